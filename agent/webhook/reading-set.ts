/**
 * The requests whose bodies are being read, before any of them takes a review slot (load-shedder.ts):
 * bounded in number, and in bytes: their buffers plus the bodies of the reviews being decided stay
 * within one budget (--max-inflight-bytes). A client decides how fast it sends, so a request that
 * has been reading for longer than a grace period can be cut: when a new request (or a body that
 * grows) would pass a bound, the request that has been reading the longest is cut if it is past its
 * grace; if it is not, the newcomer is refused instead. The API server sends its headers and its
 * body at once (a few KiB, at most a few MiB, within milliseconds on a cluster network), so under a
 * flood of slow senders the longest waiting is always one of them and the API server's reviews go
 * through; and a burst of large reviews that are all arriving at full speed refuses the latest
 * instead of cutting the nearly whole ones over and over.
 * Pure bookkeeping: what "cut" and "refused" do is the caller's.
 */

/** Bounds of the set. */
export interface ReadingLimits {
  /** Requests reading their bodies at once. */
  maxRequests: number;
  /** Bytes their body buffers, plus `heldElsewhere()`, may hold together (at least one largest body). */
  maxBytes: number;
  /** Bytes held outside the set within the same budget (the bodies of the reviews being decided). */
  heldElsewhere?: () => number;
  /** How long a request may read before it can be cut to make room (ms). */
  graceMs: number;
}

/** One request in the set. */
export interface ReadingTicket {
  /**
   * Accounts `bytes` more of buffer, cutting the longest-waiting others past their grace while the
   * total is over budget; false (and nothing accounted) when it would still be over.
   */
  grow(bytes: number): boolean;
  /** Leaves the set (idempotent): the body is whole, or the request is gone. */
  leave(): void;
}

interface Entry {
  bytes: number;
  since: number;
  cut: () => void;
}

export class ReadingSet {
  readonly limits: ReadingLimits;
  /** In the order they arrived: the first is the one that has waited the longest. */
  readonly #entries = new Set<Entry>();
  #bytes = 0;
  readonly #now: () => number;

  constructor(limits: ReadingLimits, now: () => number = () => performance.now()) {
    if (!(limits.maxRequests >= 1) || !(limits.maxBytes >= 1) || !(limits.graceMs >= 0)) throw new RangeError('reading set limits must be >= 1 (grace >= 0)');
    this.limits = limits;
    this.#now = now;
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
   * Enters a request whose body is about to be read, or refuses it (undefined) when the set is full
   * of requests still within their grace. `cut` is called (once, synchronously, after the request
   * has left the set) if it must make room for others.
   */
  enter(cut: () => void): ReadingTicket | undefined {
    const entry: Entry = { bytes: 0, since: this.#now(), cut };
    while (this.#entries.size >= this.limits.maxRequests) {
      if (!this.#evictOldest(entry)) return undefined;
    }
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
        while (over()) {
          if (!this.#evictOldest(entry)) return false;
        }
        entry.bytes += bytes;
        this.#bytes += bytes;
        return true;
      },
      leave,
    };
  }

  /** Cuts the longest-waiting entry other than `keep` if it is past its grace; false when there is none. */
  #evictOldest(keep: Entry): boolean {
    const now = this.#now();
    for (const e of this.#entries) {
      if (e === keep) continue;
      if (now - e.since < this.limits.graceMs) return false;
      this.#entries.delete(e);
      this.#bytes -= e.bytes;
      e.bytes = 0;
      e.cut();
      return true;
    }
    return false;
  }
}
