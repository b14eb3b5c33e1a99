/**
 * Finding a pod's network namespace: the resolver contract, and the chain that tries resolvers in
 * order (CRI, then procfs, then address match), caches per pod UID and re-validates on every use.
 */
import {
  NetnsError,
  NetnsUnavailableError,
  ProbeAgentError,
  UnsupportedPodError,
  describeError,
} from '../errors.ts';
import { silentLogger, type Logger } from '../log.ts';
import { isSameNetns } from './netns-path.ts';

/** The pod fields a resolver may use. */
export interface PodRef {
  uid: string;
  namespace: string;
  name: string;
  /** status.podIPs, primary first. */
  podIPs: string[];
  runtimeClassName?: string;
}

/** Resolver names, also the `resolver` metric label. */
export type ResolverName = 'cri' | 'procfs' | 'address';

/** Bounded outcome label for metrics. */
export type ResolveOutcome = 'ok' | 'not-found' | 'unavailable' | 'unsupported' | 'ambiguous' | 'invalid';

/** A validated netns path for one pod. */
export interface NetnsResolution {
  /** Canonical path: a file directly inside an allowed netns directory, or <procRoot>/<pid>/ns/net. */
  path: string;
  resolver: ResolverName;
  sandboxID?: string;
  runtimeHandler?: string;
  /** Inode of the namespace (nsfs) the path pointed to when resolved. */
  inode?: number;
}

/** Finds the netns of one pod. Rejects with NetnsUnavailableError (retryable) or UnsupportedPodError. */
export interface NetnsResolver {
  readonly name: ResolverName;
  resolve(pod: PodRef, signal?: AbortSignal): Promise<NetnsResolution>;
}

/** Outcomes a NetnsUnavailableError can carry (context.outcome). */
export type FailureOutcome = Exclude<ResolveOutcome, 'ok' | 'unsupported'>;

/** A retryable resolution failure labelled with its metric outcome. */
export function resolveFailure(
  outcome: FailureOutcome,
  message: string,
  context: Record<string, unknown> = {},
  cause?: unknown,
): NetnsUnavailableError {
  return new NetnsUnavailableError(message, { ...context, outcome }, cause === undefined ? undefined : { cause });
}

/** True for a pod the runtime ran and no longer has a READY sandbox for: going, or its sandbox replaced. */
export function isSandboxGone(err: unknown): boolean {
  return err instanceof ProbeAgentError && err.context['sandboxGone'] === true;
}

/** Maps any error a resolver threw onto the metric outcome label. */
export function outcomeOf(err: unknown): Exclude<ResolveOutcome, 'ok'> {
  if (err instanceof UnsupportedPodError) return 'unsupported';
  if (err instanceof NetnsError) return err.kind === 'gone' ? 'not-found' : 'invalid';
  if (err instanceof ProbeAgentError) {
    const o = err.context['outcome'];
    if (o === 'not-found' || o === 'unavailable' || o === 'ambiguous' || o === 'invalid') return o;
  }
  return 'unavailable';
}

const UID_RE = /^[0-9A-Za-z][0-9A-Za-z._-]{0,127}$/;
const MAX_POD_IPS = 8;

/**
 * Rejects a PodRef no resolver should act on. The UID ends up in label selectors and cgroup path
 * matching, so it is held to kubelet's real shapes (UUID, or a static pod's hex hash).
 */
export function checkPodRef(pod: PodRef): void {
  if (typeof pod?.uid !== 'string' || !UID_RE.test(pod.uid)) {
    throw resolveFailure('invalid', `invalid pod UID ${JSON.stringify(String(pod?.uid)).slice(0, 140)}`);
  }
  if (!Array.isArray(pod.podIPs) || pod.podIPs.length > MAX_POD_IPS || pod.podIPs.some((ip) => typeof ip !== 'string')) {
    throw resolveFailure('invalid', `pod ${pod.uid}: podIPs must be at most ${MAX_POD_IPS} strings`, { uid: pod.uid });
  }
}

/** Runtime handlers (and RuntimeClass names) whose pods run behind their own network stack or VM: a setns'd socket would not reach the app. */
export const DEFAULT_SANDBOXED_RUNTIMES: readonly string[] = ['runsc', 'gvisor', 'kata', 'kata-qemu', 'kata-clh', 'kata-fc'];

