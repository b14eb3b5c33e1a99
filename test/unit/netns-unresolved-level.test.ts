/**
 * A pod whose netns no resolver finds: a running pod's probe error is a warning (someone must look),
 * a pod kubelet is tearing down (deletionTimestamp in kubelet's latest list, or no longer in it) is
 * churn: logged at info as netns-gone, not a warning. Driven through the real ProbeManager, worker
 * and PodProber on a ManualClock; the resolver finds no netns for any pod, as the address resolver
 * answers for a pod whose IPs no netns holds.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { parseFeatureGates } from '../../agent/featuregates.ts';
import { createLogger } from '../../agent/log.ts';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { NetnsResolverChain, podLabel, resolveFailure, type NetnsResolver } from '../../agent/netns/resolver.ts';
import { PodProber } from '../../agent/prober/pod-prober.ts';
import type { PodInfo } from '../../agent/pods/types.ts';
import { FairLimiter } from '../../agent/scheduler/limiter.ts';
import { Harness, container, pod, running, tcpProbe, testClassify } from '../support/scheduler-harness.ts';

const nowhere: NetnsResolver = {
  name: 'address',
  resolve: async (p) => {
    throw resolveFailure('not-found', `netns of pod ${podLabel(p)} not resolvable: address: no netns holds ${p.podIPs.join(', ')}`, { uid: p.uid });
  },
};

let h: Harness | undefined;
afterEach(async () => {
  await h?.close();
  h = undefined;
});

interface Line {
  level: string;
  msg: string;
  podUID?: string;
  reason?: string;
  message?: string;
}

/** The harness with a PodProber whose pod index is `index` (kubelet's latest list), and its log lines. */
function setup(index: PodInfo[]): { h: Harness; lines: Line[] } {
  const lines: Line[] = [];
  const logger = createLogger({ level: 'debug', format: 'json', write: (l) => lines.push(JSON.parse(l) as Line) });
  const prober = new PodProber({
    pods: { get: (uid) => index.find((p) => p.uid === uid), pods: () => index },
    resolver: new NetnsResolverChain([nowhere]),
    limiter: new FairLimiter({ maxInFlight: 4, maxQueued: 16 }),
    sockets: new NodeSocketFactory(),
    nodeSockets: new NodeSocketFactory(),
    gates: parseFeatureGates(''),
    kubeVersion: '1.34',
    classify: testClassify,
  });
  h = new Harness({ runProbe: prober.runForWorker, logger });
  return { h, lines };
}

const errored = (lines: Line[], uid: string): Line[] => lines.filter((l) => l.msg === 'probe errored; result kept' && l.podUID === uid);

describe('netns-unresolved: the log level says whether the pod is going', () => {
  it('a running pod: warn, netns-unresolved; a pod being deleted: info, netns-gone; neither changes the result', async () => {
    const readiness = { Readiness: tcpProbe(1) };
    const steady = pod('steady', [container('app', readiness, running('c1', 0))]);
    // kubelet keeps probing readiness while a pod terminates.
    const leaving = pod('leaving', [container('app', readiness, running('c2', 0))], { deletionTimestamp: 0 });
    const { h: hh, lines: out } = setup([steady, leaving]);
    await hh.sync([steady, leaving]);

    expect(errored(out, 'steady')).toMatchObject([{ level: 'warn', reason: 'netns-unresolved' }]);
    expect(errored(out, 'steady')[0]?.message).toMatch(/no netns holds 127\.0\.0\.1/);
    expect(errored(out, 'leaving')).toMatchObject([{ level: 'info', reason: 'netns-gone' }]);
    expect(errored(out, 'leaving')[0]?.message).toMatch(/^pod is going \(being deleted\); not counted: .*no netns holds/);
    expect(out.filter((l) => l.level === 'warn' || l.level === 'error').map((l) => l.podUID)).toEqual(['steady']);
    // An error is thrown away, as kubelet does: no result changes for either.
    expect(hh.status('steady', 'app', 'Readiness')).toMatchObject({ result: 'unknown', consecutive: 0, lastReason: 'netns-unresolved' });
    expect(hh.status('leaving', 'app', 'Readiness')).toMatchObject({ result: 'unknown', consecutive: 0, lastReason: 'netns-gone' });
  });

  it('a pod kubelet\'s latest list no longer has (its workers not yet stopped): info, netns-gone', async () => {
    const readiness = { Readiness: tcpProbe(1) };
    const steady = pod('steady', [container('app', readiness, running('c1', 0))]);
    const gone = pod('gone', [container('app', readiness, running('c3', 0))]);
    const { h: hh, lines } = setup([steady]);
    await hh.sync([steady, gone]);
    expect(errored(lines, 'gone')).toMatchObject([{ level: 'info', reason: 'netns-gone' }]);
    expect(errored(lines, 'gone')[0]?.message).toMatch(/^pod is going \(no longer in kubelet's pod list\)/);
    expect(errored(lines, 'steady')).toMatchObject([{ level: 'warn', reason: 'netns-unresolved' }]);
  });
});
