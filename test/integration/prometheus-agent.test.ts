/**
 * A real Prometheus (test/lab/prometheus.ts) scraping the RUNNING daemon: `probe-agent run` probes
 * lab pods (netns on a bridge, node->pod traffic dropped) that a test kubelet lists, and the test
 * reads back, through the Prometheus HTTP API, kubelet's prober_probe_total with kubelet's labels
 * and the agent's own series; `promtool check metrics` accepts both real scrapes; a pod deleted
 * from the kubelet loses its prober_* series in the scrape and in Prometheus; and every panel query
 * of the Grafana dashboard (deploy/components/alerts) returns series for this agent's node. A real
 * `probe-agent shim` process (before a grpc-js stand-in runtime) takes kubelet-shaped CRI calls:
 * ordinary ones pass through, rewritten probes and a hook are answered through the agent, which
 * relays the shim's counters at /metrics/shim; Prometheus scrapes that path too, as the deploy
 * monitors do (job="probe-agent" with a metrics_path label), so the shim panels have series and the
 * alert rules' `up` selectors tell the agent's target from the relay's.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'promtool']);

import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { encodeShimCommand } from '../../agent/contract/shim-command.ts';
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
import { builtEntry } from '../support/built-cli.ts';
import { KubeletCri, RUNTIME_SERVICE, type CriAnswer } from '../support/kubelet-cri.ts';
import { startShimProcess, type ShimProcess } from '../support/shim-process.ts';

const PROMETHEUS = process.env.PROMETHEUS_BIN ?? '/usr/bin/prometheus';
const NS = 'prom-e2e';
/** The node label the deploy monitors put on the agent's target (the dashboard's $node). */
const NODE = 'lab-node';
/** The agent's memory limit here: a real cgroup, so probe_agent_memory_limit_bytes has a value. */
const MEMORY_LIMIT = 1024 * 1024 * 1024;
const DASHBOARD = new URL('../../deploy/components/alerts/probe-agent-dashboard.json', import.meta.url);
const RULES = new URL('../../deploy/components/alerts/probe-agent.rules.yaml', import.meta.url);

let lab: Lab;
let kubelet: FakeKubelet;
let agent: AgentHandle;
let prom: RunningPrometheus;
let webPod: Record<string, unknown>;
let dbPod: Record<string, unknown>;
let startedAt: number;
let cgroup: MemoryCgroup | undefined;
let scratch: string | undefined;
let runtime: grpc.Server | undefined;
let shim: ShimProcess | undefined;
let cri: KubeletCri | undefined;
/** The shim's metrics socket, which the agent relays at /metrics/shim. */
let shimMetricsSocket: string;

const uidOf = (pod: Record<string, unknown>): string => (pod.metadata as { uid: string }).uid;
const appOf = (pod: Record<string, unknown>): Record<string, unknown> =>
  (pod.spec as { containers: Record<string, unknown>[] }).containers[0] as Record<string, unknown>;

/** `name` samples of one job, keyed by "pod/probe_type/result". */
function byProbe(samples: Sample[]): Record<string, Sample> {
  return Object.fromEntries(samples.map((s) => [`${s.metric.pod}/${s.metric.probe_type}/${s.metric.result}`, s]));
}

