/**
 * Polls the kubelet's pod list and turns it into snapshots and diffs. A failed poll never
 * changes the known set: the last good list is kept (and marked stale) until the kubelet answers.
 */
import { EventEmitter } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import { ConfigError, describeError } from '../errors.ts';
import { silentLogger, type Logger } from '../log.ts';
import { KubeletError, type KubeletErrorKind } from './kubelet-client.ts';
import { parsePodList, type PodListLimits, type PodParseError } from './pod-model.ts';
import type { PodInfo } from './types.ts';

/** Anything that can fetch the kubelet's v1.PodList (KubeletClient in production). */
export interface PodListFetcher {
  getPods(signal?: AbortSignal): Promise<unknown>;
}

/** The full known set after a successful poll. */
export interface PodSnapshot {
  pods: PodInfo[];
  /** Pods of the list that could not be parsed (they are absent from `pods`). */
  errors: PodParseError[];
  /** Epoch ms of the poll. */
  time: number;
  /** Epoch ms the list was asked for: every pod kubelet held then is in `pods` or `errors`, unless it left since. */
  askedAt: number;
}

/** What changed between two successful polls, keyed by pod UID. */
export interface PodDiff {
  added: PodInfo[];
  /** New versions of pods where anything we use changed (container restarted, IPs arrived, spec edited...). */
  updated: PodInfo[];
  /** The last known version of pods no longer listed. */
  removed: PodInfo[];
}

/** Events: 'snapshot' after every successful poll; 'diff' after a successful poll that changed something. */
export type PodSourceEvents = { snapshot: [PodSnapshot]; diff: [PodDiff] };

export interface PodSourceOptions {
  client: PodListFetcher;
  /** --kubelet-poll-interval; default 5 s. */
  pollIntervalMs?: number;
  /** Longest wait between failed polls; default max(interval, min(interval * 6, 30 s)). */
  maxBackoffMs?: number;
  /** Least time between two polls when refresh() is asked for; default min(1 s, interval). */
  minRefreshMs?: number;
  limits?: PodListLimits;
  log?: Logger;
  /** Called after every poll (metrics): duration, and the error kind when it failed. Must not throw. */
  onPoll?: (durationSeconds: number, errorKind?: KubeletErrorKind) => void;
}

export const DEFAULT_POLL_INTERVAL_MS = 5_000;
const BACKOFF_CEILING_MS = 30_000;

/** Polls the kubelet, keeps the last good pod set, and emits snapshots and diffs. */
export class PodSource extends EventEmitter<PodSourceEvents> {
  readonly pollIntervalMs: number;
  readonly maxBackoffMs: number;
  readonly #client: PodListFetcher;
  readonly #minRefreshMs: number;
  readonly #limits: PodListLimits;
  readonly #log: Logger;
  readonly #onPoll: PodSourceOptions['onPoll'];
  #pods = new Map<string, PodInfo>();
  #podErrors: PodParseError[] = [];
  #loggedPodErrors = new Set<string>();
  #lastSuccess: number | undefined;
  #staleSince: number | undefined;
  #failures = 0;
  #lastError: KubeletError | undefined;
  #lastPollStart = 0;
  #running: Promise<void> | undefined;
  #stop = new AbortController();
  #wake: AbortController | undefined;
  #refreshWanted = false;
  #synced: { promise: Promise<void>; resolve: () => void };

