/**
 * agent/audit/wiring.ts: runAudit builds an audit from `run`'s configuration. Against the fake
 * kubelet (no root): an empty node audits clean without starting the netns helper; a kubelet that
 * is down or refuses the token stops the audit with AuditSetupError saying so. The audit of real
 * pods in netns is test/integration/audit.test.ts (through the CLI).
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AuditSetupError, runAudit } from '../../agent/audit/wiring.ts';
import { parseRunConfig } from '../../agent/config/run-config.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';

const TOKEN = 'wiring-test-token';
let kubelet: FakeKubelet;
let dir: string;
let tokenFile: string;
beforeAll(async () => {
  kubelet = await FakeKubelet.start({ token: TOKEN });
  dir = mkdtempSync(path.join(tmpdir(), 'audit-wiring-'));
  tokenFile = path.join(dir, 'token');
  writeFileSync(tokenFile, `${TOKEN}\n`);
});
afterAll(async () => {
  await kubelet?.stop();
  rmSync(dir, { recursive: true, force: true });
});

const config = (extra: Record<string, unknown> = {}) => parseRunConfig({
  kubeletUrl: kubelet.httpUrl, kubeletTokenFile: tokenFile, netnsResolvers: 'address',
  // A helper path that does not exist: the audit of an empty node must not need the helper at all.
  helperPath: path.join(dir, 'no-helper'),
  ...extra,
}, {});

describe('runAudit', () => {
  it('an empty node: a clean report, exit code 0, no helper started', async () => {
    kubelet.setPods([]);
    const report = await runAudit(config());
    expect(report.probes).toEqual([]);
    expect(report.summary.exitCode).toBe(0);
  }, 120_000);

  it("a kubelet that is down: AuditSetupError naming the pod listing", async () => {
    await kubelet.setFault('down');
    try {
      const err = await runAudit(config()).then(() => undefined, (e: unknown) => e);
      expect(err).toBeInstanceOf(AuditSetupError);
      expect((err as Error).message).toMatch(/^cannot list the node's pods: kubelet \/pods unreachable/);
    } finally {
      await kubelet.setFault('none');
    }
  }, 120_000);

  it('a token the kubelet refuses: AuditSetupError', async () => {
    const bad = path.join(dir, 'bad-token');
    writeFileSync(bad, 'not-the-token\n');
    const err = await runAudit(config({ kubeletTokenFile: bad })).then(() => undefined, (e: unknown) => e);
    expect(err).toBeInstanceOf(AuditSetupError);
    expect((err as Error).message).toMatch(/^cannot list the node's pods: /);
  }, 120_000);

  it('a pod to audit starts the helper: one that will not start is AuditSetupError, not a crash', async () => {
    kubelet.setPods([{
      metadata: { name: 'web', namespace: 'default', uid: '0d7c1e2f-3a4b-4c5d-8e9f-0000000000bb' },
      spec: { nodeName: 'n', containers: [{ name: 'app', readinessProbe: { tcpSocket: { port: 80 } } }] },
      status: { phase: 'Running', podIP: '10.0.0.9', podIPs: [{ ip: '10.0.0.9' }], containerStatuses: [{ name: 'app', containerID: 'containerd://abc', ready: true, started: true, state: { running: { startedAt: '2026-01-01T00:00:00Z' } } }] },
    }]);
    const err = await runAudit(config()).then(() => undefined, (e: unknown) => e);
    expect(err).toBeInstanceOf(AuditSetupError);
    expect((err as Error).message).toBe(`cannot start the netns helper: netns helper binary "${path.join(dir, 'no-helper')}" is not usable (ENOENT): build it with 'make helper' or set PROBE_AGENT_HELPER`);
  }, 120_000);
});
