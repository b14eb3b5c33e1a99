/**
 * Finds the pod and container a CRI container ID belongs to, for the kubelet shim, whose ExecSync
 * names a container and nothing else. First the kubelet pod list (status.containerStatuses and
 * initContainerStatuses of probed containers); a container the last poll has not shown yet
 * (kubelet probes right after start, the poll runs every few seconds) is asked of the runtime:
 * ListContainers by ID gives the sandbox and kubelet's labels (pod UID, container name). A pod
 * the poll does not know at all is built from the sandbox's status (name, IPs, network mode) and
 * a re-poll is asked for. Answers are cached (bounded), so a probe per second per container
 * costs no runtime round trip.
 */
import { describeError, InvalidProbeError, NetnsUnavailableError, PodNotFoundError } from '../errors.ts';
import { silentLogger, type Logger } from '../log.ts';
import type { CriContainer, CriContainerFilter, CriPodSandboxStatusResponse } from '../netns/cri-client.ts';
import type { PodInfo } from './types.ts';

/** kubelet's labels on every container it creates (pkg/kubelet/types/labels.go). */
export const CONTAINER_LABELS = {
  podUID: 'io.kubernetes.pod.uid',
  podName: 'io.kubernetes.pod.name',
  podNamespace: 'io.kubernetes.pod.namespace',
  containerName: 'io.kubernetes.container.name',
} as const;

/** The subset of CriClient the lookup uses. */
export interface ContainerRuntime {
  listContainers(filter: CriContainerFilter, signal?: AbortSignal): Promise<CriContainer[]>;
  podSandboxStatus(podSandboxId: string, verbose: boolean, signal?: AbortSignal): Promise<CriPodSandboxStatusResponse>;
}

/** Where pods are found (PodSource in the daemon). */
export interface PodIndex {
  get(uid: string): PodInfo | undefined;
  pods(): PodInfo[];
}

/** A located container. `from` says how: the pod list, or the runtime (the poll lags). */
export interface LocatedContainer {
  pod: PodInfo;
  containerName: string;
  containerID: string;
  from: 'pods' | 'runtime';
}

/** Options of ContainerLocator. */
export interface ContainerLocatorOptions {
  pods: PodIndex;
  /** The CRI runtime, when the agent has one (the cri netns resolver's client). */
  runtime?: ContainerRuntime;
  /** Asks for a kubelet re-poll and resolves after it (or after a bounded wait); never rejects. */
  refreshPods?: (signal?: AbortSignal) => Promise<void>;
  /** Cached container IDs (default 4096). */
  maxEntries?: number;
  /** How long a pod built from the runtime is used before the pod list must have it (default 30 s). */
  runtimePodTtlMs?: number;
  /** How long an unknown ID is answered from memory (default 2 s). */
  negativeTtlMs?: number;
  /** Called once per lookup with how it ended (metrics); must not throw. */
  onLookup?: (source: LookupSource) => void;
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

interface Entry {
  uid: string;
  containerName: string;
  /** A pod built from the runtime, used until `expires` while the pod list does not have it. */
  runtimePod?: PodInfo;
  expires?: number;
}

/** Container ID -> pod and container, from the pod list first and the runtime second. */
export class ContainerLocator {
  readonly #o: ContainerLocatorOptions;
  readonly #log: Logger;
  readonly #max: number;
  readonly #entries = new Map<string, Entry>();
  readonly #unknown = new Map<string, number>();
  readonly #inflight = new Map<string, Promise<LocatedContainer>>();
  /** Runtime round trips made (tests and metrics read it: a cached probe makes none). */
  runtimeLookups = 0;

  constructor(opts: ContainerLocatorOptions) {
    this.#o = opts;
    this.#log = (opts.log ?? silentLogger).child({ component: 'container-lookup' });
    this.#max = opts.maxEntries ?? 4096;
  }

  /** Finds the container; rejects with PodNotFoundError (unknown), NetnsUnavailableError (runtime down) or InvalidProbeError. */
  async locate(rawID: string, signal?: AbortSignal): Promise<LocatedContainer> {
    const id = normalizeContainerID(rawID);
    const cached = this.#fromCache(id);
    if (cached) return this.#counted('cache', cached);
    const scanned = this.#scan(id);
    if (scanned) return this.#counted('pods', scanned);
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
      const found = await p;
      return this.#counted(found.from === 'runtime' ? 'runtime' : 'refresh', found);
    } catch (err) {
      this.#count(err instanceof NetnsUnavailableError ? 'unavailable' : 'not-found');
      throw err;
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

  /** Entries cached (tests). */
  get size(): number {
    return this.#entries.size;
  }

  #fromCache(id: string): LocatedContainer | undefined {
    const e = this.#entries.get(id);
    if (!e) return undefined;
    const pod = this.#o.pods.get(e.uid);
    if (pod) {
      // LRU: a hit moves to the back.
      this.#entries.delete(id);
      this.#entries.set(id, { uid: e.uid, containerName: e.containerName });
      return { pod, containerName: e.containerName, containerID: id, from: 'pods' };
    }
    if (e.runtimePod && e.expires !== undefined && Date.now() < e.expires) {
      return { pod: e.runtimePod, containerName: e.containerName, containerID: id, from: 'runtime' };
    }
    this.#entries.delete(id);
    return undefined;
  }