/**
 * Fallback resolvers cannot see the runtime handler; the pod's runtimeClassName is their only hint
 * that the netns they would find is not where the app's network stack lives.
 */
export function refuseSandboxedRuntimeClass(pod: PodRef, sandboxed: readonly string[]): void {
  const rc = pod.runtimeClassName;
  if (rc && sandboxed.some((s) => s.toLowerCase() === rc.toLowerCase())) {
    throw new UnsupportedPodError(`pod ${podLabel(pod)} uses runtimeClassName "${rc}" (sandboxed): in-netns probes cannot reach it; left to kubelet`, {
      uid: pod.uid,
      runtimeClassName: rc,
    });
  }
}

/** "namespace/name (uid)" for messages. */
export function podLabel(pod: PodRef): string {
  return `${pod.namespace}/${pod.name} (${pod.uid})`;
}

/** Rejects with the signal's reason when it is aborted. */
export function throwIfAborted(signal: AbortSignal | undefined, what: string): void {
  if (signal?.aborted) throw resolveFailure('unavailable', `${what}: aborted`, {}, signal.reason);
}

/** Options of the chain. */
export interface NetnsResolverChainOptions {
  log?: Logger;
  /** Called once per resolver attempt (not for cache hits). */
  onResolve?: (resolver: ResolverName, outcome: ResolveOutcome, seconds: number) => void;
  /** How long a resolution is trusted before the resolvers are asked again; default 60 s. */
  cacheTtlMs?: number;
  /**
   * Each entry's TTL is shortened by a random share of up to this (0..0.5; default 0.25), so pods
   * resolved together (agent start, a node's pods at once) do not all refresh in the same second.
   */
  cacheTtlJitter?: number;
  /** Cap on cached pods; the oldest entry is dropped beyond it. Default 4096. */
  maxCacheEntries?: number;
}

interface CacheEntry {
  resolution: NetnsResolution;
  inode: number;
  podIPs: string;
  expiresAt: number;
  /** The stale fallback was announced in the log (once per entry, not once per probe). */
  staleLogged?: boolean;
}

const DEFAULT_TTL_MS = 60_000;
const DEFAULT_TTL_JITTER = 0.25;
const DEFAULT_MAX_ENTRIES = 4096;

/**
 * Tries resolvers in order; the first success wins. UnsupportedPodError stops the chain: a
 * host-network or sandboxed pod must not be "resolved" by a weaker fallback that finds some
 * other netns. So does the CRI runtime's "not found" for a pod it has run before (the pod's
 * sandbox is gone; a fallback matching its IPs could find the pod that reused them). Cached per pod UID; a cached path is re-checked (exists, same inode) on every use.
 * When the TTL has run out but the resolver that found the netns is unavailable now (the runtime
 * is down or restarting), the last netns is kept while it still exists with the same inode: a
 * sandbox cannot be replaced without the runtime, and the pod's probes must not stop with it.
 */
export class NetnsResolverChain {
  readonly #resolvers: NetnsResolver[];
  readonly #log: Logger;
  readonly #onResolve: NetnsResolverChainOptions['onResolve'];
  readonly #ttlMs: number;
  readonly #ttlJitter: number;
  readonly #maxEntries: number;
  readonly #cache = new Map<string, CacheEntry>();
  readonly #inflight = new Map<string, Promise<NetnsResolution>>();
  /**
   * Pods the CRI resolver has found (FIFO-bounded like the cache, refreshed on every CRI success).
   * The runtime is the authority on its own sandboxes: once it ran a pod, its "no READY sandbox"
   * means the pod's sandbox is gone, and no fallback may look for the pod's IPs elsewhere (during
   * the pod list's poll lag a new pod can hold a deleted pod's IP). Never cleared by invalidate():
   * a probe finding the netns gone is exactly when the answer matters.
   */
  readonly #runtimeKnown = new Set<string>();
  /** Bumped by invalidate() so a resolution in flight at that moment is not cached; cleared when it settles. */
  readonly #generation = new Map<string, number>();

