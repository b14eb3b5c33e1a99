/**
 * The probe manager: reconciles one ProbeWorker per network probe of every pod we own (regular
 * containers and sidecars), derives each container's started/ready the way kubelet's
 * UpdatePodStatus does (pkg/kubelet/prober/prober_manager.go), and writes ProbeStatus into the
 * results store. It neither resolves netns nor builds probe contexts: the injected RunProbe does.
 */
import { describeError } from '../errors.ts';
import { silentLogger } from '../log.ts';
import type { Logger } from '../log.ts';
import type { ContainerInfo, ContainerProbe, NotOursReason, PodInfo } from '../pods/types.ts';
import { PROBE_TYPES } from '../probe/types.ts';
import type { ProbeOutcome, ProbeType } from '../probe/types.ts';
import type { Clock } from './clock.ts';
import { realClock } from './clock.ts';
import type { FairLimiter } from './limiter.ts';
import { probeKeyString } from './results-store.ts';
import type { ResultsStore } from './results-store.ts';
import type { ProbeKey, ProbeObserver, ProbeStatus } from './types.ts';
import { ProbeWorker, RESTART_GRACE_MS } from './worker.ts';
import type { RunProbe, WorkerHost } from './worker.ts';

/** Default cap on workers; a node runs ~110 pods, so this is only a guard against runaway input. */
export const DEFAULT_MAX_WORKERS = 10_000;

/** Options for ProbeManager. */
export interface ProbeManagerOptions {
  runProbe: RunProbe;
  store: ResultsStore;
  /** Decides which pods are left to kubelet (agent/pods/pod-model.ts classifyPod). */
  classify: (pod: PodInfo) => NotOursReason | undefined;
  limiter?: FairLimiter;
  observer?: ProbeObserver;
  clock?: Clock;
  /** When the agent started, epoch ms (default: now on the clock). */
  agentStart?: number;
  logger?: Logger;
  maxWorkers?: number;
  /** Probe ticks fire at multiples of this many ms, so ticks due together share a wakeup (0: off). */
  tickAlignMs?: number;
}

/** A pod left to kubelet, and why. */
export interface NotOursPod {
  pod: { uid: string; namespace: string; name: string };
  reason: NotOursReason;
}

function keyOf(podUID: string, containerName: string, probeType: ProbeType): ProbeKey {
  return { podUID, containerName, probeType };
}

/** Probes we run: parsed network probes, and unparsable ones (shown as errors). Exec stays with kubelet. */
function isOurs(probe: ContainerProbe): boolean {
  return !probe.ok || probe.spec.handler.kind !== 'exec';
}

function isKubeletExec(probe: ContainerProbe | undefined): boolean {
  return probe !== undefined && probe.ok && probe.spec.handler.kind === 'exec';
}

/** Starts, updates and stops probe workers as pods come and go. */
export class ProbeManager {
  readonly #opts: ProbeManagerOptions;
  readonly #clock: Clock;
  readonly #agentStart: number;
  readonly #logger: Logger;
  readonly #maxWorkers: number;
  readonly #host: WorkerHost;
  readonly #workers = new Map<string, ProbeWorker>();
  readonly #pods = new Map<string, PodInfo>();
  readonly #notOurs = new Map<string, NotOursPod>();
  /** Workers that ended by themselves; not restarted while their pod exists (kubelet adds workers once). */
  readonly #finished = new Map<string, Set<string>>();
  /** Stopped workers whose aborted run has not settled yet. */
  readonly #draining = new Set<ProbeWorker>();
  /**
   * A container's worker ids by probe type. Every probe result and every pod sync looks its
   * container's workers up, and the pod source hands back the same container object while the pod
   * is unchanged: the id strings are built once per container object, not on every lookup.
   */
  readonly #idsOf = new WeakMap<ContainerInfo, { uid: string; ids: Record<ProbeType, string> }>();
  #stopped = false;

