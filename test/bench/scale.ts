/**
 * The scale curve: the real daemon (`probe-agent run`) against the test kubelet, N pods × 3 probes at
 * a period P, measured from the outside over a steady window: CPU of agent + helper from /proc,
 * RSS, event-loop delay p99 and probe rate from its /metrics. Plus what one netns resolution costs
 * per resolver, since the resolver cache (60 s TTL) makes that a recurring cost the window may miss.
 */
import { readdirSync } from 'node:fs';
import { AddressResolver } from '../../agent/netns/address-resolver.ts';
import { ResidentHelper } from '../../agent/netns/helper.ts';
import { EVENT_LOOP_MONITOR_PRECISION_MS } from '../../agent/metrics/registry.ts';
import { ProcfsResolver } from '../../agent/netns/procfs-resolver.ts';
import type { NetnsResolver } from '../../agent/netns/resolver.ts';
import { startAgent, sumOf, type AgentProcess, type MetricSamples } from './agent-process.ts';
import { cpuOf } from './procstat.ts';
import { PROBES_PER_POD, type ScaleEnv } from './scale-env.ts';
import { round } from './stats.ts';

/** prom-client samples the loop every EVENT_LOOP_MONITOR_PRECISION_MS and reports whole intervals: subtract one for the delay. */
export const PROM_LOOP_RESOLUTION_MS = EVENT_LOOP_MONITOR_PRECISION_MS;
/**
 * The resolver chain's mean cache TTL: DEFAULT_TTL_MS (60 s) shortened by a random share of up to
 * DEFAULT_TTL_JITTER (0.25) in agent/netns/resolver.ts, so 52.5 s on average.
 */
export const RESOLVER_TTL_SECONDS = 60 * (1 - 0.25 / 2);

/** One point of the curve. */
export interface ScalePoint {
  pods: number;
  probesPerPod: number;
  periodSeconds: number;
  windowSeconds: number;
  /** Agent + helper CPU over the window, % of one core. */
  cpuPercent: number;
  /** One resolver refresh of these pods amortised over the mean cache TTL (set by the caller), % of one core. */
  resolverCpuPercent?: number;
  helperCpuPercent: number;
  rssMB: number;
  peakRssMB: number;
  /** RSS split at the window's end: anonymous (the agent's own) and file-backed (mostly the node binary, shared and clean). */
  rssSplitMB?: { anon: number; file: number };
  /** V8 heap at the end of the window, from the agent's own nodejs_* metrics (MB). */
  heap: { usedMB: number; totalMB: number; externalMB: number };
  /** nodejs_eventloop_lag_p99_seconds over the window, as exported (includes the 10 ms sampling interval). */
  loopP99RawMs: number;
  /** The same minus the sampling interval: the delay beyond schedule. */
  loopP99Ms: number;
  probesPerSecond: number;
  expectedProbesPerSecond: number;
  /** Results other than success/warning in the window (should be 0: every pod is healthy). */
  nonSuccess: number;
  /** From spawn until every pod's netns was resolved once. */
  coldStart: { seconds: number; cpuSeconds: number };
  exitCode: number | null;
}

/** What one refresh of every pod's netns costs (the pods of a refresh share the resolver's scans). */
export interface ResolverCost {
  resolver: 'procfs' | 'address';
  /** Netns files (address) or processes (procfs) one scan examines. */
  examined: number;
  /** Pods resolved in the refresh. */
  pods: number;
  cpuMsPerRefresh: number;
  wallMsPerRefresh: number;
  cpuMsPerPod: number;
  /** cpuMsPerRefresh over the mean cache TTL, as % of one core. */
  amortizedPercent: number;
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
const results = (m: MetricSamples): number => sumOf(m, 'probe_agent_probe_results_total');
const failed = (m: MetricSamples): number => sumOf(m, 'probe_agent_probe_results_total', (l) => l.result !== 'success' && l.result !== 'warning');

/** Waits until every pod's netns was resolved once and some probe ran. */
export async function waitResolved(agent: AgentProcess, pods: number, timeoutMs: number): Promise<void> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const m = await agent.scrape();
    if (sumOf(m, 'probe_agent_netns_resolutions_total', (l) => l.outcome === 'ok') >= pods && results(m) > 0) return;
    if (Date.now() > end) {
      throw new Error(`agent resolved ${sumOf(m, 'probe_agent_netns_resolutions_total', (l) => l.outcome === 'ok')}/${pods} pods in ${timeoutMs / 1000} s`);
    }
    await sleep(250);
  }
}

