/**
 * Finds the pod and container a CRI container ID belongs to, for the kubelet shim, whose ExecSync
 * names a container and nothing else. The runtime answers it all: ListContainers by ID gives the
 * sandbox, the container's name and ports (kubelet's label and annotation); PodSandboxStatus gives
 * the pod's identity, IPs, network mode, netns and annotations. Nothing waits for kubelet's /pods,
 * which shows a new pod's IP only after its status round trip. /pods adds what it has (the
 * container's probes and state for on-demand results, ports a container's annotation lacks) and is
 * the fallback while the runtime cannot be asked.
 *
 * Answers are cached per container and per sandbox (bounded, LRU), so a probe per second per
 * container costs no runtime round trip: a cached sandbox's netns is re-checked (same inode) at
 * most a second before use, the runtime is asked again after a TTL, and a sandbox found gone
 * (netns replaced or unmounted, a probe that met a vanished netns, its pod removed) is dropped
 * with its containers.
 */
import { describeError, InvalidProbeError, NetnsUnavailableError, PodNotFoundError, UnsupportedPodError } from '../errors.ts';
import { silentLogger, type Logger } from '../log.ts';
import type { CriContainer, CriContainerFilter, CriPodSandboxStatusResponse } from '../netns/cri-client.ts';
import { isProcNetnsPath, isSameNetnsNow } from '../netns/netns-path.ts';
import { outcomeOf } from '../netns/resolver.ts';
import { CONTAINER_LABELS, containerNameOf, containerPortsOf, sandboxViewOf, type RecordedHeaders, type SandboxView } from './sandbox-view.ts';
import type { ContainerInfo, ContainerPort, PodInfo } from '../pods/types.ts';

export { CONTAINER_LABELS } from './sandbox-view.ts';

/** The subset of CriClient the lookup uses. */
export interface ContainerRuntime {
  listContainers(filter: CriContainerFilter, signal?: AbortSignal): Promise<CriContainer[]>;
  podSandboxStatus(podSandboxId: string, verbose: boolean, signal?: AbortSignal): Promise<CriPodSandboxStatusResponse>;
}

/**
 * Reads a sandbox's netns out of its verbose status and checks it (CriResolver.netnsOfStatus):
 * rejects with UnsupportedPodError (host network, sandboxed runtime) or NetnsUnavailableError.
 */
export type SandboxNetnsReader = (res: CriPodSandboxStatusResponse, sandboxID: string, who: string, uid: string) => Promise<{ path: string; inode: number }>;

/** Where pods are found (PodSource in the daemon). */
export interface PodIndex {
  get(uid: string): PodInfo | undefined;
  pods(): PodInfo[];
}

/** The runtime's view of a located container's sandbox. */
export interface RuntimeSandbox {
  id: string;
  /** The checked netns path; probes run there without asking the netns resolvers. */
  netns: string;
  /** The httpGet headers the pod's original-handlers annotation records (sandbox-view.ts). */
  recordedHeaders?: RecordedHeaders;
  /** Why a present annotation could not be used. */
  recordedHeadersError?: string;
}

/**
 * A located container. `from` says how: the runtime (with `sandbox`), or kubelet's pod list (the
 * runtime could not be asked, or none is configured; the netns then comes from the resolvers).
 */
export interface LocatedContainer {
  pod: PodInfo;
  container: ContainerInfo;
  containerName: string;
  containerID: string;
  from: 'pods' | 'runtime';
  sandbox?: RuntimeSandbox;
}

/** Options of ContainerLocator. */
export interface ContainerLocatorOptions {
  pods: PodIndex;
  /** The CRI runtime, when the agent has one (the cri netns resolver's client). */
  runtime?: ContainerRuntime;
  /** Required with `runtime`: how a sandbox's netns is read and checked. */
  sandboxNetns?: SandboxNetnsReader;
  /** Asks for a kubelet re-poll and resolves after it (or after a bounded wait); never rejects. */
  refreshPods?: (signal?: AbortSignal) => Promise<void>;
  /** Cached container IDs, and cached sandboxes (default 4096 each). */
  maxEntries?: number;
  /** How long the runtime's answer about a sandbox is used before it is asked again (default 60 s, less up to 25 % jitter). */
  sandboxTtlMs?: number;
  /** How long an unknown ID is answered from memory (default 2 s). */
  negativeTtlMs?: number;
  /** Called once per lookup with how it ended (metrics); must not throw. */
  onLookup?: (source: LookupSource) => void;
  /**
   * Called with a container ID the lookup learnt is dead: exited, gone from the runtime, its
   * sandbox gone, or replaced (a new ID for the same pod and container name). What others cache
   * by container ID goes with it (ExecSync's parsed commands).
   */
  onContainerGone?: (containerID: string) => void;
  /** How long one check of a sandbox's bind-mounted netns stands (default 1 s; see NETNS_RECHECK_MS). */
  netnsRecheckMs?: number;
  log?: Logger;
}

