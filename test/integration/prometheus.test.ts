/**
 * A real Prometheus (Debian's /usr/bin/prometheus, private config, loopback) scrapes the metrics
 * listener; the test reads kubelet's prober_* series and our probe_agent_* series back through the
 * Prometheus HTTP API. The outcomes come from the real prober (agent/probe/run.ts, node-netns
 * sockets) running TCP probes against a server this test runs.
 * The lead re-points this at the running daemon later: only the target changes.
 */
import { existsSync } from 'node:fs';
import { createServer, type AddressInfo, type Server } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseFeatureGates } from '../../agent/featuregates.ts';
import { HealthRegistry } from '../../agent/metrics/health.ts';
import { startMetricsServer, type MetricsServer } from '../../agent/metrics/http-server.ts';
import { createMetrics, type Metrics } from '../../agent/metrics/registry.ts';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { runProbe } from '../../agent/probe/run.ts';
import type { ProbeContext, ProbeOutcome } from '../../agent/probe/types.ts';
import type { ProbeRunMeta } from '../../agent/scheduler/types.ts';
import { startPrometheus, type RunningPrometheus } from '../lab/prometheus.ts';

const PROMETHEUS = process.env.PROMETHEUS_BIN ?? '/usr/bin/prometheus';

const sockets = new NodeSocketFactory();
const ctx: ProbeContext = {
  podIPs: ['127.0.0.1'],
  timeoutSeconds: 1,
  sockets,
  nodeSockets: sockets,
  kubeVersion: '1.34',
  hostFieldPolicy: 'refuse',
  happyEyeballs: false,
};
const tcpProbe = (port: number) => runProbe({ kind: 'tcp', port }, ctx);

function meta(pod: string, probeType: ProbeRunMeta['key']['probeType']): ProbeRunMeta {
  return { key: { podUID: `uid-${pod}`, containerName: 'app', probeType }, namespace: 'shop', podName: pod, protocol: 'tcp' };
}

let tcp: Server;
let openPort: number;
let closedPort: number;
let metrics: Metrics;
let health: HealthRegistry;
let server: MetricsServer;
let prom: RunningPrometheus;
const live = meta('web-0', 'Liveness');
const ready = meta('web-1', 'Readiness');
let liveSuccesses = 0;
let readyFailures = 0;

/** Runs `n` real probes for a worker and reports them; returns how many came out as `want`. */
async function probeTimes(w: ProbeRunMeta, port: number, n: number, want: ProbeOutcome['result']): Promise<number> {
  let hits = 0;
  for (let i = 0; i < n; i++) {
    const o = await tcpProbe(port);
    if (o.result === want) hits++;
    metrics.probeObserver.probeRun(w, o);
  }
  return hits;
}

beforeAll(async () => {
  if (!existsSync(PROMETHEUS)) {
    throw new Error(`this test needs Prometheus at ${PROMETHEUS}: run \`make test\`, which installs the prometheus package`);
  }
  tcp = createServer((s) => { s.on('error', () => {}); s.end(); });
  await new Promise<void>((r) => tcp.listen(0, '127.0.0.1', r));
  openPort = (tcp.address() as AddressInfo).port;
  const gone = createServer();
  await new Promise<void>((r) => gone.listen(0, '127.0.0.1', r));
  closedPort = (gone.address() as AddressInfo).port;
  await new Promise<void>((r) => gone.close(() => r()));

  metrics = createMetrics({ gates: parseFeatureGates('HappyEyeballs=false'), version: '0.1.0-prom', apiVersion: 'v1alpha1' });
  health = new HealthRegistry();
  server = await startMetricsServer({ address: '127.0.0.1:0', registry: metrics.registry, probesRegistry: metrics.probesRegistry, health });
  metrics.probeObserver.workerStarted(live);
  metrics.probeObserver.workerStarted(ready);
  liveSuccesses = await probeTimes(live, openPort, 4, 'success');
  readyFailures = await probeTimes(ready, closedPort, 3, 'failure');

  const address = `127.0.0.1:${server.port}`;
  prom = await startPrometheus({
    targets: [
      { job: 'probe-agent', address },
      { job: 'probe-agent-probes', address, path: '/metrics/probes' },
    ],
  });
}, 60_000);

