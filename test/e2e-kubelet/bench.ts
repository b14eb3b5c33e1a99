/**
 * `make bench-kubelet`: what switching a node costs, on a real kubelet. N static pods, each with
 * one HTTP readiness probe every second, run three ways: without probes (the baseline), with
 * kubelet's own network probes (the node->pod path open), and rewritten through the shim and the
 * agent (the path dropped). CPU is read from /proc for each part: kubelet; the runtime (containerd
 * and the pods' containerd-shim-runc-v2); the shim; the agent with its netns helper. Probes come
 * from kubelet's own prober_probe_total, so a probe is counted once whichever way it ran. The pods'
 * own servers answer the same requests either way and are left out; the agent is paused while
 * kubelet probes alone, as a node without the switch has none probing beside it. Wake-ups per probe
 * are counted per process the same way (every thread's schedstat run count, test/bench/procstat.ts):
 * the floor a process pays per wake-up (`make bench-floor`) times this count bounds its part.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import { wakeupsOf } from '../bench/procstat.ts';
import { check, NODE_NAME, podsOf, proberTotals, say, sleep, waitFor } from './lib.ts';
import { churnPod, HTTP_PORT } from './pods.ts';
import { removeManifest, removePods, rewritePod, writeManifest, type PhaseContext } from './static-pods.ts';

const CLK_TCK = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;

/** What the bench needs beyond the phase context. */
export interface BenchSetup {
  ctx: PhaseContext;
  kubeletPid: () => number | undefined;
  containerdPid: () => number | undefined;
  containerdSocket: string;
  shimPid: number;
  agentPid: number;
  /** Opens and closes the node->pod path (kubelet's own probes need it open). */
  nodePath: (open: boolean) => void;
}

type Part = 'kubelet' | 'runtime' | 'shim' | 'agent';
const PARTS: Part[] = ['kubelet', 'runtime', 'shim', 'agent'];
type Mode = 'none' | 'native' | 'rewritten';
/** Wake-ups are counted per process: the agent's node process apart from its netns helper. */
type Waker = 'kubelet' | 'runtime' | 'shim' | 'agent' | 'helper';
const WAKERS: Waker[] = ['kubelet', 'runtime', 'shim', 'agent', 'helper'];

/**
 * CPU seconds a process has used (utime+stime), with the children it has waited for
 * (cutime+cstime) when `children`: the netns helper's forks are the agent's probing, but
 * containerd's children (CNI plugins, shim starts) are pod lifecycle, not probes.
 */
function cpuSeconds(pid: number, children = false): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(f[11]) + Number(f[12]) + (children ? Number(f[13]) + Number(f[14]) : 0)) / CLK_TCK;
  } catch {
    return 0;
  }
}

/** A process and its descendants (the agent's resident helper and its forks). */
function withDescendants(pid: number): number[] {
  const out = [pid];
  for (let i = 0; i < out.length; i++) {
    let tasks: string[] = [];
    try {
      tasks = readdirSync(`/proc/${out[i]}/task`);
    } catch {
      continue;
    }
    for (const t of tasks) {
      try {
        for (const c of readFileSync(`/proc/${out[i]}/task/${t}/children`, 'utf8').trim().split(/\s+/)) if (c) out.push(Number(c));
      } catch {
        // gone
      }
    }
  }
  return out;
}

/** The containerd-shim-runc-v2 processes of this lab's containerd. */
function runcShims(socket: string): number[] {
  const r = spawnSync('pgrep', ['-f', `containerd-shim-runc-v2 .*-address ${socket}`], { encoding: 'utf8' });
  return r.stdout.trim().split('\n').filter(Boolean).map(Number);
}

function pidsOf(s: BenchSetup): Record<Part, number[]> {
  const k = s.kubeletPid();
  const c = s.containerdPid();
  return {
    kubelet: k ? [k] : [],
    runtime: [...(c ? [c] : []), ...runcShims(s.containerdSocket)],
    shim: withDescendants(s.shimPid),
    agent: withDescendants(s.agentPid),
  };
}

