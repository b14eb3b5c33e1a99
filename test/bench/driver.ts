/**
 * One measurement process of the side-by-side bench: runs the probe mix through ONE path and prints
 * a JSON result line. A fresh process per (round, path) keeps paths from sharing a heap, JIT state
 * or peak RSS; bench.ts interleaves them. Paths (a)-(d) call the agent's real runProbe() with the
 * path's SocketFactory, so this process IS the agent; for (e) it only generates /probe requests
 * and charges the blackbox exporter's own CPU, never its own.
 *
 *   node test/bench/driver.ts < DriverConfig.json
 */
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import type { ResidentHelper } from '../../agent/netns/helper.ts';
import { readCpuCounter, type CpuCounter } from './cpu-cgroup.ts';
import { variants, type Variant, type VariantName } from './mix.ts';
import { agentProber, blackboxProber, type BenchPod, type PathName, type Prober } from './paths.ts';
import { cpuOf, resetPeakRss, rssOf, totalCpuMs, waitNoChildren } from './procstat.ts';
import { quantile, ranToTimeout } from './stats.ts';

export { PATHS, PATH_LETTER, type BenchPod, type PathName } from './paths.ts';

/** What bench.ts asks one driver to do. */
export interface DriverConfig {
  path: PathName;
  pods: BenchPod[];
  /** Measured probes per variant (closed loop). */
  probes: number;
  /** Unmeasured probes per variant first (JIT, caches). */
  warmup: number;
  concurrency: number;
  /** Open-loop run of the healthy TCP/HTTP/gRPC entries at a fixed rate after the closed loop; omitted = none. */
  paced?: { rate: number; seconds: number };
  blackbox?: { url: string; pid: number; cpu?: CpuCounter };
  timeoutSeconds: number;
  /** This driver's own CPU cgroup (helper and children included), when the bench could make one. */
  cpu?: CpuCounter;
}

/** CPU charged to the path during a run, in ms. */
export interface CpuSplit {
  /** This process (the agent), from getrusage. */
  agent: number;
  /** Reaped children of this process (path c's per-probe helpers), /proc ticks. */
  children: number;
  /** The resident helper, its reaped forks included; or the blackbox exporter: /proc ticks. */
  helper: number;
  /** agent + children + helper from getrusage and /proc. */
  procTotal: number;
  /** The same from the cgroup's exact counter; null without one. */
  cgroupTotal: number | null;
  /** What the tables use: cgroupTotal when there is one, else procTotal. */
  total: number;
}

/** One closed-loop run of one variant. */
export interface VariantRun {
  probes: number;
  /** Probes whose result was not the expected one (a broken path must not look cheap). */
  unexpected: number;
  /** Probes that ended in result 'error' (could not run at all). */
  errors: number;
  /** Probes that ran to their own timeout without the expected result (a loaded machine can cause that: not judged). */
  timedOut: number;
  /** Of the other probes (judged): those with an unexpected result, and those in 'error'. */
  unexpectedInTime: number;
  errorsInTime: number;
  wallMs: number;
  probesPerSecond: number;
  cpu: CpuSplit;
  cpuMsPerProbe: number;
  p50Ms: number;
  p99Ms: number;
  /** Event-loop delay p99 beyond the sampling interval, ms; null for blackbox (not our loop). */
  loopP99Ms: number | null;
}

/** The open-loop run. */
export interface PacedRun {
  targetRate: number;
  achievedRate: number;
  probes: number;
  unexpected: number;
  p50Ms: number;
  p99Ms: number;
  cpuMsPerProbe: number;
  loopP99Ms: number;
}

/** Everything one driver reports. */
export interface DriverResult {
  path: PathName;
  variants: Record<VariantName, VariantRun>;
  /** Latency over every closed-loop probe of the mix. */
  overall: { p50Ms: number; p99Ms: number };
  paced?: PacedRun;
  /** Peak resident set: this process + helper (or the blackbox exporter alone for path e). */
  peakRssMB: number;
  /** Requests the resident helper served (sanity: at least one per probe). */
  helperRequests?: number;
}

/** Sampling interval of the event-loop monitor; its value is subtracted from the reported delay. */
export const LOOP_RESOLUTION_MS = 1;

