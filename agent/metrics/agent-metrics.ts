/**
 * probe_agent_* self-metrics: the API other modules report into. Every label value is checked
 * against a closed set (anything else becomes "other"), so no caller can create unbounded series
 * by passing a URL, an IP or an error message. Methods never throw.
 */
import { Counter, Gauge, Histogram, type Registry } from 'prom-client';
import type { ExecSyncCacheStats } from '../api/exec-sync.ts';
import type { Logger } from '../log.ts';
import type { NotOursReason } from '../pods/types.ts';
import { DROPPED_POD_REASONS, type DroppedPodReason } from '../pods/pod-list-stream.ts';
import { overloadedTimeouts } from '../probe/loop-lag.ts';
import { PROBE_TYPES, type ProbeOutcome } from '../probe/types.ts';
import type { ProbeRunMeta, ResultsReader, ThresholdResult } from '../scheduler/types.ts';
import type { ProbeMetrics } from './probe-metrics.ts';
import { BoundCounter, BoundHistogram, type CounterSeries, type HistogramSeries } from './bound-series.ts';
import { validSeconds } from './seconds.ts';
import { GRPC_CODE_NAMES } from '../grpc/status.ts';

/** Kubelet polls and netns resolutions are network/IPC round trips bounded by their own timeouts (~10 s). */
export const CALL_BUCKETS: readonly number[] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];

/** Socket-factory modes (SocketFactory.mode). */
export const HELPER_MODES = ['resident', 'warm', 'pool', 'spawn', 'node'] as const;
export const RUNTIME_WATCH_SOURCES = ['events', 'list'] as const;
export const RUNTIME_EVENT_TYPES = ['created', 'started', 'stopped', 'deleted'] as const;
/** KubeletError kinds (brief D): the kubelet poll error label. */
export const KUBELET_ERROR_KINDS = ['unreachable', 'timeout', 'http-status', 'too-large', 'malformed', 'unauthorized'] as const;
/** Netns resolvers (agent/netns/resolver.ts). */
export const NETNS_RESOLVERS = ['cri', 'procfs', 'address'] as const;
/** Netns resolution outcomes (agent/netns/resolver.ts). */
export const NETNS_OUTCOMES = ['ok', 'not-found', 'unavailable', 'unsupported', 'ambiguous', 'invalid'] as const;
/** How a CRI container ID (the kubelet shim's requests) was found, or why not (agent/prober/container-lookup.ts). */
export const CONTAINER_LOOKUP_SOURCES = ['cache', 'pods', 'runtime', 'refresh', 'not-found', 'unavailable'] as const;
/** Why a pod is left to kubelet (NotOursReason), plus 'ours'. */
export const POD_STATES = ['ours', 'no-network-probes', 'exec-only', 'host-network', 'sandboxed-runtime'] as const;
const THRESHOLD_RESULTS: readonly ThresholdResult[] = ['success', 'failure', 'unknown', 'error'];
const GRPC_CODES = GRPC_CODE_NAMES;
/** gRPC method names come from our own service definition; the cap is a guard against a bug, not a feature. */
const MAX_GRPC_METHODS = 32;

/** Live limiter occupancy, read at scrape time. */
export interface LimiterStats {
  inFlight: number;
  queued: number;
}

/** A limiter's caps (FairLimiter has these fields). */
export interface LimiterBounds {
  maxInFlight: number;
  maxQueued: number;
  maxInFlightPerGroup: number;
  maxQueuedPerGroup: number;
  maxInFlightPerOwner: number;
  maxQueuedPerOwner: number;
}

/** Pods known from the kubelet: probed by us, or left to kubelet and why. */
export interface PodCounts {
  ours: number;
  notOurs: Partial<Record<NotOursReason, number>>;
}

/** Construction options; createMetrics() supplies them. */
export interface AgentMetricsOptions {
  registry: Registry;
  probeMetrics: ProbeMetrics;
  log: Logger;
  now: () => number;
}

/** The self-metrics API (see the report/README for who calls what). */
export class AgentMetrics {
  readonly #probeMetrics: ProbeMetrics;
  readonly #log: Logger;
  readonly #now: () => number;
  readonly #startedAt: number;
  #lastKubeletSuccess: number | undefined;
  #limiterSource: (() => LimiterStats) | undefined;
  #execSyncCacheSource: (() => ExecSyncCacheStats) | undefined;
  #resultsSource: Pick<ResultsReader, 'list'> | undefined;
  readonly #grpcMethods = new Set<string>();

