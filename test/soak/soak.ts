/**
 * The soak: the real daemon (`probe-agent run`) probing lab pods for minutes while the world
 * churns (see world.ts), with every probe result judged against the server state the test knows,
 * and the agent's process watched from /proc: open fds, children, zombies, memory.
 *
 *   make soak                          # 10 minutes, 100 pods x 3 probes at 1 s
 *   SOAK_MINUTES=30 SOAK_PODS=100 SOAK_RESOLVER=address SOAK_SEED=42 node test/soak/soak.ts
 *
 * Exit status 0 only when no result was wrong and fds, children, zombies and memory stayed flat.
 * test/integration/soak-short.test.ts runs the same code for about a minute with fewer pods.
 */
import { fileURLToPath } from 'node:url';
import { requireRoot } from '../support/root.ts';
import { startAgent, type AgentHandle } from '../support/agent-harness.ts';
import type { ExpectedLog } from '../support/log-check.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { mulberry32 } from '../support/prng.ts';
import type { ProbeStatus } from '../../agent/scheduler/types.ts';
import { cpuSeconds, sample, sleep, snapshot, type ProcessSnapshot } from './observe.ts';
import { containerID, expected, kindOf, NAMESPACE, World } from './world.ts';

/** How long and how big. */
export interface SoakOptions {
  minutes: number;
  pods: number;
  labs: number;
  netnsPerLab: number;
  /** Seed of the churn's random choices (printed, so a run can be replayed). */
  seed: number;
  /** A churn action starts every tickMs. */
  tickMs: number;
  /** Recreate one lab's netns every this many ms (0: never). */
  recreateEveryMs: number;
  /** The agent's netns resolver: 'procfs' (pause processes in kubelet-shaped cgroups) or 'address'. */
  resolver: 'procfs' | 'address';
  log: (line: string) => void;
  /** Extra environment for the agent process (e.g. NODE_OPTIONS to cap its heap). */
  agentEnv?: NodeJS.ProcessEnv;
  /**
   * Starts the agent some other way than as a host process (test/deployed/containerized-agent.ts:
   * the image in a container with the DaemonSet's posture); it must find the pods' netns with `resolver`.
   */
  startAgent?: (kubelet: FakeKubelet) => Promise<SoakAgent>;
}

/**
 * Warnings the churn itself causes (checked when the agent runs under vitest, test/support/log-check.ts):
 * a pod whose netns was just deleted is not resolvable until kubelet's list drops it, and a reply
 * the helper still had for a probe the agent gave up on meets a closed pipe.
 */
