/**
 * The side-by-side part of `make bench`: one lab of N pods running test/lab/pod-server.ts, the
 * blackbox exporter, and rounds of one fresh driver process per path (a, b, c, d, e in that order,
 * repeated), summarised as medians over the rounds.
 */
import { spawn } from 'node:child_process';
import { createLab, type Lab, type RunningServer } from '../lab/lab.ts';
import { startBlackbox, type Blackbox } from './blackbox.ts';
import { CpuCgroups } from './cpu-cgroup.ts';
import { PATHS, type DriverConfig, type DriverResult, type PathName } from './driver.ts';
import { DOWN_SERVICE, KINDS, POD_PORTS, VARIANT_NAMES, type Kind, type VariantName } from './mix.ts';
import { median, round } from './stats.ts';

/** Paths whose latency is compared at a fixed rate: the in-netns candidates against direct. */
const PACED_PATHS: readonly PathName[] = ['resident', 'warm', 'node'];

/** Knobs of the side-by-side run (see config.ts for the env names). */
export interface SideBySideOptions {
  pods: number;
  probes: number;
  warmup: number;
  rounds: number;
  concurrency: number;
  paced?: { rate: number; seconds: number };
  timeoutSeconds: number;
  /** The driver script to run (compiled or source; see build.ts). */
  driver: string;
  /** Paths to run (default all, in PATHS order); the report needs all of them. */
  paths?: readonly PathName[];
  /** Other builds' drivers (build.ts buildRevision), each run as path (a) after the paths of every round, in rotated order. */
  revisions?: readonly { label: string; driver: string }[];
  /** Node flags for every agent driver (e.g. --cpu-prof). */
  driverNodeFlags?: (name: string) => string[];
  log: (line: string) => void;
}

/** Medians over rounds of one variant on one path. */
export interface VariantSummary {
  cpuMsPerProbe: number;
  /** The agent process alone (getrusage). */
  agentMsPerProbe: number;
  /** Everything else charged: the helper and its forks, or (c)'s spawned helpers, or the exporter. */
  helperMsPerProbe: number;
  /** The total as /proc ticks count it (cross-check of the cgroup counter). */
  procCpuMsPerProbe: number;
  probesPerSecond: number;
  p50Ms: number;
  p99Ms: number;
  loopP99Ms: number | null;
  /** Summed over rounds. */
  unexpected: number;
  errors: number;
  /** Summed over rounds: probes run, those that ran to their timeout without the expected result, and the judged ones unexpected or in 'error'. */
  probes: number;
  timedOut: number;
  unexpectedInTime: number;
  errorsInTime: number;
}

/** Medians over rounds of one path. */
export interface PathSummary {
  variants: Record<VariantName, VariantSummary>;
  /** CPU per probe of a kind, its success and failure runs together. */
  kinds: Record<Kind, { cpuMsPerProbe: number; probesPerSecond: number; p99Ms: number }>;
  /** The whole mix at the fixed concurrency: probes / wall time. */
  probesPerSecond: number;
  cpuMsPerProbe: number;
  p50Ms: number;
  p99Ms: number;
  /** Worst variant's event-loop delay p99 (ms beyond the sampling interval). */
  loopP99Ms: number | null;
  peakRssMB: number;
  paced?: { targetRate: number; achievedRate: number; p50Ms: number; p99Ms: number; cpuMsPerProbe: number; loopP99Ms: number; unexpected: number };
}

/** What the side-by-side part produces. */
export interface SideBySideResult {
  options: Omit<SideBySideOptions, 'log' | 'driver' | 'revisions' | 'driverNodeFlags'>;
  paths: Record<PathName, PathSummary>;
  /** Path (a) of each other build, by label. */
  revisions?: Record<string, PathSummary>;
  rounds: DriverResult[][];
  wallSeconds: number;
}

async function startServers(lab: Lab, parallel: number): Promise<RunningServer[]> {
  const out: RunningServer[] = [];
  let next = 0;
  await Promise.all(Array.from({ length: parallel }, async () => {
    while (next < lab.pods.length) {
      const pod = lab.pods[next++]!;
      out.push(await lab.startServer(pod, { ...POD_PORTS, grpcServices: { '': 'SERVING', [DOWN_SERVICE]: 'NOT_SERVING' } }));
    }
  }));
  return out;
}

