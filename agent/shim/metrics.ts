/**
 * The shim's own counters, in the Prometheus text format written by hand: the shim loads no npm
 * package (test/unit/shim-imports.test.ts). Every label value is from a fixed set, so the series
 * count is bounded whatever kubelet or a pod sends. Counting costs a Map lookup and an addition
 * on kubelet's path; rendering happens only when someone scrapes.
 */
import { getHeapSpaceStatistics } from 'node:v8';
import { SHIM_KINDS } from '../contract/shim-command.ts';

/** Why a rewritten handler was not answered by the agent. */
export type AgentErrorCause = 'unreachable' | 'unavailable' | 'timeout' | 'refused' | 'exhausted' | 'bad_command' | 'agent_too_old' | 'other';

/** What the shim answered an intercepted ExecSync: an exit code 0, a non-zero one, or a gRPC error. */
export type InterceptAnswer = 'success' | 'failure' | 'error';

/** How a hook that had to wait for the agent ended: it reached the agent, or the wait ran out. */
export type HookWaitOutcome = 'ran' | 'gave_up';

/** The intercepted kinds (cmd[1] of the rewritten command), plus 'unknown' for a cmd[1] that is none of them. */
export const INTERCEPT_KINDS = [...SHIM_KINDS, 'unknown'] as const;
export type InterceptKind = (typeof INTERCEPT_KINDS)[number];

/** CRI methods (runtime.v1 RuntimeService and ImageService) named in the forwarded counter; anything else is "other". */
export const KNOWN_CRI_METHODS: readonly string[] = [
  'Version', 'RunPodSandbox', 'StopPodSandbox', 'RemovePodSandbox', 'PodSandboxStatus', 'ListPodSandbox',
  'CreateContainer', 'StartContainer', 'StopContainer', 'RemoveContainer', 'ListContainers', 'ContainerStatus',
  'UpdateContainerResources', 'ReopenContainerLog', 'ExecSync', 'Exec', 'Attach', 'PortForward',
  'ContainerStats', 'ListContainerStats', 'PodSandboxStats', 'ListPodSandboxStats', 'UpdateRuntimeConfig',
  'Status', 'CheckpointContainer', 'GetContainerEvents', 'ListMetricDescriptors', 'ListPodSandboxMetrics',
  'RuntimeConfig', 'UpdatePodSandboxResources',
  'ListImages', 'ImageStatus', 'PullImage', 'RemoveImage', 'ImageFsInfo',
];

/** Histogram buckets (seconds) of the intercept duration: a probe takes ms, a hook may take minutes. */
export const DURATION_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600];

/** Full CRI paths of the known methods → their label: one Map lookup per forwarded call. */
const LABEL_OF_PATH = new Map<string, string>(
  ['/runtime.v1.RuntimeService/', '/runtime.v1.ImageService/'].flatMap((prefix) => KNOWN_CRI_METHODS.map((m) => [prefix + m, m] as [string, string])),
);

/** The bounded method label of a CRI call path. */
export function methodLabel(path: string | undefined): string {
  return (path !== undefined && LABEL_OF_PATH.get(path)) || 'other';
}

/** Calls on one connection of the kubelet-facing socket: the installer's proof that kubelet uses the shim. */
export interface CriClient {
  /** Connection number, unique for the shim's life. */
  readonly id: number;
  readonly openedAt: number;
  calls: number;
}

/** How many connections GET /cri-clients lists (the busiest): kubelet holds two or three. */
export const CRI_CLIENTS_LISTED = 16;

interface Histogram {
  buckets: number[];
  sum: number;
  count: number;
}

/** The shim's counters. */
export class ShimMetrics {
  readonly #forwarded = new Map<string, number>();
  readonly #intercepted = new Map<string, number>();
  readonly #agentErrors = new Map<AgentErrorCause, number>();
  readonly #hookWaits = new Map<HookWaitOutcome, number>();
  readonly #durations = new Map<InterceptKind, Histogram>();
  #runtimeErrors = 0;
  #criCalls = 0;
  #nextClient = 1;
  readonly #clients = new Set<CriClient>();

