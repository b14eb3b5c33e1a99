/**
 * What a flooding gRPC server costs the prober and its neighbour (issue 43, the frame budget's two
 * holes): in this process (the prober, as in the agent), through lab pods and the resident helper.
 *
 *  1. `--attackers` attacker workers (period 1 s, timeout 5 s) against each flood (endless 1xx heads;
 *     SETTINGS re-armed on each connection): this process's CPU share, event-loop delay p99, and
 *     the flood frames each probe read before it was cut;
 *  2. the neighbour alone, then beside as many attacker workers of each flood (1xx heads; SETTINGS
 *     re-armed on each connection): its probes back to back (timeout 1 s), rate, p99 and slowest.
 *
 *   node test/bench/frame-flood.ts [--seconds 8] [--attackers 4]
 *
 * Run it from another checkout (a worktree of main) to compare before and after. Root only.
 */
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { ResidentHelper } from '../../agent/netns/helper.ts';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { runProbe } from '../../agent/probe/run.ts';
import type { SharedFrameBudget } from '../../agent/http2/frame-budget.ts';
import type { ProbeContext, ProbeOutcome } from '../../agent/probe/types.ts';
import { createLab, type LabPod } from '../lab/lab.ts';
import { startHostileServer, type H2Flood } from '../lab/hostile-server.ts';
import { quantile } from './stats.ts';

const { values: args } = parseArgs({ options: { seconds: { type: 'string', default: '8' }, attackers: { type: 'string', default: '4' } } });
const WINDOW_MS = Number(args.seconds) * 1000;
const ATTACKERS = Number(args.attackers);

/** The per-pod budgets when this checkout has them (after the fix); none before. */
async function podBudgets(): Promise<((uid: string) => SharedFrameBudget) | undefined> {
  try {
    // A variable path: a checkout from before the fix has no such module.
    const path = '../../agent/probe/pod-frame-budgets.ts';
    const m = (await import(path)) as { PodFrameBudgets: new () => { of(pod: { uid: string; namespace: string; name: string }): SharedFrameBudget } };
    const b = new m.PodFrameBudgets();
    return (uid) => b.of({ uid, namespace: 'lab', name: uid });
  } catch {
    return undefined;
  }
}

const pct = (values: number[], p: number): number => quantile([...values].sort((a, b) => a - b), p / 100);

async function worker(run: () => Promise<ProbeOutcome>, periodMs: number, until: number, out: ProbeOutcome[]): Promise<void> {
  const start = performance.now();
  while (performance.now() < until) {
    out.push(await run());
    const now = performance.now();
    const next = periodMs === 0 ? now : start + Math.ceil((now - start) / periodMs) * periodMs;
    if (next >= until) break;
    if (next > now) await new Promise((r) => setTimeout(r, next - now));
  }
}

async function main(): Promise<void> {
  const lab = await createLab({ pods: 2, policy: 'drop', tag: 'frame-flood-bench' });
  const [attacker, neighbour] = lab.pods as [LabPod, LabPod];
  const helper = await ResidentHelper.start();
  const hostile = await startHostileServer(attacker.name, { h2Informational: 0, h2Settings: 0 });
  const healthy = await lab.startServer(neighbour, { grpc: 0, grpcServices: { '': 'SERVING' } });
  const budgetOf = await podBudgets();
  const nodeSockets = new NodeSocketFactory();
  const ctx = (pod: LabPod, timeoutSeconds: number): ProbeContext => ({
    netns: pod.netns, podIPs: pod.ips, timeoutSeconds, sockets: helper, nodeSockets, kubeVersion: '1.34',
    hostFieldPolicy: 'refuse', happyEyeballs: false, ...(budgetOf ? { frameBudget: budgetOf(pod.name) } : {}),
  });
  const attack = (kind: H2Flood) => () => runProbe({ kind: 'grpc', port: hostile.ports[kind] as number }, ctx(attacker, 5));
  const healthyProbe = () => runProbe({ kind: 'grpc', port: healthy.ports.grpc as number }, ctx(neighbour, 1));
  console.log(`frame-flood bench: ${budgetOf ? 'per-pod frame budgets' : 'no per-pod frame budgets (before the fix)'}, window ${WINDOW_MS / 1000} s`);
  try {
    for (const kind of ['h2Informational', 'h2Settings'] as const) {
      const lag = monitorEventLoopDelay({ resolution: 10 });
      lag.enable();
      const cpu0 = process.cpuUsage();
      const t0 = performance.now();
      const runs = Array.from({ length: ATTACKERS }, (): ProbeOutcome[] => []);
      await Promise.all(runs.map((o) => worker(attack(kind), 1000, t0 + WINDOW_MS, o)));
      const wall = performance.now() - t0;
      const cpu = process.cpuUsage(cpu0);
      lag.disable();
      const out = runs.flat();
      // Frames without progress each probe read before it was cut, from its message ("(SETTINGS n)").
      const frames = out.map((o) => Number(/\((?:SETTINGS|1xx HEADERS) (\d+)/.exec(o.message)?.[1] ?? NaN)).filter((n) => !Number.isNaN(n));
      console.log(`${ATTACKERS} ${kind} probe workers: CPU ${(((cpu.user + cpu.system) / 1000 / wall) * 100).toFixed(1)} % of one core, ` +
        `loop delay p99 ${(lag.percentile(99) / 1e6).toFixed(1)} ms, ${out.length} probes (${[...new Set(out.map((o) => o.reason ?? o.result))].join(', ')})` +
        (frames.length ? `, flood frames read per probe: median ${pct(frames, 50)}, most ${Math.max(...frames)}` : ''));
    }
    for (const kind of [undefined, 'h2Informational', 'h2Settings'] as const) {
      const until = performance.now() + WINDOW_MS;
      const mine: ProbeOutcome[] = [];
      const theirs = Array.from({ length: kind ? ATTACKERS : 0 }, (): ProbeOutcome[] => []);
      await Promise.all([worker(healthyProbe, 0, until, mine), ...theirs.map((o) => worker(attack(kind!), 1000, until, o))]);
      const times = mine.map((o) => o.durationSeconds);
      const ok = mine.filter((o) => o.result === 'success').length;
      console.log(`neighbour ${kind ? `beside ${ATTACKERS} ${kind} workers` : 'alone'}: ${(mine.length / (WINDOW_MS / 1000)).toFixed(1)} probes/s, ${ok}/${mine.length} SERVING, ` +
        `p99 ${(pct(times, 99) * 1000).toFixed(0)} ms, slowest ${(Math.max(...times) * 1000).toFixed(0)} ms`);
    }
  } finally {
    await hostile.stop();
    await helper.close();
    await lab.destroy();
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