function sample(pids: Record<Part, number[]>): Record<Part, number> {
  const out = {} as Record<Part, number>;
  for (const p of PARTS) out[p] = pids[p].reduce((sum, pid) => sum + cpuSeconds(pid, p === 'agent' || p === 'shim'), 0);
  return out;
}

function sampleWakeups(pids: Record<Part, number[]>, agentPid: number): Record<Waker, number> {
  const sum = (xs: number[]): number => xs.reduce((n, pid) => n + wakeupsOf(pid), 0);
  return {
    kubelet: sum(pids.kubelet), runtime: sum(pids.runtime), shim: sum(pids.shim),
    agent: wakeupsOf(agentPid), helper: sum(pids.agent.filter((p) => p !== agentPid)),
  };
}

function probesDone(totals: Map<string, number>, prefix: string): number {
  let n = 0;
  for (const [k, v] of totals) if (k.startsWith(prefix)) n += v;
  return n;
}

/** One mode's measurement. */
interface ModeResult {
  mode: Mode;
  seconds: number;
  probes: number;
  cpu: Record<Part, number>;
  wakeups: Record<Waker, number>;
}

/** The probes each bench pod has: BENCH_KUBELET_PERIOD (seconds, default 1) and BENCH_KUBELET_TCP=1 (a TCP liveness probe too). */
export interface BenchProbes {
  periodSeconds: number;
  tcp: boolean;
}

export function benchProbes(env: NodeJS.ProcessEnv = process.env): BenchProbes {
  const periodSeconds = Number(env['BENCH_KUBELET_PERIOD'] ?? 1);
  if (!Number.isInteger(periodSeconds) || periodSeconds < 1 || periodSeconds > 60) throw new Error(`BENCH_KUBELET_PERIOD=${env['BENCH_KUBELET_PERIOD']}: a whole number of seconds, 1 to 60`);
  return { periodSeconds, tcp: env['BENCH_KUBELET_TCP'] === '1' };
}

function benchPod(name: string, mode: Mode, probes: BenchProbes): Record<string, unknown> {
  const pod = churnPod(name) as { spec: { containers: Record<string, unknown>[] } };
  const app = pod.spec.containers[0]!;
  // Without -vv: a log line per request would make the runtime copy every probe's log, a cost of the server, not of probing.
  app['command'] = ['/bin/busybox', 'sh', '-c', `mkdir -p /www && echo ok > /www/ready && exec /bin/busybox httpd -f -p ${HTTP_PORT} -h /www`];
  for (const k of ['readinessProbe', 'livenessProbe']) {
    const probe = app[k] as Record<string, unknown> | undefined;
    if (probe) probe['periodSeconds'] = probes.periodSeconds;
  }
  if (!probes.tcp || mode === 'none') delete app['livenessProbe'];
  if (mode === 'none') delete app['readinessProbe'];
  return pod as unknown as Record<string, unknown>;
}

async function runMode(s: BenchSetup, mode: Mode, pods: number, windowS: number, probes: BenchProbes): Promise<ModeResult | undefined> {
  const names = Array.from({ length: pods }, (_, i) => `bench-${mode}-${String(i).padStart(2, '0')}`);
  s.nodePath(mode === 'native');
  // A node without the switch has no agent probing beside kubelet: it is paused while kubelet probes alone.
  const paused = mode === 'native' ? withDescendants(s.agentPid) : [];
  for (const pid of paused) process.kill(pid, 'SIGSTOP');
  try {
    return await measureMode(s, mode, names, windowS, probes);
  } finally {
    for (const pid of paused) process.kill(pid, 'SIGCONT');
  }
}