afterAll(async () => {
  await prom?.stop();
  await server?.close();
  health?.close();
  await new Promise<void>((r) => (tcp ? tcp.close(() => r()) : r()));
});

describe('Prometheus scraping the metrics listener', () => {
  it('scrapes both endpoints successfully', async () => {
    const up = await prom.waitFor('up', (s) => s.length === 2 && s.every((x) => x.value === 1), 30_000);
    expect(up.map((s) => s.metric.job).sort()).toEqual(['probe-agent', 'probe-agent-probes']);
  });

  it('reads kubelet\'s prober_probe_total back with kubelet\'s labels', async () => {
    expect([liveSuccesses, readyFailures]).toEqual([4, 3]);
    const q = 'prober_probe_total{job="probe-agent"}';
    const samples = await prom.waitFor(q, (s) => s.length === 2);
    const byPod = Object.fromEntries(samples.map((s) => [s.metric.pod, s]));
    expect(byPod['web-0']?.metric).toMatchObject({ probe_type: 'Liveness', result: 'successful', container: 'app', namespace: 'shop', pod_uid: 'uid-web-0' });
    expect(byPod['web-0']?.value).toBe(liveSuccesses);
    expect(byPod['web-1']?.metric).toMatchObject({ probe_type: 'Readiness', result: 'failed', pod_uid: 'uid-web-1' });
    expect(byPod['web-1']?.value).toBe(readyFailures);
    // Same series on the kubelet-compatible path.
    const viaProbes = await prom.query('sum(prober_probe_total{job="probe-agent-probes"})');
    expect(viaProbes[0]?.value).toBe(liveSuccesses + readyFailures);
    // Only successes are timed.
    const count = await prom.query('prober_probe_duration_seconds_count{job="probe-agent"}');
    expect(count.map((s) => [s.metric.pod, s.value])).toEqual([['web-0', liveSuccesses]]);
  });

  it('reads probe_agent_* and kubernetes_feature_enabled back', async () => {
    const results = await prom.query('sum by (result, reason) (probe_agent_probe_results_total{job="probe-agent"})');
    expect(Object.fromEntries(results.map((s) => [`${s.metric.result}/${s.metric.reason}`, s.value]))).toEqual({
      'success/none': liveSuccesses,
      'failure/refused': readyFailures,
    });
    const phases = await prom.query('probe_agent_probe_phase_duration_seconds_count{job="probe-agent",phase="total"}');
    expect(phases[0]?.value).toBe(liveSuccesses + readyFailures);
    const gate = await prom.query('kubernetes_feature_enabled{job="probe-agent",name="HappyEyeballs"}');
    expect(gate.map((s) => [s.metric.stage, s.value])).toEqual([['BETA', 0]]);
    const build = await prom.query('probe_agent_build_info{job="probe-agent"}');
    expect(build[0]?.metric.version).toBe('0.1.0-prom');
    // Nothing but kubelet's series on /metrics/probes (Prometheus adds up and scrape_* itself).
    const names = await prom.query('count by (__name__) ({job="probe-agent-probes"})');
    const ours = names.map((s) => s.metric.__name__ ?? '').filter((n) => n !== 'up' && !n.startsWith('scrape_'));
    expect(ours.sort()).toEqual([
      'prober_probe_duration_seconds_bucket',
      'prober_probe_duration_seconds_count',
      'prober_probe_duration_seconds_sum',
      'prober_probe_total',
      'process_start_time_seconds',
    ]);
  });

  it('sees new runs and marks a stopped worker\'s series stale', async () => {
    const more = await probeTimes(live, openPort, 2, 'success');
    await prom.waitFor('prober_probe_total{job="probe-agent",pod="web-0"}', (s) => s[0]?.value === liveSuccesses + more);
    metrics.probeObserver.workerStopped(ready);
    await prom.waitFor('prober_probe_total{job="probe-agent",pod="web-1"}', (s) => s.length === 0);
    const remaining = await prom.query('prober_probe_total{job="probe-agent"}');
    expect(remaining.map((s) => s.metric.pod)).toEqual(['web-0']);
  });
});
