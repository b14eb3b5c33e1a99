/**
 * A real Prometheus (test/lab/prometheus.ts) scraping the RUNNING daemon: `probe-agent run` probes
 * lab pods (netns on a bridge, node->pod traffic dropped) that a test kubelet lists, and the test
 * reads back, through the Prometheus HTTP API, kubelet's prober_probe_total with kubelet's labels
 * and the agent's own series; `promtool check metrics` accepts both real scrapes; a pod deleted
 * from the kubelet loses its prober_* series in the scrape and in Prometheus; and every panel query
 * of the Grafana dashboard (deploy/components/alerts) returns series for this agent's node.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'promtool']);

import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { Command } from 'commander';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { registerRunCommand } from '../../agent/cli/run-command.ts';
import { FEATURES, type FeatureName } from '../../agent/featuregates.ts';
import { kubernetesStageLabel } from '../../agent/metrics/registry.ts';
import { AGENT_VERSION, API_VERSION } from '../../agent/version.ts';
import { createLab, type Lab } from '../lab/lab.ts';
import { createMemoryCgroup, type MemoryCgroup } from '../lab/memory-cgroup.ts';
import { startPrometheus, type RunningPrometheus, type Sample } from '../lab/prometheus.ts';
import { startAgent, type AgentHandle } from '../support/agent-harness.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { makePod } from '../support/pod-factory.ts';
import { dashboardQueries, readsShimMetrics, SHIM_METRICS, substitute } from '../support/dashboard.ts';

const PROMETHEUS = process.env.PROMETHEUS_BIN ?? '/usr/bin/prometheus';
const NS = 'prom-e2e';
/** The node label the deploy monitors put on the agent's target (the dashboard's $node). */
const NODE = 'lab-node';
/** The agent's memory limit here: a real cgroup, so probe_agent_memory_limit_bytes has a value. */
const MEMORY_LIMIT = 1024 * 1024 * 1024;
const DASHBOARD = new URL('../../deploy/components/alerts/probe-agent-dashboard.json', import.meta.url);

let lab: Lab;
let kubelet: FakeKubelet;
let agent: AgentHandle;
let prom: RunningPrometheus;
let webPod: Record<string, unknown>;
let dbPod: Record<string, unknown>;
let startedAt: number;
let cgroup: MemoryCgroup | undefined;

const uidOf = (pod: Record<string, unknown>): string => (pod.metadata as { uid: string }).uid;
const appOf = (pod: Record<string, unknown>): Record<string, unknown> =>
  (pod.spec as { containers: Record<string, unknown>[] }).containers[0] as Record<string, unknown>;

/** `name` samples of one job, keyed by "pod/probe_type/result". */
function byProbe(samples: Sample[]): Record<string, Sample> {
  return Object.fromEntries(samples.map((s) => [`${s.metric.pod}/${s.metric.probe_type}/${s.metric.result}`, s]));
}

/** Runs `promtool check metrics` on a scrape; returns its exit status and what it said. */
function promtoolCheck(text: string): { status: number | null; output: string } {
  const r = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8', timeout: 20_000 });
  return { status: r.status, output: `${r.stdout}${r.stderr}`.trim() };
}