  /** One call passed through to the runtime, by its `:path`. */
  forwarded(path: string | undefined): void {
    const m = methodLabel(path);
    this.#forwarded.set(m, (this.#forwarded.get(m) ?? 0) + 1);
  }

  /** One intercepted ExecSync answered, with how long the shim took. */
  intercepted(kind: InterceptKind, answer: InterceptAnswer, seconds: number): void {
    const key = `${kind}\u0000${answer}`;
    this.#intercepted.set(key, (this.#intercepted.get(key) ?? 0) + 1);
    let h = this.#durations.get(kind);
    if (!h) {
      h = { buckets: DURATION_BUCKETS.map(() => 0), sum: 0, count: 0 };
      this.#durations.set(kind, h);
    }
    for (let i = 0; i < DURATION_BUCKETS.length; i++) if (seconds <= DURATION_BUCKETS[i]!) h.buckets[i]!++;
    h.sum += seconds;
    h.count++;
  }

  /** One rewritten handler the agent did not answer, by cause. */
  agentError(cause: AgentErrorCause): void {
    this.#agentErrors.set(cause, (this.#agentErrors.get(cause) ?? 0) + 1);
  }

  /** One hook that had to wait for the agent, by how the wait ended. */
  hookWait(outcome: HookWaitOutcome): void {
    this.#hookWaits.set(outcome, (this.#hookWaits.get(outcome) ?? 0) + 1);
  }

