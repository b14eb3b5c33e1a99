/** `probe-agent watch` (agent/cli/watch-command.ts), built, against a real agent API server whose store the test changes. */
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { LabProber, startApiFixture, status, type ApiFixture } from '../support/api-harness.ts';
import { builtCli } from '../support/built-cli.ts';
import { runCli } from '../support/run-cli.ts';

let fx: ApiFixture;
let dir: string;
beforeAll(async () => {
  dir = mkdtempSync(path.join(tmpdir(), 'watch-cmd-'));
  fx = await startApiFixture({ prober: new LabProber({ pods: [], sockets: new NodeSocketFactory() }), dir });
  fx.store.upsert(status('u1', 'ns-a', 'Readiness', 'success'));
});
afterAll(async () => {
  await fx?.close();
  rmSync(dir, { recursive: true, force: true });
});

/** Starts `watch` and feeds the store once its snapshot is out; resolves with what it printed and its exit code. */
function watchWhileFeeding(args: string[], feed: () => void): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn(builtCli(), ['watch', '--socket', fx.socket, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  let fed = false;
  const timer = setTimeout(() => child.kill('SIGKILL'), 60_000);
  child.stdout.on('data', (d: Buffer) => {
    stdout += d.toString();
    if (!fed && stdout.includes('snapshot')) {
      fed = true;
      feed();
    }
  });
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  return new Promise((resolve) => child.on('close', (code) => {
    clearTimeout(timer);
    resolve({ code, stdout, stderr });
  }));
}

describe('the built `probe-agent watch`', () => {
  it('prints the snapshot, then events with the transition, and exits 0 after --count events', async () => {
    const r = await watchWhileFeeding(['--count', '2'], () => {
      fx.store.upsert(status('u1', 'ns-a', 'Readiness', 'failure', { lastMessage: 'HTTP 503\nforged line' }));
      fx.store.upsert(status('u2', 'ns-a', 'Liveness', 'success'));
    });
    expect(r.code).toBe(0);
    const lines = r.stdout.trimEnd().split('\n');
    expect(lines[0]).toMatch(/^snapshot revision=\d+ instance=\S+ statuses=1$/);
    expect(lines[1]).toMatch(/^ {2}ns-a\/pod-u1 container=app Readiness success /);
    expect(lines[2]).toMatch(/ changed ns-a\/pod-u1 container=app Readiness success -> failure started=true ready=false "HTTP 503 forged line"$/);
    expect(lines[3]).toMatch(/ added ns-a\/pod-u2 /);
    expect(lines).toHaveLength(4);
  }, 240_000);

  it('JSON lines with --output json, filtered by --probe-type', async () => {
    const r = await watchWhileFeeding(['--count', '1', '--output', 'json', '--probe-type', 'liveness'], () => {
      fx.store.upsert(status('u1', 'ns-a', 'Readiness', 'success'));
      fx.store.upsert(status('u2', 'ns-a', 'Liveness', 'failure'));
    });
    expect(r.code).toBe(0);
    const items = r.stdout.trimEnd().split('\n').map((l) => JSON.parse(l) as { type: string; event?: string; previous?: string; status?: { probeType: string } });
    expect(items[0]!.type).toBe('snapshot');
    expect(items.slice(1)).toEqual([expect.objectContaining({ type: 'event', event: 'changed', previous: 'success', status: expect.objectContaining({ probeType: 'Liveness', result: 'failure' }) })]);
  }, 240_000);

  it('exit 2 with the flag named for a bad --count or --from-revision, and when the agent is not there', async () => {
    const count = await runCli(['watch', '--socket', fx.socket, '--count', '-1']);
    expect(count.code).toBe(2);
    expect(count.stderr).toContain('--count: want a non-negative integer, got "-1"');
    const rev = await runCli(['watch', '--socket', fx.socket, '--from-revision', '1e3']);
    expect(rev.code).toBe(2);
    expect(rev.stderr).toContain('--from-revision: want a non-negative integer, got "1e3"');
    const gone = await runCli(['watch', '--socket', path.join(dir, 'none.sock')]);
    expect(gone.code).toBe(2);
    expect(gone.stderr).toMatch(/^probe-agent watch: /);
  }, 240_000);
});
