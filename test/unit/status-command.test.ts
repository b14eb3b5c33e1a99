/** `probe-agent status`: its formatting helpers, and the built CLI against a real agent API server. */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { filterFromFlags, oneLine, statusJson, statusTable } from '../../agent/cli/status-command.ts';
import { InvalidProbeError } from '../../agent/errors.ts';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { LabProber, startApiFixture, status, type ApiFixture } from '../support/api-harness.ts';
import { runCli } from '../support/run-cli.ts';

describe('status helpers', () => {
  it('filterFromFlags: probe type in any case, an unknown one refused with the flag named', () => {
    expect(filterFromFlags({ namespace: 'ns', podUid: 'u', probeType: 'READINESS' })).toEqual({ namespace: 'ns', podUID: 'u', probeType: 'Readiness' });
    expect(filterFromFlags({})).toEqual({});
    expect(() => filterFromFlags({ probeType: 'exec' })).toThrow(InvalidProbeError);
    expect(() => filterFromFlags({ probeType: 'exec' })).toThrow('--probe-type: want liveness, readiness or startup, got "exec"');
  });

  it('oneLine flattens control characters (a hostile message cannot forge table rows) and bounds the length', () => {
    expect(oneLine('a\r\nb\u001b[31mc\u007f', 100)).toBe('a b [31mc');
    expect(oneLine('x'.repeat(100), 10)).toBe(`${'x'.repeat(9)}…`);
  });

  it('statusTable aligns columns, marks on-hold probes and counts; statusJson has stable fields', () => {
    const now = Date.now();
    const a = status('u1', 'ns-a', 'Readiness', 'success', { lastProbeTime: now - 5000 });
    const b = status('u2', 'namespace-b', 'Liveness', 'failure', { consecutive: 3, onHold: true, lastProbeTime: 0, lastMessage: 'bad\nthing' });
    const lines = statusTable([a, b], now).trimEnd().split('\n');
    expect(lines[0]).toMatch(/^NAMESPACE\s+POD\s+CONTAINER\s+PROBE\s+RESULT\s+STARTED\s+READY\s+LAST\s+MESSAGE$/);
    expect(lines[0]!.indexOf('POD')).toBe(lines[2]!.indexOf('pod-u2'));
    expect(lines[1]).toContain('5s');
    expect(lines[2]).toMatch(/Liveness \(on hold\)\s+failure x3\s+true\s+false\s+-\s+bad thing$/);
    expect(statusJson(b)).toMatchObject({ namespace: 'namespace-b', pod: 'pod-u2', podUID: 'u2', probeType: 'Liveness', result: 'failure', lastProbeTime: null, onHold: true, lastReason: null });
  });
});

describe('the built `probe-agent status`', () => {
  let fx: ApiFixture;
  let dir: string;
  beforeAll(async () => {
    dir = mkdtempSync(path.join(tmpdir(), 'status-cmd-'));
    fx = await startApiFixture({ prober: new LabProber({ pods: [], sockets: new NodeSocketFactory() }), dir });
    fx.store.upsert(status('u1', 'ns-a', 'Readiness', 'success'));
    fx.store.upsert(status('u2', 'ns-b', 'Liveness', 'failure'));
  });
  afterAll(async () => {
    await fx?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('lists the statuses as a table, filtered by namespace', async () => {
    const all = await runCli(['status', '--socket', fx.socket]);
    expect(all.code).toBe(0);
    expect(all.stdout.trimEnd().split('\n')).toHaveLength(3);
    const one = await runCli(['status', '--socket', fx.socket, '--namespace', 'ns-b']);
    expect(one.code).toBe(0);
    expect(one.stdout).toContain('pod-u2');
    expect(one.stdout).not.toContain('pod-u1');
  }, 240_000);

  it('as JSON, with the agent instance and revision', async () => {
    const r = await runCli(['status', '--socket', fx.socket, '--output', 'json', '--probe-type', 'readiness']);
    expect(r.code).toBe(0);
    const out = JSON.parse(r.stdout) as { instanceId: string; revision: number; statuses: { pod: string }[] };
    expect(out.statuses.map((s) => s.pod)).toEqual(['pod-u1']);
    expect(out.instanceId).not.toBe('');
    expect(out.revision).toBeGreaterThanOrEqual(2);
  }, 240_000);

  it('"no probes" for an empty match', async () => {
    const r = await runCli(['status', '--socket', fx.socket, '--namespace', 'none']);
    expect(r).toMatchObject({ code: 0, stdout: 'no probes\n' });
  }, 240_000);

  it('exit 2 with the reason when the agent cannot be asked or a flag is bad', async () => {
    const gone = await runCli(['status', '--socket', path.join(dir, 'no.sock')]);
    expect(gone.code).toBe(2);
    expect(gone.stderr).toMatch(/^probe-agent status: /);
    const bad = await runCli(['status', '--socket', fx.socket, '--probe-type', 'exec']);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('--probe-type: want liveness, readiness or startup, got "exec"');
  }, 240_000);
});
