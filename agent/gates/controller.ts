/**
 * Gates mode on the agent's side: the probe workers (agent/scheduler/) run the probes the webhook
 * took from kubelet (agent/rewrite/gates-rewrite.ts) with kubelet's state machine; this turns
 * their decisions into what kubelet would have done with them.
 *
 * - Readiness: the pod condition `probe-agent.io/ready` is True when every container whose
 *   readiness or startup probe the agent took is running, and the agent's started/ready for that
 *   very container ID (the results store) say so. Kubelet derives Ready from its containers and
 *   this gate. Written only when it changes (an agent restart that finds it right writes nothing),
 *   True at most once per `minWriteIntervalMs` per pod (the newest value wins; False goes at once),
 *   one write per pod at a time, `maxInFlight` over the node.
 * - A restarted container starts not ready: its new container ID has no decision yet, so the
 *   condition goes False as soon as the runtime (runtime-watch.ts) or kubelet's /pods shows the
 *   old container stopped or a new one; the agent's own liveness stop clears it before it stops anything.
 *   A deleted pod's stopped containers are not written: kubelet restarts nothing there.
 * - Liveness and startup: when a taken liveness probe fails at its threshold (or a taken startup
 *   probe), once per container ID: the events kubelet records, the preStop hook (HTTP from the pod
 *   netns, exec through CRI ExecSync, sleep), then CRI StopContainer with the probe's
 *   terminationGracePeriodSeconds, else the pod's, less the time the hook took.
 *   Kubelet restarts the container under its own back-off. Every grace and sleep is clamped as
 *   kubelet's time.Duration holds it (spec.ts clampSeconds), a stop gets kubelet's 2 s at least, a
 *   hook waits at most the hook cap (lifecycle.ts), and a stop that fails (or throws) is that pod's:
 *   logged, counted (op stop, error), a FailedKillPod event; the agent goes on.
 * - A liveness failure of a container kubelet's list does not show yet (a restart the runtime saw
 *   first) is kept and acted on when kubelet's list or the runtime's shows that container running.
 * - Converges on the condition the pod has now, as kubelet's /pods shows it: after a lease expiry,
 *   an outage or anyone else's write it writes its own value again (paced like every write). A
 *   value just written counts until kubelet's view shows it (at most `confirmWindowMs`): kubelet's
 *   list lags the API server a little, and that lag must not cost a second write.
 */
import { describeError } from '../errors.ts';
import type { Logger } from '../log.ts';
import type { ContainerInfo, PodInfo } from '../pods/types.ts';
import type { LifecycleHandlerSpec } from '../probe/lifecycle.ts';
import { clampSeconds, parseProbe, SPEC_LIMITS } from '../probe/spec.ts';
import { realClock } from '../scheduler/clock.ts';
import type { ProbeType } from '../probe/types.ts';
import type { ProbeEvent, ProbeStatus, ResultsReader } from '../scheduler/types.ts';
import type { GateCondition, GatesWriter } from './api-writer.ts';
import type { RuntimeContainer } from './runtime-watch.ts';

/** Stops a container through the runtime (CRI StopContainer). */
export interface ContainerStopper {
  stopContainer(containerID: string, timeoutSeconds: number): Promise<void>;
}

/** Runs a container's HTTP preStop hook from the pod netns; resolves with a failure message or ''. */
export type PreStopRunner = (pod: PodInfo, container: ContainerInfo, handler: LifecycleHandlerSpec, timeoutSeconds: number) => Promise<string>;

/** Runs `cmd` in a container through the runtime (CRI ExecSync); resolves with a failure message or ''. */
export type ExecRunner = (containerID: string, cmd: string[], timeoutSeconds: number) => Promise<string>;

/** Counted outcomes, for the metric. */
export type GatesOp = 'condition' | 'event' | 'prestop' | 'stop';

export interface GatesControllerOptions {
  results: ResultsReader;
  writer: GatesWriter;
  stopper?: ContainerStopper;
  preStop?: PreStopRunner;
  exec?: ExecRunner;
  log: Logger;
  onOp?: (op: GatesOp, ok: boolean) => void;
  minWriteIntervalMs?: number;
  maxInFlight?: number;
  /** How long a value written counts over kubelet's view before that view shows it (its lag). */
  confirmWindowMs?: number;
}

