/**
 * The shim's import graph stays small and never reaches the agent's internals: starting from
 * agent/shim/main.ts, every import is a Node built-in or one of the few modules listed here. If
 * the agent crashes or grows, kubelet's runtime path is unaffected; the installed shim needs no
 * node_modules (the installer copies dist/ and node only).
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';

const AGENT = fileURLToPath(new URL('../../agent/', import.meta.url));
const ALLOWED = [
  'shim/main.ts', 'shim/proxy.ts', 'shim/relay.ts', 'shim/answer.ts', 'shim/exec-sync.ts',
  'shim/hook-runner.ts', 'shim/metrics.ts', 'shim/metrics-server.ts', 'shim/flags.ts', 'config/duration.ts', 'errors.ts',
  'http2/connection.ts', 'http2/flow-control.ts', 'http2/writer.ts', 'http2/authority.ts', 'http2/hpack.ts', 'http2/huffman.ts', 'http2/unary-client.ts', 'http2/wire.ts',
  'grpc/frame.ts', 'grpc/headers.ts', 'grpc/protowire.ts', 'grpc/status.ts',
  'api/shim-client.ts', 'api/shim-socket.ts', 'api/hook-refusal.ts', 'rewrite/shim-command.ts', 'probe/time-budget.ts',
];

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
  it('reaches only the shim, the lean ProbeService client and the command contract', () => {
    const { modules } = graph('shim/main.ts');
    expect([...modules].sort()).toEqual([...ALLOWED].sort());
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
    expect(graph('shim/flags.ts').modules).toEqual(new Set(['shim/flags.ts', 'config/duration.ts', 'errors.ts', 'api/shim-socket.ts']));
  });
});
