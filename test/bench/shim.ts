/**
 * The kubelet shim in `make bench` (and alone: `node test/bench/shim.ts`, BENCH_QUICK=1 for a
 * quick run; prints markdown, writes JSON to BENCH_SHIM_OUT or the temp dir). On the lab's real
 * containerd, with the real agent and the shim as separate processes:
 *
 *  - the shim path: a kubelet-shaped ExecSync of a rewritten HTTP probe through the shim to the
 *    agent and back; CPU of shim + agent + helper per probe, latency; beside (a), the agent's own
 *    in-netns probe of the same target (runProbe with the resident helper, in this process);
 *  - a real exec probe: ExecSync of /bin/true in the busybox container, CPU of containerd and its
 *    runc shims (runc and the exec'd process are their reaped children);
 *  - the shim's overhead on kubelet's ordinary calls with N pod sandboxes (default 250), each
 *    with a container: ListContainers, ListPodSandbox, PodSandboxStatus, ContainerStatus, p50/p99
 *    direct vs through the shim, and the shim's own CPU per call.
 * CPU is the kernel's accounting from /proc (utime+stime, + reaped children), as procstat.ts reads it.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { EXEC_SYNC_REQUEST as REQ } from '../../agent/contract/exec-sync-fields.ts';
import { encodeShimCommand } from '../../agent/contract/shim-command.ts';
import { BUSYBOX_IMAGE_REF, importBusyboxImage } from '../lab/busybox-image.ts';
import { createContainerdLab, type ContainerdLab, type LabContainer, type LabSandbox } from '../lab/containerd.ts';
import { POD_SERVER_PATH } from '../lab/server.ts';
import { builtEntry } from '../support/built-cli.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { KubeletCri } from '../support/kubelet-cri.ts';
import { makePod } from '../support/pod-factory.ts';
import { launcherNodeFlags } from './agent-process.ts';
import { ResidentHelper } from '../../agent/netns/helper.ts';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { runProbe } from '../../agent/probe/run.ts';
import { ShimProbeClient } from '../../agent/shim/agent-client.ts';
import { shimSocketBeside } from '../../agent/contract/shim-socket.ts';
import { ProbeApiClient } from '../../agent/api/client.ts';
import { encodeFrame } from '../../agent/grpc/frame.ts';
import { WireWriter } from '../../agent/grpc/protowire.ts';
import type { ProbeContext, ProbeHandler } from '../../agent/probe/types.ts';
import { cmdlineOf, findChild, runMsOf, totalCpuMs, wakeupsOf } from './procstat.ts';
import { quantile, ranToTimeout, round } from './stats.ts';
import type { TargetCheck } from './report.ts';

/** How much to measure. */
export interface ShimBenchOptions {
  sandboxes: number;
  probes: number;
  execs: number;
  callsPerMethod: number;
  /** The `:authority` the kubelet-shaped client sends the shim (BENCH_SHIM_AUTHORITY; default grpc-js's, `localhost`): a socket path measures kubelet before 1.31, whose connection the shim rewrites. */
  authority?: string;
  /**
   * A second shim, another build's `shim/main.js` (BENCH_SHIM_COMPARE=/path/to/dist/shim/main.js,
   * e.g. a worktree of the previous release), measured in the same run against the same agent.
   */
  compareShim?: string;
  /**
   * Probes per second of the A/B with compareShim (BENCH_SHIM_AB_RATE; default 0: back to back). At
   * kubelet's rates (20/s: 20 pods at 1 s) each probe wakes the processes on its own, as on a node.
   */
  abRate?: number;
  /** `node <cli> run` starts the agent (default: the built dist/cli.js). */
  cli?: string;
  log: (line: string) => void;
}

/** Latency and CPU of one measured series. */
export interface Series { n: number; p50Ms: number; p99Ms: number; cpuMsPerCall: number }

