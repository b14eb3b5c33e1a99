/**
 * Runs probes for pods known on this node: resolves the pod's netns, builds the probe context
 * (pod IPs, container ports, gates) and calls the probers. Workers use runForWorker (the worker
 * takes its own limiter slot); the API's one-shot Probe RPC uses probe(), which takes one here.
 */
import {
  describeError,
  InvalidProbeError,
  NetnsUnavailableError,
  PodNotFoundError,
  UnsupportedPodError,
} from '../errors.ts';
import type { FeatureGates } from '../featuregates.ts';
import { silentLogger, type Logger } from '../log.ts';
import { isSandboxGone, outcomeOf, type NetnsResolverChain, type PodRef } from '../netns/resolver.ts';
import type { ContainerLocator, PodIndex, RuntimeSandbox } from './container-lookup.ts';
import { handlerFieldOf, needsHeaderValues, refuseDroppedHeaderValues, withHeaderValues, type HeaderValueSource } from './header-values.ts';
import type { ContainerInfo, NotOursReason, PodInfo } from '../pods/types.ts';
import { runProbe } from '../probe/run.ts';
import { refuseForeignHostInShimCall } from '../probe/target.ts';
import type { FailureReason, ProbeContext, ProbeHandler, ProbeOutcome, ProbeSpec, ProbeType, SocketFactory } from '../probe/types.ts';
import { errorOutcome, type RunProbe } from '../scheduler/guarded-run.ts';
import type { FairLimiter } from '../scheduler/limiter.ts';
import type { SandboxGoing } from './sandbox-going.ts';
import type { OnDemandHookRequest, OnDemandProber, OnDemandProbeRequest, ProbeKey } from '../scheduler/types.ts';
import { runLifecycleHandler, type HookOutcome, type LifecycleHook } from '../probe/lifecycle.ts';
import { admission } from '../probe/time-budget.ts';
import { PodFrameBudgets } from '../probe/pod-frame-budgets.ts';
import type { Tenant } from '../scheduler/limiter.ts';

/** Dependencies of PodProber. */
export interface PodProberOptions {
  /** Where the prober finds pods (the pod source's last good set). */
  pods: PodIndex;
  resolver: NetnsResolverChain;
  limiter: FairLimiter;
  /** Probe calls of one namespace that may wait for a slot (the shim's and the Probe RPC's); default: the limiter's own bound. */
  maxQueuedPerNamespace?: number;
  /**
   * Bounds lifecycle hooks per namespace and pod (they take no probe slot: a hook may legitimately
   * run for minutes). Absent = hooks are not bounded here.
   */
  hookLimiter?: FairLimiter;
  sockets: SocketFactory;
  nodeSockets: SocketFactory;
  gates: FeatureGates;
  kubeVersion: string;
  classify: (pod: PodInfo) => NotOursReason | undefined;
  /** Finds pods by CRI container ID (the kubelet shim's requests); without it container_id is refused. */
  containers?: ContainerLocator;
  /**
   * On-demand mode: called with the outcome of every Probe call that carries a probe type (the kubelet
   * shim's), for the probe's status. Must not throw.
   */
  onShimResult?: (key: ProbeKey, containerID: string, outcome: ProbeOutcome) => void;
  log?: Logger;
  /** Asks the runtime whether a pod's sandbox stopped (sandbox-going.ts); absent = never asked. */
  sandboxGoing?: SandboxGoing;
}

/** A request's pod and container; `sandbox` when the runtime was asked by container ID (netns and annotations from it). */
export interface Located {
  pod: PodInfo;
  container: ContainerInfo | undefined;
  containerID: string | undefined;
  sandbox?: RuntimeSandbox;
}

/** Where a located call's `valueFrom: annotation` headers are read (the call's kind names the record entry). */
function headerSource(located: Located, kind: { probeType: ProbeType } | { hook: LifecycleHook } | undefined): HeaderValueSource {
  const containerName = located.container?.name ?? '';
  const field = kind ? handlerFieldOf(kind) : 'livenessProbe';
  const sb = located.sandbox;
  if (!kind) return { containerName, field, unavailable: 'a probe call without probe_type cannot name its record entry' };
  if (!sb) return { containerName, field, unavailable: 'only a call by container_id, answered by the runtime, reads the pod\'s annotations' };
  if (sb.recordedHeadersError !== undefined) return { containerName, field, unavailable: sb.recordedHeadersError };
  return { containerName, field, ...(sb.recordedHeaders ? { recorded: sb.recordedHeaders } : {}) };
}

