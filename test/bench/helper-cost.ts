/**
 * What one in-netns socket costs, per path: the resident helper (a clone child per socket), its
 * pool of long-lived workers (--pool 4), its warm variant (setns there and back in the resident)
 * and a per-socket spawn from Node. Prints CPU per
 * socket (agent + helper, children included), createSocket latency and event-loop delay.
 *
 *   node test/bench/helper-cost.ts [--n 2000] [--concurrency 16] [--rounds 3] [--rss-mb 0] [--connect]
 *                                  [--baseline NAME=PATH ...]
 *
 * --rss-mb grows the agent's heap first: a spawn forks the whole agent, the resident does not.
 * --baseline runs another helper binary (an older build, other flags) in the same rounds, resident
 * and warm, and prints its cost against this tree's: `make bench-helper` builds one with the
 * flags the helper had before its hardening.
 * Root only (a lab pod is the target netns).
 */
import { readFileSync } from 'node:fs';
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { ResidentHelper } from '../../agent/netns/helper.ts';
import { SpawnHelper } from '../../agent/netns/spawn-helper.ts';
import type { SocketFactory } from '../../agent/probe/types.ts';
import { createLab, type LabPod } from '../lab/lab.ts';
import { treeCpuMs } from './procstat.ts';

const { values: args } = parseArgs({
  options: {
    n: { type: 'string', default: '2000' },
    concurrency: { type: 'string', default: '16' },
    rounds: { type: 'string', default: '3' },
    'rss-mb': { type: 'string', default: '0' },
    connect: { type: 'boolean', default: false },
    baseline: { type: 'string', multiple: true, default: [] },
  },
});
const BASELINES = (args.baseline ?? []).map((b) => {
  const eq = b.indexOf('=');
  if (eq <= 0) throw new Error(`--baseline wants NAME=PATH, got ${b}`);
  return { name: b.slice(0, eq), path: b.slice(eq + 1) };
});
const N = Number(args.n);
const CONCURRENCY = Number(args.concurrency);
const ROUNDS = Number(args.rounds);
const TICK_MS = 10; // USER_HZ is 100 on Linux

/** utime+stime (+cutime+cstime: reaped children) of a process, in ms. */
function procCpuMs(pid: number | 'self', withChildren: boolean): number {
  const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.split(' ') ?? [];
  // After "pid (comm) ": state is field 3, so utime (14) is index 11 here.
  const [ut, st, cut, cst] = [11, 12, 13, 14].map((i) => Number(f[i]));
  return ((ut as number) + (st as number) + (withChildren ? (cut as number) + (cst as number) : 0)) * TICK_MS;
}

interface Run { mode: string; cpuMsPerSocket: number; agentMsPerSocket: number; helperMsPerSocket: number; p50: number; p99: number; loopP99: number; perSecond: number }

async function measure(mode: string, f: SocketFactory, pod: LabPod, helperPid: number | undefined, port: number | undefined): Promise<Run> {
  const lat: number[] = [];
  const loop = monitorEventLoopDelay({ resolution: 1 });
  const cpu0 = process.cpuUsage();
  // Spawned helpers are the agent's children: their CPU shows up in the agent's cutime/cstime.
  const kids0 = procCpuMs('self', true) - procCpuMs('self', false);
  // The pool's workers live through the run: their CPU is in no cutime until they are reaped.
  const helper0 = helperPid ? treeCpuMs(helperPid) : 0;
  const t0 = performance.now();
  loop.enable();
  let next = 0;
  await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
    while (next++ < N) {
      const family = (next % 2 ? 4 : 6) as 4 | 6;
      const s0 = performance.now();
      const socket = await f.createSocket(pod.netns, family);
      lat.push(performance.now() - s0);
      if (port) {
        await new Promise<void>((res, rej) => {
          socket.once('error', rej);
          socket.connect({ host: family === 4 ? pod.ipv4 : pod.ipv6, port }, () => res());
        });
      }
      socket.destroy();
    }
  }));
  loop.disable();
  const wall = performance.now() - t0;
  const cpu = process.cpuUsage(cpu0);
  const agentMs = (cpu.user + cpu.system) / 1000;
  const kidsMs = procCpuMs('self', true) - procCpuMs('self', false) - kids0;
  const helperMs = helperPid ? treeCpuMs(helperPid) - helper0 : 0;
  lat.sort((x, y) => x - y);
  const q = (p: number): number => lat[Math.min(lat.length - 1, Math.floor(p * lat.length))] as number;
  return {
    mode,
    cpuMsPerSocket: (agentMs + kidsMs + helperMs) / N,
    agentMsPerSocket: agentMs / N,
    helperMsPerSocket: (kidsMs + helperMs) / N,
    p50: q(0.5),
    p99: q(0.99),
    loopP99: loop.percentile(99) / 1e6,
    perSecond: N / (wall / 1000),
  };
}

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;