/** What latest.json holds under `shim`. */
export interface ShimBenchResult {
  sandboxes: number;
  startupMs: number;
  /** Kubelet-shaped ExecSync of a rewritten http probe through shim + agent; cpu split by process. */
  shimPath: Series & {
    shimCpuMs: number;
    /** agent + helper (kept for older readers of latest.json); agentOnlyCpuMs + helperCpuMs. */
    agentCpuMs: number;
    agentOnlyCpuMs: number;
    helperCpuMs: number;
    /** CPU per probe over (a)'s. */
    cpuRatioToA: number;
    /** Probes that ended before their timeout without success (a broken path). */
    unexpected: number;
    /** Probes that ended without success at or past their timeout (the machine's load, not judged). */
    timedOut: number;
    /** Wake-ups per probe of each process (its threads' schedstat run counts; idle wake-ups of the window included). */
    wakeups: { shim: number; agent: number; helper: number };
  };
  /**
   * The agent alone, same probe by container ID straight to its socket, interleaved: through its
   * lean server (the shim's client) and through grpc-js (a grpc-js client); CPU of agent + helper.
   */
  agentTransports: { lean: Series; grpcJs: Series };
  /** (a): the agent's own in-netns probe of the same target, resident helper. */
  inNetns: Series;
  /** ExecSync of /bin/true in the busybox container, straight to containerd. */
  realExec: Series & { containerdCpuMs: number; runcShimCpuMs: number };
  /** Per ordinary CRI method: direct and through the shim; cpuMsPerCall of `shim` = the shim process only. */
  ordinary: Record<string, { direct: Series; shim: Series; addedP50Ms: number; addedP99Ms: number }>;
  /** The shim's share of a core for PLEG's relist every second (one ListPodSandbox + one ListContainers), in %. */
  plegCorePercent: number;
  /** The measured shim's main.js. */
  relay: string;
  /** A second shim build (BENCH_SHIM_COMPARE), measured in the same run. */
  compared?: { relay: string; shimPath: Series & { shimCpuMs: number }; ordinary: ShimBenchResult['ordinary']; plegCorePercent: number };
  targets: TargetCheck[];
}

const HTTP = 8080;

function series(lat: number[], cpuMs: number): Series {
  const s = [...lat].sort((a, b) => a - b);
  return { n: lat.length, p50Ms: round(quantile(s, 0.5)), p99Ms: round(quantile(s, 0.99)), cpuMsPerCall: round(cpuMs / Math.max(1, lat.length)) };
}

function spawnLogged(cmd: string, args: string[], ready: RegExp, what: string): Promise<ChildProcess> {
  const child = spawn(cmd, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let tail = '';
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`${what} did not start: ${tail}`)), 30_000);
    child.stderr!.on('data', (d: Buffer) => {
      tail = (tail + d.toString()).slice(-2000);
      if (ready.test(tail)) {
        clearTimeout(t);
        resolve(child);
      }
    });
    child.once('exit', (c) => reject(new Error(`${what} exited (${c}): ${tail}`)));
  });
}

/** containerd-shim-runc-v2 processes serving this lab's containerd. */
function runcShimPids(lab: ContainerdLab): number[] {
  return readdirSync('/proc').filter((d) => /^\d+$/.test(d)).map(Number).filter((pid) => {
    const argv = cmdlineOf(pid);
    return (argv[0] ?? '').includes('containerd-shim') && argv.includes(lab.socket);
  });
}

