/**
 * On-demand mode through the running daemon: the fake kubelet serves a pod whose probes were
 * rewritten for the kubelet shim (probe-agent's exec command, agent/contract/shim-command.ts) next to
 * a container with an ordinary probe. The agent must send no timer traffic for the rewritten probes
 * (counted at a real server in the pod's netns), keep probing the ordinary one, and show in
 * ListProbeStatus and metrics exactly the results of the Probe calls the shim makes with probe_type.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft']);

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ProbeStatus } from '../../agent/scheduler/types.ts';
import { encodeShimCommand } from '../../agent/contract/shim-command.ts';
import { createLab, type Lab, type LabPod } from '../lab/lab.ts';
import { startRecordingServer, type RecordingServer } from '../lab/recording-server.ts';
import { startAgent, type AgentHandle } from '../support/agent-harness.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { makePod } from '../support/pod-factory.ts';

const UID = 'c0ffee00-0000-4000-8000-0000000000d1';
const APP_ID = 'a'.repeat(64);

let lab: Lab;
let pod: LabPod;
let srv: RecordingServer;
let kubelet: FakeKubelet;
let agent: AgentHandle;
let port: number;

function status(list: ProbeStatus[], container: string, type: ProbeStatus['key']['probeType']): ProbeStatus | undefined {
  return list.find((s) => s.key.containerName === container && s.key.probeType === type);
}

/** A pod as kubelet lists it after `probe-agent rewrite`: app's probes are shim-driven, side's readiness is ordinary. */
function rewrittenPod(): Record<string, unknown> {
  const p = makePod({ uid: UID, name: 'rewritten', namespace: 'od', ips: pod.ips, port, probe: 'none', containerID: `containerd://${APP_ID}` });
  const spec = p.spec as { containers: Record<string, unknown>[] };
  const app = spec.containers[0] as Record<string, unknown>;
  app.readinessProbe = { exec: { command: encodeShimCommand('readiness', { httpGet: { path: '/ready', port: 'http' } }) }, periodSeconds: 1 };
  app.livenessProbe = { exec: { command: encodeShimCommand('liveness', { httpGet: { path: '/live', port } }) }, periodSeconds: 1, failureThreshold: 2 };
  spec.containers.push({ name: 'side', image: 'x', readinessProbe: { httpGet: { path: '/normal', port }, periodSeconds: 1 } });
  const st = p.status as { containerStatuses: Record<string, unknown>[] };
  st.containerStatuses.push({ ...st.containerStatuses[0], name: 'side', containerID: `containerd://${'b'.repeat(64)}` });
  return p;
}

function sample(body: string, name: string, want: Record<string, string>): number {
  for (const line of body.split('\n')) {
    const m = /^([a-zA-Z_:][\w:]*)\{(.*)\} (\S+)$/.exec(line);
    if (!m || m[1] !== name) continue;
    const labels = Object.fromEntries([...(m[2] as string).matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)].map((l) => [l[1], l[2]]));
    if (Object.entries(want).every(([k, v]) => labels[k] === v)) return Number(m[3]);
  }
  return 0;
}

beforeAll(async () => {
  lab = await createLab({ pods: 1, policy: 'drop', tag: 'on-demand.test' });
  pod = lab.pods[0] as LabPod;
  srv = await startRecordingServer(pod.name, { http: 0 });
  port = srv.ports.http as number;
  kubelet = await FakeKubelet.start({ pods: [rewrittenPod()] });
  agent = await startAgent({ kubeletUrl: kubelet.httpUrl });
}, 60_000);

afterAll(async () => {
  await agent?.stop('SIGKILL').catch(() => {});
  await kubelet?.stop();
  await srv?.stop();
  await lab?.destroy();
});

