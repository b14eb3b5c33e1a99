/**
 * Metrics mapping, label sets and series lifecycle; health-check registry; logger robustness.
 * The inputs are ProbeOutcome values (data, not mocks): what these tests check is how the metrics
 * layer maps them onto kubelet's series and ours. Real probes feed the integration tests.
 */
import { describe, expect, it } from 'vitest';
import { ExecSyncHandlerCache } from '../../agent/api/exec-sync.ts';
import { encodeShimCommand } from '../../agent/contract/shim-command.ts';
import { FEATURES, FeatureGates, parseFeatureGates } from '../../agent/featuregates.ts';
import { createLogger } from '../../agent/log.ts';
import { freshnessCheck, HealthRegistry } from '../../agent/metrics/health.ts';
import { renderHealth } from '../../agent/metrics/http-server.ts';
import { logProbeTransitions } from '../../agent/metrics/probe-metrics.ts';
import { createMetrics, KUBELET_PROBE_BUCKETS, type Metrics } from '../../agent/metrics/registry.ts';
import type { ProbeOutcome, ProbeType } from '../../agent/probe/types.ts';
import { FairLimiter } from '../../agent/scheduler/limiter.ts';
import { ResultsStore } from '../../agent/scheduler/results-store.ts';
import type { ProbeRunMeta, ProbeStatus } from '../../agent/scheduler/types.ts';

interface Series {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/** Parses Prometheus text exposition (samples only). */
function parse(text: string): Series[] {
  const out: Series[] = [];
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!m) throw new Error(`unparseable exposition line: ${line}`);
    const labels: Record<string, string> = {};
    for (const lm of (m[2] ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[lm[1] as string] = lm[2] as string;
    out.push({ name: m[1] as string, labels, value: Number(m[3]) });
  }
  return out;
}

async function scrape(m: Metrics, which: 'registry' | 'probesRegistry' = 'registry'): Promise<Series[]> {
  return parse(await m[which].metrics());
}

function find(series: Series[], name: string, labels: Record<string, string> = {}): Series[] {
  return series.filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v));
}

function meta(pod: string, probeType: ProbeType = 'Readiness', uid = `uid-${pod}`, protocol: ProbeRunMeta['protocol'] = 'http'): ProbeRunMeta {
  return { key: { podUID: uid, containerName: 'app', probeType }, namespace: 'shop', podName: pod, protocol };
}

function outcome(result: ProbeOutcome['result'], extra: Partial<ProbeOutcome> = {}): ProbeOutcome {
  return { result, message: '', durationSeconds: 0.012, phases: { connect: 0.002, firstByte: 0.008, total: 0.012 }, ...extra };
}

function newMetrics(gates = new FeatureGates()): Metrics {
  return createMetrics({ gates, version: '9.9.9-test', apiVersion: 'v1alpha1', processMetrics: false });
}

