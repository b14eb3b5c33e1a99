/**
 * The results store: the latest ProbeStatus per worker, plus an ordered, bounded log of the
 * changes that matter, which the API's List/Watch and the metrics read. Like kubelet's results
 * manager it only announces real changes; unlike it, it keeps a revision so a watcher can resume.
 */
import type { Clock } from './clock.ts';
import { realClock } from './clock.ts';
import type { ProbeEvent, ProbeKey, ProbeStatus, ResultsReader, StatusFilter, ThresholdResult } from './types.ts';

/** Default number of events kept for eventsSince(). */
export const DEFAULT_EVENT_RING = 4096;
/**
 * Default age past which an event leaves the ring. A watcher reconnects within seconds; one gone
 * longer resyncs from a snapshot. Without an age bound the ring fills at the pace of pod churn, so
 * the agent's heap grows for as long as that takes (about 30 minutes at 16 new pods a minute).
 */
export const DEFAULT_EVENT_MAX_AGE_MS = 5 * 60_000;

/** Options for ResultsStore. */
export interface ResultsStoreOptions {
  /** How many recent events eventsSince() can replay (default 4096, at least 1). */
  ringSize?: number;
  /** How old (ms, by the clock) an event may be and still be replayed (default 5 minutes). */
  maxEventAgeMs?: number;
  clock?: Clock;
  /** Called when a subscriber throws; the store carries on delivering. */
  onListenerError?: (err: unknown) => void;
}

/** The string form of a ProbeKey, unique per worker. */
export function probeKeyString(key: ProbeKey): string {
  return `${key.podUID}/${key.containerName}/${key.probeType}`;
}

function copyStatus(s: ProbeStatus): ProbeStatus {
  return { ...s, key: { ...s.key } };
}

/** Whether `to` can take `from`'s fields in place and then equal its copy (the same optional fields present). */
function sameShape(to: ProbeStatus, from: ProbeStatus): boolean {
  return ('lastReason' in to) === ('lastReason' in from) && ('erroring' in to) === ('erroring' in from);
}

/** Copies every field of `from` but the key (equal: the same id) into `to`. */
function assignStatus(to: ProbeStatus, from: ProbeStatus): void {
  to.namespace = from.namespace;
  to.podName = from.podName;
  to.containerID = from.containerID;
  to.result = from.result;
  to.consecutive = from.consecutive;
  to.lastProbeTime = from.lastProbeTime;
  to.lastMessage = from.lastMessage;
  if ('lastReason' in from) to.lastReason = from.lastReason;
  to.started = from.started;
  to.ready = from.ready;
  to.onHold = from.onHold;
  if ('erroring' in from) to.erroring = from.erroring;
}

/** Fields whose change is worth an event; lastProbeTime, consecutive and messages change every period. */
function significantlyDifferent(a: ProbeStatus, b: ProbeStatus): boolean {
  return (
    a.result !== b.result ||
    a.started !== b.started ||
    a.ready !== b.ready ||
    a.onHold !== b.onHold ||
    a.containerID !== b.containerID
  );
}

function matches(s: ProbeStatus, f: StatusFilter | undefined): boolean {
  if (!f) return true;
  return (
    (!f.podUID || s.key.podUID === f.podUID) &&
    (!f.namespace || s.namespace === f.namespace) &&
    (!f.probeType || s.key.probeType === f.probeType)
  );
}

/** In-memory ResultsReader with the writers the probe manager uses. */
export class ResultsStore implements ResultsReader {
  readonly #statuses = new Map<string, ProbeStatus>();
  readonly #listeners = new Set<(event: ProbeEvent) => void>();
  readonly #ring: ProbeEvent[] = [];
  readonly #ringSize: number;
  readonly #maxAgeMs: number;
  readonly #clock: Clock;
  readonly #onListenerError: (err: unknown) => void;
  #revision = 0;
  /** Events raised by a listener while another event is being delivered wait here, to keep order. */
  readonly #pending: ProbeEvent[] = [];
  #delivering = false;

  constructor(opts: ResultsStoreOptions = {}) {
    this.#ringSize = Math.max(1, Math.floor(opts.ringSize ?? DEFAULT_EVENT_RING));
    this.#maxAgeMs = Math.max(0, opts.maxEventAgeMs ?? DEFAULT_EVENT_MAX_AGE_MS);
    this.#clock = opts.clock ?? realClock;
    this.#onListenerError = opts.onListenerError ?? (() => {});
  }