async function measureMode(s: BenchSetup, mode: Mode, names: string[], windowS: number, probes: BenchProbes): Promise<ModeResult | undefined> {
  const { ctx } = s;
  const pods = names.length;
  // One rewrite for all pods (a node process per pod would take the CPU being measured).
  const template = mode === 'rewritten' ? rewritePod(ctx, benchPod('bench-template', mode, probes)) : undefined;
  for (const n of names) {
    const pod = template ? { ...template, metadata: { ...template['metadata'], name: n } } : benchPod(n, mode, probes);
    writeManifest(ctx.manifests, n, JSON.stringify(pod));
  }
  // Standalone, each mode gets a kubelet of its own, started with the mode's manifests in place:
  // a KubeEdge-based standalone kubelet (our v1.26 and v1.32) never marks its file source ready and
  // then never deletes a removed pod ("skipping delete because sources aren't ready yet"), so the
  // previous mode's pods would keep running and being probed in this mode's window.
  if (!ctx.kubelet.setup.cluster && !(await ctx.kubelet.start(`bench-${mode}`))) {
    check(`bench: kubelet starts with the ${mode} pods`, false, `kubelet ${ctx.kubelet.exited ? 'exited' : 'not healthy'}`);
    return undefined;
  }
  const settled = await waitFor(`${mode}: ${pods} pods running${mode === 'none' ? '' : ' and Ready'}`, 180_000, async () => {
    const listed = (await podsOf(ctx.kubelet.setup.roPort)).filter((p) => names.includes(p.name));
    return (listed.length === pods && listed.every((p) => p.containers.length > 0 && p.containers.every((c) => c.id !== '') && (mode === 'none' || p.ready))) || undefined;
  }, 1000);
  if (!settled) {
    check(`bench: ${mode} pods up`, false, `not all ${pods} pods ${mode === 'none' ? 'running' : 'Ready'} within 180 s`);
    await removePods(ctx, names);
    return undefined;
  }
  await sleep(10_000); // past the start-up work
  const pids = pidsOf(s);
  const t0 = performance.now();
  const before = sample(pids);
  const w0 = sampleWakeups(pids, s.agentPid);
  // Only this mode's pods: a pod of another mode still running must not count as one of its probes.
  const p0 = probesDone(await proberTotals(ctx.kubelet.setup.roPort), `bench-${mode}-`);
  await sleep(windowS * 1000);
  const after = sample(pids);
  const w1 = sampleWakeups(pids, s.agentPid);
  const p1 = probesDone(await proberTotals(ctx.kubelet.setup.roPort), `bench-${mode}-`);
  const seconds = (performance.now() - t0) / 1000;
  const cpu = {} as Record<Part, number>;
  for (const p of PARTS) cpu[p] = after[p] - before[p];
  const wakeups = {} as Record<Waker, number>;
  for (const w of WAKERS) wakeups[w] = w1[w] - w0[w];
  if (ctx.kubelet.setup.cluster) {
    const gone = await removePods(ctx, names);
    if (!gone) check(`bench: ${mode} pods removed`, false, 'still listed or running after 90 s');
  } else {
    // The manifests go while kubelet is stopped, then the sandboxes: nothing is left to restart them.
    await ctx.kubelet.stop();
    for (const n of names) removeManifest(ctx.manifests, n);
  }
  await removeSandboxes(ctx, names);
  return { mode, seconds, probes: p1 - p0, cpu, wakeups };
}

/**
 * Removes the pods' stopped sandboxes now, as kubelet's garbage collection would within a minute or
 * two: otherwise their teardown (CNI, mounts) lands in the next mode's window.
 */
async function removeSandboxes(ctx: PhaseContext, names: string[]): Promise<void> {
  const full = new Set(names.map((n) => `${n}-${NODE_NAME}`));
  const r = await ctx.cri.call<{ items: { id: string; metadata: { name: string } }[] }>('ListPodSandbox', {});
  if (!r.ok) return;
  for (const sb of r.msg.items.filter((x) => full.has(x.metadata.name))) {
    await ctx.cri.call('StopPodSandbox', { podSandboxId: sb.id });
    await ctx.cri.call('RemovePodSandbox', { podSandboxId: sb.id });
  }
  await sleep(5000);
}

const ms = (v: number): string => v.toFixed(2);