/** How a lookup ended: where the container was found, or why it was not. */
export type LookupSource = 'cache' | 'pods' | 'runtime' | 'refresh' | 'not-found' | 'unavailable';

/** Longest container ID accepted: CRI IDs are 64 hex characters; leave room for other runtimes. */
const MAX_ID_LENGTH = 128;

/**
 * Strips a "<runtime>://" prefix (as kubelet's containerStatuses[].containerID carries) and checks
 * the rest; throws InvalidProbeError naming `field`.
 */
export function normalizeContainerID(raw: string, field = 'container_id'): string {
  const m = /^[a-z][a-z0-9+.-]{0,31}:\/\/(.*)$/.exec(raw);
  const id = m ? (m[1] ?? '') : raw;
  if (id === '') throw new InvalidProbeError(`${field}: empty container ID`, { field });
  if (id.length > MAX_ID_LENGTH || !/^[A-Za-z0-9][A-Za-z0-9_.-]*$/.test(id)) {
    throw new InvalidProbeError(`${field}: not a container ID: ${JSON.stringify(raw.slice(0, 80))}`, { field });
  }
  return id;
}

/** A sandbox as last read from the runtime. `gone` once invalidated: containers holding it look again. */
interface SandboxRecord {
  view: SandboxView;
  /** Absent when the pod cannot be probed from a netns: `unsupported` says why. */
  netns?: { path: string; inode: number };
  /** When the netns was last found the same (Date.now() ms); see NETNS_RECHECK_MS. */
  netnsCheckedAt?: number;
  unsupported?: UnsupportedPodError;
  freshUntil: number;
  /** When the runtime was asked (Date.now() ms): the pod was in kubelet's list by then (see retainPods). */
  readAt: number;
  gone: boolean;
}

interface ContainerEntry {
  containerName: string;
  /** CRI metadata.attempt: kubelet creates restart n of a container with attempt n. */
  attempt: number;
  ports: ContainerPort[];
  sandbox: SandboxRecord;
}

/**
 * How long one check of a sandbox's bind-mounted netns file stands (three syscalls per probe
 * otherwise). Such a name is never reused, and a torn-down sandbox's file is no namespace, which
 * the helper refuses (NS_GET_NSTYPE) before any setns: a probe never runs elsewhere in between.
 * A /proc/<pid>/ns/net path is checked every time: its pid can be reused by another pod's process.
 */
const NETNS_RECHECK_MS = 1000;

/** Container ID -> pod and container, from the runtime (kubelet's pod list as the fallback). */
export class ContainerLocator {
  readonly #o: ContainerLocatorOptions;
  readonly #log: Logger;
  readonly #max: number;
  readonly #ttlMs: number;
  readonly #netnsRecheckMs: number;
  readonly #entries = new Map<string, ContainerEntry>();
  readonly #sandboxes = new Map<string, SandboxRecord>();
  /** Containers the pod-list fallback found: container ID -> pod UID and container name. */
  readonly #listed = new Map<string, { uid: string; containerName: string }>();
  readonly #unknown = new Map<string, number>();
  readonly #inflight = new Map<string, Promise<{ found: LocatedContainer; source: LookupSource }>>();
  readonly #sandboxInflight = new Map<string, Promise<SandboxRecord>>();
  /** ListContainers round trips made (tests and metrics read it: a cached probe makes none). */
  runtimeLookups = 0;
  /** PodSandboxStatus round trips made (containers of one sandbox share one). */
  sandboxLookups = 0;