describe('kubelet prober_* series', () => {
  it('uses kubelet label sets: probe_total with pod_uid and result, duration without either', async () => {
    const m = newMetrics();
    const w = meta('web-0');
    m.probeObserver.workerStarted(w);
    m.probeObserver.probeRun(w, outcome('success'));
    const s = await scrape(m);
    const total = find(s, 'prober_probe_total');
    expect(total).toEqual([
      {
        name: 'prober_probe_total',
        labels: { probe_type: 'Readiness', result: 'successful', container: 'app', pod: 'web-0', namespace: 'shop', pod_uid: 'uid-web-0' },
        value: 1,
      },
    ]);
    const count = find(s, 'prober_probe_duration_seconds_count');
    expect(count.map((c) => c.labels)).toEqual([{ probe_type: 'Readiness', container: 'app', pod: 'web-0', namespace: 'shop' }]);
    expect(count[0]?.value).toBe(1);
    const les = find(s, 'prober_probe_duration_seconds_bucket').map((b) => b.labels.le);
    expect(les).toEqual([...KUBELET_PROBE_BUCKETS.map(String), '+Inf']);
    // 0.012 s lands in the 0.025 bucket and above, not in 0.01.
    expect(find(s, 'prober_probe_duration_seconds_bucket', { le: '0.01' })[0]?.value).toBe(0);
    expect(find(s, 'prober_probe_duration_seconds_bucket', { le: '0.025' })[0]?.value).toBe(1);
  });

  it('counts warning as successful, failure as failed without a duration, and error not at all', async () => {
    const m = newMetrics();
    const w = meta('web-1', 'Liveness');
    m.probeObserver.workerStarted(w);
    m.probeObserver.probeRun(w, outcome('warning'));
    m.probeObserver.probeRun(w, outcome('failure', { reason: 'status' }));
    m.probeObserver.probeRun(w, outcome('failure', { reason: 'timeout' }));
    m.probeObserver.probeRun(w, outcome('error', { reason: 'port-unresolved' }));
    const s = await scrape(m);
    expect(find(s, 'prober_probe_total', { result: 'successful' })[0]?.value).toBe(1);
    expect(find(s, 'prober_probe_total', { result: 'failed' })[0]?.value).toBe(2);
    expect(find(s, 'prober_probe_total', { result: 'unknown' })).toEqual([]);
    expect(find(s, 'prober_probe_total')).toHaveLength(2);
    // Only the warning (a success) was timed: failures never are, kubelet-style.
    expect(find(s, 'prober_probe_duration_seconds_count')[0]?.value).toBe(1);
    // The error is visible in our own series instead.
    expect(find(s, 'probe_agent_probe_results_total', { result: 'error', reason: 'port-unresolved' })[0]?.value).toBe(1);
    expect(find(s, 'probe_agent_probe_results_total', { result: 'warning', reason: 'none' })[0]?.value).toBe(1);
    expect(find(s, 'probe_agent_probe_results_total', { result: 'failure', reason: 'status', probe_type: 'Liveness', protocol: 'http' })[0]?.value).toBe(1);
  });

  it('deletes a worker\'s series when it stops and leaves other workers alone', async () => {
    const m = newMetrics();
    const a = meta('web-a');
    const b = meta('web-b', 'Startup');
    for (const w of [a, b]) {
      m.probeObserver.workerStarted(w);
      m.probeObserver.probeRun(w, outcome('success'));
      m.probeObserver.probeRun(w, outcome('failure', { reason: 'refused' }));
    }
    expect((await m.registry.metrics()).includes('pod="web-a"')).toBe(true);
    m.probeObserver.workerStopped(a);
    const text = await m.registry.metrics();
    expect(text.includes('pod="web-a"')).toBe(false);
    expect(text.includes('pod_uid="uid-web-a"')).toBe(false);
    const s = parse(text);
    expect(find(s, 'prober_probe_total', { pod: 'web-b' })).toHaveLength(2);
    expect(find(s, 'prober_probe_duration_seconds_count', { pod: 'web-b' })).toHaveLength(1);
    expect((await m.probesRegistry.metrics()).includes('pod="web-a"')).toBe(false);
    // Our aggregate series are not per pod and survive.
    expect(find(s, 'probe_agent_probe_results_total', { result: 'success' }).reduce((n, x) => n + x.value, 0)).toBe(2);
  });

  it('does not resurrect the series of a stopped (or never started) worker', async () => {
    const m = newMetrics();
    const w = meta('late');
    m.probeObserver.workerStarted(w);
    m.probeObserver.workerStopped(w);
    m.probeObserver.probeRun(w, outcome('success'));
    m.probeObserver.probeRun(meta('never-started'), outcome('failure', { reason: 'refused' }));
    const s = await scrape(m);
    expect(find(s, 'prober_probe_total')).toEqual([]);
    expect(find(s, 'probe_agent_probe_results_total')).toHaveLength(2);
    expect(m.probeObserver.liveWorkers()).toBe(0);
  });

  it('keeps the uid-less duration series until the last worker sharing it stops', async () => {
    const m = newMetrics();
    const old = meta('db-0', 'Readiness', 'uid-old');
    const recreated = meta('db-0', 'Readiness', 'uid-new');
    for (const w of [old, recreated]) {
      m.probeObserver.workerStarted(w);
      m.probeObserver.probeRun(w, outcome('success'));
    }
    let s = await scrape(m);
    expect(find(s, 'prober_probe_total', { pod: 'db-0' })).toHaveLength(2);
    expect(find(s, 'prober_probe_duration_seconds_count', { pod: 'db-0' })[0]?.value).toBe(2);
    m.probeObserver.workerStopped(old);
    s = await scrape(m);
    expect(find(s, 'prober_probe_total', { pod: 'db-0' }).map((x) => x.labels.pod_uid)).toEqual(['uid-new']);
    expect(find(s, 'prober_probe_duration_seconds_count', { pod: 'db-0' })).toHaveLength(1);
    m.probeObserver.workerStopped(recreated);
    s = await scrape(m);
    expect(find(s, 'prober_probe_duration_seconds_count')).toEqual([]);
  });

  it('serves only prober_* (and process_start_time_seconds, as kubelet does) on the probes registry', async () => {
    const m = newMetrics();
    const w = meta('web-0');
    m.probeObserver.workerStarted(w);
    m.probeObserver.probeRun(w, outcome('success'));
    m.agent.kubeletPoll(0.01);
    const names = new Set((await scrape(m, 'probesRegistry')).map((s) => s.name.replace(/_(bucket|sum|count)$/, '')));
    expect([...names].sort()).toEqual(['prober_probe_duration_seconds', 'prober_probe_total', 'process_start_time_seconds']);
    const text = await m.probesRegistry.metrics();
    expect(text).toContain('# HELP prober_probe_total [BETA] Cumulative number of a liveness, readiness or startup probe for a container by result.');
    expect(text).toContain('# TYPE prober_probe_duration_seconds histogram');
  });
});

