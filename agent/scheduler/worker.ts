/**
 * One probe worker per (pod UID, container, probe type), with kubelet's worker state machine
 * (pkg/kubelet/prober/worker.go): initial values per container ID, hold after a liveness failure
 * or a decided startup probe, thresholds over consecutive raw results, start-time based initial
 * delay, startup gating, jitter after an agent restart and manual readiness triggers.
 *
 * A probe that cannot run (result 'error': our trouble, not the target's) is retried up to
 * MAX_PROBE_TRIES times and then thrown away, as kubelet's prober.go and doProbe do: it never
 * changes the published decision, the thresholds or the run count. It is still reported: the
 * observer (metrics) sees every try, and the status carries its message and reason.
 */
import { describeError } from '../errors.ts';
import type { Logger } from '../log.ts';
import type { ContainerInfo, ContainerProbe, PodInfo } from '../pods/types.ts';
import { boundMessage, messageLogField } from '../probe/message.ts';
import type { FailureReason, ProbeOutcome, ProbeSpec, ProbeType } from '../probe/types.ts';
import type { Clock, TimerHandle } from './clock.ts';
import { errorOutcome, runGuarded } from './guarded-run.ts';
import type { RunProbe } from './guarded-run.ts';
import type { FairLimiter } from './limiter.ts';
import { probeKeyString } from './results-store.ts';
import { Ticker } from './ticker.ts';
import type { ProbeKey, ProbeObserver, ProbeRunMeta, ProbeStatus, ThresholdResult } from './types.ts';

export type { RunProbe } from './guarded-run.ts';

/** What a worker needs from its manager. */
export interface WorkerHost {
  readonly clock: Clock;
  /** When the agent started, epoch ms: decides jitter and kubelet's restart grace. */
  readonly agentStart: number;
  readonly runProbe: RunProbe;
  readonly limiter?: FairLimiter;
  readonly observer?: ProbeObserver;
  readonly logger: Logger;
  /** Ticks fire at multiples of this many ms (0: exactly when due); see Ticker. */
  readonly tickAlignMs?: number;
  /** kubelet's isContainerStarted for the worker's container, evaluated now. */
  containerStarted(worker: ProbeWorker): boolean;
  /** Visible state changed; `significant` when the result, the container ID or the hold changed. */
  workerUpdated(worker: ProbeWorker, significant: boolean): void;
  /** The worker ended by itself (pod finished, container will not restart, pod terminating). */
  workerExited(worker: ProbeWorker): void;
}

/** kubelet's initial values: not ready until proven, alive until proven dead, startup undecided. */
export const INITIAL_RESULT: Record<ProbeType, ThresholdResult> = {
  Readiness: 'failure',
  Liveness: 'success',
  Startup: 'unknown',
};

/** A container that started this long before the agent keeps its state until a real result (kubelet: 10 s). */
export const RESTART_GRACE_MS = 10_000;
/** kubelet's maxProbeRetries: a probe that errored is tried again at once, this many tries in all. */
export const MAX_PROBE_TRIES = 3;
/** Period used by a worker whose spec could not be parsed: it only re-announces the error. */
const INVALID_SPEC_PERIOD_MS = 10_000;

/** Periodic prober of one probe of one container. Create, then start(). */
export class ProbeWorker {
  readonly key: ProbeKey;
  /** probeKeyString(key), built once: the manager looks its workers up by it on every result. */
  readonly id: string;
  /** Metric identity; undefined when the spec is invalid (nothing runs, nothing is measured). */
  readonly meta: ProbeRunMeta | undefined;
  readonly probe: ContainerProbe;
  readonly #host: WorkerHost;
  readonly #spec: ProbeSpec | undefined;
  readonly #periodMs: number;
  /** On-demand mode: kubelet drives this probe through the shim; no timers, results come from deliver(). */
  readonly #shimDriven: boolean;
  #pod: PodInfo;
  #container: ContainerInfo;

  #containerID = '';
  /** kubelet's cached result for #containerID; undefined = no cache entry. */
  #cached: ThresholdResult | undefined;
  #lastRaw: 'success' | 'failure' | undefined;
  #run = 0;
  #onHold = false;
  #lastProbeTime = 0;
  #lastMessage = '';
  #lastReason: FailureReason | undefined;
  /** The latest run errored and was thrown away (shown, never part of the decision). */
  #erroredBefore = false;
  #lastErrorReason: FailureReason | undefined;

  #started = false;
  #stopped = false;
  #begun = false;
  #manualPending = false;
  readonly #ticker: Ticker;
  #jitterTimer: TimerHandle | undefined;
  #busy: Promise<void> | undefined;
  #inflight: AbortController | undefined;