  /** The pod list: kubelet's containerStatuses (and initContainerStatuses, for sidecars). */
  #scan(id: string): LocatedContainer | undefined {
    for (const pod of this.#o.pods.pods()) {
      for (const c of pod.containers) {
        const cid = c.state?.containerID;
        if (cid && stripScheme(cid) === id) {
          this.#remember(id, { uid: pod.uid, containerName: c.name });
          return { pod, containerName: c.name, containerID: id, from: 'pods' };
        }
      }
    }
    return undefined;
  }

  async #slowPath(id: string, signal?: AbortSignal): Promise<LocatedContainer> {
    const { runtime, refreshPods } = this.#o;
    let runtimeError: unknown;
    if (runtime) {
      try {
        const found = await this.#askRuntime(runtime, id, signal);
        if (found) return found;
        // The runtime does not have it: no re-poll can make it appear.
        this.#unknown.set(id, Date.now() + (this.#o.negativeTtlMs ?? 2000));
        this.#trimUnknown();
        throw this.#notFound(id, 'the runtime has no such container');
      } catch (err) {
        if (err instanceof PodNotFoundError || err instanceof InvalidProbeError) throw err;
        runtimeError = err;
        this.#log.debug('runtime lookup failed; waiting for a kubelet poll', { container: id, err: describeError(err) });
      }
    }
    if (refreshPods) {
      await refreshPods(signal);
      const scanned = this.#scan(id);
      if (scanned) return scanned;
    }
    if (runtimeError !== undefined) {
      throw new NetnsUnavailableError(
        `container ${short(id)} is not in kubelet's pod list yet and the runtime cannot be asked: ${describeError(runtimeError)}`,
        { containerID: id },
        { cause: runtimeError },
      );
    }
    throw this.#notFound(id, runtime ? undefined : 'no CRI runtime configured to ask');
  }

  async #askRuntime(runtime: ContainerRuntime, id: string, signal?: AbortSignal): Promise<LocatedContainer | undefined> {
    this.runtimeLookups++;
    const items = await runtime.listContainers({ id }, signal);
    // Runtimes match a filter ID by prefix; only the exact container counts.
    const c = items.find((x) => x.id === id);
    if (!c) return undefined;
    const labels = c.labels ?? {};
    const uid = labels[CONTAINER_LABELS.podUID];
    const containerName = labels[CONTAINER_LABELS.containerName] || c.metadata?.name;
    if (!uid || !containerName) {
      throw new PodNotFoundError(`container ${short(id)} exists in the runtime but was not created by kubelet (no ${CONTAINER_LABELS.podUID} / ${CONTAINER_LABELS.containerName} labels)`, { containerID: id });
    }
    const known = this.#o.pods.get(uid);
    if (known) {
      this.#remember(id, { uid, containerName });
      return { pod: known, containerName, containerID: id, from: 'runtime' };
    }
    // A pod the poll has not shown: ask for a poll, and meanwhile probe what the runtime says it is.
    void this.#o.refreshPods?.();
    const pod = await this.#podFromSandbox(runtime, c, uid, containerName, signal);
    this.#remember(id, { uid, containerName, runtimePod: pod, expires: Date.now() + (this.#o.runtimePodTtlMs ?? 30_000) });
    this.#log.info('container not in the pod list yet; using the runtime\'s view of its pod', {
      container: short(id), pod: `${pod.namespace}/${pod.name}`, uid,
    });
    return { pod, containerName, containerID: id, from: 'runtime' };
  }

  async #podFromSandbox(runtime: ContainerRuntime, c: CriContainer, uid: string, containerName: string, signal?: AbortSignal): Promise<PodInfo> {
    const res = await runtime.podSandboxStatus(c.podSandboxId, false, signal);
    const st = res.status;
    if (!st) throw new PodNotFoundError(`container ${short(c.id)}: its sandbox ${short(c.podSandboxId)} has no status`, { containerID: c.id });
    const labels = c.labels ?? {};
    const ips = [st.network?.ip ?? '', ...(st.network?.additionalIps ?? []).map((a) => a.ip)].filter((ip) => ip !== '');
    return {
      uid,
      namespace: st.metadata?.namespace || labels[CONTAINER_LABELS.podNamespace] || '',
      name: st.metadata?.name || labels[CONTAINER_LABELS.podName] || '',
      hostNetwork: st.linux?.namespaces?.options?.network === 'NODE',
      podIPs: [...new Set(ips)],
      phase: 'Pending',
      restartPolicy: 'Always',
      isStatic: false,
      podReady: false,
      // Only the container: ports (for named ports) come with the pod list.
      containers: [{ name: containerName, kind: 'regular', ports: [], probes: {} }],
      ...(st.runtimeHandler ? { runtimeClassName: st.runtimeHandler } : {}),
    };
  }

  #remember(id: string, e: Entry): void {
    this.#entries.delete(id);
    this.#entries.set(id, e);
    this.#unknown.delete(id);
    while (this.#entries.size > this.#max) {
      const oldest = this.#entries.keys().next().value;
      if (oldest === undefined) break;
      this.#entries.delete(oldest);
    }
  }

  #trimUnknown(): void {
    const now = Date.now();
    if (this.#unknown.size <= this.#max) return;
    for (const [id, until] of this.#unknown) if (until <= now || this.#unknown.size > this.#max) this.#unknown.delete(id);
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