interface PodState {
  pod: PodInfo;
  /** The last value written; undefined: none yet (kubelet's view is what the pod has). */
  written?: GateCondition['status'];
  /** Kubelet's view has shown `written` since it was written. */
  confirmed: boolean;
  /** When the last write was sent (pacing), and when the one of `written` was (its lastTransitionTime). */
  lastWriteAt: number;
  writtenAt: number;
  /** The lastTransitionTime of the value kubelet's view showed when `written` was written: that one is answered. */
  overwrote?: number;
  writing: boolean;
  inflight?: Promise<void>;
  timer?: NodeJS.Timeout;
  /** Container IDs stopped for a probe failure (at most one stop per container ID). */
  stopped: Set<string>;
  /** The pod's containers as the runtime last listed them (runtime-watch.ts): newer than kubelet's list. */
  runtime?: RuntimeContainer[];
  /** Liveness/startup failures of a container neither list showed running yet, by container ID. */
  pendingKills: Map<string, { status: ProbeStatus; probeType: ProbeType }>;
}

const DEFAULT_MIN_WRITE_INTERVAL_MS = 1000;
const DEFAULT_MAX_IN_FLIGHT = 8;
/** How long a liveness stop waits for the condition to be cleared first. */
const CLEAR_BEFORE_STOP_MS = 5000;
const DEFAULT_CONFIRM_WINDOW_MS = 10_000;
/** Kubelet's least grace for a stop (kuberuntime minimumGracePeriodInSeconds). */
const MIN_STOP_GRACE_SECONDS = 2;
/** What a runtime call that waits `timeoutSeconds` is given beyond it (kubelet gives its runtime request timeout). */
const RUNTIME_CALL_MARGIN_SECONDS = 30;

/**
 * The grace of a stop for a failed liveness or startup probe, as kubelet's setTerminationGracePeriod
 * picks it: the probe's terminationGracePeriodSeconds, else the pod's; clamped (spec.ts clampSeconds). Pure.
 */
export function stopGraceSeconds(pod: PodInfo, container: ContainerInfo, probeType: ProbeType): number {
  const probe = container.probes[probeType];
  return clampSeconds((probe?.ok ? probe.spec.terminationGracePeriodSeconds : undefined) ?? pod.gates?.terminationGracePeriodSeconds ?? 30);
}

/** The StopContainer timeout once a preStop hook took `elapsedMs` of `grace` (kuberuntime killContainer). Pure. */
export function stopTimeoutSeconds(grace: number, elapsedMs: number): number {
  return Math.max(MIN_STOP_GRACE_SECONDS, clampSeconds(grace) - Math.floor(Math.max(0, elapsedMs) / 1000));
}

/** The deadline (ms) of a runtime call that waits `timeoutSeconds` (StopContainer, ExecSync): finite, and one grpc-js accepts. Pure. */
export function runtimeCallMs(timeoutSeconds: number): number {
  return (clampSeconds(timeoutSeconds) + RUNTIME_CALL_MARGIN_SECONDS) * 1000;
}

/** The most the agent waits on a preStop hook it runs over HTTP or ExecSync: the hook cap of lifecycle.ts. Pure. */
export function hookTimeoutSeconds(grace: number): number {
  return Math.max(1, Math.min(clampSeconds(grace), SPEC_LIMITS.maxTimeoutSeconds));
}

/** The condition the agent's decisions call for. Pure. */
export function desiredCondition(pod: PodInfo, statuses: readonly ProbeStatus[], stopping: ReadonlySet<string> = new Set()): GateCondition {
  const gates = pod.gates;
  if (!gates) return { status: 'False', reason: 'NotGatesMode', message: '' };
  for (const c of pod.containers) {
    const taken = gates.taken[c.name] ?? [];
    if (!taken.includes('Readiness') && !taken.includes('Startup')) continue;
    const st = c.state;
    if (!st?.running || !st.containerID) return { status: 'False', reason: 'ContainerNotRunning', message: `container ${c.name} is not running` };
    if (stopping.has(st.containerID)) return { status: 'False', reason: 'ContainerStopping', message: `container ${c.name} is being stopped for a failed probe` };
    const own = statuses.filter((s) => s.key.containerName === c.name && (s.key.probeType === 'Readiness' || s.key.probeType === 'Startup'));
    // A status of another container ID is the previous container's: the new one has no decision yet.
    const current = own.filter((s) => s.containerID === st.containerID);
    if (current.length === 0) return { status: 'False', reason: 'NoDecisionYet', message: `container ${c.name} has no probe result yet` };
    if (!current.every((s) => s.started)) return { status: 'False', reason: 'NotStarted', message: `container ${c.name}: startup probe has not succeeded` };
    if (!current.every((s) => s.ready)) {
      const r = current.find((s) => s.key.probeType === 'Readiness');
      return { status: 'False', reason: 'ReadinessProbeFailed', message: `container ${c.name}: ${r?.lastMessage || 'readiness probe has not succeeded'}` };
    }
  }
  return { status: 'True', reason: 'ProbesSucceeded', message: '' };
}