/** How an API request names its pod (and container): exactly one way is set. */
export type PodSelection = Pick<OnDemandProbeRequest, 'podUID' | 'podSandboxID' | 'podNamespace' | 'podName' | 'containerID' | 'containerName'>;

/** Longest wait before a pod whose netns was not found is looked up again (the wait starts at two probe periods and doubles). */
const UNRESOLVED_MAX_BACKOFF_MS = 30_000;

/** What, when it changes, makes a not-found pod worth resolving at once: its IPs or its containers (a new sandbox). */
function unresolvedKey(pod: PodInfo): string {
  return `${pod.podIPs.join(',')}|${pod.containers.map((c) => c.state?.containerID ?? '').join(',')}`;
}

/** Pod reasons the API refuses with FAILED_PRECONDITION (exec-only and probe-less pods are fine on demand). */
const UNPROBEABLE: ReadonlySet<NotOursReason> = new Set(['host-network', 'sandboxed-runtime']);

/** Whether `spec` is the container's liveness or startup probe (whose failures restart it). */
function decidesRestart(container: ContainerInfo, spec: ProbeSpec): boolean {
  const { Liveness, Startup } = container.probes;
  return (Liveness?.ok === true && Liveness.spec === spec) || (Startup?.ok === true && Startup.spec === spec);
}

/** Runs probes inside the netns of pods known on this node. */
/** A pod as the limiters and the helper's shares count it: its namespace, its UID. */
function tenantOf(pod: { namespace: string; uid: string; name: string }): Tenant {
  return { group: pod.namespace, owner: pod.uid, label: `${pod.namespace}/${pod.name}` };
}

export class PodProber implements OnDemandProber {
  readonly #o: PodProberOptions;
  readonly #log: Logger;
  /** sandbox ID -> pod UID, learnt from CRI resolutions (the API may name a pod by its sandbox). */
  readonly #sandboxes = new Map<string, string>();
  /**
   * Pods that no resolver found (outcome not-found), and when their workers may ask again. Such a
   * pod is asked about every probe period, holding a probe slot through the whole resolver chain
   * (runtime calls, a /proc or netns scan): with many of them the node's real probes starve. A
   * runtime that could not be asked (unavailable) is not remembered: it must be retried at once.
   */
  readonly #unresolved = new Map<string, { key: string; failures: number; retryAt: number; reason: FailureReason; message: string }>();
  /** Each pod's HTTP/2 frame budget, across its probes' connections. */
  readonly #frameBudgets: PodFrameBudgets;

  constructor(opts: PodProberOptions) {
    this.#o = opts;
    this.#log = (opts.log ?? silentLogger).child({ component: 'prober' });
    this.#frameBudgets = new PodFrameBudgets({ log: this.#log });
  }

