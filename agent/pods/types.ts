import type { ProbeSpec, ProbeType } from '../probe/types.ts';

/** A container port as declared in the pod spec. */
export interface ContainerPort {
  name?: string;
  containerPort: number;
  protocol?: string;
}

/**
 * The probe of one type on one container: parsed, or the reason it could not be. `shim`: the probe
 * was rewritten into probe-agent's exec command; kubelet drives it through the kubelet shim and
 * `spec` holds the original handler (on-demand mode).
 */
export type ContainerProbe = { ok: true; spec: ProbeSpec; shim?: true } | { ok: false; error: string };

/** The runtime state of one container, from pod status (may lag for non-static pods). */
export interface ContainerState {
  /** "containerd://<id>" as kubelet reports it; empty while creating. */
  containerID: string;
  running: boolean;
  /** state.running.startedAt, epoch ms. */
  startedAt?: number;
  terminated: boolean;
  started?: boolean;
  ready: boolean;
  restartCount: number;
}

/** One container that may carry probes: a regular container or a restartable init container (sidecar). */
export interface ContainerInfo {
  name: string;
  kind: 'regular' | 'sidecar';
  ports: ContainerPort[];
  probes: Partial<Record<ProbeType, ContainerProbe>>;
  state?: ContainerState;
  /** Gates mode: the container's preStop hook as written (kubelet's, the agent runs it before a liveness stop). */
  preStop?: Record<string, unknown>;
}

/** What gates mode needs of a pod (agent/gates/). */
export interface GatesInfo {
  /** Probe types the agent took from kubelet, per container name. */
  taken: Record<string, ProbeType[]>;
  /** status.conditions[probe-agent.io/ready].status as kubelet reports it ('' when absent). */
  condition: string;
  /** Its lastTransitionTime, epoch ms (second precision); undefined when absent or unreadable. */
  conditionSince?: number;
  /** spec.terminationGracePeriodSeconds (kubelet's default 30). */
  terminationGracePeriodSeconds: number;
}

/** The parts of a v1.Pod probe-agent acts on. */
export interface PodInfo {
  uid: string;
  namespace: string;
  name: string;
  hostNetwork: boolean;
  /** status.podIPs (primary first); empty while the sandbox is being set up. */
  podIPs: string[];
  phase: string;
  restartPolicy: string;
  /** metadata.deletionTimestamp, epoch ms. */
  deletionTimestamp?: number;
  /** A static (file/URL) pod: kubernetes.io/config.source != api. */
  isStatic: boolean;
  runtimeClassName?: string;
  /** status.conditions Ready == True (used for kubelet's restart-grace rule). */
  podReady: boolean;
  containers: ContainerInfo[];
  /** Present for a pod rewritten for gates mode (the record's `mode: gates`). */
  gates?: GatesInfo;
}

/** Why a pod is left to kubelet rather than probed by us (never an error). */
export type NotOursReason = 'no-network-probes' | 'exec-only' | 'host-network' | 'sandboxed-runtime';