export class GatesController {
  readonly #o: GatesControllerOptions;
  readonly #pods = new Map<string, PodState>();
  readonly #minInterval: number;
  readonly #maxInFlight: number;
  #inFlight = 0;
  /** Condition writes failed (not 404/409) since the last one that succeeded. */
  #failedWrites = 0;
  /** Pods waiting for a write slot, in order. */
  readonly #waiting = new Set<string>();
  readonly #unsubscribe: () => void;
  #closed = false;
  /** Every pod UID of kubelet's last list (gates mode or not). */
  #listed = new Set<string>();
  /** The runtime's containers by pod UID, and the IDs running, as last told (runtime()). */
  #runtimeByPod = new Map<string, RuntimeContainer[]>();
  #running = new Set<string>();
  /** Kubelet's container ID prefix ("containerd://"); undefined until the runtime's name is known. */
  #prefix: string | undefined;
  readonly #pending = new Set<Promise<void>>();
  readonly #confirmWindow: number;
  /** Ends hook sleeps and waits on close: a pod's 292-year sleep must not hold the agent's shutdown. */
  readonly #abort = new AbortController();

  constructor(o: GatesControllerOptions) {
    this.#o = o;
    this.#confirmWindow = o.confirmWindowMs ?? DEFAULT_CONFIRM_WINDOW_MS;
    this.#minInterval = o.minWriteIntervalMs ?? DEFAULT_MIN_WRITE_INTERVAL_MS;
    this.#maxInFlight = o.maxInFlight ?? DEFAULT_MAX_IN_FLIGHT;
    this.#unsubscribe = o.results.subscribe((e) => this.#onProbeEvent(e));
  }

