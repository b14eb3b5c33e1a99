/**
 * deploy/components/alerts: the alerting rules are unit-tested with the real `promtool test rules`
 * (test/alerts/probe-agent.rules.test.yaml: every alert fires in a case of its own and stays quiet
 * in a healthy one), the PrometheusRule is exactly what `make alerts` renders from the one rules
 * file, every metric the rules and the dashboard read is one the agent exports (or one of the
 * shim metrics agreed with the shim's relay, or kubelet's / Prometheus's own), and every alert's
 * runbook_url names a section of docs/runbooks.md.
 */
import { spawnSync } from 'node:child_process';
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { FeatureGates } from '../../agent/featuregates.ts';
import { HealthRegistry } from '../../agent/metrics/health.ts';
import { registerCloseHoleState } from '../../agent/metrics/close-hole-state.ts';
import { registerMemoryLimitGauge, registerReadinessGauge } from '../../agent/metrics/ops-metrics.ts';
import { createMetrics, EVENT_LOOP_MONITOR_PRECISION_MS } from '../../agent/metrics/registry.ts';
import { PROMETHEUS_RULE_FILE, RULES_FILE, renderPrometheusRule } from '../../tools/alerts/render-prometheusrule.ts';
import { dashboardQueries, SHIM_METRICS } from '../support/dashboard.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const TESTS = path.join(ROOT, 'test/alerts/probe-agent.rules.test.yaml');
const DASHBOARD = path.join(ROOT, 'deploy/components/alerts/probe-agent-dashboard.json');

type Obj = Record<string, any>;
interface Rule { alert: string; expr: string; for?: string; labels: Record<string, string>; annotations: Record<string, string> }

const rulesText = readFileSync(RULES_FILE, 'utf8');
const rules = (): Rule[] => (parse(rulesText) as Obj).groups.flatMap((g: Obj) => g.rules as Rule[]);

function promtool(args: string[], cwd = ROOT): { status: number | null; output: string } {
  const r = spawnSync('promtool', args, { cwd, encoding: 'utf8', timeout: 60_000 });
  if (r.error) throw new Error(`promtool could not run (${r.error.message}): install Debian's prometheus package (make system-deps does)`);
  return { status: r.status, output: `${r.stdout}${r.stderr}`.trim() };
}

let scratch: string;
beforeAll(() => {
  if (spawnSync('promtool', ['--version']).error) {
    throw new Error("promtool is missing: these tests run `promtool test rules`; install Debian's prometheus package (make system-deps does)");
  }
  scratch = mkdtempSync(path.join(tmpdir(), 'probe-agent-alerts-'));
});
afterAll(() => {
  if (scratch) rmSync(scratch, { recursive: true, force: true });
});

