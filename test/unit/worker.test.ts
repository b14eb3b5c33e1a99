/**
 * kubelet's worker rules, one test each, driven through the real ProbeManager and ResultsStore on a
 * ManualClock, with real TCP probes against a server on 127.0.0.1 that the test opens and closes.
 */
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { ProbeOutcome, ProbeSpec, ProbeType } from '../../agent/probe/types.ts';
import { ManualClock, realClock } from '../../agent/scheduler/clock.ts';
import { errorOutcome, runGuarded } from '../../agent/scheduler/guarded-run.ts';
import type { RunProbe } from '../../agent/scheduler/guarded-run.ts';
import { FairLimiter } from '../../agent/scheduler/limiter.ts';
import { Ticker } from '../../agent/scheduler/ticker.ts';
import { MAX_PROBE_TRIES } from '../../agent/scheduler/worker.ts';
import { Harness, ToggleServer, container, pod, realRunProbe, running, tcpProbe } from '../support/scheduler-harness.ts';

const PERIOD = 10_000;
let server: ToggleServer;
let h: Harness | undefined;

beforeEach(async () => {
  server = await ToggleServer.start();
});

afterEach(async () => {
  await h?.close();
  h = undefined;
  await server.down();
});

function harness(opts: ConstructorParameters<typeof Harness>[0] = {}): Harness {
  h = new Harness(opts);
  return h;
}

function eventsOf(hh: Harness, type: ProbeType, container = 'app'): string[] {
  return hh.events
    .filter((e) => e.status.key.probeType === type && e.status.key.containerName === container)
    .map((e) => (e.type === 'removed' ? 'removed' : e.status.result));
}

