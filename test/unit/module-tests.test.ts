/**
 * Every agent module has a test that names it: a test file of its basename under test/unit or
 * test/integration (`<name>.test.ts`) that names its path (`agent/...`, so a test of another
 * module of the same name does not count), or a test file there that imports it. A module named by no
 * test is one nobody will notice breaking. The allow-list is for modules where a test of their own
 * makes no sense; each entry says why.
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const REPO = fileURLToPath(new URL('../..', import.meta.url));

const ALLOWED = new Map<string, string>([
  // Entry points: run as users run them, by every test that starts the built CLI or shim.
  ['agent/cli.ts', 'the CLI entry point: every test that runs bin/probe-agent (test/support/run-cli.ts, built-cli.ts) runs it'],
  ['agent/shim/main.ts', "the shim's entry point: every shim test starts it (test/support/shim-process.ts)"],
  ['agent/daemon.ts', '`probe-agent run`: agent-e2e.test.ts and every test/support/agent-harness.ts test run the daemon whole'],
  // Driven through a fixture that builds it as its caller does.
  ['agent/shim/relay.ts', 'the relay-*.test.ts files drive it through test/support/relay-harness.ts'],
  ['agent/probe/grpc.ts', 'probers.test.ts and grpc-probe-peers.test.ts run it through runProbe against real gRPC servers'],
]);

function* tsFiles(dir: string): Generator<string> {
  for (const name of readdirSync(dir)) {
    const p = path.join(dir, name);
    if (statSync(p).isDirectory()) yield* tsFiles(p);
    else if (p.endsWith('.ts') && !p.endsWith('.d.ts')) yield p;
  }
}

describe('each agent module has a test that names it', () => {
  const modules = [...tsFiles(path.join(REPO, 'agent'))].map((p) => path.relative(REPO, p));
  const tests = ['test/unit', 'test/integration'].flatMap((d) => [...tsFiles(path.join(REPO, d))].filter((p) => p.endsWith('.test.ts')));
  const testSources = new Map(tests.map((p) => [p, readFileSync(p, 'utf8')]));
  /** A test of the module's basename that names its path. */
  const namedBy = (m: string): boolean => tests.some((t) => path.basename(t, '.test.ts') === path.basename(m, '.ts') && testSources.get(t)!.includes(m));
  const imported = new Set<string>();
  for (const t of tests) {
    for (const m of testSources.get(t)!.matchAll(/(?:from|import\()\s*['"](\.[^'"]+\.ts)['"]/g)) {
      imported.add(path.relative(REPO, path.resolve(path.dirname(t), m[1]!)));
    }
  }

  it('finds the modules and the tests', () => {
    expect(modules.length).toBeGreaterThan(100);
    expect(modules).toContain('agent/daemon.ts');
  });

  it('no module without a test of its name or a test that imports it, beyond the allow-list', () => {
    const missing = modules.filter((m) => !ALLOWED.has(m) && !namedBy(m) && !imported.has(m));
    expect(missing).toEqual([]);
  });

  it('the allow-list names only modules that exist and still have no test of their own', () => {
    const stale = [...ALLOWED.keys()].filter((m) => !modules.includes(m) || namedBy(m) || imported.has(m));
    expect(stale).toEqual([]);
  });
});
