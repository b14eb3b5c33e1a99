/**
 * The requests whose bodies are being read, before any of them takes a review slot (load-shedder.ts):
 * bounded in number, and in bytes: their buffers plus the bodies of the reviews being decided stay
 * within one budget (--max-inflight-bytes). A client decides how fast it sends, so these bounds are
 * enforced by cutting, not by refusing the newcomer: when a new request (or a body that grows)
 * would pass a bound, the request that has been reading the longest is cut. The
 * API server sends its headers and its body at once (a few KiB, at most a few MiB, within a
 * millisecond or so on a cluster network), so under a flood of slow senders the longest waiting
 * is always one of them, and the API server's reviews go through however many there are.
 * Pure bookkeeping: what "cut" does is the caller's.
 */

/** Bounds of the set. */
export interface ReadingLimits {
  /** Requests reading their bodies at once. */
  maxRequests: number;
  /** Bytes their body buffers, plus `heldElsewhere()`, may hold together (at least one largest body). */
  maxBytes: number;
  /** Bytes held outside the set within the same budget (the bodies of the reviews being decided). */
  heldElsewhere?: () => number;
}

/** One request in the set. */
export interface ReadingTicket {
  /**
   * Accounts `bytes` more of buffer, cutting the longest-waiting others while the total is over
   * budget; false (and nothing accounted) when it is still over with no other reader left to cut.
   */
  grow(bytes: number): boolean;
  /** Leaves the set (idempotent): the body is whole, or the request is gone. */
  leave(): void;
}

interface Entry {
  bytes: number;
  cut: () => void;
}

export class ReadingSet {
  readonly limits: ReadingLimits;
  /** In the order they arrived: the first is the one that has waited the longest. */
  readonly #entries = new Set<Entry>();
  #bytes = 0;

  constructor(limits: ReadingLimits) {
    if (!(limits.maxRequests >= 1) || !(limits.maxBytes >= 1)) throw new RangeError('reading set limits must be >= 1');
    this.limits = limits;
  }

  /** Requests reading now. */
  get size(): number {
    return this.#entries.size;
  }

  /** Bytes their buffers hold now. */
  get bytes(): number {
    return this.#bytes;
  }

  /**
   * Enters a request whose body is about to be read; `cut` is called (once, synchronously, after
   * the request has left the set) if it must make room for others.
   */
  enter(cut: () => void): ReadingTicket {
    const entry: Entry = { bytes: 0, cut };
    while (this.#entries.size >= this.limits.maxRequests) this.#evictOldest(entry);
    this.#entries.add(entry);
    const leave = (): void => {
      if (!this.#entries.delete(entry)) return;
      this.#bytes -= entry.bytes;
      entry.bytes = 0;
    };
    return {
      grow: (bytes: number) => {
        if (!this.#entries.has(entry)) return false;
        const over = (): boolean => this.#bytes + bytes + (this.limits.heldElsewhere?.() ?? 0) > this.limits.maxBytes;
        while (over() && this.#entries.size > 1) this.#evictOldest(entry);
        if (over()) return false;
        entry.bytes += bytes;
        this.#bytes += bytes;
        return true;
      },
      leave,
    };
  }

  /** Cuts the longest-waiting entry other than `keep`. */
  #evictOldest(keep: Entry): void {
    for (const e of this.#entries) {
      if (e === keep) continue;
      this.#entries.delete(e);
      this.#bytes -= e.bytes;
      e.bytes = 0;
      e.cut();
      return;
    }
  }
}