  /** The RunProbe workers call: never throws; netns trouble becomes an 'error' outcome with a reason. */
  readonly runForWorker: RunProbe = async (pod, container, spec, signal) => {
    const miss = this.#unresolved.get(pod.uid);
    // The key (string building) only for a pod that missed: not on every probe of a resolved pod.
    if (miss && miss.key === unresolvedKey(pod) && Date.now() < miss.retryAt) return errorOutcome(miss.reason, miss.message);
    let netns: string;
    try {
      netns = await this.#resolve(pod, signal);
      this.#unresolved.delete(pod.uid);
    } catch (err) {
      // A sandbox the runtime no longer has READY is a pod going (or its sandbox replaced): expected churn.
      let reason: FailureReason = err instanceof UnsupportedPodError ? 'unsupported-pod' : isSandboxGone(err) ? 'netns-gone' : 'netns-unresolved';
      let message = describeError(err);
      // A pod being torn down loses its netns before kubelet's list drops it: churn, not a fault.
      const going = reason === 'netns-unresolved' ? this.#going(pod) : undefined;
      if (going !== undefined) {
        reason = 'netns-gone';
        message = `pod is going (${going}); not counted: ${message}`;
      }
      if (outcomeOf(err) === 'not-found' && !signal.aborted) {
        const key = unresolvedKey(pod);
        const failures = miss?.key === key ? miss.failures + 1 : 1;
        // Two periods, then four...: each failure skips more of this probe's runs. Jittered, so that
        // pods which failed together (a burst of new pods) do not come back together.
        const periodMs = Math.max(1, spec.periodSeconds) * 1000;
        const delay = Math.min(UNRESOLVED_MAX_BACKOFF_MS, periodMs * 2 ** Math.min(failures, 20) * (0.75 + Math.random() / 2));
        this.#unresolved.set(pod.uid, { key, failures, retryAt: Date.now() + delay, reason, message });
      } else {
        this.#unresolved.delete(pod.uid);
      }
      return errorOutcome(reason, message);
    }
    const outcome = await this.#run(pod, container, spec.handler, spec.timeoutSeconds, netns, signal);
    if (outcome.result !== 'failure' || !this.#o.sandboxGoing || signal.aborted || !decidesRestart(container, spec)) return outcome;
    // A liveness or startup failure restarts the container. If the runtime already stopped the
    // pod's sandbox, the pod is going and the failure is its shutdown: an error, thrown away.
    const going = await this.#o.sandboxGoing(pod.uid, signal).catch(() => undefined);
    if (going === undefined) return outcome;
    this.#o.resolver.invalidate(pod.uid);
    return { ...outcome, result: 'error', reason: 'netns-gone', message: `pod is going (${going}); not counted: ${outcome.message}` };
  };

  /**
   * Why a pod whose netns was not found is going, from kubelet's latest list (no runtime call: this
   * runs for every unresolved pod): marked deleted, or no longer listed. A sandbox the runtime has
   * but not READY is the resolvers' own finding (isSandboxGone).
   */
  #going(pod: PodInfo): string | undefined {
    const latest = this.#o.pods.get(pod.uid);
    if (latest === undefined) return 'no longer in kubelet\'s pod list';
    if (latest.deletionTimestamp !== undefined || pod.deletionTimestamp !== undefined) return 'being deleted';
    return undefined;
  }

  /** One-shot probe for the API; rejects with the typed errors the API maps to status codes. */
  async probe(req: OnDemandProbeRequest, signal?: AbortSignal): Promise<ProbeOutcome> {
    if (req.handler.kind === 'exec') throw new InvalidProbeError('handler: exec probes are run by kubelet, not by probe-agent');
    const located = await this.locate(req, signal);
    const { pod, container, containerID, sandbox } = located;
    req.onLocated?.(pod.namespace);
    const shimCall = req.containerID !== undefined;
    const handler = this.#callHandler(req.handler, located, shimCall, req.probeType ? { probeType: req.probeType } : undefined, 'probe');
    // Admitted per namespace and pod as soon as the pod is known (before any netns work, so that a
    // refused call costs next to nothing): fair queueing, and refused at once when the probe could
    // not start its full timeout before the caller's deadline. One tenant's hanging probes never
    // take another tenant's slots.
    const { value } = await this.#o.limiter.run(
      tenantOf(pod),
      async () => this.#run(pod, container, handler, req.timeoutSeconds, await this.#netnsOf(located, signal), signal, shimCall, sandbox?.id),
      signal,
      { ...admission(req.deadlineAt, req.timeoutSeconds, Date.now()), maxQueuedInGroup: this.#o.maxQueuedPerNamespace },
    );
    if (value.reason === 'netns-gone' && shimCall) await this.#refuseIfDead(req, signal);
    // A call its caller gave up on is not a result kubelet will see: record nothing for it.
    if (req.probeType && container && containerID && this.#o.onShimResult && !signal?.aborted) {
      try {
        this.#o.onShimResult({ podUID: pod.uid, containerName: container.name, probeType: req.probeType }, containerID, value);
      } catch (err) {
        this.#log.warn('recording a shim probe result failed', { pod: `${pod.namespace}/${pod.name}`, err: describeError(err) });
      }
    }
    return value;
  }