  readonly #helperSpawns: BoundCounter<'mode' | 'result'>;
  readonly #helperSpawnSeconds: BoundHistogram<'mode'>;
  /** Each helper mode's series, bound at its first request: one update per request, no label hashing. */
  readonly #helperSeries = new Map<string, { success: CounterSeries; failure: CounterSeries; seconds: HistogramSeries }>();
  readonly #helperRestarts: Counter;
  readonly #helperWorkersLost: Counter<'reason'>;
  readonly #gatesOps: Counter<'op' | 'result'>;
  readonly #runtimeWatchSource: Gauge<'source'>;
  readonly #runtimeEvents: Counter<'type'>;
  readonly #containerLookups: Counter;
  readonly #kubeletPollSeconds: Histogram<'result'>;
  readonly #kubeletPollErrors: Counter<'kind'>;
  readonly #kubeletLastSuccess: Gauge;
  readonly #netnsResolutions: Counter<'resolver' | 'outcome'>;
  readonly #addressListings: Counter;
  readonly #netnsSeconds: Histogram<'resolver'>;
  readonly #pods: Gauge<'state'>;
  readonly #limiterBounds: Gauge<'limiter' | 'scope' | 'slots'>;
  readonly #grpcRequests: Counter<'method' | 'code'>;
  readonly #grpcSeconds: Histogram<'method'>;
  readonly #droppedPods: Gauge<'reason'>;