  /** A connection opened on the kubelet-facing socket; count its calls with criCall(), end it with criClientClosed(). */
  criClientOpened(): CriClient {
    const c: CriClient = { id: this.#nextClient++, openedAt: Date.now(), calls: 0 };
    this.#clients.add(c);
    return c;
  }

  /** One call started on that connection. */
  criCall(c: CriClient): void {
    c.calls++;
    this.#criCalls++;
  }

  criClientClosed(c: CriClient): void {
    this.#clients.delete(c);
  }

  /**
   * The busiest open connections of the kubelet-facing socket (at most CRI_CLIENTS_LISTED): kubelet
   * keeps its connection and calls about every second (PLEG relist), so one id whose count keeps
   * rising is kubelet's; a tool such as crictl opens a new connection for each command.
   */
  criClients(): { id: number; ageSeconds: number; calls: number }[] {
    const now = Date.now();
    return [...this.#clients].sort((a, b) => b.calls - a.calls).slice(0, CRI_CLIENTS_LISTED)
      .map((c) => ({ id: c.id, ageSeconds: Math.round((now - c.openedAt) / 100) / 10, calls: c.calls }));
  }

  /** One forwarded call the runtime could not take (unreachable, reset). */
  runtimeError(): void {
    this.#runtimeErrors++;
  }

  /** The Prometheus text exposition (format 0.0.4). */
  render(): string {
    const out: string[] = [];
    const family = (name: string, type: string, help: string): void => {
      out.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
    };
    family('probe_agent_shim_cri_calls_total', 'counter', 'CRI calls received on the kubelet-facing socket (forwarded, intercepted or refused).');
    out.push(`probe_agent_shim_cri_calls_total ${this.#criCalls}`);
    family('probe_agent_shim_cri_connections', 'gauge', 'Open connections on the kubelet-facing socket.');
    out.push(`probe_agent_shim_cri_connections ${this.#clients.size}`);
    family('probe_agent_shim_forwarded_total', 'counter', 'CRI calls passed through to the runtime, by method.');
    for (const [m, v] of sorted(this.#forwarded)) out.push(`probe_agent_shim_forwarded_total{method="${m}"} ${v}`);
    family('probe_agent_shim_intercepted_total', 'counter', 'Rewritten probes and hooks answered by the shim, by kind and answer (success: exit 0, failure: non-zero exit, error: a gRPC error).');
    for (const [key, v] of sorted(this.#intercepted)) {
      const [kind, answer] = key.split('\u0000');
      out.push(`probe_agent_shim_intercepted_total{kind="${kind}",answer="${answer}"} ${v}`);
    }
    family('probe_agent_shim_agent_errors_total', 'counter', 'Rewritten probes and hooks the agent did not answer, by cause.');
    for (const [c, v] of sorted(this.#agentErrors)) out.push(`probe_agent_shim_agent_errors_total{cause="${c}"} ${v}`);
    family('probe_agent_shim_hook_waits_total', 'counter', 'Hooks that waited for the agent (down, starting or draining), by outcome.');
    for (const [o, v] of sorted(this.#hookWaits)) out.push(`probe_agent_shim_hook_waits_total{outcome="${o}"} ${v}`);
    family('probe_agent_shim_intercept_duration_seconds', 'histogram', 'Time from a rewritten ExecSync read to its answer, by kind.');
    for (const [kind, h] of sorted(this.#durations)) {
      DURATION_BUCKETS.forEach((le, i) => out.push(`probe_agent_shim_intercept_duration_seconds_bucket{kind="${kind}",le="${le}"} ${h.buckets[i]}`));
      out.push(`probe_agent_shim_intercept_duration_seconds_bucket{kind="${kind}",le="+Inf"} ${h.count}`);
      out.push(`probe_agent_shim_intercept_duration_seconds_sum{kind="${kind}"} ${h.sum}`);
      out.push(`probe_agent_shim_intercept_duration_seconds_count{kind="${kind}"} ${h.count}`);
    }
    family('probe_agent_shim_runtime_errors_total', 'counter', 'Forwarded CRI calls the runtime could not take (unreachable or reset).');
    out.push(`probe_agent_shim_runtime_errors_total ${this.#runtimeErrors}`);
    processMemory(out, family);
    return `${out.join('\n')}\n`;
  }
}

/**
 * The shim's own memory, prefixed like its other families: the agent relays them beside its own
 * process_* and nodejs_* series (/metrics/shim), which dashboards and alerts read by name. The shim
 * runs under a systemd MemoryMax, and RSS alone cannot tell V8's heap from native buffers.
 */
function processMemory(out: string[], family: (name: string, type: string, help: string) => void): void {
  const m = process.memoryUsage();
  family('probe_agent_shim_resident_memory_bytes', 'gauge', 'The shim\'s resident memory.');
  out.push(`probe_agent_shim_resident_memory_bytes ${m.rss}`);
  family('probe_agent_shim_heap_total_bytes', 'gauge', 'V8 heap committed by the shim.');
  out.push(`probe_agent_shim_heap_total_bytes ${m.heapTotal}`);
  family('probe_agent_shim_heap_used_bytes', 'gauge', 'V8 heap used by the shim (live and not yet collected).');
  out.push(`probe_agent_shim_heap_used_bytes ${m.heapUsed}`);
  family('probe_agent_shim_external_memory_bytes', 'gauge', 'Memory outside V8\'s heap held by the shim\'s JavaScript objects (Buffers).');
  out.push(`probe_agent_shim_external_memory_bytes ${m.external}`);
  const spaces = getHeapSpaceStatistics();
  family('probe_agent_shim_heap_space_used_bytes', 'gauge', 'V8 heap used by the shim, by space.');
  for (const s of spaces) out.push(`probe_agent_shim_heap_space_used_bytes{space="${s.space_name.replace(/_space$/, '')}"} ${s.space_used_size}`);
  family('probe_agent_shim_heap_space_total_bytes', 'gauge', 'V8 heap committed by the shim, by space.');
  for (const s of spaces) out.push(`probe_agent_shim_heap_space_total_bytes{space="${s.space_name.replace(/_space$/, '')}"} ${s.space_size}`);
}

function sorted<K extends string, V>(m: Map<K, V>): [K, V][] {
  return [...m].sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
}
