/**
 * Go's time.Ticker as kubelet's worker uses it, on a Clock: ticks every period from start; a tick
 * that arrives while the consumer is busy is held (one only, like the channel's buffer of 1) and
 * later ones are dropped; reset() restarts the period from now and discards a held tick (Go 1.23+).
 *
 * With an alignment (`alignMs` > 0) each tick fires at the next multiple of it on the clock rather
 * than at its exact due time. Ticks stay one period apart (periods are whole seconds and the
 * alignment divides a second), only shifted by a fixed offset below `alignMs`; what it buys is that
 * ticks of different workers due within the same window fire together, in one event-loop wakeup
 * and one wakeup of the helper, instead of one each. At long periods those wakeups are most of a
 * probe's cost (50 ms alignment took about a third off the agent's CPU at 250 pods x 3 every 10 s,
 * measured with test/bench/points.ts).
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
  readonly #alignMs: number;

  /** `onTick` is called at each tick; it should call take() when it can consume the tick. `alignMs` 0: no alignment. */
  constructor(clock: Clock, periodMs: number, onTick: () => void, alignMs = 0) {
    this.#clock = clock;
    this.#periodMs = periodMs;
    this.#onTick = onTick;
    this.#alignMs = alignMs;
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
    this.#timer = this.#clock.setTimeout(this.#fire, this.#firesAt() - this.#clock.now());
  }

  /** The timer's callback, made once: a closure per period would live a period, into V8's old generation. */
  readonly #fire = (): void => {
    this.#held = true;
    // This tick is due even when the timer fired a little early by the wall clock (Node's timers
    // run on a monotonic clock and may fire ~1 ms before Date.now() reaches the due time): always
    // move on by one period. A late timer (a blocked event loop) skips missed ticks, no burst.
    const now = this.#clock.now();
    do this.#nextAt += this.#periodMs;
    while (this.#nextAt <= now);
    this.#arm();
    this.#onTick();
  };

  /** When the next tick's timer fires: its due time, or the next multiple of the alignment. */
  #firesAt(): number {
    const g = this.#alignMs;
    return g > 0 ? Math.ceil(this.#nextAt / g) * g : this.#nextAt;
  }
}
