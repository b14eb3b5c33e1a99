/**
 * Health checks in the Kubernetes component style (/healthz, /livez, /readyz).
 *
 * Liveness checks ("is the process able to do work at all") run on /healthz, /livez AND /readyz;
 * readiness checks ("should we be trusted right now": kubelet fresh, gRPC socket serving, helper
 * self-test) run on /readyz only, as in kube-apiserver. Every check has a timeout; concurrent
 * requests share one in-flight run per check, so a scrape storm cannot fork a storm of helper
 * self-tests; cacheMs additionally rate-limits expensive checks.
 */
import { describeError, ProbeAgentError } from '../errors.ts';
import { silentLogger, type Logger } from '../log.ts';

/** A check: resolves (or returns) when healthy; throws/rejects with the reason when not. */
export type HealthCheckFn = (signal: AbortSignal) => void | Promise<void>;

/** Per-check bounds. */
export interface CheckOptions {
  /** Fail the check when it has not answered within this many ms (default 2000, max 60000). */
  timeoutMs?: number;
  /** Reuse a finished result for this many ms (default 0: every request runs the check). */
  cacheMs?: number;
}

/** Which endpoint family is asked. */
export type HealthKind = 'livez' | 'readyz';

/** One check's verdict. */
export interface CheckResult {
  name: string;
  ok: boolean;
  /** Single line, bounded; only for failures. */
  reason?: string;
}

/** The verdict of one endpoint call. */
export interface HealthReport {
  ok: boolean;
  checks: CheckResult[];
  /** Names passed in ?exclude= that match no check (reported like Kubernetes does). */
  unknownExcludes: string[];
}

interface Check {
  name: string;
  kind: HealthKind;
  fn: HealthCheckFn;
  timeoutMs: number;
  cacheMs: number;
  running?: Promise<CheckResult>;
  cached?: { at: number; result: CheckResult };
}

const NAME_RE = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;
const MAX_REASON = 300;

/** Options for the registry itself. */
export interface HealthRegistryOptions {
  log?: Logger;
  /** The liveness 'eventloop' check fails when the loop stalled longer than this (default 10 s). */
  eventLoopStallSeconds?: number;
  now?: () => number;
}

/** The set of named checks behind /healthz, /livez and /readyz. */
export class HealthRegistry {
  readonly #checks = new Map<string, Check>();
  readonly #log: Logger;
  readonly #now: () => number;
  #shuttingDown = false;
  #lastReadyz: { ok: boolean; at: number } | undefined;
  #lastTick: number;
  #lastStallMs = 0;
  readonly #ticker: NodeJS.Timeout;

