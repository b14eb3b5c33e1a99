/**
 * Probe metrics: kubelet's own prober_* series (same names, types, labels, help and semantics, so
 * existing kubelet dashboards and alerts keep working) and our probe_agent_* probe series.
 *
 * Kubelet semantics copied on purpose (pkg/kubelet/prober/worker.go doProbe):
 * - prober_probe_total{result}: successful | failed | unknown; a prober *error* is thrown away (no
 *   increment). Our 'error' results therefore never touch prober_*; they are counted in
 *   probe_agent_probe_results_total{result="error"} instead.
 * - prober_probe_duration_seconds is observed for successful and unknown results, never failed.
 * - Both are created lazily on first use and deleted when the worker stops.
 * One deliberate refinement: the duration series has no pod_uid label, so a recreated pod with the
 * same name shares it with the old worker; we delete it when the LAST such worker stops (kubelet
 * deletes it on the first stop, which resets the new worker's histogram).
 */
import type { Registry } from 'prom-client';
import type { Logger } from '../log.ts';
import type { FailureReason, ProbeOutcome, ProbePhases, ProbeType } from '../probe/types.ts';
import { PROBE_TYPES } from '../probe/types.ts';
import { messageLogField } from '../probe/message.ts';
import type { ProbeObserver, ProbeRunMeta, ResultsReader } from '../scheduler/types.ts';
import { BoundCounter, BoundHistogram, type CounterSeries, type HistogramSeries } from './bound-series.ts';
import { validSeconds } from './seconds.ts';

/**
 * Kubelet's prober_probe_duration_seconds sets no buckets, so client_golang's DefBuckets apply;
 * kept explicit here so a prom-client default change cannot silently diverge from kubelet.
 */
export const KUBELET_PROBE_BUCKETS: readonly number[] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];

/** Probe phases are sub-millisecond on loopback and up to the probe timeout when things go wrong. */
export const PHASE_BUCKETS: readonly number[] = [
  0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
];

/** Every FailureReason, for label validation (a label must never carry anything else). */
export const FAILURE_REASONS: readonly FailureReason[] = [
  'refused', 'timeout', 'reset', 'unreachable', 'status', 'redirects', 'tls', 'protocol', 'grpc-status',
  'grpc-unimplemented', 'grpc-not-serving', 'netns-gone', 'netns-denied', 'netns-unresolved', 'unsupported-pod', 'helper-error', 'host-refused',
  'port-unresolved', 'invalid-spec', 'queue-full', 'agent-overloaded', 'frame-budget', 'other',
];
const REASONS = new Set<string>(FAILURE_REASONS);
const PROTOCOLS = new Set(['http', 'tcp', 'grpc']);
const PROBE_TYPE_SET = new Set<string>(PROBE_TYPES);

/** The probe_type label for one-shot probes from the API (not kubelet workers). */
export const ON_DEMAND_PROBE_TYPE = 'OnDemand';

const PHASE_LABELS: readonly (readonly [keyof ProbePhases, string])[] = [
  ['queue', 'queue'],
  ['helper', 'helper'],
  ['connect', 'connect'],
  ['tls', 'tls'],
  ['firstByte', 'first_byte'],
  ['total', 'total'],
];

type ResultLabels = { probe_type: string; container: string; pod: string; namespace: string; pod_uid: string };
type DurationLabels = { probe_type: string; container: string; pod: string; namespace: string };

/** A worker's series, bound when it starts: a probe run then only adds to them (bound-series.ts). */
interface LiveWorker {
  results: ResultLabels;
  successful: CounterSeries;
  failed: CounterSeries;
  duration: HistogramSeries;
  durationLabels: DurationLabels;
  durationKey: string;
  /** Set when the worker stops: a cached lookup by its meta object must not find it any more. */
  stopped: boolean;
}

const AGENT_RESULTS = new Set(['success', 'warning', 'failure', 'error']);

/** Construction options; createMetrics() supplies them. */
export interface ProbeMetricsOptions {
  registry: Registry;
  probesRegistry: Registry;
  /** The ProbePhaseTimings gate: off = only the 'total' phase is exported. */
  phaseTimings: boolean;
  log: Logger;
}

/** Implements the scheduler's ProbeObserver: kubelet-compatible prober_* series plus probe_agent_* probe series. */
export class ProbeMetrics implements ProbeObserver {
  readonly #results: BoundCounter<'probe_type' | 'result' | 'container' | 'pod' | 'namespace' | 'pod_uid'>;
  readonly #duration: BoundHistogram<'probe_type' | 'container' | 'pod' | 'namespace'>;
  readonly #agentResults: BoundCounter<'probe_type' | 'protocol' | 'result' | 'reason'>;
  readonly #phases: BoundHistogram<'protocol' | 'phase'>;
  readonly #phaseTimings: boolean;
  readonly #log: Logger;
  readonly #live = new Map<string, LiveWorker>();
  readonly #durationRefs = new Map<string, number>();
  /** Live workers by their meta object: the scheduler passes the same object to every call of a worker. */
  readonly #byMeta = new WeakMap<ProbeRunMeta, LiveWorker>();
  /**
   * probe_agent_probe_results_total series by probe type, protocol, result and reason. Nested maps
   * of short interned strings: no key string is built per run. Bounded: all four are enums.
   */
  readonly #agentSeries = new Map<string, Map<string, Map<string, Map<string, CounterSeries>>>>();
  /** probe_agent_probe_phase_duration_seconds series, per protocol, in PHASE_LABELS order. */
  readonly #phaseSeries = new Map<string, HistogramSeries[]>();

