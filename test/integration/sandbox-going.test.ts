/**
 * A pod whose sandbox the runtime has stopped is going: a liveness or startup failure seen then is
 * its shutdown, not the app's ill health, and is thrown away (an error) instead of counting toward
 * a restart. Against a real containerd: one running sandbox (whose netns the probe really runs in,
 * to a closed port) and one stopped sandbox (whose pod UID the probed pod carries). Likewise a pod
 * whose sandbox stopped is going, not a fault, when the CRI resolver finds no READY sandbox for it.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'containerd', 'ctr', 'gcc', 'tar']);

import { randomUUID } from 'node:crypto';
import { statSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseFeatureGates } from '../../agent/featuregates.ts';
import { CriClient } from '../../agent/netns/cri-client.ts';
import { ResidentHelper } from '../../agent/netns/helper.ts';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { CriResolver } from '../../agent/netns/cri-resolver.ts';
import { NetnsResolverChain, type NetnsResolver } from '../../agent/netns/resolver.ts';
import { PodProber } from '../../agent/prober/pod-prober.ts';
import type { ContainerInfo, PodInfo } from '../../agent/pods/types.ts';
import type { ProbeSpec } from '../../agent/probe/types.ts';
import { criSandboxGoing } from '../../agent/prober/sandbox-going.ts';
import { FairLimiter } from '../../agent/scheduler/limiter.ts';
import { createContainerdLab, type ContainerdLab, type LabSandbox } from '../lab/containerd.ts';

let ctrd: ContainerdLab;
let client: CriClient;
let helper: ResidentHelper;
let live: LabSandbox;
let gone: LabSandbox;

const spec = (): ProbeSpec => ({
  handler: { kind: 'tcp', port: 1 },
  timeoutSeconds: 1, periodSeconds: 10, successThreshold: 1, failureThreshold: 1, initialDelaySeconds: 0,
});

beforeAll(async () => {
  ctrd = await createContainerdLab();
  client = new CriClient(ctrd.endpoint);
  helper = await ResidentHelper.start({ allowDirs: [ctrd.netnsDir] });
  [live, gone] = await Promise.all([ctrd.runSandbox({ name: 'live' }), ctrd.runSandbox({ name: 'gone' })]);
  await ctrd.stopSandbox(gone.id);
}, 120_000);

afterAll(async () => {
  await helper?.close();
  client?.close();
  await ctrd?.destroy();
});

const fixed: NetnsResolver = {
  name: 'cri',
  resolve: async () => ({ path: live.netnsPath, resolver: 'cri', inode: statSync(live.netnsPath).ino }),
};

/**
 * A prober whose netns for every pod is the live sandbox's (the resolver is not what is under test),
 * or `resolver`'s; `pods` is kubelet's latest list.
 */
function prober(withRuntime: boolean, opts: { resolver?: NetnsResolver; pods?: PodInfo[] } = {}): PodProber {
  const pods = opts.pods ?? [];
  return new PodProber({
    pods: { get: (uid) => pods.find((p) => p.uid === uid), pods: () => pods },
    resolver: new NetnsResolverChain([opts.resolver ?? fixed]),
    limiter: new FairLimiter({ maxInFlight: 4, maxQueued: 16 }),
    sockets: helper,
    nodeSockets: new NodeSocketFactory(),
    gates: parseFeatureGates(''),
    kubeVersion: '1.34',
    classify: () => undefined,
    ...(withRuntime ? { sandboxGoing: criSandboxGoing(client) } : {}),
  });
}

function podOf(uid: string, liveness: ProbeSpec, readiness: ProbeSpec): { pod: PodInfo; container: ContainerInfo } {
  const container: ContainerInfo = {
    name: 'app', kind: 'regular', ports: [],
    probes: { Liveness: { ok: true, spec: liveness }, Readiness: { ok: true, spec: readiness } },
    state: { containerID: 'containerd://x', running: true, startedAt: 0, terminated: false, ready: true, restartCount: 0 },
  };
  const pod: PodInfo = {
    uid, namespace: 'lab', name: 'p', hostNetwork: false, podIPs: live.ips, phase: 'Running', restartPolicy: 'Always',
    isStatic: false, podReady: true, containers: [container],
  };
  return { pod, container };
}

describe('a stopped sandbox (the runtime knows the pod is going before the pod list shows it)', () => {
  it('criSandboxGoing: silent for a running sandbox and for a pod the runtime does not run; says why for a stopped one', async () => {
    const going = criSandboxGoing(client);
    expect(await going(live.uid)).toBeUndefined();
    expect(await going(randomUUID())).toBeUndefined();
    expect(await going(gone.uid)).toMatch(/^sandbox [0-9a-f]{12} is SANDBOX_NOTREADY$/);
  });

  it('turns a liveness failure of a going pod into an error (thrown away); readiness and running pods keep their failures', async () => {
    const liveness = spec();
    const readiness = spec();
    const g = podOf(gone.uid, liveness, readiness);
    const l = podOf(live.uid, liveness, readiness);
    const p = prober(true);
    const signal = new AbortController().signal;
    const lv = await p.runForWorker(g.pod, g.container, liveness, signal);
    expect(lv).toMatchObject({ result: 'error', reason: 'netns-gone' });
    expect(lv.message).toMatch(/^pod is going \(sandbox [0-9a-f]{12} is SANDBOX_NOTREADY\); not counted: dial tcp .*connection refused$/);
    expect(await p.runForWorker(g.pod, g.container, readiness, signal)).toMatchObject({ result: 'failure', reason: 'refused' });
    expect(await p.runForWorker(l.pod, l.container, liveness, signal)).toMatchObject({ result: 'failure', reason: 'refused' });
    // Without the runtime's word, the same probe is the failure kubelet would count.
    expect(await prober(false).runForWorker(g.pod, g.container, liveness, signal)).toMatchObject({ result: 'failure', reason: 'refused' });
  });

  it('the CRI resolver: a pod whose sandbox stopped is going (netns-gone, not counted), a pod it never ran is netns-unresolved', async () => {
    const readiness = spec();
    const g = podOf(gone.uid, spec(), readiness);
    const stranger = podOf(randomUUID(), spec(), readiness);
    const signal = new AbortController().signal;
    const p = prober(false, { resolver: new CriResolver({ client }), pods: [g.pod, stranger.pod] });
    const gv = await p.runForWorker(g.pod, g.container, readiness, signal);
    expect(gv).toMatchObject({ result: 'error', reason: 'netns-gone' });
    expect(gv.message).toMatch(/no READY sandbox \([0-9a-f]{12,13} is SANDBOX_NOTREADY\)/);
    const sv = await p.runForWorker(stranger.pod, stranger.container, readiness, signal);
    expect(sv).toMatchObject({ result: 'error', reason: 'netns-unresolved' });
    expect(sv.message).toMatch(/no READY sandbox/);
  });
});
