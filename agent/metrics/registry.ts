/**
 * The agent's metric registries and the one place that builds every metric (createMetrics).
 *
 * Two registries, as kubelet has: `registry` (served on /metrics: everything) and `probesRegistry`
 * (served on /metrics/probes: kubelet's prober_* series plus process_start_time_seconds, exactly
 * what kubelet registers on that path). The prober metrics are registered in both.
 */
import { Gauge, Registry, collectDefaultMetrics } from 'prom-client';
import type { FeatureGates, Stage } from '../featuregates.ts';
import { silentLogger, type Logger } from '../log.ts';
import { AgentMetrics } from './agent-metrics.ts';
import { ProbeMetrics } from './probe-metrics.ts';

export { KUBELET_PROBE_BUCKETS, PHASE_BUCKETS } from './probe-metrics.ts';
export { CALL_BUCKETS } from './agent-metrics.ts';

/**
 * Sampling interval of the nodejs_eventloop_lag_* metrics (prom-client's monitorEventLoopDelay).
 * prom-client's default, 10 ms, wakes the loop 100 times a second: 0.5 % of a core on an idle node
 * (measured), more than the rest of an idle agent. At 100 ms it costs about 0.05 %; the lag of each
 * sample is still exact (the histogram records whole intervals: subtract this for the delay), only
 * stalls shorter than the interval are sampled less often. The 'eventloop' liveness check has its
 * own 500 ms ticker and is unaffected.
 */
export const EVENT_LOOP_MONITOR_PRECISION_MS = 100;

/** prom-client default metrics that are gauges with a _total suffix. */
const LINT_FAILING_DEFAULTS = ['nodejs_active_handles_total', 'nodejs_active_requests_total', 'nodejs_active_resources_total'];

/** What the daemon passes to build the metrics. */
export interface MetricsOptions {
  gates: FeatureGates;
  /** The agent version (AGENT_VERSION). */
  version: string;
  /** The ProbeService API version (API_VERSION). */
  apiVersion?: string;
  /** VCS revision the binary was built from, when known. */
  revision?: string;
  /** process_* and nodejs_* metrics; off only in tests that build many registries. */
  processMetrics?: boolean;
  /** Where metric-recording problems are reported (they never throw into callers). */
  log?: Logger;
  /** Wall clock in ms; injectable for staleness tests. */
  now?: () => number;
}

/** Everything the daemon wires: the registries to serve, the scheduler hook and the self-metrics API. */
export interface Metrics {
  /** Served on /metrics. */
  registry: Registry;
  /** Served on /metrics/probes (kubelet's path: prober_* only, plus process_start_time_seconds). */
  probesRegistry: Registry;
  /** Pass to the probe manager/workers (ProbeObserver). */
  probeObserver: ProbeMetrics;
  /** Self-metrics the other modules report into. */
  agent: AgentMetrics;
}

/** Kubernetes labels GA gates with an empty stage (featuregate.GA == ""); copy that, dashboards rely on it. */
export function kubernetesStageLabel(stage: Stage): string {
  return stage === 'GA' ? '' : stage;
}

/** Builds both registries and every metric the agent exports. */
export function createMetrics(opts: MetricsOptions): Metrics {
  const log = opts.log ?? silentLogger;
  const now = opts.now ?? Date.now;
  const registry = new Registry();
  const probesRegistry = new Registry();

  if (opts.processMetrics !== false) {
    collectDefaultMetrics({ register: registry, eventLoopMonitoringPrecision: EVENT_LOOP_MONITOR_PRECISION_MS });
    // Gauges named *_total fail `promtool check metrics`; sum() over the by-type gauges
    // (nodejs_active_handles{type} etc.) gives the same numbers.
    for (const name of LINT_FAILING_DEFAULTS) registry.removeSingleMetric(name);
  }

  const startTime = Math.round(now() / 1000 - process.uptime());
  new Gauge({
    name: 'process_start_time_seconds',
    help: 'Start time of the process since unix epoch in seconds.',
    registers: [probesRegistry],
    collect() {
      this.set(startTime);
    },
  });

  const buildInfo = new Gauge({
    name: 'probe_agent_build_info',
    help: 'Build information about probe-agent; the value is always 1.',
    labelNames: ['version', 'revision', 'api_version', 'node_version'] as const,
    registers: [registry],
  });
  buildInfo.set(
    {
      version: opts.version,
      revision: opts.revision ?? 'unknown',
      api_version: opts.apiVersion ?? 'unknown',
      node_version: process.version,
    },
    1,
  );

  const featureEnabled = new Gauge({
    name: 'kubernetes_feature_enabled',
    help: '[ALPHA] This metric records the data about the stage and enablement of a k8s feature.',
    labelNames: ['name', 'stage'] as const,
    registers: [registry],
  });
  for (const gate of opts.gates.list()) {
    featureEnabled.set({ name: gate.name, stage: kubernetesStageLabel(gate.stage) }, gate.enabled ? 1 : 0);
  }

  const probeObserver = new ProbeMetrics({
    registry,
    probesRegistry,
    phaseTimings: opts.gates.enabled('ProbePhaseTimings'),
    log,
  });
  const agent = new AgentMetrics({ registry, probeMetrics: probeObserver, log, now });
  return { registry, probesRegistry, probeObserver, agent };
}