  constructor(resolvers: NetnsResolver[], opts: NetnsResolverChainOptions = {}) {
    if (resolvers.length === 0) throw new ProbeAgentError('config', 'netns resolver chain needs at least one resolver');
    this.#resolvers = [...resolvers];
    this.#log = (opts.log ?? silentLogger).child({ component: 'netns-resolver' });
    this.#onResolve = opts.onResolve;
    this.#ttlMs = Math.max(0, opts.cacheTtlMs ?? DEFAULT_TTL_MS);
    this.#ttlJitter = Math.min(0.5, Math.max(0, opts.cacheTtlJitter ?? DEFAULT_TTL_JITTER));
    this.#maxEntries = Math.max(1, opts.maxCacheEntries ?? DEFAULT_MAX_ENTRIES);
  }

  /** Number of cached pods. */
  get cacheSize(): number {
    return this.#cache.size;
  }

  /** The pod's netns: from the cache when still valid, else from the first resolver that finds it. */
  async resolve(pod: PodRef, signal?: AbortSignal): Promise<NetnsResolution> {
    checkPodRef(pod);
    throwIfAborted(signal, `resolving the netns of pod ${podLabel(pod)}`);
    const cached = await this.#fromCache(pod);
    if (cached) return cached;
    let pending = this.#inflight.get(pod.uid);
    if (!pending) {
      pending = this.#resolveUncached(pod).finally(() => {
        this.#inflight.delete(pod.uid);
        this.#generation.delete(pod.uid);
      });
      this.#inflight.set(pod.uid, pending);
    }
    return signal ? raceAbort(pending, signal, pod) : pending;
  }

  /** Forgets the pod's cached netns (pod gone, or a probe found the netns gone). */
  invalidate(uid: string): void {
    this.#cache.delete(uid);
    if (this.#inflight.has(uid)) this.#generation.set(uid, (this.#generation.get(uid) ?? 0) + 1);
  }

  /** Forgets every cached netns. */
  clear(): void {
    for (const uid of this.#cache.keys()) this.invalidate(uid);
    for (const uid of this.#inflight.keys()) this.invalidate(uid);
  }

  async #fromCache(pod: PodRef): Promise<NetnsResolution | undefined> {
    const entry = this.#cache.get(pod.uid);
    if (!entry) return undefined;
    // New pod IPs mean a new sandbox. An expired entry may point at a netns that a restarted
    // sandbox replaced but that something still holds open: it is kept only as a fallback for
    // when its resolver cannot be asked (see #staleFallback).
    if (entry.podIPs !== ipKey(pod.podIPs)) {
      this.#cache.delete(pod.uid);
      return undefined;
    }
    if (entry.expiresAt <= Date.now()) return undefined;
    if (await isSameNetns(entry.resolution.path, entry.inode)) {
      if (this.#cache.get(pod.uid) === entry) return entry.resolution;
      return undefined;
    }
    this.#log.debug('cached netns gone or replaced', { uid: pod.uid, path: entry.resolution.path, inode: entry.inode });
    if (this.#cache.get(pod.uid) === entry) this.#cache.delete(pod.uid);
    return undefined;
  }

  async #resolveUncached(pod: PodRef): Promise<NetnsResolution> {
    const generation = this.#generation.get(pod.uid) ?? 0;
    const failures: string[] = [];
    let worst: FailureOutcome = 'not-found';
    let lastCause: unknown;
    const unavailable = new Set<ResolverName>();
    for (const resolver of this.#resolvers) {
      const started = performance.now();
      try {
        const resolution = await resolver.resolve(pod);
        this.#observe(resolver.name, 'ok', started);
        if (resolver.name === 'cri') this.#rememberRuntimePod(pod.uid);
        this.#store(pod, resolution, generation);
        this.#log.debug('netns resolved', { uid: pod.uid, resolver: resolver.name, path: resolution.path });
        return resolution;
      } catch (err) {
        const outcome = outcomeOf(err);
        this.#observe(resolver.name, outcome, started);
        if (outcome === 'unsupported') throw err;
        if (outcome === 'not-found' && resolver.name === 'cri' && (this.#runtimeKnown.has(pod.uid) || isSandboxGone(err))) {
          // The runtime ran this pod (we resolved it before, or it lists a stopped sandbox) and has no
          // READY sandbox for it now: the pod is gone or its sandbox is being replaced. Its IPs may
          // already belong to another pod: look no further.
          throw resolveFailure(
            'not-found',
            `netns of pod ${podLabel(pod)} not resolvable: the runtime no longer has a READY sandbox for it (${describeError(err)}); ` +
              'not falling back to the other resolvers, whose match could be another pod that reused its IP',
            { uid: pod.uid, namespace: pod.namespace, name: pod.name, resolver: 'cri', sandboxGone: true },
            err,
          );
        }
        this.#log.debug('netns resolver failed', { uid: pod.uid, resolver: resolver.name, outcome, err: describeError(err) });
        failures.push(`${resolver.name}: ${describeError(err)}`);
        worst = moreTelling(worst, outcome as FailureOutcome);
        lastCause = err;
        if (outcome === 'unavailable') unavailable.add(resolver.name);
      }
    }
    const stale = await this.#staleFallback(pod, unavailable, generation);
    if (stale) return stale;
    throw resolveFailure(
      worst,
      `netns of pod ${podLabel(pod)} not resolvable: ${failures.join('; ')}`,
      { uid: pod.uid, namespace: pod.namespace, name: pod.name },
      lastCause,
    );
  }

  /**
   * The expired entry of a pod whose resolver could not be asked just now (runtime down), if its
   * netns is still there with the same inode; a resolver that answered "not found" is believed.
   */
  async #staleFallback(pod: PodRef, unavailable: ReadonlySet<ResolverName>, generation: number): Promise<NetnsResolution | undefined> {
    const entry = this.#cache.get(pod.uid);
    if (!entry || !unavailable.has(entry.resolution.resolver) || entry.podIPs !== ipKey(pod.podIPs)) return undefined;
    if ((this.#generation.get(pod.uid) ?? 0) !== generation) return undefined;
    if (!(await isSameNetns(entry.resolution.path, entry.inode))) {
      if (this.#cache.get(pod.uid) === entry) this.#cache.delete(pod.uid);
      return undefined;
    }
    if (this.#cache.get(pod.uid) !== entry) return undefined;
    if (!entry.staleLogged) {
      entry.staleLogged = true;
      this.#log.warn('netns resolver unavailable; probing in the last known netns of the pod', {
        uid: pod.uid, resolver: entry.resolution.resolver, path: entry.resolution.path,
      });
    }
    return entry.resolution;
  }

  #rememberRuntimePod(uid: string): void {
    this.#runtimeKnown.delete(uid);
    if (this.#runtimeKnown.size >= this.#maxEntries) {
      const oldest = this.#runtimeKnown.values().next().value;
      if (oldest !== undefined) this.#runtimeKnown.delete(oldest);
    }
    this.#runtimeKnown.add(uid);
  }

  #store(pod: PodRef, resolution: NetnsResolution, generation: number): void {
    if ((this.#generation.get(pod.uid) ?? 0) !== generation) return;
    if (resolution.inode === undefined) return;
    this.#cache.delete(pod.uid);
    if (this.#cache.size >= this.#maxEntries) {
      const oldest = this.#cache.keys().next().value;
      if (oldest !== undefined) this.#cache.delete(oldest);
    }
    this.#cache.set(pod.uid, {
      resolution,
      inode: resolution.inode,
      podIPs: ipKey(pod.podIPs),
      // Jittered downwards only: the TTL stays an upper bound.
      expiresAt: Date.now() + this.#ttlMs * (1 - this.#ttlJitter * Math.random()),
    });
  }

  #observe(resolver: ResolverName, outcome: ResolveOutcome, started: number): void {
    try {
      this.#onResolve?.(resolver, outcome, (performance.now() - started) / 1000);
    } catch (err) {
      this.#log.warn('netns resolve observer threw', { err: describeError(err) });
    }
  }
}

/** Orders failure outcomes by how much they tell an operator; the chain reports the most telling. */
const TELLING: Record<FailureOutcome, number> = { 'not-found': 0, unavailable: 1, invalid: 2, ambiguous: 3 };

function moreTelling(a: FailureOutcome, b: FailureOutcome): FailureOutcome {
  return TELLING[b] > TELLING[a] ? b : a;
}

function ipKey(ips: string[]): string {
  return ips.join(',');
}

function raceAbort<T>(p: Promise<T>, signal: AbortSignal, pod: PodRef): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const onAbort = (): void => reject(resolveFailure('unavailable', `resolving the netns of pod ${podLabel(pod)}: aborted`, {}, signal.reason));
    signal.addEventListener('abort', onAbort, { once: true });
    p.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
  });
}