  /**
   * The node's pods (every snapshot); only gates-mode pods are kept. True when kubelet's list is
   * still behind the runtime for a gates pod (runtime()): the caller reads it again.
   */
  sync(pods: readonly PodInfo[]): boolean {
    if (this.#closed) return false;
    const seen = new Set<string>();
    this.#listed = new Set(pods.map((p) => p.uid));
    // Kubelet's own spelling of container IDs, from any container it lists.
    for (const p of pods) {
      const m = /^([a-z0-9.-]{1,64}):\/\//i.exec(p.containers.find((c) => c.state?.containerID)?.state?.containerID ?? '');
      if (m) {
        this.#prefix = `${m[1]}://`;
        break;
      }
    }
    let behind = false;
    for (const pod of pods) {
      if (!pod.gates) continue;
      seen.add(pod.uid);
      let s = this.#pods.get(pod.uid);
      if (!s) {
        s = { pod, confirmed: false, lastWriteAt: -Infinity, writtenAt: -Infinity, writing: false, stopped: new Set(), runtime: this.#runtimeByPod.get(pod.uid), pendingKills: new Map() };
        this.#pods.set(pod.uid, s);
      }
      s.pod = pod;
      behind ||= kubeletBehind(pod, s.runtime);
      this.#recheckKills(s);
      this.#evaluate(s);
    }
    for (const [uid, s] of this.#pods) {
      if (seen.has(uid)) continue;
      if (s.timer) clearTimeout(s.timer);
      this.#pods.delete(uid);
      this.#waiting.delete(uid);
    }
    return behind;
  }

  /**
   * The runtime's containers (runtime-watch.ts): a taken container that exited, or was replaced,
   * turns its pod's condition False before kubelet's pod list says so. True when kubelet's list is
   * behind: a gates pod runs a container that list does not show yet, or a container started
   * since the last call in a pod that list does not hold yet. The caller reads that list again, so
   * the new container is probed without waiting for the next poll.
   */
  runtime(containers: readonly RuntimeContainer[]): boolean {
    if (this.#closed) return false;
    const byPod = new Map<string, RuntimeContainer[]>();
    let behind = false;
    const seen = new Set<string>();
    for (const c of containers) {
      if (c.running) {
        seen.add(c.id);
        behind ||= !this.#listed.has(c.podUID) && !this.#running.has(c.id);
      }
      const list = byPod.get(c.podUID);
      if (list) list.push(c);
      else byPod.set(c.podUID, [c]);
    }
    this.#running = seen;
    this.#runtimeByPod = byPod;
    for (const [uid, s] of this.#pods) {
      s.runtime = byPod.get(uid) ?? [];
      behind ||= kubeletBehind(s.pod, s.runtime);
      this.#recheckKills(s);
      this.#evaluate(s);
    }
    return behind;
  }

  /** The runtime's name as kubelet prefixes container IDs with it ("containerd"), until kubelet's list shows one: see podAsRuntimeStarted. */
  setRuntimeName(name: string): void {
    if (!this.#prefix && /^[a-z0-9.-]{1,64}$/i.test(name)) this.#prefix = `${name}://`;
  }

  /** `pods` (kubelet's list) as the probe workers should see them: gates pods with the containers the runtime started since. */
  asRuntimeStarted(pods: readonly PodInfo[]): PodInfo[] {
    return pods.map((p) => (p.gates ? podAsRuntimeStarted(p, this.#runtimeByPod.get(p.uid), this.#prefix) : p));
  }

  /** Stops writing; resolves when writes in flight have settled and stops have let go (a stop call in flight is left to the runtime). */
  async close(): Promise<void> {
    this.#closed = true;
    this.#abort.abort();
    this.#unsubscribe();
    for (const s of this.#pods.values()) if (s.timer) clearTimeout(s.timer);
    await Promise.allSettled([...this.#pending]);
  }

  #track(p: Promise<void>): void {
    this.#pending.add(p);
    void p.finally(() => this.#pending.delete(p));
  }

  #onProbeEvent(e: ProbeEvent): void {
    if (this.#closed) return;
    const s = this.#pods.get(e.status.key.podUID);
    if (!s) return;
    const { containerName, probeType } = e.status.key;
    if (e.type !== 'removed' && (probeType === 'Liveness' || probeType === 'Startup') && e.status.onHold && e.status.result === 'failure') {
      if (s.pod.gates?.taken[containerName]?.includes(probeType)) this.#startKill(s, e.status, probeType);
    }
    this.#evaluate(s);
  }

  /** A stop for a failed probe; whatever it meets (a runtime error, a throw) is that pod's, never the agent's. */
  #startKill(s: PodState, status: ProbeStatus, probeType: ProbeType): void {
    const id = status.containerID;
    if (!id || s.stopped.has(id)) return;
    const container = this.#viewed(s).containers.find((c) => c.name === status.key.containerName);
    if (!container?.state?.running || container.state.containerID !== id) {
      // Probed from the runtime's view before either list shows it running (the restart race): acted
      // on when one does (#recheckKills), not lost.
      s.pendingKills.set(id, { status, probeType });
      return;
    }
    s.pendingKills.delete(id);
    s.stopped.add(id);
    this.#track(this.#kill(s, container, status, probeType).catch((err: unknown) => {
      this.#o.onOp?.('stop', false);
      this.#o.log.error('container stop failed unexpectedly; the agent goes on', { pod: `${s.pod.namespace}/${s.pod.name}`, container: container.name, containerID: id, err: describeError(err) });
    }));
  }

  /** Failures kept for a container not shown yet: stopped once it shows, dropped once its worker moved on (a new container, the probe gone). */
  #recheckKills(s: PodState): void {
    if (s.pendingKills.size === 0) return;
    const statuses = this.#o.results.list({ podUID: s.pod.uid });
    for (const [id, k] of [...s.pendingKills]) {
      const still = statuses.some((st) => st.key.containerName === k.status.key.containerName && st.key.probeType === k.probeType && st.containerID === id && st.onHold && st.result === 'failure');
      if (!still) s.pendingKills.delete(id);
      else this.#startKill(s, k.status, k.probeType);
    }
  }

  /** The pod as kubelet's list and the runtime's (newer) show it together. */
  #viewed(s: PodState): PodInfo {
    return podAsRuntimeSees(podAsRuntimeStarted(s.pod, s.runtime, this.#prefix), s.runtime);
  }

  /**
   * The condition the pod has now: kubelet's view, except that a value this agent wrote counts
   * until that view shows it, for at most the confirm window (kubelet's list lags the API server).
   * Any other value there is someone else's write (the lease controller, a person), and the agent
   * converges on its own value again: once its own was shown, or when the other one is no older
   * than its write (lastTransitionTime, which every writer of this condition sets; to the second).
   */
  #have(s: PodState): string {
    const seen = s.pod.gates?.condition || 'False';
    if (s.written === undefined) return seen;
    if (seen === s.written) {
      s.confirmed = true;
      return seen;
    }
    const since = s.pod.gates?.conditionSince;
    const newer = since !== undefined && since !== s.overwrote && since >= Math.floor(s.writtenAt / 1000) * 1000;
    if (!s.confirmed && !newer && Date.now() - s.writtenAt < this.#confirmWindow) return s.written;
    return seen;
  }

  #evaluate(s: PodState): void {
    if (this.#closed) return;
    const want = desiredCondition(this.#viewed(s), this.#o.results.list({ podUID: s.pod.uid }), s.stopped);
    // A deleted pod's containers stopping: kubelet shows the pod not Ready itself and starts no new
    // container, so a False here would be a write per deleted pod (often refused: the pod is gone).
    if (s.pod.deletionTimestamp !== undefined && want.reason === 'ContainerNotRunning') return;
    // Kubelet's view is what the pod has (#have): an agent restart that finds it right writes
    // nothing, an absent condition is a False gate to kubelet already, and a value someone else
    // wrote over ours is written again.
    if (want.status === this.#have(s) || s.writing) return;
    // Only True waits out the pacing (the newest value wins): a False is never held back, or a
    // restarted container could show Ready on a condition meant for its predecessor. So a flapping
    // probe costs at most two writes per interval.
    if (want.status !== 'True' && s.timer) {
      clearTimeout(s.timer);
      s.timer = undefined;
    }
    if (s.timer) return;
    const wait = want.status === 'True' ? s.lastWriteAt + this.#minInterval - Date.now() : 0;
    if (wait > 0) {
      s.timer = setTimeout(() => {
        s.timer = undefined;
        this.#evaluate(s);
      }, wait);
      return;
    }
    this.#waiting.add(s.pod.uid);
    this.#drain();
  }

  #drain(): void {
    while (this.#inFlight < this.#maxInFlight && this.#waiting.size > 0) {
      const uid = this.#waiting.values().next().value as string;
      this.#waiting.delete(uid);
      const s = this.#pods.get(uid);
      if (s) {
        const p = this.#write(s);
        s.inflight = p;
        this.#track(p);
      }
    }
  }

  async #write(s: PodState): Promise<void> {
    const want = desiredCondition(this.#viewed(s), this.#o.results.list({ podUID: s.pod.uid }), s.stopped);
    const pod = s.pod;
    const overwrote = pod.gates?.conditionSince;
    s.writing = true;
    this.#inFlight++;
    s.lastWriteAt = Date.now();
    try {
      await this.#o.writer.patchCondition(pod.namespace, pod.name, pod.uid, want);
      s.written = want.status;
      s.writtenAt = s.lastWriteAt;
      s.overwrote = overwrote;
      s.confirmed = false;
      this.#o.onOp?.('condition', true);
      this.#o.log.info('pod condition written', { pod: `${pod.namespace}/${pod.name}`, status: want.status, reason: want.reason });
      if (this.#failedWrites > 0) this.#o.log.info('pod condition writes recovered', { failedSinceLastWrite: this.#failedWrites });
      this.#failedWrites = 0;
    } catch (err) {
      // Not retried here: the next probe result or pod list evaluates again (after the interval).
      s.written = undefined;
      this.#o.onOp?.('condition', false);
      // 404 or 409 (the UID precondition): the pod was deleted, or replaced under its name, before
      // the agent's pod list said so. Nothing is wrong and nothing is left to write.
      const status = (err as { status?: unknown } | undefined)?.status;
      if (status === 404 || status === 409) this.#o.log.info('pod condition not written: the pod is gone', { pod: `${pod.namespace}/${pod.name}`, status: want.status, err: describeError(err) });
      else {
        // One warning per outage: an API server that is down fails every pod's write, each retried.
        const fields = { pod: `${pod.namespace}/${pod.name}`, status: want.status, err: describeError(err) };
        if (this.#failedWrites++ === 0) this.#o.log.warn('pod condition not written (further failures at info until a write succeeds)', fields);
        else this.#o.log.info('pod condition not written', fields);
      }
    } finally {
      s.writing = false;
      this.#inFlight--;
      this.#drain();
      if (this.#pods.get(pod.uid) === s) this.#evaluate(s);
    }
  }

  async #kill(s: PodState, container: ContainerInfo, status: ProbeStatus, probeType: ProbeType): Promise<void> {
    const pod = s.pod;
    const id = status.containerID!;
    const signal = this.#abort.signal;
    // Not ready before anything is stopped: the container is now `stopping`, so the condition goes
    // False at once (never paced); the stop waits for that write (bounded: a slow API server must
    // not keep a dead container running).
    this.#evaluate(s);
    const deadline = Date.now() + CLEAR_BEFORE_STOP_MS;
    // A settled write is no wait: waiting for a slot (the in-flight bound) polls, never spins.
    while ((s.writing || this.#waiting.has(pod.uid)) && Date.now() < deadline && !signal.aborted) await (s.writing && s.inflight ? s.inflight : sleep(50, signal));
    if (signal.aborted) return;
    const kind = probeType === 'Liveness' ? 'liveness' : 'startup';
    const grace = stopGraceSeconds(pod, container, probeType);
    const who = { pod: `${pod.namespace}/${pod.name}`, container: container.name, containerID: id };
    this.#o.log.info(`${kind} probe failed; stopping the container`, { ...who, message: status.lastMessage, grace });
    const event = (type: 'Normal' | 'Warning', reason: string, message: string) =>
      this.#o.writer.recordEvent({ namespace: pod.namespace, podName: pod.name, podUID: pod.uid, container: container.name, type, reason, message }).then(
        () => this.#o.onOp?.('event', true),
        (err: unknown) => {
          this.#o.onOp?.('event', false);
          this.#o.log.warn('event not recorded', { ...who, reason, err: describeError(err) });
        },
      );
    // kubelet's wording (prober.go recordContainerEvent, kuberuntime_manager.go computePodActions).
    await event('Warning', 'Unhealthy', `${probeType} probe failed: ${status.lastMessage}`);
    await event('Normal', 'Killing', `Container ${container.name} failed ${kind} probe, will be restarted`);
    if (!this.#o.stopper) {
      this.#o.log.warn('no container runtime configured: the container is not stopped', who);
      this.#o.onOp?.('stop', false);
      return;
    }
    const started = Date.now();
    const failure = await this.#preStop(pod, container, id, grace, who);
    if (signal.aborted) return;
    if (failure) await event('Warning', 'FailedPreStopHook', `PreStopHook failed: ${failure}`);
    const timeout = stopTimeoutSeconds(grace, Date.now() - started);
    try {
      // The call may wait out the whole grace: on close it is left to the runtime (its channel closes).
      await untilAborted(this.#o.stopper.stopContainer(bare(id), timeout), signal);
      if (!signal.aborted) this.#o.onOp?.('stop', true);
    } catch (err) {
      // A later container ID gets its own chance; this one is left to its probe's next decision.
      s.stopped.delete(id);
      this.#o.onOp?.('stop', false);
      this.#o.log.warn('container not stopped', { ...who, timeout, err: describeError(err) });
      // kubelet's event for a kill that failed (events.FailedKillPod).
      await event('Warning', 'FailedKillPod', `error killing container ${container.name}: ${describeError(err)}`);
    }
  }

  /**
   * The container's preStop hook, as kubelet runs it before it kills a container: HTTP from the pod
   * netns, exec through the runtime (CRI ExecSync), sleep by waiting; each within `grace`
   * seconds (HTTP and exec at most the hook cap). Resolves with a failure message, or '' (ran, or no
   * hook this agent can run).
   */
  async #preStop(pod: PodInfo, container: ContainerInfo, containerID: string, grace: number, who: Record<string, string>): Promise<string> {
    const plan = preStopPlan(container.preStop, grace);
    if (plan.kind === 'none' || (plan.kind === 'http' && !this.#o.preStop) || (plan.kind === 'exec' && !this.#o.exec)) return '';
    let failure = '';
    try {
      if (plan.kind === 'invalid') failure = plan.message;
      else if (plan.kind === 'http') failure = await this.#o.preStop!(pod, container, plan.handler, hookTimeoutSeconds(grace));
      else if (plan.kind === 'exec') failure = await this.#o.exec!(bare(containerID), plan.cmd, hookTimeoutSeconds(grace));
      else await sleep(plan.ms, this.#abort.signal);
    } catch (err) {
      failure = describeError(err);
      this.#o.log.warn('preStop hook could not run', { ...who, err: failure });
    }
    this.#o.onOp?.('prestop', failure === '');
    return failure;
  }

}

/** Waits `ms` (longer than a Node timer holds: chained), or until `signal` aborts. */
function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const timer = realClock.setTimeout(() => {
      signal.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = (): void => {
      realClock.clearTimeout(timer);
      resolve();
    };
    signal.addEventListener('abort', onAbort, { once: true });
  });
}

/** `p`, or undefined once `signal` aborts (p's own outcome is then dropped, never unhandled). */
function untilAborted<T>(p: Promise<T>, signal: AbortSignal): Promise<T | undefined> {
  p.catch(() => {});
  if (signal.aborted) return Promise.resolve(undefined);
  return new Promise<T | undefined>((resolve, reject) => {
    const onAbort = (): void => resolve(undefined);
    signal.addEventListener('abort', onAbort, { once: true });
    p.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
  });
}

/**
 * `pod` with each container's state as the runtime's list says where that list is newer: the
 * container kubelet reports has exited, or a later one of the same name runs. A list that does not
 * hold the reported container (older than it, or it is gone) changes nothing. Pure.
 */
export function podAsRuntimeSees(pod: PodInfo, runtime: readonly RuntimeContainer[] | undefined): PodInfo {
  if (!runtime?.length) return pod;
  let changed = false;
  const containers = pod.containers.map((c) => {
    const id = c.state?.containerID;
    if (!c.state || !id) return c;
    const known = runtime.find((r) => r.id === bare(id));
    if (!known) return c;
    const newer = runtime.filter((r) => r.name === c.name && r.running && r.createdAt > known.createdAt).sort((a, b) => (a.createdAt < b.createdAt ? 1 : -1))[0];
    if (newer) {
      changed = true;
      return { ...c, state: { ...c.state, containerID: `${id.slice(0, id.length - bare(id).length)}${newer.id}`, running: true, ready: false, startedAt: undefined } };
    }
    if (!known.running && c.state.running) {
      changed = true;
      return { ...c, state: { ...c.state, running: false, ready: false } };
    }
    return c;
  });
  return changed ? { ...pod, containers } : pod;
}

/**
 * `pod` with each container the runtime has started since kubelet's list (a running container of
 * that name newer than the one listed, or none listed) as running, when the runtime told when it
 * started (its event stream does; a list does not, and without it a probe's initial delay could not
 * be kept). `prefix` is kubelet's "<runtime name>://". The probe workers then probe the new
 * container at once, as kubelet probes a container its own runtime view shows started, instead of
 * after kubelet's status write and the agent's next read of /pods. Pure.
 */
export function podAsRuntimeStarted(pod: PodInfo, runtime: readonly RuntimeContainer[] | undefined, prefix: string | undefined): PodInfo {
  if (!runtime?.length || !prefix || !pod.gates) return pod;
  let changed = false;
  const containers = pod.containers.map((c) => {
    const id = c.state?.containerID ? bare(c.state.containerID) : undefined;
    const known = id ? runtime.find((r) => r.id === id) : undefined;
    if (id && !known) return c; // the list is older than kubelet's view of this container
    const newer = runtime.filter((r) => r.name === c.name && r.running && r.startedAt > 0n && r.id !== id && (!known || r.createdAt > known.createdAt))
      .sort((a, b) => (a.createdAt < b.createdAt ? 1 : -1))[0];
    if (!newer) return c;
    // Kubelet probes a pod only once it knows its IP; so does the agent (from the sandbox, as kubelet).
    if (pod.podIPs.length === 0 && !newer.podIPs?.length) return c;
    changed = true;
    const startup = c.probes.Startup;
    return {
      ...c,
      state: {
        containerID: `${prefix}${newer.id}`,
        running: true,
        startedAt: Number(newer.startedAt / 1_000_000n),
        terminated: false,
        // As kubelet reports it: started once running, unless kubelet runs an exec startup probe itself.
        started: !(startup?.ok && startup.spec.handler.kind === 'exec'),
        ready: false,
        restartCount: c.state?.restartCount ?? 0,
      },
    };
  });
  if (!changed) return pod;
  const ips = pod.podIPs.length > 0 ? pod.podIPs : (runtime.find((r) => r.running && r.podIPs?.length)?.podIPs ?? []);
  return { ...pod, containers, podIPs: ips };
}

/** A container of `pod` runs in the runtime under an ID kubelet's list does not show (yet). Pure. */
export function kubeletBehind(pod: PodInfo, runtime: readonly RuntimeContainer[] | undefined): boolean {
  if (!runtime?.length) return false;
  return pod.containers.some((c) => {
    const id = c.state?.containerID ? bare(c.state.containerID) : undefined;
    const known = id ? runtime.find((r) => r.id === id) : undefined;
    return runtime.some((r) => r.name === c.name && r.running && r.id !== id && (!known || r.createdAt > known.createdAt));
  });
}

/** Bounds of an exec hook's command (the API server admits larger specs). */
const MAX_EXEC_ARGS = 1024;
const MAX_EXEC_BYTES = 64 * 1024;

/** What a preStop hook as written asks for, within `grace` seconds. */
export type PreStopPlan =
  | { kind: 'none' }
  | { kind: 'invalid'; message: string }
  | { kind: 'http'; handler: LifecycleHandlerSpec }
  | { kind: 'exec'; cmd: string[] }
  | { kind: 'sleep'; ms: number };

/** Reads a preStop hook (kubelet's LifecycleHandler) into what to run. Pure. */
export function preStopPlan(hook: Record<string, unknown> | undefined, grace: number): PreStopPlan {
  if (!hook) return { kind: 'none' };
  try {
    if (isObject(hook['httpGet'])) {
      // The probe parser is the one place a handler is read; a hook is a probe handler without thresholds.
      return { kind: 'http', handler: parseProbe({ httpGet: hook['httpGet'] }, { fieldPath: 'lifecycle.preStop' }).handler as LifecycleHandlerSpec };
    }
  } catch (err) {
    return { kind: 'invalid', message: describeError(err) };
  }
  if (isObject(hook['exec'])) {
    const cmd = hook['exec']['command'];
    if (!Array.isArray(cmd) || cmd.length === 0 || !cmd.every((a): a is string => typeof a === 'string')) return { kind: 'invalid', message: 'exec hook: command must be a non-empty list of strings' };
    if (cmd.length > MAX_EXEC_ARGS || cmd.reduce((n, a) => n + Buffer.byteLength(a), 0) > MAX_EXEC_BYTES) {
      return { kind: 'invalid', message: `exec hook: command longer than ${MAX_EXEC_ARGS} arguments or ${MAX_EXEC_BYTES} bytes` };
    }
    return { kind: 'exec', cmd };
  }
  if (isObject(hook['sleep'])) {
    const seconds = hook['sleep']['seconds'];
    if (!Number.isInteger(seconds) || (seconds as number) < 0) return { kind: 'invalid', message: `sleep hook: seconds must be a whole number >= 0, got ${JSON.stringify(seconds)}` };
    // int64 in the API: clamped as kubelet's Duration holds it; the wait is a chained timer (sleep()).
    return { kind: 'sleep', ms: Math.min(clampSeconds(seconds as number), clampSeconds(grace)) * 1000 };
  }
  // tcpSocket is deprecated and kubelet ignores it; nothing else exists.
  return { kind: 'none' };
}

function isObject(v: unknown): v is Record<string, any> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** A container ID without its "<runtime>://" prefix. */
function bare(id: string): string {
  const i = id.indexOf('://');
  return i >= 0 ? id.slice(i + 3) : id;
}
