/**
 * Who may hold the webhook's connections. A fixed cap on open connections, counted before TLS, lets
 * anyone who can reach the port hold every slot with idle sockets (reopened as soon as they are
 * cut), and the API server's own connections are then reset: a review that fails open. So no
 * source is ever refused for what others hold; each class of connection lives in a bounded pool of
 * its own, and a newcomer to a full pool evicts the oldest connection of the source holding the
 * most of it:
 *
 * - handshaking: every TCP connection until its TLS handshake is done (and no longer than the
 *   handshake deadline). Here a newcomer whose own source already holds its share, or as many as
 *   the largest holder of a full pool, evicts its own oldest only if that one is stalled (older than
 *   a legitimate handshake takes); otherwise it is refused before TLS (`admit`). The flood's
 *   reconnect loop then mostly costs the server an accept and a close, not a TLS socket built and
 *   torn down, which under a flood took most of the server's CPU and delayed the API server's
 *   handshakes by seconds. The API server, holding one or a few, is never refused and is evicted
 *   last.
 * - verified: connections whose client certificate verified against --client-ca-file, the API
 *   server's. Nothing else enters this pool, so nothing else can evict from it.
 * - other: every other connection past TLS (kubelet's /healthz probes, and every caller when no
 *   client CA is configured). With a client CA these connections close after one answer.
 */

/** Bounds of one pool. */
export interface PoolLimits {
  /** Connections in the pool. */
  max: number;
  /** Connections one source address may hold in it; its own oldest is evicted beyond. */
  perSource: number;
}

interface Entry {
  source: string;
  evict: () => void;
  /** performance.now() when it was added. */
  since: number;
}

/** One bounded pool of connections, by source address; bookkeeping only, the caller closes. */
export class ConnectionPool {
  readonly limits: PoolLimits;
  /** Each source's connections, oldest first. */
  readonly #bySource = new Map<string, Set<Entry>>();
  #size = 0;
  #evicted = 0;
  #refused = 0;

  constructor(limits: PoolLimits) {
    if (!(limits.max >= 1) || !(limits.perSource >= 1)) throw new RangeError('connection pool limits must be >= 1');
    this.limits = { max: limits.max, perSource: Math.min(limits.perSource, limits.max) };
  }

  get size(): number {
    return this.#size;
  }

  /** Connections evicted since the start. */
  get evicted(): number {
    return this.#evicted;
  }

  /** Sources with a connection in the pool. */
  get sources(): number {
    return this.#bySource.size;
  }

  /**
   * Adds a connection from `source`, first evicting (calling `evict` of) one other when the source
   * or the pool is full. Returns the function that takes it out (idempotent; call it on close).
   */
  add(source: string, evict: () => void): () => void {
    const own = this.#bySource.get(source);
    if (own && own.size >= this.limits.perSource) this.#evictOldest(own);
    else if (this.#size >= this.limits.max) this.#evictOldest(this.#largest());
    const entry: Entry = { source, evict, since: performance.now() };
    let set = this.#bySource.get(source);
    if (!set) this.#bySource.set(source, (set = new Set()));
    set.add(entry);
    this.#size++;
    return () => this.#remove(entry);
  }

  /**
   * Like `add`, but when the newcomer's source holds its share already, or as many as the largest
   * holder of a full pool, its own oldest is evicted only once older than `youngMs`; before that
   * the newcomer is refused (returns undefined, evicting nothing). A source's reconnect loop then
   * tears down at most `perSource` connections each `youngMs`.
   */
  admit(source: string, evict: () => void, youngMs: number): (() => void) | undefined {
    const own = this.#bySource.get(source);
    const held = own?.size ?? 0;
    if (own && (held >= this.limits.perSource || (this.#size >= this.limits.max && held >= this.#largest().size))) {
      const oldest = own.values().next().value as Entry;
      if (performance.now() - oldest.since < youngMs) {
        this.#refused++;
        return undefined;
      }
    }
    return this.add(source, evict);
  }

  /** Newcomers refused by `admit` since the start. */
  get refused(): number {
    return this.#refused;
  }

  /** The set of the source holding the most connections (the oldest-arrived such source on a tie). */
  #largest(): Set<Entry> {
    let best: Set<Entry> | undefined;
    for (const set of this.#bySource.values()) if (!best || set.size > best.size) best = set;
    return best!;
  }

  #evictOldest(set: Set<Entry>): void {
    const oldest = set.values().next().value as Entry;
    this.#remove(oldest);
    this.#evicted++;
    oldest.evict();
  }

  #remove(entry: Entry): void {
    const set = this.#bySource.get(entry.source);
    if (!set?.delete(entry)) return;
    this.#size--;
    if (set.size === 0) this.#bySource.delete(entry.source);
  }
}
