/**
 * Time as the scheduler sees it. Workers and the limiter take a Clock so tests can drive probe
 * periods, initial delays and jitter by hand while real sockets keep using real time (vitest's
 * fake timers would freeze those too).
 */

/** An opaque handle returned by Clock.setTimeout. */
export type TimerHandle = object;

/** The scheduler's source of time, timers and randomness. */
export interface Clock {
  /** Epoch milliseconds. */
  now(): number;
  /** Calls `fn` once, `ms` milliseconds from now. */
  setTimeout(fn: () => void, ms: number): TimerHandle;
  /** Cancels a timer; unknown or already-fired handles are ignored. */
  clearTimeout(handle: TimerHandle): void;
  /** A number in [0, 1), for jitter. */
  random(): number;
}

/** A delay beyond one Node timer, run as a chain of them. */
class ChainedTimer {
  timer: NodeJS.Timeout | undefined;
}

/** Node clamps longer delays to 1 ms (a probe period can legally be int32 seconds): chain instead. */
const MAX_NODE_DELAY = 2_147_483_647;

/**
 * Wall-clock time and Node timers. Timers are unref'd: a pending probe tick never keeps the process
 * alive. A delay Node can take in one timer is that timer itself, the handle: every worker arms one
 * per period, and each lives a period, long enough to reach V8's old generation.
 */
export const realClock: Clock = {
  now: () => Date.now(),
  setTimeout(fn, ms) {
    if (!(ms > MAX_NODE_DELAY)) return setTimeout(fn, Math.max(0, ms)).unref();
    const handle = new ChainedTimer();
    const arm = (left: number): void => {
      const step = Math.min(Math.max(0, left), MAX_NODE_DELAY);
      handle.timer = setTimeout(() => (left > step ? arm(left - step) : fn()), step);
      handle.timer.unref();
    };
    arm(ms);
    return handle;
  },
  clearTimeout(handle) {
    clearTimeout(handle instanceof ChainedTimer ? handle.timer : (handle as NodeJS.Timeout));
  },
  random: () => Math.random(),
};

interface ManualTimer {
  due: number;
  seq: number;
  fn: () => void;
}

/** Options for ManualClock. */
export interface ManualClockOptions {
  /** Initial epoch ms (default: a fixed date, so tests never depend on today). */
  start?: number;
  /** Source for random(); default always 0 (no jitter). */
  random?: () => number;
}

/**
 * A clock that only moves when told to. `await clock.advance(ms)` fires due timers one at a time,
 * in due order (ties in creation order), and lets pending promise chains run between timers, so a
 * timer that starts async work sees that work progress before the next timer fires.
 */
export class ManualClock implements Clock {
  #now: number;
  #seq = 0;
  #timers = new Set<ManualTimer>();
  #random: () => number;

  constructor(opts: ManualClockOptions = {}) {
    this.#now = opts.start ?? Date.UTC(2030, 0, 1);
    this.#random = opts.random ?? (() => 0);
  }

  /** Current manual time in epoch ms. */
  now(): number {
    return this.#now;
  }

  /** Registers a timer due `ms` from the current manual time. */
  setTimeout(fn: () => void, ms: number): TimerHandle {
    const timer: ManualTimer = { due: this.#now + Math.max(0, ms), seq: this.#seq++, fn };
    this.#timers.add(timer);
    return timer;
  }

  /** Cancels a timer. */
  clearTimeout(handle: TimerHandle): void {
    this.#timers.delete(handle as ManualTimer);
  }

  /** The configured random source. */
  random(): number {
    return this.#random();
  }

  /** Replaces the random source (e.g. to pin jitter in one test). */
  setRandom(random: () => number): void {
    this.#random = random;
  }

  /** Number of timers not yet fired or cancelled. */
  pendingTimers(): number {
    return this.#timers.size;
  }

  /** Moves time forward by `ms`, firing every timer that falls due on the way. */
  async advance(ms: number): Promise<void> {
    const target = this.#now + Math.max(0, ms);
    await settle();
    for (;;) {
      const next = this.#earliest();
      if (!next || next.due > target) break;
      this.#timers.delete(next);
      this.#now = Math.max(this.#now, next.due);
      next.fn();
      await settle();
    }
    this.#now = target;
    await settle();
  }

  #earliest(): ManualTimer | undefined {
    let best: ManualTimer | undefined;
    for (const t of this.#timers) {
      if (!best || t.due < best.due || (t.due === best.due && t.seq < best.seq)) best = t;
    }
    return best;
  }
}

/** Lets already-resolved promise chains and immediate callbacks run (a few event-loop turns). */
export async function settle(turns = 5): Promise<void> {
  for (let i = 0; i < turns; i++) await new Promise<void>((resolve) => setImmediate(resolve));
}