  constructor(opts: ContainerLocatorOptions) {
    if (opts.runtime && !opts.sandboxNetns) throw new TypeError('ContainerLocator: a runtime needs sandboxNetns');
    this.#o = opts;
    this.#log = (opts.log ?? silentLogger).child({ component: 'container-lookup' });
    this.#max = Math.max(1, opts.maxEntries ?? 4096);
    this.#ttlMs = Math.max(0, opts.sandboxTtlMs ?? 60_000);
    this.#netnsRecheckMs = Math.max(0, opts.netnsRecheckMs ?? NETNS_RECHECK_MS);
  }

  /** Entries cached (tests). */
  get size(): number {
    return this.#entries.size + this.#listed.size;
  }

  /** Sandboxes cached (tests). */
  get sandboxCount(): number {
    return this.#sandboxes.size;
  }

  /**
   * Finds the container; rejects with PodNotFoundError (unknown), NetnsUnavailableError (runtime
   * down, sandbox not ready), UnsupportedPodError (host network, sandboxed runtime) or InvalidProbeError.
   */
  async locate(rawID: string, signal?: AbortSignal): Promise<LocatedContainer> {
    const id = normalizeContainerID(rawID);
    let cached: LocatedContainer | undefined;
    try {
      cached = this.#fromCache(id);
    } catch (err) {
      // A cached pod that cannot be probed from a netns (host network, sandboxed runtime).
      this.#count('cache');
      throw err;
    }
    if (cached) return this.#counted('cache', cached);
    if (!this.#o.runtime) {
      const scanned = this.#scan(id);
      if (scanned) return this.#counted('pods', scanned);
    }
    const unknownUntil = this.#unknown.get(id);
    if (unknownUntil !== undefined) {
      if (Date.now() < unknownUntil) {
        this.#count('not-found');
        throw this.#notFound(id);
      }
      this.#unknown.delete(id);
    }
    // Concurrent probes of one new container share one runtime lookup.
    let p = this.#inflight.get(id);
    if (!p) {
      p = this.#slowPath(id, signal).finally(() => this.#inflight.delete(id));
      this.#inflight.set(id, p);
    }
    try {
      const { found, source } = await p;
      return this.#counted(source, found);
    } catch (err) {
      this.#count(err instanceof NetnsUnavailableError && outcomeOf(err) !== 'not-found' ? 'unavailable' : 'not-found');
      throw err;
    }
  }

  /** Drops a sandbox and every container cached with it (its netns vanished, or it was replaced). */
  invalidateSandbox(sandboxID: string): void {
    const rec = this.#sandboxes.get(sandboxID);
    if (rec) rec.gone = true;
    this.#sandboxes.delete(sandboxID);
    for (const [id, e] of this.#entries) if (e.sandbox.view.id === sandboxID) this.#gone(id);
  }

  /** Drops everything cached about a pod (it left kubelet's pod list). */
  forgetPod(uid: string): void {
    for (const [sid, rec] of this.#sandboxes) if (rec.view.uid === uid) this.invalidateSandbox(sid);
    for (const [id, e] of this.#listed) {
      if (e.uid !== uid) continue;
      this.#listed.delete(id);
      this.#tell(id);
    }
  }

  /**
   * Drops what is cached about pods that left kubelet's list: `listed` holds the UIDs of a list
   * kubelet answered to a request sent at `askedAt` (Date.now() ms). A sandbox read before that
   * belongs to a pod kubelet held then (it creates the sandbox after adding the pod), so its
   * absence means the pod is gone. forgetPod alone is not enough: a probe or preStop still in
   * flight for the pod caches it again from the runtime after it left.
   */
  retainPods(listed: ReadonlySet<string>, askedAt: number): void {
    const dropped = new Set<string>();
    for (const [sid, rec] of this.#sandboxes) {
      if (rec.readAt >= askedAt || listed.has(rec.view.uid)) continue;
      rec.gone = true;
      this.#sandboxes.delete(sid);
      dropped.add(sid);
    }
    for (const [id, e] of this.#entries) {
      const rec = e.sandbox;
      if (dropped.has(rec.view.id) || (rec.readAt < askedAt && !listed.has(rec.view.uid))) this.#gone(id);
    }
  }

  /** Drops a container's entry: it is dead or replaced. */
  #gone(id: string): void {
    this.#entries.delete(id);
    this.#tell(id);
  }

  #tell(id: string): void {
    try {
      this.#o.onContainerGone?.(id);
    } catch (err) {
      this.#log.warn('onContainerGone failed', { container: short(id), err: describeError(err) });
    }
  }

