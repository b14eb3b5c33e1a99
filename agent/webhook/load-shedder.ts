/**
 * The webhook's admission control of its own: how many AdmissionReviews are being read, parsed and
 * answered at once, and how many request bytes they may hold together. A request over either bound
 * is answered 429 with Retry-After before its body is read, so a burst of large reviews costs the
 * server a status line each, not a parsed pod each (the API server's client retries a 429 that
 * carries Retry-After, within the webhook's timeoutSeconds).
 */

/** Bounds of the shedder. */
export interface LoadShedderLimits {
  /** Requests admitted at once. */
  maxConcurrent: number;
  /**
   * Sum of the admitted requests' reserved bytes (the declared Content-Length, or the request cap
   * when the body is chunked). One request alone is always admitted when nothing else is in flight,
   * so a single largest review is never refused for the budget.
   */
  maxInflightBytes: number;
}

/** Why a request was shed. */
export type ShedReason = 'concurrency' | 'bytes';

/** Counts admitted requests and their reserved bytes; pure bookkeeping, no timers. */
export class LoadShedder {
  readonly limits: LoadShedderLimits;
  #requests = 0;
  #bytes = 0;

  constructor(limits: LoadShedderLimits) {
    if (!(limits.maxConcurrent >= 1) || !(limits.maxInflightBytes >= 1)) throw new RangeError('load shedder limits must be >= 1');
    this.limits = limits;
  }

  /** Requests admitted now. */
  get inFlight(): number {
    return this.#requests;
  }

  /** Bytes reserved now. */
  get inFlightBytes(): number {
    return this.#bytes;
  }

  /**
   * Admits a request reserving `bytes`, returning its release function (idempotent), or the reason
   * it is shed.
   */
  tryAdmit(bytes: number): { release: () => void } | { shed: ShedReason } {
    if (this.#requests >= this.limits.maxConcurrent) return { shed: 'concurrency' };
    if (this.#requests > 0 && this.#bytes + bytes > this.limits.maxInflightBytes) return { shed: 'bytes' };
    this.#requests++;
    this.#bytes += bytes;
    let released = false;
    return {
      release: () => {
        if (released) return;
        released = true;
        this.#requests--;
        this.#bytes -= bytes;
      },
    };
  }
}