beforeAll(async () => {
  if (!existsSync(PROMETHEUS)) throw new Error(`this test needs Prometheus at ${PROMETHEUS}: run \`make test\`, which installs it`);
  lab = await createLab({ pods: 2, policy: 'drop', tag: 'prom-agent' });
  const [p1, p2] = lab.pods;
  await Promise.all([lab.startServer(p1!, { http: 8080 }), lab.startServer(p2!, { tcp: 5432 })]);
  webPod = makePod({ name: 'web', namespace: NS, ips: p1!.ips, probe: 'http', port: 8080 });
  Object.assign(appOf(webPod), {
    readinessProbe: { httpGet: { path: '/healthz', port: 8080 }, periodSeconds: 1 },
    livenessProbe: { httpGet: { path: '/healthz', port: 'http' }, periodSeconds: 1, failureThreshold: 1000 },
  });
  dbPod = makePod({ name: 'db', namespace: NS, ips: p2!.ips, probe: 'tcp', port: 5432 });
  // Nothing listens on 5433: a readiness probe that fails (refused) on every run.
  Object.assign(appOf(dbPod), {
    livenessProbe: { tcpSocket: { port: 5432 }, periodSeconds: 1 },
    readinessProbe: { tcpSocket: { port: 5433 }, periodSeconds: 1 },
  });
  kubelet = await FakeKubelet.start({ pods: [webPod, dbPod] });
  startedAt = Date.now() / 1000;
  agent = await startAgent({ kubeletUrl: kubelet.httpUrl, args: ['--feature-gates=HappyEyeballs=false'] });
  cgroup = createMemoryCgroup('prom-agent', MEMORY_LIMIT);
  cgroup.add(agent.pid);
  const address = agent.metricsUrl.replace(/^http:\/\//, '');
  prom = await startPrometheus({
    targets: [
      { job: 'probe-agent', address, labels: { node: NODE } },
      { job: 'probe-agent-probes', address, path: '/metrics/probes' },
    ],
  });
}, 45_000);

afterAll(async () => {
  await prom?.stop();
  await agent?.stop('SIGKILL').catch(() => {});
  await kubelet?.stop();
  await lab?.destroy();
  cgroup?.destroy();
});

describe('Prometheus scraping the running daemon', () => {
  it('scrapes /metrics and /metrics/probes', async () => {
    const up = await prom.waitFor('up', (s) => s.length === 2 && s.every((x) => x.value === 1), 30_000);
    expect(up.map((s) => s.metric.job).sort()).toEqual(['probe-agent', 'probe-agent-probes']);
  });

  it('reads kubelet\'s prober_probe_total back for the lab pods, with kubelet\'s labels', async () => {
    const q = `prober_probe_total{job="probe-agent-probes",namespace="${NS}"}`;
    const samples = byProbe(await prom.waitFor(q, (s) => s.length === 4 && s.every((x) => x.value >= 1)));
    expect(Object.keys(samples).sort()).toEqual([
      'db/Liveness/successful', 'db/Readiness/failed', 'web/Liveness/successful', 'web/Readiness/successful',
    ]);
    const { __name__, instance, ...labels } = samples['web/Readiness/successful']!.metric;
    expect(__name__).toBe('prober_probe_total');
    expect(instance).toBe(agent.metricsUrl.replace(/^http:\/\//, ''));
    expect(labels).toEqual({
      job: 'probe-agent-probes', container: 'app', namespace: NS, pod: 'web', pod_uid: uidOf(webPod), probe_type: 'Readiness', result: 'successful',
    });
    expect(samples['db/Readiness/failed']!.metric.pod_uid).toBe(uidOf(dbPod));
    // The same counters on /metrics; the values only grow between the scrape Prometheus took and a later one.
    const direct = (await agent.http('/metrics/probes')).body;
    const line = direct.split('\n').find((l) => l.startsWith('prober_probe_total{') && l.includes('pod="web"') && l.includes('probe_type="Readiness"'));
    expect(Number(line?.split(' ').at(-1))).toBeGreaterThanOrEqual(samples['web/Readiness/successful']!.value);
    const viaMain = await prom.query(`sum(prober_probe_total{job="probe-agent",namespace="${NS}"})`);
    expect(viaMain[0]?.value).toBeGreaterThanOrEqual(4);
  });

  it('reads the per-phase histogram: every HTTP probe got its socket from the netns helper', async () => {
    const buckets = await prom.waitFor('probe_agent_probe_phase_duration_seconds_bucket{job="probe-agent",protocol="http",phase="helper"}');
    const les = buckets.map((b) => b.metric.le ?? '');
    expect(les).toContain('+Inf');
    // Cumulative buckets: non-decreasing with le, ending at the count.
    const sorted = [...buckets].sort((a, b) => Number(a.metric.le === '+Inf' ? Infinity : a.metric.le) - Number(b.metric.le === '+Inf' ? Infinity : b.metric.le));
    for (let i = 1; i < sorted.length; i++) expect(sorted[i]!.value).toBeGreaterThanOrEqual(sorted[i - 1]!.value);
    const inf = sorted.at(-1)!.value;
    const [count] = await prom.query('probe_agent_probe_phase_duration_seconds_count{job="probe-agent",protocol="http",phase="helper"}');
    expect(count?.value).toBe(inf);
    const [total] = await prom.query('probe_agent_probe_phase_duration_seconds_count{job="probe-agent",protocol="http",phase="total"}');
    expect(inf).toBeGreaterThanOrEqual(2);
    expect(inf).toBe(total?.value);
    const phases = await prom.query('count by (phase) (probe_agent_probe_phase_duration_seconds_count{job="probe-agent",protocol="http"})');
    expect(phases.map((p) => p.metric.phase).sort()).toEqual(['connect', 'first_byte', 'helper', 'queue', 'total']);
  });

  it('reads the kubelet freshness, the feature gates and the build info', async () => {
    const [last] = await prom.waitFor('probe_agent_kubelet_last_success_timestamp_seconds{job="probe-agent"}', (s) => (s[0]?.value ?? 0) > 0);
    expect(last!.value).toBeGreaterThanOrEqual(Math.floor(startedAt));
    expect(last!.value).toBeLessThanOrEqual(Date.now() / 1000 + 1);
    await prom.waitFor('probe_agent_kubelet_last_success_timestamp_seconds{job="probe-agent"}', (s) => (s[0]?.value ?? 0) > last!.value, 10_000);

    const gates = await prom.query('kubernetes_feature_enabled{job="probe-agent"}');
    const want = (Object.keys(FEATURES) as FeatureName[]).map((name) => {
      const stage = kubernetesStageLabel(FEATURES[name].stage);
      const enabled = name === 'HappyEyeballs' ? false : FEATURES[name].default;
      // Prometheus drops empty labels: a GA gate has no stage label at all.
      return `${name}/${stage || '-'}/${enabled ? 1 : 0}`;
    }).sort();
    expect(gates.map((g) => `${g.metric.name}/${g.metric.stage ?? '-'}/${g.value}`).sort()).toEqual(want);

    const build = await prom.query('probe_agent_build_info{job="probe-agent"}');
    expect(build).toHaveLength(1);
    expect(build[0]!.value).toBe(1);
    expect(build[0]!.metric).toMatchObject({ version: AGENT_VERSION, api_version: API_VERSION, node_version: process.version });
  });

  it('passes promtool check metrics on both real scrapes', async () => {
    for (const path of ['/metrics', '/metrics/probes']) {
      const res = await agent.http(path);
      expect(res.status).toBe(200);
      expect(res.body).toContain(path === '/metrics' ? 'probe_agent_build_info{' : 'prober_probe_total{');
      expect(promtoolCheck(res.body), path).toEqual({ status: 0, output: '' });
    }
    // And promtool is not a rubber stamp: a counter without _total is a lint problem.
    const bad = promtoolCheck('# HELP probe_bad A counter.\n# TYPE probe_bad counter\nprobe_bad 1\n');
    expect(bad.status).not.toBe(0);
    expect(bad.output).toMatch(/counter metrics should have "_total" suffix/);
  });

  it('exports the memory limit of the agent\'s real cgroup', async () => {
    const [limit] = await prom.waitFor(`probe_agent_memory_limit_bytes{job="probe-agent",node="${NODE}"}`);
    expect(limit!.value).toBe(MEMORY_LIMIT);
    // The gauge is the latest /readyz verdict; kubelet's readinessProbe asks in a cluster, the test asks here.
    expect((await agent.http('/readyz')).status).toBe(200);
    const [ready] = await prom.waitFor(`probe_agent_ready{job="probe-agent",node="${NODE}"}`, (s) => s[0]?.value === 1);
    expect(ready!.metric.instance).toBe(agent.metricsUrl.replace(/^http:\/\//, ''));
  });

  it('answers every panel query of the Grafana dashboard with series for this node', async () => {
    const dashboard = JSON.parse(readFileSync(DASHBOARD, 'utf8'));
    // The node variable, run as Grafana runs label_values(selector, label).
    const variable = dashboard.templating.list.find((v: { name: string }) => v.name === 'node');
    const m = /^label_values\((.+),\s*(\w+)\)$/.exec(variable.query.query as string);
    expect(m, variable.query.query).not.toBeNull();
    const nodes = (await prom.waitFor(`group by (${m![2]}) (${m![1]})`)).map((s) => s.metric[m![2]!]!);
    expect(nodes).toEqual([NODE]);
    // Grafana's "All" is the variable's allValue; a single pick is the node itself: both must work.
    const selections: Record<string, string[]>[] = [{ node: [variable.allValue as string] }, { node: nodes }];

    const queries = dashboardQueries(dashboard);
    expect(queries.length).toBeGreaterThanOrEqual(15);
    const agentQueries = queries.filter((q) => !readsShimMetrics(q.expr));
    const shimQueries = queries.filter((q) => readsShimMetrics(q.expr));
    expect(shimQueries.length).toBeGreaterThanOrEqual(5);
    for (const vars of selections) {
      for (const q of agentQueries) {
        const expr = substitute(q.expr, vars, '30s');
        const samples = await prom.waitFor(expr, (s) => s.length > 0, 30_000).catch((err: unknown) => {
          throw new Error(`panel "${q.panel}" ${q.refId}: ${String(err)}`);
        });
        // Every series of a panel is this node's (or aggregated away from it): nothing leaks in from elsewhere.
        for (const s of samples) if (s.metric.node !== undefined) expect(s.metric.node, `${q.panel} ${q.refId}`).toBe(NODE);
      }
    }
    // The shim panels read the shim's counters, which the agent relays from a kubelet shim at
    // /metrics/shim. This tree's agent has no relay (no --shim-metrics-socket: that is another
    // branch's work), so no shim series can exist here: the shim panels' queries must still be valid
    // PromQL over the agreed families only, and return nothing. Once the relay is in the tree this
    // fails on purpose: then start a shim here (as shim-probes.test.ts does) with its metrics socket,
    // pass it to the agent, scrape /metrics/shim with metrics_path="/metrics/shim" (docs/runbooks.md)
    // and require series from the shim panels too.
    const runFlags = new Command();
    registerRunCommand(runFlags);
    const relayFlag = runFlags.commands.find((c) => c.name() === 'run')!.options.some((o) => o.long === '--shim-metrics-socket');
    expect(relayFlag, 'the agent relays the shim now: run a shim in this test and require series from the shim panels').toBe(false);
    expect((await agent.http('/metrics')).body).not.toContain('probe_agent_shim_');
    for (const q of shimQueries) {
      const names = [...q.expr.matchAll(/probe_agent_shim_\w+/g)].map((x) => x[0].replace(/_(bucket|count|sum)$/, ''));
      for (const n of names) expect(SHIM_METRICS as readonly string[], `${q.panel}: ${n}`).toContain(n);
      expect(await prom.query(substitute(q.expr, { node: nodes }, '30s')), `${q.panel} ${q.refId}`).toEqual([]);
    }
  }, 120_000);

  it('drops a deleted pod\'s prober_probe_total series from the scrape and from Prometheus', async () => {
    await prom.waitFor(`prober_probe_total{job="probe-agent-probes",pod="db"}`, (s) => s.length === 2);
    kubelet.setPods([webPod]);
    const end = Date.now() + 10_000;
    let body = '';
    for (;;) {
      body = (await agent.http('/metrics/probes')).body;
      if (!body.includes('pod="db"') || Date.now() > end) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(body).not.toContain('pod="db"');
    expect(body).toMatch(/prober_probe_total\{[^}]*pod="web"/);
    // Gone from the next scrape: Prometheus marks the series stale, an instant query no longer has it.
    await prom.waitFor(`prober_probe_total{job="probe-agent-probes",pod="db"}`, (s) => s.length === 0);
    const left = await prom.query(`prober_probe_total{job="probe-agent-probes",namespace="${NS}"}`);
    expect(left.map((s) => s.metric.pod)).toEqual(['web', 'web']);
  });
});