  constructor(opts: AgentMetricsOptions) {
    this.#probeMetrics = opts.probeMetrics;
    this.#log = opts.log.child({ component: 'agent-metrics' });
    this.#now = opts.now;
    this.#startedAt = opts.now();
    const registers = [opts.registry];
    const self = this;

    this.#helperSpawns = new BoundCounter({
      name: 'probe_agent_helper_spawns_total',
      help: 'Sockets requested from the netns helper (each forks a child that enters the pod netns), by mode and result.',
      labelNames: ['mode', 'result'] as const,
      registers,
    });
    this.#helperSpawnSeconds = new BoundHistogram({
      name: 'probe_agent_helper_spawn_duration_seconds',
      help: 'Time to get a socket made inside a pod netns from the helper (fork, setns, socket, fd pass).',
      labelNames: ['mode'] as const,
      buckets: [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
      registers,
    });
    this.#helperRestarts = new Counter({
      name: 'probe_agent_helper_restarts_total',
      help: 'Times the resident netns helper died and was restarted.',
      registers,
    });
    this.#helperWorkersLost = new Counter({
      name: 'probe_agent_helper_workers_lost_total',
      help: 'Pool workers of the netns helper lost, by reason (timeout: killed past a request\'s deadline; crash), each replaced when next needed.',
      labelNames: ['reason'] as const,
      registers,
    });
    this.#gatesOps = new Counter({
      name: 'probe_agent_gates_operations_total',
      help: 'Gates mode: writes and actions by op (condition, event, prestop, stop, lease) and result (ok, error).',
      labelNames: ['op', 'result'] as const,
      registers,
    });
    this.#runtimeWatchSource = new Gauge({
      name: 'probe_agent_gates_runtime_watch_source',
      help: 'Gates mode: 1 for where the agent learns of container starts and stops now: events (the runtime\'s CRI GetContainerEvents stream) or list (CRI ListContainers every second, for a runtime without the stream).',
      labelNames: ['source'] as const,
      registers,
    });
    this.#runtimeEvents = new Counter({
      name: 'probe_agent_gates_runtime_events_total',
      help: 'Gates mode: container events received from the runtime, by type (created, started, stopped, deleted).',
      labelNames: ['type'] as const,
      registers,
    });
    this.#kubeletPollSeconds = new Histogram({
      name: 'probe_agent_kubelet_poll_duration_seconds',
      help: 'Duration of GET /pods against the kubelet, by result (success or error).',
      labelNames: ['result'] as const,
      buckets: [...CALL_BUCKETS],
      registers,
    });
    this.#kubeletPollErrors = new Counter({
      name: 'probe_agent_kubelet_poll_errors_total',
      help: 'Failed kubelet polls by kind (unreachable, timeout, http-status, too-large, malformed, unauthorized, other).',
      labelNames: ['kind'] as const,
      registers,
    });
    for (const kind of [...KUBELET_ERROR_KINDS, 'other']) this.#kubeletPollErrors.inc({ kind }, 0);
    this.#kubeletLastSuccess = new Gauge({
      name: 'probe_agent_kubelet_last_success_timestamp_seconds',
      help: 'Unix time of the last successful kubelet poll (0 before the first).',
      registers,
    });
    new Gauge({
      name: 'probe_agent_kubelet_staleness_seconds',
      help: 'Seconds since the pod set was last refreshed from the kubelet (since agent start before the first success).',
      registers,
      collect() {
        this.set(self.kubeletStalenessSeconds());
      },
    });
    this.#addressListings = new Counter({
      name: 'probe_agent_netns_address_listings_total',
      help: 'Listings of the node\'s and every netns\'s addresses by the address resolver (one helper request per netns); the resolutions of one refresh share one.',
      registers,
    });
    this.#netnsResolutions = new Counter({
      name: 'probe_agent_netns_resolutions_total',
      help: 'Pod network namespace lookups by resolver (cri, procfs, address) and outcome.',
      labelNames: ['resolver', 'outcome'] as const,
      registers,
    });
    this.#containerLookups = new Counter({
      name: 'probe_agent_container_lookups_total',
      help: 'Container ID lookups (kubelet shim requests) by source: cache, pods (pod list), runtime (CRI), refresh (after a re-poll), not-found, unavailable.',
      labelNames: ['source'] as const,
      registers,
    });
    this.#netnsSeconds = new Histogram({
      name: 'probe_agent_netns_resolution_duration_seconds',
      help: 'Duration of pod network namespace lookups by resolver.',
      labelNames: ['resolver'] as const,
      buckets: [...CALL_BUCKETS],
      registers,
    });
    new Counter({
      name: 'probe_agent_exec_sync_commands_total',
      help: 'Rewritten commands of ProbeService ExecSync calls (the kubelet shim\'s) by how the agent got their handler: hit (the parsed-command cache) or parsed (base64url, JSON and validation).',
      labelNames: ['result'] as const,
      registers,
      collect() {
        const stats = self.#execSyncCacheStats();
        if (!stats) return;
        this.reset();
        this.inc({ result: 'hit' }, stats.hits);
        this.inc({ result: 'parsed' }, stats.parses);
      },
    });
    new Counter({
      name: 'probe_agent_probe_timeouts_overloaded_total',
      help: 'Probe timeouts reported as error (agent-overloaded), not failure: the agent\'s event loop stalled longer than the probe\'s budget could give back to the target.',
      registers,
      collect() {
        this.reset();
        this.inc(overloadedTimeouts());
      },
    });
    // The parsed-command cache's gauges, read from one stats() call each at scrape time.
    const execSyncGauges: [name: string, help: string, value: (s: ExecSyncCacheStats) => number][] = [
      ['entries', 'Parsed rewritten commands ExecSync keeps (by container ID and command; bounded at 4096).', (s) => s.entries],
      ['bytes', 'Estimated bytes of the parsed rewritten commands ExecSync keeps.', (s) => s.bytes],
      ['max_bytes', 'The byte bound of the ExecSync parsed-command cache.', (s) => s.maxBytes],
      ['namespaces', 'Namespaces with entries in the ExecSync parsed-command cache.', (s) => s.namespaces],
      ['namespace_share_bytes', 'Each namespace\'s share of the ExecSync cache\'s byte bound (the bound over the namespaces with entries); once the cache is full, a namespace over its share evicts only its own entries.', (s) => s.namespaceShareBytes],
      ['namespaces_at_share', 'Namespaces holding at least their share of the ExecSync cache\'s byte bound.', (s) => s.namespacesAtShare],
    ];
    for (const [name, help, value] of execSyncGauges) {
      new Gauge({
        name: `probe_agent_exec_sync_cache_${name}`,
        help,
        registers,
        collect() {
          const stats = self.#execSyncCacheStats();
          if (stats) this.set(value(stats));
        },
      });
    }
    new Counter({
      name: 'probe_agent_exec_sync_cache_evictions_total',
      help: 'Parsed rewritten commands ExecSync dropped to stay within its bounds (a steady rate: more distinct commands than the cache holds).',
      registers,
      collect() {
        const stats = self.#execSyncCacheStats();
        if (!stats) return;
        this.reset();
        this.inc(stats.evictions);
      },
    });
    new Gauge({
      name: 'probe_agent_probes_in_flight',
      help: 'Probes holding a concurrency slot right now.',
      registers,
      collect() {
        const stats = self.#limiterStats();
        if (stats) this.set(stats.inFlight);
      },
    });
    new Gauge({
      name: 'probe_agent_probes_queued',
      help: 'Probes waiting for a concurrency slot right now.',
      registers,
      collect() {
        const stats = self.#limiterStats();
        if (stats) this.set(stats.queued);
      },
    });
    this.#limiterBounds = new Gauge({
      name: 'probe_agent_limiter_bound',
      help: 'The fair limiter\'s caps: runs one node, namespace or pod may hold (slots="in_flight") or have waiting (slots="queued"); beyond them a call is refused at once.',
      labelNames: ['limiter', 'scope', 'slots'] as const,
      registers,
    });
    this.#pods = new Gauge({
      name: 'probe_agent_pods',
      help: 'Pods on this node by state: ours (probed by the agent) or the reason they are left to kubelet.',
      labelNames: ['state'] as const,
      registers,
    });
    for (const state of POD_STATES) this.#pods.set({ state }, 0);
    this.#droppedPods = new Gauge({
      name: 'probe_agent_kubelet_pods_dropped',
      help: 'Pods of the last kubelet pod list that are not probed because they could not be read: too-large (over --kubelet-max-pod-bytes), too-many (over the pod cap), malformed (not JSON) or invalid (a field the agent uses is wrong). The other pods are unaffected.',
      labelNames: ['reason'] as const,
      registers,
    });
    for (const reason of DROPPED_POD_REASONS) this.#droppedPods.set({ reason }, 0);
    new Gauge({
      name: 'probe_agent_workers',
      help: 'Probe workers by probe type and current thresholded result (success, failure, unknown), or error while the latest run errored (thrown away, decision unchanged).',
      labelNames: ['probe_type', 'result'] as const,
      registers,
      collect() {
        self.#collectWorkers(this);
      },
    });
    this.#grpcRequests = new Counter({
      name: 'probe_agent_grpc_requests_total',
      help: 'ProbeService gRPC requests handled, by method and status code.',
      labelNames: ['method', 'code'] as const,
      registers,
    });
    this.#grpcSeconds = new Histogram({
      name: 'probe_agent_grpc_request_duration_seconds',
      help: 'ProbeService gRPC request duration by method.',
      labelNames: ['method'] as const,
      buckets: [...CALL_BUCKETS],
      registers,
    });
  }

  /** One socket request to the netns helper finished (ok = a socket came back). */
  helperSpawn(seconds: number, ok: boolean, mode: string = 'resident'): void {
    this.#guard('helperSpawn', () => {
      const s = this.#helperSeries.get(mode) ?? this.#bindHelperSeries(mode);
      (ok ? s.success : s.failure).inc();
      if (validSeconds(seconds)) s.seconds.observe(seconds);
    });
  }

  #bindHelperSeries(mode: string): { success: CounterSeries; failure: CounterSeries; seconds: HistogramSeries } {
    const m = oneOf(mode, HELPER_MODES);
    const s = {
      success: this.#helperSpawns.series({ mode: m, result: 'success' }),
      failure: this.#helperSpawns.series({ mode: m, result: 'failure' }),
      seconds: this.#helperSpawnSeconds.series({ mode: m }),
    };
    // Keyed by the caller's spelling (bounded: the known modes, and 'other' for anything else).
    if ((HELPER_MODES as readonly string[]).includes(mode)) this.#helperSeries.set(mode, s);
    return s;
  }

  /** The resident helper died and was restarted. */
  gatesOp(op: string, ok: boolean): void {
    this.#guard('gatesOp', () => this.#gatesOps.inc({ op, result: ok ? 'ok' : 'error' }));
  }

  /** Gates mode: the runtime watch's source changed (runtime-watch.ts). */
  runtimeWatchSource(source: string): void {
    this.#guard('runtimeWatchSource', () => {
      for (const s of RUNTIME_WATCH_SOURCES) this.#runtimeWatchSource.set({ source: s }, s === source ? 1 : 0);
    });
  }

  /** Gates mode: one container event from the runtime (a CRI ContainerEventType name). */
  runtimeEvent(type: string): void {
    this.#guard('runtimeEvent', () => {
      const t = type.replace(/^CONTAINER_/, '').replace(/_EVENT$/, '').toLowerCase();
      this.#runtimeEvents.inc({ type: oneOf(t, RUNTIME_EVENT_TYPES) });
    });
  }

  helperRestart(): void {
    this.#guard('helperRestart', () => this.#helperRestarts.inc());
  }

  /** The helper lost a pool worker ('timeout' or 'crash'). */
  helperWorkerLost(reason: 'timeout' | 'crash'): void {
    this.#guard('helperWorkerLost', () => this.#helperWorkersLost.inc({ reason }));
  }

  /** One kubelet poll finished; errorKind set = it failed (a KubeletError kind). */
  kubeletPoll(seconds: number, errorKind?: string): void {
    this.#guard('kubeletPoll', () => {
      const ok = errorKind === undefined;
      if (validSeconds(seconds)) this.#kubeletPollSeconds.observe({ result: ok ? 'success' : 'error' }, seconds);
      if (ok) {
        this.#lastKubeletSuccess = this.#now();
        this.#kubeletLastSuccess.set(this.#lastKubeletSuccess / 1000);
      } else {
        this.#kubeletPollErrors.inc({ kind: oneOf(errorKind, KUBELET_ERROR_KINDS) });
      }
    });
  }

  /** Epoch ms of the last successful kubelet poll, if any. */
  kubeletLastSuccess(): number | undefined {
    return this.#lastKubeletSuccess;
  }

  /** Seconds since the last successful kubelet poll (since start before the first). */
  kubeletStalenessSeconds(): number {
    return Math.max(0, (this.#now() - (this.#lastKubeletSuccess ?? this.#startedAt)) / 1000);
  }

  /** One netns lookup finished (resolver: cri|procfs|address; outcome: ok|not-found|unavailable|unsupported|ambiguous|invalid). */
  netnsResolve(resolver: string, outcome: string, seconds: number): void {
    this.#guard('netnsResolve', () => {
      const r = oneOf(resolver, NETNS_RESOLVERS);
      this.#netnsResolutions.inc({ resolver: r, outcome: oneOf(outcome, NETNS_OUTCOMES) });
      if (validSeconds(seconds)) this.#netnsSeconds.observe({ resolver: r }, seconds);
    });
  }

  /** The address resolver listed the node's and every netns's addresses once. */
  addressListing(): void {
    this.#guard('addressListing', () => this.#addressListings.inc());
  }

  /** One container ID lookup and how it ended. */
  containerLookup(source: string): void {
    this.#guard('containerLookup', () => this.#containerLookups.inc({ source: oneOf(source, CONTAINER_LOOKUP_SOURCES) }));
  }

  /** Where in-flight/queued probe counts come from (the limiter); read at scrape time. */
  setLimiterSource(source: () => LimiterStats): void {
    this.#limiterSource = source;
  }

  /** Publishes a limiter's caps (probe_agent_limiter_bound). */
  setLimiterBounds(limiter: 'probe' | 'hook', b: LimiterBounds): void {
    this.#guard('setLimiterBounds', () => {
      const put = (scope: string, slots: string, v: number): void => void this.#limiterBounds.set({ limiter, scope, slots }, v);
      put('node', 'in_flight', b.maxInFlight);
      put('node', 'queued', b.maxQueued);
      put('namespace', 'in_flight', b.maxInFlightPerGroup);
      put('namespace', 'queued', b.maxQueuedPerGroup);
      put('pod', 'in_flight', b.maxInFlightPerOwner);
      put('pod', 'queued', b.maxQueuedPerOwner);
    });
  }

  /** Where ExecSync's parsed-command cache counters come from (the API server); read at scrape time. */
  setExecSyncCacheSource(source: () => ExecSyncCacheStats): void {
    this.#execSyncCacheSource = source;
  }

  /** Where worker states come from (the results store); read at scrape time. */
  setResultsSource(reader: Pick<ResultsReader, 'list'>): void {
    this.#resultsSource = reader;
  }

  /** Replaces the pod counts (call after every manager sync). */
  setPodCounts(counts: PodCounts): void {
    this.#guard('setPodCounts', () => {
      this.#pods.set({ state: 'ours' }, count(counts.ours));
      for (const state of POD_STATES) {
        if (state !== 'ours') this.#pods.set({ state }, count(counts.notOurs[state]));
      }
    });
  }

  /** Replaces the counts of pods dropped from the last pod list, by reason (call after every poll). */
  setDroppedPods(reasons: readonly DroppedPodReason[]): void {
    this.#guard('setDroppedPods', () => {
      for (const reason of DROPPED_POD_REASONS) this.#droppedPods.set({ reason }, reasons.filter((r) => r === reason).length);
    });
  }

  /** One ProbeService RPC finished; code is a gRPC status number or name. */
  grpcRequest(method: string, code: number | string, seconds: number): void {
    this.#guard('grpcRequest', () => {
      let m = /^\/[\w.]{1,100}\/\w{1,60}$/.test(method) ? method : 'other';
      if (m !== 'other' && !this.#grpcMethods.has(m)) {
        if (this.#grpcMethods.size >= MAX_GRPC_METHODS) m = 'other';
        else this.#grpcMethods.add(m);
      }
      const name = typeof code === 'number' ? (GRPC_CODES[code] ?? 'UNKNOWN') : oneOf(code, GRPC_CODES, 'UNKNOWN');
      this.#grpcRequests.inc({ method: m, code: name });
      if (validSeconds(seconds)) this.#grpcSeconds.observe({ method: m }, seconds);
    });
  }

  /** A one-shot API probe finished (probe_agent_* series with probe_type="OnDemand"). */
  onDemandProbe(protocol: ProbeRunMeta['protocol'], outcome: ProbeOutcome): void {
    this.#probeMetrics.onDemandProbe(protocol, outcome);
  }

  #execSyncCacheStats(): ExecSyncCacheStats | undefined {
    if (!this.#execSyncCacheSource) return undefined;
    try {
      const s = this.#execSyncCacheSource();
      return {
        entries: count(s.entries), bytes: count(s.bytes), maxBytes: count(s.maxBytes), hits: count(s.hits), parses: count(s.parses), evictions: count(s.evictions),
        namespaces: count(s.namespaces), namespaceShareBytes: count(s.namespaceShareBytes), namespacesAtShare: count(s.namespacesAtShare),
      };
    } catch (err) {
      this.#log.warn('exec-sync cache source failed at scrape', { err });
      return undefined;
    }
  }

  #limiterStats(): LimiterStats | undefined {
    if (!this.#limiterSource) return undefined;
    try {
      const s = this.#limiterSource();
      return { inFlight: count(s.inFlight), queued: count(s.queued) };
    } catch (err) {
      this.#log.warn('limiter source failed at scrape', { err });
      return undefined;
    }
  }

  #collectWorkers(gauge: Gauge<'probe_type' | 'result'>): void {
    if (!this.#resultsSource) return;
    const counts = new Map<string, number>();
    try {
      for (const status of this.#resultsSource.list()) {
        const k = `${status.key.probeType}\u0000${status.erroring ? 'error' : status.result}`;
        counts.set(k, (counts.get(k) ?? 0) + 1);
      }
    } catch (err) {
      this.#log.warn('results source failed at scrape', { err });
      return;
    }
    // Every combination is set (0 included) so a result that drains to zero reads 0, not absent.
    for (const probeType of PROBE_TYPES) {
      for (const result of THRESHOLD_RESULTS) {
        gauge.set({ probe_type: probeType, result }, counts.get(`${probeType}\u0000${result}`) ?? 0);
      }
    }
  }

  #guard(what: string, fn: () => void): void {
    try {
      fn();
    } catch (err) {
      this.#log.warn('recording a metric failed', { what, err });
    }
  }
}

function oneOf<T extends string>(value: string | undefined, allowed: readonly T[], fallback = 'other'): string {
  return value !== undefined && (allowed as readonly string[]).includes(value) ? value : fallback;
}

function count(v: number | undefined): number {
  return typeof v === 'number' && Number.isFinite(v) && v > 0 ? Math.floor(v) : 0;
}