describe('alerting rules', () => {
  it('pass promtool check rules, as the plain file and as the PrometheusRule\'s spec', () => {
    expect(promtool(['check', 'rules', RULES_FILE])).toMatchObject({ status: 0 });
    const spec = path.join(scratch, 'from-prometheusrule.yaml');
    writeFileSync(spec, JSON.stringify((parse(readFileSync(PROMETHEUS_RULE_FILE, 'utf8')) as Obj).spec));
    const r = promtool(['check', 'rules', spec]);
    expect(r.status, r.output).toBe(0);
    expect(r.output).toContain(`SUCCESS: ${rules().length} rules found`);
  });

  it('pass their promtool unit tests', () => {
    const r = promtool(['test', 'rules', TESTS]);
    expect(r.status, r.output).toBe(0);
    expect(r.output).toContain('SUCCESS');
  });

  it('give every alert a case where it fires and a case where it stays quiet', () => {
    const tests = (parse(readFileSync(TESTS, 'utf8')) as Obj).tests as Obj[];
    const cases = tests.flatMap((t) => (t.alert_rule_test ?? []) as Obj[]);
    for (const { alert } of rules()) {
      const mine = cases.filter((c) => c.alertname === alert);
      expect(mine.some((c) => (c.exp_alerts ?? []).length > 0), `${alert} never fires in a test`).toBe(true);
      expect(mine.some((c) => (c.exp_alerts ?? []).length === 0), `${alert} is never shown quiet`).toBe(true);
    }
    const healthy = tests.find((t) => t.name === 'a healthy node raises nothing')!;
    expect(healthy.alert_rule_test.map((c: Obj) => c.alertname).sort()).toEqual(rules().map((r) => r.alert).sort());
  });

  it('fail their promtool tests when a rule is broken (promtool is no rubber stamp)', () => {
    // The same tests against a copy whose ProbeAgentDown never fires and whose discard alert lost its agent_down branch.
    const dir = path.join(scratch, 'broken');
    cpSync(path.join(ROOT, 'test/alerts'), path.join(dir, 'test/alerts'), { recursive: true });
    const broken = rulesText
      .replace('up{job="probe-agent",metrics_path!="/metrics/shim"} == 0 or', 'up{job="probe-agent",metrics_path!="/metrics/shim"} == 2 or')
      .replace('unless on (node) (max by (node) (up{job="probe-agent",metrics_path!="/metrics/shim"}) == 1)', 'unless on (node) (max by (node) (up{job="probe-agent",metrics_path!="/metrics/shim"}) >= 0)');
    expect(broken.match(/== 2 or|>= 0\)/g)).toHaveLength(2);
    expect(broken).not.toBe(rulesText);
    const rulesCopy = path.join(dir, path.relative(ROOT, RULES_FILE));
    cpSync(RULES_FILE, rulesCopy);
    writeFileSync(rulesCopy, broken);
    const r = promtool(['test', 'rules', path.join(dir, 'test/alerts/probe-agent.rules.test.yaml')]);
    expect(r.status).not.toBe(0);
    expect(r.output).toMatch(/alertname: ProbeAgentDown/);
    expect(r.output).toMatch(/alertname: ProbeAgentRewrittenProbesDiscarded/);
  });

  it('ship the PrometheusRule that `make alerts` renders from the rules file, with the same groups', () => {
    const committed = readFileSync(PROMETHEUS_RULE_FILE, 'utf8');
    expect(committed, 'prometheusrule.yaml is stale: run `make alerts`').toBe(renderPrometheusRule(rulesText));
    const pr = parse(committed) as Obj;
    expect(pr).toMatchObject({ apiVersion: 'monitoring.coreos.com/v1', kind: 'PrometheusRule' });
    expect(pr.spec).toEqual(parse(rulesText));
  });

  it('label and annotate every alert: severity, summary, description, a runbook section that exists', () => {
    const runbooks = readFileSync(path.join(ROOT, 'docs/runbooks.md'), 'utf8');
    const anchors = new Set([...runbooks.matchAll(/^#{2,3} (.+)$/gm)].map((m) => m[1]!.trim().toLowerCase().replace(/[^a-z0-9 -]/g, '').replace(/ /g, '-')));
    expect(rules().length).toBe(9);
    for (const r of rules()) {
      expect(['critical', 'warning'], r.alert).toContain(r.labels.severity);
      expect(r.annotations.summary, r.alert).toBeTruthy();
      expect(r.annotations.description, r.alert).toBeTruthy();
      expect(r.annotations.runbook_url, r.alert).toBe(`docs/runbooks.md#${r.alert.toLowerCase()}`);
      expect(anchors.has(r.alert.toLowerCase()), `docs/runbooks.md has no "## ${r.alert}"`).toBe(true);
    }
    expect(readFileSync(path.join(ROOT, 'README.md'), 'utf8')).toContain('[docs/runbooks.md](docs/runbooks.md)');
  });
});

describe('metric names the rules and the dashboard read', () => {
  /** Every family the running agent registers (process metrics and the ops gauges included). */
  async function agentFamilies(): Promise<Set<string>> {
    const metrics = createMetrics({ gates: new FeatureGates(), version: 'test' });
    const health = new HealthRegistry();
    try {
      registerReadinessGauge(metrics.registry, health);
      registerMemoryLimitGauge(metrics.registry);
      registerCloseHoleState(metrics.registry, path.join(scratch, 'no-state-file'));
      const names = new Set<string>();
      for (const m of await metrics.registry.getMetricsAsJSON()) {
        names.add(m.name);
        // prom-client's index.d.ts types `type` as a numeric enum (MetricType) it never exports at
        // run time; the value is the string ('counter', 'histogram', ...): compare it as what it is.
        const type: unknown = m.type;
        if (type === 'histogram') for (const s of ['_bucket', '_count', '_sum']) names.add(`${m.name}${s}`);
      }
      return names;
    } finally {
      health.close();
    }
  }

  /** Metric names in a PromQL expression (identifiers followed by a selector or a range, not functions or labels). */
  function metricNames(expr: string): string[] {
    const withoutStrings = expr.replace(/"[^"]*"/g, '""');
    const withoutMatchers = withoutStrings.replace(/\{[^}]*\}/g, '{}');
    return [...withoutMatchers.matchAll(/\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?=\{|\[|\s*[)/><=!+*-]|\s*$|\s+(?:or|and|unless)\b)/g)]
      .map((m) => m[1]!)
      .filter((n) => !['by', 'on', 'without', 'ignoring', 'or', 'and', 'unless', 'bool', 'group_left', 'group_right', 'le', 'node', 'cause'].includes(n) && /_/.test(n));
  }

  it('are exported by the agent, or are the agreed shim names, kubelet\'s or Prometheus\'s own', async () => {
    const exported = await agentFamilies();
    const external = new Set(['up', 'prober_probe_total']);
    const exprs = [...rules().map((r) => r.expr), ...dashboardQueries(JSON.parse(readFileSync(DASHBOARD, 'utf8'))).map((q) => q.expr)];
    const seen = new Set<string>();
    for (const expr of exprs) {
      for (const name of metricNames(expr)) {
        seen.add(name);
        const known = exported.has(name) || external.has(name) || SHIM_METRICS.some((s) => name === s || name.startsWith(`${s}_`));
        expect(known, `${name} (in ${expr.replace(/\s+/g, ' ')}) is exported by nobody`).toBe(true);
      }
    }
    // The extraction found the names (a parser that finds nothing would pass the loop above).
    for (const n of ['probe_agent_ready', 'probe_agent_probe_results_total', 'probe_agent_shim_agent_errors_total', 'prober_probe_total', 'process_resident_memory_bytes', 'nodejs_eventloop_lag_p99_seconds']) {
      expect(seen.has(n), n).toBe(true);
    }
    expect(exported.has('probe_agent_no_such_metric')).toBe(false);
  });

  it('subtracts the agent\'s event-loop sampling interval from the lag it shows (every sample includes it)', () => {
    const queries = dashboardQueries(JSON.parse(readFileSync(DASHBOARD, 'utf8'))).filter((q) => q.expr.includes('nodejs_eventloop_lag_'));
    expect(queries.length).toBe(2);
    for (const q of queries) expect(q.expr).toContain(`} - ${EVENT_LOOP_MONITOR_PRECISION_MS / 1000}, 0)`);
  });
});