  constructor(opts: PodSourceOptions) {
    super();
    this.#client = opts.client;
    this.pollIntervalMs = opts.pollIntervalMs ?? DEFAULT_POLL_INTERVAL_MS;
    this.maxBackoffMs = opts.maxBackoffMs ?? Math.max(this.pollIntervalMs, Math.min(this.pollIntervalMs * 6, BACKOFF_CEILING_MS));
    this.#minRefreshMs = opts.minRefreshMs ?? Math.min(1_000, this.pollIntervalMs);
    for (const [what, v] of [['poll interval', this.pollIntervalMs], ['max backoff', this.maxBackoffMs], ['min refresh', this.#minRefreshMs]] as const) {
      if (!Number.isFinite(v) || v <= 0 || v > 24 * 3600_000) throw new ConfigError(`kubelet ${what} must be > 0 ms and at most a day, got ${v}`);
    }
    this.#limits = opts.limits ?? {};
    this.#log = (opts.log ?? silentLogger).child({ component: 'pod-source' });
    this.#onPoll = opts.onPoll;
    let resolve!: () => void;
    const promise = new Promise<void>((r) => (resolve = r));
    this.#synced = { promise, resolve };
  }

  /** Starts polling; the first poll runs at once. Idempotent. */
  start(): void {
    if (this.#running || this.#stop.signal.aborted) return;
    this.#running = this.#loop();
  }

  /** Stops polling and aborts a poll in flight; resolves when the loop has exited. */
  async stop(): Promise<void> {
    this.#stop.abort();
    await this.#running;
  }

  /** Asks for a poll now (e.g. a request named a pod we do not know yet); ignored while backing off. */
  refresh(): void {
    if (this.#failures > 0) return;
    // Remembered, not just a wake-up: the loop may be between polls and not asleep yet.
    this.#refreshWanted = true;
    this.#wake?.abort();
  }

  /** Resolves after the first successful poll, or rejects when `signal` aborts first. */
  synced(signal?: AbortSignal): Promise<void> {
    if (!signal) return this.#synced.promise;
    return Promise.race([
      this.#synced.promise,
      new Promise<never>((_, reject) => {
        if (signal.aborted) reject(signal.reason);
        signal.addEventListener('abort', () => reject(signal.reason), { once: true });
      }),
    ]);
  }

  /** The last good pod set (possibly stale); the objects are shared: treat them as read-only. */
  pods(): PodInfo[] {
    return [...this.#pods.values()];
  }

  /** One pod of the last good set by UID. */
  get(uid: string): PodInfo | undefined {
    return this.#pods.get(uid);
  }

  /** Pods of the last good list that could not be parsed. */
  podErrors(): PodParseError[] {
    return [...this.#podErrors];
  }

  /** Epoch ms of the last successful poll; undefined before the first. */
  get lastSuccess(): number | undefined {
    return this.#lastSuccess;
  }

  /** Epoch ms of the first failed poll of the current failure streak; undefined while healthy. */
  get staleSince(): number | undefined {
    return this.#staleSince;
  }

  /** Failed polls since the last success. */
  get consecutiveFailures(): number {
    return this.#failures;
  }

  /** The error of the last failed poll of the current streak. */
  get lastError(): KubeletError | undefined {
    return this.#lastError;
  }

  /** True while polls fail (or before the first success). */
  get stale(): boolean {
    return this.#staleSince !== undefined || this.#lastSuccess === undefined;
  }

  async #loop(): Promise<void> {
    const stop = this.#stop.signal;
    while (!stop.aborted) {
      this.#lastPollStart = Date.now();
      this.#refreshWanted = false;
      await this.#poll();
      if (stop.aborted) break;
      const elapsed = Date.now() - this.#lastPollStart;
      const wait = this.#failures > 0 ? this.#backoff() : Math.max(0, this.pollIntervalMs - elapsed);
      await this.#sleep(wait);
      if (!stop.aborted && this.#failures === 0) {
        // A refresh() may have cut the wait short: never poll the kubelet more often than minRefreshMs.
        await this.#sleep(this.#lastPollStart + this.#minRefreshMs - Date.now(), false);
      }
    }
  }

  /** Waits `ms`, cut short by stop() (and by refresh() when `wakeable`). */
  async #sleep(ms: number, wakeable = true): Promise<void> {
    if (ms <= 0 || (wakeable && this.#refreshWanted)) return;
    const wake = new AbortController();
    if (wakeable) this.#wake = wake;
    try {
      await sleep(ms, undefined, { signal: AbortSignal.any([this.#stop.signal, wake.signal]) });
    } catch {
      // Aborted: stop() or refresh().
    } finally {
      if (this.#wake === wake) this.#wake = undefined;
    }
  }

  #backoff(): number {
    const exp = Math.min(this.#failures - 1, 20);
    return Math.min(this.maxBackoffMs, this.pollIntervalMs * 2 ** exp);
  }

  /**
   * The last pod list object (weakly: the client keeps it while it may hand it back) and its parse
   * (see #poll). Holding it strongly would keep a large list alive between polls.
   */
  #lastJson: { json: WeakRef<object> | unknown; parsed: ReturnType<typeof parsePodList> } | undefined;

  async #poll(): Promise<void> {
    const started = performance.now();
    const askedAt = Date.now();
    let parsed: ReturnType<typeof parsePodList>;
    try {
      const json = await this.#client.getPods(this.#stop.signal);
      // The client hands back the same object for a byte-identical answer: reuse its parse, so
      // unchanged pods keep their PodInfo objects and every consumer can skip them by identity.
      const last = this.#lastJson;
      const lastJson = last?.json instanceof WeakRef ? (last.json.deref() as unknown) : last?.json;
      parsed = last !== undefined && json === lastJson ? last.parsed : parsePodList(json, this.#limits);
      this.#lastJson = { json: typeof json === 'object' && json !== null ? new WeakRef(json) : json, parsed };
    } catch (err) {
      if (this.#stop.signal.aborted) return;
      this.#failed(err, (performance.now() - started) / 1000);
      return;
    }
    this.#report((performance.now() - started) / 1000);
    this.#succeeded(parsed.pods, parsed.errors, askedAt);
  }

  #failed(err: unknown, seconds: number): void {
    const kerr = err instanceof KubeletError
      ? err
      : new KubeletError('unreachable', `kubelet pod list failed: ${describeError(err)}`, {}, { cause: err });
    this.#report(seconds, kerr.kind);
    this.#failures++;
    this.#lastError = kerr;
    if (this.#staleSince === undefined) {
      this.#staleSince = Date.now();
      // Once per streak: a kubelet down for an hour must not write 720 warnings.
      this.#log.warn('kubelet pod list unavailable; keeping the last known pods', {
        kind: kerr.kind, error: kerr.message, pods: this.#pods.size, retryInMs: this.#backoff(),
      });
    } else {
      this.#log.debug('kubelet pod list still unavailable', { kind: kerr.kind, error: kerr.message, failures: this.#failures });
    }
  }

  #succeeded(pods: PodInfo[], errors: PodParseError[], askedAt: number): void {
    const now = Date.now();
    if (this.#staleSince !== undefined) {
      this.#log.info('kubelet pod list recovered', { failures: this.#failures, staleSeconds: (now - this.#staleSince) / 1000 });
    }
    this.#failures = 0;
    this.#staleSince = undefined;
    this.#lastError = undefined;
    this.#lastSuccess = now;
    this.#logPodErrors(errors);
    this.#podErrors = errors;

    const next = new Map(pods.map((p) => [p.uid, p]));
    const diff: PodDiff = { added: [], updated: [], removed: [] };
    for (const [uid, pod] of next) {
      const before = this.#pods.get(uid);
      if (!before) diff.added.push(pod);
      else if (!deepEqual(before, pod)) diff.updated.push(pod);
    }
    for (const [uid, pod] of this.#pods) if (!next.has(uid)) diff.removed.push(pod);
    this.#pods = next;

    this.#emitSafely('snapshot', { pods, errors, time: now, askedAt });
    if (diff.added.length || diff.updated.length || diff.removed.length) this.#emitSafely('diff', diff);
    this.#synced.resolve();
  }

  /** Logs each unparseable pod once while it stays unparseable (not once per poll). */
  #logPodErrors(errors: PodParseError[]): void {
    const current = new Set<string>();
    for (const e of errors) {
      // Once per pod and reason, wherever the pod sits in the list (the items[i] prefix moves).
      const key = `${e.uid ?? ''}/${e.namespace ?? ''}/${e.name ?? ''}/${e.reason}/${e.error.replace(/^items\[\d+\]: /, '')}`;
      current.add(key);
      if (!this.#loggedPodErrors.has(key)) {
        this.#log.warn('pod from kubelet cannot be parsed; not probing it', { uid: e.uid, namespace: e.namespace, pod: e.name, reason: e.reason, error: e.error });
      }
    }
    this.#loggedPodErrors = current;
  }

  #report(seconds: number, kind?: KubeletErrorKind): void {
    try {
      this.#onPoll?.(seconds, kind);
    } catch (err) {
      this.#log.error('onPoll callback threw', { error: describeError(err) });
    }
  }

  #emitSafely<K extends keyof PodSourceEvents>(event: K, ...args: PodSourceEvents[K]): void {
    try {
      (this.emit as (e: K, ...a: PodSourceEvents[K]) => boolean)(event, ...args);
    } catch (err) {
      // A listener bug must not stop polling (the known set would silently freeze).
      this.#log.error('pod source listener threw', { event, error: describeError(err) });
    }
  }
}

/** Structural equality of plain JSON-like values (PodInfo holds nothing else). */
export function deepEqual(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  if (Array.isArray(a)) {
    const bb = b as unknown[];
    return a.length === bb.length && a.every((v, i) => deepEqual(v, bb[i]));
  }
  const ao = a as Record<string, unknown>;
  const bo = b as Record<string, unknown>;
  const ak = Object.keys(ao).filter((k) => ao[k] !== undefined);
  const bk = Object.keys(bo).filter((k) => bo[k] !== undefined);
  return ak.length === bk.length && ak.every((k) => Object.hasOwn(bo, k) && deepEqual(ao[k], bo[k]));
}