/** Runs the shim part of the bench. */
export async function runShimBench(o: ShimBenchOptions): Promise<ShimBenchResult> {
  const scratch = mkdtempSync(path.join(tmpdir(), 'probe-agent-shim-bench-'));
  const procs: ChildProcess[] = [];
  let lab: ContainerdLab | undefined;
  let kubelet: FakeKubelet | undefined;
  const clients: KubeletCri[] = [];
  try {
    lab = await createContainerdLab();
    importBusyboxImage(lab.socket);
    const t0 = Date.now();
    const pod = await lab.runSandbox({ name: 'bench-web', namespace: 'bench' });
    const app = await lab.runContainer(pod, { name: 'app', image: BUSYBOX_IMAGE_REF, command: ['/bin/sleep', 'infinity'] });
    const others: { sb: LabSandbox; c: LabContainer }[] = [];
    for (let i = 1; i < o.sandboxes; i += 8) {
      const batch = await Promise.all(Array.from({ length: Math.min(8, o.sandboxes - i) }, async (_, j) => {
        const sb = await lab!.runSandbox({ name: `bench-${i + j}`, namespace: 'bench' });
        return { sb, c: await lab!.runContainer(sb, { name: 'app' }) };
      }));
      others.push(...batch);
    }
    o.log(`shim: ${o.sandboxes} sandboxes with a container each in ${((Date.now() - t0) / 1000).toFixed(1)} s`);

    const server = spawn('nsenter', [`--net=${pod.netnsPath}`, '--', process.execPath, POD_SERVER_PATH, JSON.stringify({ http: HTTP })], { stdio: ['pipe', 'pipe', 'ignore'] });
    procs.push(server);
    await new Promise<void>((resolve) => server.stdout!.on('data', (d: Buffer) => { if (d.toString().includes('ready')) resolve(); }));

    kubelet = await FakeKubelet.start({ pods: [makePod({ uid: pod.uid, name: pod.name, namespace: 'bench', ips: pod.ips, probe: 'none', port: HTTP, containerID: `containerd://${app.id}` })] });
    const agentSock = path.join(scratch, 'probe.sock');
    const cli = o.cli ?? builtEntry('cli.js');
    const shimMain = builtEntry('shim/main.js');
    // BENCH_SHIM_PROFILE=<dir>: CPU profiles of the agent and the shim (summarise with cpuprofile.ts).
    const prof = (name: string): string[] => (process.env.BENCH_SHIM_PROFILE ? ['--cpu-prof', `--cpu-prof-dir=${process.env.BENCH_SHIM_PROFILE}`, `--cpu-prof-name=${name}.cpuprofile`] : []);
    const agent = await spawnLogged(process.execPath, [...launcherNodeFlags(), ...prof('agent'), cli, 'run', `--kubelet-url=${kubelet.httpUrl}`, '--kubelet-token-file=',
      '--netns-resolvers=cri', `--cri-endpoint=${lab.endpoint}`, `--netns-dir=${lab.netnsDir}`, `--socket=${agentSock}`, '--metrics-address=127.0.0.1:0', '--log-format=json'],
    /metrics listener started/, 'agent');
    procs.push(agent);
    const shimSock = path.join(scratch, 'cri.sock');
    const tShim = performance.now();
    const builds = [shimMain, ...(o.compareShim ? [path.resolve(o.compareShim)] : [])];
    const shimArgs = (sock: string, main: string): string[] => [main, '--listen', `unix://${sock}`, '--runtime-endpoint', lab!.endpoint, '--probe-socket', agentSock, '--metrics-socket', ''];
    const shim = await spawnLogged(process.execPath, [...prof('shim'), ...shimArgs(shimSock, builds[0]!)], /shim listening/, 'shim');
    const startupMs = round(performance.now() - tShim, 1);
    procs.push(shim);
    const viaShim = new KubeletCri(shimSock, o.authority ? { 'grpc.default_authority': o.authority } : {});
    if (o.authority) o.log(`shim: the client sends :authority ${JSON.stringify(o.authority)}`);
    o.log(`shim: ${builds[0]}${builds[1] ? `, compared in the same run with a second shim, ${builds[1]}` : ''}`);
    const direct = new KubeletCri(lab.socket);
    clients.push(viaShim, direct);
    let alt: { relay: string; proc: ChildProcess; client: KubeletCri } | undefined;
    if (builds[1]) {
      const altSock = path.join(scratch, 'cri-alt.sock');
      const proc = await spawnLogged(process.execPath, [...prof('shim-alt'), ...shimArgs(altSock, builds[1])], /shim listening/, 'shim (compared)');
      procs.push(proc);
      const client = new KubeletCri(altSock, o.authority ? { 'grpc.default_authority': o.authority } : {});
      clients.push(client);
      alt = { relay: builds[1], proc, client };
    }

    // --- the shim path vs (a) ---
    const cmd = encodeShimCommand('readiness', { httpGet: { path: '/healthz', port: HTTP } });
    for (let i = 0; i < Math.min(50, o.probes); i++) await viaShim.execSync(app.id, cmd, 1);
    const helperPid = (): number | undefined => findChild(agent.pid!, (argv) => argv.some((a) => a.includes('netns-helper')));
    const helperCpu = (): number => (helperPid() ? totalCpuMs(helperPid()!) : 0);
    const wakes = (): { shim: number; agent: number; helper: number } => {
      const h = helperPid();
      return { shim: wakeupsOf(shim.pid!), agent: wakeupsOf(agent.pid!), helper: h ? wakeupsOf(h) : 0 };
    };
    const w0 = wakes();
    const client0 = { shim: totalCpuMs(shim.pid!), agent: totalCpuMs(agent.pid!), helper: helperCpu() };
    const lat: number[] = [];
    let unexpected = 0;
    let timedOut = 0;
    for (let i = 0; i < o.probes; i++) {
      const t = performance.now();
      const r = await viaShim.execSync(app.id, cmd, 1);
      const ms = performance.now() - t;
      lat.push(ms);
      if (!r.ok || r.msg.exitCode !== 0) {
        if (ranToTimeout(ms, 1)) timedOut++;
        else unexpected++;
      }
    }
    const shimCpu = totalCpuMs(shim.pid!) - client0.shim;
    const w1 = wakes();
    const wakeups = { shim: round((w1.shim - w0.shim) / o.probes, 1), agent: round((w1.agent - w0.agent) / o.probes, 1), helper: round((w1.helper - w0.helper) / o.probes, 1) };
    // The helper's CPU includes its reaped per-socket children; the agent's (cutime) includes the helper
    // only once it exits, which it does not during the run.
    const helperCpuUsed = helperCpu() - client0.helper;
    const agentOnlyUsed = totalCpuMs(agent.pid!) - client0.agent;
    const agentCpuUsed = agentOnlyUsed + helperCpuUsed;
    const shimPath = {
      ...series(lat, shimCpu + agentCpuUsed), shimCpuMs: round(shimCpu / o.probes), agentCpuMs: round(agentCpuUsed / o.probes),
      agentOnlyCpuMs: round(agentOnlyUsed / o.probes), helperCpuMs: round(helperCpuUsed / o.probes), cpuRatioToA: 0, unexpected, timedOut, wakeups,
    };
    o.log(`shim path: ${shimPath.cpuMsPerCall} ms CPU/probe (shim ${shimPath.shimCpuMs}, agent ${shimPath.agentOnlyCpuMs}, helper ${shimPath.helperCpuMs}), p50 ${shimPath.p50Ms} / p99 ${shimPath.p99Ms} ms; wake-ups/probe shim ${wakeups.shim}, agent ${wakeups.agent}, helper ${wakeups.helper}`);
    let altShimPath: (Series & { shimCpuMs: number }) | undefined;
    if (alt) {
      for (let i = 0; i < Math.min(50, o.probes); i++) await alt.client.execSync(app.id, cmd, 1);
      const a0 = totalCpuMs(alt.proc.pid!);
      const altLat: number[] = [];
      for (let i = 0; i < o.probes; i++) {
        const t = performance.now();
        const r = await alt.client.execSync(app.id, cmd, 1);
        altLat.push(performance.now() - t);
        if (!r.ok || r.msg.exitCode !== 0) throw new Error(`probe through the compared shim ${alt.relay} did not succeed`);
      }
      const used = totalCpuMs(alt.proc.pid!) - a0;
      altShimPath = { ...series(altLat, used), shimCpuMs: round(used / o.probes) };
      o.log(`shim path through ${alt.relay}: shim ${altShimPath.shimCpuMs} ms CPU/probe, p50 ${altShimPath.p50Ms} / p99 ${altShimPath.p99Ms} ms`);
      // The whole path, A/B in the same run: this shim and the compared one in alternating rounds,
      // each with the agent's and the helper's CPU (the same agent serves both: ExecSync for a shim
      // of issue 26 or later, Probe / RunLifecycleHandler for an older one).
      // Shim and agent CPU from schedstat (ns; ticks are too coarse for a paced round), the helper's
      // with its reaped forks from ticks; wake-ups of the shim and the agent.
      const zero = (): { shim: number; agent: number; helper: number; shimWakes: number; agentWakes: number; n: number } => ({ shim: 0, agent: 0, helper: 0, shimWakes: 0, agentWakes: 0, n: 0 });
      const ab = { this: zero(), compared: zero() };
      const perRound = Math.max(1, Math.floor(o.probes / 4));
      const rate = o.abRate ?? 0;
      for (let r = 0; r < 4; r++) {
        for (const [which, proc, client] of [['this', shim, viaShim], ['compared', alt.proc, alt.client]] as const) {
          const c0 = { shim: runMsOf(proc.pid!), agent: runMsOf(agent.pid!), helper: helperCpu(), shimWakes: wakeupsOf(proc.pid!), agentWakes: wakeupsOf(agent.pid!) };
          const t0 = performance.now();
          for (let i = 0; i < perRound; i++) {
            if (rate > 0) await new Promise((res) => setTimeout(res, Math.max(0, t0 + (i * 1000) / rate - performance.now())));
            const r2 = await client.execSync(app.id, cmd, 1);
            if (!r2.ok || r2.msg.exitCode !== 0) throw new Error(`A/B probe through ${which} shim did not succeed`);
          }
          const x = ab[which];
          x.shim += runMsOf(proc.pid!) - c0.shim;
          x.agent += runMsOf(agent.pid!) - c0.agent;
          x.helper += helperCpu() - c0.helper;
          x.shimWakes += wakeupsOf(proc.pid!) - c0.shimWakes;
          x.agentWakes += wakeupsOf(agent.pid!) - c0.agentWakes;
          x.n += perRound;
        }
      }
      for (const which of ['this', 'compared'] as const) {
        const x = ab[which];
        o.log(`A/B ${which} shim${rate > 0 ? ` at ${rate}/s` : ''}: ${round((x.shim + x.agent + x.helper) / x.n)} ms CPU/probe (shim ${round(x.shim / x.n)}, agent ${round(x.agent / x.n)}, helper ${round(x.helper / x.n)}); wake-ups/probe shim ${round(x.shimWakes / x.n, 1)}, agent ${round(x.agentWakes / x.n, 1)}`);
      }
      const t = ab.this;
      const c = ab.compared;
      o.log(`A/B this / compared: shim ${round(t.shim / c.shim, 2)}x, agent ${round(t.agent / c.agent, 2)}x, whole path ${round((t.shim + t.agent + t.helper) / (c.shim + c.agent + c.helper), 2)}x`);
    }

    // --- the agent's two transports, same run, interleaved ---
    const lean = new ShimProbeClient(shimSocketBeside(agentSock), agentSock);
    const viaGrpcJs = new ProbeApiClient(agentSock);
    // The shim's call: kubelet's ExecSyncRequest bytes for the rewritten probe, to ProbeService ExecSync.
    const execW = new WireWriter().bytes(REQ.containerId, app.id);
    for (const arg of cmd) execW.bytes(REQ.cmd, arg);
    const execBody = encodeFrame(execW.varint(REQ.timeout, 1).finish());
    const ways = {
      lean: async (): Promise<boolean> => (await lean.execSync(execBody, { deadlineMs: 3000 })).exitCode === 0,
      grpcJs: async (): Promise<boolean> => (await viaGrpcJs.probe({ pod: { containerId: app.id }, handler: { kind: 'http', port: HTTP, path: '/healthz', scheme: 'HTTP', headers: [] }, timeoutSeconds: 1, probeType: 'Readiness' })).result === 'success',
    };
    const tLat = { lean: [] as number[], grpcJs: [] as number[] };
    const tCpu = { lean: 0, grpcJs: 0 };
    for (const w of ['lean', 'grpcJs'] as const) for (let i = 0; i < 30; i++) await ways[w]();
    const perRound = Math.max(1, Math.floor(o.probes / 4));
    for (let r = 0; r < 4; r++) {
      for (const w of ['lean', 'grpcJs'] as const) {
        const c0 = totalCpuMs(agent.pid!) + helperCpu();
        for (let i = 0; i < perRound; i++) {
          const t = performance.now();
          if (!(await ways[w]())) throw new Error(`agent probe through ${w} did not succeed`);
          tLat[w].push(performance.now() - t);
        }
        tCpu[w] += totalCpuMs(agent.pid!) + helperCpu() - c0;
      }
    }
    lean.close();
    viaGrpcJs.close();
    const agentTransports = { lean: series(tLat.lean, tCpu.lean), grpcJs: series(tLat.grpcJs, tCpu.grpcJs) };
    o.log(`agent alone, by container ID: ExecSync on the lean server ${agentTransports.lean.cpuMsPerCall} ms CPU (p50 ${agentTransports.lean.p50Ms}), Probe on grpc-js ${agentTransports.grpcJs.cpuMsPerCall} ms CPU (p50 ${agentTransports.grpcJs.p50Ms})`);

    // (a): runProbe with the resident helper in this process, allowed into containerd's netns dir.
    const helper = await ResidentHelper.start({ allowDirs: [lab.netnsDir], maxInFlight: 512 });
    const ctx: ProbeContext = {
      netns: pod.netnsPath, podIPs: [pod.ipv4, pod.ipv6].filter(Boolean), timeoutSeconds: 1, sockets: helper,
      nodeSockets: new NodeSocketFactory(), kubeVersion: '1.34', hostFieldPolicy: 'refuse', happyEyeballs: true,
    };
    const handler: ProbeHandler = { kind: 'http', port: HTTP, path: '/healthz', scheme: 'HTTP', headers: [] };
    for (let i = 0; i < Math.min(50, o.probes); i++) {
      const r = await runProbe(handler, ctx);
      if (r.result !== 'success') throw new Error(`(a) in-netns probe of ${pod.ipv4}:${HTTP}: ${r.result} ${r.message}`);
    }
    const aHelper = helper.stats().pid!;
    const a0 = totalCpuMs('self') + totalCpuMs(aHelper);
    const aLat: number[] = [];
    for (let i = 0; i < o.probes; i++) {
      const t = performance.now();
      await runProbe(handler, ctx);
      aLat.push(performance.now() - t);
    }
    const inNetns = series(aLat, totalCpuMs('self') + totalCpuMs(aHelper) - a0);
    await helper.close();
    shimPath.cpuRatioToA = round(shimPath.cpuMsPerCall / Math.max(0.001, inNetns.cpuMsPerCall));
    o.log(`(a) in-netns, same target: ${inNetns.cpuMsPerCall} ms CPU/probe, p50 ${inNetns.p50Ms} / p99 ${inNetns.p99Ms} ms; shim path = ${shimPath.cpuRatioToA}x (a) in CPU, p50 +${round(shimPath.p50Ms - inNetns.p50Ms)} ms`);

    // --- a real exec probe ---
    const shims = runcShimPids(lab);
    const ctrdCpu = (): number => totalCpuMs(lab!.pid!);
    const shimsCpu = (): number => shims.reduce((s, p) => s + totalCpuMs(p), 0);
    for (let i = 0; i < Math.min(10, o.execs); i++) await direct.execSync(app.id, ['/bin/true'], 1);
    const e0 = { c: ctrdCpu(), s: shimsCpu() };
    const eLat: number[] = [];
    for (let i = 0; i < o.execs; i++) {
      const t = performance.now();
      await direct.execSync(app.id, ['/bin/true'], 1);
      eLat.push(performance.now() - t);
    }
    const eC = ctrdCpu() - e0.c;
    const eS = shimsCpu() - e0.s;
    const realExec = { ...series(eLat, eC + eS), containerdCpuMs: round(eC / o.execs), runcShimCpuMs: round(eS / o.execs) };
    o.log(`real exec probe: ${realExec.cpuMsPerCall} ms CPU (containerd ${realExec.containerdCpuMs}, runc shims ${realExec.runcShimCpuMs}), p50 ${realExec.p50Ms} ms`);

    // --- ordinary calls, direct vs through the shim, interleaved ---
    const targets = [{ sb: pod, c: app }, ...others];
    const methods: Record<string, (i: number) => [string, object]> = {
      ListContainers: () => ['ListContainers', {}],
      ListPodSandbox: () => ['ListPodSandbox', {}],
      PodSandboxStatus: (i) => ['PodSandboxStatus', { podSandboxId: targets[i % targets.length]!.sb.id }],
      ContainerStatus: (i) => ['ContainerStatus', { containerId: targets[i % targets.length]!.c.id }],
    };
    const ordinary: ShimBenchResult['ordinary'] = {};
    const altOrdinary: ShimBenchResult['ordinary'] = {};
    const rounds = 4;
    const per = Math.max(1, Math.floor(o.callsPerMethod / rounds));
    for (const [name, mk] of Object.entries(methods)) {
      const lats = { direct: [] as number[], shim: [] as number[], alt: [] as number[] };
      let shimCpuUsed = 0;
      let altCpuUsed = 0;
      for (let i = 0; i < 20; i++) await viaShim.call(...mk(i));
      if (alt) for (let i = 0; i < 20; i++) await alt.client.call(...mk(i));
      for (let r = 0; r < rounds; r++) {
        for (const way of alt ? (['direct', 'shim', 'alt'] as const) : (['direct', 'shim'] as const)) {
          const c = way === 'shim' ? viaShim : way === 'alt' ? alt!.client : direct;
          const s0 = totalCpuMs(shim.pid!);
          const alt0 = alt ? totalCpuMs(alt.proc.pid!) : 0;
          for (let i = 0; i < per; i++) {
            const t = performance.now();
            const res = await c.call(...mk(i));
            lats[way].push(performance.now() - t);
            if (!res.ok) throw new Error(`${name} ${way}: ${res.details}`);
          }
          if (way === 'shim') shimCpuUsed += totalCpuMs(shim.pid!) - s0;
          if (way === 'alt') altCpuUsed += totalCpuMs(alt!.proc.pid!) - alt0;
        }
      }
      const d = series(lats.direct, 0);
      const s = series(lats.shim, shimCpuUsed);
      ordinary[name] = { direct: d, shim: s, addedP50Ms: round(s.p50Ms - d.p50Ms), addedP99Ms: round(s.p99Ms - d.p99Ms) };
      o.log(`${name}: direct p50 ${d.p50Ms} / p99 ${d.p99Ms} ms, shim p50 ${s.p50Ms} / p99 ${s.p99Ms} ms (added p50 ${round(s.p50Ms - d.p50Ms)} ms), shim CPU ${s.cpuMsPerCall} ms/call`);
      if (alt) {
        const a = series(lats.alt, altCpuUsed);
        altOrdinary[name] = { direct: d, shim: a, addedP50Ms: round(a.p50Ms - d.p50Ms), addedP99Ms: round(a.p99Ms - d.p99Ms) };
        o.log(`${name} through ${alt.relay}: shim p50 ${a.p50Ms} / p99 ${a.p99Ms} ms (added p50 ${round(a.p50Ms - d.p50Ms)} ms), shim CPU ${a.cpuMsPerCall} ms/call`);
      }
    }
    const plegCorePercent = plegShare(ordinary);
    o.log(`PLEG relist through the shim (ListPodSandbox + ListContainers every second, ${o.sandboxes} pods): ${plegCorePercent} % of a core`);

    const result: ShimBenchResult = { sandboxes: o.sandboxes, startupMs, shimPath, agentTransports, inNetns, realExec, ordinary, plegCorePercent, relay: builds[0]!, targets: [] };
    if (alt && altShimPath) {
      result.compared = { relay: alt.relay, shimPath: altShimPath, ordinary: altOrdinary, plegCorePercent: plegShare(altOrdinary) };
      o.log(`PLEG relist through the compared shim ${alt.relay}: ${result.compared.plegCorePercent} % of a core`);
    }
    result.targets = shimTargets(result);
    return result;
  } finally {
    for (const c of clients) c.close();
    // SIGTERM first, so profiling processes write their profiles; then make sure.
    for (const p of procs) p.kill('SIGTERM');
    await new Promise((r) => setTimeout(r, process.env.BENCH_SHIM_PROFILE ? 3000 : 200));
    for (const p of procs) p.kill('SIGKILL');
    await kubelet?.stop();
    await lab?.destroy();
    rmSync(scratch, { recursive: true, force: true });
  }
}