/** Runs the three modes and prints the table; the marginal CPU of a probe is its mode minus the baseline. */
export async function runBench(s: BenchSetup): Promise<void> {
  const pods = Number(process.env['BENCH_KUBELET_PODS'] ?? 20);
  const windowS = Number(process.env['BENCH_KUBELET_SECONDS'] ?? 60);
  const probes = benchProbes();
  const what = `one HTTP readiness probe${probes.tcp ? ' and one TCP liveness probe' : ''} each every ${probes.periodSeconds} s`;
  say(`bench: ${pods} pods, ${what}; ${windowS} s per mode`);
  const results: ModeResult[] = [];
  const standalone = !s.ctx.kubelet.setup.cluster;
  if (standalone) await s.ctx.kubelet.stop(); // each mode starts its own (measureMode)
  for (const mode of ['none', 'native', 'rewritten'] as Mode[]) {
    say(`bench: ${mode}`);
    const r = await runMode(s, mode, pods, windowS, probes);
    if (!r) return;
    results.push(r);
  }
  if (standalone && !(await s.ctx.kubelet.start('bench-done'))) check('bench: kubelet starts again after the bench', false, `kubelet ${s.ctx.kubelet.exited ? 'exited' : 'not healthy'}`);
  s.nodePath(false);
  const [none, native, rewritten] = results as [ModeResult, ModeResult, ModeResult];
  const rate = (r: ModeResult, p: Part): number => r.cpu[p] / r.seconds; // CPU s per s
  // The agent is paused for the native mode: no part of it is that mode's cost.
  const counted = (r: ModeResult): Part[] => (r.mode === 'native' ? PARTS.filter((p) => p !== 'agent') : PARTS);
  const perProbe = (r: ModeResult, p: Part): number => (counted(r).includes(p) ? ((rate(r, p) - rate(none, p)) * r.seconds * 1000) / Math.max(1, r.probes) : 0);
  const allIn = (r: ModeResult): number => (counted(r).reduce((sum, p) => sum + r.cpu[p], 0) * 1000) / Math.max(1, r.probes);
  console.log('');
  console.log(`bench-kubelet (${pods} pods, ${what}, ${windowS} s per mode): CPU ms per probe, above the pods-without-probes baseline`);
  console.log(`| mode | probes/s | ${PARTS.join(' | ')} | marginal total | all-in per probe |`);
  console.log(`|---|---|${PARTS.map(() => '---|').join('')}---|---|`);
  for (const r of [native, rewritten]) {
    const parts = PARTS.map((p) => (counted(r).includes(p) ? ms(perProbe(r, p)) : 'paused'));
    const marginal = PARTS.reduce((sum, p) => sum + perProbe(r, p), 0);
    console.log(`| ${r.mode} | ${(r.probes / r.seconds).toFixed(1)} | ${parts.join(' | ')} | ${ms(marginal)} | ${ms(allIn(r))} |`);
  }
  console.log(`| none (baseline, CPU % of a core) | 0 | ${PARTS.map((p) => (rate(none, p) * 100).toFixed(1)).join(' | ')} | | |`);
  const wakes = (r: ModeResult, w: Waker): string => {
    if (r.mode === 'native' && (w === 'agent' || w === 'helper')) return 'paused';
    return (((r.wakeups[w] / r.seconds - none.wakeups[w] / none.seconds) * r.seconds) / Math.max(1, r.probes)).toFixed(1);
  };
  console.log('');
  console.log('Wake-ups per probe, above the baseline (times each process\'s threads were scheduled, /proc/<pid>/task/*/schedstat):');
  console.log(`| mode | ${WAKERS.map((w) => (w === 'agent' ? 'agent (node)' : w === 'helper' ? 'agent\'s netns helper' : w)).join(' | ')} |`);
  console.log(`|---|${WAKERS.map(() => '---|').join('')}`);
  for (const r of [native, rewritten]) console.log(`| ${r.mode} | ${WAKERS.map((w) => wakes(r, w)).join(' | ')} |`);
  console.log(`| none (baseline, per second) | ${WAKERS.map((w) => (none.wakeups[w] / none.seconds).toFixed(1)).join(' | ')} |`);
  const m = (r: ModeResult): number => PARTS.reduce((sum, p) => sum + perProbe(r, p), 0);
  console.log(`rewritten / native marginal CPU per probe: ${(m(rewritten) / m(native)).toFixed(2)}x`);
  check('bench: every mode measured', native.probes > 0 && rewritten.probes > 0,
    `native ${native.probes} probes, rewritten ${rewritten.probes} probes in ${native.seconds.toFixed(0)} / ${rewritten.seconds.toFixed(0)} s`);
}
