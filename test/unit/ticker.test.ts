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
    const clock = new ManualClock({ start: 0 });
    let ticks = 0;
    const ticker = new Ticker(clock, 1000, () => {
      ticks++;
      ticker.take();
    });
    ticker.reset();
    await clock.advance(1000);
    expect(ticks).toBe(1);
    ticker.stop();
  });
});
