/**
 * Turns a bench run into the target checks (PASS/MISS) and the markdown of docs/bench-latest.md.
 */
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import os from 'node:os';
import { launcherNodeFlags } from './agent-process.ts';
import type { BenchConfig } from './config.ts';
import type { ProfileResult } from './profile.ts';
import { PATH_LETTER, PATHS, type PathName } from './driver.ts';
import { KINDS, VARIANT_NAMES, type Kind } from './mix.ts';
import { PROM_LOOP_RESOLUTION_MS, type ResolverCost, type ScalePoint } from './scale.ts';
import type { SideBySideResult } from './sidebyside.ts';
import { round } from './stats.ts';

/** The machine a run happened on. */
export interface MachineInfo {
  date: string;
  cpu: string;
  cores: number;
  memoryGB: number;
  kernel: string;
  node: string;
  commit: string;
  loadAverageAtStart: number[];
  loadAverageAtEnd?: number[];
}

/** One target with its verdict; pass null = not measured in this run. */
export interface TargetCheck {
  target: string;
  measured: string;
  limit: string;
  pass: boolean | null;
}

/** Everything latest.json holds. */
export interface BenchResult {
  machine: MachineInfo;
  config: Omit<BenchConfig, 'jsonPath' | 'markdownPath'>;
  build: { compiled: boolean; note?: string };
  sideBySide: SideBySideResult;
  scale?: { resolver: string; points: ScalePoint[]; resolverCost: ResolverCost[]; setupSeconds: number };
  profile?: Omit<ProfileResult, 'file'>;
  targets: TargetCheck[];
  wallSeconds: number;
}

/** Describes this machine (read-only commands only). */
export function machineInfo(): MachineInfo {
  let cpu = os.cpus()[0]?.model ?? 'unknown';
  try {
    cpu = /^model name\s*:\s*(.+)$/m.exec(readFileSync('/proc/cpuinfo', 'utf8'))?.[1] ?? cpu;
  } catch {
    // keep os.cpus()'s answer
  }
  let commit = 'unknown';
  try {
    commit = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
  } catch {
    // not a checkout
  }
  return {
    date: new Date().toISOString(),
    cpu,
    cores: os.cpus().length,
    memoryGB: round(os.totalmem() / 2 ** 30, 1),
    kernel: os.release(),
    node: process.version,
    commit,
    loadAverageAtStart: os.loadavg().map((x) => round(x, 2)),
  };
}

const ms = (x: number, d = 3): string => (Number.isFinite(x) ? x.toFixed(d) : 'n/a');
/** An open-loop run kept its rate (5 % slack for start and end effects). */
const sustained = (x: { achievedRate: number; targetRate: number }): boolean => x.achievedRate >= 0.95 * x.targetRate;