describe('ProbeWorker (kubelet worker.go rules)', () => {
  it('holds the initial results per container ID: readiness failure, liveness success, startup unknown', async () => {
    const hh = harness();
    const probes = {
      Liveness: tcpProbe(server.port, { initialDelaySeconds: 30 }),
      Readiness: tcpProbe(server.port, { initialDelaySeconds: 30 }),
      Startup: tcpProbe(server.port, { initialDelaySeconds: 30 }),
    };
    // No container status yet: nothing known.
    await hh.sync([pod('u1', [container('app', probes, undefined)])]);
    expect(hh.status('u1', 'app', 'Readiness')).toMatchObject({ containerID: '', result: 'unknown', ready: false });

    await hh.sync([pod('u1', [container('app', probes, running('c1', hh.now()))])]);
    await hh.step(PERIOD);
    expect(hh.status('u1', 'app', 'Readiness')).toMatchObject({ containerID: 'containerd://c1', result: 'failure', lastProbeTime: 0 });
    expect(hh.status('u1', 'app', 'Liveness')).toMatchObject({ result: 'success', lastProbeTime: 0 });
    expect(hh.status('u1', 'app', 'Startup')).toMatchObject({ result: 'unknown', lastProbeTime: 0 });
    expect(hh.observer.runs).toHaveLength(0);
    expect(server.accepted).toBe(0);
  });

  it('applies failureThreshold to consecutive failures; a success resets the run; only flips are events', async () => {
    const hh = harness();
    const p = (): ReturnType<typeof pod> =>
      pod('u1', [container('app', { Liveness: tcpProbe(server.port, { failureThreshold: 3 }) }, running('c1', hh.t0))]);
    await server.down();
    await hh.sync([p()]); // failure 1
    await hh.step(PERIOD); // failure 2
    expect(hh.status('u1', 'app', 'Liveness')).toMatchObject({ result: 'success', consecutive: 2 });
    await server.up();
    await hh.step(PERIOD); // success: the run restarts
    await server.down();
    await hh.step(PERIOD); // failure 1
    await hh.step(PERIOD); // failure 2
    expect(hh.status('u1', 'app', 'Liveness')).toMatchObject({ result: 'success', consecutive: 2 });
    await hh.step(PERIOD); // failure 3: flips
    expect(hh.status('u1', 'app', 'Liveness')).toMatchObject({ result: 'failure', lastReason: 'refused' });
    expect(hh.observer.runsOf('Liveness')).toBe(6);
    expect(eventsOf(hh, 'Liveness')).toEqual(['unknown', 'success', 'failure']);
  });

  it('applies successThreshold to readiness', async () => {
    const hh = harness();
    const p = pod('u1', [container('app', { Readiness: tcpProbe(server.port, { successThreshold: 2 }) }, running('c1', hh.t0))]);
    await server.down();
    await hh.sync([p]);
    await server.up();
    await hh.step(PERIOD); // success 1 of 2
    expect(hh.status('u1', 'app', 'Readiness')).toMatchObject({ result: 'failure', ready: false, consecutive: 1 });
    await hh.step(PERIOD); // success 2 of 2
    expect(hh.status('u1', 'app', 'Readiness')).toMatchObject({ result: 'success', ready: true });
  });

  it('puts liveness on hold after a failure, until a new container ID resets it to the initial value', async () => {
    const hh = harness();
    const probes = { Liveness: tcpProbe(server.port, { failureThreshold: 1 }) };
    await server.down();
    await hh.sync([pod('u1', [container('app', probes, running('c1', hh.t0))])]);
    expect(hh.status('u1', 'app', 'Liveness')).toMatchObject({ result: 'failure', onHold: true });
    await server.up();
    await hh.step(PERIOD);
    await hh.step(PERIOD);
    expect(hh.observer.runsOf('Liveness')).toBe(1);
    expect(server.accepted).toBe(0);
    expect(hh.status('u1', 'app', 'Liveness')).toMatchObject({ result: 'failure', onHold: true });

    // kubelet restarts the container: the worker notices at its next tick.
    await hh.sync([pod('u1', [container('app', probes, running('c2', hh.now(), 0, { restartCount: 1 }))])]);
    await hh.step(PERIOD);
    expect(hh.status('u1', 'app', 'Liveness')).toMatchObject({ containerID: 'containerd://c2', result: 'success', onHold: false });
    expect(hh.observer.runsOf('Liveness')).toBe(2);
    expect(server.accepted).toBe(1);
  });

  it('gates liveness and readiness on startup, holds startup once decided either way, and resets it on restart', async () => {
    const hh = harness();
    const probes = {
      Startup: tcpProbe(server.port, { failureThreshold: 2 }),
      Readiness: tcpProbe(server.port),
      Liveness: tcpProbe(server.port),
    };
    await server.down();
    await hh.sync([pod('u1', [container('app', probes, running('c1', hh.t0))])]);
    await hh.step(PERIOD);
    expect(hh.status('u1', 'app', 'Startup')).toMatchObject({ result: 'failure', onHold: true, started: false });
    await hh.step(PERIOD);
    expect(hh.observer.runsOf('Startup')).toBe(2);
    expect(hh.observer.runsOf('Readiness')).toBe(0);
    expect(hh.observer.runsOf('Liveness')).toBe(0);

    await server.up();
    await hh.sync([pod('u1', [container('app', probes, running('c2', hh.now()))])]);
    await hh.step(PERIOD);
    expect(hh.status('u1', 'app', 'Startup')).toMatchObject({ containerID: 'containerd://c2', result: 'success', onHold: true });
    // Started: readiness was triggered at once and is ready; liveness waits for its own tick.
    expect(hh.status('u1', 'app', 'Readiness')).toMatchObject({ started: true, ready: true, result: 'success' });
    expect(hh.observer.runsOf('Liveness')).toBe(0);
    await hh.step(PERIOD);
    expect(hh.observer.runsOf('Liveness')).toBe(1);
    // Startup stops probing once started but its worker stays for the next restart.
    expect(hh.observer.runsOf('Startup')).toBe(3);
    expect(hh.manager.workerCount()).toBe(3);
  });

  it('a non-running container is a failure; the worker stops only if it terminated and will not restart', async () => {
    const hh = harness();
    const probes = { Readiness: tcpProbe(server.port) };
    const exited = { containerID: 'containerd://c1', running: false, terminated: true, ready: false, restartCount: 0 };
    await hh.sync([pod('u1', [container('app', probes, running('c1', hh.t0))])]);
    expect(hh.status('u1', 'app', 'Readiness')).toMatchObject({ result: 'success', ready: true });

    await hh.sync([pod('u1', [container('app', probes, exited)])]);
    await hh.step(PERIOD);
    expect(hh.status('u1', 'app', 'Readiness')).toMatchObject({ result: 'failure', ready: false, started: false });
    expect(hh.manager.workerCount()).toBe(1);

    await hh.sync([pod('u1', [container('app', probes, exited)], { restartPolicy: 'Never' })]);
    await hh.step(PERIOD);
    expect(hh.manager.workerCount()).toBe(0);
    expect(hh.status('u1', 'app', 'Readiness')).toBeUndefined();
    expect(eventsOf(hh, 'Readiness').at(-1)).toBe('removed');
    // Not recreated by later syncs.
    await hh.sync([pod('u1', [container('app', probes, exited)], { restartPolicy: 'Never' })]);
    expect(hh.manager.workerCount()).toBe(0);

    // A sidecar is restarted whatever the pod's policy: its worker carries on.
    await hh.sync([pod('u2', [container('proxy', probes, exited, { kind: 'sidecar' })], { restartPolicy: 'Never' })]);
    await hh.step(PERIOD);
    expect(hh.status('u2', 'proxy', 'Readiness')).toMatchObject({ result: 'failure' });
    expect(hh.manager.workerCount()).toBe(1);
  });

  it('on pod deletion, liveness and startup are set to success and stop; readiness keeps probing', async () => {
    const hh = harness();
    await server.down();
    const containers = (): ReturnType<typeof container>[] => [
      container('starting', { Startup: tcpProbe(server.port, { failureThreshold: 10 }) }, running('a1', hh.t0)),
      container('app', { Liveness: tcpProbe(server.port, { failureThreshold: 5 }), Readiness: tcpProbe(server.port) }, running('b1', hh.t0)),
    ];
    await hh.sync([pod('u1', containers())]);
    expect(hh.status('u1', 'starting', 'Startup')).toMatchObject({ result: 'unknown' });

    await hh.sync([pod('u1', containers(), { deletionTimestamp: hh.now() })]);
    await hh.step(PERIOD);
    // added (no container yet), initial value for a1, the quiet-shutdown success, then gone.
    expect(eventsOf(hh, 'Startup', 'starting')).toEqual(['unknown', 'unknown', 'success', 'removed']);
    expect(eventsOf(hh, 'Liveness').at(-1)).toBe('removed');
    expect(hh.manager.workerCount()).toBe(1);
    expect(hh.status('u1', 'app', 'Readiness')).toMatchObject({ lastProbeTime: hh.now(), ready: false });

    const livenessRuns = hh.observer.runsOf('Liveness');
    const startedBefore = hh.observer.started.length;
    await hh.sync([pod('u1', containers(), { deletionTimestamp: hh.t0 })]);
    expect(hh.observer.started).toHaveLength(startedBefore);
    await hh.step(PERIOD);
    expect(hh.manager.workerCount()).toBe(1);
    expect(hh.observer.runsOf('Liveness')).toBe(livenessRuns);
    expect(hh.status('u1', 'app', 'Readiness')?.lastProbeTime).toBe(hh.now());
  });

  it('stops liveness and startup the moment the deletion is seen: a probe in flight never counts (kubelet StopLivenessAndStartup)', async () => {
    let release: ((o: ProbeOutcome) => void) | undefined;
    const blocked: RunProbe = () => new Promise<ProbeOutcome>((resolve) => (release = resolve));
    const hh = harness({ runProbe: blocked });
    const c = (): ReturnType<typeof container> => container('app', { Liveness: tcpProbe(server.port, { failureThreshold: 1 }) }, running('c1', hh.t0));
    hh.manager.sync([pod('u1', [c()])]);
    for (let i = 0; i < 5 && !release; i++) await new Promise((r) => setImmediate(r));
    expect(release).toBeDefined();
    hh.manager.sync([pod('u1', [c()], { deletionTimestamp: hh.now() })]);
    // No clock step, no probe period: the worker is gone already.
    expect(hh.manager.workerCount()).toBe(0);
    release?.({ result: 'failure', reason: 'refused', message: 'dial tcp: connect: connection refused', durationSeconds: 0, phases: { total: 0 } });
    await hh.idle();
    expect(eventsOf(hh, 'Liveness')).toEqual(['unknown', 'success', 'removed']);
    expect(hh.events.some((e) => e.status.onHold)).toBe(false);
    expect(hh.observer.runsOf('Liveness')).toBe(0);
  });

  it('stops every worker of a pod that reached phase Succeeded or Failed', async () => {
    const hh = harness();
    const c = (): ReturnType<typeof container> => container('app', { Liveness: tcpProbe(server.port), Readiness: tcpProbe(server.port) }, running('c1', hh.t0));
    await hh.sync([pod('u1', [c()]), pod('u2', [c()])]);
    expect(hh.manager.workerCount()).toBe(4);
    await hh.sync([pod('u1', [c()], { phase: 'Succeeded' }), pod('u2', [c()], { phase: 'Failed' })]);
    await hh.step(PERIOD);
    expect(hh.manager.workerCount()).toBe(0);
    expect(hh.store.size()).toBe(0);
    // Neither terminal pods nor workers that ended by themselves get new workers on later syncs.
    const startedBefore = hh.observer.started.length;
    await hh.sync([pod('u1', [c()], { phase: 'Succeeded' }), pod('u2', [c()], { phase: 'Failed' }), pod('u3', [c()], { phase: 'Succeeded' })]);
    expect(hh.manager.workerCount()).toBe(0);
    expect(hh.observer.started).toHaveLength(startedBefore);
  });

  it('measures initialDelaySeconds from the container start, not from the worker start', async () => {
    const hh = harness();
    // Started 25 s ago with a 30 s delay: kubelet probes at the first tick past 30 s, i.e. in 10 s.
    const p = pod('u1', [container('app', { Liveness: tcpProbe(server.port, { initialDelaySeconds: 30 }) }, running('c1', hh.now(), 25_000))]);
    await hh.sync([p]);
    expect(hh.observer.runsOf('Liveness')).toBe(0);
    await hh.step(PERIOD);
    expect(hh.observer.runsOf('Liveness')).toBe(1);
    expect(hh.status('u1', 'app', 'Liveness')?.lastProbeTime).toBe(hh.t0 + PERIOD);
  });

  it('jitters the first probe by random*period only for workers created within a period of the agent start', async () => {
    const hh = harness({ agentStartOffsetMs: 0, random: () => 0.5 });
    const c = (): ReturnType<typeof container> => container('app', { Liveness: tcpProbe(server.port) }, running('c1', hh.t0));
    await hh.sync([pod('u1', [c()])]);
    await hh.step(4_999);
    expect(hh.observer.runsOf('Liveness')).toBe(0);
    await hh.step(1);
    expect(hh.status('u1', 'app', 'Liveness')?.lastProbeTime).toBe(hh.t0 + 5_000);

    await hh.step(15_000); // now t0+20s: more than a period after the agent started
    const before = hh.observer.runsOf('Liveness');
    await hh.sync([pod('u1', [c()]), pod('u2', [c()])]);
    expect(hh.status('u2', 'app', 'Liveness')?.lastProbeTime).toBe(hh.t0 + 20_000);
    expect(hh.observer.runsOf('Liveness')).toBe(before + 1);
  });

  it('a manual trigger runs at once and restarts the period', async () => {
    const hh = harness();
    await hh.sync([pod('u1', [container('app', { Liveness: tcpProbe(server.port) }, running('c1', hh.t0))])]);
    expect(hh.status('u1', 'app', 'Liveness')?.lastProbeTime).toBe(hh.t0);
    await hh.step(3_000);
    expect(hh.manager.trigger({ podUID: 'u1', containerName: 'app', probeType: 'Liveness' })).toBe(true);
    await hh.idle();
    expect(hh.status('u1', 'app', 'Liveness')?.lastProbeTime).toBe(hh.t0 + 3_000);
    await hh.step(7_000); // the old schedule's tick (t0+10s) must not fire
    expect(hh.status('u1', 'app', 'Liveness')?.lastProbeTime).toBe(hh.t0 + 3_000);
    await hh.step(3_000);
    expect(hh.status('u1', 'app', 'Liveness')?.lastProbeTime).toBe(hh.t0 + 13_000);
    expect(hh.manager.trigger({ podUID: 'u1', containerName: 'nope', probeType: 'Liveness' })).toBe(false);
  });

  it('throws a probe that cannot run away (kubelet): the initial values stay, the error is only reported', async () => {
    const hh = harness();
    const probes = { Liveness: tcpProbe('web', { failureThreshold: 1 }), Readiness: tcpProbe('web') };
    const c = (ports: { name: string; containerPort: number }[]): ReturnType<typeof container> =>
      container('app', probes, running('c1', hh.t0), { ports });
    await hh.sync([pod('u1', [c([])])]);
    for (let i = 0; i < 3; i++) await hh.step(PERIOD);
    expect(hh.status('u1', 'app', 'Liveness')).toMatchObject({ result: 'success', onHold: false, lastReason: 'port-unresolved' });
    expect(hh.status('u1', 'app', 'Liveness')?.lastMessage).toContain('port "web" not found');
    expect(hh.status('u1', 'app', 'Readiness')).toMatchObject({ result: 'failure', ready: false, lastReason: 'port-unresolved' });
    expect(eventsOf(hh, 'Liveness')).toEqual(['unknown', 'success']);
    // 4 passes x 2 probes (plus readiness triggers) x kubelet's 3 tries each, every try reported to the observer (metrics).
    const errors = hh.observer.runs.filter((r) => r.outcome.result === 'error').length;
    expect(errors).toBeGreaterThanOrEqual(4 * 2 * 3);
    expect(errors % MAX_PROBE_TRIES).toBe(0);

    await hh.sync([pod('u1', [c([{ name: 'web', containerPort: server.port }])])]);
    await hh.step(PERIOD);
    expect(hh.status('u1', 'app', 'Liveness')).toMatchObject({ result: 'success' });
    expect(hh.status('u1', 'app', 'Readiness')).toMatchObject({ result: 'success', ready: true });
  });

  it('an error neither counts toward nor breaks a failure run (kubelet drops prober errors)', async () => {
    const hh = harness();
    const probes = { Liveness: tcpProbe('web', { failureThreshold: 2 }) };
    const c = (ports: { name: string; containerPort: number }[]): ReturnType<typeof container> =>
      container('app', probes, running('c1', hh.t0), { ports });
    await server.down();
    await hh.sync([pod('u1', [c([{ name: 'web', containerPort: server.port }])])]); // failure 1
    await hh.sync([pod('u1', [c([])])]);
    await hh.step(PERIOD); // error
    expect(hh.status('u1', 'app', 'Liveness')).toMatchObject({ result: 'success', consecutive: 1, lastReason: 'port-unresolved' });
    await hh.sync([pod('u1', [c([{ name: 'web', containerPort: server.port }])])]);
    await hh.step(PERIOD); // failure 2
    expect(hh.status('u1', 'app', 'Liveness')).toMatchObject({ result: 'failure', onHold: true });
    expect(eventsOf(hh, 'Liveness')).toEqual(['unknown', 'success', 'failure']);
  });

  it('after an agent restart, an errored first probe leaves a long-running ready container ready (restart grace kept)', async () => {
    let calls = 0;
    const erroring: RunProbe = async () => {
      calls++;
      return errorOutcome('helper-error', 'netns helper is starting');
    };
    const hh = harness({ agentStartOffsetMs: 0, random: () => 0, runProbe: erroring });
    const probes = { Readiness: tcpProbe(server.port), Liveness: tcpProbe(server.port, { failureThreshold: 1 }) };
    await hh.sync([pod('u1', [container('app', probes, running('c1', hh.now(), 3_600_000, { ready: true }))], { podReady: true })]);
    await hh.step(1);
    expect(calls).toBeGreaterThanOrEqual(2 * MAX_PROBE_TRIES);
    expect(calls % MAX_PROBE_TRIES).toBe(0);
    expect(hh.status('u1', 'app', 'Readiness')).toMatchObject({ ready: true, lastReason: 'helper-error' });
    expect(hh.status('u1', 'app', 'Liveness')?.result).not.toBe('failure');
    expect(hh.events.filter((e) => e.status.key.probeType === 'Readiness').map((e) => e.status.ready)).not.toContain(false);
  });

  it('retries an errored probe at once, up to 3 tries, and uses the first real result (kubelet runProbeWithRetries)', async () => {
    let calls = 0;
    const real = realRunProbe();
    const flaky: RunProbe = async (p, c, spec, signal) => {
      calls++;
      return calls <= 2 ? errorOutcome('queue-full', 'queue full') : real(p, c, spec, signal);
    };
    const hh = harness({ runProbe: flaky });
    await hh.sync([pod('u1', [container('app', { Readiness: tcpProbe(server.port) }, running('c1', hh.t0))])]);
    expect(hh.observer.runs.slice(0, 3).map((r) => r.outcome.result)).toEqual(['error', 'error', 'success']);
    expect(hh.status('u1', 'app', 'Readiness')).toMatchObject({ result: 'success', ready: true });
  });
});