  constructor(key: ProbeKey, pod: PodInfo, container: ContainerInfo, probe: ContainerProbe, host: WorkerHost) {
    this.key = key;
    this.id = probeKeyString(key);
    this.probe = probe;
    this.#host = host;
    this.#pod = pod;
    this.#container = container;
    this.#spec = probe.ok && probe.spec.handler.kind !== 'exec' ? probe.spec : undefined;
    this.#shimDriven = probe.ok && probe.shim === true && this.#spec !== undefined;
    const kind = this.#spec?.handler.kind;
    this.meta = kind && kind !== 'exec' ? { key, namespace: pod.namespace, podName: pod.name, protocol: kind } : undefined;
    this.#periodMs = this.#spec ? Math.max(1, this.#spec.periodSeconds) * 1000 : INVALID_SPEC_PERIOD_MS;
    this.#ticker = new Ticker(host.clock, this.#periodMs, () => this.#schedule(), host.tickAlignMs ?? 0);
  }

  /** The latest pod object the manager handed over. */
  get pod(): PodInfo {
    return this.#pod;
  }

  /** The latest container object the manager handed over. */
  get container(): ContainerInfo {
    return this.#container;
  }

  /** True once stopped or exited. */
  get stopped(): boolean {
    return this.#stopped;
  }

  /** True while a probe pass is in flight. */
  get busy(): boolean {
    return this.#busy !== undefined;
  }

  /** The container ID the worker last saw ('' before any). */
  get containerID(): string {
    return this.#containerID;
  }