describe('probe_agent_* probe series', () => {
  it('records each phase under its label, and only total with ProbePhaseTimings off', async () => {
    const on = newMetrics();
    const off = newMetrics(parseFeatureGates('ProbePhaseTimings=false'));
    const o = outcome('success', { phases: { queue: 0.0001, helper: 0.0004, connect: 0.001, tls: 0.003, firstByte: 0.004, total: 0.009 } });
    for (const m of [on, off]) m.probeObserver.probeRun(meta('x', 'Readiness', 'u', 'http'), o);
    const phases = async (m: Metrics) =>
      find(await scrape(m), 'probe_agent_probe_phase_duration_seconds_count').map((s) => `${s.labels.protocol}/${s.labels.phase}`).sort();
    expect(await phases(on)).toEqual(['http/connect', 'http/first_byte', 'http/helper', 'http/queue', 'http/tls', 'http/total']);
    expect(await phases(off)).toEqual(['http/total']);
  });

  it('bounds the reason label and counts on-demand probes separately', async () => {
    const m = newMetrics();
    m.probeObserver.probeRun(meta('a'), outcome('failure'));
    m.probeObserver.probeRun(meta('a'), outcome('failure', { reason: 'GET http://10.1.2.3/secret failed' as never }));
    m.probeObserver.probeRun(meta('a', 'Readiness', 'u', 'weird' as never), outcome('success'));
    m.agent.onDemandProbe('grpc', outcome('failure', { reason: 'grpc-not-serving' }));
    const s = await scrape(m);
    expect(find(s, 'probe_agent_probe_results_total', { result: 'failure', reason: 'other' })[0]?.value).toBe(2);
    expect(find(s, 'probe_agent_probe_results_total', { protocol: 'other' })[0]?.value).toBe(1);
    expect(find(s, 'probe_agent_probe_results_total', { probe_type: 'OnDemand', protocol: 'grpc', reason: 'grpc-not-serving' })[0]?.value).toBe(1);
    expect((await m.registry.metrics()).includes('10.1.2.3')).toBe(false);
  });

  it('never throws into the scheduler on malformed input', () => {
    const m = newMetrics();
    const bad = { key: null } as unknown as ProbeRunMeta;
    expect(() => m.probeObserver.workerStarted(bad)).not.toThrow();
    expect(() => m.probeObserver.probeRun(bad, outcome('success'))).not.toThrow();
    expect(() => m.probeObserver.probeRun(meta('n'), { result: 'success', message: '', durationSeconds: NaN, phases: { total: -1 } })).not.toThrow();
    expect(() => m.probeObserver.workerStopped(bad)).not.toThrow();
  });
});