/** The shim's % of a core for one ListPodSandbox and one ListContainers a second (kubelet's generic PLEG relist). */
export function plegShare(ordinary: ShimBenchResult['ordinary']): number {
  const ms = (ordinary['ListPodSandbox']?.shim.cpuMsPerCall ?? 0) + (ordinary['ListContainers']?.shim.cpuMsPerCall ?? 0);
  return round(ms / 10, 3);
}

/** The issue's targets for the shim (issue 19). */
export function shimTargets(r: ShimBenchResult): TargetCheck[] {
  const t: TargetCheck[] = [{
    target: 'shim path CPU/probe (shim + agent + helper), http',
    measured: `${r.shimPath.cpuMsPerCall} ms (shim ${r.shimPath.shimCpuMs}, agent ${r.shimPath.agentOnlyCpuMs}, helper ${r.shimPath.helperCpuMs}; ${r.shimPath.cpuRatioToA}x a = ${r.inNetns.cpuMsPerCall})`,
    limit: '<= 1.0 ms',
    pass: r.shimPath.cpuMsPerCall <= 1.0,
  }, {
    target: 'shim path p50, http',
    measured: `${r.shimPath.p50Ms} ms (a ${r.inNetns.p50Ms}, +${round(r.shimPath.p50Ms - r.inNetns.p50Ms)})`,
    limit: `<= a + 0.5 = ${round(r.inNetns.p50Ms + 0.5)} ms`,
    pass: r.shimPath.p50Ms <= r.inNetns.p50Ms + 0.5,
  }];
  for (const [m, x] of Object.entries(r.ordinary)) {
    t.push({ target: `shim CPU per ${m} (${r.sandboxes} pods)`, measured: `${x.shim.cpuMsPerCall} ms`, limit: '<= 0.15 ms', pass: x.shim.cpuMsPerCall <= 0.15 });
    t.push({ target: `shim added p50, ${m}`, measured: `${x.addedP50Ms} ms (${x.direct.p50Ms} -> ${x.shim.p50Ms})`, limit: '<= 0.2 ms', pass: x.addedP50Ms <= 0.2 });
  }
  t.push({ target: `PLEG relist every second through the shim (${r.sandboxes} pods)`, measured: `${r.plegCorePercent} % of a core`, limit: '<= 0.1 %', pass: r.plegCorePercent <= 0.1 });
  return t;
}