  constructor(opts: HealthRegistryOptions = {}) {
    this.#log = (opts.log ?? silentLogger).child({ component: 'health' });
    this.#now = opts.now ?? Date.now;
    const stallMs = (opts.eventLoopStallSeconds ?? 10) * 1000;
    const tickMs = 500;
    this.#lastTick = this.#now();
    // A timer that fires late by more than the bound means the loop was blocked that long.
    this.#ticker = setInterval(() => {
      const t = this.#now();
      this.#lastStallMs = Math.max(0, t - this.#lastTick - tickMs);
      this.#lastTick = t;
    }, tickMs);
    this.#ticker.unref();

    this.addLiveness('ping', () => {});
    this.addLiveness('eventloop', () => {
      const sinceTick = this.#now() - this.#lastTick - tickMs;
      const stall = Math.max(this.#lastStallMs, sinceTick);
      if (stall > stallMs) throw new Error(`event loop blocked for ${(stall / 1000).toFixed(1)}s (bound ${stallMs / 1000}s)`);
    });
    this.addReadiness('shutdown', () => {
      if (this.#shuttingDown) throw new Error('process is shutting down');
    });
  }

  /** Adds a check run by /healthz, /livez and /readyz. */
  addLiveness(name: string, fn: HealthCheckFn, opts: CheckOptions = {}): void {
    this.#add('livez', name, fn, opts);
  }

  /** Adds a check run by /readyz only. */
  addReadiness(name: string, fn: HealthCheckFn, opts: CheckOptions = {}): void {
    this.#add('readyz', name, fn, opts);
  }

  /** From now on /readyz fails with "[-]shutdown failed" (call at the start of graceful shutdown). */
  markShuttingDown(): void {
    this.#shuttingDown = true;
  }

  /** Check names an endpoint runs, in registration order. */
  names(kind: HealthKind): string[] {
    return [...this.#checks.values()].filter((c) => kind === 'readyz' || c.kind === 'livez').map((c) => c.name);
  }

  /** Runs one named check (for /readyz/<name>); undefined when no such check belongs to `kind`. */
  async runOne(kind: HealthKind, name: string): Promise<CheckResult | undefined> {
    const check = this.#checks.get(name);
    if (!check || (kind === 'livez' && check.kind !== 'livez')) return undefined;
    return this.#run(check);
  }

  /** Runs every check of an endpoint in parallel, minus `exclude`. */
  async run(kind: HealthKind, exclude: readonly string[] = []): Promise<HealthReport> {
    const names = this.names(kind);
    const skip = new Set(exclude);
    const unknownExcludes = [...skip].filter((n) => !names.includes(n));
    const checks = await Promise.all(
      names.filter((n) => !skip.has(n)).map((n) => this.#run(this.#checks.get(n) as Check)),
    );
    const failed = checks.filter((c) => !c.ok);
    // Only a full /readyz (no exclusions) is the agent's readiness as kubelet and the sidecar see it.
    if (kind === 'readyz' && skip.size === 0) this.#lastReadyz = { ok: failed.length === 0, at: this.#now() };
    if (failed.length > 0) {
      this.#log.info('health check failed', { endpoint: kind, failed: failed.map((c) => `${c.name}: ${c.reason}`) });
    }
    return { ok: failed.length === 0, checks, unknownExcludes };
  }

  /** The verdict of the latest full /readyz run and when (epoch ms); undefined before the first. */
  lastReadiness(): { ok: boolean; at: number } | undefined {
    return this.#lastReadyz;
  }

  /** Stops the event-loop ticker. */
  close(): void {
    clearInterval(this.#ticker);
  }

  #add(kind: HealthKind, name: string, fn: HealthCheckFn, opts: CheckOptions): void {
    if (!NAME_RE.test(name)) {
      throw new ProbeAgentError('health-check', `health check name "${name}" must be lowercase alphanumerics and '-' (max 63)`);
    }
    if (this.#checks.has(name)) throw new ProbeAgentError('health-check', `health check "${name}" is already registered`);
    const timeoutMs = clamp(opts.timeoutMs ?? 2000, 1, 60_000);
    const cacheMs = clamp(opts.cacheMs ?? 0, 0, 3_600_000);
    this.#checks.set(name, { name, kind, fn, timeoutMs, cacheMs });
  }

  #run(check: Check): Promise<CheckResult> {
    if (check.cached && this.#now() - check.cached.at < check.cacheMs) return Promise.resolve(check.cached.result);
    if (check.running) return check.running;
    const running = runWithTimeout(check).then((result) => {
      check.running = undefined;
      if (check.cacheMs > 0) check.cached = { at: this.#now(), result };
      return result;
    });
    check.running = running;
    return running;
  }
}

async function runWithTimeout(check: Check): Promise<CheckResult> {
  const ac = new AbortController();
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      const err = new Error(`timed out after ${check.timeoutMs / 1000}s`);
      ac.abort(err);
      reject(err);
    }, check.timeoutMs);
  });
  try {
    await Promise.race([Promise.resolve().then(() => check.fn(ac.signal)), timeout]);
    return { name: check.name, ok: true };
  } catch (err) {
    return { name: check.name, ok: false, reason: oneLine(describeError(err)) };
  } finally {
    clearTimeout(timer);
  }
}

/** Makes a readiness check that fails when `lastSuccessMs()` is older than `maxAgeSeconds` (or never happened). */
export function freshnessCheck(what: string, lastSuccessMs: () => number | undefined, maxAgeSeconds: number, now: () => number = Date.now): HealthCheckFn {
  return () => {
    const last = lastSuccessMs();
    if (last === undefined) throw new Error(`no successful ${what} yet`);
    const age = (now() - last) / 1000;
    if (age > maxAgeSeconds) throw new Error(`last successful ${what} ${age.toFixed(1)}s ago (bound ${maxAgeSeconds}s)`);
  };
}

function oneLine(s: string): string {
  const flat = s.replace(/[\r\n\t]+/g, ' ').replace(/[^\x20-\x7e]/g, '?');
  return flat.length > MAX_REASON ? `${flat.slice(0, MAX_REASON)}...` : flat;
}

function clamp(v: number, lo: number, hi: number): number {
  return Number.isFinite(v) ? Math.min(hi, Math.max(lo, v)) : lo;
}
