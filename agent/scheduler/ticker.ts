/**
 * Go's time.Ticker as kubelet's worker uses it, on a Clock: ticks every period from start; a tick
 * that arrives while the consumer is busy is held (one only, like the channel's buffer of 1) and
 * later ones are dropped; reset() restarts the period from now and discards a held tick (Go 1.23+).
 */
import type { Clock, TimerHandle } from './clock.ts';

/** A periodic tick source with one buffered tick. */
export class Ticker {
  readonly #clock: Clock;
  readonly #periodMs: number;
  readonly #onTick: () => void;
  #nextAt = 0;
  #timer: TimerHandle | undefined;
  #held = false;

  /** `onTick` is called at each tick; it should call take() when it can consume the tick. */
  constructor(clock: Clock, periodMs: number, onTick: () => void) {
    this.#clock = clock;
    this.#periodMs = periodMs;
    this.#onTick = onTick;
  }

  /** Starts (or restarts) ticking: the first tick one period from now. */
  reset(): void {
    this.#held = false;
    this.#nextAt = this.#clock.now() + this.#periodMs;
    this.#arm();
  }

  /** Consumes the held tick; true if there was one. */
  take(): boolean {
    const had = this.#held;
    this.#held = false;
    return had;
  }

  /** Stops ticking for good. */
  stop(): void {
    if (this.#timer) this.#clock.clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#held = false;
  }

  #arm(): void {
    if (this.#timer) this.#clock.clearTimeout(this.#timer);
    this.#timer = this.#clock.setTimeout(() => {
      this.#held = true;
      // This tick is due even when the timer fired a little early by the wall clock (Node's timers
      // run on a monotonic clock and may fire ~1 ms before Date.now() reaches the due time): always
      // move on by one period. A late timer (a blocked event loop) skips missed ticks, no burst.
      const now = this.#clock.now();
      do this.#nextAt += this.#periodMs;
      while (this.#nextAt <= now);
      this.#arm();
      this.#onTick();
    }, this.#nextAt - this.#clock.now());
  }
}