/** Runs one driver process (in its own CPU cgroup when there are any) and returns its parsed result. */
function runDriver(driver: string, cfg: DriverConfig, cgroups: CpuCgroups | undefined, name: string, nodeFlags: string[] = []): Promise<DriverResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [...nodeFlags, driver, cfg.path], { stdio: ['pipe', 'pipe', 'pipe'] });
    // Placed before it can start its helper: every task it makes inherits the cgroup.
    const cpu = child.pid ? cgroups?.place(name, child.pid) : undefined;
    child.stdin.end(JSON.stringify(cpu ? { ...cfg, cpu } : cfg));
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => { stdout += d.toString(); });
    child.stderr.on('data', (d: Buffer) => { stderr = (stderr + d.toString()).slice(-8192); });
    child.on('error', reject);
    child.on('close', (code) => {
      const line = stdout.split('\n').find((l) => l.startsWith('result '));
      if (code !== 0 || !line) return reject(new Error(`driver ${cfg.path} exited ${code}: ${stderr.trim() || '(no stderr)'}`));
      resolve(JSON.parse(line.slice(7)) as DriverResult);
    });
  });
}

function summarisePath(runs: DriverResult[]): PathSummary {
  const variants = {} as Record<VariantName, VariantSummary>;
  for (const name of VARIANT_NAMES) {
    const vs = runs.map((r) => r.variants[name]);
    const loops = vs.map((v) => v.loopP99Ms).filter((x): x is number => x !== null);
    variants[name] = {
      cpuMsPerProbe: round(median(vs.map((v) => v.cpuMsPerProbe)), 4),
      agentMsPerProbe: round(median(vs.map((v) => v.cpu.agent / v.probes)), 4),
      helperMsPerProbe: round(median(vs.map((v) => (v.cpu.total - v.cpu.agent) / v.probes)), 4),
      procCpuMsPerProbe: round(median(vs.map((v) => v.cpu.procTotal / v.probes)), 4),
      probesPerSecond: round(median(vs.map((v) => v.probesPerSecond)), 1),
      p50Ms: round(median(vs.map((v) => v.p50Ms))),
      p99Ms: round(median(vs.map((v) => v.p99Ms))),
      loopP99Ms: loops.length ? round(median(loops)) : null,
      unexpected: vs.reduce((s, v) => s + v.unexpected, 0),
      errors: vs.reduce((s, v) => s + v.errors, 0),
      probes: vs.reduce((s, v) => s + v.probes, 0),
      timedOut: vs.reduce((s, v) => s + v.timedOut, 0),
      unexpectedInTime: vs.reduce((s, v) => s + v.unexpectedInTime, 0),
      errorsInTime: vs.reduce((s, v) => s + v.errorsInTime, 0),
    };
  }
  const kinds = {} as PathSummary['kinds'];
  for (const kind of KINDS) {
    const perRound = runs.map((r) => {
      const ok = r.variants[`${kind}-ok`];
      const fail = r.variants[`${kind}-fail`];
      return {
        cpu: (ok.cpu.total + fail.cpu.total) / (ok.probes + fail.probes),
        rate: (ok.probes + fail.probes) / ((ok.wallMs + fail.wallMs) / 1000),
        p99: Math.max(ok.p99Ms, fail.p99Ms),
      };
    });
    kinds[kind] = {
      cpuMsPerProbe: round(median(perRound.map((x) => x.cpu)), 4),
      probesPerSecond: round(median(perRound.map((x) => x.rate)), 1),
      p99Ms: round(median(perRound.map((x) => x.p99))),
    };
  }
  const whole = runs.map((r) => {
    const vs = Object.values(r.variants);
    const n = vs.reduce((s, v) => s + v.probes, 0);
    return {
      rate: n / (vs.reduce((s, v) => s + v.wallMs, 0) / 1000),
      cpu: vs.reduce((s, v) => s + v.cpu.total, 0) / n,
      loop: vs.some((v) => v.loopP99Ms === null) ? null : Math.max(...vs.map((v) => v.loopP99Ms as number)),
    };
  });
  const loops = whole.map((w) => w.loop).filter((x): x is number => x !== null);
  const summary: PathSummary = {
    variants,
    kinds,
    probesPerSecond: round(median(whole.map((w) => w.rate)), 1),
    cpuMsPerProbe: round(median(whole.map((w) => w.cpu)), 4),
    p50Ms: round(median(runs.map((r) => r.overall.p50Ms))),
    p99Ms: round(median(runs.map((r) => r.overall.p99Ms))),
    loopP99Ms: loops.length ? round(median(loops)) : null,
    peakRssMB: round(median(runs.map((r) => r.peakRssMB)), 1),
  };
  const paced = runs.map((r) => r.paced).filter((p) => p !== undefined);
  if (paced.length > 0) {
    summary.paced = {
      targetRate: paced[0]!.targetRate,
      achievedRate: round(median(paced.map((p) => p.achievedRate)), 1),
      p50Ms: round(median(paced.map((p) => p.p50Ms))),
      p99Ms: round(median(paced.map((p) => p.p99Ms))),
      cpuMsPerProbe: round(median(paced.map((p) => p.cpuMsPerProbe)), 4),
      loopP99Ms: round(median(paced.map((p) => p.loopP99Ms))),
      unexpected: paced.reduce((s, p) => s + p.unexpected, 0),
    };
  }
  return summary;
}

