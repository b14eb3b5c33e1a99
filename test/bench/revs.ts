/**
 * Before/after in one run: the side-by-side mix on path (a) for this tree and for other git
 * revisions, interleaved round by round (this tree's paths first, then each revision, their order
 * rotated every round; name this tree as a revision too, e.g. head=HEAD, to rotate it as well), plus
 * blackbox_exporter (e) by default. Each revision is compiled with its own driver and its own
 * helper (build.ts buildRevision), so only the code differs between the columns.
 *
 *   BENCH_REVS='base=63b094f budgets-off=86bcf41^' node test/bench/revs.ts
 *
 * Env: BENCH_REVS (label=rev, space or comma separated; none: this tree alone, e.g. to profile), BENCH_PATHS (this tree's paths,
 * default resident,blackbox), BENCH_DRIVER_PROFILE (a dir: each agent driver runs with
 * --cpu-prof there), and the side-by-side's BENCH_PODS, _PROBES, _WARMUP, _ROUNDS, _CONCURRENCY,
 * _PACED_RATE and _PACED_SECONDS (an open-loop run at that rate after each closed loop, every
 * revision too: the per-probe cost at a kubelet-like rate, where each probe wakes the agent alone).
 */
import os from 'node:os';
import { buildForBench, buildRevision, type BenchBuild } from './build.ts';
import { benchConfig } from './config.ts';
import { PATH_LETTER, PATHS, type PathName } from './driver.ts';
import { KINDS } from './mix.ts';
import { runSideBySide, type PathSummary } from './sidebyside.ts';
import { round } from './stats.ts';

const log = (line: string): void => void process.stderr.write(`[revs] ${line}\n`);

function parseRevs(raw: string | undefined): { label: string; rev: string }[] {
  const list = (raw ?? '').split(/[\s,]+/).filter(Boolean).map((x) => {
    const i = x.indexOf('=');
    if (i <= 0 || i === x.length - 1) throw new Error(`BENCH_REVS: want label=rev, got ${JSON.stringify(x)}`);
    return { label: x.slice(0, i), rev: x.slice(i + 1) };
  });
  return list;
}

function parsePaths(raw: string | undefined): PathName[] {
  const list = (raw ?? 'resident,blackbox').split(',').map((x) => x.trim()).filter(Boolean);
  for (const p of list) if (!PATHS.includes(p as PathName)) throw new Error(`BENCH_PATHS: ${JSON.stringify(p)} is not one of ${PATHS.join(', ')}`);
  if (!list.includes('resident')) throw new Error('BENCH_PATHS: must include resident (the revisions are compared with it)');
  return PATHS.filter((p) => list.includes(p));
}

