/**
 * Property: no value a pod sets reaches a deadline, a timer or a runtime call unbounded (issue 43).
 * Pods are generated (test/support/prng.ts, seeded: a failure names its seed) from every extreme the
 * API server admits for the fields gates mode turns into time: terminationGracePeriodSeconds (pod:
 * int64 >= 0; probe: int64 > 0), probe timeoutSeconds/periodSeconds/thresholds/initialDelaySeconds
 * (int32), a preStop sleep's seconds (int64), each also absent, 0, negative, non-integer, beyond its
 * type. Each goes through the pod model as the agent reads kubelet's list, and every derived value
 * must be finite and within its clamp; the StopContainer deadline must be one grpc-js accepts (its own
 * check, the one that threw "Deadline is too far in the future" and made the agent exit).
 *
 * Then the agent's stop path runs for real (the GatesController, real timers, the ApiWriter against
 * the API server stand-in: a real kube-apiserver cannot run in a unit test), the runtime's StopContainer
 * recorded at the CRI boundary: every stop is asked with a clamped timeout and settles; a preStop sleep
 * of years neither ends after 1 ms (a Node timer's overflow) nor holds the agent's close.
 */
import { afterEach, describe, expect, it } from 'vitest';
// grpc-js's own deadline check (not exported from its index): the exact code that threw.
import * as grpcDeadline from '@grpc/grpc-js/build/src/deadline.js';
import { ApiWriter } from '../../agent/gates/api-writer.ts';
import { GatesController, hookTimeoutSeconds, preStopPlan, runtimeCallMs, stopGraceSeconds, stopTimeoutSeconds } from '../../agent/gates/controller.ts';
import { createLogger } from '../../agent/log.ts';
import { GATES_CONDITION_TYPE, parsePodList } from '../../agent/pods/pod-model.ts';
import type { PodInfo } from '../../agent/pods/types.ts';
import { SPEC_LIMITS } from '../../agent/probe/spec.ts';
import { rewritePodGates } from '../../agent/rewrite/gates-rewrite.ts';
import { ResultsStore } from '../../agent/scheduler/results-store.ts';
import { until } from '../support/api-harness.ts';
import { startApiServerStandIn } from '../support/api-server-standin.ts';
import { mulberry32 } from '../support/prng.ts';

type Obj = Record<string, any>;

const MAX = SPEC_LIMITS.maxDurationSeconds;
/** What JSON.parse makes of the API's int64 extremes, and the edges around each bound. */
const INT64_MAX = 9223372036854775807;
const EXTREMES: unknown[] = [INT64_MAX, -INT64_MAX, 2 ** 53, 400000000000, MAX, MAX + 1, 2147483647, 2147483648, 3601, 3600, 2, 1, 0, -1, 1.5, 1e-9, undefined, null];
const SEEDS = [1, 43, 20261207];
const PODS_PER_SEED = 200;

let cleanup: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  for (const c of cleanup.reverse()) await c();
  cleanup = [];
});

function pick<T>(rand: () => number, from: readonly T[]): T {
  return from[Math.floor(rand() * from.length)]!;
}

/** A gates pod (as the webhook's rewrite leaves it) whose time fields come from EXTREMES; absent ones left out. */
function generatedPod(rand: () => number, i: number): Obj {
  const set = (o: Obj, k: string): void => {
    const v = pick(rand, EXTREMES);
    if (v !== undefined) o[k] = v;
  };
  const liveness: Obj = { httpGet: { path: '/healthz', port: 8081 } };
  const readiness: Obj = { httpGet: { path: '/ready', port: 8080 } };
  for (const p of [liveness, readiness]) for (const k of ['timeoutSeconds', 'periodSeconds', 'failureThreshold', 'initialDelaySeconds']) set(p, k);
  set(liveness, 'terminationGracePeriodSeconds');
  const sleep: Obj = {};
  set(sleep, 'seconds');
  const spec: Obj = { nodeName: 'node-a', containers: [{ name: 'app', image: 'app', readinessProbe: readiness, livenessProbe: liveness, lifecycle: { preStop: { sleep } } }] };
  set(spec, 'terminationGracePeriodSeconds');
  return rewritePodGates({ metadata: { name: `p${i}`, namespace: 'shop', uid: `uid-${i}` }, spec }).pod as Obj;
}

