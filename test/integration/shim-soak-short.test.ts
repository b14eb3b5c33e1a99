/**
 * The CI variant of `make soak-shim` (test/soak/shim-soak.ts): the same code on the lab's real containerd,
 * the shim and the agent as separate processes, 16 pods' rewritten readiness (HTTP) and liveness (TCP)
 * probes every second through the shim, 4 pods replaced every 15 s, for about 35 s with the `:authority`
 * kubelet ≥ 1.31 sends (`localhost`; shim-grpc-go.test.ts churns with the socket path older kubelets
 * send, and shim-authority.test.ts checks both). Too short to judge a slope; it holds
 * every answer right (running pods succeed, stopped and removed containers are refused as dead ones), both processes
 * alive, and the agent and the shim under their limits (deploy/base/daemonset.yaml's 224 Mi; the shim
 * unit's MemoryMax=256M).
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'nsenter', 'containerd', 'ctr', 'dpkg-deb']);

import * as grpc from '@grpc/grpc-js';
import { describe, expect, it } from 'vitest';
import { AGENT_LIMIT_MB, SHIM_PEAK_MB, formatResult, isDeadContainerRefusal, runShimSoak, slopePerMinute, type ShimSoakOptions } from '../soak/shim-soak.ts';

/** probe-agent-shim.service: MemoryMax=256M. */
const SHIM_MEMORY_MAX_MB = 256;

function options(authority: ShimSoakOptions['authority']): ShimSoakOptions {
  return {
    minutes: 35 / 60, pods: 16, replacePods: 4, replaceEverySeconds: 15, authority, sampleEverySeconds: 3,
    // A slope over 17 s of a process still warming up says nothing: only the long soak bounds it.
    shimSlopeBoundMBPerMin: Infinity, shimPeakBoundMB: SHIM_PEAK_MB, agentLimitMB: AGENT_LIMIT_MB, log: () => {},
  };
}

describe('shim soak, short', () => {
  it(':authority localhost: every probe answered right through pod churn, the shim and the agent within their limits', async () => {
    const r = await runShimSoak(options('localhost'));
    const report = formatResult(r);
    expect(r.failures, report).toEqual([]);
    // The churn happened and was judged: pods replaced, their dead containers probed and refused.
    expect(r.replaced, report).toBeGreaterThanOrEqual(4);
    expect(r.probes.dead.ok, report).toBeGreaterThanOrEqual(r.replaced * 4);
    expect(r.probes.healthy.ok, report).toBeGreaterThan(16 * 2 * 10);
    expect(r.samples.length, report).toBeGreaterThanOrEqual(5);
    expect(r.shimRss.peakMB, report).toBeGreaterThan(0);
    expect(r.shimRss.peakMB, report).toBeLessThan(SHIM_MEMORY_MAX_MB);
    expect(r.agentRss.peakMB, report).toBeLessThan(AGENT_LIMIT_MB);
  }, 240_000);
});

describe('slopePerMinute', () => {
  it('is the least-squares slope in units per minute', () => {
    expect(slopePerMinute([{ t: 0, y: 10 }, { t: 30, y: 11 }, { t: 60, y: 12 }])).toBeCloseTo(2);
    expect(slopePerMinute([{ t: 0, y: 5 }, { t: 60, y: 5 }])).toBe(0);
    expect(slopePerMinute([{ t: 0, y: 5 }])).toBe(0);
  });
});

describe('isDeadContainerRefusal', () => {
  const sb = { namespace: 'shim-soak', name: 'soak-3', uid: '0b7c5a43-2f0e-4f4e-9a51-000000000003' };
  const app = { id: '9af77a187b4461d5e1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7081' };
  const err = (code: grpc.status, details: string) => ({ ok: false as const, code, details });
  it("counts the agent's two refusals of a dead container, as the shim passes them on", () => {
    expect(isDeadContainerRefusal(err(grpc.status.NOT_FOUND, 'probe-agent refused the readiness probe: container 9af77a187b446 is not known on this node (the runtime has no such container)'), 'readiness', sb, app)).toBe(true);
    expect(isDeadContainerRefusal(err(grpc.status.NOT_FOUND, 'probe-agent refused the liveness probe: container 9af77a187b446 is not known on this node'), 'liveness', sb, app)).toBe(true);
    expect(isDeadContainerRefusal(err(grpc.status.UNAVAILABLE, `probe-agent refused the liveness probe: netns of pod shim-soak/soak-3 (${sb.uid}) not resolvable: cri: pod shim-soak/soak-3 (${sb.uid}): no READY sandbox`), 'liveness', sb, app)).toBe(true);
    expect(isDeadContainerRefusal(err(grpc.status.UNAVAILABLE, `probe-agent refused the readiness probe: netns of pod shim-soak/soak-3 (${sb.uid}) not resolvable: the runtime no longer has a READY sandbox for it (x); not falling back`), 'readiness', sb, app)).toBe(true);
  });
  it('counts nothing else: an exit code, another error, another container or pod, another kind', () => {
    expect(isDeadContainerRefusal({ ok: true, raw: Buffer.alloc(0), msg: { exitCode: 0 } }, 'readiness', sb, app)).toBe(false);
    expect(isDeadContainerRefusal(err(grpc.status.UNAVAILABLE, 'probe-agent did not run the readiness probe: connect ECONNREFUSED /run/probe-agent/probe.sock'), 'readiness', sb, app)).toBe(false);
    expect(isDeadContainerRefusal(err(grpc.status.UNAVAILABLE, 'probe-agent shim: runtime /run/containerd/containerd.sock unavailable: connection closed'), 'readiness', sb, app)).toBe(false);
    expect(isDeadContainerRefusal(err(grpc.status.UNAVAILABLE, `probe-agent refused the readiness probe: netns of pod shim-soak/soak-3 (${sb.uid}) not resolvable: cri: connect ECONNREFUSED`), 'readiness', sb, app)).toBe(false);
    expect(isDeadContainerRefusal(err(grpc.status.RESOURCE_EXHAUSTED, 'probe-agent refused the readiness probe: probe refused: node queue full'), 'readiness', sb, app)).toBe(false);
    expect(isDeadContainerRefusal(err(grpc.status.DEADLINE_EXCEEDED, 'Deadline exceeded'), 'readiness', sb, app)).toBe(false);
    expect(isDeadContainerRefusal(err(grpc.status.NOT_FOUND, 'probe-agent refused the readiness probe: container 1234567890abc is not known on this node'), 'readiness', sb, app)).toBe(false);
    expect(isDeadContainerRefusal(err(grpc.status.UNAVAILABLE, 'probe-agent refused the readiness probe: netns of pod shim-soak/soak-4 (other-uid) not resolvable: cri: pod shim-soak/soak-4 (other-uid): no READY sandbox'), 'readiness', sb, app)).toBe(false);
    expect(isDeadContainerRefusal(err(grpc.status.NOT_FOUND, 'probe-agent refused the liveness probe: container 9af77a187b446 is not known on this node'), 'readiness', sb, app)).toBe(false);
  });
});