const f = (x: number): string => x.toFixed(3);
const ratio = (x: number, base: number): string => (base > 0 ? `${(x / base).toFixed(2)}x` : 'n/a');
/** Agent-process CPU per probe of a kind (the helper and its children left out). */
function agentMs(s: PathSummary, kind: string): number {
  const ok = s.variants[`${kind}-ok` as keyof PathSummary['variants']];
  const fail = s.variants[`${kind}-fail` as keyof PathSummary['variants']];
  return (ok.agentMsPerProbe + fail.agentMsPerProbe) / 2;
}

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) throw new Error('the bench needs root');
  const revs = parseRevs(process.env.BENCH_REVS);
  const paths = parsePaths(process.env.BENCH_PATHS);
  const cfg = benchConfig();
  const profileDir = process.env.BENCH_DRIVER_PROFILE;
  const builds: BenchBuild[] = [];
  try {
    const self = await buildForBench();
    builds.push(self);
    if (self.note) log(self.note);
    const others: { label: string; driver: string }[] = [];
    for (const r of revs) {
      log(`building ${r.label} = ${r.rev}`);
      const b = await buildRevision(r.label, r.rev);
      builds.push(b);
      if (b.note) log(b.note);
      others.push({ label: r.label, driver: b.driver });
    }
    const loadStart = os.loadavg().map((x) => round(x, 2));
    const sbs = await runSideBySide({
      pods: cfg.pods,
      probes: cfg.probes,
      warmup: cfg.warmup,
      rounds: cfg.rounds,
      concurrency: cfg.concurrency,
      timeoutSeconds: cfg.timeoutSeconds,
      driver: self.driver,
      paths,
      revisions: others,
      ...(cfg.paced ? { paced: cfg.paced } : {}),
      driverNodeFlags: profileDir ? (name) => ['--cpu-prof', `--cpu-prof-dir=${profileDir}`, `--cpu-prof-name=${name}.cpuprofile`] : undefined,
      log,
    });
    const loadEnd = os.loadavg().map((x) => round(x, 2));
    const a = sbs.paths.resident;
    const e = sbs.paths.blackbox;
    const L: string[] = [];
    L.push(`${cfg.pods} pods, ${cfg.probes} probes per mix entry after ${cfg.warmup} warm-up, concurrency ${cfg.concurrency}, medians of ${cfg.rounds} interleaved rounds (${paths.map((p) => `(${PATH_LETTER[p]})`).join(' ')} then ${revs.map((r) => r.label).join(', ')}).`);
    L.push(`Load average at start ${loadStart.join(' / ')}, at end ${loadEnd.join(' / ')}. Revisions: ${revs.map((r) => `${r.label} = ${r.rev}`).join(', ')}.`, '');
    L.push('CPU ms per probe, (a) agent + helper [agent process alone]; ratio = this tree / revision:', '');
    const head = ['kind', 'this tree (a)', ...revs.map((r) => r.label), ...revs.map((r) => `this / ${r.label}`), ...revs.map((r) => `agent this / ${r.label}`)];
    if (e) head.push('(e) blackbox', '(a) / (e)');
    L.push(`| ${head.join(' | ')} |`, `|${head.map(() => '---').join('|')}|`);
    const row = (label: string, total: (s: PathSummary) => number, agent: (s: PathSummary) => number): void => {
      const rs = revs.map((r) => sbs.revisions?.[r.label] as PathSummary);
      const cells = [label, `${f(total(a))} [${f(agent(a))}]`, ...rs.map((s) => `${f(total(s))} [${f(agent(s))}]`), ...rs.map((s) => ratio(total(a), total(s))), ...rs.map((s) => ratio(agent(a), agent(s)))];
      if (e) cells.push(f(total(e)), ratio(total(a), total(e)));
      L.push(`| ${cells.join(' | ')} |`);
    };
    for (const kind of KINDS) row(kind, (s) => s.kinds[kind].cpuMsPerProbe, (s) => agentMs(s, kind));
    row('whole mix', (s) => s.cpuMsPerProbe, (s) => KINDS.reduce((t, k) => t + agentMs(s, k), 0) / KINDS.length);
    if (cfg.paced && a.paced) {
      // Open loop at a low rate: each probe wakes the agent on its own, as kubelet's period does.
      const cells = revs.map((r) => {
        const p = sbs.revisions?.[r.label]?.paced;
        return p ? `${r.label} ${f(p.cpuMsPerProbe)} (this / ${r.label} ${ratio(a.paced!.cpuMsPerProbe, p.cpuMsPerProbe)})` : `${r.label} -`;
      });
      L.push('', `Paced at ${cfg.paced.rate}/s for ${cfg.paced.seconds} s (the healthy tcp/http/grpc entries, open loop), CPU ms per probe, medians: this tree ${f(a.paced.cpuMsPerProbe)}; ${cells.join('; ')}.`);
    }
    const columns: [string, PathSummary][] = [['this tree', a], ...revs.map((r) => [r.label, sbs.revisions?.[r.label] as PathSummary] as [string, PathSummary])];
    const bad = columns.map(([label, s]) => [label, Object.entries(s.variants).filter(([, v]) => v.unexpected > 0).map(([n, v]) => `${n} ${v.unexpected}`)] as const).filter(([, l]) => l.length > 0);
    L.push('', bad.length === 0 ? 'Every probe gave the expected result.' : `**Unexpected results** (a broken build or timeouts under load): ${bad.map(([label, l]) => `${label}: ${l.join(', ')}`).join('; ')}.`);
    process.stdout.write(`${L.join('\n')}\n`);
  } finally {
    for (const b of builds) b.cleanup();
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`bench revs failed: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exitCode = 1;
});