/** As kubelet's /pods shows it: running container c-<i>, our condition True. */
function listed(pod: Obj, i: number): Obj {
  return {
    ...pod,
    status: {
      phase: 'Running', podIP: '10.0.0.5', podIPs: [{ ip: '10.0.0.5' }], conditions: [{ type: GATES_CONDITION_TYPE, status: 'True' }],
      containerStatuses: [{ name: 'app', containerID: `containerd://c-${i}`, ready: true, started: true, restartCount: 0, state: { running: { startedAt: '2026-01-01T00:00:00Z' } } }],
    },
  };
}

/** The preStop sleep of a pod's container, in ms (0: none). */
function sleepMs(p: PodInfo): number {
  const plan = preStopPlan(p.containers[0]!.preStop, stopGraceSeconds(p, p.containers[0]!, 'Liveness'));
  return plan.kind === 'sleep' ? plan.ms : 0;
}

function checkBounds(info: PodInfo): void {
  const grace = info.gates!.terminationGracePeriodSeconds;
  expect(Number.isInteger(grace) && grace >= 0 && grace <= MAX).toBe(true);
  for (const c of info.containers) {
    for (const [type, probe] of Object.entries(c.probes)) {
      if (!probe.ok) {
        // Refused with a clear reason (a field beyond its type): the pod's, said, never a throw.
        expect(probe.error).toMatch(/^spec\.containers\[0\]\.(liveness|readiness)Probe/);
        continue;
      }
      const s = probe.spec;
      expect(s.timeoutSeconds >= 1 && s.timeoutSeconds <= SPEC_LIMITS.maxTimeoutSeconds).toBe(true);
      for (const v of [s.periodSeconds, s.failureThreshold, s.successThreshold, s.initialDelaySeconds]) expect(Number.isInteger(v) && v >= 0 && v <= SPEC_LIMITS.maxInt32).toBe(true);
      if (s.terminationGracePeriodSeconds !== undefined) expect(s.terminationGracePeriodSeconds >= 1 && s.terminationGracePeriodSeconds <= MAX).toBe(true);
      if (type === 'Readiness') continue;
      const stopGrace = stopGraceSeconds(info, c, type as 'Liveness');
      expect(Number.isInteger(stopGrace) && stopGrace >= 0 && stopGrace <= MAX).toBe(true);
      for (const elapsed of [0, 999, stopGrace * 1000, Number.MAX_SAFE_INTEGER]) {
        const t = stopTimeoutSeconds(stopGrace, elapsed);
        expect(Number.isInteger(t) && t >= 2 && t <= Math.max(2, stopGrace)).toBe(true);
        const ms = runtimeCallMs(t);
        expect(Number.isFinite(ms) && ms >= 30_000).toBe(true);
        // grpc-js turns the deadline into its grpc-timeout header; beyond what that holds it throws.
        expect(() => grpcDeadline.getDeadlineTimeoutString(Date.now() + ms)).not.toThrow();
      }
      const hook = hookTimeoutSeconds(stopGrace);
      expect(hook >= 1 && hook <= SPEC_LIMITS.maxTimeoutSeconds).toBe(true);
      const plan = preStopPlan(c.preStop, stopGrace);
      if (plan.kind === 'sleep') expect(Number.isInteger(plan.ms) && plan.ms >= 0 && plan.ms <= MAX * 1000).toBe(true);
      else expect(plan).toMatchObject({ kind: 'invalid', message: /^sleep hook: seconds must be a whole number >= 0/ });
    }
  }
}