describe('agent self-metrics', () => {
  it('exports feature gates the Kubernetes way (GA stage is empty) and build info', async () => {
    const m = newMetrics(parseFeatureGates('HappyEyeballs=false,WarmNetnsHelper=true'));
    const s = await scrape(m);
    const gates = find(s, 'kubernetes_feature_enabled');
    expect(gates).toHaveLength(Object.keys(FEATURES).length);
    expect(find(s, 'kubernetes_feature_enabled', { name: 'HappyEyeballs' })).toEqual([
      { name: 'kubernetes_feature_enabled', labels: { name: 'HappyEyeballs', stage: 'BETA' }, value: 0 },
    ]);
    expect(find(s, 'kubernetes_feature_enabled', { name: 'WarmNetnsHelper', stage: 'ALPHA' })[0]?.value).toBe(1);
    expect(find(s, 'kubernetes_feature_enabled', { name: 'InNamespaceProbes', stage: '' })[0]?.value).toBe(1);
    expect(find(s, 'probe_agent_build_info')).toEqual([
      {
        name: 'probe_agent_build_info',
        labels: { version: '9.9.9-test', revision: 'unknown', api_version: 'v1alpha1', node_version: process.version },
        value: 1,
      },
    ]);
  });

  it('tracks kubelet polls: errors by bounded kind, last success and staleness', async () => {
    let now = 1_700_000_000_000;
    const m = createMetrics({ gates: new FeatureGates(), version: 't', processMetrics: false, now: () => now });
    now += 4000;
    let s = await scrape(m);
    expect(find(s, 'probe_agent_kubelet_staleness_seconds')[0]?.value).toBe(4);
    expect(find(s, 'probe_agent_kubelet_poll_errors_total', { kind: 'timeout' })[0]?.value).toBe(0);
    m.agent.kubeletPoll(0.05);
    now += 2500;
    m.agent.kubeletPoll(1.5, 'timeout');
    m.agent.kubeletPoll(0.2, 'connect ECONNREFUSED 10.0.0.1:10250');
    s = await scrape(m);
    expect(find(s, 'probe_agent_kubelet_poll_errors_total', { kind: 'timeout' })[0]?.value).toBe(1);
    expect(find(s, 'probe_agent_kubelet_poll_errors_total', { kind: 'other' })[0]?.value).toBe(1);
    expect(find(s, 'probe_agent_kubelet_last_success_timestamp_seconds')[0]?.value).toBe(1_700_000_004);
    expect(find(s, 'probe_agent_kubelet_staleness_seconds')[0]?.value).toBe(2.5);
    expect(find(s, 'probe_agent_kubelet_poll_duration_seconds_count', { result: 'error' })[0]?.value).toBe(2);
    expect(find(s, 'probe_agent_kubelet_poll_duration_seconds_count', { result: 'success' })[0]?.value).toBe(1);
    expect(m.agent.kubeletLastSuccess()).toBe(1_700_000_004_000);
    expect((await m.registry.metrics()).includes('10.0.0.1')).toBe(false);
  });

  it('reads in-flight and queued probes from a real limiter at scrape time', async () => {
    const m = newMetrics();
    const limiter = new FairLimiter({ maxInFlight: 2, maxQueued: 5, maxInFlightPerOwner: 2 });
    m.agent.setLimiterSource(() => ({ inFlight: limiter.inFlight, queued: limiter.queued }));
    const p1 = await limiter.acquire('pod-a');
    const p2 = await limiter.acquire('pod-b');
    const waiting = limiter.acquire('pod-c');
    let s = await scrape(m);
    expect(find(s, 'probe_agent_probes_in_flight')[0]?.value).toBe(2);
    expect(find(s, 'probe_agent_probes_queued')[0]?.value).toBe(1);
    p1.release();
    (await waiting).release();
    p2.release();
    s = await scrape(m);
    expect(find(s, 'probe_agent_probes_in_flight')[0]?.value).toBe(0);
    expect(find(s, 'probe_agent_probes_queued')[0]?.value).toBe(0);
    m.agent.setLimiterSource(() => {
      throw new Error('limiter gone');
    });
    await expect(m.registry.metrics()).resolves.toContain('probe_agent_probes_in_flight');
  });

  it('reads ExecSync\'s parsed-command cache (hits, parses, entries, bytes, evictions) from a real cache at scrape time', async () => {
    const m = newMetrics();
    const cache = new ExecSyncHandlerCache({ maxEntries: 8, maxBytes: 64 * 1024 });
    m.agent.setExecSyncCacheSource(() => cache.stats());
    const cmd = encodeShimCommand('readiness', { tcpSocket: { port: 8080 } }).map((x) => Buffer.from(x));
    for (let i = 0; i < 3; i++) cache.get('c1', cmd);
    cache.get('c2', cmd);
    let s = await scrape(m);
    expect(find(s, 'probe_agent_exec_sync_commands_total', { result: 'hit' })[0]?.value).toBe(2);
    expect(find(s, 'probe_agent_exec_sync_commands_total', { result: 'parsed' })[0]?.value).toBe(2);
    expect(find(s, 'probe_agent_exec_sync_cache_entries')[0]?.value).toBe(2);
    const bytes = find(s, 'probe_agent_exec_sync_cache_bytes')[0]?.value ?? 0;
    expect(bytes).toBe(cache.bytes);
    expect(bytes).toBeGreaterThan(0);
    expect(find(s, 'probe_agent_exec_sync_cache_max_bytes')[0]?.value).toBe(64 * 1024);
    cache.get('c1', cmd);
    for (let i = 3; i <= 10; i++) cache.get(`c${i}`, cmd);
    s = await scrape(m);
    expect(find(s, 'probe_agent_exec_sync_commands_total', { result: 'hit' })[0]?.value).toBe(3);
    expect(find(s, 'probe_agent_exec_sync_cache_entries')[0]?.value).toBe(8);
    expect(find(s, 'probe_agent_exec_sync_cache_evictions_total')[0]?.value).toBe(2);
    // All in one namespace: its share is the whole byte bound, of which it holds a tenth.
    expect(find(s, 'probe_agent_exec_sync_cache_namespaces')[0]?.value).toBe(1);
    expect(find(s, 'probe_agent_exec_sync_cache_namespace_share_bytes')[0]?.value).toBe(64 * 1024);
    expect(find(s, 'probe_agent_exec_sync_cache_namespaces_at_share')[0]?.value).toBe(0);
    cache.get('n1', cmd, 'neighbour');
    s = await scrape(m);
    expect(find(s, 'probe_agent_exec_sync_cache_namespaces')[0]?.value).toBe(2);
    expect(find(s, 'probe_agent_exec_sync_cache_namespace_share_bytes')[0]?.value).toBe(32 * 1024);
  });

  it('counts workers by type and thresholded result from the real results store', async () => {
    const m = newMetrics();
    const store = new ResultsStore();
    m.agent.setResultsSource(store);
    const status = (pod: string, probeType: ProbeType, result: ProbeStatus['result']): ProbeStatus => ({
      key: { podUID: pod, containerName: 'app', probeType },
      namespace: 'ns',
      podName: pod,
      containerID: 'containerd://x',
      result,
      consecutive: 1,
      lastProbeTime: 0,
      lastMessage: '',
      started: true,
      ready: result === 'success',
      onHold: false,
    });
    store.upsert(status('a', 'Readiness', 'success'));
    store.upsert(status('b', 'Readiness', 'success'));
    store.upsert(status('c', 'Readiness', 'failure'));
    store.upsert(status('a', 'Liveness', 'error'));
    let s = await scrape(m);
    expect(find(s, 'probe_agent_workers')).toHaveLength(12);
    expect(find(s, 'probe_agent_workers', { probe_type: 'Readiness', result: 'success' })[0]?.value).toBe(2);
    expect(find(s, 'probe_agent_workers', { probe_type: 'Readiness', result: 'failure' })[0]?.value).toBe(1);
    expect(find(s, 'probe_agent_workers', { probe_type: 'Liveness', result: 'error' })[0]?.value).toBe(1);
    store.upsert(status('c', 'Readiness', 'success'));
    s = await scrape(m);
    expect(find(s, 'probe_agent_workers', { probe_type: 'Readiness', result: 'failure' })[0]?.value).toBe(0);
    expect(find(s, 'probe_agent_workers', { probe_type: 'Readiness', result: 'success' })[0]?.value).toBe(3);
  });

  it('exports pods, helper, netns and gRPC series with bounded labels', async () => {
    const m = newMetrics();
    m.agent.setPodCounts({ ours: 7, notOurs: { 'host-network': 2, 'exec-only': 1 } });
    m.agent.helperSpawn(0.0012, true);
    m.agent.helperSpawn(0.03, false, 'spawn');
    m.agent.helperSpawn(0.01, true, '/usr/bin/evil');
    m.agent.helperRestart();
    m.agent.netnsResolve('cri', 'ok', 0.004);
    m.agent.netnsResolve('procfs', 'not-found', 0.02);
    m.agent.netnsResolve('/proc/1/ns/net', 'pod abc not found', 0.02);
    m.agent.grpcRequest('/probeagent.v1alpha1.ProbeService/Probe', 0, 0.01);
    m.agent.grpcRequest('/probeagent.v1alpha1.ProbeService/Probe', 'NOT_FOUND', 0.01);
    m.agent.grpcRequest('../../etc/passwd', 99, 0.01);
    const s = await scrape(m);
    expect(Object.fromEntries(find(s, 'probe_agent_pods').map((x) => [x.labels.state, x.value]))).toEqual({
      ours: 7, 'no-network-probes': 0, 'exec-only': 1, 'host-network': 2, 'sandboxed-runtime': 0,
    });
    expect(find(s, 'probe_agent_helper_spawns_total').map((x) => `${x.labels.mode}/${x.labels.result}=${x.value}`).sort()).toEqual([
      'other/success=1', 'resident/success=1', 'spawn/failure=1',
    ]);
    expect(find(s, 'probe_agent_helper_restarts_total')[0]?.value).toBe(1);
    expect(find(s, 'probe_agent_netns_resolutions_total').map((x) => `${x.labels.resolver}/${x.labels.outcome}`).sort()).toEqual([
      'cri/ok', 'other/other', 'procfs/not-found',
    ]);
    expect(find(s, 'probe_agent_grpc_requests_total').map((x) => `${x.labels.method} ${x.labels.code}`).sort()).toEqual([
      '/probeagent.v1alpha1.ProbeService/Probe NOT_FOUND', '/probeagent.v1alpha1.ProbeService/Probe OK', 'other UNKNOWN',
    ]);
  });
});

