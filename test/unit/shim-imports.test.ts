/**
 * The shim is one folder: starting from agent/shim/main.ts, every module it loads is in
 * agent/shim/, the contract both sides share (agent/contract/), the HTTP/2 and gRPC wire layers
 * and the socket they read through (agent/http2/, agent/grpc/, agent/io/), or one of the few leaves listed here, and every import is a Node
 * built-in. Agent core (probe, pods, prober, scheduler, netns, api, ...) is never reached, so if the
 * agent crashes or grows, kubelet's runtime path is unaffected; the installed shim needs no
 * node_modules (the installer copies dist/ and node only).
 */
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';

const AGENT = fileURLToPath(new URL('../../agent/', import.meta.url));
/** Folders the shim may load anything from. */
const SHIM_FOLDERS = ['shim/', 'contract/', 'http2/', 'grpc/', 'io/'];
/** Leaves outside them (they import nothing but each other). */
const SHIM_LEAVES = ['config/duration.ts', 'errors.ts', 'probe/time-budget.ts'];

function allowed(module: string): boolean {
  return SHIM_FOLDERS.some((f) => module.startsWith(f)) || SHIM_LEAVES.includes(module);
}

function tsFiles(folder: string): string[] {
  return readdirSync(path.join(AGENT, folder)).filter((f) => f.endsWith('.ts')).map((f) => folder + f);
}

function graph(entry: string): { modules: Set<string>; packages: Set<string> } {
  const modules = new Set<string>();
  const packages = new Set<string>();
  const todo = [entry];
  while (todo.length) {
    const file = todo.pop()!;
    if (modules.has(file)) continue;
    modules.add(file);
    const src = readFileSync(path.join(AGENT, file), 'utf8');
    // TypeScript's own scan: `import x from`, side-effect `import '...'`, `export ... from`, `import()`, either quote.
    for (const { fileName: spec } of ts.preProcessFile(src, true, true).importedFiles) {
      if (spec.startsWith('.')) todo.push(path.relative(AGENT, path.resolve(path.dirname(path.join(AGENT, file)), spec)));
      else packages.add(spec);
    }
  }
  return { modules, packages };
}

describe('the shim import graph', () => {
  it('reaches only the shim folder, the contract, the wire layers and the listed leaves', () => {
    const { modules } = graph('shim/main.ts');
    expect([...modules].filter((m) => !allowed(m)).sort()).toEqual([]);
  });

  it('is the whole shim folder: every module of agent/shim/ is loaded by the shim', () => {
    const { modules } = graph('shim/main.ts');
    expect(tsFiles('shim/').filter((m) => !modules.has(m))).toEqual([]);
  });

  it('the rule holds for what it allows, and fails for agent core', () => {
    expect(SHIM_LEAVES.flatMap((leaf) => [...graph(leaf).modules]).every(allowed)).toBe(true);
    for (const core of ['probe/run.ts', 'prober/pod-prober.ts', 'api/exec-sync.ts', 'scheduler/manager.ts', 'netns/helper.ts', 'pods/pod-model.ts']) {
      expect(allowed(core), core).toBe(false);
    }
  });

  it('the contract is a leaf both sides import: it imports nothing', () => {
    for (const m of tsFiles('contract/')) expect(graph(m).modules, m).toEqual(new Set([m]));
    const agentSide = ['api/exec-sync.ts', 'api/hot-unary.ts', 'pods/shim-probe.ts', 'rewrite/pod-rewrite.ts'];
    const importers = (m: string): string[] => ts.preProcessFile(readFileSync(path.join(AGENT, m), 'utf8'), true, true).importedFiles.map((f) => f.fileName);
    for (const m of [...agentSide, 'shim/exec-sync.ts', 'shim/agent-client.ts']) {
      expect(importers(m).some((spec) => spec.includes('/contract/')), m).toBe(true);
    }
  });

  it('the agent does not load the shim: only `probe-agent shim` (cli/shim-command.ts) imports it', () => {
    const folders = readdirSync(AGENT, { withFileTypes: true }).filter((d) => d.isDirectory()).map((d) => `${d.name}/`);
    const outside = [...tsFiles(''), ...folders.filter((f) => f !== 'shim/').flatMap(tsFiles)];
    const importers = outside.filter((m) => [...graph(m).modules].some((x) => x.startsWith('shim/')));
    expect(importers.sort()).toEqual(['cli.ts', 'cli/shim-command.ts']);
  });

  it('uses Node built-ins only (no npm package, so no node_modules on the host)', () => {
    const { packages } = graph('shim/main.ts');
    for (const p of packages) expect(p, p).toMatch(/^node:/);
  });

  it('sees every form of import (side-effect, re-export, dynamic, double quotes)', () => {
    const src = "import './a.ts';\nimport b from \"./b.ts\";\nexport * from './c.ts';\nconst d = await import('./d.ts');\nimport 'node:e';\n";
    expect(ts.preProcessFile(src, true, true).importedFiles.map((f) => f.fileName)).toEqual(['./a.ts', './b.ts', './c.ts', './d.ts', 'node:e']);
  });

  it('the CLI command loads the shim lazily', () => {
    const src = readFileSync(path.join(AGENT, 'cli/shim-command.ts'), 'utf8');
    expect(src).toMatch(/await import\('\.\.\/shim\/main\.ts'\)/);
    // Statically, only the flags' leaf module (the same definitions as the systemd entry point's).
    const statics = [...src.matchAll(/^import .*'(\.\.\/shim\/[^']+)'/gm)].map((m) => m[1]);
    expect(statics).toEqual(['../shim/flags.ts']);
    expect(graph('shim/flags.ts').modules).toEqual(new Set(['shim/flags.ts', 'config/duration.ts', 'errors.ts', 'contract/shim-socket.ts']));
  });
});
