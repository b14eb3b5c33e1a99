/**
 * The frame budget's arithmetic, one place for both of its scopes: frames that move no stream
 * forward (connection.ts says which) spend tokens of a bucket that time refills.
 *
 *  - Per connection (every role): `TokenBucket`, a burst of `noProgressBudget` (1000) that progress
 *    gives back to and that refills in full over 10 s. A flood on one connection ends after about
 *    the burst.
 *  - Per peer across connections (the gRPC prober, keyed by pod): a `SharedFrameBudget` the
 *    connection also charges, past a few free frames per connection (a server's handshake). A
 *    client that opens a new connection every period would otherwise give a flooding server a
 *    fresh burst every period; charged to the pod, the flood's share stays at the pod's refill rate
 *    whatever the number of connections, and a neighbour's bucket is its own.
 */
import { performance } from 'node:perf_hooks';
import { H2ConnectionError, H2Error } from './wire.ts';

/** A burst of `max` tokens refilled in full over `refillMs`; starts full. */
export class TokenBucket {
  readonly max: number;
  readonly #refillMs: number;
  #tokens: number;
  #at = performance.now();

  constructor(max: number, refillMs: number) {
    this.max = max;
    this.#refillMs = refillMs;
    this.#tokens = max;
  }

  /** Takes one token; false when none is left (after what time refilled since). */
  take(): boolean {
    if (this.#tokens > 0) {
      this.#tokens--;
      return true;
    }
    this.#refill();
    if (this.#tokens <= 0) return false;
    this.#tokens--;
    return true;
  }

  /** Gives one back (progress), up to the burst. */
  giveBack(): void {
    if (this.#tokens < this.max) this.#tokens++;
  }

  /** Tokens left now, with what time refilled. */
  get level(): number {
    this.#refill();
    return this.#tokens;
  }

  #refill(): void {
    const now = performance.now();
    const add = Math.floor(((now - this.#at) * this.max) / this.#refillMs);
    if (add <= 0) return;
    // Moved by the whole tokens added only, so that frequent calls still refill.
    this.#at = this.#tokens + add >= this.max ? now : this.#at + (add * this.#refillMs) / this.max;
    this.#tokens = Math.min(this.max, this.#tokens + add);
  }
}

/** A budget several connections charge (one pod's), beside each connection's own. */
export interface SharedFrameBudget {
  /** Spends one token; false when the budget is spent (the connection is then cut). */
  spend(): boolean;
  /** Why a connection was cut for this budget, for its error ("the pod's frame budget ... is spent"). */
  readonly spentWhy: string;
}

/** Frames without progress a connection sends free of its shared budget (SETTINGS, its ACK, WINDOW_UPDATEs, PINGs of a handshake). */
export const SHARED_FREE_FRAMES = 16;

/** A connection ended because its peer spent a frame budget: GOAWAY ENHANCE_YOUR_CALM. */
export class FrameBudgetError extends H2ConnectionError {
  /** Which budget: the connection's own burst, or the shared one (the pod's). */
  readonly scope: 'connection' | 'shared';
  constructor(scope: 'connection' | 'shared', message: string) {
    super(H2Error.ENHANCE_YOUR_CALM, message);
    this.scope = scope;
  }
}