describe('health registry', () => {
  it('runs liveness checks everywhere and readiness checks on readyz only', async () => {
    const h = new HealthRegistry();
    let kubeletOk = false;
    h.addReadiness('kubelet', () => {
      if (!kubeletOk) throw new Error('no successful kubelet poll yet');
    });
    try {
      expect(h.names('livez')).toEqual(['ping', 'eventloop']);
      expect(h.names('readyz')).toEqual(['ping', 'eventloop', 'shutdown', 'kubelet']);
      expect((await h.run('livez')).ok).toBe(true);
      const r = await h.run('readyz');
      expect(r.ok).toBe(false);
      expect(r.checks.find((c) => c.name === 'kubelet')).toEqual({ name: 'kubelet', ok: false, reason: 'no successful kubelet poll yet' });
      expect(renderHealth('readyz', r, true).body).toBe(
        '[+]ping ok\n[+]eventloop ok\n[+]shutdown ok\n[-]kubelet failed: no successful kubelet poll yet\nreadyz check failed\n',
      );
      expect(renderHealth('readyz', r, false)).toEqual({
        status: 500,
        body: '[+]ping ok\n[+]eventloop ok\n[+]shutdown ok\n[-]kubelet failed: reason withheld\nreadyz check failed\n',
      });
      expect((await h.run('readyz', ['kubelet', 'nope'])).unknownExcludes).toEqual(['nope']);
      expect((await h.run('readyz', ['kubelet'])).ok).toBe(true);
      kubeletOk = true;
      expect(renderHealth('readyz', await h.run('readyz'), false)).toEqual({ status: 200, body: 'ok' });
      h.markShuttingDown();
      expect((await h.runOne('readyz', 'shutdown'))?.reason).toBe('process is shutting down');
      expect(await h.runOne('livez', 'kubelet')).toBeUndefined();
    } finally {
      h.close();
    }
  });

  it('times out a hanging check, aborting its signal', async () => {
    const h = new HealthRegistry();
    let aborted = false;
    h.addReadiness('helper', (signal) => new Promise<void>(() => signal.addEventListener('abort', () => { aborted = true; })), { timeoutMs: 100 });
    try {
      const t0 = performance.now();
      const r = await h.runOne('readyz', 'helper');
      expect(performance.now() - t0).toBeLessThan(10_000);
      expect(r).toEqual({ name: 'helper', ok: false, reason: 'timed out after 0.1s' });
      expect(aborted).toBe(true);
    } finally {
      h.close();
    }
  });

  it('shares one in-flight run between concurrent requests and honours cacheMs', async () => {
    const h = new HealthRegistry();
    let runs = 0;
    h.addReadiness('selftest', async () => {
      runs++;
      await new Promise((r) => setTimeout(r, 50));
    });
    h.addReadiness('cached', () => {
      runs += 100;
    }, { cacheMs: 60_000 });
    try {
      await Promise.all([h.run('readyz'), h.run('readyz'), h.run('readyz')]);
      expect(runs).toBe(101);
      await h.run('readyz');
      expect(runs).toBe(102);
    } finally {
      h.close();
    }
  });

  it('rejects bad or duplicate names and flattens multi-line reasons', async () => {
    const h = new HealthRegistry();
    try {
      expect(() => h.addLiveness('Bad Name', () => {})).toThrow(/lowercase/);
      expect(() => h.addLiveness('ping', () => {})).toThrow(/already registered/);
      h.addReadiness('multi', () => {
        throw new Error(`line1\nline2 ${'x'.repeat(1000)}`);
      });
      const r = await h.runOne('readyz', 'multi');
      expect(r?.reason?.includes('\n')).toBe(false);
      expect(r?.reason?.length).toBeLessThanOrEqual(303);
    } finally {
      h.close();
    }
  });

  it('freshnessCheck fails before the first success and after the bound', () => {
    let now = 100_000;
    let last: number | undefined;
    const check = freshnessCheck('kubelet poll', () => last, 30, () => now);
    const signal = new AbortController().signal;
    expect(() => check(signal)).toThrow('no successful kubelet poll yet');
    last = now;
    now += 29_000;
    expect(() => check(signal)).not.toThrow();
    now += 2_000;
    expect(() => check(signal)).toThrow('last successful kubelet poll 31.0s ago (bound 30s)');
  });
});