  /**
   * The pod (and container, when named) a request means, refused when its probes cannot be run
   * from its netns. A container_id names both; a container_name given beside it must agree.
   */
  async locate(req: PodSelection, signal?: AbortSignal): Promise<Located> {
    let pod: PodInfo;
    let containerName = req.containerName;
    let containerID: string | undefined;
    let container: ContainerInfo | undefined;
    let sandbox: RuntimeSandbox | undefined;
    if (req.containerID) {
      if (!this.#o.containers) throw new InvalidProbeError('container_id: this agent cannot look containers up', { field: 'container_id' });
      const found = await this.#o.containers.locate(req.containerID, signal);
      if (containerName && containerName !== found.containerName) {
        throw new InvalidProbeError(`container_name: "${containerName}" but container_id names container "${found.containerName}"`, { field: 'container_name' });
      }
      ({ pod, container, containerName, containerID, sandbox } = found);
    } else {
      pod = this.#find(req);
    }
    const reason = this.#o.classify(pod);
    if (reason !== undefined && UNPROBEABLE.has(reason)) {
      throw new UnsupportedPodError(`pod ${pod.namespace}/${pod.name} is ${reason}: its probes stay with kubelet`, { uid: pod.uid, reason });
    }
    if (containerName && !container) {
      container = pod.containers.find((c) => c.name === containerName);
      if (!container) throw new PodNotFoundError(`container "${containerName}" not found in pod ${pod.namespace}/${pod.name}`, { uid: pod.uid });
      containerID ??= container.state?.containerID || undefined;
    }
    return { pod, container, containerID, ...(sandbox ? { sandbox } : {}) };
  }

  /**
   * One lifecycle hook for the API (kubelet's semantics, agent/probe/lifecycle.ts); rejects like
   * probe(). Hooks take no probe slot: one that hangs for its whole time must not starve probes;
   * they are admitted per namespace and pod by the hook limiter instead.
   */
  async runHook(req: OnDemandHookRequest, signal?: AbortSignal): Promise<HookOutcome> {
    const located = await this.locate(req, signal);
    const { pod, container, sandbox } = located;
    req.onLocated?.(pod.namespace);
    const shimCall = req.containerID !== undefined;
    const handler = this.#callHandler(req.handler, located, shimCall, { hook: req.hook }, 'hook');
    const run = async (): Promise<HookOutcome> => {
      const netns = await this.#netnsOf(located, signal);
      return runLifecycleHandler(handler, { ...this.#context(pod, container, req.timeoutSeconds, netns, signal, shimCall), hook: req.hook });
    };
    const outcome = this.#o.hookLimiter
      ? (await this.#o.hookLimiter.run(tenantOf(pod), run, signal, admission(req.deadlineAt, req.timeoutSeconds, Date.now()))).value
      : await run();
    if (outcome.reason === 'netns-gone') {
      this.#netnsGone(pod.uid, sandbox?.id);
      if (shimCall) await this.#refuseIfDead(req, signal);
    }
    return outcome;
  }

  /** Where a located call runs: the runtime's checked netns, else the resolvers'. */
  async #netnsOf(located: Located, signal?: AbortSignal): Promise<string> {
    return located.sandbox?.netns || (await this.#resolve(located.pod, signal));
  }

  /**
   * A call by container ID that met a vanished netns (its cached lookup was still fresh) is looked
   * up again, as a call arriving now would be: a stopped or removed container is then refused as
   * dead, with the same answer whether the lookup or the probe noticed first. Returns when the
   * lookup still finds it running (the netns-gone error stands).
   */
  async #refuseIfDead(req: PodSelection, signal?: AbortSignal): Promise<void> {
    if (signal?.aborted) return;
    await this.#netnsOf(await this.locate(req, signal), signal);
  }

  /**
   * The handler an API call runs. A call naming a container ID is the kubelet shim's, its handler
   * taken from the pod's own exec command: a foreign host or a header value an old shim dropped is
   * refused. `valueFrom: annotation` header values are filled from the sandbox's record.
   */
  #callHandler<H extends ProbeHandler>(handler: H, located: Located, shimCall: boolean, kind: { probeType: ProbeType } | { hook: LifecycleHook } | undefined, what: 'probe' | 'hook'): H {
    if (shimCall) refuseForeignHostInShimCall(handler, located.pod.podIPs, what);
    if (handler.kind !== 'http') return handler;
    const source = headerSource(located, kind);
    if (shimCall) refuseDroppedHeaderValues(handler, source);
    return needsHeaderValues(handler) ? (withHeaderValues(handler, source) as H) : handler;
  }

  /** Forgets what was learnt about a pod (it is gone). */
  forget(uid: string): void {
    this.#o.containers?.forgetPod(uid);
    this.#o.resolver.invalidate(uid);
    this.#unresolved.delete(uid);
    this.#frameBudgets.forget(uid);
    for (const [sandbox, owner] of this.#sandboxes) if (owner === uid) this.#sandboxes.delete(sandbox);
  }

  #find(req: PodSelection): PodInfo {
    const { pods } = this.#o;
    let pod: PodInfo | undefined;
    let asked: string;
    if (req.podUID) {
      asked = `uid ${req.podUID}`;
      pod = pods.get(req.podUID);
    } else if (req.podSandboxID) {
      asked = `sandbox ${req.podSandboxID}`;
      const uid = this.#sandboxes.get(req.podSandboxID);
      pod = uid === undefined ? undefined : pods.get(uid);
    } else if (req.podNamespace && req.podName) {
      asked = `${req.podNamespace}/${req.podName}`;
      pod = pods.pods().find((p) => p.namespace === req.podNamespace && p.name === req.podName);
    } else {
      throw new InvalidProbeError('name the pod: pod_uid, pod_sandbox_id, or namespace and name');
    }
    if (!pod) throw new PodNotFoundError(`pod ${asked} is not known on this node`, { pod: asked });
    return pod;
  }

  async #resolve(pod: PodInfo, signal?: AbortSignal): Promise<string> {
    const ref: PodRef = {
      uid: pod.uid,
      namespace: pod.namespace,
      name: pod.name,
      podIPs: pod.podIPs,
      runtimeClassName: pod.runtimeClassName,
    };
    if (pod.hostNetwork) throw new UnsupportedPodError(`pod ${pod.namespace}/${pod.name} uses hostNetwork`, { uid: pod.uid });
    try {
      const res = await this.#o.resolver.resolve(ref, signal);
      if (res.sandboxID) this.#sandboxes.set(res.sandboxID, pod.uid);
      return res.path;
    } catch (err) {
      if (err instanceof UnsupportedPodError || err instanceof NetnsUnavailableError) throw err;
      throw new NetnsUnavailableError(`cannot resolve the netns of pod ${pod.namespace}/${pod.name}: ${describeError(err)}`, { uid: pod.uid }, { cause: err });
    }
  }

  /** A probe or hook met a vanished netns: drop what the resolvers and the container lookup cached. */
  #netnsGone(uid: string, sandboxID: string | undefined): void {
    this.#o.resolver.invalidate(uid);
    if (sandboxID) this.#o.containers?.invalidateSandbox(sandboxID);
  }