describe('worker building blocks', () => {
  it('ManualClock fires due timers in order (ties in creation order) and lets async work run between them', async () => {
    const clock = new ManualClock({ start: 1_000 });
    const order: string[] = [];
    clock.setTimeout(() => order.push('b@20'), 20);
    clock.setTimeout(() => {
      order.push('a@10');
      void Promise.resolve().then(() => order.push('a@10 continued'));
    }, 10);
    clock.setTimeout(() => order.push('c@20'), 20);
    const cancelled = clock.setTimeout(() => order.push('cancelled'), 15);
    clock.clearTimeout(cancelled);
    clock.setTimeout(() => order.push('late'), 31);
    await clock.advance(30);
    expect(order).toEqual(['a@10', 'a@10 continued', 'b@20', 'c@20']);
    expect(clock.now()).toBe(1_030);
    expect(clock.pendingTimers()).toBe(1);
  });

  it('realClock does not fire early for delays beyond what Node timers hold (2^31 ms)', async () => {
    let fired = false;
    const handle = realClock.setTimeout(() => (fired = true), 2 ** 31 + 5);
    await new Promise((r) => setTimeout(r, 30));
    realClock.clearTimeout(handle);
    expect(fired).toBe(false);
  });

  it('realClock fires a delay Node holds in one timer, and clearTimeout stops one before it fires', async () => {
    const order: string[] = [];
    const cancelled = realClock.setTimeout(() => order.push('cancelled'), 1);
    realClock.clearTimeout(cancelled);
    await new Promise<void>((resolve) => realClock.setTimeout(() => {
      order.push('fired');
      resolve();
    }, 1));
    // A later timer of the same delay ran, so the cleared one would have run by now.
    expect(order).toEqual(['fired']);
  });

  it('Ticker holds one tick while busy, drops the rest, and reset() discards a held tick', async () => {
    const clock = new ManualClock();
    let ticks = 0;
    const ticker = new Ticker(clock, 1_000, () => ticks++);
    ticker.reset();
    await clock.advance(3_500);
    expect(ticks).toBe(3);
    expect(ticker.take()).toBe(true);
    expect(ticker.take()).toBe(false);
    await clock.advance(500); // tick at 4000
    ticker.reset(); // next tick at 5000, the held one is gone
    expect(ticker.take()).toBe(false);
    await clock.advance(999);
    expect(ticks).toBe(4);
    await clock.advance(1);
    expect(ticks).toBe(5);
    ticker.stop();
    await clock.advance(5_000);
    expect(ticks).toBe(5);
  });

  it('runGuarded turns a hung, throwing or rejecting prober into an error outcome and releases the slot only when it settles', async () => {
    const p = pod('u1', [container('app', {}, running('c1', Date.now()))]);
    const c = p.containers[0] as ReturnType<typeof container>;
    const spec = { ...(tcpProbe(1) as { ok: true; spec: ProbeSpec }).spec, timeoutSeconds: 0.05 };
    const limiter = new FairLimiter({ maxInFlight: 1, maxQueued: 1 });

    let finishHung!: () => void;
    let abortedWith: unknown;
    const hung: RunProbe = (_p, _c, _s, signal) =>
      new Promise((resolve) => {
        signal.addEventListener('abort', () => (abortedWith = signal.reason));
        finishHung = () => resolve({ result: 'success', message: '', durationSeconds: 0, phases: { total: 0 } });
      });
    const t = performance.now();
    const out = await runGuarded(hung, limiter, p, c, spec, new AbortController(), 50);
    expect(out).toMatchObject({ result: 'error', reason: 'other' });
    expect(out.message).toContain('did not return');
    expect(performance.now() - t).toBeLessThan(10_000);
    expect(String(abortedWith)).toContain('watchdog');
    // The abandoned prober still holds its slot until it really ends.
    expect(limiter.inFlight).toBe(1);
    finishHung();
    await new Promise((r) => setTimeout(r, 0));
    expect(limiter.inFlight).toBe(0);

    const throwing: RunProbe = () => {
      throw new Error('boom');
    };
    expect(await runGuarded(throwing, limiter, p, c, spec, new AbortController())).toMatchObject({ result: 'error', message: 'prober threw: boom' });
    const rejecting: RunProbe = () => Promise.reject(new Error('nope'));
    expect(await runGuarded(rejecting, limiter, p, c, spec, new AbortController())).toMatchObject({ result: 'error', message: 'prober failed: nope' });
    expect(limiter.inFlight).toBe(0);
  });
});