/** The markdown section for docs/bench-latest.md. */
export function renderShimMarkdown(r: ShimBenchResult): string {
  const L: string[] = ['', '## The kubelet shim', ''];
  L.push(`Real containerd (the lab's), the real agent (\`probe-agent run\`, CRI resolver) and the shim (\`node dist/shim/main.js\`, listening ${r.startupMs} ms after spawn) as separate processes; sequential calls from a kubelet-shaped grpc-js client. CPU from /proc (utime+stime + reaped children).`, '');
  L.push('| path | calls | CPU ms/call | p50 ms | p99 ms |', '| --- | --- | --- | --- | --- |');
  L.push(`| shim path: rewritten http probe, ExecSync -> shim -> agent -> helper (wake-ups/probe: shim ${r.shimPath.wakeups.shim}, agent ${r.shimPath.wakeups.agent}, helper ${r.shimPath.wakeups.helper}) | ${r.shimPath.n} | ${r.shimPath.cpuMsPerCall} (shim ${r.shimPath.shimCpuMs}, agent ${r.shimPath.agentOnlyCpuMs}, helper ${r.shimPath.helperCpuMs}; ${r.shimPath.cpuRatioToA}x a) | ${r.shimPath.p50Ms} | ${r.shimPath.p99Ms} |`);
  L.push(`| the agent alone: Probe by container ID through its lean server (the shim's client) | ${r.agentTransports.lean.n} | ${r.agentTransports.lean.cpuMsPerCall} (agent + helper) | ${r.agentTransports.lean.p50Ms} | ${r.agentTransports.lean.p99Ms} |`);
  L.push(`| the agent alone: the same through grpc-js (a grpc-js client) | ${r.agentTransports.grpcJs.n} | ${r.agentTransports.grpcJs.cpuMsPerCall} (agent + helper) | ${r.agentTransports.grpcJs.p50Ms} | ${r.agentTransports.grpcJs.p99Ms} |`);
  L.push(`| (a) the agent's own in-netns probe, same target | ${r.inNetns.n} | ${r.inNetns.cpuMsPerCall} | ${r.inNetns.p50Ms} | ${r.inNetns.p99Ms} |`);
  L.push(`| real exec probe: ExecSync /bin/true in busybox (containerd + runc shim + runc) | ${r.realExec.n} | ${r.realExec.cpuMsPerCall} (containerd ${r.realExec.containerdCpuMs}, runc shims ${r.realExec.runcShimCpuMs}) | ${r.realExec.p50Ms} | ${r.realExec.p99Ms} |`);
  L.push('', `Kubelet's ordinary calls with ${r.sandboxes} pod sandboxes (a container each), direct vs through the shim:`, '');
  L.push('| call | direct p50 / p99 ms | shim p50 / p99 ms | added p50 / p99 ms | shim CPU ms/call |', '| --- | --- | --- | --- | --- |');
  for (const [m, x] of Object.entries(r.ordinary)) {
    L.push(`| ${m} | ${x.direct.p50Ms} / ${x.direct.p99Ms} | ${x.shim.p50Ms} / ${x.shim.p99Ms} | ${x.addedP50Ms} / ${x.addedP99Ms} | ${x.shim.cpuMsPerCall} |`);
  }
  L.push('', `PLEG's relist (one ListPodSandbox and one ListContainers a second) costs the shim ${r.plegCorePercent} % of a core.`);
  const c = r.compared;
  if (c) {
    L.push('', `The same run, the measured shim (${r.relay}) beside a second shim (${c.relay}) (shim CPU ms/call, added p50 ms):`, '');
    L.push(`| call | ${r.relay} | ${c.relay} |`, '| --- | --- | --- |');
    L.push(`| rewritten probe (shim only) | ${r.shimPath.shimCpuMs}, p50 ${r.shimPath.p50Ms} | ${c.shimPath.shimCpuMs}, p50 ${c.shimPath.p50Ms} |`);
    for (const [m, x] of Object.entries(r.ordinary)) {
      const y = c.ordinary[m];
      if (y) L.push(`| ${m} | ${x.shim.cpuMsPerCall}, +${x.addedP50Ms} | ${y.shim.cpuMsPerCall}, +${y.addedP50Ms} |`);
    }
    L.push(`| PLEG relist, % of a core | ${r.plegCorePercent} | ${c.plegCorePercent} |`);
  }
  L.push('', '| target | measured | limit | verdict |', '| --- | --- | --- | --- |');
  for (const t of r.targets) L.push(`| ${t.target} | ${t.measured} | ${t.limit} | ${t.pass === null ? 'n/a' : t.pass ? 'PASS' : '**MISS**'} |`);
  return `${L.join('\n')}\n`;
}

