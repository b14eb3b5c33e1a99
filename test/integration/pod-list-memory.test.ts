/**
 * The largest pod list accepted stays inside the DaemonSet's memory limit (issue 18, "Bounded per
 * pod, not all or nothing"). The real agent, with the manifest's heap cap (NODE_OPTIONS from
 * deploy/base/daemonset.yaml), polls a fake kubelet serving lists as large as the default
 * --kubelet-max-response-bytes allows (64 MiB): 4990 pods of ~12.5 KiB (with the two bad ones, just under the 5000-pod cap), and 60 pods of just under
 * the per-pod cap of 1 MiB, each with one oversized and one broken pod among them. Every good pod is
 * known, the two bad ones are dropped and counted, and the kernel's peak RSS of the agent stays
 * under the manifest's limit.
 */
import { readFileSync } from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import { startAgent, type AgentHandle } from '../support/agent-harness.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { makePod } from '../support/pod-factory.ts';
import { sample, snapshot, until } from '../soak/observe.ts';

const manifest = readFileSync(new URL('../../deploy/base/daemonset.yaml', import.meta.url), 'utf8');
const heapFlag = /name: NODE_OPTIONS\s+value: (--max-old-space-size=\d+)/.exec(manifest)?.[1];
const limitMi = Number(/limits:\s+memory: (\d+)Mi/.exec(manifest)?.[1]);

let kubelet: FakeKubelet | undefined;
let agent: AgentHandle | undefined;
afterEach(async () => {
  await agent?.stop('SIGKILL').catch(() => {});
  await kubelet?.stop();
  agent = undefined;
  kubelet = undefined;
});

/** A PodList body of `count` pods padded to about `podBytes` each, plus one pod over the cap and one that is not JSON. */
function listBody(count: number, podBytes: number): { body: string; names: string[] } {
  const names: string[] = [];
  const items: string[] = [];
  for (let i = 0; i < count; i++) {
    const pod = makePod({ name: `pod-${i}`, namespace: `ns-${i % 50}`, probe: 'none' });
    const base = JSON.stringify(pod).length;
    (pod['metadata'] as Record<string, unknown>)['annotations'] = { pad: 'x'.repeat(Math.max(0, podBytes - base - 40)) };
    items.push(JSON.stringify(pod));
    names.push(`pod-${i}`);
  }
  const huge = makePod({ name: 'huge', probe: 'none' });
  (huge['metadata'] as Record<string, unknown>)['annotations'] = { pad: 'x'.repeat(2 * 1024 * 1024) };
  items.splice(count >> 1, 0, JSON.stringify(huge), '{"metadata":{"name":"broken"},"spec":{"containers":[{"name":}]}}');
  return { body: `{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[${items.join(',')}]}`, names };
}

describe('the largest pod list under the manifest memory limit', () => {
  it.each([
    ['4990 pods of ~12.5 KiB', 4990, 12_800],
    ['60 pods of ~1000 KiB', 60, 1000 * 1024],
  ])('%s (about 64 MiB, one oversized and one broken pod): all good pods known, peak RSS under the limit', async (_what, count, podBytes) => {
    expect(heapFlag, 'NODE_OPTIONS in deploy/base/daemonset.yaml').toBeDefined();
    expect(limitMi).toBeGreaterThan(0);
    const { body, names } = listBody(count, podBytes);
    expect(Buffer.byteLength(body)).toBeLessThanOrEqual(64 * 1024 * 1024);
    kubelet = await FakeKubelet.start();
    kubelet.setBody(body);
    agent = await startAgent({
      kubeletUrl: kubelet.httpUrl, pollInterval: '1s', env: { NODE_OPTIONS: heapFlag },
      expectedLogs: [
        { level: 'warn', msg: 'pod from kubelet cannot be parsed; not probing it', line: /"pod":"(huge|broken)","reason":"(too-large|malformed)"/, why: 'one oversized and one broken pod in the list, on purpose' },
        { level: 'warn', msg: 'kubelet pod list unavailable; keeping the last known pods', line: /"kind":"timeout"/, why: 'a 64 MiB list under a heap cap on a loaded machine may outlast the poll timeout; the test asserts the pods end up known' },
      ],
    });
    const a = agent;
    const metrics = async (): Promise<string> => (await a.http('/metrics')).body;
    await until(async () => sample(await metrics(), 'probe_agent_kubelet_pods_dropped', { reason: 'too-large' }) === 1, 120_000, 'the first poll of the large list');
    const m = await metrics();
    expect(sample(m, 'probe_agent_kubelet_pods_dropped', { reason: 'malformed' })).toBe(1);
    const polls0 = kubelet.requestCount;
    // Several more polls of the same list (each one read again, pod by pod).
    await until(() => kubelet!.requestCount >= polls0 + 5, 120_000, 'five more polls');
    const known = (await a.client.listStatus({}, 10_000)).statuses.length;
    const pods = sample(await metrics(), 'probe_agent_pods', { state: 'no-network-probes' }) ?? 0;
    const s = snapshot(a.pid);
    console.log(`${_what}: list ${(Buffer.byteLength(body) / 1048576).toFixed(1)} MiB, ${count} good pods (agent counts ${pods} without probes, ${known} statuses), ` +
      `RSS ${s.rssMB.toFixed(0)} MiB, peak ${s.peakMB.toFixed(0)} MiB (limit ${limitMi} MiB, ${heapFlag})`);
    expect(pods).toBe(names.length);
    expect(a.proc.exitCode).toBeNull();
    expect(s.peakMB).toBeLessThan(limitMi);
  }, 300_000);
});
