/**
 * Bounded, fair concurrency for probe runs. Kubelet runs one goroutine per probe and lets them all
 * go at once; an agent that forks a helper per probe cannot, so runs wait for a slot. Waiting runs
 * sit in one FIFO per owner (pod); a free slot goes to the waiting owner holding the fewest slots
 * (round-robin among equals), and no owner may hold more than its share: a pod with many slow or
 * hanging probes delays only itself.
 */
import type { Clock } from './clock.ts';
import { realClock } from './clock.ts';
import { OverloadedError } from '../errors.ts';
import { boundedInt } from '../config/bounds.ts';

/** Options for FairLimiter. */
export interface FairLimiterOptions {
  /** Runs in flight at once, across all owners (at least 1). */
  maxInFlight: number;
  /** Runs waiting for a slot, across all owners; one more is refused with OverloadedError. */
  maxQueued: number;
  /**
   * Slots one owner may hold at once. Default: half of maxInFlight (at least 1), so hanging probes
   * of one pod can never take every slot.
   */
  maxInFlightPerOwner?: number;
  clock?: Clock;
}

/** A slot held by one run; release it exactly once (later calls are ignored). */
export interface Permit {
  /** Milliseconds spent waiting in the queue. */
  readonly waitedMs: number;
  release(): void;
}

interface Waiter {
  owner: string;
  enqueuedAt: number;
  grant: (permit: Permit) => void;
  detach: () => void;
}

const HARD_MAX = 1_000_000;


/** Fair concurrency limiter keyed by owner (pod UID). */
export class FairLimiter {
  readonly maxInFlight: number;
  readonly maxQueued: number;
  readonly maxInFlightPerOwner: number;
  readonly #clock: Clock;
  /** Per-owner FIFO of waiting runs. */
  readonly #queues = new Map<string, Waiter[]>();
  /** Owners with waiting runs, in round-robin order. */
  #turns: string[] = [];
  readonly #held = new Map<string, number>();
  #inFlight = 0;
  #queued = 0;

  constructor(opts: FairLimiterOptions) {
    this.maxInFlight = boundedInt(opts.maxInFlight, 1, HARD_MAX, 'maxInFlight');
    this.maxQueued = boundedInt(opts.maxQueued, 0, HARD_MAX, 'maxQueued');
    this.maxInFlightPerOwner = boundedInt(
      opts.maxInFlightPerOwner ?? Math.max(1, Math.floor(this.maxInFlight / 2)),
      1,
      HARD_MAX,
      'maxInFlightPerOwner',
    );
    this.#clock = opts.clock ?? realClock;
  }

  /** Runs holding a slot now. */
  get inFlight(): number {
    return this.#inFlight;
  }

  /** Runs waiting for a slot now. */
  get queued(): number {
    return this.#queued;
  }

  /**
   * Waits for a slot for `owner`. Rejects with OverloadedError when the queue is full, and with the
   * signal's reason when `signal` aborts first (the run then leaves the queue).
   */
  acquire(owner: string, signal?: AbortSignal): Promise<Permit> {
    if (signal?.aborted) return Promise.reject(signal.reason);
    // Anyone still waiting is blocked by its own per-owner cap (#pump runs on every release), so a
    // run that can start now takes nobody's turn.
    if (this.#canRun(owner)) return Promise.resolve(this.#grant(owner, 0));
    if (this.#queued >= this.maxQueued) {
      return Promise.reject(
        new OverloadedError(`probe queue full (${this.#queued} waiting, ${this.#inFlight} in flight)`, {
          queued: this.#queued,
          inFlight: this.#inFlight,
        }),
      );
    }
    return new Promise<Permit>((resolve, reject) => {
      const onAbort = (): void => {
        this.#dequeue(waiter);
        reject(signal?.reason);
      };
      const waiter: Waiter = {
        owner,
        enqueuedAt: this.#clock.now(),
        grant: resolve,
        detach: () => signal?.removeEventListener('abort', onAbort),
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      let queue = this.#queues.get(owner);
      if (!queue) {
        queue = [];
        this.#queues.set(owner, queue);
        this.#turns.push(owner);
      }
      queue.push(waiter);
      this.#queued++;
    });
  }

  /**
   * Runs `fn` once a slot is free and releases the slot when it settles. Resolves with fn's value
   * and the seconds spent queued.
   */
  async run<T>(owner: string, fn: () => Promise<T>, signal?: AbortSignal): Promise<{ value: T; queueSeconds: number }> {
    const permit = await this.acquire(owner, signal);
    try {
      return { value: await fn(), queueSeconds: permit.waitedMs / 1000 };
    } finally {
      permit.release();
    }
  }

  #canRun(owner: string): boolean {
    return this.#inFlight < this.maxInFlight && (this.#held.get(owner) ?? 0) < this.maxInFlightPerOwner;
  }

  #grant(owner: string, waitedMs: number): Permit {
    this.#inFlight++;
    this.#held.set(owner, (this.#held.get(owner) ?? 0) + 1);
    let released = false;
    return {
      waitedMs,
      release: () => {
        if (released) return;
        released = true;
        this.#inFlight--;
        const left = (this.#held.get(owner) ?? 1) - 1;
        if (left > 0) this.#held.set(owner, left);
        else this.#held.delete(owner);
        this.#pump();
      },
    };
  }

  /**
   * Hands free slots to waiting owners: the owner holding the fewest slots goes first, ties in
   * round-robin order; owners at their cap wait.
   */
  #pump(): void {
    while (this.#inFlight < this.maxInFlight && this.#queued > 0) {
      let pick = -1;
      let least = Infinity;
      for (let i = 0; i < this.#turns.length; i++) {
        const owner = this.#turns[i] as string;
        const held = this.#held.get(owner) ?? 0;
        if (held < least && held < this.maxInFlightPerOwner) {
          pick = i;
          least = held;
          // Nobody holds fewer than none: the first such owner is the pick, no need to scan on.
          // Under load most waiting owners (pods) hold nothing, so this ends at the first one or
          // two instead of scanning every waiting pod for every grant.
          if (held === 0) break;
        }
      }
      if (pick < 0) return;
      const owner = this.#turns[pick] as string;
      this.#turns.splice(pick, 1);
      const queue = this.#queues.get(owner) as Waiter[];
      const waiter = queue.shift() as Waiter;
      this.#queued--;
      if (queue.length > 0) this.#turns.push(owner);
      else this.#queues.delete(owner);
      waiter.detach();
      waiter.grant(this.#grant(owner, this.#clock.now() - waiter.enqueuedAt));
    }
  }

  #dequeue(waiter: Waiter): void {
    const queue = this.#queues.get(waiter.owner);
    const at = queue?.indexOf(waiter) ?? -1;
    if (!queue || at < 0) return;
    queue.splice(at, 1);
    this.#queued--;
    if (queue.length === 0) {
      this.#queues.delete(waiter.owner);
      this.#turns = this.#turns.filter((o) => o !== waiter.owner);
    }
  }
}
