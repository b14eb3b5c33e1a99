/**
 * Reading deploy/components/alerts/probe-agent-dashboard.json the way Grafana runs it: every
 * panel's queries, with the dashboard's template variables substituted, so tests can run them
 * against a real Prometheus.
 */

/** The shim's metric families (relayed by the agent), as agreed with the shim's metrics work. */
export const SHIM_METRICS = [
  'probe_agent_shim_forwarded_total',
  'probe_agent_shim_intercepted_total',
  'probe_agent_shim_agent_errors_total',
  'probe_agent_shim_hook_waits_total',
  'probe_agent_shim_intercept_duration_seconds',
  'probe_agent_shim_runtime_errors_total',
  'probe_agent_shim_cri_calls_total',
  'probe_agent_shim_cri_connections',
  'probe_agent_shim_resident_memory_bytes',
  'probe_agent_shim_heap_total_bytes',
  'probe_agent_shim_heap_used_bytes',
  'probe_agent_shim_external_memory_bytes',
  'probe_agent_shim_heap_space_used_bytes',
  'probe_agent_shim_heap_space_total_bytes',
] as const;

/** One panel query. */
export interface PanelQuery {
  panel: string;
  refId: string;
  expr: string;
}

type Obj = Record<string, any>;

/** Every target of every panel (rows included), in dashboard order. */
export function dashboardQueries(dashboard: Obj): PanelQuery[] {
  const out: PanelQuery[] = [];
  const walk = (panels: Obj[]): void => {
    for (const p of panels ?? []) {
      for (const t of p.targets ?? []) out.push({ panel: String(p.title), refId: String(t.refId), expr: String(t.expr) });
      walk(p.panels ?? []);
    }
  };
  walk(dashboard.panels);
  return out;
}

/** Whether a query reads a shim metric (those exist only where a shim reports to the agent). */
export function readsShimMetrics(expr: string): boolean {
  return SHIM_METRICS.some((m) => expr.includes(m));
}

/**
 * A query as Grafana sends it: `$var`/`${var}` replaced by the variable's value (a multi-value
 * regex selection: values joined with |), `$__rate_interval` by the given range.
 */
export function substitute(expr: string, vars: Record<string, string[]>, rateInterval: string): string {
  return expr
    .replaceAll('$__rate_interval', rateInterval)
    .replace(/\$\{(\w+)\}|\$(\w+)/g, (whole, a: string | undefined, b: string | undefined) => {
      const name = (a ?? b)!;
      const values = vars[name];
      if (!values) throw new Error(`dashboard query uses $${name}, which is no template variable: ${expr}`);
      return values.length === 1 ? values[0]! : `(${values.join('|')})`;
    });
}