const CHURN_LOGS: ExpectedLog[] = [
  { level: 'warn', msg: 'probe errored; result kept', line: /"reason":"netns-unresolved","message":"netns of pod soak\/soak-\d+ /, why: 'pods are deleted under their probes on purpose (churn)' },
  { level: 'warn', msg: 'netns helper stderr', line: /"line":"probe-agent-netns-helper: dropping a reply: Broken pipe"/, why: 'the helper answers a probe of a pod deleted meanwhile after the agent stopped waiting (churn)' },
];

/** What the soak needs of a running agent: its process (host PID), its API, its metrics, and a way to stop it. */
export type SoakAgent = Pick<AgentHandle, 'pid' | 'client' | 'http' | 'waitForStatuses' | 'stop'>;

/** The agent process at one instant (minimums over a few samples, to skip in-flight sockets). */
export interface ProcessFigures {
  fds: number;
  children: number;
  zombies: number;
  rssMB: number;
}

/** One result that disagreed with the world. */
export interface WrongResult {
  at: number;
  pod: string;
  probe: string;
  got: string;
  want: string;
  why: string;
}

/** What the soak saw. */
export interface SoakReport {
  seed: number;
  resolver: string;
  seconds: number;
  pods: number;
  probesRun: number;
  judged: number;
  /** Results that disagreed with the world: `late` + `incorrect`. */
  wrong: number;
  /** Wrong because the agent had not probed enough since the change (it fell behind its periods). */
  late: number;
  /** Wrong although the agent had probed enough since the change: a real error of the agent. */
  incorrect: number;
  wrongSamples: WrongResult[];
  /** Oldest lastProbeTime of a judged result, in ms before the look. */
  maxProbeAgeMs: number;
  start: ProcessFigures;
  end: ProcessFigures;
  peakRssMB: number;
  maxZombies: number;
  maxFds: number;
  churn: Record<string, number>;
  exitCode: number | string | null;
  /** Per-interval samples: seconds since start, fds, children, zombies, RSS MB, CPU % of a core (agent + helper), probes queued. */
  timeline: [number, number, number, number, number, number, number][];
}

/** Results are judged only once a change has had this long to show: one poll, two failed runs, a timeout, and slack. */
const SETTLE_MS = 6000;
const MAX_WRONG_KEPT = 50;
/** The heap cap deploy/base/daemonset.yaml gives the agent: a leak shows as an out-of-memory exit, not as slow growth. */
export const DAEMONSET_ENV: NodeJS.ProcessEnv = { NODE_OPTIONS: '--max-old-space-size=96' };

/** Runs the soak and returns its figures; never throws for wrong results (the caller judges the report). */
export async function runSoak(o: SoakOptions): Promise<SoakReport> {
  const rand = mulberry32(o.seed);
  const kubelet = await FakeKubelet.start({ pods: [] });
  const world = new World({ pods: o.pods, labs: o.labs, netnsPerLab: o.netnsPerLab, kubelet, resolver: o.resolver, tag: 'soak', log: o.log });
  let agent: SoakAgent | undefined;
  try {
    await world.start();
    agent = o.startAgent
      ? await o.startAgent(kubelet)
      : await startAgent({ kubeletUrl: kubelet.httpUrl, resolvers: o.resolver, pollInterval: '1s', env: o.agentEnv ?? DAEMONSET_ENV, expectedLogs: CHURN_LOGS });
    const a = agent;
    o.log(`soak: ${o.pods} pods x 3 probes on ${world.slots.length} netns (${o.labs} labs), ${o.resolver} resolver, agent pid ${a.pid}, seed ${o.seed}`);
    // Every probe has run; a result that is wrong already will be judged like any other.
    await a.waitForStatuses((s) => s.length === o.pods * 3 && s.every((x) => x.lastProbeTime > 0), 60_000);
    await sleep(SETTLE_MS);

    const report: SoakReport = {
      seed: o.seed, resolver: o.resolver, seconds: 0, pods: o.pods, probesRun: 0, judged: 0, wrong: 0, late: 0, incorrect: 0, wrongSamples: [], maxProbeAgeMs: 0,
      start: await figures(a.pid), end: { fds: 0, children: 0, zombies: 0, rssMB: 0 }, peakRssMB: 0, maxZombies: 0, maxFds: 0,
      churn: world.counts, exitCode: null, timeline: [],
    };
    const runs0 = await probesRun(a);
    const t0 = Date.now();
    const end = t0 + o.minutes * 60_000;
    const actions = new Set<Promise<void>>();
    let lastTick = 0;
    let lastRecreate = t0;
    let lastSample = 0;
    let lastCpu = 0;
    const track = (p: Promise<void>): void => {
      const q = p.catch((err: unknown) => o.log(`churn action failed: ${String(err)}`)).finally(() => actions.delete(q));
      actions.add(q);
    };
    while (Date.now() < end) {
      const now = Date.now();
      if (now - lastTick >= o.tickMs) {
        lastTick = now;
        if (o.recreateEveryMs > 0 && now - lastRecreate >= o.recreateEveryMs) {
          lastRecreate = now;
          track(world.recreateLab(Math.floor(rand() * o.labs)));
        } else {
          track(churnOnce(world, rand));
        }
      }
      if (now - lastSample >= 10_000) {
        const cpu = cpuSeconds(a.pid);
        const cpuPct = lastSample ? Math.round(((cpu - lastCpu) / ((now - lastSample) / 1000)) * 100) : 0;
        lastSample = now;
        lastCpu = cpu;
        const s = snapshot(a.pid);
        const queued = sample((await a.http('/metrics')).body, 'probe_agent_probes_queued') ?? -1;
        report.timeline.push([Math.round((now - t0) / 1000), s.fds, s.children.length, s.zombies, Math.round(s.rssMB), cpuPct, queued]);
      }
      await judge(a, world, report);
      await sleep(1000);
    }
    await Promise.all(actions);
    await sleep(SETTLE_MS);
    for (let i = 0; i < 3; i++) {
      await judge(a, world, report);
      await sleep(1000);
    }
    report.seconds = Math.round((Date.now() - t0) / 1000);
    report.probesRun = (await probesRun(a)) - runs0;
    report.end = await figures(a.pid);
    o.log(`soak: done, ${report.probesRun} probes, ${report.judged} results judged, ${report.wrong} wrong`);
    report.exitCode = await a.stop('SIGTERM', 20_000);
    agent = undefined;
    return report;
  } finally {
    await agent?.stop('SIGKILL').catch(() => {});
    await kubelet.stop();
    await world.destroy();
  }
}

/** Starts one random churn action (an episode on a netns, or a pod replaced). */
async function churnOnce(world: World, rand: () => number): Promise<void> {
  const r = rand();
  if (r < 0.3) return world.churnPod(rand);
  const slot = world.idleSlot(rand);
  if (!slot) return;
  const ms = 4000 + Math.floor(rand() * 6000);
  const state = r < 0.55 ? 'unhealthy' : r < 0.78 ? 'notserving' : 'down';
  await world.episode(slot, state, ms);
}

/** One look at every status: counts the judged ones and the wrong ones (see SETTLE_MS). */
async function judge(a: SoakAgent, world: World, report: SoakReport): Promise<void> {
  let statuses: ProbeStatus[];
  try {
    statuses = (await a.client.listStatus({ namespace: NAMESPACE }, 5000)).statuses;
  } catch (err) {
    report.incorrect++;
    wrong(report, { at: Date.now(), pod: '*', probe: '*', got: 'no answer', want: 'ListProbeStatus', why: String(err) });
    return;
  }
  const now = Date.now();
  const present = new Set<string>();
  for (const s of statuses) {
    const kind = kindOf(s.key.containerName, s.key.probeType);
    present.add(`${s.key.podUID}/${kind}`);
    const pod = world.pods.get(s.key.podUID);
    if (!pod) {
      const gone = world.removed.get(s.key.podUID);
      if (gone === undefined || now - gone > SETTLE_MS) {
        report.incorrect++;
        wrong(report, { at: now, pod: s.podName, probe: String(kind), got: s.result, want: 'absent', why: 'pod left the kubelet list' });
      }
      continue;
    }
    if (!kind) {
      report.incorrect++;
      wrong(report, { at: now, pod: s.podName, probe: `${s.key.containerName}/${s.key.probeType}`, got: s.result, want: 'no such probe', why: 'unknown probe' });
      continue;
    }
    const { state, since } = world.stateAt(pod.slot, now);
    const settledAt = Math.max(since, pod.changedAt);
    if (now - settledAt < SETTLE_MS) continue;
    report.judged++;
    const want = expected(kind, state);
    if (s.result !== want) {
      // Late: the agent has not seen the container restart yet, or shows the value it reset to
      // (no run since: no reason, no message), or its last run was too close to the change. Had it
      // probed on schedule, its last run would be about `now`.
      const current = containerID(pod.uid, s.key.containerName, pod.epoch);
      const reset = s.lastReason === undefined && s.lastMessage === '';
      const late = s.containerID !== current || reset || s.lastProbeTime - settledAt < SETTLE_MS - 1000;
      if (late) report.late++;
      else report.incorrect++;
      wrong(report, {
        at: now, pod: s.podName, probe: kind, got: `${s.result} (${s.lastReason ?? ''}: ${s.lastMessage.slice(0, 400)})`, want,
        why: `${late ? 'late' : 'incorrect'}: server ${state} since ${now - since} ms, last probe ${now - s.lastProbeTime} ms ago`,
      });
    }
    // A liveness probe on hold (failed; waiting for the container restart) rightly stops running.
    if (!s.onHold) report.maxProbeAgeMs = Math.max(report.maxProbeAgeMs, now - s.lastProbeTime);
  }
  for (const pod of world.pods.values()) {
    if (now - pod.changedAt < SETTLE_MS) continue;
    for (const kind of ['http-liveness', 'grpc-readiness', 'tcp-readiness']) {
      if (present.has(`${pod.uid}/${kind}`)) continue;
      report.incorrect++;
      wrong(report, { at: now, pod: pod.name, probe: kind, got: 'absent', want: 'a status', why: 'pod listed by the kubelet' });
    }
  }
  const s = snapshot(a.pid);
  report.peakRssMB = Math.max(report.peakRssMB, s.rssMB);
  report.maxZombies = Math.max(report.maxZombies, s.zombies);
  report.maxFds = Math.max(report.maxFds, s.fds);
}

function wrong(report: SoakReport, w: WrongResult): void {
  report.wrong++;
  // Keep room for incorrect ones: a run that falls behind produces late ones by the thousand.
  const late = report.wrongSamples.filter((x) => x.why.startsWith('late')).length;
  if (report.wrongSamples.length < MAX_WRONG_KEPT && (!w.why.startsWith('late') || late < 10)) report.wrongSamples.push(w);
}

/** fds, direct children, zombies and RSS: the minimum of five looks 200 ms apart (an in-flight probe holds a socket and a helper child). */
async function figures(pid: number): Promise<ProcessFigures> {
  const looks: ProcessSnapshot[] = [];
  for (let i = 0; i < 5; i++) {
    looks.push(snapshot(pid));
    await sleep(200);
  }
  return {
    fds: Math.min(...looks.map((l) => l.fds)),
    children: Math.min(...looks.map((l) => l.children.length)),
    zombies: Math.min(...looks.map((l) => l.zombies)),
    rssMB: Math.round(Math.min(...looks.map((l) => l.rssMB))),
  };
}

/** Raw probe runs so far (every result, every reason). */
async function probesRun(a: SoakAgent): Promise<number> {
  const body = (await a.http('/metrics')).body;
  let total = 0;
  for (const line of body.split('\n')) {
    if (line.startsWith('probe_agent_probe_results_total{')) total += Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return total;
}

/** The soak's pass/fail verdicts; empty when it passed. `rssGrowthMB` bounds end-start resident memory. */
export function verdicts(r: SoakReport, rssGrowthMB: number): string[] {
  const out: string[] = [];
  if (r.wrong > 0) {
    const first = [...r.wrongSamples.filter((w) => !w.why.startsWith('late')), ...r.wrongSamples.filter((w) => w.why.startsWith('late'))].slice(0, 5);
    out.push(`${r.wrong} wrong results (${r.late} late, ${r.incorrect} incorrect), first: ${JSON.stringify(first)}`);
  }
  if (r.judged === 0) out.push('no result was judged');
  if (r.end.fds > r.start.fds + 5) out.push(`fds grew from ${r.start.fds} to ${r.end.fds}`);
  if (r.end.children !== r.start.children) out.push(`children went from ${r.start.children} to ${r.end.children}`);
  if (r.end.zombies > 0) out.push(`${r.end.zombies} zombies at the end`);
  if (r.end.rssMB - r.start.rssMB > rssGrowthMB) out.push(`RSS grew by ${r.end.rssMB - r.start.rssMB} MB (bound ${rssGrowthMB})`);
  if (r.exitCode !== 0) out.push(`agent exit ${String(r.exitCode)} on SIGTERM`);
  return out;
}

/** The report as the markdown table docs/soak.md holds. */
export function markdown(r: SoakReport): string {
  return [
    `| figure | start | end |`,
    `|---|---|---|`,
    `| open fds | ${r.start.fds} | ${r.end.fds} (max ${r.maxFds}) |`,
    `| children | ${r.start.children} | ${r.end.children} |`,
    `| zombies | ${r.start.zombies} | ${r.end.zombies} (max seen ${r.maxZombies}) |`,
    `| RSS (MB) | ${r.start.rssMB} | ${r.end.rssMB} (peak ${Math.round(r.peakRssMB)}) |`,
    '',
    `${r.seconds} s, ${r.pods} pods x 3 probes, ${r.resolver} resolver, seed ${r.seed}: ${r.probesRun} probes run, ${r.judged} results judged, ` +
      `**${r.wrong} wrong** (${r.late} late, ${r.incorrect} incorrect); oldest judged result ${(r.maxProbeAgeMs / 1000).toFixed(1)} s old; churn ${JSON.stringify(r.churn)}; ` +
      `exit on SIGTERM: ${String(r.exitCode)}.`,
  ].join('\n');
}

/** The soak's size and pace from SOAK_MINUTES, SOAK_PODS and SOAK_SEED, as both soak entry points take them. */
export function soakSizeFromEnv(): Pick<SoakOptions, 'minutes' | 'pods' | 'labs' | 'netnsPerLab' | 'seed' | 'tickMs' | 'recreateEveryMs'> {
  const minutes = Number(process.env['SOAK_MINUTES'] ?? 10);
  const pods = Number(process.env['SOAK_PODS'] ?? 100);
  if (!(minutes > 0 && minutes <= 24 * 60) || !Number.isInteger(pods) || pods < 1 || pods > 500) {
    throw new Error('SOAK_MINUTES must be in (0, 1440] and SOAK_PODS an integer 1..500');
  }
  const netns = Math.max(2, Math.ceil(pods / 5));
  const labs = Math.max(2, Math.ceil(netns / 64));
  const seed = Number(process.env['SOAK_SEED'] ?? Date.now() % 1_000_000);
  return { minutes, pods, labs, netnsPerLab: Math.ceil(netns / labs), seed, tickMs: 2000, recreateEveryMs: 60_000 };
}

async function main(): Promise<void> {
  requireRoot(['ip', 'nft']);
  const size = soakSizeFromEnv();
  const resolver = process.env['SOAK_RESOLVER'] ?? 'procfs';
  if (resolver !== 'procfs' && resolver !== 'address') throw new Error('SOAK_RESOLVER must be procfs or address');
  const started = Date.now();
  const report = await runSoak({
    ...size, resolver,
    log: (l) => process.stderr.write(`${new Date().toISOString()} ${l}\n`),
  });
  process.stdout.write(`${markdown(report)}\n\ntimeline [s, fds, children, zombies, RSS MB, CPU %, queued]: ${JSON.stringify(report.timeline)}\n`);
  if (report.wrongSamples.length) process.stdout.write(`wrong results kept:\n${report.wrongSamples.map((w) => JSON.stringify(w)).join('\n')}\n`);
  const bad = verdicts(report, 150);
  process.stdout.write(bad.length ? `SOAK FAILED:\n- ${bad.join('\n- ')}\n` : `soak passed in ${Math.round((Date.now() - started) / 1000)} s\n`);
  process.exitCode = bad.length ? 1 : 0;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  main().catch((err: unknown) => {
    process.stderr.write(`soak: ${err instanceof Error ? err.stack : String(err)}\n`);
    process.exitCode = 2;
  });
}

