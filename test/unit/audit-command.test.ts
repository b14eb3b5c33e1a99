/**
 * `probe-agent audit` (agent/cli/audit-command.ts), built, against the fake kubelet with an empty
 * node (no root: nothing to probe, no helper): the exit-status contract, a quiet stderr, the JSON shape, and the --concurrency bounds. Audits of real pods, and the other
 * bad flags, are test/integration/audit.test.ts.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MAX_AUDIT_CONCURRENCY } from '../../agent/audit/audit.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { runCli } from '../support/run-cli.ts';

const TOKEN = 'audit-command-token';
let kubelet: FakeKubelet;
let dir: string;
let flags: string[];
beforeAll(async () => {
  kubelet = await FakeKubelet.start({ token: TOKEN, pods: [] });
  dir = mkdtempSync(path.join(tmpdir(), 'audit-cmd-'));
  writeFileSync(path.join(dir, 'token'), TOKEN);
  flags = ['--kubelet-url', kubelet.httpUrl, '--kubelet-token-file', path.join(dir, 'token'), '--netns-resolvers', 'address'];
});
afterAll(async () => {
  await kubelet?.stop();
  rmSync(dir, { recursive: true, force: true });
});

describe('probe-agent audit (built)', () => {
  it('an empty node: exit 0, nothing on stderr', async () => {
    const r = await runCli(['audit', ...flags]);
    expect(r.code).toBe(0);
    expect(r.stderr).toBe('');
    expect(r.stdout).not.toBe('');
  }, 240_000);

  it('JSON: the report with its summary and exit code', async () => {
    const r = await runCli(['audit', ...flags, '--output', 'json']);
    expect(r.code).toBe(0);
    const report = JSON.parse(r.stdout) as { probes: unknown[]; summary: { exitCode: number } };
    expect(report.probes).toEqual([]);
    expect(report.summary.exitCode).toBe(0);
  }, 240_000);

  it.each(['0', String(MAX_AUDIT_CONCURRENCY + 1), '2.5', 'many'])('--concurrency %s: exit 2 naming the bounds', async (n) => {
    const r = await runCli(['audit', ...flags, '--concurrency', n]);
    expect(r.code).toBe(2);
    expect(r.stdout).toBe('');
    expect(r.stderr).toBe(`probe-agent audit: bad configuration: --concurrency: want an integer 1..${MAX_AUDIT_CONCURRENCY}, got "${n}"\n`);
  }, 240_000);
});