/** Checks every target the issue lists against the measurements. */
export function checkTargets(sbs: SideBySideResult, scale: BenchResult['scale']): TargetCheck[] {
  const out: TargetCheck[] = [];
  const p = sbs.paths;
  for (const kind of ['tcp', 'http', 'grpc'] as Kind[]) {
    const d = p.node.kinds[kind].cpuMsPerProbe;
    const a = p.resident.kinds[kind].cpuMsPerProbe;
    const b = p.warm.kinds[kind].cpuMsPerProbe;
    out.push({ target: `(a) default CPU/probe, ${kind}`, measured: `${ms(a)} ms (d ${ms(d)}, +${ms(a - d)})`, limit: `<= d + 0.15 = ${ms(d + 0.15)} ms`, pass: a <= d + 0.15 });
    out.push({ target: `(b) warm CPU/probe, ${kind}`, measured: `${ms(b)} ms (d ${ms(d)}, +${ms(b - d)})`, limit: `<= d + 0.15 = ${ms(d + 0.15)} ms`, pass: b <= d + 0.15 });
  }
  for (const kind of KINDS) {
    const a = p.resident.kinds[kind].cpuMsPerProbe;
    const e = p.blackbox.kinds[kind].cpuMsPerProbe;
    out.push({ target: `(a) default CPU/probe <= blackbox, ${kind}`, measured: `${ms(a)} ms vs ${ms(e)} ms`, limit: '<= (e)', pass: a <= e });
  }
  const at = (pods: number, period: number): ScalePoint | undefined => scale?.points.find((x) => x.pods === pods && x.periodSeconds === period);
  // CPU targets include the amortised resolver refresh (issue 14); RSS is judged at the window's end and at peak.
  const cpuOf = (pt: ScalePoint): number => round(pt.cpuPercent + (pt.resolverCpuPercent ?? 0), 2);
  const cpuText = (pt: ScalePoint): string => `${cpuOf(pt)} % of a core (window ${pt.cpuPercent} + resolver ${pt.resolverCpuPercent ?? 0})`;
  const idle = at(0, 10);
  out.push({ target: 'idle (0 pods): CPU', measured: idle ? `${idle.cpuPercent} % of a core` : 'not run', limit: '<= 0.2 %', pass: idle ? idle.cpuPercent <= 0.2 : null });
  out.push({ target: 'idle (0 pods): RSS (agent + helper)', measured: idle ? `${idle.rssMB} MB (peak ${idle.peakRssMB})` : 'not run', limit: '<= 90 MB', pass: idle ? idle.rssMB <= 90 : null });
  for (const [period, cpu, rss] of [[10, 4, 120], [1, 30, 140]] as const) {
    const pt = at(250, period);
    out.push({ target: `250 pods x 3 @${period}s: CPU`, measured: pt ? cpuText(pt) : 'not run', limit: `<= ${cpu} %`, pass: pt ? cpuOf(pt) <= cpu : null });
    out.push({ target: `250 pods x 3 @${period}s: RSS (agent + helper)`, measured: pt ? `${pt.rssMB} MB (peak ${pt.peakRssMB})` : 'not run', limit: `<= ${rss} MB`, pass: pt ? pt.peakRssMB <= rss : null });
    if (pt) out.push({ target: `250 pods x 3 @${period}s: keeps up`, measured: `${pt.probesPerSecond}/s of ${pt.expectedProbesPerSecond}`, limit: '>= 95 %', pass: pt.probesPerSecond >= 0.95 * pt.expectedProbesPerSecond });
  }
  for (const pt of (scale?.points ?? []).filter((x) => x.pods > 0)) {
    out.push({ target: `event-loop p99, ${pt.pods} x 3 @${pt.periodSeconds}s`, measured: `${ms(pt.loopP99Ms, 2)} ms (raw ${ms(pt.loopP99RawMs, 2)})`, limit: '<= 5 ms', pass: pt.loopP99Ms <= 5 });
  }
  const d = p.node.paced;
  for (const path of ['resident', 'warm'] as PathName[]) {
    const x = p[path].paced;
    const name = `(${PATH_LETTER[path]}) p99 latency at ${x?.targetRate ?? '?'} probes/s`;
    if (!x || !d) {
      out.push({ target: name, measured: 'not run', limit: '<= (d) p99 + 2 ms', pass: null });
    } else if (!sustained(d)) {
      // The direct path itself could not keep the rate: the machine, not the path, set the latency.
      out.push({ target: name, measured: `${ms(x.p99Ms)} ms (d ${ms(d.p99Ms)}); (d) reached only ${d.achievedRate}/s`, limit: `<= ${ms(d.p99Ms + 2)} ms`, pass: null });
    } else {
      const note = sustained(x) ? '' : `; reached only ${x.achievedRate}/s`;
      out.push({ target: name, measured: `${ms(x.p99Ms)} ms (d ${ms(d.p99Ms)})${note}`, limit: `<= ${ms(d.p99Ms + 2)} ms`, pass: sustained(x) && x.p99Ms <= d.p99Ms + 2 });
    }
  }
  return out;
}

const LEGEND: Record<PathName, string> = {
  resident: '(a) resident helper, fork per probe (default)',
  warm: '(b) warm helper, setns there and back (WarmNetnsHelper)',
  spawn: '(c) spawn per probe from Node',
  node: "(d) direct from the node netns (kubelet's path today)",
  blackbox: '(e) blackbox_exporter 0.23 via /probe',
};

function row(cells: (string | number)[]): string {
  return `| ${cells.join(' | ')} |`;
}

function ratio(x: number, base: number): string {
  return Number.isFinite(x) && base > 0 ? `${(x / base).toFixed(2)}x` : 'n/a';
}