  #counted(source: LookupSource, found: LocatedContainer): LocatedContainer {
    this.#count(source);
    return found;
  }

  #count(source: LookupSource): void {
    try {
      this.#o.onLookup?.(source);
    } catch {
      // Metrics never break a lookup.
    }
  }

  #fromCache(id: string): LocatedContainer | undefined {
    const e = this.#entries.get(id);
    if (e) {
      const rec = e.sandbox;
      if (this.#superseded(e)) {
        // Restarted in the same sandbox under a new ID: the runtime says what became of this one.
        this.#gone(id);
        return undefined;
      }
      if (!rec.gone && Date.now() < rec.freshUntil && this.#netnsStillThere(rec)) {
        // LRU: a hit moves to the back.
        this.#entries.delete(id);
        this.#entries.set(id, e);
        return this.#located(id, e);
      }
      return undefined;
    }
    if (this.#o.runtime) return undefined;
    const l = this.#listed.get(id);
    if (!l) return undefined;
    const pod = this.#o.pods.get(l.uid);
    const container = pod?.containers.find((c) => c.name === l.containerName);
    if (pod && container) return { pod, container, containerName: l.containerName, containerID: id, from: 'pods' };
    this.#listed.delete(id);
    return undefined;
  }

  /**
   * Whether kubelet's pod list shows a later restart of this container (restartCount above the
   * cached attempt): the cached ID is then an earlier, replaced container. A list that lags behind
   * the runtime shows a lower count, so a new container's entry is never dropped by it.
   */
  #superseded(e: ContainerEntry): boolean {
    const listed = this.#o.pods.get(e.sandbox.view.uid)?.containers.find((c) => c.name === e.containerName);
    return listed?.state !== undefined && listed.state.restartCount > e.attempt;
  }

  /** A cached sandbox's netns, when it has one, is still the same namespace (a sandbox torn down unmounts it). */
  #netnsStillThere(rec: SandboxRecord): boolean {
    const ns = rec.netns;
    if (!ns) return true;
    const now = Date.now();
    if (rec.netnsCheckedAt !== undefined && now - rec.netnsCheckedAt < this.#netnsRecheckMs && !isProcNetnsPath(ns.path)) return true;
    if (isSameNetnsNow(ns.path, ns.inode)) {
      rec.netnsCheckedAt = now;
      return true;
    }
    this.invalidateSandbox(rec.view.id);
    return false;
  }

  /** The answer for a cached container: the runtime's pod, with what /pods knows of it. */
  #located(id: string, e: ContainerEntry): LocatedContainer {
    const rec = e.sandbox;
    if (rec.unsupported) throw rec.unsupported;
    const v = rec.view;
    const listed = this.#o.pods.get(v.uid);
    const listedContainer = listed?.containers.find((c) => c.name === e.containerName);
    const container: ContainerInfo = listedContainer
      ? (listedContainer.ports.length > 0 || e.ports.length === 0 ? listedContainer : { ...listedContainer, ports: e.ports })
      : { name: e.containerName, kind: 'regular', ports: e.ports, probes: {} };
    const pod: PodInfo = listed
      ? { ...listed, podIPs: v.podIPs, hostNetwork: v.hostNetwork || listed.hostNetwork }
      : {
          uid: v.uid,
          namespace: v.namespace,
          name: v.name,
          hostNetwork: v.hostNetwork,
          podIPs: v.podIPs,
          phase: 'Pending',
          restartPolicy: 'Always',
          isStatic: false,
          podReady: false,
          containers: [container],
          ...(v.runtimeHandler ? { runtimeClassName: v.runtimeHandler } : {}),
        };
    const sandbox: RuntimeSandbox = { id: v.id, netns: rec.netns?.path ?? '' };
    if (v.recordedHeaders !== undefined) sandbox.recordedHeaders = v.recordedHeaders;
    if (v.recordedHeadersError !== undefined) sandbox.recordedHeadersError = v.recordedHeadersError;
    return { pod, container, containerName: e.containerName, containerID: id, from: 'runtime', sandbox };
  }

  /** The pod list: kubelet's containerStatuses (and initContainerStatuses, for sidecars). */
  #scan(id: string): LocatedContainer | undefined {
    for (const pod of this.#o.pods.pods()) {
      for (const c of pod.containers) {
        const cid = c.state?.containerID;
        if (cid && stripScheme(cid) === id) {
          this.#bounded(this.#listed, id, { uid: pod.uid, containerName: c.name });
          return { pod, container: c, containerName: c.name, containerID: id, from: 'pods' };
        }
      }
    }
    return undefined;
  }

  async #slowPath(id: string, signal?: AbortSignal): Promise<{ found: LocatedContainer; source: LookupSource }> {
    const { runtime, refreshPods } = this.#o;
    if (!runtime) {
      if (refreshPods) {
        await refreshPods(signal);
        const scanned = this.#scan(id);
        if (scanned) return { found: scanned, source: 'refresh' };
      }
      throw this.#notFound(id, 'no CRI runtime configured to ask');
    }
    const stale = this.#entries.get(id);
    try {
      return { found: await this.#askRuntime(runtime, id, signal), source: 'runtime' };
    } catch (err) {
      if (err instanceof PodNotFoundError || err instanceof InvalidProbeError || err instanceof UnsupportedPodError) throw err;
      if (outcomeOf(err) !== 'unavailable' || signal?.aborted) throw err;
      // The runtime cannot be asked (restarting, overloaded). A sandbox cannot be replaced without
      // it, so the last answer stands while its netns is still the same namespace.
      if (stale && !stale.sandbox.gone && this.#netnsStillThere(stale.sandbox)) {
        this.#log.debug('runtime unavailable; using the last answer about the container', { container: short(id), err: describeError(err) });
        return { found: this.#located(id, stale), source: 'cache' };
      }
      this.#log.debug('runtime lookup failed; trying kubelet\'s pod list', { container: short(id), err: describeError(err) });
      const scanned = this.#scan(id);
      if (scanned) return { found: scanned, source: 'pods' };
      if (refreshPods) {
        await refreshPods(signal);
        const refreshed = this.#scan(id);
        if (refreshed) return { found: refreshed, source: 'refresh' };
      }
      throw new NetnsUnavailableError(
        `container ${short(id)} is not in kubelet's pod list yet and the runtime cannot be asked: ${describeError(err)}`,
        { containerID: id },
        { cause: err },
      );
    }
  }

  async #askRuntime(runtime: ContainerRuntime, id: string, signal?: AbortSignal): Promise<LocatedContainer> {
    this.runtimeLookups++;
    const items = await runtime.listContainers({ id }, signal);
    // Runtimes match a filter ID by prefix; only the exact container counts.
    const c = items.find((x) => x.id === id);
    if (!c) {
      // The runtime is the authority: a container it does not have is not probed anywhere.
      this.#gone(id);
      this.#bounded(this.#unknown, id, Date.now() + (this.#o.negativeTtlMs ?? 2000));
      throw this.#notFound(id, 'the runtime has no such container');
    }
    const uid = c.labels?.[CONTAINER_LABELS.podUID];
    const containerName = containerNameOf(c);
    if (!uid || !c.labels?.[CONTAINER_LABELS.containerName] || !containerName) {
      throw new PodNotFoundError(`container ${short(id)} exists in the runtime but was not created by kubelet (no ${CONTAINER_LABELS.podUID} / ${CONTAINER_LABELS.containerName} labels)`, { containerID: id });
    }
    const sandbox = await this.#sandbox(runtime, c.podSandboxId, signal);
    if (sandbox.view.uid !== uid) {
      throw new PodNotFoundError(`container ${short(id)} is labelled for pod ${uid} but its sandbox ${short(c.podSandboxId)} belongs to pod ${sandbox.view.uid}`, { containerID: id });
    }
    if (c.state === 'CONTAINER_EXITED') {
      // As the runtime's own ExecSync: nothing runs for a container that has exited (kubelet keeps the last one for its logs).
      this.#gone(id);
      throw new PodNotFoundError(`container ${short(id)} has exited: nothing is probed for it`, { containerID: id });
    }
    const entry: ContainerEntry = { containerName, attempt: c.metadata?.attempt ?? 0, ports: containerPortsOf(c), sandbox };
    // A new ID for the same pod and container name replaces the one cached (a restart, a new sandbox).
    if (!this.#entries.has(id)) {
      for (const [other, e] of this.#entries) if (e.containerName === containerName && e.sandbox.view.uid === uid) this.#gone(other);
    }
    this.#bounded(this.#entries, id, entry);
    this.#unknown.delete(id);
    return this.#located(id, entry);
  }

  /** The sandbox's record: cached while fresh and its netns unchanged, else read (once for concurrent callers). */
  async #sandbox(runtime: ContainerRuntime, sandboxID: string, signal?: AbortSignal): Promise<SandboxRecord> {
    const cached = this.#sandboxes.get(sandboxID);
    if (cached && !cached.gone && Date.now() < cached.freshUntil && this.#netnsStillThere(cached)) return cached;
    let p = this.#sandboxInflight.get(sandboxID);
    if (!p) {
      p = this.#readSandbox(runtime, sandboxID, signal).finally(() => this.#sandboxInflight.delete(sandboxID));
      this.#sandboxInflight.set(sandboxID, p);
    }
    return p;
  }

  async #readSandbox(runtime: ContainerRuntime, sandboxID: string, signal?: AbortSignal): Promise<SandboxRecord> {
    this.sandboxLookups++;
    const readAt = Date.now();
    let res: CriPodSandboxStatusResponse;
    try {
      res = await runtime.podSandboxStatus(sandboxID, true, signal);
    } catch (err) {
      if (outcomeOf(err) === 'not-found') {
        throw new PodNotFoundError(`sandbox ${short(sandboxID)} is gone from the runtime: ${describeError(err)}`, { sandboxID });
      }
      throw err;
    }
    const view = sandboxViewOf(res, sandboxID);
    if (typeof view === 'string') throw new PodNotFoundError(`sandbox ${short(sandboxID)}: ${view}`, { sandboxID });
    const who = `${view.namespace}/${view.name} (${view.uid})`;
    const rec: SandboxRecord = { view, freshUntil: Date.now() + this.#ttlMs * (0.75 + Math.random() / 4), readAt, gone: false };
    if (view.hostNetwork) {
      rec.unsupported = new UnsupportedPodError(`pod ${who} uses hostNetwork: its probes stay with kubelet`, { uid: view.uid, sandboxID });
    } else {
      try {
        rec.netns = await (this.#o.sandboxNetns as SandboxNetnsReader)(res, sandboxID, who, view.uid);
      } catch (err) {
        if (!(err instanceof UnsupportedPodError)) throw err;
        rec.unsupported = err;
      }
    }
    this.#bounded(this.#sandboxes, sandboxID, rec);
    return rec;
  }

  /** Sets `key` at the back of an LRU map and drops the oldest beyond the bound. */
  #bounded<V>(map: Map<string, V>, key: string, value: V): void {
    map.delete(key);
    map.set(key, value);
    while (map.size > this.#max) {
      const oldest = map.keys().next().value;
      if (oldest === undefined) break;
      map.delete(oldest);
    }
  }

  #notFound(id: string, why?: string): PodNotFoundError {
    return new PodNotFoundError(
      `container ${short(id)} is not known on this node${why ? ` (${why})` : ''}`,
      { containerID: id },
    );
  }
}

function stripScheme(id: string): string {
  const i = id.indexOf('://');
  return i >= 0 ? id.slice(i + 3) : id;
}

function short(id: string): string {
  return id.length > 13 ? id.slice(0, 13) : id;
}

/** What refreshPodsOf needs of PodSource. */
export interface RefreshablePods {
  refresh(): void;
  once(event: 'snapshot', listener: () => void): unknown;
  off(event: 'snapshot', listener: () => void): unknown;
}

/**
 * A refreshPods for ContainerLocator: asks the pod source for a poll now and resolves after the
 * next successful poll, after `maxWaitMs`, or when `signal` aborts, whichever comes first.
 */
export function refreshPodsOf(source: RefreshablePods, maxWaitMs = 2000): (signal?: AbortSignal) => Promise<void> {
  return (signal) =>
    new Promise<void>((resolve) => {
      if (signal?.aborted) {
        resolve();
        return;
      }
      const done = (): void => {
        clearTimeout(timer);
        source.off('snapshot', done);
        signal?.removeEventListener('abort', done);
        resolve();
      };
      const timer = setTimeout(done, maxWaitMs);
      source.once('snapshot', done);
      signal?.addEventListener('abort', done, { once: true });
      source.refresh();
    });
}