describe('gates mode bounds every time a pod sets', () => {
  it('derived deadlines and timers are finite, within their clamps, and ones grpc-js accepts', () => {
    for (const seed of SEEDS) {
      const rand = mulberry32(seed);
      const items = Array.from({ length: PODS_PER_SEED }, (_, i) => listed(generatedPod(rand, i), i));
      const { pods, errors } = parsePodList({ kind: 'PodList', apiVersion: 'v1', items });
      // Nothing here makes a pod unreadable: a bad probe is that probe's error.
      expect(errors, `seed ${seed}`).toEqual([]);
      expect(pods).toHaveLength(PODS_PER_SEED);
      for (const info of pods) checkBounds(info);
    }
  });

  it('the stop path runs for every extreme: clamped StopContainer timeouts, all settled; a sleep of years is a wait, and close ends it', async () => {
    const api = await startApiServerStandIn();
    cleanup.push(() => api.close());
    const writer = new ApiWriter({ url: api.url, nodeName: 'node-a', conditionType: GATES_CONDITION_TYPE });
    cleanup.push(() => writer.close());
    const rand = mulberry32(43);
    const infos: PodInfo[] = [];
    for (let i = 0; infos.length < 30 && i < 4000; i++) {
      const pod = generatedPod(rand, i);
      const { pods } = parsePodList({ kind: 'PodList', apiVersion: 'v1', items: [listed(pod, i)] });
      const info = pods[0]!;
      const c = info.containers[0]!;
      // A sleep this test could not wait out (1..30 s) is left to the bounds above.
      if (c.probes.Liveness?.ok && (sleepMs(info) === 0 || sleepMs(info) > 30_000)) {
        infos.push(info);
        api.pods.push(pod);
      }
    }
    expect(infos.length).toBe(30);
    const sleeping = new Set(infos.filter((p) => sleepMs(p) > 0).map((p) => `c-${p.name.slice(1)}`));
    expect(sleeping.size).toBeGreaterThan(0);
    expect(sleeping.size).toBeLessThan(infos.length);

    const stops: Array<{ id: string; timeout: number }> = [];
    const ops: string[] = [];
    const lines: string[] = [];
    const results = new ResultsStore();
    const controller = new GatesController({
      results, writer, log: createLogger({ level: 'info', write: (l) => lines.push(l) }),
      // The runtime's boundary (CRI StopContainer), recorded; one in five fails, as a runtime may.
      stopper: {
        stopContainer: async (id, timeout) => {
          stops.push({ id, timeout });
          if (stops.length % 5 === 0) throw new Error('runtime refused');
        },
      },
      onOp: (op, ok) => ops.push(`${op}:${ok}`),
      // Few write slots: most stops wait for one before they go (a wait that must not spin the loop).
      maxInFlight: 2,
    });
    controller.sync(infos);
    for (const p of infos) {
      results.upsert({
        key: { podUID: p.uid, containerName: 'app', probeType: 'Liveness' }, namespace: 'shop', podName: p.name, containerID: p.containers[0]!.state!.containerID,
        result: 'failure', consecutive: 3, lastProbeTime: Date.now(), lastMessage: 'HTTP probe failed with statuscode: 503', onHold: true, started: true, ready: false,
      });
    }
    const expected = infos.length - sleeping.size;
    await until(() => ops.filter((o) => o.startsWith('stop:')).length === expected, 60_000, 'every stop not held by a sleep');
    for (const s of stops) {
      expect(Number.isInteger(s.timeout) && s.timeout >= 2 && s.timeout <= MAX).toBe(true);
      // A sleeping hook's container is not stopped yet: its wait did not overflow to 1 ms.
      expect(sleeping.has(s.id)).toBe(false);
    }
    expect(ops.filter((o) => o === 'stop:false')).toHaveLength(Math.floor(expected / 5));
    // The failed stops are each their pod's: logged with the pod, nothing thrown past the controller.
    expect(lines.filter((l) => l.includes('container not stopped'))).toHaveLength(Math.floor(expected / 5));
    expect(lines.some((l) => l.includes('"level":"error"'))).toBe(false);
    // close() ends the sleeps (a 292-year one included) and resolves.
    await controller.close();
    expect(stops.filter((s) => sleeping.has(s.id))).toEqual([]);
  });
});
