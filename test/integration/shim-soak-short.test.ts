/**
 * The CI variant of `make soak-shim` (test/soak/shim-soak.ts): the same code on the lab's real containerd,
 * the shim and the agent as separate processes, 16 pods' rewritten readiness (HTTP) and liveness (TCP)
 * probes every second through the shim, 4 pods replaced every 15 s; about 35 s for each `:authority`
 * kubelet sends (the socket path before 1.31, `localhost` after). Too short to judge a slope; it holds
 * every answer right (running pods succeed, stopped and removed containers are refused), both processes
 * alive, and the agent and the shim under their limits (deploy/base/daemonset.yaml's 224 Mi; the shim
 * unit's MemoryMax=256M).
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'nsenter', 'containerd', 'ctr', 'dpkg-deb', 'nice']);

import { describe, expect, it } from 'vitest';
import { AGENT_LIMIT_MB, SHIM_PEAK_MB, formatResult, runShimSoak, slopePerMinute, type ShimSoakOptions } from '../soak/shim-soak.ts';

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
  for (const authority of ['path', 'localhost'] as const) {
    it(`:authority ${authority}: every probe answered right through pod churn, the shim and the agent within their limits`, async () => {
      const r = await runShimSoak(options(authority));
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
  }
});

describe('slopePerMinute', () => {
  it('is the least-squares slope in units per minute', () => {
    expect(slopePerMinute([{ t: 0, y: 10 }, { t: 30, y: 11 }, { t: 60, y: 12 }])).toBeCloseTo(2);
    expect(slopePerMinute([{ t: 0, y: 5 }, { t: 60, y: 5 }])).toBe(0);
    expect(slopePerMinute([{ t: 0, y: 5 }])).toBe(0);
  });
});