/** The cgroup counter that holds the path's CPU: the exporter's for (e), this driver's otherwise. */
let counter: CpuCounter | undefined;

function cpuNow(helperPid: number | undefined): { agent: number; children: number; helper: number; cgroup: number } {
  const ru = process.resourceUsage();
  return {
    agent: (ru.userCPUTime + ru.systemCPUTime) / 1000,
    children: cpuOf('self').childrenMs,
    helper: helperPid ? totalCpuMs(helperPid) : 0,
    cgroup: counter ? readCpuCounter(counter) : Number.NaN,
  };
}

function cpuSince(p: Prober, before: ReturnType<typeof cpuNow>, isBlackbox: boolean): CpuSplit {
  const now = cpuNow(p.helperPid());
  // For (e) the load generator is not the prober: only the exporter's own CPU counts.
  const agent = isBlackbox ? 0 : now.agent - before.agent;
  const children = isBlackbox ? 0 : now.children - before.children;
  const helper = now.helper - before.helper;
  const procTotal = agent + children + helper;
  const cg = now.cgroup - before.cgroup;
  const cgroupTotal = Number.isFinite(cg) ? cg : null;
  return { agent, children, helper, procTotal, cgroupTotal, total: cgroupTotal ?? procTotal };
}

function loopDelayMs(h: ReturnType<typeof monitorEventLoopDelay>): number {
  return Math.max(0, h.percentile(99) / 1e6 - LOOP_RESOLUTION_MS);
}

async function closedLoop(p: Prober, cfg: DriverConfig, v: Variant, n: number, measure: boolean, all?: number[]): Promise<VariantRun> {
  const isBlackbox = cfg.path === 'blackbox';
  const lat: number[] = [];
  let unexpected = 0;
  let errors = 0;
  let timedOut = 0;
  let unexpectedInTime = 0;
  let errorsInTime = 0;
  let next = 0;
  const loop = monitorEventLoopDelay({ resolution: LOOP_RESOLUTION_MS });
  const helperPid = p.helperPid();
  const before = cpuNow(helperPid);
  const t0 = performance.now();
  loop.enable();
  await Promise.all(Array.from({ length: Math.min(cfg.concurrency, n) }, async () => {
    while (next < n) {
      const i = next++;
      const pod = cfg.pods[i % cfg.pods.length] as BenchPod;
      const s = performance.now();
      const r = await p.probe(v, pod);
      const ms = performance.now() - s;
      lat.push(ms);
      const bad = (r === 'success') !== v.expectSuccess || r === 'error';
      if (r === 'error') errors++;
      if (bad) unexpected++;
      if (bad && ranToTimeout(ms, cfg.timeoutSeconds)) timedOut++;
      else {
        if (r === 'error') errorsInTime++;
        if (bad) unexpectedInTime++;
      }
    }
  }));
  const wallMs = performance.now() - t0;
  loop.disable();
  // Path (c): a helper that answered may still be exiting; its CPU lands in cutime once reaped.
  if (measure && cfg.path === 'spawn') await waitNoChildren('self', 2000);
  const cpu = cpuSince(p, before, isBlackbox);
  all?.push(...lat);
  lat.sort((a, b) => a - b);
  return {
    probes: n,
    unexpected,
    errors,
    timedOut,
    unexpectedInTime,
    errorsInTime,
    wallMs,
    probesPerSecond: n / (wallMs / 1000),
    cpu,
    cpuMsPerProbe: cpu.total / n,
    p50Ms: quantile(lat, 0.5),
    p99Ms: quantile(lat, 0.99),
    loopP99Ms: isBlackbox ? null : loopDelayMs(loop),
  };
}