  constructor(opts: ProbeManagerOptions) {
    this.#opts = opts;
    this.#clock = opts.clock ?? realClock;
    this.#agentStart = opts.agentStart ?? this.#clock.now();
    this.#logger = opts.logger ?? silentLogger;
    this.#maxWorkers = opts.maxWorkers ?? DEFAULT_MAX_WORKERS;
    this.#host = {
      clock: this.#clock,
      agentStart: this.#agentStart,
      runProbe: opts.runProbe,
      limiter: opts.limiter,
      observer: opts.observer,
      logger: this.#logger,
      tickAlignMs: opts.tickAlignMs ?? 0,
      containerStarted: (w) => this.#isStarted(w.pod, w.container),
      workerUpdated: (w, significant) => this.#workerUpdated(w, significant),
      workerExited: (w) => this.#workerExited(w),
    };
  }

  /** Makes the workers match `pods` (the full current set): starts new ones, updates, restarts changed specs, stops the rest. */
  sync(pods: PodInfo[]): void {
    if (this.#stopped) return;
    const seen = new Set<string>();
    const changed = new Set<string>();
    for (const pod of pods) {
      if (seen.has(pod.uid)) continue;
      seen.add(pod.uid);
      if (this.#syncPod(pod)) changed.add(pod.uid);
    }
    for (const uid of [...this.#pods.keys(), ...this.#notOurs.keys()]) {
      if (seen.has(uid)) continue;
      this.#stopPodWorkers(uid);
      this.#pods.delete(uid);
      this.#notOurs.delete(uid);
      this.#finished.delete(uid);
    }
    // Like kubelet's UpdatePodStatus on a pod sync: only a pod that changed gets its not-ready
    // containers' readiness probes triggered, or every poll would shorten their period.
    for (const pod of this.#pods.values()) {
      for (const c of pod.containers) this.#refreshContainer(pod, c, changed.has(pod.uid));
    }
  }

  /** Pods seen in the last sync that are left to kubelet, with the reason. */
  notOurs(): NotOursPod[] {
    return [...this.#notOurs.values()].map((p) => ({ pod: { ...p.pod }, reason: p.reason }));
  }

  /** Number of running workers. */
  workerCount(): number {
    return this.#workers.size;
  }

  /** Requests an immediate run of one worker (resets its period); false when unknown or already pending. */
  trigger(key: ProbeKey): boolean {
    return this.#workers.get(probeKeyString(key))?.trigger() ?? false;
  }

  /**
   * On-demand mode: a result the kubelet shim obtained for one probe. Taken only by a worker whose
   * probe is shim-driven in the pod spec; false otherwise (unknown pod or container, a probe the
   * agent runs itself, a worker that ended).
   */
  deliver(key: ProbeKey, containerID: string, outcome: ProbeOutcome): boolean {
    if (this.#stopped) return false;
    return this.#workers.get(probeKeyString(key))?.deliver(containerID, outcome) ?? false;
  }

  /** Resolves once no probe is in flight, including aborted runs of stopped workers. */
  async whenIdle(): Promise<void> {
    for (;;) {
      const all = [...this.#workers.values(), ...this.#draining];
      if (all.every((w) => !w.busy)) return;
      await Promise.all(all.map((w) => w.whenIdle()));
    }
  }

  /**
   * Stops every worker and aborts in-flight probes. The store keeps the last statuses: on shutdown,
   * watchers should see the API go away, not a burst of 'removed' events that looks like real change.
   */
  async stop(): Promise<void> {
    this.#stopped = true;
    const all = [...this.#workers.values()];
    this.#workers.clear();
    for (const w of all) w.stop();
    await Promise.all([...all, ...this.#draining].map((w) => w.whenIdle()));
  }

  /** Reconciles one pod's workers; true when the pod is ours and differs from the last sync. */
  #syncPod(pod: PodInfo): boolean {
    let reason: NotOursReason | undefined;
    try {
      reason = this.#opts.classify(pod);
    } catch (err) {
      this.#logger.warn('pod classification failed; leaving the pod to kubelet', { pod: `${pod.namespace}/${pod.name}`, err: describeError(err) });
      reason = 'no-network-probes';
    }
    if (reason) {
      this.#notOurs.set(pod.uid, { pod: { uid: pod.uid, namespace: pod.namespace, name: pod.name }, reason });
      this.#stopPodWorkers(pod.uid);
      this.#pods.delete(pod.uid);
      return false;
    }
    this.#notOurs.delete(pod.uid);
    const previous = this.#pods.get(pod.uid);
    // The pod source hands back the same object for a pod unchanged since the last poll.
    const changed = previous === undefined || (previous !== pod && JSON.stringify(previous) !== JSON.stringify(pod));
    this.#pods.set(pod.uid, pod);

    const desired = new Map<string, { container: ContainerInfo; probe: ContainerProbe; probeType: ProbeType }>();
    for (const container of pod.containers) {
      const ids = this.#ids(pod, container);
      for (const probeType of PROBE_TYPES) {
        const probe = container.probes[probeType];
        if (!probe || !isOurs(probe)) continue;
        desired.set(ids[probeType], { container, probe, probeType });
      }
    }
    for (const [id, w] of this.#workersOf(previous)) {
      if (!desired.has(id)) this.#stopWorker(id, w);
    }
    const finished = this.#finished.get(pod.uid);
    // Terminal pods get no new workers (kubelet's ReconcilePod); existing ones see the phase and exit.
    const terminal = pod.phase === 'Failed' || pod.phase === 'Succeeded';
    for (const [id, want] of desired) {
      const existing = this.#workers.get(id);
      // The same probe object is the same spec (an unchanged pod is handed back as is).
      if (existing && (existing.probe === want.probe || JSON.stringify(existing.probe) === JSON.stringify(want.probe))) {
        existing.update(pod, want.container);
        continue;
      }
      if (existing) this.#stopWorker(id, existing);
      else if (terminal || finished?.has(id)) continue;
      const key = keyOf(pod.uid, want.container.name, want.probeType);
      if (this.#workers.size >= this.#maxWorkers) {
        this.#logger.warn('worker limit reached; probe not started', { ...key, maxWorkers: this.#maxWorkers });
        continue;
      }
      const worker = new ProbeWorker(key, pod, want.container, want.probe, this.#host);
      this.#workers.set(id, worker);
      this.#logger.debug('probe worker started', { ...key, restarted: existing !== undefined });
      worker.start();
    }
    return changed;
  }

  #stopWorker(id: string, w: ProbeWorker): void {
    this.#logger.debug('probe worker stopped', { ...w.key });
    this.#workers.delete(id);
    w.stop();
    this.#opts.store.remove(w.key);
    if (w.busy) {
      this.#draining.add(w);
      void w.whenIdle().then(() => this.#draining.delete(w));
    }
  }

  #stopPodWorkers(uid: string): void {
    for (const [id, w] of this.#workersOf(this.#pods.get(uid))) this.#stopWorker(id, w);
  }

  /**
   * The running workers of a pod, found from the version last synced (workers are only made from
   * it): a scan of every worker per pod would make each sync quadratic in the node's pods.
   */
  #workersOf(pod: PodInfo | undefined): [string, ProbeWorker][] {
    const out: [string, ProbeWorker][] = [];
    if (!pod) return out;
    for (const container of pod.containers) {
      const ids = this.#ids(pod, container);
      for (const probeType of PROBE_TYPES) {
        const id = ids[probeType];
        const w = this.#workers.get(id);
        if (w) out.push([id, w]);
      }
    }
    return out;
  }

  #ids(pod: PodInfo, container: ContainerInfo): Record<ProbeType, string> {
    const known = this.#idsOf.get(container);
    if (known && known.uid === pod.uid) return known.ids;
    const ids = {} as Record<ProbeType, string>;
    for (const t of PROBE_TYPES) ids[t] = probeKeyString(keyOf(pod.uid, container.name, t));
    this.#idsOf.set(container, { uid: pod.uid, ids });
    return ids;
  }

  #workerUpdated(w: ProbeWorker, significant: boolean): void {
    if (w.stopped || this.#workers.get(w.id) !== w) return;
    this.#refreshContainer(w.pod, w.container, significant);
  }

  #workerExited(w: ProbeWorker): void {
    const id = w.id;
    if (this.#workers.get(id) !== w) return;
    this.#workers.delete(id);
    this.#opts.store.remove(w.key);
    let finished = this.#finished.get(w.key.podUID);
    if (!finished) {
      finished = new Set();
      this.#finished.set(w.key.podUID, finished);
    }
    finished.add(id);
    this.#logger.debug('probe worker exited', { ...w.key });
    this.#refreshContainer(w.pod, w.container, true);
  }

  #worker(pod: PodInfo, container: ContainerInfo, probeType: ProbeType): ProbeWorker | undefined {
    return this.#workers.get(this.#ids(pod, container)[probeType]);
  }

  /** Writes the container's derived state into every one of its workers' statuses. */
  #refreshContainer(pod: PodInfo, container: ContainerInfo, allowTrigger: boolean): void {
    const ids = this.#ids(pod, container);
    const liveness = this.#workers.get(ids.Liveness);
    const readiness = this.#workers.get(ids.Readiness);
    const startup = this.#workers.get(ids.Startup);
    if (!liveness && !readiness && !startup) return;
    const started = this.#isStarted(pod, container, startup);
    const ready = started && this.#isReady(pod, container, allowTrigger, readiness);
    if (liveness) this.#store(liveness, started, ready);
    if (readiness) this.#store(readiness, started, ready);
    if (startup) this.#store(startup, started, ready);
  }

  #store(w: ProbeWorker, started: boolean, ready: boolean): void {
    const status: ProbeStatus = { ...w.status(), started, ready };
    this.#opts.store.upsert(status, w.id);
  }

  /** kubelet's isContainerStarted; `worker`: the container's startup worker, when the caller has looked it up. */
  #isStarted(pod: PodInfo, container: ContainerInfo, worker = this.#worker(pod, container, 'Startup')): boolean {
    const state = container.state;
    if (!state?.running) return false;
    const cached = worker?.resultFor(state.containerID);
    if (cached !== undefined) return cached === 'success';
    // ChangeContainerStatusOnKubeletRestart off (kubelet's default): a reported Started=true is trusted.
    // Not in gates mode, where kubelet has no startup probe and reports every running container
    // started: there only a container running since before the agent (the restart grace) keeps it.
    const gatesStartup = pod.gates?.taken[container.name]?.includes('Startup') === true;
    const startedLongBefore = state.startedAt !== undefined && state.startedAt < this.#agentStart - RESTART_GRACE_MS;
    if (state.started === true && (!gatesStartup || startedLongBefore)) return true;
    if (worker) return false;
    // An exec startup probe is kubelet's: its Started (false here) is the only truth we have.
    return !isKubeletExec(container.probes.Startup);
  }

  /** kubelet's readiness part of UpdatePodStatus (called only for started containers), with the restart grace. */
  #isReady(pod: PodInfo, container: ContainerInfo, allowTrigger: boolean, worker = this.#worker(pod, container, 'Readiness')): boolean {
    const state = container.state;
    if (!state?.running) return false;
    const cached = worker?.resultFor(state.containerID);
    if (cached === 'success') return true;
    if (!worker && isKubeletExec(container.probes.Readiness)) return state.ready;
    let ready = !worker;
    if (worker && allowTrigger) worker.trigger();
    const startedLongBefore = state.startedAt !== undefined && state.startedAt < this.#agentStart - RESTART_GRACE_MS;
    if (startedLongBefore) {
      if (!ready && cached === undefined) ready = true;
      if (container.probes.Readiness !== undefined && !pod.podReady) ready = false;
    }
    return ready;
  }
}
