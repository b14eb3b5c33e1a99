/**
 * The daemon end to end: a test kubelet serving lab pods, `probe-agent run` finding their netns by
 * address, probing them behind the node->pod drop rule, and exiting cleanly on SIGTERM.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { requireRoot } from '../support/root.ts';
import { createLab, type Lab, type RunningServer } from '../lab/lab.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { makePod } from '../support/pod-factory.ts';
import { startAgent, type AgentHandle } from '../support/agent-harness.ts';

requireRoot();

let lab: Lab;
let kubelet: FakeKubelet;
let agent: AgentHandle;
let web: RunningServer;

beforeAll(async () => {
  lab = await createLab({ pods: 2, policy: 'drop', tag: 'e2e' });
  const [p1, p2] = lab.pods;
  web = await lab.startServer(p1!, { http: 8080 });
  await lab.startServer(p2!, { tcp: 5432 });
  const pods = [
    makePod({ name: 'web', namespace: 'e2e', ips: p1!.ips, probe: 'http', port: 8080 }),
    makePod({ name: 'db', namespace: 'e2e', ips: p2!.ips, probe: 'tcp', port: 5432 }),
  ];
  // The factory's readiness path is /ready; the lab server answers /healthz.
  const app = (pods[0]!.spec as { containers: Record<string, unknown>[] }).containers[0]!;
  app.readinessProbe = { httpGet: { path: '/healthz', port: 8080 }, periodSeconds: 1, failureThreshold: 2 };
  app.livenessProbe = { httpGet: { path: '/healthz', port: 'http' }, periodSeconds: 1, failureThreshold: 3 };
  kubelet = await FakeKubelet.start({ pods });
  agent = await startAgent({ kubeletUrl: kubelet.httpUrl });
});

afterAll(async () => {
  await agent?.stop('SIGKILL').catch(() => {});
  await kubelet?.stop();
  await lab?.destroy();
});

describe('probe-agent run', () => {
  it('probes every pod inside its netns while the node cannot reach them', async () => {
    const statuses = await agent.waitForStatuses((s) => s.length === 3 && s.every((x) => x.result === 'success' && x.lastProbeTime > 0));
    expect(statuses.map((s) => `${s.podName}/${s.key.probeType}`).sort()).toEqual(['db/Liveness', 'web/Liveness', 'web/Readiness']);
    expect(statuses.find((s) => s.podName === 'web' && s.key.probeType === 'Readiness')?.ready).toBe(true);
    expect(await lab.nodeToPodDrops()).toBe(0);
  });

  it('turns readiness to failure after failureThreshold when the server stops answering', async () => {
    await web.control('/control/health?ok=0');
    const statuses = await agent.waitForStatuses((s) => s.some((x) => x.podName === 'web' && x.key.probeType === 'Readiness' && x.result === 'failure'));
    const ready = statuses.find((x) => x.podName === 'web' && x.key.probeType === 'Readiness');
    expect(ready?.ready).toBe(false);
    expect(ready?.lastMessage).toContain('statuscode: 503');
    await web.control('/control/health?ok=1');
    await agent.waitForStatuses((s) => s.some((x) => x.podName === 'web' && x.key.probeType === 'Readiness' && x.result === 'success'));
  });

  it('serves kubelet-compatible metrics and readiness', async () => {
    const metrics = await agent.http('/metrics/probes');
    expect(metrics.status).toBe(200);
    const line = metrics.body.split('\n').find((l) => l.startsWith('prober_probe_total{') && l.includes('probe_type="Readiness"') && l.includes('pod="web"') && l.includes('result="successful"'));
    expect(line).toMatch(/container="app".*namespace="e2e".*pod_uid="[0-9a-f-]{36}".* [1-9]\d*$/);
    const ready = await agent.http('/readyz?verbose');
    expect(ready.body).toContain('[+]kubelet ok');
    expect(ready.status).toBe(200);
  });

  it('exits 0 on SIGTERM and removes its socket', async () => {
    const code = await agent.stop('SIGTERM');
    expect(code).toBe(0);
    const { existsSync } = await import('node:fs');
    expect(existsSync(agent.socket)).toBe(false);
  });
});
