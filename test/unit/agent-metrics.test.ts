/**
 * AgentMetrics (agent/metrics/agent-metrics.ts), the agent's self-metrics, read back from the
 * registry as Prometheus text: label values bounded to their known sets, gRPC method labels capped,
 * durations that are no durations dropped, scrape-time sources that fail leave their series out
 * with a warning, staleness from an injected clock. metrics.test.ts covers the series' presence.
 */
import { describe, expect, it } from 'vitest';
import { FeatureGates } from '../../agent/featuregates.ts';
import { createLogger } from '../../agent/log.ts';
import { AgentMetrics } from '../../agent/metrics/agent-metrics.ts';
import { createMetrics } from '../../agent/metrics/registry.ts';
import { ResultsStore } from '../../agent/scheduler/results-store.ts';
import { status } from '../support/api-harness.ts';

function setup() {
  let t = 1_000_000;
  const lines: string[] = [];
  const m = createMetrics({ gates: new FeatureGates(), version: 'test', processMetrics: false, now: () => t, log: createLogger({ level: 'warn', format: 'json', write: (l) => lines.push(l) }) });
  const text = async (): Promise<string> => m.registry.metrics();
  const series = async (name: string): Promise<string[]> => (await text()).split('\n').filter((l) => l.startsWith(`${name}{`) || l.startsWith(`${name} `));
  return { agent: m.agent, text, series, lines, advance: (ms: number) => (t += ms) };
}

