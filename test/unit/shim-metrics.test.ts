/**
 * The shim's hand-written Prometheus exposition (agent/shim/metrics.ts): the names other tools
 * alert on, bounded labels whatever kubelet sends, cumulative histogram buckets, and text that
 * the real `promtool check metrics` accepts.
 */
import { spawnSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { CRI_CLIENTS_LISTED, DURATION_BUCKETS, methodLabel, ShimMetrics } from '../../agent/shim/metrics.ts';

function promtool(text: string): { status: number | null; output: string } {
  const r = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8' });
  if (r.error) throw new Error(`promtool not found (Debian package prometheus): ${r.error.message}`);
  return { status: r.status, output: `${r.stdout}${r.stderr}` };
}

describe('ShimMetrics', () => {
  it('names every family the alerts and dashboards use, with bounded label values', () => {
    const m = new ShimMetrics();
    m.forwarded('/runtime.v1.RuntimeService/ListContainers');
    m.forwarded('/runtime.v1.ImageService/PullImage');
    m.forwarded('/runtime.v1.RuntimeService/Made-Up-By-A-Client');
    m.forwarded(undefined);
    m.intercepted('readiness', 'success', 0.003);
    m.intercepted('postStart', 'error', 12);
    m.agentError('unreachable');
    m.hookWait('gave_up');
    m.runtimeError();
    const text = m.render();
    for (const family of ['forwarded_total', 'intercepted_total', 'agent_errors_total', 'hook_waits_total', 'intercept_duration_seconds', 'runtime_errors_total']) {
      expect(text).toMatch(new RegExp(`^# TYPE probe_agent_shim_${family} (counter|histogram)$`, 'm'));
    }
    expect(text).toMatch(/^probe_agent_shim_forwarded_total\{method="ListContainers"\} 1$/m);
    expect(text).toMatch(/^probe_agent_shim_forwarded_total\{method="PullImage"\} 1$/m);
    expect(text).toMatch(/^probe_agent_shim_forwarded_total\{method="other"\} 2$/m);
    expect(text).toMatch(/^probe_agent_shim_intercepted_total\{kind="postStart",answer="error"\} 1$/m);
    expect(text).toMatch(/^probe_agent_shim_agent_errors_total\{cause="unreachable"\} 1$/m);
    expect(text).toMatch(/^probe_agent_shim_hook_waits_total\{outcome="gave_up"\} 1$/m);
    expect(text).toMatch(/^probe_agent_shim_runtime_errors_total 1$/m);
    expect(methodLabel('/runtime.v1.RuntimeService/' + 'x'.repeat(10_000))).toBe('other');
  });

  it('histogram buckets are cumulative and +Inf equals the count', () => {
    const m = new ShimMetrics();
    for (const s of [0.001, 0.02, 0.02, 3, 5000]) m.intercepted('preStop', 'success', s);
    const text = m.render();
    const bucket = (le: string): number => Number(new RegExp(`^probe_agent_shim_intercept_duration_seconds_bucket\\{kind="preStop",le="${le.replace('+', '\\+')}"\\} (\\d+)$`, 'm').exec(text)?.[1]);
    expect(bucket('0.005')).toBe(1);
    expect(bucket('0.025')).toBe(3);
    expect(bucket('5')).toBe(4);
    expect(bucket(String(DURATION_BUCKETS.at(-1)))).toBe(4);
    expect(bucket('+Inf')).toBe(5);
    expect(text).toMatch(/^probe_agent_shim_intercept_duration_seconds_count\{kind="preStop"\} 5$/m);
  });

  it('reports its own memory: RSS, V8 heap by space, external', () => {
    const text = new ShimMetrics().render();
    const value = (re: RegExp): number => Number(re.exec(text)?.[1]);
    const rss = value(/^probe_agent_shim_resident_memory_bytes (\d+)$/m);
    expect(rss).toBeGreaterThan(10 * 2 ** 20);
    expect(Math.abs(rss - process.memoryUsage().rss)).toBeLessThan(rss / 2);
    const used = value(/^probe_agent_shim_heap_used_bytes (\d+)$/m);
    expect(used).toBeGreaterThan(0);
    expect(used).toBeLessThanOrEqual(value(/^probe_agent_shim_heap_total_bytes (\d+)$/m));
    expect(value(/^probe_agent_shim_heap_space_used_bytes\{space="old"\} (\d+)$/m)).toBeGreaterThan(0);
    expect(value(/^probe_agent_shim_heap_space_total_bytes\{space="new"\} (\d+)$/m)).toBeGreaterThan(0);
    expect(value(/^probe_agent_shim_external_memory_bytes (\d+)$/m)).toBeGreaterThan(0);
  });

  it('promtool accepts the exposition, empty and full', () => {
    expect(promtool(new ShimMetrics().render()).status).toBe(0);
    const m = new ShimMetrics();
    m.forwarded('/runtime.v1.RuntimeService/Version');
    m.intercepted('liveness', 'failure', 0.5);
    m.agentError('bad_command');
    m.hookWait('ran');
    const r = promtool(m.render());
    expect(r.output).toBe('');
    expect(r.status).toBe(0);
  });

  it('counts the calls of each open connection on kubelet\'s socket, lists the busiest, and forgets closed ones', () => {
    const m = new ShimMetrics();
    const kubelet = m.criClientOpened();
    const crictl = m.criClientOpened();
    for (let i = 0; i < 5; i++) m.criCall(kubelet);
    m.criCall(crictl);
    expect(m.criClients().map((c) => [c.id, c.calls])).toEqual([[kubelet.id, 5], [crictl.id, 1]]);
    m.criClientClosed(crictl);
    expect(m.criClients().map((c) => c.id)).toEqual([kubelet.id]);
    const text = m.render();
    expect(text).toMatch(/^probe_agent_shim_cri_calls_total 6$/m);
    expect(text).toMatch(/^probe_agent_shim_cri_connections 1$/m);
    // Bounded whatever the number of connections.
    for (let i = 0; i < 100; i++) m.criCall(m.criClientOpened());
    expect(m.criClients()).toHaveLength(CRI_CLIENTS_LISTED);
    expect(m.criClients()[0]!.id).toBe(kubelet.id);
    expect(promtool(m.render()).status).toBe(0);
  });
});