/** Runs the daemon at one (pods, period) point and measures a steady window (`root`: the checkout whose launcher flags and DaemonSet env it runs with, default this tree). */
export async function measurePoint(env: ScaleEnv, cli: string, pods: number, periodSeconds: number, windowSeconds: number, idleSettleMs = 30_000, root?: string): Promise<ScalePoint> {
  env.kubelet.setPods(env.podList(pods, periodSeconds));
  const spawned = Date.now();
  const agent = await startAgent({ cli, kubeletUrl: env.kubelet.httpUrl, resolver: env.resolver, dir: env.dir, root });
  let point: Omit<ScalePoint, 'exitCode'>;
  try {
    // Idle (0 pods): nothing to resolve; start-up work (V8's compile and GC threads settling after
    // the first polls) still shows 10 to 20 s in, so the idle window starts 30 s after spawn.
    if (pods > 0) await waitResolved(agent, pods, 180_000);
    else await sleep(idleSettleMs);
    const coldCpu = agent.cpuMs();
    const coldStart = { seconds: round((Date.now() - spawned) / 1000, 1), cpuSeconds: round((coldCpu.agent + coldCpu.helper) / 1000, 2) };
    // A worker whose first run waited for its pod's resolution holds one tick (Go's ticker buffer)
    // and runs again at once: one more period after the last resolution, that backlog is gone.
    if (pods > 0) await sleep(periodSeconds * 1000 + 1000);
    const m0 = await agent.scrape();
    const c0 = agent.cpuMs();
    const t0 = performance.now();
    await sleep(windowSeconds * 1000);
    const m1 = await agent.scrape();
    const c1 = agent.cpuMs();
    const seconds = (performance.now() - t0) / 1000;
    const mem = agent.rss();
    const loopRaw = sumOf(m1, 'nodejs_eventloop_lag_p99_seconds') * 1000;
    const pct = (ms: number): number => round(ms / seconds / 10, 2);
    point = {
      pods,
      probesPerPod: PROBES_PER_POD,
      periodSeconds,
      windowSeconds: round(seconds, 1),
      cpuPercent: pct(c1.agent + c1.helper - c0.agent - c0.helper),
      helperCpuPercent: pct(c1.helper - c0.helper),
      rssMB: round(mem.rssMB, 1),
      peakRssMB: round(mem.peakMB, 1),
      rssSplitMB: { anon: round(mem.anonMB, 1), file: round(mem.fileMB, 1) },
      heap: {
        usedMB: round(sumOf(m1, 'nodejs_heap_size_used_bytes') / 2 ** 20, 1),
        totalMB: round(sumOf(m1, 'nodejs_heap_size_total_bytes') / 2 ** 20, 1),
        externalMB: round(sumOf(m1, 'nodejs_external_memory_bytes') / 2 ** 20, 1),
      },
      loopP99RawMs: round(loopRaw, 2),
      loopP99Ms: round(Math.max(0, loopRaw - PROM_LOOP_RESOLUTION_MS), 2),
      probesPerSecond: round((results(m1) - results(m0)) / seconds, 1),
      expectedProbesPerSecond: round((pods * PROBES_PER_POD) / periodSeconds, 1),
      nonSuccess: failed(m1) - failed(m0),
      coldStart,
    };
  } catch (err) {
    await agent.stop();
    throw new Error(`${pods} pods @${periodSeconds}s: ${err instanceof Error ? err.message : String(err)}\nagent stderr: ${agent.stderrTail().slice(-2000)}`);
  }
  return { ...point, exitCode: await agent.stop() };
}

/**
 * One refresh: every one of `pods` pods resolved, one after another, with a fresh instance of the
 * agent's own resolver class (its scans shared as in the daemon), charging this process's CPU and
 * its reaped children's (the address resolver's helper is closed, so reaped, before the count).
 */
export async function measureResolverCost(env: ScaleEnv, resolver: 'procfs' | 'address', pods: number): Promise<ResolverCost> {
  const picked = env.pods.slice(0, pods);
  const cpu = (): number => {
    const ru = process.resourceUsage();
    return (ru.userCPUTime + ru.systemCPUTime) / 1000 + cpuOf('self').childrenMs;
  };
  const c0 = cpu();
  const t0 = performance.now();
  const helper = resolver === 'address' ? await ResidentHelper.start() : undefined;
  try {
    const r: NetnsResolver = helper ? new AddressResolver({ addresses: helper }) : new ProcfsResolver();
    for (const p of picked) {
      const res = await r.resolve({ uid: p.uid, namespace: 'bench', name: p.name, podIPs: p.lab.ips });
      if (!res.path) throw new Error(`resolver ${resolver} found no netns for ${p.name}`);
    }
  } finally {
    await helper?.close();
  }
  const cpuMs = cpu() - c0;
  const examined = resolver === 'address' ? readdirSync('/run/netns').length : readdirSync('/proc').filter((e) => /^\d+$/.test(e)).length;
  return {
    resolver,
    examined,
    pods: picked.length,
    cpuMsPerRefresh: round(cpuMs, 1),
    wallMsPerRefresh: round(performance.now() - t0, 1),
    cpuMsPerPod: round(cpuMs / Math.max(1, picked.length), 3),
    amortizedPercent: round(cpuMs / (RESOLVER_TTL_SECONDS * 1000) * 100, 3),
  };
}
