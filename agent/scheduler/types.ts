import type { FailureReason, ProbeType } from '../probe/types.ts';

/** Identifies one probe worker, as kubelet does: (pod UID, container name, probe type). */
export interface ProbeKey {
  podUID: string;
  containerName: string;
  probeType: ProbeType;
}

/**
 * The thresholded result kubelet would hold for a probe. Workers never publish 'error': like kubelet
 * they throw a prober error away (ProbeStatus.erroring shows it); the value stays for the wire enum
 * and for clients.
 */
export type ThresholdResult = 'success' | 'failure' | 'unknown' | 'error';

/** Current state of one worker, as stored in the results store. */
export interface ProbeStatus {
  key: ProbeKey;
  namespace: string;
  podName: string;
  containerID: string;
  result: ThresholdResult;
  /** Consecutive raw results equal to the last one. */
  consecutive: number;
  /** Epoch ms of the last probe run; 0 if none yet. */
  lastProbeTime: number;
  lastMessage: string;
  lastReason?: FailureReason;
  /** Derived container state, kubelet's isContainerStarted / ready rules. */
  started: boolean;
  ready: boolean;
  /** Worker is paused (liveness failure or startup decided) until a new container ID. */
  onHold: boolean;
  /**
   * The latest run could not be made (our trouble: netns, helper, queue, named port) and was thrown
   * away as kubelet does; `result` is the unchanged decision, lastMessage/lastReason say why.
   */
  erroring?: boolean;
}

/** One change in the results store; `revision` increases by one per event across the store. */
export interface ProbeEvent {
  revision: number;
  type: 'added' | 'changed' | 'removed';
  status: ProbeStatus;
  /** The result before the change ('unknown' for added). */
  previous?: ThresholdResult;
  time: number;
}

/** Filter for listing statuses; empty fields match everything. */
export interface StatusFilter {
  podUID?: string;
  namespace?: string;
  probeType?: ProbeType;
}

/** Read side of the results store: what the gRPC API and the metrics read. */
export interface ResultsReader {
  list(filter?: StatusFilter): ProbeStatus[];
  /** The revision of the newest event (0 before any). */
  revision(): number;
  /** Events after `revision`, oldest first; undefined when they are no longer retained (client must resync). */
  eventsSince(revision: number): ProbeEvent[] | undefined;
  /** Calls `listener` for every future event, in order; returns an unsubscribe function. */
  subscribe(listener: (event: ProbeEvent) => void): () => void;
}

/** Identity of a probe run, enough for kubelet's metric labels. */
export interface ProbeRunMeta {
  key: ProbeKey;
  namespace: string;
  podName: string;
  protocol: 'http' | 'tcp' | 'grpc';
}

/** Hooks the scheduler calls; metrics and logging implement them. All are synchronous and must not throw. */
export interface ProbeObserver {
  /** After every raw probe run (before thresholds). Errors (result 'error') included. */
  probeRun(meta: ProbeRunMeta, outcome: import('../probe/types.ts').ProbeOutcome): void;
  /** A worker started. */
  workerStarted(meta: ProbeRunMeta): void;
  /** A worker stopped: its per-pod series must go. */
  workerStopped(meta: ProbeRunMeta): void;
}

/** A one-shot probe request against a pod known on this node (the API's Probe RPC). */
export interface OnDemandProbeRequest {
  podUID?: string;
  podSandboxID?: string;
  /** With podName: the pod named by namespace/name (the API's third way; exactly one way is set). */
  podNamespace?: string;
  podName?: string;
  /** CRI container ID (no runtime prefix): the fourth way of naming the pod; also names the container. */
  containerID?: string;
  /** For named ports; required when the handler uses one. */
  containerName?: string;
  /** Set by the kubelet shim: the result is recorded as this probe's status (on-demand mode). */
  probeType?: ProbeType;
  handler: import('../probe/types.ts').ProbeHandler;
  /** Seconds; fractional when the API call's deadline capped the probe's own timeout. */
  timeoutSeconds: number;
  /**
   * Epoch ms when the answer is due (the API call's deadline less the reply margin,
   * time-budget.ts callBudget); absent = never. A call that could not start its full timeout
   * before it is refused instead of queued (RESOURCE_EXHAUSTED).
   */
  deadlineAt?: number;
  /** Called with the pod's namespace once the pod is found, before admission (ExecSync's cache charges its entry to it). */
  onLocated?: (namespace: string) => void;
}

/** A lifecycle hook to run for the API's RunLifecycleHandler (the pod named as in OnDemandProbeRequest). */
export interface OnDemandHookRequest {
  podUID?: string;
  podSandboxID?: string;
  containerID?: string;
  containerName?: string;
  handler: import('../probe/lifecycle.ts').LifecycleHandlerSpec;
  hook: import('../probe/lifecycle.ts').LifecycleHook;
  /** Seconds; 0 = no limit of its own; fractional when the call deadline capped it. */
  timeoutSeconds: number;
  /** Epoch ms when the answer is due, as in OnDemandProbeRequest. */
  deadlineAt?: number;
  /** As in OnDemandProbeRequest. */
  onLocated?: (namespace: string) => void;
}

/**
 * Runs one-shot probes for the API. Rejects with PodNotFoundError, UnsupportedPodError,
 * NetnsUnavailableError, OverloadedError or InvalidProbeError; a probe that fails resolves
 * with result 'failure'.
 */
export interface OnDemandProber {
  probe(req: OnDemandProbeRequest, signal?: AbortSignal): Promise<import('../probe/types.ts').ProbeOutcome>;
  /** Runs one lifecycle hook (same rejections); absent = RunLifecycleHandler is UNIMPLEMENTED. */
  runHook?(req: OnDemandHookRequest, signal?: AbortSignal): Promise<import('../probe/lifecycle.ts').HookOutcome>;
}
