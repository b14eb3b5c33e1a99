/**
 * How often readiness runs, against kubelet's worker loop (pkg/kubelet/prober/worker.go and
 * UpdatePodStatus in prober_manager.go): a run per period, plus one manual run when a pod sync
 * finds a started container not ready (a one-slot channel, so a second trigger while one is
 * pending is dropped). The `make demo` case (readiness periodSeconds 2, kubelet polled every 2 s,
 * "success x6") is replayed on a manual clock with the real prober against a real HTTP server:
 * six runs take ~9 s of the agent's life (the demo waits for the 10 s liveness jitter), not 3 s.
 * These tests pin that polls, liveness updates and the agent's start add no runs beyond kubelet's.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { PodInfo } from '../../agent/pods/types.ts';
import type { RunProbe } from '../../agent/scheduler/worker.ts';
import { container, Harness, httpProbe, pod, realRunProbe, running, tcpProbe, ToggleServer } from '../support/scheduler-harness.ts';

let web: ToggleServer;
let harness: Harness | undefined;

beforeAll(async () => {
  web = await ToggleServer.start({ httpDelayMs: 0 });
});

afterAll(async () => {
  await web.down();
});

afterEach(async () => {
  await harness?.close();
  harness = undefined;
});

/** A harness whose real prober also notes when each readiness run started (ms after t0). */
function timedHarness(opts: { agentStartOffsetMs: number; random?: () => number }): { h: Harness; readinessRuns: number[] } {
  const readinessRuns: number[] = [];
  const real = realRunProbe();
  let h!: Harness;
  const runProbe: RunProbe = (p, c, spec, signal) => {
    // Pods are rebuilt on every poll: the worker's spec is equal to, not the same object as, the container's.
    const readiness = c.probes.Readiness;
    if (readiness?.ok && JSON.stringify(readiness.spec) === JSON.stringify(spec)) readinessRuns.push(h.now() - h.t0);
    return real(p, c, spec, signal);
  };
  h = new Harness({ ...opts, runProbe });
  harness = h;
  return { h, readinessRuns };
}

/** The demo's web pod: liveness every 10 s, readiness every 2 s, both HTTP on the same server. */
function demoPod(h: Harness, state: ReturnType<typeof running>, podReady: boolean): PodInfo {
  return pod('web', [container('app', {
    Liveness: httpProbe(web.port, { periodSeconds: 10 }),
    Readiness: httpProbe(web.port, { periodSeconds: 2 }),
  }, state)], { podReady });
}

/** Advances `totalMs` in 2 s kubelet polls, each handing the manager a pod list as the pod source would. */
async function pollFor(h: Harness, totalMs: number, podAt: (i: number) => PodInfo): Promise<void> {
  for (let i = 1; i * 2000 <= totalMs; i++) {
    // Two 1 s steps, each waiting for the real probes it started: one 2 s jump would let the manual
    // clock run past a probe still in flight, and its queued follow-up would land a second late.
    await h.step(1000);
    await h.step(1000);
    await h.sync([podAt(i)]);
  }
}

describe('readiness runs as often as kubelet would run it', () => {
  it('the demo: a just-started agent, a container running for long: first run, the queued manual run, then every period', async () => {
    // Jitter is half a period: readiness begins at t0+1s, liveness at t0+5s.
    const { h, readinessRuns } = timedHarness({ agentStartOffsetMs: 0, random: () => 0.5 });
    const state = running('c1', h.t0, 3_600_000, { ready: true, started: true });
    await h.sync([demoPod(h, state, true)]);
    await pollFor(h, 10_000, () => demoPod(h, state, true));
    // Kubelet: the sync that added the pod found no readiness result and queued one manual run;
    // the worker takes it right after its first probe. Then one run per period, whatever the polls.
    expect(readinessRuns).toEqual([1000, 1000, 3000, 5000, 7000, 9000]);
    expect(h.status('web', 'app', 'Readiness')).toMatchObject({ result: 'success', consecutive: 6, ready: true });
    expect(h.observer.runsOf('Liveness')).toBe(1);
    // At 3 s of the agent's life the count is 3, not 6: the demo printed after its 10 s liveness jitter.
    expect(readinessRuns.filter((t) => t <= 3000)).toHaveLength(3);
  });

  it('a container that just started: initial failure, one manual run, then the period; liveness updates add nothing', async () => {
    const { h, readinessRuns } = timedHarness({ agentStartOffsetMs: -3_600_000 });
    const state = running('c2', h.t0, 0);
    await h.sync([demoPod(h, state, false)]);
    await pollFor(h, 8000, () => demoPod(h, state, false));
    expect(readinessRuns).toEqual([0, 0, 2000, 4000, 6000, 8000]);
    expect(h.status('web', 'app', 'Readiness')).toMatchObject({ result: 'success', ready: true });
  });

  it('a not-ready container is triggered by a changed pod only, once per change, never by an unchanged poll', async () => {
    const { h, readinessRuns } = timedHarness({ agentStartOffsetMs: -3_600_000 });
    await web.down();
    try {
      const notReady = (restartCount: number): PodInfo => pod('web', [container('app', {
        Readiness: tcpProbe(web.port, { periodSeconds: 10, failureThreshold: 1 }),
      }, running('c3', h.t0, 0, { restartCount }))]);
      await h.sync([notReady(0)]);
      expect(readinessRuns).toEqual([0, 0]);
      // Unchanged polls: only the period (t0+10s) runs the probe.
      await pollFor(h, 10_000, () => notReady(0));
      expect(readinessRuns).toEqual([0, 0, 10_000]);
      // A pod whose status changed is a kubelet pod sync: exactly one manual run, and the period restarts.
      await h.step(2000);
      await h.sync([notReady(1)]);
      expect(readinessRuns).toEqual([0, 0, 10_000, 12_000]);
      await pollFor(h, 10_000, () => notReady(1));
      expect(readinessRuns).toEqual([0, 0, 10_000, 12_000, 22_000]);
      expect(h.status('web', 'app', 'Readiness')).toMatchObject({ result: 'failure', ready: false });
    } finally {
      await web.up();
    }
  });
});
