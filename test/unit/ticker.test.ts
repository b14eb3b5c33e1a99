/** The worker's ticker: one tick per period, even when timers fire a little before the wall clock. */
import { describe, expect, it } from 'vitest';
import { ManualClock, type Clock, type TimerHandle } from '../../agent/scheduler/clock.ts';
import { Ticker } from '../../agent/scheduler/ticker.ts';

/** A clock whose timers fire `earlyMs` before now() reaches their due time, as Node's may. */
class EarlyTimerClock implements Clock {
  readonly inner: ManualClock;
  readonly earlyMs: number;
  constructor(earlyMs: number) {
    this.inner = new ManualClock({ start: 1_000_000 });
    this.earlyMs = earlyMs;
  }
  now(): number {
    return this.inner.now();
  }
  setTimeout(fn: () => void, ms: number): TimerHandle {
    return this.inner.setTimeout(fn, Math.max(0, ms - this.earlyMs));
  }
  clearTimeout(h: TimerHandle): void {
    this.inner.clearTimeout(h);
  }
  random(): number {
    return this.inner.random();
  }
}

/**
 * A clock whose event loop can be blocked: block(ms) moves now() on without firing any timer, as a
 * busy loop does; the timers due meanwhile fire late, when the inner clock next advances.
 */
class BlockableClock implements Clock {
  readonly inner = new ManualClock({ start: 0 });
  #blockedMs = 0;
  now(): number {
    return this.inner.now() + this.#blockedMs;
  }
  block(ms: number): void {
    this.#blockedMs += ms;
  }
  setTimeout(fn: () => void, ms: number): TimerHandle {
    return this.inner.setTimeout(fn, ms);
  }
  clearTimeout(h: TimerHandle): void {
    this.inner.clearTimeout(h);
  }
  random(): number {
    return this.inner.random();
  }
}

describe('Ticker', () => {
  it.each([0, 1, 3])('ticks once per period when timers fire %d ms early', async (early) => {
    const clock = new EarlyTimerClock(early);
    let ticks = 0;
    const ticker = new Ticker(clock, 1000, () => {
      ticks++;
      ticker.take();
    });
    ticker.reset();
    await clock.inner.advance(10_000);
    ticker.stop();
    expect(ticks).toBe(10);
  });

  it('skips ticks missed while the event loop was blocked instead of bursting', async () => {
    const clock = new BlockableClock();
    const tickAt: number[] = [];
    const ticker = new Ticker(clock, 1000, () => {
      tickAt.push(clock.now());
      ticker.take();
    });
    ticker.reset();
    // The loop is blocked for 2.5 s just before the first tick is due: that timer fires 2.5 s late,
    // when the ticks due at 1000, 2000 and 3000 have all been missed.
    await clock.inner.advance(999);
    clock.block(2500);
    await clock.inner.advance(1);
    expect(tickAt).toEqual([3500]);
    // The next tick keeps the schedule (4000), then one per period: the missed ticks never burst.
    await clock.inner.advance(1500);
    ticker.stop();
    expect(tickAt).toEqual([3500, 4000, 5000]);
  });

  it('with an alignment, ticks of workers started at different times fire together, one period apart', async () => {
    const clock = new ManualClock({ start: 0 });
    const fired: Record<string, number[]> = { a: [], b: [], c: [] };
    const tickers: Ticker[] = [];
    // Three workers started 7, 23 and 61 ms into the clock, period 1 s, ticks aligned to 50 ms.
    for (const [name, startAt] of [['a', 7], ['b', 23], ['c', 61]] as const) {
      await clock.advance(startAt - clock.now());
      const t: Ticker = new Ticker(clock, 1000, () => {
        fired[name]!.push(clock.now());
        t.take();
      }, 50);
      t.reset();
      tickers.push(t);
    }
    await clock.advance(3200 - clock.now());
    for (const t of tickers) t.stop();
    // a and b were due at 1007 and 1023: both fire at 1050; c (due 1061) at 1100. Never early,
    // never more than the alignment late, and still exactly one period apart.
    expect(fired).toEqual({ a: [1050, 2050, 3050], b: [1050, 2050, 3050], c: [1100, 2100, 3100] });
  });

  it('without an alignment, each tick fires exactly when due', async () => {
    const clock = new ManualClock({ start: 0 });
    const fired: number[] = [];
    await clock.advance(7);
    const t: Ticker = new Ticker(clock, 1000, () => {
      fired.push(clock.now());
      t.take();
    });
    t.reset();
    await clock.advance(2100);
    t.stop();
    expect(fired).toEqual([1007, 2007]);
  });
});
