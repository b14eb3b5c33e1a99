/**
 * A stopped container's probe by container ID (the kubelet shim's) is refused as a dead container,
 * the same answer whichever notices first: the container lookup (its netns check finds the sandbox's
 * netns gone and asks the runtime) or the probe itself (the lookup's check still stood, and the
 * helper's setns meets the vanished netns). Both orders are forced, not raced: the lookup's netns
 * check is made to stand for an hour, or to run on every call. Real containerd, real helper, the
 * agent's own PodProber and ContainerLocator in-process.
 *
 * Then the container lookup tells what caches by container ID (ExecSync's parsed commands) when a
 * container is replaced by a new ID for the same pod and name, or found exited.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'containerd', 'ctr', 'gcc', 'tar']);

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ExecSyncHandlerCache } from '../../agent/api/exec-sync.ts';
import { NetnsUnavailableError, PodNotFoundError } from '../../agent/errors.ts';
import { parseFeatureGates } from '../../agent/featuregates.ts';
import { CriResolver } from '../../agent/netns/cri-resolver.ts';
import { ResidentHelper } from '../../agent/netns/helper.ts';
import { NetnsPathChecker } from '../../agent/netns/netns-path.ts';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { NetnsResolverChain } from '../../agent/netns/resolver.ts';
import { PodProber } from '../../agent/prober/pod-prober.ts';
import { ContainerLocator } from '../../agent/prober/container-lookup.ts';
import type { PodInfo } from '../../agent/pods/types.ts';
import { encodeShimCommand } from '../../agent/contract/shim-command.ts';
import { FairLimiter } from '../../agent/scheduler/limiter.ts';
import { createContainerdLab, type ContainerdLab, type LabContainer, type LabSandbox } from '../lab/containerd.ts';

const NS = 'shim-dead';
const PORT = 8080;

let ctrd: ContainerdLab;
let helper: ResidentHelper;

beforeAll(async () => {
  ctrd = await createContainerdLab();
  helper = await ResidentHelper.start({ allowDirs: [ctrd.netnsDir] });
}, 120_000);

afterAll(async () => {
  await helper?.close();
  await ctrd?.destroy();
});

/** The pod as kubelet's list still shows it while the runtime stops it. */
function listed(sb: LabSandbox, app: LabContainer): PodInfo {
  return {
    uid: sb.uid, namespace: NS, name: sb.name, hostNetwork: false, podIPs: sb.ips, phase: 'Running', restartPolicy: 'Always',
    isStatic: false, podReady: true,
    containers: [{ name: 'app', kind: 'regular', ports: [], probes: {}, state: { containerID: `containerd://${app.id}`, running: true, startedAt: 0, terminated: false, ready: true, restartCount: 0 } }],
  };
}

/** The daemon's wiring of PodProber and ContainerLocator, with the lookup's netns check standing `netnsRecheckMs`. */
function proberOf(pods: Map<string, PodInfo>, netnsRecheckMs: number): { prober: PodProber; locator: ContainerLocator } {
  const cri = new CriResolver({ client: ctrd.client, pathChecker: new NetnsPathChecker({ extraDirs: [ctrd.netnsDir] }) });
  const index = { get: (u: string) => pods.get(u), pods: () => [...pods.values()] };
  const locator = new ContainerLocator({
    pods: index, runtime: ctrd.client, netnsRecheckMs,
    sandboxNetns: (res, id, who, uid) => cri.netnsOfStatus(res, id, who, uid),
  });
  const prober = new PodProber({
    pods: index,
    resolver: new NetnsResolverChain([cri]),
    limiter: new FairLimiter({ maxInFlight: 4, maxQueued: 16 }),
    sockets: helper,
    nodeSockets: new NodeSocketFactory(),
    gates: parseFeatureGates(''),
    kubeVersion: '1.34',
    classify: () => undefined,
    containers: locator,
  });
  return { prober, locator };
}