async function main(): Promise<void> {
  const ballast: Buffer[] = [];
  for (let i = 0; i < Number(args['rss-mb']); i++) ballast.push(Buffer.alloc(1024 * 1024, i));
  const lab = await createLab({ pods: 1, policy: 'none', tag: 'helper-cost bench' });
  const pod = lab.pods[0] as LabPod;
  const server = args.connect ? await lab.startServer(pod, { tcp: 0 }) : undefined;
  const resident = await ResidentHelper.start({ maxInFlight: 256 });
  const warm = await ResidentHelper.start({ warm: true });
  const pool = await ResidentHelper.start({ pool: 4, maxInFlight: 256 });
  const spawn = new SpawnHelper();
  const factories: [string, SocketFactory][] = [['resident', resident], ['pool', pool], ['warm', warm], ['spawn', spawn]];
  for (const b of BASELINES) {
    factories.push([`resident@${b.name}`, await ResidentHelper.start({ maxInFlight: 256, helperPath: b.path })]);
    factories.push([`warm@${b.name}`, await ResidentHelper.start({ warm: true, helperPath: b.path })]);
    factories.push([`pool@${b.name}`, await ResidentHelper.start({ pool: 4, maxInFlight: 256, helperPath: b.path })]);
  }
  const runs: Run[] = [];
  try {
    // Round 0 warms the JIT and each helper up, and is not counted.
    for (let r = 0; r <= ROUNDS; r++) {
      for (const [mode, f] of factories) {
        const helperPid = f instanceof ResidentHelper ? f.stats().pid : undefined;
        const run = await measure(mode, f, pod, helperPid, server?.ports.tcp);
        if (r > 0) runs.push(run);
      }
    }
  } finally {
    await Promise.all(factories.map(([, f]) => (f instanceof ResidentHelper ? f.close() : undefined)));
    await lab.destroy();
  }
  const rss = Math.round(process.memoryUsage().rss / 1e6);
  console.log(`\n${N} sockets x ${ROUNDS} rounds, concurrency ${CONCURRENCY}, agent RSS ${rss} MB${args.connect ? ', with connect' : ''} (medians)`);
  const width = Math.max(10, ...factories.map(([mode]) => mode.length + 1));
  console.log(`${'mode'.padEnd(width)} CPU ms/socket  (agent) (helper)   latency p50 ms  p99 ms   loop p99 ms  sockets/s`);
  const of = (mode: string, k: 'cpuMsPerSocket' | 'helperMsPerSocket'): number => median(runs.filter((x) => x.mode === mode).map((x) => x[k]));
  for (const [mode] of factories) {
    const m = runs.filter((x) => x.mode === mode);
    const col = (k: keyof Omit<Run, 'mode'>, d: number): string => median(m.map((x) => x[k])).toFixed(d);
    console.log(`${mode.padEnd(width)} ${col('cpuMsPerSocket', 3).padStart(13)}  ${col('agentMsPerSocket', 3).padStart(7)}  ${col('helperMsPerSocket', 3).padStart(7)}   ` +
      `${col('p50', 3).padStart(14)}  ${col('p99', 3).padStart(6)}   ${col('loopP99', 2).padStart(11)}  ${col('perSecond', 0).padStart(9)}`);
  }
  for (const b of BASELINES) {
    for (const mode of ['resident', 'pool', 'warm']) {
      const ratio = (k: 'cpuMsPerSocket' | 'helperMsPerSocket'): string => (of(mode, k) / of(`${mode}@${b.name}`, k)).toFixed(2);
      console.log(`${mode}: this tree / ${b.name} = ${ratio('cpuMsPerSocket')}x CPU per socket, ${ratio('helperMsPerSocket')}x the helper's own`);
    }
  }
  void ballast.length;
}

await main();