/** Builds the lab and the exporter, runs the rounds, tears everything down. */
export async function runSideBySide(opts: SideBySideOptions): Promise<SideBySideResult> {
  const t0 = Date.now();
  const { log, driver, revisions = [], driverNodeFlags, ...options } = opts;
  const runPaths = opts.paths ?? PATHS;
  // Policy 'none': path (d) and the exporter dial the pods from the node, as kubelet does today.
  const lab = await createLab({ pods: opts.pods, policy: 'none', tag: 'bench side-by-side' });
  let blackbox: Blackbox | undefined;
  const cgroups = CpuCgroups.open();
  if (!cgroups) log('side-by-side: no CPU cgroup available: CPU from /proc ticks only (coarser)');
  try {
    log(`side-by-side: lab ${lab.id} with ${opts.pods} pods; starting pod servers`);
    await startServers(lab, 8);
    blackbox = await startBlackbox();
    const pods = lab.pods.map((p) => ({ netns: p.netns, ipv4: p.ipv4, ipv6: p.ipv6 }));
    const rounds: DriverResult[][] = [];
    const revRounds: DriverResult[][] = revisions.map(() => []);
    for (let r = 0; r < opts.rounds; r++) {
      const round: DriverResult[] = [];
      for (const path of runPaths) {
        const cfg: DriverConfig = {
          path,
          pods,
          probes: opts.probes,
          warmup: opts.warmup,
          concurrency: opts.concurrency,
          timeoutSeconds: opts.timeoutSeconds,
        };
        if (path === 'blackbox') {
          const cpu = cgroups?.place('blackbox', blackbox.pid);
          cfg.blackbox = { url: blackbox.url, pid: blackbox.pid, ...(cpu ? { cpu } : {}) };
        }
        if (opts.paced && PACED_PATHS.includes(path)) cfg.paced = opts.paced;
        const t = Date.now();
        const flags = path === 'blackbox' ? [] : driverNodeFlags?.(`${path}-${r + 1}`);
        round.push(await runDriver(driver, cfg, cgroups, `${path}-${r + 1}`, flags));
        log(`  round ${r + 1}/${opts.rounds} ${path}: ${((Date.now() - t) / 1000).toFixed(1)} s`);
      }
      // Each round starts with the next revision: none always runs right after another.
      for (let k = 0; k < revisions.length; k++) {
        const i = (k + r) % revisions.length;
        const rev = revisions[i]!;
        const cfg: DriverConfig = { path: 'resident', pods, probes: opts.probes, warmup: opts.warmup, concurrency: opts.concurrency, timeoutSeconds: opts.timeoutSeconds };
        if (opts.paced) cfg.paced = opts.paced;
        const t = Date.now();
        revRounds[i]!.push(await runDriver(rev.driver, cfg, cgroups, `${rev.label}-${r + 1}`, driverNodeFlags?.(`${rev.label}-${r + 1}`)));
        log(`  round ${r + 1}/${opts.rounds} ${rev.label} (a): ${((Date.now() - t) / 1000).toFixed(1)} s`);
      }
      rounds.push(round);
    }
    const paths = {} as Record<PathName, PathSummary>;
    for (const path of runPaths) paths[path] = summarisePath(rounds.map((round) => round.find((x) => x.path === path) as DriverResult));
    const result: SideBySideResult = { options, paths, rounds, wallSeconds: round((Date.now() - t0) / 1000, 1) };
    if (revisions.length > 0) result.revisions = Object.fromEntries(revisions.map((rev, i) => [rev.label, summarisePath(revRounds[i]!)]));
    return result;
  } finally {
    await blackbox?.stop();
    await lab.destroy();
    cgroups?.close();
  }
}
