/**
 * Focused scale measurements without the side-by-side run: `BENCH_POINTS=0x10,250x10 node
 * test/bench/points.ts` measures each pods×period point (0 pods = idle) with the daemon as the
 * curve does, plus one resolver refresh. For before/after checks of one change; the full bench
 * (`make bench`) is what docs/bench-latest.md comes from.
 *
 * BENCH_AGENT_VARIANTS='|--feature-gates=NetnsHelperPool=false' measures each point once per
 * variant (extra daemon flags, '|'-separated; '' is the defaults), interleaved over
 * BENCH_VARIANT_ROUNDS rounds (default 1), on the same pods: ratios from one run.
 */
import { loadavg } from 'node:os';
import { buildForBench } from './build.ts';
import { measurePoint, measureResolverCost } from './scale.ts';
import { createScaleEnv } from './scale-env.ts';

const points = (process.env.BENCH_POINTS ?? '0x10,250x10').split(',').map((s) => s.split('x').map(Number) as [number, number]);
const seconds = Number(process.env.BENCH_SCALE_SECONDS ?? 20);
const resolver = process.env.BENCH_RESOLVER === 'address' ? 'address' : 'procfs';
const build = await buildForBench({ fromSource: process.env.BENCH_TS === '1' });
const maxPods = Math.max(1, ...points.map(([p]) => p));
const env = await createScaleEnv(maxPods, resolver, (l) => process.stderr.write(`${l}\n`));
try {
  if (process.env.BENCH_RESOLVER_COST !== '0') {
    for (const r of ['procfs', 'address'] as const) process.stdout.write(`${JSON.stringify(await measureResolverCost(env, r, maxPods))}\n`);
  }
  const variants = process.env.BENCH_AGENT_VARIANTS?.split('|') ?? [process.env.BENCH_AGENT_ARGS ?? ''];
  const rounds = Number(process.env.BENCH_VARIANT_ROUNDS ?? 1);
  const runs = points.flatMap(([pods, period]) => Array.from({ length: rounds }, () => variants.map((v) => [pods, period, v] as const)).flat());
  for (const [pods, period, variant] of runs) {
    process.env.BENCH_AGENT_ARGS = variant;
    if (variants.length > 1) process.stdout.write(`[${variant || 'defaults'}] load ${loadavg().map((l) => l.toFixed(1)).join(' ')} `);
    const pt = await measurePoint(env, build.cli, pods, period, seconds).catch((err: unknown) => {
      // One variant failing (an overloaded machine) must not lose the others' lines.
      if (variants.length === 1) throw err;
      process.stdout.write(`${pods}x3@${period}s: failed: ${String(err).split('\n')[0]}\n`);
      return undefined;
    });
    if (!pt) continue;
    process.stdout.write(`${pods}x3@${period}s: cpu ${pt.cpuPercent}% (helper ${pt.helperCpuPercent}) probes/s ${pt.probesPerSecond}/${pt.expectedProbesPerSecond} rss ${pt.rssMB} (anon ${pt.rssSplitMB?.anon} file ${pt.rssSplitMB?.file}) peak ${pt.peakRssMB} heap ${pt.heap.usedMB}/${pt.heap.totalMB} loop ${pt.loopP99RawMs} nonSuccess ${pt.nonSuccess}\n`);
  }
} finally {
  await env.destroy();
  build.cleanup();
}