  constructor(opts: ProbeMetricsOptions) {
    this.#phaseTimings = opts.phaseTimings;
    this.#log = opts.log.child({ component: 'probe-metrics' });
    const both = [opts.registry, opts.probesRegistry];
    this.#results = new BoundCounter({
      name: 'prober_probe_total',
      help: '[BETA] Cumulative number of a liveness, readiness or startup probe for a container by result.',
      labelNames: ['probe_type', 'result', 'container', 'pod', 'namespace', 'pod_uid'] as const,
      registers: both,
    });
    this.#duration = new BoundHistogram({
      name: 'prober_probe_duration_seconds',
      help: '[ALPHA] Duration in seconds for a probe response.',
      labelNames: ['probe_type', 'container', 'pod', 'namespace'] as const,
      buckets: [...KUBELET_PROBE_BUCKETS],
      registers: both,
    });
    this.#agentResults = new BoundCounter({
      name: 'probe_agent_probe_results_total',
      help: 'Raw probe runs (before thresholds) by probe type, protocol, result (success, warning, failure, error) and failure reason ("none" unless failure/error).',
      labelNames: ['probe_type', 'protocol', 'result', 'reason'] as const,
      registers: [opts.registry],
    });
    this.#phases = new BoundHistogram({
      name: 'probe_agent_probe_phase_duration_seconds',
      help: 'Time spent in each probe phase: queue, helper (socket made in the pod netns), connect, tls, first_byte, total.',
      labelNames: ['protocol', 'phase'] as const,
      buckets: [...PHASE_BUCKETS],
      registers: [opts.registry],
    });
  }

  /** A worker started: its kubelet series may now be created (lazily, on its first result, as kubelet does). */
  workerStarted(meta: ProbeRunMeta): void {
    try {
      const key = workerKey(meta);
      if (this.#live.has(key) || !PROBE_TYPE_SET.has(meta.key.probeType)) return;
      const results = {
        probe_type: meta.key.probeType,
        container: meta.key.containerName,
        pod: meta.podName,
        namespace: meta.namespace,
        pod_uid: meta.key.podUID,
      };
      const durationLabels = { probe_type: results.probe_type, container: results.container, pod: results.pod, namespace: results.namespace };
      const durationKey = JSON.stringify([results.probe_type, results.container, results.pod, results.namespace]);
      // Label order as prom-client showed it before: the worker's labels, then result.
      this.#live.set(key, {
        results,
        successful: this.#results.series({ ...results, result: 'successful' }),
        failed: this.#results.series({ ...results, result: 'failed' }),
        duration: this.#duration.series(durationLabels),
        durationLabels,
        durationKey,
        stopped: false,
      });
      this.#durationRefs.set(durationKey, (this.#durationRefs.get(durationKey) ?? 0) + 1);
    } catch (err) {
      this.#log.warn('recording worker start failed', { err });
    }
  }

  /** A worker stopped: its prober_* series are deleted (kubelet's worker does the same on exit). */
  workerStopped(meta: ProbeRunMeta): void {
    try {
      const key = workerKey(meta);
      const live = this.#live.get(key);
      if (!live) return;
      live.stopped = true;
      this.#live.delete(key);
      for (const result of ['successful', 'failed', 'unknown']) this.#results.remove({ ...live.results, result });
      const refs = (this.#durationRefs.get(live.durationKey) ?? 1) - 1;
      if (refs > 0) {
        this.#durationRefs.set(live.durationKey, refs);
      } else {
        this.#durationRefs.delete(live.durationKey);
        this.#duration.remove(live.durationLabels);
      }
    } catch (err) {
      this.#log.warn('recording worker stop failed', { err });
    }
  }

  /**
   * After every raw run of a worker's probe. Runs of a worker that is not started (or already
   * stopped) count only in probe_agent_* series: re-creating its prober_* series would leak them.
   */
  probeRun(meta: ProbeRunMeta, outcome: ProbeOutcome): void {
    try {
      const live = this.#liveFor(meta);
      if (live) this.#recordKubelet(live, outcome);
      this.#recordAgent(meta.key.probeType, meta.protocol, outcome);
      if (this.#log.enabled('debug')) {
        this.#log.debug('probe run', {
          pod: `${meta.namespace}/${meta.podName}`,
          container: meta.key.containerName,
          probe_type: meta.key.probeType,
          protocol: meta.protocol,
          result: outcome.result,
          reason: outcome.reason,
          duration_seconds: outcome.durationSeconds,
          message: outcome.message,
        });
      }
    } catch (err) {
      this.#log.warn('recording probe run failed', { err });
    }
  }

  /** A one-shot probe run for the API: probe_agent_* series only, probe_type="OnDemand". */
  onDemandProbe(protocol: ProbeRunMeta['protocol'], outcome: ProbeOutcome): void {
    try {
      this.#recordAgent(ON_DEMAND_PROBE_TYPE, protocol, outcome);
    } catch (err) {
      this.#log.warn('recording on-demand probe failed', { err });
    }
  }

  /** How many workers currently own prober_* series. */
  liveWorkers(): number {
    return this.#live.size;
  }

  /** The live worker behind `meta`, found by object first (no key string per run), by key otherwise. */
  #liveFor(meta: ProbeRunMeta): LiveWorker | undefined {
    const cached = this.#byMeta.get(meta);
    if (cached && !cached.stopped) return cached;
    const live = this.#live.get(workerKey(meta));
    if (live) this.#byMeta.set(meta, live);
    return live;
  }

  #agentSeriesFor(probeType: string, protocol: string, result: string, reason: string): CounterSeries {
    let byProtocol = this.#agentSeries.get(probeType);
    if (!byProtocol) this.#agentSeries.set(probeType, (byProtocol = new Map()));
    let byResult = byProtocol.get(protocol);
    if (!byResult) byProtocol.set(protocol, (byResult = new Map()));
    let byReason = byResult.get(result);
    if (!byReason) byResult.set(result, (byReason = new Map()));
    let series = byReason.get(reason);
    if (!series) byReason.set(reason, (series = this.#agentResults.series({ probe_type: probeType, protocol, result, reason })));
    return series;
  }

  #recordKubelet(live: LiveWorker, outcome: ProbeOutcome): void {
    switch (outcome.result) {
      case 'success':
      case 'warning':
        live.successful.inc();
        if (validSeconds(outcome.durationSeconds)) live.duration.observe(outcome.durationSeconds);
        break;
      case 'failure':
        live.failed.inc();
        break;
      default:
        // 'error': kubelet throws prober errors away; no prober_* change at all.
        break;
    }
  }

  #recordAgent(probeType: string, protocol: string, outcome: ProbeOutcome): void {
    const result = outcome.result;
    if (!AGENT_RESULTS.has(result)) return;
    const proto = PROTOCOLS.has(protocol) ? protocol : 'other';
    const failed = result === 'failure' || result === 'error';
    const reason = failed ? (outcome.reason && REASONS.has(outcome.reason) ? outcome.reason : 'other') : 'none';
    this.#agentSeriesFor(probeType, proto, result, reason).inc();
    const phases = outcome.phases;
    if (!phases) return;
    let series = this.#phaseSeries.get(proto);
    if (!series) {
      series = PHASE_LABELS.map(([, phase]) => this.#phases.series({ protocol: proto, phase }));
      this.#phaseSeries.set(proto, series);
    }
    for (let i = 0; i < PHASE_LABELS.length; i++) {
      const [field, phase] = PHASE_LABELS[i] as (typeof PHASE_LABELS)[number];
      if (!this.#phaseTimings && phase !== 'total') continue;
      const seconds = phases[field];
      if (validSeconds(seconds)) (series[i] as HistogramSeries).observe(seconds);
    }
  }
}