/** How a probe of a stopped container ended: the refusal, or an Error saying what it answered instead. */
async function probeStopped(netnsRecheckMs: number, name: string): Promise<{ refusal: Error }> {
  const sb = await ctrd.runSandbox({ name, namespace: NS });
  const app = await ctrd.runContainer(sb, { name: 'app' });
  const { prober } = proberOf(new Map([[sb.uid, listed(sb, app)]]), netnsRecheckMs);
  const call = { containerID: app.id, probeType: 'Readiness' as const, handler: { kind: 'tcp' as const, port: PORT }, timeoutSeconds: 2 };
  // Running: the lookup caches it, then its netns check (the second call); nothing listens, so the probe fails.
  for (let i = 0; i < 2; i++) expect((await prober.probe(call)).result).toBe('failure');
  await ctrd.stopSandbox(sb.id);
  const refusal = await prober.probe(call).then(
    (o) => new Error(`answered ${o.result} (${o.reason ?? ''}): ${o.message}`),
    (err: unknown) => err as Error,
  );
  await ctrd.removeSandbox(sb.id);
  return { refusal };
}

describe('a stopped container, probed by container ID', () => {
  it('is refused as dead when the probe meets the vanished netns before the lookup notices', async () => {
    const { refusal } = await probeStopped(3_600_000, 'probe-first');
    expect(refusal).toBeInstanceOf(NetnsUnavailableError);
    expect(refusal.message).toMatch(/^netns of pod shim-dead\/probe-first \(.*\) not resolvable: .*\bno(?: longer has a)? READY sandbox\b/);
  }, 60_000);

  it('is refused the same way when the lookup notices first', async () => {
    const { refusal } = await probeStopped(0, 'lookup-first');
    expect(refusal).toBeInstanceOf(NetnsUnavailableError);
    expect(refusal.message).toMatch(/^netns of pod shim-dead\/lookup-first \(.*\) not resolvable: .*\bno(?: longer has a)? READY sandbox\b/);
  }, 60_000);
});

describe('the lookup tells who caches by container ID', () => {
  it('drops a container\'s parsed ExecSync commands when the same pod and name get a new container ID, or it exits', async () => {
    const sb = await ctrd.runSandbox({ name: 'restarts', namespace: NS });
    const first = await ctrd.runContainer(sb, { name: 'app' });
    const other = await ctrd.runContainer(sb, { name: 'sidecar' });
    const cache = new ExecSyncHandlerCache();
    const gone: string[] = [];
    const cri = new CriResolver({ client: ctrd.client, pathChecker: new NetnsPathChecker({ extraDirs: [ctrd.netnsDir] }) });
    const locator = new ContainerLocator({
      pods: { get: () => undefined, pods: () => [] },
      runtime: ctrd.client,
      sandboxNetns: (res, id, who, uid) => cri.netnsOfStatus(res, id, who, uid),
      onContainerGone: (id) => {
        gone.push(id);
        cache.forgetContainer(id);
      },
    });
    const cmd = encodeShimCommand('readiness', { tcpSocket: { port: PORT } }).map((a) => Buffer.from(a));
    for (const c of [first, other]) {
      await locator.locate(c.id);
      cache.get(c.id, cmd);
    }
    expect(cache.size).toBe(2);
    // kubelet restarts 'app': attempt 1, a new ID in the same sandbox.
    const second = await ctrd.runContainer(sb, { name: 'app', attempt: 1 });
    await locator.locate(second.id);
    cache.get(second.id, cmd);
    expect(gone).toEqual([first.id]);
    expect(cache.size).toBe(2);
    const parses = cache.parses;
    cache.get(other.id, cmd);
    expect(cache.parses).toBe(parses);
    cache.get(first.id, cmd);
    expect(cache.parses).toBe(parses + 1);
    // The runtime has never heard of an ID: gone too.
    await expect(locator.locate('0'.repeat(64))).rejects.toBeInstanceOf(PodNotFoundError);
    expect(gone).toContain('0'.repeat(64));
    await ctrd.stopSandbox(sb.id);
    await ctrd.removeSandbox(sb.id);
  }, 60_000);
});