describe('AgentMetrics', () => {
  it('is what createMetrics hands the other modules', () => {
    expect(setup().agent).toBeInstanceOf(AgentMetrics);
  });

  it('gRPC methods: a malformed one is "other", at most 32 distinct names, codes by number or name', async () => {
    const { agent, series } = setup();
    agent.grpcRequest('/probe.v1alpha1.ProbeService/Probe', 0, 0.01);
    agent.grpcRequest('/probe.v1alpha1.ProbeService/Probe', 'NOT_FOUND', 0.01);
    agent.grpcRequest('/probe.v1alpha1.ProbeService/Probe', 99, 0.01);
    agent.grpcRequest('/probe.v1alpha1.ProbeService/Probe', 'MADE_UP', 0.01);
    agent.grpcRequest('not a method\n{evil="1"}', 0, 0.01);
    for (let i = 0; i < 100; i++) agent.grpcRequest(`/s.S/M${i}`, 0, 0.01);
    const lines = await series('probe_agent_grpc_requests_total');
    expect(lines).toContain('probe_agent_grpc_requests_total{method="/probe.v1alpha1.ProbeService/Probe",code="OK"} 1');
    expect(lines).toContain('probe_agent_grpc_requests_total{method="/probe.v1alpha1.ProbeService/Probe",code="NOT_FOUND"} 1');
    expect(lines).toContain('probe_agent_grpc_requests_total{method="/probe.v1alpha1.ProbeService/Probe",code="UNKNOWN"} 2');
    const methods = new Set(lines.map((l) => /method="([^"]*)"/.exec(l)?.[1]));
    expect(methods.size).toBe(33); // 32 names, then "other" (69 of the M names and the malformed one: 70 calls)
    expect(lines).toContain('probe_agent_grpc_requests_total{method="other",code="OK"} 70');
  });

  it('label values outside their sets are "other"; NaN, negative and infinite seconds are not observed', async () => {
    const { agent, series } = setup();
    agent.netnsResolve('cri', 'ok', Number.NaN);
    agent.netnsResolve('magic', 'weird', -1);
    agent.helperSpawn(Number.POSITIVE_INFINITY, true, '/usr/bin/evil');
    agent.containerLookup('guess');
    expect(await series('probe_agent_netns_resolutions_total')).toEqual(expect.arrayContaining([
      'probe_agent_netns_resolutions_total{resolver="cri",outcome="ok"} 1',
      'probe_agent_netns_resolutions_total{resolver="other",outcome="other"} 1',
    ]));
    expect((await series('probe_agent_netns_resolution_duration_seconds_count')).filter((l) => !l.endsWith(' 0'))).toEqual([]);
    expect(await series('probe_agent_helper_spawns_total')).toEqual(['probe_agent_helper_spawns_total{mode="other",result="success"} 1']);
    expect(await series('probe_agent_container_lookups_total')).toEqual(['probe_agent_container_lookups_total{source="other"} 1']);
  });

  it('helper spawns by mode, pool mode included, and pool workers lost by reason', async () => {
    const { agent, series } = setup();
    agent.helperSpawn(0.0001, true, 'pool');
    agent.helperSpawn(0.002, false, 'pool');
    agent.helperWorkerLost('timeout');
    agent.helperWorkerLost('crash');
    agent.helperWorkerLost('crash');
    expect((await series('probe_agent_helper_spawns_total')).sort()).toEqual([
      'probe_agent_helper_spawns_total{mode="pool",result="failure"} 1',
      'probe_agent_helper_spawns_total{mode="pool",result="success"} 1',
    ]);
    expect((await series('probe_agent_helper_workers_lost_total')).sort()).toEqual([
      'probe_agent_helper_workers_lost_total{reason="crash"} 2',
      'probe_agent_helper_workers_lost_total{reason="timeout"} 1',
    ]);
  });

  it('kubelet staleness counts from start, then from the last success; a failed poll does not reset it', () => {
    const { agent, advance } = setup();
    advance(5000);
    expect(agent.kubeletStalenessSeconds()).toBe(5);
    agent.kubeletPoll(0.1);
    expect(agent.kubeletLastSuccess()).toBeDefined();
    advance(3000);
    agent.kubeletPoll(0.1, 'timeout');
    expect(agent.kubeletStalenessSeconds()).toBe(3);
  });

  it('pod counts and dropped pods are replaced, not added; negative or fractional counts are floored at 0', async () => {
    const { agent, series } = setup();
    agent.setPodCounts({ ours: 5, notOurs: { 'host-network': 2 } });
    agent.setPodCounts({ ours: 2.7, notOurs: { 'exec-only': -3 } });
    const lines = await series('probe_agent_pods');
    expect(lines).toContain('probe_agent_pods{state="ours"} 2');
    expect(lines).toContain('probe_agent_pods{state="host-network"} 0');
    expect(lines).toContain('probe_agent_pods{state="exec-only"} 0');
  });

  it('workers by type and result, every combination present (0 included), read from the results at scrape time', async () => {
    const { agent, series } = setup();
    const store = new ResultsStore();
    store.upsert(status('u1', 'ns', 'Readiness', 'success'));
    store.upsert(status('u2', 'ns', 'Readiness', 'success'));
    store.upsert(status('u3', 'ns', 'Liveness', 'failure'));
    agent.setResultsSource(store);
    const lines = await series('probe_agent_workers');
    expect(lines).toContain('probe_agent_workers{probe_type="Readiness",result="success"} 2');
    expect(lines).toContain('probe_agent_workers{probe_type="Liveness",result="failure"} 1');
    expect(lines).toContain('probe_agent_workers{probe_type="Startup",result="success"} 0');
  });

  it('a scrape-time source that throws: its series are left out, the scrape goes on, one warning each', async () => {
    const { agent, text, series, lines } = setup();
    agent.setLimiterSource(() => { throw new Error('limiter gone'); });
    agent.setResultsSource({ list: () => { throw new Error('store gone'); } });
    agent.setExecSyncCacheSource(() => { throw new Error('cache gone'); });
    const out = await text();
    expect(out).toContain('probe_agent_kubelet_staleness_seconds');
    expect(await series('probe_agent_workers')).toEqual([]);
    expect(lines.some((l) => l.includes('limiter source failed at scrape'))).toBe(true);
    expect(lines.some((l) => l.includes('results source failed at scrape'))).toBe(true);
    expect(lines.some((l) => l.includes('exec-sync cache source failed at scrape'))).toBe(true);
  });
});