/** The markdown of docs/bench-latest.md. */
export function renderMarkdown(r: BenchResult): string {
  const s = r.sideBySide;
  const p = s.paths;
  const o = s.options;
  const L: string[] = [];
  const m = r.machine;
  const precise = s.rounds.every((round) => round.every((d) => Object.values(d.variants).every((v) => v.cpu.cgroupTotal !== null)));
  const cpuSource = precise
    ? "CPU = the kernel's exact runtime of each driver's own cgroup: the agent, its helper and every child they forked; (e) = the exporter's cgroup only (the /proc tick sums in latest.json agree)."
    : 'CPU = /proc utime+stime (+ reaped children) of the agent and its helper, in 10 ms ticks (no CPU cgroup could be made); (e) = the exporter process only.';
  L.push('# probe-agent benchmark: latest run', '');
  L.push(`${m.date} on ${m.cpu}, ${m.cores} cores, ${m.memoryGB} GB, Linux ${m.kernel}, Node ${m.node}, commit ${m.commit}.`);
  L.push(`Load average at start ${m.loadAverageAtStart.join(' / ')}${m.loadAverageAtEnd ? `, at end ${m.loadAverageAtEnd.join(' / ')}` : ''} (a shared machine: other work ran alongside).`);
  L.push(`Agent code: ${r.build.compiled ? 'compiled by tsc, as bin/probe-agent runs it' : 'TypeScript sources via type stripping'}. Whole run: ${r.wallSeconds} s. How to read this: docs/benchmark.md.`, '');
  L.push(`## Side by side`, '');
  L.push(`${o.pods} pods (lab netns, test/lab/pod-server.ts), ${o.probes} measured probes per mix entry and round after ${o.warmup} warm-up, concurrency ${o.concurrency}, medians of ${o.rounds} interleaved round(s) (a, b, c, d, e, repeat). ${cpuSource}`, '');
  for (const path of PATHS) L.push(`- ${LEGEND[path]}`);
  L.push('', '### CPU ms per probe (success and failure runs of a kind together)', '');
  L.push(row(['kind', '(a)', '(b)', '(c)', '(d)', '(e)', 'a/d', 'b/d', 'c/d', 'e/d']));
  L.push(row(Array(10).fill('---')));
  const kindRow = (label: string, get: (path: PathName) => number): void => {
    const v = Object.fromEntries(PATHS.map((x) => [x, get(x)])) as Record<PathName, number>;
    L.push(row([label, ...PATHS.map((x) => ms(v[x])), ratio(v.resident, v.node), ratio(v.warm, v.node), ratio(v.spawn, v.node), ratio(v.blackbox, v.node)]));
  };
  for (const kind of KINDS) kindRow(kind, (x) => p[x].kinds[kind].cpuMsPerProbe);
  kindRow('whole mix', (x) => p[x].cpuMsPerProbe);
  L.push('', '### Throughput, latency, event loop, memory (whole mix at the fixed concurrency)', '');
  L.push(row(['path', 'probes/s', 'vs (d)', 'p50 ms', 'p99 ms', 'loop p99 ms', 'peak RSS MB', 'CPU ms/probe']));
  L.push(row(Array(8).fill('---')));
  for (const path of PATHS) {
    const x = p[path];
    L.push(row([`(${PATH_LETTER[path]}) ${path}`, x.probesPerSecond, ratio(x.probesPerSecond, p.node.probesPerSecond), ms(x.p50Ms), ms(x.p99Ms),
      x.loopP99Ms === null ? 'n/a (Go)' : ms(x.loopP99Ms, 2), x.peakRssMB, ms(x.cpuMsPerProbe)]));
  }
  L.push('', 'Peak RSS: the measuring process (the agent for a-d: Node, the probers, its bookkeeping) plus the helper; for (e) the exporter alone. (e)\'s CPU includes serving the /probe request and rendering its metrics page, which is how Prometheus uses it; its latency includes that request too.');
  L.push('', '### Per mix entry: CPU ms/probe, p50 / p99 ms', '');
  L.push(row(['entry', ...PATHS.map((x) => `(${PATH_LETTER[x]})`)]));
  L.push(row(Array(PATHS.length + 1).fill('---')));
  for (const v of VARIANT_NAMES) {
    L.push(row([v, ...PATHS.map((x) => {
      const e = p[x].variants[v];
      const late = e.timedOut > 0 ? `, ${e.timedOut} ran to their timeout` : '';
      const bad = e.unexpected > 0 ? ` (${e.unexpected} unexpected${late})` : '';
      return `${ms(e.cpuMsPerProbe)}, ${ms(e.p50Ms, 2)} / ${ms(e.p99Ms, 2)}${bad}`;
    })]));
  }
  if (p.node.paced) {
    L.push('', `### Latency at a fixed rate (${p.node.paced.targetRate} probes/s, open loop; tcp-ok, http-ok, grpc-ok in turn, like the scale curve's healthy pods)`, '');
    L.push('A rate the machine cannot sustain turns this into a queueing measurement: the latency target is only judged when (d) reached 95 % of the rate.', '');
    L.push(row(['path', 'achieved/s', 'p50 ms', 'p99 ms', 'p99 - (d) ms', 'CPU ms/probe', 'loop p99 ms']));
    L.push(row(Array(7).fill('---')));
    for (const path of ['resident', 'warm', 'node'] as PathName[]) {
      const x = p[path].paced;
      if (!x) continue;
      L.push(row([`(${PATH_LETTER[path]}) ${path}`, x.achievedRate, ms(x.p50Ms), ms(x.p99Ms), ms(x.p99Ms - p.node.paced.p99Ms), ms(x.cpuMsPerProbe), ms(x.loopP99Ms, 2)]));
    }
  }
  if (r.scale) {
    L.push('', `## Scale curve: \`probe-agent run\` against the test kubelet (netns resolver: ${r.scale.resolver})`, '');
    const flags = launcherNodeFlags();
    L.push(`The agent runs with bin/probe-agent's node flags (${flags.length ? flags.map((f) => `\`${f}\``).join(' ') : 'none'}). 3 probes per pod (HTTP liveness + gRPC readiness on the app, TCP readiness on a sidecar), kubelet poll 5 s. Measured over a steady window that starts once every pod was resolved and the first period (start jitter) is over. CPU = agent + helper (children included) from /proc; loop p99 = nodejs_eventloop_lag_p99_seconds over the window minus its ${PROM_LOOP_RESOLUTION_MS} ms sampling interval (raw value in brackets).`, '');
    L.push(row(['pods x probes', 'period', 'probes/s (expected)', 'CPU % of a core: window (helper) + resolver', 'RSS MB (peak)', 'heap used / total MB', 'loop p99 ms (raw)', 'non-success', 'cold start s (CPU s)']));
    L.push(row(Array(9).fill('---')));
    for (const pt of r.scale.points) {
      const cpu = `${pt.cpuPercent} (${pt.helperCpuPercent})${pt.resolverCpuPercent !== undefined ? ` + ${pt.resolverCpuPercent}` : ''}`;
      L.push(row([pt.pods === 0 ? 'idle (0 pods)' : `${pt.pods} x ${pt.probesPerPod}`, pt.pods === 0 ? '-' : `${pt.periodSeconds} s`, `${pt.probesPerSecond} (${pt.expectedProbesPerSecond})`, cpu,
        `${pt.rssMB} (${pt.peakRssMB})${pt.rssSplitMB ? `; anon ${pt.rssSplitMB.anon}, file ${pt.rssSplitMB.file}` : ''}`, `${pt.heap.usedMB} / ${pt.heap.totalMB}`, `${ms(pt.loopP99Ms, 2)} (${ms(pt.loopP99RawMs, 2)})`, pt.nonSuccess, `${pt.coldStart.seconds} (${pt.coldStart.cpuSeconds})`]));
    }
    const over = r.scale.points.filter((pt) => pt.pods > 0 && pt.probesPerSecond > pt.expectedProbesPerSecond * 1.05);
    const under = r.scale.points.filter((pt) => pt.pods > 0 && pt.probesPerSecond < pt.expectedProbesPerSecond * 0.95);
    if (over.length) L.push('', `**More probes than the periods ask for** at ${over.map((pt) => `${pt.pods} x 3 @${pt.periodSeconds}s`).join(', ')}: workers ran extra probes (see docs/benchmark.md, "How to read the numbers"); CPU above includes them.`);
    if (under.length) L.push('', `**Fewer probes than the periods ask for** at ${under.map((pt) => `${pt.pods} x 3 @${pt.periodSeconds}s`).join(', ')}: the agent did not keep up.`);
    if (r.scale.resolverCost.length) {
      L.push('', 'Netns resolution is cached (60 s TTL, jittered down by up to 25 %: 52.5 s on average), so it recurs outside the windows above; the "+ resolver" share in the CPU column is one refresh of that point\'s pods amortised over the mean TTL. One refresh of every pod at the largest point, measured with the agent\'s resolver classes on this node (the pods of a refresh share the resolver\'s scans):', '');
      L.push(row(['resolver', 'examines', 'pods', 'CPU ms / refresh', 'wall ms / refresh', 'CPU ms / pod', 'amortised over the TTL']));
      L.push(row(Array(7).fill('---')));
      for (const c of r.scale.resolverCost) {
        L.push(row([c.resolver, `${c.examined} ${c.resolver === 'address' ? 'netns' : 'processes'}`, c.pods, c.cpuMsPerRefresh, c.wallMsPerRefresh, c.cpuMsPerPod, `${c.amortizedPercent} % of a core`]));
      }
    }
  }
  if (r.profile) {
    L.push('', `## CPU profile: ${r.profile.pods} pods x 3 @${r.profile.periodSeconds}s (node --cpu-prof, steady ${r.profile.windowSeconds} s window, agent + helper ${r.profile.cpuPercent} % of a core with the profiler on)`, '');
    L.push(r.profile.markdown);
  }
  L.push('', '## Targets', '');
  L.push(row(['target', 'measured', 'limit', 'verdict']));
  L.push(row(Array(4).fill('---')));
  for (const t of r.targets) L.push(row([t.target, t.measured, t.limit, t.pass === null ? 'n/a' : t.pass ? 'PASS' : '**MISS**']));
  const unexpected = PATHS.flatMap((x) => VARIANT_NAMES.map((v) => p[x].variants[v].unexpected)).reduce((a, b) => a + b, 0);
  L.push('', unexpected === 0 ? 'Every probe of the mix gave the expected result on every path.' : `**${unexpected} probes gave an unexpected result**: see the per-entry table.`);
  return `${L.join('\n')}\n`;
}