describe('logging', () => {
  it('never throws on unserialisable fields, in either format', () => {
    const lines: string[] = [];
    const circular: Record<string, unknown> = { a: 1 };
    circular.self = circular;
    for (const format of ['json', 'text'] as const) {
      const log = createLogger({ format, write: (l) => lines.push(l) });
      expect(() => log.info('odd fields', { big: 10n, circular, err: new Error('boom') })).not.toThrow();
    }
    const json = JSON.parse(lines[0] as string) as Record<string, unknown>;
    expect(json).toMatchObject({ level: 'info', msg: 'odd fields', big: '10', circular: { a: 1, self: '[Circular]' }, err: { message: 'boom' } });
    expect(lines[1]).toMatch(/INFO  "odd fields" big="10"/);
    const throwing = createLogger({ write: () => { throw new Error('EPIPE'); } });
    expect(() => throwing.error('still fine')).not.toThrow();
  });

  it('logs result transitions at info and plain updates at debug', () => {
    const lines: string[] = [];
    const store = new ResultsStore();
    const info = createLogger({ level: 'info', write: (l) => lines.push(l) });
    const unsubscribe = logProbeTransitions(store, info);
    const base: ProbeStatus = {
      key: { podUID: 'u1', containerName: 'app', probeType: 'Readiness' },
      namespace: 'shop', podName: 'web-0', containerID: 'containerd://a', result: 'failure', consecutive: 1,
      lastProbeTime: 0, lastMessage: 'HTTP probe failed with statuscode: 503', lastReason: 'status',
      started: true, ready: false, onHold: false,
    };
    store.upsert(base);
    store.upsert({ ...base, result: 'success', ready: true, lastMessage: '', lastReason: undefined });
    store.upsert({ ...base, result: 'success', ready: true, containerID: 'containerd://b' });
    unsubscribe();
    expect(lines).toHaveLength(1);
    expect(JSON.parse(lines[0] as string)).toMatchObject({
      level: 'info', msg: 'probe result changed', component: 'prober', pod: 'shop/web-0', container: 'app',
      probe_type: 'Readiness', result: 'success', previous: 'failure',
    });
  });
});
