/**
 * `make bench`: probe cost, latency and the scale curve, side by side for the in-netns paths,
 * kubelet's direct path and the blackbox exporter. Root only. Writes test/bench/results/latest.json
 * and docs/bench-latest.md (BENCH_QUICK=1: a temp dir, or BENCH_OUT) and prints the markdown.
 * Knobs (BENCH_*) are in config.ts; method and reading guide in docs/benchmark.md.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname } from 'node:path';
import { buildForBench } from './build.ts';
import { benchConfig, BenchConfigError } from './config.ts';
import { profileAgent } from './profile.ts';
import { checkTargets, machineInfo, renderMarkdown, type BenchResult } from './report.ts';
import { measurePoint, measureResolverCost, type ResolverCost, type ScalePoint } from './scale.ts';
import { createScaleEnv } from './scale-env.ts';
import { runSideBySide } from './sidebyside.ts';
import { renderShimMarkdown, runShimBench, shimBenchOptions, type ShimBenchResult } from './shim.ts';
import { round } from './stats.ts';

const log = (line: string): void => void process.stderr.write(`[bench] ${line}\n`);

/** Runs the scale curve (and the profile when asked) on one environment sized for the largest point. */
async function runScale(cfg: ReturnType<typeof benchConfig>, cli: string): Promise<{ scale: NonNullable<BenchResult['scale']>; profile?: BenchResult['profile'] }> {
  const t0 = Date.now();
  const maxPods = Math.max(...cfg.scalePods, cfg.profile ? cfg.profilePods : 0);
  const env = await createScaleEnv(maxPods, cfg.resolver, log);
  try {
    const setupSeconds = round((Date.now() - t0) / 1000, 1);
    const largest = Math.max(...cfg.scalePods);
    const resolverCost: ResolverCost[] = [];
    // Both resolvers at the largest point, whichever the agent uses; the curve's own resolver at
    // every point, so each point's CPU can include its amortised refresh.
    const refresh = new Map<number, ResolverCost>();
    for (const pods of [...new Set(cfg.scalePods)].sort((a, b) => a - b)) {
      const c = await measureResolverCost(env, cfg.resolver, pods);
      refresh.set(pods, c);
      if (pods === largest) resolverCost.push(c);
    }
    resolverCost.push(await measureResolverCost(env, cfg.resolver === 'procfs' ? 'address' : 'procfs', largest));
    const points: ScalePoint[] = [];
    // Idle first: the agent with no pods at all.
    // A longer window for idle: /proc counts 10 ms ticks, and idle is a few ticks per 10 s.
    const idle = await measurePoint(env, cli, 0, 10, cfg.quick ? cfg.scaleSeconds : Math.max(30, cfg.scaleSeconds), cfg.quick ? 2000 : 30_000);
    points.push(idle);
    log(`idle: ${idle.cpuPercent} % CPU, RSS ${idle.rssMB} MB`);
    for (const period of cfg.scalePeriods) {
      for (const pods of cfg.scalePods) {
        const t = Date.now();
        const pt = await measurePoint(env, cli, pods, period, cfg.scaleSeconds);
        pt.resolverCpuPercent = refresh.get(pods)?.amortizedPercent;
        points.push(pt);
        log(`scale ${pods} x 3 @${period}s: ${pt.cpuPercent} % CPU, ${pt.probesPerSecond}/s, RSS ${pt.rssMB} MB (${((Date.now() - t) / 1000).toFixed(0)} s)`);
      }
    }
    let profile: BenchResult['profile'];
    if (cfg.profile) {
      log(`profile: ${cfg.profilePods} pods x 3 @1s for ${cfg.profileSeconds} s`);
      const { file: _file, ...rest } = await profileAgent(env, cli, cfg.profilePods, 1, cfg.profileSeconds);
      profile = rest;
    }
    return { scale: { resolver: cfg.resolver, points, resolverCost, setupSeconds }, profile };
  } finally {
    await env.destroy();
  }
}

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) throw new BenchConfigError('the bench needs root (network namespaces, nftables, cgroups, setns)');
  const cfg = benchConfig();
  const t0 = Date.now();
  const machine = machineInfo();
  const build = await buildForBench({ fromSource: cfg.fromSource });
  if (build.note) log(build.note);
  try {
    log(`side-by-side: ${cfg.pods} pods, ${cfg.probes} probes x 8 entries x ${cfg.rounds} rounds, concurrency ${cfg.concurrency}`);
    const sideBySide = await runSideBySide({
      pods: cfg.pods,
      probes: cfg.probes,
      warmup: cfg.warmup,
      rounds: cfg.rounds,
      concurrency: cfg.concurrency,
      paced: cfg.paced,
      timeoutSeconds: cfg.timeoutSeconds,
      driver: build.driver,
      log,
    });
    const scaled = cfg.scale ? await runScale(cfg, build.cli) : undefined;
    // The kubelet shim (test/bench/shim.ts); BENCH_SHIM=0 skips it.
    const shim: ShimBenchResult | undefined = process.env.BENCH_SHIM === '0' ? undefined : await runShimBench({ ...shimBenchOptions(process.env, log), cli: build.cli });
    machine.loadAverageAtEnd = os.loadavg().map((x) => round(x, 2));
    const { jsonPath, markdownPath, ...config } = cfg;
    const result: BenchResult = {
      machine,
      config,
      build: { compiled: build.compiled, ...(build.note ? { note: build.note } : {}) },
      sideBySide,
      targets: checkTargets(sideBySide, scaled?.scale),
      wallSeconds: round((Date.now() - t0) / 1000, 1),
    };
    if (scaled) result.scale = scaled.scale;
    if (scaled?.profile) result.profile = scaled.profile;
    if (shim) Object.assign(result, { shim });
    const markdown = renderMarkdown(result) + (shim ? renderShimMarkdown(shim) : '');
    mkdirSync(dirname(jsonPath), { recursive: true });
    mkdirSync(dirname(markdownPath), { recursive: true });
    writeFileSync(jsonPath, `${JSON.stringify(result, null, 2)}\n`);
    writeFileSync(markdownPath, markdown);
    process.stdout.write(markdown);
    log(`wrote ${jsonPath} and ${markdownPath} (${result.wallSeconds} s)`);
  } finally {
    build.cleanup();
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`bench failed: ${err instanceof Error ? (err instanceof BenchConfigError ? err.message : err.stack) : String(err)}\n`);
  process.exitCode = 1;
});