describe('on-demand mode', () => {
  it('sends no timer traffic for shim-driven probes, but keeps probing ordinary ones', async () => {
    // side's ordinary readiness probe runs every second: wait for three of them.
    await agent.waitForStatuses((s) => (status(s, 'side', 'Readiness')?.consecutive ?? 0) >= 3);
    expect(srv.count('/normal')).toBeGreaterThanOrEqual(3);
    expect(srv.count('/ready')).toBe(0);
    expect(srv.count('/live')).toBe(0);
    const list = (await agent.client.listStatus({ podUID: UID })).statuses;
    // The shim-driven workers exist (status and watch show them) but have no result yet.
    expect(status(list, 'app', 'Readiness')).toMatchObject({ result: 'unknown', lastProbeTime: 0 });
    expect(status(list, 'app', 'Liveness')).toMatchObject({ result: 'unknown', lastProbeTime: 0 });
  });

  it('shows the results of the shim\'s Probe calls, with kubelet\'s thresholds, in status and metrics', async () => {
    // The shim names the container by its CRI ID, as kubelet's ExecSync does.
    const ready = await agent.client.probe({ pod: { containerId: APP_ID }, probeType: 'Readiness', handler: { kind: 'http', port: 'http', path: '/ready', scheme: 'HTTP', headers: [] } });
    expect(ready.result).toBe('success');
    // The server records a request on its stdout, which can reach us after the response: wait for it.
    await expect.poll(() => srv.count('/ready'), { timeout: 5000 }).toBe(1);
    let list = await agent.waitForStatuses((s) => status(s, 'app', 'Readiness')?.result === 'success');
    expect(status(list, 'app', 'Readiness')).toMatchObject({ ready: true, started: true, consecutive: 1, containerID: `containerd://${APP_ID}` });

    // Liveness: failureThreshold 2. One failure is not enough; the second decides and holds.
    const live = { kind: 'http' as const, port, path: '/status/503', scheme: 'HTTP' as const, headers: [] };
    expect((await agent.client.probe({ pod: { uid: UID }, containerName: 'app', probeType: 'Liveness', handler: live })).result).toBe('failure');
    list = await agent.waitForStatuses((s) => status(s, 'app', 'Liveness')?.consecutive === 1);
    expect(status(list, 'app', 'Liveness')?.result).not.toBe('failure');
    await agent.client.probe({ pod: { containerId: `containerd://${APP_ID}` }, probeType: 'Liveness', handler: live });
    list = await agent.waitForStatuses((s) => status(s, 'app', 'Liveness')?.result === 'failure');
    expect(status(list, 'app', 'Liveness')).toMatchObject({ onHold: true, lastReason: 'status' });

    const metrics = (await agent.http('/metrics/probes')).body;
    expect(sample(metrics, 'prober_probe_total', { probe_type: 'Readiness', container: 'app', result: 'successful' })).toBe(1);
    expect(sample(metrics, 'prober_probe_total', { probe_type: 'Liveness', container: 'app', result: 'failed' })).toBe(2);

    // A few seconds later still no timer traffic for the rewritten probes.
    await new Promise((r) => setTimeout(r, 2500));
    expect(srv.count('/ready')).toBe(1);
    expect(srv.count('/live')).toBe(0);
  });

  it('streams the change the shim\'s results cause to watchers', async () => {
    const { revision, instanceId } = await agent.client.listStatus({ podUID: UID });
    const ac = new AbortController();
    const seen = (async () => {
      for await (const m of agent.client.watch({ filter: { podUID: UID }, fromRevision: revision, instanceId, signal: ac.signal })) {
        if (m.kind === 'event' && m.event.status.key.containerName === 'app' && m.event.status.key.probeType === 'Readiness' && m.event.status.result === 'failure') return m.event;
      }
      return undefined;
    })();
    // Readiness failureThreshold is 3 (the default): three failed shim probes flip it.
    const fail = { kind: 'http' as const, port, path: '/status/500', scheme: 'HTTP' as const, headers: [] };
    for (let i = 0; i < 3; i++) await agent.client.probe({ pod: { containerId: APP_ID }, probeType: 'Readiness', handler: fail });
    const timer = setTimeout(() => ac.abort(), 10_000);
    const event = await seen;
    clearTimeout(timer);
    ac.abort();
    expect(event).toMatchObject({ type: 'changed', previous: 'success', status: { ready: false, consecutive: 3 } });
  });

  it('does not record an ad-hoc probe (no probe_type)', async () => {
    const before = status((await agent.client.listStatus({ podUID: UID })).statuses, 'app', 'Readiness');
    await agent.client.probe({ pod: { uid: UID }, containerName: 'app', handler: { kind: 'http', port, path: '/status/500', scheme: 'HTTP', headers: [] } });
    const after = status((await agent.client.listStatus({ podUID: UID })).statuses, 'app', 'Readiness');
    expect(after?.lastProbeTime).toBe(before?.lastProbeTime);
    expect(after?.result).toBe('failure');
  });
});
