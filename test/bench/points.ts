/**
 * Focused scale measurements without the side-by-side run: `BENCH_POINTS=0x10,250x10 node
 * test/bench/points.ts` measures each pods×period point (0 pods = idle) with the daemon as the
 * curve does, plus one resolver refresh. For before/after checks of one change; the full bench
 * (`make bench`) is what docs/bench-latest.md comes from.
 *
 * BENCH_AGENT_VARIANTS='|--feature-gates=NetnsHelperPool=false' measures each point once per
 * variant (extra daemon flags, '|'-separated; '' is the defaults), interleaved over
 * BENCH_VARIANT_ROUNDS rounds (default 1), on the same pods: ratios from one run.
 *
 * BENCH_NODE_VARIANTS does the same for node flags (BENCH_NODE_FLAGS; NAME=value words set the
 * agent's environment, e.g. the DaemonSet's 'MALLOC_ARENA_MAX=1 MALLOC_MMAP_THRESHOLD_=131072').
 *
 * BENCH_POINTS_REVS='main=main' measures other git revisions too (compiled as bench-revs does, each
 * with its own launcher's node flags; the helper is this tree's), this tree labelled "this", in
 * an order rotated every round: a before/after of a change at the same points in one sitting.
 */
import { loadavg } from 'node:os';
import { buildForBench, buildRevision, type BenchBuild } from './build.ts';
import { measurePoint, measureResolverCost } from './scale.ts';
import { createScaleEnv } from './scale-env.ts';

const points = (process.env.BENCH_POINTS ?? '0x10,250x10').split(',').map((s) => s.split('x').map(Number) as [number, number]);
const seconds = Number(process.env.BENCH_SCALE_SECONDS ?? 20);
const resolver = process.env.BENCH_RESOLVER === 'address' ? 'address' : 'procfs';
const build = await buildForBench({ fromSource: process.env.BENCH_TS === '1' });
const builds: { label: string; build: BenchBuild }[] = [{ label: 'this', build }];
for (const r of (process.env.BENCH_POINTS_REVS ?? '').split(/[\s,]+/).filter(Boolean)) {
  const [label, rev] = r.split('=');
  if (!label || !rev) throw new Error(`BENCH_POINTS_REVS: want label=rev, got ${JSON.stringify(r)}`);
  builds.push({ label, build: await buildRevision(label, rev) });
}
const maxPods = Math.max(1, ...points.map(([p]) => p));
const env = await createScaleEnv(maxPods, resolver, (l) => process.stderr.write(`${l}\n`));
try {
  if (process.env.BENCH_RESOLVER_COST !== '0') {
    for (const r of ['procfs', 'address'] as const) process.stdout.write(`${JSON.stringify(await measureResolverCost(env, r, maxPods))}\n`);
  }
  const variants = process.env.BENCH_AGENT_VARIANTS?.split('|') ?? [process.env.BENCH_AGENT_ARGS ?? ''];
  // BENCH_NODE_VARIANTS: the same for node flags (and NAME=value environment words), as BENCH_NODE_FLAGS.
  const nodeVariants = process.env.BENCH_NODE_VARIANTS?.split('|') ?? [process.env.BENCH_NODE_FLAGS ?? ''];
  const rounds = Number(process.env.BENCH_VARIANT_ROUNDS ?? 1);
  // Each round rotates the builds' order, so neither always runs first (or on a warmer machine).
  const order = (round: number): typeof builds => builds.map((_, i) => builds[(i + round) % builds.length] as (typeof builds)[number]);
  const runs = points.flatMap(([pods, period]) => Array.from({ length: rounds }, (_, r) => order(r).flatMap((b) => variants.flatMap((v) => nodeVariants.map((n) => [pods, period, v, b, n] as const)))).flat());
  const several = variants.length > 1 || builds.length > 1 || nodeVariants.length > 1;
  for (const [pods, period, variant, b, nodeFlags] of runs) {
    process.env.BENCH_AGENT_ARGS = variant;
    process.env.BENCH_NODE_FLAGS = nodeFlags;
    const label = [builds.length > 1 ? b.label : '', variants.length > 1 ? variant || 'defaults' : '', nodeVariants.length > 1 ? nodeFlags || 'launcher' : ''].filter(Boolean).join(' ');
    if (several) process.stdout.write(`[${label}] load ${loadavg().map((l) => l.toFixed(1)).join(' ')} `);
    const pt = await measurePoint(env, b.build.cli, pods, period, seconds, undefined, b.build.root).catch((err: unknown) => {
      // One variant failing (an overloaded machine) must not lose the others' lines.
      if (!several) throw err;
      process.stdout.write(`${pods}x3@${period}s: failed: ${String(err).split('\n')[0]}\n`);
      return undefined;
    });
    if (!pt) continue;
    process.stdout.write(`${pods}x3@${period}s: cpu ${pt.cpuPercent}% (helper ${pt.helperCpuPercent}) probes/s ${pt.probesPerSecond}/${pt.expectedProbesPerSecond} rss ${pt.rssMB} (anon ${pt.rssSplitMB?.anon} file ${pt.rssSplitMB?.file}) peak ${pt.peakRssMB} heap ${pt.heap.usedMB}/${pt.heap.totalMB} loop ${pt.loopP99RawMs} nonSuccess ${pt.nonSuccess}\n`);
  }
} finally {
  await env.destroy();
  for (const b of builds) b.build.cleanup();
}