/** Open loop: probes start on schedule whatever is still in flight (bounded), `mix` round-robin. */
async function pacedRun(p: Prober, cfg: DriverConfig, mix: Variant[], rate: number, seconds: number): Promise<PacedRun> {
  const total = Math.max(1, Math.round(rate * seconds));
  const lat: number[] = [];
  let unexpected = 0;
  let started = 0;
  let inFlight = 0;
  const maxInFlight = 1024;
  const loop = monitorEventLoopDelay({ resolution: LOOP_RESOLUTION_MS });
  const before = cpuNow(p.helperPid());
  const t0 = performance.now();
  loop.enable();
  await new Promise<void>((resolve) => {
    let done = 0;
    const launch = (): void => {
      const v = mix[started % mix.length] as Variant;
      const pod = cfg.pods[started % cfg.pods.length] as BenchPod;
      started++;
      inFlight++;
      const s = performance.now();
      void p.probe(v, pod).then((r) => {
        lat.push(performance.now() - s);
        if ((r === 'success') !== v.expectSuccess || r === 'error') unexpected++;
        inFlight--;
        if (++done === total) resolve();
      });
    };
    const tick = (): void => {
      const due = Math.min(total, Math.floor(((performance.now() - t0) / 1000) * rate) + 1);
      while (started < due && inFlight < maxInFlight) launch();
      // Sleep until the next probe is due (at least 1 ms): a timer every millisecond would wake this
      // process, which is the agent being measured, far more often than its probes do at a low rate.
      if (started < total) setTimeout(tick, Math.max(1, t0 + (started * 1000) / rate - performance.now()));
    };
    tick();
  });
  const wallMs = performance.now() - t0;
  loop.disable();
  if (cfg.path === 'spawn') await waitNoChildren('self', 2000);
  const cpu = cpuSince(p, before, cfg.path === 'blackbox');
  lat.sort((a, b) => a - b);
  return {
    targetRate: rate,
    achievedRate: total / (wallMs / 1000),
    probes: total,
    unexpected,
    p50Ms: quantile(lat, 0.5),
    p99Ms: quantile(lat, 0.99),
    cpuMsPerProbe: cpu.total / total,
    loopP99Ms: loopDelayMs(loop),
  };
}

/** Runs the whole mix for cfg.path and returns the measurements. */
export async function drive(cfg: DriverConfig): Promise<DriverResult> {
  if (cfg.pods.length === 0) throw new Error('driver: no pods');
  const isBlackbox = cfg.path === 'blackbox';
  if (isBlackbox && !cfg.blackbox) throw new Error('driver: path blackbox needs cfg.blackbox');
  counter = isBlackbox ? cfg.blackbox?.cpu : cfg.cpu;
  const p: Prober & { helper?: ResidentHelper } = isBlackbox
    ? blackboxProber(cfg.blackbox!.url, cfg.blackbox!.pid, cfg.concurrency)
    : await agentProber(cfg.path as Exclude<PathName, 'blackbox'>, cfg.timeoutSeconds);
  try {
    if (isBlackbox) resetPeakRss(cfg.blackbox!.pid);
    const mix = variants();
    for (const v of mix) await closedLoop(p, cfg, v, cfg.warmup, false);
    const out = {} as Record<VariantName, VariantRun>;
    const all: number[] = [];
    for (const v of mix) out[v.name] = await closedLoop(p, cfg, v, cfg.probes, true, all);
    all.sort((a, b) => a - b);
    // The paced run stands for the scale curve's healthy pods: succeeding TCP, HTTP and gRPC probes.
    const pacedMix = mix.filter((v) => v.expectSuccess && v.kind !== 'https');
    const paced = cfg.paced ? await pacedRun(p, cfg, pacedMix, cfg.paced.rate, cfg.paced.seconds) : undefined;
    const helperPid = p.helperPid();
    const peakRssMB = isBlackbox ? rssOf(helperPid as number).peakMB : rssOf('self').peakMB + (helperPid ? rssOf(helperPid).peakMB : 0);
    const result: DriverResult = { path: cfg.path, variants: out, overall: { p50Ms: quantile(all, 0.5), p99Ms: quantile(all, 0.99) }, peakRssMB };
    if (paced) result.paced = paced;
    if (p.helper) result.helperRequests = p.helper.stats().spawned;
    return result;
  } finally {
    await p.close();
  }
}

/** Reads all of stdin (the config is too long for a readable command line). */
async function readStdin(): Promise<string> {
  let text = '';
  for await (const chunk of process.stdin) text += String(chunk);
  return text;
}

if (import.meta.main) {
  const cfg = JSON.parse(await readStdin()) as DriverConfig;
  try {
    const result = await drive(cfg);
    process.stdout.write(`result ${JSON.stringify(result)}\n`);
  } catch (err) {
    process.stderr.write(`driver (${cfg.path}) failed: ${err instanceof Error ? err.stack : String(err)}\n`);
    process.exitCode = 1;
  }
}