  /** kubelet's cache lookup: the visible result for `containerID`, or undefined when there is no entry for it. */
  resultFor(containerID: string): ThresholdResult | undefined {
    if (!containerID || containerID !== this.#containerID) return undefined;
    return this.#cached;
  }

  /** The worker's part of its ProbeStatus (the manager adds started/ready). */
  status(): Omit<ProbeStatus, 'started' | 'ready'> {
    return {
      key: this.key,
      namespace: this.#pod.namespace,
      podName: this.#pod.name,
      containerID: this.#containerID,
      result: this.#visible(),
      consecutive: this.#run,
      lastProbeTime: this.#lastProbeTime,
      lastMessage: this.#lastMessage,
      lastReason: this.#lastReason,
      onHold: this.#onHold,
      erroring: this.#erroredBefore,
    };
  }

  /**
   * Hands over fresher pod and container objects; they are read at the next probe. A liveness or
   * startup worker of a pod that is being deleted stops here and now (kubelet's
   * StopLivenessAndStartup): a probe in flight is aborted and its result never counts.
   */
  update(pod: PodInfo, container: ContainerInfo): void {
    this.#pod = pod;
    this.#container = container;
    if (pod.deletionTimestamp !== undefined && this.key.probeType !== 'Readiness' && this.#started && !this.#stopped) {
      this.#terminating();
    }
  }

  /** kubelet's step 7 of doProbe, taken as soon as the deletion is seen: a quiet Success, then the worker ends. */
  #terminating(): void {
    if (this.#containerID !== '') this.#set('success', 'pod is terminating');
    this.stop();
    this.#host.workerExited(this);
  }

  /** Starts probing: after a jitter of [0, period) when the agent started less than a period ago. */
  start(): void {
    if (this.#started || this.#stopped) return;
    this.#started = true;
    this.#notifyObserver('workerStarted');
    if (this.#shimDriven) return;
    const clock = this.#host.clock;
    if (this.#periodMs > clock.now() - this.#host.agentStart) {
      this.#jitterTimer = clock.setTimeout(() => this.#begin(), Math.floor(clock.random() * this.#periodMs));
    } else {
      this.#begin();
    }
  }

  /** Requests an immediate run that also restarts the period; false when one is already pending (kubelet's full channel). */
  trigger(): boolean {
    if (this.#stopped || this.#manualPending) return false;
    this.#manualPending = true;
    this.#schedule();
    return true;
  }

  /** Stops for good: timers cleared, an in-flight probe aborted and its result ignored. Idempotent. */
  stop(): void {
    if (this.#stopped) return;
    this.#stopped = true;
    this.#clearTimers();
    this.#inflight?.abort(new Error('probe worker stopped'));
    if (this.#started) this.#notifyObserver('workerStopped');
  }

  /** True when kubelet drives this probe through the shim (on-demand mode). */
  get shimDriven(): boolean {
    return this.#shimDriven;
  }

  /**
   * On-demand mode (docs/design/shim.md): a result kubelet obtained through the shim for this probe of
   * container `containerID`. Kubelet decided to probe (its own delay, startup gating and hold
   * rules), so only the container-ID reset and the thresholds apply here. False when not taken.
   */
  deliver(containerID: string, outcome: ProbeOutcome): boolean {
    if (this.#stopped || !this.#shimDriven || !this.#started) return false;
    if (bareID(containerID) !== bareID(this.#containerID)) {
      const st = this.#container.state;
      const listed = st !== undefined && bareID(st.containerID) === bareID(containerID);
      this.#containerID = listed ? st.containerID : containerID;
      // As #doProbe on a new container ID (and kubelet): the initial value; the run counter carries over.
      this.#erroredBefore = false;
      const longRunning = listed && st.running && st.startedAt !== undefined && st.startedAt < this.#host.agentStart - RESTART_GRACE_MS;
      this.#cached = longRunning ? undefined : INITIAL_RESULT[this.key.probeType];
    } else {
      // The pod list caught up: use its spelling ("containerd://..."), which started/ready compare with.
      const listedID = this.#container.state?.containerID;
      if (listedID && bareID(listedID) === bareID(containerID)) this.#containerID = listedID;
    }
    // A decided liveness or startup probe is on hold in kubelet too: a later result means a new decision.
    this.#onHold = false;
    if (this.meta) this.#safeObserve(() => this.#host.observer?.probeRun(this.meta as ProbeRunMeta, outcome));
    this.#record(outcome);
    return true;
  }

  /** Resolves once no probe of this worker is in flight. */
  async whenIdle(): Promise<void> {
    while (this.#busy) await this.#busy;
  }

  #visible(): ThresholdResult {
    return this.#cached ?? 'unknown';
  }

  #begin(): void {
    this.#jitterTimer = undefined;
    if (this.#stopped) return;
    this.#begun = true;
    this.#ticker.reset();
    this.#probeNow();
  }

  /** kubelet's select between the ticker and the manual trigger, run whenever the worker is free. */
  #schedule(): void {
    if (this.#stopped || !this.#begun || this.#busy) return;
    if (this.#manualPending) {
      this.#manualPending = false;
      this.#ticker.reset();
      this.#probeNow();
    } else if (this.#ticker.take()) {
      this.#probeNow();
    }
  }

  #probeNow(): void {
    // Start on a microtask so #busy is set before doProbe's synchronous part can call back into
    // the manager (which may trigger this worker again: that must queue, not start a second run).
    const busy: Promise<void> = Promise.resolve()
      .then(() => this.#doProbe())
      .catch((err: unknown) => {
        // Mirrors kubelet's HandleCrash in doProbe: log and keep going.
        this.#host.logger.error('probe worker crashed; continuing', { ...this.key, err: describeError(err) });
        return true;
      })
      .then((keepGoing) => {
        if (this.#busy === busy) this.#busy = undefined;
        if (this.#stopped) return;
        if (!keepGoing) {
          this.stop();
          this.#host.workerExited(this);
          return;
        }
        this.#schedule();
      });
    this.#busy = busy;
  }

  /** One pass of kubelet's doProbe, in its order of checks. Returns whether to keep going. */
  async #doProbe(): Promise<boolean> {
    const pod = this.#pod;
    const container = this.#container;
    if (pod.phase === 'Failed' || pod.phase === 'Succeeded') return false;

    const state = container.state;
    if (!state || !state.containerID) return true;

    if (state.containerID !== this.#containerID) {
      this.#containerID = state.containerID;
      this.#erroredBefore = false;
      this.#onHold = false;
      this.#lastMessage = '';
      this.#lastReason = undefined;
      // kubelet (ChangeContainerStatusOnKubeletRestart off): a container that was running well before
      // we started gets no initial value, so the restart grace can keep it ready until a real result.
      const longRunning = state.running && state.startedAt !== undefined && state.startedAt < this.#host.agentStart - RESTART_GRACE_MS;
      this.#cached = longRunning ? undefined : INITIAL_RESULT[this.key.probeType];
      this.#host.workerUpdated(this, true);
    }

    if (this.#onHold) return true;

    if (!state.running) {
      this.#set('failure', 'container is not running');
      const willRestart = !state.terminated || pod.restartPolicy !== 'Never' || container.kind === 'sidecar';
      return willRestart;
    }

    if (pod.deletionTimestamp !== undefined && this.key.probeType !== 'Readiness') {
      // A quiet shutdown: nothing may kill a container that is already being stopped.
      this.#set('success', 'pod is terminating');
      return false;
    }

    const initialDelaySeconds = this.#spec?.initialDelaySeconds ?? 0;
    if (state.startedAt !== undefined && Math.trunc((this.#host.clock.now() - state.startedAt) / 1000) < initialDelaySeconds) {
      return true;
    }

    const started = this.#host.containerStarted(this);
    if (started ? this.key.probeType === 'Startup' : this.key.probeType !== 'Startup') return true;

    if (!this.#spec) {
      this.#record(errorOutcome('invalid-spec', this.probe.ok ? 'exec probes are run by kubelet' : this.probe.error));
      return true;
    }
    for (let tries = 1; ; tries++) {
      const outcome = await this.#runOnce(pod, container, this.#spec);
      if (this.#stopped) return false;
      if (this.meta) this.#safeObserve(() => this.#host.observer?.probeRun(this.meta as ProbeRunMeta, outcome));
      if (outcome.result !== 'error' || tries >= MAX_PROBE_TRIES) {
        this.#record(outcome);
        return true;
      }
    }
  }

  /** kubelet's resultsManager.Set: writes the cached value (no thresholds). */
  #set(result: ThresholdResult, message: string): void {
    const before = this.#visible();
    this.#cached = result;
    const changedMessage = this.#lastMessage !== message;
    this.#lastMessage = message;
    this.#lastReason = undefined;
    const significant = before !== this.#visible();
    if (significant || changedMessage) this.#host.workerUpdated(this, significant);
  }

  #record(outcome: ProbeOutcome): void {
    const before = this.#visible();
    const holdBefore = this.#onHold;
    this.#lastProbeTime = this.#host.clock.now();
    this.#lastMessage = boundMessage(outcome.message);
    this.#lastReason = outcome.reason;
    // kubelet's doProbe: a prober error is thrown away (only its message and reason are shown).
    if (outcome.result !== 'error') {
      const raw = outcome.result === 'failure' ? 'failure' : 'success';
      if (this.#lastRaw === raw) this.#run++;
      else {
        this.#lastRaw = raw;
        this.#run = 1;
      }
      const spec = this.#spec as ProbeSpec;
      const threshold = raw === 'failure' ? spec.failureThreshold : spec.successThreshold;
      if (this.#run >= threshold) {
        this.#cached = raw;
        if ((this.key.probeType === 'Liveness' && raw === 'failure') || this.key.probeType === 'Startup') {
          // Decided: wait for a new container ID (kubelet #21751, #117153).
          this.#onHold = true;
          this.#run = 0;
        }
      }
    }
    const after = this.#visible();
    if (outcome.result === 'error') {
      // Reported (kubelet: an "errored" event per run), but once per streak of the same reason.
      if (!this.#erroredBefore || this.#lastErrorReason !== outcome.reason) {
        // A pod's netns or sandbox gone is a pod going or its sandbox replaced: churn, nothing to chase.
        // An overloaded agent is the node's matter, logged once for all probes (daemon.ts).
        const level = outcome.reason === 'netns-gone' || outcome.reason === 'agent-overloaded' ? 'info' : 'warn';
        this.#host.logger[level]('probe errored; result kept', { ...this.key, kept: after, reason: outcome.reason, message: this.#lastMessage });
      }
      this.#erroredBefore = true;
      this.#lastErrorReason = outcome.reason;
    } else {
      this.#erroredBefore = false;
    }
    if (after !== before) {
      this.#host.logger.info('probe result changed', { ...this.key, from: before, to: after, ...messageLogField(outcome.result, this.#lastMessage, this.#host.logger.enabled('debug')) });
    } else if (this.#host.logger.enabled('debug')) {
      this.#host.logger.debug('probe ran', { ...this.key, result: outcome.result, consecutive: this.#run });
    }
    this.#host.workerUpdated(this, after !== before || holdBefore !== this.#onHold);
  }

  async #runOnce(pod: PodInfo, container: ContainerInfo, spec: ProbeSpec): Promise<ProbeOutcome> {
    const controller = new AbortController();
    this.#inflight = controller;
    try {
      return await runGuarded(this.#host.runProbe, this.#host.limiter, pod, container, spec, controller);
    } finally {
      if (this.#inflight === controller) this.#inflight = undefined;
    }
  }

  #clearTimers(): void {
    this.#ticker.stop();
    if (this.#jitterTimer) this.#host.clock.clearTimeout(this.#jitterTimer);
    this.#jitterTimer = undefined;
  }

  #notifyObserver(hook: 'workerStarted' | 'workerStopped'): void {
    const meta = this.meta;
    if (meta) this.#safeObserve(() => this.#host.observer?.[hook](meta));
  }

  #safeObserve(fn: () => void): void {
    try {
      fn();
    } catch (err) {
      this.#host.logger.warn('probe observer threw', { ...this.key, err: describeError(err) });
    }
  }
}

/** A container ID without its "<runtime>://" prefix. */
function bareID(id: string): string {
  const i = id.indexOf('://');
  return i >= 0 ? id.slice(i + 3) : id;
}