/** The app container's ID as kubelet names it in ExecSync (the pod's containerID without its runtime prefix). */
function containerIdOf(pod: Record<string, unknown>): string {
  const statuses = (pod.status as { containerStatuses: { containerID: string }[] }).containerStatuses;
  return statuses[0]!.containerID.replace(/^[a-z]+:\/\//, '');
}

/** The exit code of an ExecSync answer; throws with the gRPC status when there is none. */
function exitCode(a: CriAnswer<{ exitCode: number }>): number {
  if (!a.ok) throw new Error(`expected an exit code, got gRPC ${grpc.status[a.code]}: ${a.details}`);
  return a.msg.exitCode;
}

/** The `expr:` of one single-line alert rule in the rules file. */
function ruleExpr(alert: string): string {
  const m = new RegExp(`- alert: ${alert}\\n\\s+expr: (.+)\\n`).exec(readFileSync(RULES, 'utf8'));
  if (!m) throw new Error(`no single-line expr for ${alert} in ${RULES.pathname}`);
  return m[1]!;
}

/**
 * A stand-in CRI runtime (grpc-js on a unix socket): what the shim forwards ordinary calls to.
 * Version answers; everything else is left unimplemented (the shim forwards it all the same).
 */
async function startStandInRuntime(socketPath: string): Promise<grpc.Server> {
  const server = new grpc.Server();
  const version = RUNTIME_SERVICE['Version'] as grpc.MethodDefinition<object, object>;
  server.register(version.path, (_c: unknown, cb: grpc.sendUnaryData<object>) => cb(null, { version: '0.1.0', runtimeName: 'stand-in', runtimeVersion: '1', runtimeApiVersion: 'v1' }), version.responseSerialize, version.requestDeserialize, 'unary');
  await new Promise<void>((resolve, reject) => server.bindAsync(`unix:${socketPath}`, grpc.ServerCredentials.createInsecure(), (e) => (e ? reject(e) : resolve())));
  return server;
}

/** Runs `promtool check metrics` on a scrape; returns its exit status and what it said. */
function promtoolCheck(text: string): { status: number | null; output: string } {
  const r = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8', timeout: 20_000 });
  return { status: r.status, output: `${r.stdout}${r.stderr}`.trim() };
}

beforeAll(async () => {
  if (!existsSync(PROMETHEUS)) throw new Error(`this test needs Prometheus at ${PROMETHEUS}: run \`make test\`, which installs it`);
  const cli = builtEntry('cli.js');
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

  // The kubelet shim, as the host service runs it, before a stand-in runtime; its agent socket is a
  // link made once the agent is up, so a hook sent now has to wait for the agent.
  scratch = mkdtempSync(path.join(tmpdir(), 'prom-agent-shim-'));
  mkdirSync(path.join(scratch, 'shim'), { mode: 0o700 });
  shimMetricsSocket = path.join(scratch, 'shim', 'metrics.sock');
  const probeLink = path.join(scratch, 'probe.sock');
  runtime = await startStandInRuntime(path.join(scratch, 'rt.sock'));
  shim = await startShimProcess(cli, path.join(scratch, 'cri.sock'), [
    `--runtime-endpoint=unix://${path.join(scratch, 'rt.sock')}`, `--probe-socket=${probeLink}`,
    `--metrics-socket=${shimMetricsSocket}`, '--hook-agent-wait=60s', '--agent-grace=1s',
  ]);
  cri = new KubeletCri(shim.listenPath);
  const waitingHook = cri.execSync(containerIdOf(webPod), encodeShimCommand('postStart', { httpGet: { path: '/healthz', port: 8080 } }), 0);

  startedAt = Date.now() / 1000;
  agent = await startAgent({ kubeletUrl: kubelet.httpUrl, args: ['--feature-gates=HappyEyeballs=false', `--shim-metrics-socket=${shimMetricsSocket}`] });
  symlinkSync(agent.socket, probeLink);
  cgroup = createMemoryCgroup('prom-agent', MEMORY_LIMIT);
  cgroup.add(agent.pid);
  // The hook waited for the agent and ran once it came (probe_agent_shim_hook_waits_total{outcome="ran"}).
  expect(exitCode(await waitingHook)).toBe(0);

  const address = agent.metricsUrl.replace(/^http:\/\//, '');
  prom = await startPrometheus({
    targets: [
      { job: 'probe-agent', address, labels: { node: NODE } },
      { job: 'probe-agent-probes', address, path: '/metrics/probes' },
      // As the pod-monitor/service-monitor components scrape the relay: same job, a metrics_path label.
      { job: 'probe-agent', jobName: 'probe-agent-shim', address, path: '/metrics/shim', labels: { node: NODE }, metricsPathLabel: true },
    ],
  });
}, 90_000);

afterAll(async () => {
  cri?.close();
  await shim?.stop();
  await prom?.stop();
  await agent?.stop('SIGKILL').catch(() => {});
  await new Promise<void>((resolve) => (runtime ? runtime.tryShutdown(() => resolve()) : resolve()));
  if (scratch) rmSync(scratch, { recursive: true, force: true });
  await kubelet?.stop();
  await lab?.destroy();
  cgroup?.destroy();
});

describe('Prometheus scraping the running daemon', () => {
  it('scrapes /metrics, /metrics/probes and the shim relay /metrics/shim', async () => {
    const up = await prom.waitFor('up', (s) => s.length === 3 && s.every((x) => x.value === 1), 30_000);
    expect(up.map((s) => `${s.metric.job} ${s.metric.metrics_path ?? '-'}`).sort()).toEqual(['probe-agent -', 'probe-agent /metrics/shim', 'probe-agent-probes -']);
    // The alert rules' selectors: the agent's own target, and the relay's, one each on this node.
    const own = await prom.query('up{job="probe-agent",metrics_path!="/metrics/shim"}');
    expect(own.map((s) => [s.metric.node, s.value])).toEqual([[NODE, 1]]);
    const relay = await prom.query('up{job="probe-agent",metrics_path="/metrics/shim"}');
    expect(relay.map((s) => [s.metric.node, s.value])).toEqual([[NODE, 1]]);
  });

  it('reads the shim\'s counters through the relay: calls passed through, probes and hooks answered through the agent', async () => {
    const c = cri!;
    const version = await c.call<{ runtimeName: string }>('Version', { version: 'v1' });
    expect(version.ok && version.msg.runtimeName).toBe('stand-in');
    // Not implemented by the stand-in: forwarded all the same, the runtime's answer passed back.
    const list = await c.call('ListContainers', {});
    expect(list.ok ? 'ok' : grpc.status[list.code]).toBe('UNIMPLEMENTED');
    // Rewritten probes, answered by the agent inside the pods' netns: success, failure, error.
    expect(exitCode(await c.execSync(containerIdOf(webPod), encodeShimCommand('readiness', { httpGet: { path: '/healthz', port: 8080 } }), 1))).toBe(0);
    expect(exitCode(await c.execSync(containerIdOf(dbPod), encodeShimCommand('liveness', { tcpSocket: { port: 5433 } }), 1))).not.toBe(0);
    shim!.expectLogs({ level: 'warn', msg: 'rewritten handler not run', line: /"code":3,"error":"probe-agent: invalid rewritten command: probe-agent exec command: handler is not base64url"/, why: 'a malformed rewritten command, on purpose' });
    const bad = await c.execSync(containerIdOf(webPod), ['/.probe-agent/v1', 'readiness', '%%%'], 1);
    expect(bad.ok, 'a malformed rewritten command is a gRPC error').toBe(false);

    const series = (q: string) => prom.waitFor(q, (s) => s.length > 0 && s.every((x) => x.value >= 1), 30_000);
    await series(`probe_agent_shim_forwarded_total{job="probe-agent",node="${NODE}",method="Version"}`);
    await series(`probe_agent_shim_forwarded_total{job="probe-agent",node="${NODE}",method="ListContainers"}`);
    const answers = await prom.waitFor(`probe_agent_shim_intercepted_total{job="probe-agent",node="${NODE}"}`, (s) => s.length >= 4, 30_000);
    // The malformed command names its kind (cmd[1], all the shim reads of it); the agent refused it.
    expect(answers.map((s) => `${s.metric.kind}/${s.metric.answer}`).sort()).toEqual(['liveness/failure', 'postStart/success', 'readiness/error', 'readiness/success']);
    await series(`probe_agent_shim_agent_errors_total{job="probe-agent",node="${NODE}",cause="bad_command"}`);
    await series(`probe_agent_shim_hook_waits_total{job="probe-agent",node="${NODE}",outcome="ran"}`);
    await series(`probe_agent_shim_intercept_duration_seconds_count{job="probe-agent",node="${NODE}",kind="readiness"}`);
    const [runtimeErrors] = await prom.waitFor(`probe_agent_shim_runtime_errors_total{job="probe-agent",node="${NODE}"}`);
    expect(runtimeErrors!.value).toBe(0);
    // The families the dashboard was written against are exactly the ones the real shim exposes.
    const relayed = (await agent.http('/metrics/shim')).body;
    const families = [...relayed.matchAll(/^# TYPE (\w+) /gm)].map((x) => x[1]);
    expect(families.sort()).toEqual([...SHIM_METRICS].sort());
    // The relay's series carry the relay target's labels only: never the agent's own families.
    expect(await prom.query('probe_agent_build_info{metrics_path="/metrics/shim"}')).toEqual([]);
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

  it('passes promtool check metrics on the three real scrapes', async () => {
    const family = { '/metrics': 'probe_agent_build_info{', '/metrics/probes': 'prober_probe_total{', '/metrics/shim': 'probe_agent_shim_intercepted_total{' };
    for (const [p, name] of Object.entries(family)) {
      const res = await agent.http(p);
      expect(res.status).toBe(200);
      expect(res.body).toContain(name);
      expect(promtoolCheck(res.body), p).toEqual({ status: 0, output: '' });
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
    // probe_agent_ready is the latest /readyz verdict (kubelet asks in a cluster): ask, so this test stands alone.
    expect((await agent.http('/readyz')).status).toBe(200);
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
    const shimQueries = queries.filter((q) => readsShimMetrics(q.expr));
    expect(shimQueries.length).toBeGreaterThanOrEqual(5);
    // Every shim panel reads only the shim's agreed families.
    for (const q of shimQueries) {
      const names = [...q.expr.matchAll(/probe_agent_shim_\w+/g)].map((x) => x[0].replace(/_(bucket|count|sum)$/, ''));
      for (const n of names) expect(SHIM_METRICS as readonly string[], `${q.panel}: ${n}`).toContain(n);
    }
    for (const vars of selections) {
      for (const q of queries) {
        const expr = substitute(q.expr, vars, '30s');
        const samples = await prom.waitFor(expr, (s) => s.length > 0, 30_000).catch((err: unknown) => {
          throw new Error(`panel "${q.panel}" ${q.refId} (${JSON.stringify(vars)}): ${String(err)}`);
        });
        // Every series of a panel is this node's (or aggregated away from it): nothing leaks in from elsewhere.
        for (const s of samples) if (s.metric.node !== undefined) expect(s.metric.node, `${q.panel} ${q.refId}`).toBe(NODE);
      }
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

  it('the shim away: its relay target goes down (503), the agent\'s own up stays 1 and ProbeAgentDown stays quiet', async () => {
    await shim!.stop();
    const res = await agent.http('/metrics/shim');
    expect(res.status).toBe(503);
    expect(res.body).toContain(shimMetricsSocket);
    await prom.waitFor('up{job="probe-agent",metrics_path="/metrics/shim"}', (s) => s.length === 1 && s[0]!.value === 0, 30_000);
    const own = await prom.query('up{job="probe-agent",metrics_path!="/metrics/shim"}');
    expect(own.map((s) => [s.metric.node, s.value])).toEqual([[NODE, 1]]);
    // The rule's own expression, run by this Prometheus over these real targets.
    expect(await prom.query(ruleExpr('ProbeAgentDown'))).toEqual([]);
    // Without the metrics_path label the relay's down target would be the agent down: the rule is not vacuous.
    expect((await prom.query('up{job="probe-agent"} == 0')).map((s) => s.metric.metrics_path)).toEqual(['/metrics/shim']);
  }, 60_000);
});
