/**
 * ProbeManager: worker reconciliation, kubelet's UpdatePodStatus rules for started/ready, the
 * restart grace, and fair bounded concurrency, with real TCP probes against servers on 127.0.0.1.
 */
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { realClock } from '../../agent/scheduler/clock.ts';
import { FairLimiter } from '../../agent/scheduler/limiter.ts';
import { ProbeManager } from '../../agent/scheduler/manager.ts';
import { ResultsStore } from '../../agent/scheduler/results-store.ts';
import {
  Harness,
  RecordingObserver,
  ToggleServer,
  container,
  execProbe,
  pod,
  running,
  httpProbe,
  realRunProbe,
  tcpProbe,
  testClassify,
} from '../support/scheduler-harness.ts';

const PERIOD = 10_000;
const HOUR = 3_600_000;
let server: ToggleServer;
const cleanups: (() => Promise<void>)[] = [];

beforeEach(async () => {
  server = await ToggleServer.start();
  cleanups.push(() => server.down());
});

afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function harness(opts: ConstructorParameters<typeof Harness>[0] = {}): Harness {
  const h = new Harness(opts);
  cleanups.push(() => h.close());
  return h;
}

describe('ProbeManager', () => {
  it('starts workers for network probes of containers and sidecars, skips exec probes, and tracks pods left to kubelet', async () => {
    const h = harness();
    const now = h.now();
    const ours = pod('ours', [
      container('app', { Liveness: tcpProbe(server.port), Readiness: execProbe() }, running('a', now)),
      container('proxy', { Readiness: tcpProbe(server.port) }, running('b', now), { kind: 'sidecar' }),
    ]);
    const hostNet = pod('hostnet', [container('app', { Liveness: tcpProbe(server.port) }, running('c', now))], { hostNetwork: true });
    const execOnly = pod('exec', [container('app', { Liveness: execProbe() }, running('d', now))]);
    const none = pod('none', [container('app', {}, running('e', now))]);
    await h.sync([ours, hostNet, execOnly, none]);

    expect(h.store.list().map((s) => `${s.key.podUID}/${s.key.containerName}/${s.key.probeType}`)).toEqual([
      'ours/app/Liveness',
      'ours/proxy/Readiness',
    ]);
    expect(h.observer.started.map((m) => `${m.key.containerName}/${m.key.probeType}/${m.protocol}`).sort()).toEqual([
      'app/Liveness/tcp',
      'proxy/Readiness/tcp',
    ]);
    expect(h.manager.notOurs().sort((a, b) => a.pod.uid.localeCompare(b.pod.uid))).toEqual([
      { pod: { uid: 'exec', namespace: 'ns', name: 'pod-exec' }, reason: 'exec-only' },
      { pod: { uid: 'hostnet', namespace: 'ns', name: 'pod-hostnet' }, reason: 'host-network' },
      { pod: { uid: 'none', namespace: 'ns', name: 'pod-none' }, reason: 'no-network-probes' },
    ]);

    // Pods that go away take their workers, results and not-ours entries with them.
    await h.sync([execOnly]);
    expect(h.manager.workerCount()).toBe(0);
    expect(h.store.list()).toEqual([]);
    expect(h.observer.stopped).toHaveLength(2);
    expect(h.manager.notOurs().map((p) => p.pod.uid)).toEqual(['exec']);
  });

  it('restarts only the worker whose probe spec changed', async () => {
    const h = harness();
    const c = (readinessPeriod: number): ReturnType<typeof container> =>
      container('app', { Liveness: tcpProbe(server.port), Readiness: tcpProbe(server.port, { periodSeconds: readinessPeriod }) }, running('a', h.t0));
    await h.sync([pod('u1', [c(10)])]);
    await h.sync([pod('u1', [c(10)])]);
    expect(h.observer.started).toHaveLength(2);

    await h.step(3_000);
    await h.sync([pod('u1', [c(4)])]);
    expect(h.observer.stopped.map((m) => m.key.probeType)).toEqual(['Readiness']);
    expect(h.observer.started).toHaveLength(3);
    // The new worker runs at once and then every 4 s.
    expect(h.status('u1', 'app', 'Readiness')?.lastProbeTime).toBe(h.t0 + 3_000);
    await h.step(4_000);
    expect(h.status('u1', 'app', 'Readiness')?.lastProbeTime).toBe(h.t0 + 7_000);
    expect(h.status('u1', 'app', 'Liveness')?.lastProbeTime).toBe(h.t0);
  });

  it('derives started and ready like kubelet: no probe means started/ready, a readiness probe must succeed', async () => {
    const h = harness();
    await server.down();
    await h.sync([
      pod('live-only', [container('app', { Liveness: tcpProbe(server.port) }, running('a', h.t0))]),
      pod('ready', [container('app', { Liveness: tcpProbe(server.port, { failureThreshold: 9 }), Readiness: tcpProbe(server.port) }, running('b', h.t0))]),
      pod('stopped', [container('app', { Liveness: tcpProbe(server.port) }, { containerID: 'containerd://c', running: false, terminated: false, ready: false, restartCount: 0 })]),
    ]);
    expect(h.status('live-only', 'app', 'Liveness')).toMatchObject({ started: true, ready: true });
    expect(h.status('ready', 'app', 'Liveness')).toMatchObject({ started: true, ready: false });
    expect(h.status('ready', 'app', 'Readiness')).toMatchObject({ started: true, ready: false, result: 'failure' });
    expect(h.status('stopped', 'app', 'Liveness')).toMatchObject({ started: false, ready: false });
  });

  it('triggers readiness when a changed pod shows a started, not ready container; an unchanged pod triggers nothing', async () => {
    const h = harness();
    const probes = { Readiness: tcpProbe(server.port, { failureThreshold: 1 }) };
    const created = { containerID: 'containerd://a', running: false, terminated: false, ready: false, restartCount: 0 };
    await h.sync([pod('u1', [container('app', probes, created)])]);
    expect(h.status('u1', 'app', 'Readiness')).toMatchObject({ started: false, ready: false, lastProbeTime: 0 });
    await h.step(3_000);
    // The container starts: kubelet's pod sync triggers the readiness probe now, not at t0+10s.
    await h.sync([pod('u1', [container('app', probes, running('a', h.now()))])]);
    expect(h.status('u1', 'app', 'Readiness')).toMatchObject({ started: true, ready: true, lastProbeTime: h.t0 + 3_000 });

    // Not ready again, but the pod objects of later polls are unchanged: they must not add runs.
    await server.down();
    await h.step(10_000); // t0+13s, a period after the triggered run: fails, not ready
    expect(h.status('u1', 'app', 'Readiness')).toMatchObject({ ready: false });
    const runs = h.observer.runsOf('Readiness');
    for (let i = 0; i < 3; i++) {
      await h.step(1_000);
      await h.sync([pod('u1', [container('app', probes, running('a', h.t0 + 3_000))])]);
    }
    expect(h.observer.runsOf('Readiness')).toBe(runs);
  });

  it('leaves exec startup and readiness probes to kubelet and uses its reported state for them', async () => {
    const h = harness();
    const state = running('a', h.t0, 0, { started: false, ready: true });
    await h.sync([pod('u1', [container('app', { Startup: execProbe(), Readiness: execProbe(), Liveness: tcpProbe(server.port) }, state)])]);
    expect(h.status('u1', 'app', 'Liveness')).toMatchObject({ started: false, ready: false, lastProbeTime: 0 });
    await h.sync([pod('u1', [container('app', { Startup: execProbe(), Readiness: execProbe(), Liveness: tcpProbe(server.port) }, { ...state, started: true })])]);
    expect(h.status('u1', 'app', 'Liveness')).toMatchObject({ started: true, ready: true });
    await h.step(PERIOD);
    expect(h.status('u1', 'app', 'Liveness')?.lastProbeTime).toBe(h.t0 + PERIOD);
  });

  it('restart grace: long-running containers keep ready until a result, unless they have a readiness probe and the pod was not Ready', async () => {
    // The agent starts now; the first probes are jittered to 9.9 s.
    const h = harness({ agentStartOffsetMs: 0, random: () => 0.99 });
    await server.down();
    const probes = { Readiness: tcpProbe(server.port, { failureThreshold: 3 }) };
    await h.sync([
      pod('was-ready', [container('app', probes, running('a', h.t0, HOUR))], { podReady: true }),
      pod('was-not-ready', [container('app', probes, running('b', h.t0, HOUR))], { podReady: false }),
      pod('recent', [container('app', probes, running('c', h.t0, 5_000))], { podReady: true }),
    ]);
    expect(h.status('was-ready', 'app', 'Readiness')).toMatchObject({ ready: true, result: 'unknown' });
    expect(h.status('was-not-ready', 'app', 'Readiness')).toMatchObject({ ready: false });
    expect(h.status('recent', 'app', 'Readiness')).toMatchObject({ ready: false, result: 'unknown' });

    // First probe (plus the run kubelet's not-ready trigger queued during the jitter) fails below the
    // threshold: no result yet, so the grace holds, because kubelet sets no initial value here.
    await h.step(9_900);
    expect(h.status('was-ready', 'app', 'Readiness')).toMatchObject({ ready: true, result: 'unknown', consecutive: 2 });
    // A recently started container got the initial failure at once.
    expect(h.status('recent', 'app', 'Readiness')).toMatchObject({ ready: false, result: 'failure' });
    // At the threshold the result exists and decides.
    await h.step(PERIOD);
    expect(h.status('was-ready', 'app', 'Readiness')).toMatchObject({ ready: false, result: 'failure' });
  });

  it('trusts a reported Started=true when there is no startup result yet (kubelet restart rule)', async () => {
    const h = harness({ agentStartOffsetMs: 0, random: () => 0.5 });
    await server.down();
    const probes = { Startup: tcpProbe(server.port), Liveness: tcpProbe(server.port) };
    await h.sync([pod('u1', [container('app', probes, running('a', h.t0, HOUR, { started: true }))])]);
    expect(h.status('u1', 'app', 'Liveness')).toMatchObject({ started: true });
    await h.step(5_000);
    // The startup worker does not probe an already started container; liveness does.
    expect(h.observer.runsOf('Startup')).toBe(0);
    expect(h.observer.runsOf('Liveness')).toBe(1);
  });

  it('shows a probe whose spec could not be parsed by its reason, keeps the initial value, runs nothing', async () => {
    const h = harness();
    await h.sync([pod('u1', [container('app', { Readiness: { ok: false, error: 'readinessProbe.httpGet.port: must be 1-65535' } }, running('a', h.t0))])]);
    expect(h.status('u1', 'app', 'Readiness')).toMatchObject({ result: 'failure', ready: false, lastReason: 'invalid-spec' });
    expect(h.status('u1', 'app', 'Readiness')?.lastMessage).toContain('must be 1-65535');
    expect(h.observer.runs).toHaveLength(0);
    expect(h.observer.started).toHaveLength(0);
  });

  it('one pod with many slow probes does not delay another pod (fair limiter)', async () => {
    const slowServer = await ToggleServer.start({ httpDelayMs: 300 });
    cleanups.push(() => slowServer.down());
    const store = new ResultsStore();
    const observer = new RecordingObserver();
    const limiter = new FairLimiter({ maxInFlight: 4, maxQueued: 100 });
    const manager = new ProbeManager({
      runProbe: realRunProbe(),
      store,
      classify: testClassify,
      observer,
      limiter,
      clock: realClock,
      agentStart: Date.now() - HOUR,
    });
    cleanups.push(() => manager.stop());
    const fastServer = await ToggleServer.start({ httpDelayMs: 0 });
    cleanups.push(() => fastServer.down());
    const now = Date.now();
    const slowContainers = Array.from({ length: 8 }, (_, i) =>
      container(`c${i}`, { Liveness: httpProbe(slowServer.port, { timeoutSeconds: 5 }) }, running(`s${i}`, now)),
    );
    const t = Date.now();
    manager.sync([
      pod('slow', slowContainers),
      pod('fast', [container('app', { Liveness: httpProbe(fastServer.port, { timeoutSeconds: 5 }) }, running('f', now))]),
    ]);
    await new Promise((r) => setTimeout(r, 50));
    expect(limiter.inFlight).toBeLessThanOrEqual(4);
    await manager.whenIdle();
    const fastRun = observer.runs.find((r) => r.meta.key.podUID === 'fast');
    const slowRuns = observer.runs.filter((r) => r.meta.key.podUID === 'slow');
    expect(fastRun?.outcome.result).toBe('success');
    expect(slowRuns).toHaveLength(8);
    // The fast pod was done before the first slow probe (300 ms) finished.
    const lastProbe = (podUID: string, containerName: string): number =>
      store.get({ podUID, containerName, probeType: 'Liveness' })?.lastProbeTime ?? Infinity;
    const firstSlowDone = Math.min(...slowContainers.map((c) => lastProbe('slow', c.name)));
    expect(lastProbe('fast', 'app')).toBeLessThan(firstSlowDone);
    expect(firstSlowDone - t).toBeGreaterThanOrEqual(290);
    expect(slowRuns.every((r) => r.outcome.result === 'success')).toBe(true);
    // The slow pod was held to half the slots: its later runs queued for whole slow probes.
    expect(Math.max(...slowRuns.map((r) => r.outcome.phases.queue ?? 0))).toBeGreaterThan(0.5);
  });

  it('a full queue is a prober error (reason queue-full): reported, thrown away, never a probe failure', async () => {
    const slowServer = await ToggleServer.start({ httpDelayMs: 200 });
    cleanups.push(() => slowServer.down());
    const h = harness({ limiter: new FairLimiter({ maxInFlight: 1, maxQueued: 1 }) });
    const containers = ['a', 'b', 'c'].map((n) => container(n, { Liveness: httpProbe(slowServer.port, { failureThreshold: 1 }) }, running(n, h.t0)));
    await h.sync([pod('u1', containers)]);
    const statuses = h.store.list();
    expect(statuses.filter((s) => s.lastReason === 'queue-full')).toHaveLength(1);
    expect(statuses.filter((s) => s.result === 'success')).toHaveLength(3);
    expect(h.observer.runs.filter((r) => r.outcome.reason === 'queue-full')).toHaveLength(3);
    expect(statuses.some((s) => s.result === 'failure' || s.onHold)).toBe(false);
  });

  it('stop() stops every worker, aborts in-flight probes and ignores later syncs', async () => {
    const hang = await ToggleServer.start({ httpDelayMs: Infinity });
    cleanups.push(() => hang.down());
    const h = harness();
    const c = container('app', { Liveness: httpProbe(hang.port, { timeoutSeconds: 30 }) }, running('a', h.t0));
    h.manager.sync([pod('u1', [c])]);
    await new Promise((r) => setTimeout(r, 50));
    const t = performance.now();
    await h.manager.stop();
    // Aborted, not waited for: the probe's timeout is 30 s.
    expect(performance.now() - t).toBeLessThan(10_000);
    expect(h.manager.workerCount()).toBe(0);
    expect(h.observer.stopped).toHaveLength(1);
    // The aborted run is not recorded as a result.
    expect(h.observer.runs).toHaveLength(0);
    // Results stay readable for the API while the agent shuts down.
    expect(h.store.list()).toHaveLength(1);
    h.manager.sync([pod('u2', [c])]);
    expect(h.manager.workerCount()).toBe(0);
  });
});