  /** The probe context; `shimCall` pins the host-field policy to refuse (never the node netns for a pod-written command). */
  #context(pod: PodInfo, container: ContainerInfo | undefined, timeoutSeconds: number, netns: string, signal?: AbortSignal, shimCall = false): ProbeContext {
    const { gates } = this.#o;
    return {
      netns,
      tenant: tenantOf(pod),
      podIPs: pod.podIPs,
      containerPorts: container?.ports,
      timeoutSeconds,
      sockets: this.#o.sockets,
      nodeSockets: this.#o.nodeSockets,
      kubeVersion: this.#o.kubeVersion,
      hostFieldPolicy: !shimCall && gates.enabled('LegacyHostFieldProbes') ? 'legacy-node' : 'refuse',
      happyEyeballs: gates.enabled('HappyEyeballs'),
      signal,
      frameBudget: this.#frameBudgets.of(pod),
    };
  }

  async #run(
    pod: PodInfo,
    container: ContainerInfo | undefined,
    handler: ProbeHandler,
    timeoutSeconds: number,
    netns: string,
    signal?: AbortSignal,
    shimCall = false,
    sandboxID?: string,
  ): Promise<ProbeOutcome> {
    const { gates } = this.#o;
    const outcome = await runProbe(handler, this.#context(pod, container, timeoutSeconds, netns, signal, shimCall));
    if (outcome.reason === 'netns-gone') {
      // The pod's sandbox was replaced or removed: resolve afresh next time.
      this.#netnsGone(pod.uid, sandboxID);
      this.#log.debug('netns gone, cache dropped', { pod: `${pod.namespace}/${pod.name}` });
    }
    if (!gates.enabled('ProbePhaseTimings')) return { ...outcome, phases: { total: outcome.phases.total } };
    return outcome;
  }
}