  /**
   * Stores `status` as the latest for its key (`id`: probeKeyString of it, when the caller has it).
   * Emits 'added' for a new key and 'changed' when a significant field changed; otherwise updates
   * silently. Returns the event, if any.
   */
  upsert(status: ProbeStatus, id = probeKeyString(status.key)): ProbeEvent | undefined {
    const before = this.#statuses.get(id);
    if (before && sameShape(before, status)) {
      // Updated in place: every probe (and every pod sync) stores a status that lives until the
      // next one, seconds later; a fresh copy each time would reach the old generation every time.
      const significant = significantlyDifferent(before, status);
      const previous = before.result;
      assignStatus(before, status);
      return significant ? this.#emit('changed', before, previous) : undefined;
    }
    const stored = copyStatus(status);
    this.#statuses.set(id, stored);
    if (before && !significantlyDifferent(before, stored)) return undefined;
    return this.#emit(before ? 'changed' : 'added', stored, before ? before.result : 'unknown');
  }

  /** Forgets a key, emitting 'removed' (with the last status) if it was present. */
  remove(key: ProbeKey): ProbeEvent | undefined {
    const id = probeKeyString(key);
    const before = this.#statuses.get(id);
    if (!before) return undefined;
    this.#statuses.delete(id);
    return this.#emit('removed', before, before.result);
  }

  /** The latest status of one key. */
  get(key: ProbeKey): ProbeStatus | undefined {
    const s = this.#statuses.get(probeKeyString(key));
    return s ? copyStatus(s) : undefined;
  }

  /** Latest statuses matching `filter`, sorted by pod UID, container and probe type. */
  list(filter?: StatusFilter): ProbeStatus[] {
    const out: ProbeStatus[] = [];
    for (const s of this.#statuses.values()) if (matches(s, filter)) out.push(copyStatus(s));
    return out.sort((a, b) => probeKeyString(a.key).localeCompare(probeKeyString(b.key)));
  }

  /** Number of stored statuses. */
  size(): number {
    return this.#statuses.size;
  }

  /** Revision of the newest event (0 before any). */
  revision(): number {
    return this.#revision;
  }

  /**
   * Events after `revision`, oldest first. Undefined when some of them have left the ring, or when
   * `revision` is from a future this store never reached (the agent restarted): resync with list().
   */
  eventsSince(revision: number): ProbeEvent[] | undefined {
    if (!Number.isSafeInteger(revision) || revision < 0 || revision > this.#revision) return undefined;
    if (revision === this.#revision) return [];
    this.#expire();
    const oldest = this.#ring[0]?.revision ?? this.#revision + 1;
    if (revision + 1 < oldest) return undefined;
    return this.#ring.slice(revision + 1 - oldest).map((e) => ({ ...e, status: copyStatus(e.status) }));
  }

  /** Delivers every future event to `listener`, synchronously and in revision order. */
  subscribe(listener: (event: ProbeEvent) => void): () => void {
    // A wrapper makes each subscription distinct, even when the same function subscribes twice.
    const entry = (e: ProbeEvent): void => listener(e);
    this.#listeners.add(entry);
    return () => {
      this.#listeners.delete(entry);
    };
  }

  #emit(type: ProbeEvent['type'], status: ProbeStatus, previous: ThresholdResult): ProbeEvent {
    const event: ProbeEvent = { revision: ++this.#revision, type, status: copyStatus(status), previous, time: this.#clock.now() };
    this.#ring.push(event);
    if (this.#ring.length > this.#ringSize) this.#ring.shift();
    this.#expire();
    this.#pending.push(event);
    if (!this.#delivering) this.#drain();
    return event;
  }

  /** Drops events past the age bound (the newest always stays: it marks where the ring starts). */
  #expire(): void {
    const cutoff = this.#clock.now() - this.#maxAgeMs;
    let n = 0;
    while (n < this.#ring.length - 1 && (this.#ring[n] as ProbeEvent).time < cutoff) n++;
    if (n > 0) this.#ring.splice(0, n);
  }

  #drain(): void {
    this.#delivering = true;
    try {
      for (let e = this.#pending.shift(); e; e = this.#pending.shift()) {
        for (const listener of [...this.#listeners]) {
          try {
            listener({ ...e, status: copyStatus(e.status) });
          } catch (err) {
            this.#onListenerError(err);
          }
        }
      }
    } finally {
      this.#delivering = false;
    }
  }
}
