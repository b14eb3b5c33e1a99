import { describe, expect, it } from 'vitest';
import { ConfigError, OverloadedError } from '../../agent/errors.ts';
import { ManualClock } from '../../agent/scheduler/clock.ts';
import { FairLimiter } from '../../agent/scheduler/limiter.ts';

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

describe('FairLimiter', () => {
  it('never runs more than maxInFlight at once and counts queued runs', async () => {
    const limiter = new FairLimiter({ maxInFlight: 3, maxQueued: 100, maxInFlightPerOwner: 3 });
    let now = 0;
    let peak = 0;
    const work = async (): Promise<void> => {
      now++;
      peak = Math.max(peak, now);
      await sleep(15);
      now--;
    };
    const all = Array.from({ length: 12 }, (_, i) => limiter.run(`pod-${i % 4}`, work));
    await sleep(0);
    expect(limiter.inFlight).toBe(3);
    expect(limiter.queued).toBe(9);
    await Promise.all(all);
    expect(peak).toBe(3);
    expect(limiter.inFlight).toBe(0);
    expect(limiter.queued).toBe(0);
  });

  it('serves owners round-robin: a pod with many slow probes does not starve another pod', async () => {
    // No per-owner cap here, so only the round-robin queue protects the fast pod.
    const limiter = new FairLimiter({ maxInFlight: 2, maxQueued: 100, maxInFlightPerOwner: 2 });
    const order: string[] = [];
    const slow = Array.from({ length: 10 }, (_, i) =>
      limiter.run('slow-pod', async () => {
        order.push(`slow-${i}`);
        await sleep(100);
      }),
    );
    const fastStart = performance.now();
    let fastStartedAfter = -1;
    const fast = limiter.run('fast-pod', async () => {
      fastStartedAfter = performance.now() - fastStart;
      order.push('fast');
    });
    await Promise.all([...slow, fast]);
    // The fast pod's probe is the first run handed a slot after the two that were already running.
    expect(order.indexOf('fast')).toBe(2);
    // ...so it waited for one slow probe (~100 ms), not for all ten (~500 ms).
    expect(fastStartedAfter).toBeLessThan(350);
  });

  it('caps one owner at its share, so hanging probes of one pod leave slots for others', async () => {
    const limiter = new FairLimiter({ maxInFlight: 4, maxQueued: 100 });
    expect(limiter.maxInFlightPerOwner).toBe(2);
    const never = new Promise<void>(() => {});
    const hanging = Array.from({ length: 6 }, () => limiter.run('hung-pod', () => never));
    await sleep(0);
    expect(limiter.inFlight).toBe(2);
    expect(limiter.queued).toBe(4);
    const t = performance.now();
    const { value } = await limiter.run('other-pod', async () => 'ran');
    expect(value).toBe('ran');
    expect(performance.now() - t).toBeLessThan(50);
    void hanging;
  });

  it('refuses work beyond maxQueued with OverloadedError', async () => {
    const limiter = new FairLimiter({ maxInFlight: 1, maxQueued: 2 });
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const first = limiter.run('a', () => gate);
    const q1 = limiter.run('a', async () => 1);
    const q2 = limiter.run('b', async () => 2);
    await expect(limiter.run('c', async () => 3)).rejects.toBeInstanceOf(OverloadedError);
    expect(limiter.queued).toBe(2);
    release();
    await Promise.all([first, q1, q2]);
    // Room again once the queue drained.
    await expect(limiter.run('c', async () => 3)).resolves.toMatchObject({ value: 3 });
  });

  it('an aborted queued run leaves the queue and never runs', async () => {
    const limiter = new FairLimiter({ maxInFlight: 1, maxQueued: 10 });
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const first = limiter.run('a', () => gate);
    const ac = new AbortController();
    let ran = false;
    const queued = limiter.run(
      'b',
      async () => {
        ran = true;
      },
      ac.signal,
    );
    expect(limiter.queued).toBe(1);
    ac.abort(new Error('worker stopped'));
    await expect(queued).rejects.toThrow('worker stopped');
    expect(limiter.queued).toBe(0);
    release();
    await first;
    await sleep(5);
    expect(ran).toBe(false);
    expect(limiter.inFlight).toBe(0);
    // An already-aborted signal is refused without queueing.
    await expect(limiter.acquire('c', ac.signal)).rejects.toThrow('worker stopped');
  });

  it('measures queue wait on its clock', async () => {
    const clock = new ManualClock();
    const limiter = new FairLimiter({ maxInFlight: 1, maxQueued: 10, clock });
    const held = await limiter.acquire('a');
    expect(held.waitedMs).toBe(0);
    const waiting = limiter.acquire('b');
    await clock.advance(250);
    held.release();
    held.release(); // a second release must not free a second slot
    const permit = await waiting;
    expect(permit.waitedMs).toBe(250);
    expect(limiter.inFlight).toBe(1);
    permit.release();
    expect(limiter.inFlight).toBe(0);
  });

  it('tryAcquire takes a slot within the pod, namespace and node caps, or none at once', () => {
    const limiter = new FairLimiter({ maxInFlight: 4, maxQueued: 0, maxInFlightPerGroup: 2, maxInFlightPerOwner: 1 });
    const a1 = limiter.tryAcquire({ group: 'a', owner: 'a1' });
    expect(a1).toBeDefined();
    expect(limiter.tryAcquire({ group: 'a', owner: 'a1' }), 'the pod is at its cap').toBeUndefined();
    expect(limiter.tryAcquire({ group: 'a', owner: 'a2' })).toBeDefined();
    expect(limiter.tryAcquire({ group: 'a', owner: 'a3' }), 'the namespace is at its cap').toBeUndefined();
    expect(limiter.tryAcquire({ group: 'b', owner: 'b1' })).toBeDefined();
    expect(limiter.tryAcquire({ group: 'c', owner: 'c1' })).toBeDefined();
    expect(limiter.tryAcquire({ group: 'd', owner: 'd1' }), 'the node is at its cap').toBeUndefined();
    expect(limiter.inFlight).toBe(4);
    a1?.release();
    expect(limiter.groupStats('a').inFlight).toBe(1);
    expect(limiter.tryAcquire({ group: 'a', owner: 'a1' })).toBeDefined();
    expect(limiter.queued).toBe(0);
  });

  it('rejects nonsense limits', () => {
    expect(() => new FairLimiter({ maxInFlight: 0, maxQueued: 1 })).toThrow(ConfigError);
    expect(() => new FairLimiter({ maxInFlight: 1.5, maxQueued: 1 })).toThrow(ConfigError);
    expect(() => new FairLimiter({ maxInFlight: 1, maxQueued: -1 })).toThrow(ConfigError);
    expect(() => new FairLimiter({ maxInFlight: Number.NaN, maxQueued: 1 })).toThrow(ConfigError);
  });

  it('queues fairly namespace -> pod: a namespace with many pods gets no more slots than one with one pod', async () => {
    const limiter = new FairLimiter({ maxInFlight: 2, maxQueued: 100, maxInFlightPerOwner: 2 });
    const gates: (() => void)[] = [];
    const order: string[] = [];
    const hold = (who: string) => async (): Promise<void> => {
      order.push(who);
      await new Promise<void>((r) => gates.push(r));
    };
    const runs: Promise<unknown>[] = [];
    // Namespace "noisy" fills both slots, then queues 6 runs over 3 pods; "quiet" queues 2 runs of one pod.
    for (let i = 0; i < 8; i++) runs.push(limiter.run({ group: 'noisy', owner: `n${i % 3}` }, hold(`noisy/n${i % 3}`)));
    for (let i = 0; i < 2; i++) runs.push(limiter.run({ group: 'quiet', owner: 'q' }, hold('quiet/q')));
    await sleep(1);
    expect(order).toEqual(['noisy/n0', 'noisy/n1']);
    // Each release hands the slot to the namespace holding fewer: quiet gets every other slot
    // although noisy queued first and three times as many pods.
    for (let i = 0; i < 3; i++) {
      (gates.shift() as () => void)();
      await sleep(1);
    }
    expect(order.slice(0, 5)).toEqual(['noisy/n0', 'noisy/n1', 'quiet/q', 'noisy/n2', 'quiet/q']);
    while (gates.length > 0 || order.length < 10) {
      (gates.shift() as (() => void) | undefined)?.();
      await sleep(1);
    }
    await Promise.all(runs);
    expect(limiter.inFlight).toBe(0);
  });

  it('caps a namespace: its hanging runs leave the node\'s other slots to other namespaces', async () => {
    const limiter = new FairLimiter({ maxInFlight: 10, maxQueued: 100, maxInFlightPerGroup: 3, maxQueuedPerGroup: 2, maxInFlightPerOwner: 10 });
    const never = new Promise<void>(() => {});
    for (let i = 0; i < 3; i++) void limiter.run({ group: 'noisy', owner: `p${i}` }, () => never);
    const waiting = [limiter.acquire({ group: 'noisy', owner: 'p9' }), limiter.acquire({ group: 'noisy', owner: 'p9' })];
    await expect(limiter.acquire({ group: 'noisy', owner: 'p8' })).rejects.toThrow(/namespace queue full/);
    expect(limiter.groupStats('noisy')).toEqual({ inFlight: 3, queued: 2 });
    const t = performance.now();
    const { value } = await limiter.run({ group: 'quiet', owner: 'q' }, async () => 'ran');
    expect(value).toBe('ran');
    expect(performance.now() - t).toBeLessThan(1000);
    void waiting;
  });

  it('holds an outside caller to its namespace share while the scheduler may queue up to the node bound', async () => {
    const limiter = new FairLimiter({ maxInFlight: 10, maxQueued: 100, maxInFlightPerGroup: 2, maxInFlightPerOwner: 10 });
    const never = new Promise<void>(() => {});
    for (let i = 0; i < 2; i++) void limiter.run({ group: 'bulk', owner: `p${i}` }, () => never);
    // The scheduler's own runs: 5 wait, no namespace bound of their own.
    for (let i = 0; i < 5; i++) void limiter.acquire({ group: 'bulk', owner: `s${i}` });
    expect(limiter.groupStats('bulk')).toEqual({ inFlight: 2, queued: 5 });
    // An outside call of the same namespace, held to 5 waiting, is refused; with 6 it waits.
    await expect(limiter.acquire({ group: 'bulk', owner: 'shim' }, undefined, { maxQueuedInGroup: 5 })).rejects.toThrow(/namespace queue full \(5 waiting, 2 in flight\)/);
    void limiter.acquire({ group: 'bulk', owner: 'shim' }, undefined, { maxQueuedInGroup: 6 });
    expect(limiter.groupStats('bulk')).toEqual({ inFlight: 2, queued: 6 });
  });

  it('refuses at once a run whose wait would outlast its deadline, and drops a queued run when its deadline passes', async () => {
    const limiter = new FairLimiter({ maxInFlight: 10, maxQueued: 100, maxInFlightPerOwner: 1 });
    const never = new Promise<void>(() => {});
    // A run that may hold its slot for an hour.
    void limiter.run({ group: 'ns', owner: 'p' }, () => never, undefined, { holdMs: 3_600_000 });
    const t = performance.now();
    const refused = limiter.acquire({ group: 'ns', owner: 'p' }, undefined, { deadlineMs: 10_000 });
    await expect(refused).rejects.toBeInstanceOf(OverloadedError);
    await expect(refused).rejects.toThrow(/pod is at its limit.*later than this call can wait/);
    expect(performance.now() - t).toBeLessThan(1000);
    expect(limiter.queued).toBe(0);

    // A holder bound of 20 ms: a call with a long deadline waits; one whose deadline comes first is dropped then.
    const other = new FairLimiter({ maxInFlight: 10, maxQueued: 100, maxInFlightPerOwner: 1 });
    const first = await other.acquire({ group: 'ns', owner: 'p' }, undefined, { holdMs: 20 });
    const late = other.acquire({ group: 'ns', owner: 'p' }, undefined, { deadlineMs: 40, holdMs: 20 });
    await expect(late).rejects.toThrow(/no slot free within the time this call can wait/);
    expect(other.queued).toBe(0);
    first.release();
    expect(other.inFlight).toBe(0);
  });
});