/** Options from BENCH_* variables. */
export function shimBenchOptions(env: NodeJS.ProcessEnv, log: (l: string) => void): ShimBenchOptions {
  const quick = env.BENCH_QUICK === '1' || env.BENCH_QUICK === 'true';
  const n = (k: string, d: number): number => (env[k] ? Number(env[k]) : d);
  return {
    sandboxes: n('BENCH_SHIM_PODS', quick ? 4 : 250),
    probes: n('BENCH_SHIM_PROBES', quick ? 40 : 1000),
    execs: n('BENCH_SHIM_EXECS', quick ? 10 : 200),
    callsPerMethod: n('BENCH_SHIM_CALLS', quick ? 40 : 1000),
    ...(env.BENCH_SHIM_AUTHORITY ? { authority: env.BENCH_SHIM_AUTHORITY } : {}),
    ...(env.BENCH_SHIM_COMPARE ? { compareShim: env.BENCH_SHIM_COMPARE } : {}),
    ...(env.BENCH_SHIM_AB_RATE ? { abRate: n('BENCH_SHIM_AB_RATE', 0) } : {}),
    log,
  };
}

if (process.argv[1] && path.resolve(process.argv[1]) === path.resolve(new URL(import.meta.url).pathname)) {
  const log = (l: string): void => void process.stderr.write(`[bench] ${l}\n`);
  runShimBench(shimBenchOptions(process.env, log)).then((r) => {
    const out = process.env.BENCH_SHIM_OUT ?? mkdtempSync(path.join(tmpdir(), 'probe-agent-shim-bench-out-'));
    mkdirSync(out, { recursive: true });
    writeFileSync(path.join(out, 'shim.json'), `${JSON.stringify(r, null, 2)}\n`);
    process.stdout.write(renderShimMarkdown(r));
    log(`wrote ${path.join(out, 'shim.json')}`);
  }, (err: Error) => {
    process.stderr.write(`shim bench failed: ${err.stack}\n`);
    process.exitCode = 1;
  });
}