function workerKey(meta: ProbeRunMeta): string {
  return `${meta.key.podUID}\u0000${meta.key.containerName}\u0000${meta.key.probeType}`;
}

/**
 * Logs thresholded result changes at info (what an operator wants to see at the default -v) and
 * worker add/remove at debug. Each raw probe run is logged at debug by ProbeMetrics.probeRun.
 * Returns the unsubscribe function.
 */
export function logProbeTransitions(reader: Pick<ResultsReader, 'subscribe'>, log: Logger): () => void {
  const plog = log.child({ component: 'prober' });
  return reader.subscribe((event) => {
    try {
      const s = event.status;
      const fields = {
        pod: `${s.namespace}/${s.podName}`,
        container: s.key.containerName,
        probe_type: s.key.probeType satisfies ProbeType,
        result: s.result,
      };
      if (event.type === 'changed' && event.previous !== undefined && event.previous !== s.result) {
        plog.info('probe result changed', { ...fields, previous: event.previous, reason: s.lastReason, ...messageLogField(s.result, s.lastMessage, plog.enabled('debug')) });
      } else if (plog.enabled('debug')) {
        plog.debug(event.type === 'removed' ? 'probe worker removed' : 'probe status updated', fields);
      }
    } catch {
      // A log line must never break the store's synchronous delivery to other subscribers.
    }
  });
}
