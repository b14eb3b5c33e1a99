/**
 * `make soak-shim`: memory of the kubelet shim and the agent under pod churn, through the shim, on real
 * parts (`node test/soak/shim-soak.ts`; knobs SOAK_MINUTES (default 30), SOAK_PODS (16),
 * SOAK_AUTHORITY (`path`: the socket path as `:authority`, as kubelet < 1.31 sends it; or `localhost`),
 * SOAK_SHIM_SLOPE_MB_MIN (1), SOAK_SHIM_PEAK_MB (100), SOAK_SHIM_UNIT_FLAGS=0 (start the shim without the unit's
 * node flags and environment, to compare), SOAK_OUT (JSON result), SOAK_SHIM_NODE_FLAGS / SOAK_AGENT_NODE_FLAGS (extra node
 * flags, e.g. --heapsnapshot-signal=SIGUSR2, to find a leak)). The CI variant is
 * test/integration/shim-soak-short.test.ts.
 *
 * What runs: the lab's containerd with SOAK_PODS pod sandboxes, each with a busybox container serving
 * HTTP on 8080 (`httpd`); `probe-agent run` with the CRI resolver behind `probe-agent-shim` (dist/shim/main.js)
 * as separate processes; the fake kubelet lists the pods with their rewritten exec probes, so the agent's own
 * timers stay idle (on-demand, as in production). A kubelet-shaped driver (grpc-js, one connection, a new
 * ExecSync per probe with the timeout in the request and kubelet's deadline) runs every pod's rewritten HTTP
 * readiness and TCP liveness probe every second, and every 15 s replaces 4 pods: the sandbox is stopped and
 * removed (so their container IDs die) and a new one created. Every answer is judged: a probe of a running
 * pod must answer exit 0; a probe of a container whose sandbox was stopped or removed must be refused as a
 * dead container (NOT_FOUND "not known on this node" or UNAVAILABLE "no READY sandbox", see
 * isDeadContainerRefusal; never an exit code, nor any other error). Every few seconds the shim's and the agent's RSS is read from /proc, and the
 * agent's V8 heap from its /metrics (the shim has no heap endpoint).
 *
 * Fails when any answer was wrong (or more than 1 % Unknown), the shim's RSS slope over the second half or its
 * peak exceeds its bound, or the agent (with its helpers) exceeds the DaemonSet's memory limit.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import { encodeShimCommand } from '../../agent/contract/shim-command.ts';
import { launcherNodeFlags } from '../bench/agent-process.ts';
import { REPO } from '../bench/build.ts';
import { childrenOf, rssOf } from '../bench/procstat.ts';
import { BUSYBOX_IMAGE_REF, importBusyboxImage } from '../lab/busybox-image.ts';
import { createContainerdLab, type ContainerdLab, type LabContainer, type LabSandbox } from '../lab/containerd.ts';
import { builtEntry } from '../support/built-cli.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { KubeletCri, type CriAnswer } from '../support/kubelet-cri.ts';
import { makePod } from '../support/pod-factory.ts';

/** deploy/base/daemonset.yaml: resources.limits.memory of the agent container. */
export const AGENT_LIMIT_MB = 224;
/** The shim's RSS bound: Node's floor with the shim's code loaded (~65 MB at start, 48 MB of it the node binary) plus headroom. */
export const SHIM_PEAK_MB = 100;
/** deploy/base/daemonset.yaml: NODE_OPTIONS of the agent container. */
const AGENT_NODE_OPTIONS = '--max-old-space-size=96';
const PORT = 8080;
const NS = 'shim-soak';
/** busybox httpd serves /etc of the container: /passwd is a file, so 200. */
const READY_PATH = '/passwd';
/** A probe's timeoutSeconds: kubelet's default 1 s raised so a starved shared machine does not decide a verdict. */
const PROBE_TIMEOUT_S = 3;

/** What to run. */
export interface ShimSoakOptions {
  minutes: number;
  pods: number;
  /** Pods replaced per churn step, and how often (s). */
  replacePods: number;
  replaceEverySeconds: number;
  /** `path`: `:authority` = the shim's socket path (kubelet < 1.31); `localhost`: grpc-go's (and grpc-js's) default. */
  authority: 'path' | 'localhost';
  sampleEverySeconds: number;
  /** Fail when the shim's RSS grows faster than this over the second half (MB/min). */
  shimSlopeBoundMBPerMin: number;
  /** Fail when the shim's RSS ever exceeds this (MB). */
  shimPeakBoundMB: number;
  /** Fail when agent + helpers RSS exceeds this (MB). */
  agentLimitMB: number;
  log: (line: string) => void;
}

/** One memory sample. */
export interface MemorySample { tSec: number; shimRssMB: number; agentRssMB: number; agentHeapUsedMB: number }

/** Start, peak, end and second-half slope of one series. */
export interface SeriesSummary { startMB: number; peakMB: number; endMB: number; slopeMBPerMin: number }

/** Per kind of probe answer: how many, and how many were wrong. */
export interface AnswerCounts { ok: number; wrong: number }

/**
 * Probes of running pods: `unknown` = a gRPC error (the agent could not run the probe, e.g. a netns helper
 * starved on a loaded machine): kubelet's prober makes that Unknown and keeps the container's state, so it
 * is no wrong verdict, but more than UNKNOWN_SHARE_MAX of them fails the soak.
 */
export interface HealthyCounts extends AnswerCounts { unknown: number }

/** The share of probes of running pods that may end Unknown (a gRPC error) before the soak fails. */
export const UNKNOWN_SHARE_MAX = 0.01;

/** What a run found. */
export interface ShimSoakResult {
  options: Omit<ShimSoakOptions, 'log'>;
  seconds: number;
  replaced: number;
  probes: { healthy: HealthyCounts; dead: AnswerCounts };
  /** The first wrong answers (at most 20), for the report. */
  wrongExamples: string[];
  shimRss: SeriesSummary;
  agentRss: SeriesSummary;
  agentHeapUsed: SeriesSummary;
  samples: MemorySample[];
  failures: string[];
}

/** Options from the environment (SOAK_* knobs). */
export function optionsFromEnv(log: (line: string) => void): ShimSoakOptions {
  const num = (name: string, dflt: number): number => {
    const v = process.env[name];
    if (v === undefined || v === '') return dflt;
    const n = Number(v);
    if (!Number.isFinite(n) || n <= 0) throw new Error(`${name}=${v}: want a positive number`);
    return n;
  };
  const authority = process.env['SOAK_AUTHORITY'] ?? 'path';
  if (authority !== 'path' && authority !== 'localhost') throw new Error(`SOAK_AUTHORITY=${authority}: want path or localhost`);
  return {
    minutes: num('SOAK_MINUTES', 30),
    pods: num('SOAK_PODS', 16),
    replacePods: num('SOAK_REPLACE_PODS', 4),
    replaceEverySeconds: num('SOAK_REPLACE_EVERY', 15),
    authority,
    sampleEverySeconds: num('SOAK_SAMPLE_EVERY', 5),
    shimSlopeBoundMBPerMin: num('SOAK_SHIM_SLOPE_MB_MIN', 1),
    shimPeakBoundMB: num('SOAK_SHIM_PEAK_MB', SHIM_PEAK_MB),
    agentLimitMB: num('SOAK_AGENT_LIMIT_MB', AGENT_LIMIT_MB),
    log,
  };
}

/** Least-squares slope of y over t (s), in units per minute; 0 with fewer than 2 points. */
export function slopePerMinute(points: { t: number; y: number }[]): number {
  if (points.length < 2) return 0;
  const n = points.length;
  const mt = points.reduce((s, p) => s + p.t, 0) / n;
  const my = points.reduce((s, p) => s + p.y, 0) / n;
  let num = 0;
  let den = 0;
  for (const p of points) {
    num += (p.t - mt) * (p.y - my);
    den += (p.t - mt) ** 2;
  }
  return den === 0 ? 0 : (num / den) * 60;
}

function summarise(samples: MemorySample[], pick: (s: MemorySample) => number): SeriesSummary {
  const r = (x: number): number => Math.round(x * 100) / 100;
  if (samples.length === 0) return { startMB: 0, peakMB: 0, endMB: 0, slopeMBPerMin: 0 };
  const end = samples[samples.length - 1]!;
  const half = samples.filter((s) => s.tSec >= end.tSec / 2);
  return {
    startMB: r(pick(samples[0]!)),
    peakMB: r(Math.max(...samples.map(pick))),
    endMB: r(pick(end)),
    slopeMBPerMin: r(slopePerMinute(half.map((s) => ({ t: s.tSec, y: pick(s) })))),
  };
}

function spawnReady(cmd: string, args: string[], ready: RegExp, what: string, env: NodeJS.ProcessEnv = process.env): Promise<{ child: ChildProcess; match: RegExpExecArray }> {
  const child = spawn(cmd, args, { stdio: ['ignore', 'ignore', 'pipe'], env });
  let tail = '';
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`${what} did not start: ${tail}`)), 60_000);
    const onData = (d: Buffer): void => {
      tail = (tail + d.toString()).slice(-4000);
      const m = ready.exec(tail);
      if (m) {
        clearTimeout(t);
        // Keep draining stderr so the child never blocks on a full pipe.
        child.stderr!.off('data', onData);
        child.stderr!.on('data', () => {});
        resolve({ child, match: m });
      }
    };
    child.stderr!.on('data', onData);
    child.once('exit', (c) => reject(new Error(`${what} exited (${c}): ${tail}`)));
  });
}

/** The pod as kubelet (and the rewrite webhook) leaves it: both probes are probe-agent's exec commands. */
function podSpec(sb: LabSandbox, app: LabContainer): Record<string, unknown> {
  const pod = makePod({ uid: sb.uid, name: sb.name, namespace: NS, ips: sb.ips, probe: 'none', port: PORT, containerID: `containerd://${app.id}` });
  const c = (pod.spec as { containers: Record<string, unknown>[] }).containers[0]!;
  const timing = { periodSeconds: 1, timeoutSeconds: PROBE_TIMEOUT_S, successThreshold: 1, failureThreshold: 3 };
  c.readinessProbe = { exec: { command: readinessCmd }, ...timing };
  c.livenessProbe = { exec: { command: livenessCmd }, ...timing };
  return pod;
}

const readinessCmd = encodeShimCommand('readiness', { httpGet: { path: READY_PATH, port: PORT, scheme: 'HTTP' } });
const livenessCmd = encodeShimCommand('liveness', { tcpSocket: { port: PORT } });

function describeAnswer(a: CriAnswer<{ exitCode: number; stdout: Buffer }>): string {
  return a.ok ? `exit ${a.msg.exitCode} ${a.msg.stdout.toString().slice(0, 200)}` : `gRPC ${grpc.status[a.code]}: ${a.details.slice(0, 200)}`;
}

/** The systemd unit the shim runs under on a node. */
export const SHIM_UNIT = path.join(REPO, 'deploy/components/kubelet-shim/probe-agent-shim.service');

/**
 * The node flags the shim's systemd unit starts it with (between `node` and `dist/shim/main.js` in its
 * ExecStart), so that the soak measures the memory the shipped unit gives; [] if there are none.
 */
export function shimUnitNodeFlags(unit = SHIM_UNIT): string[] {
  const line = /^ExecStart=\S*\/node((?:\s+--[a-z0-9-]+(?:=\S+)?)*)\s+\S*\/dist\/shim\/main\.js/m.exec(readFileSync(unit, 'utf8'));
  if (!line) throw new Error(`${unit}: no ExecStart running node .../dist/shim/main.js`);
  return (line[1] ?? '').split(/\s+/).filter(Boolean);
}

/**
 * The environment the shim's systemd unit gives it (its `Environment=` lines: the allocator settings
 * its memory depends on), so that a harness runs the shim with the memory behaviour of the shipped unit.
 */
export function shimUnitEnv(unit = SHIM_UNIT): Record<string, string> {
  const env: Record<string, string> = {};
  for (const m of readFileSync(unit, 'utf8').matchAll(/^Environment=(.*)$/gm)) {
    for (const a of (m[1] ?? '').split(/\s+/).filter(Boolean)) {
      const eq = a.indexOf('=');
      if (eq <= 0 || /["'\\$%]/.test(a)) throw new Error(`${unit}: Environment= entry ${JSON.stringify(a)} is not a plain NAME=value`);
      env[a.slice(0, eq)] = a.slice(eq + 1);
    }
  }
  return env;
}

/** The agent DaemonSet as shipped. */
export const AGENT_DAEMONSET = path.join(REPO, 'deploy/base/daemonset.yaml');

/**
 * The agent container's NODE_OPTIONS (its V8 heap cap) and MALLOC_* settings from the shipped
 * DaemonSet, so that a harness runs the agent with the memory behaviour it is deployed with.
 */
export function agentDaemonSetEnv(manifest = AGENT_DAEMONSET): Record<string, string> {
  const env: Record<string, string> = {};
  for (const m of readFileSync(manifest, 'utf8').matchAll(/- name: (NODE_OPTIONS|MALLOC_[A-Z_]+)\s+value: "?([^"\n]*?)"?\s*$/gm)) env[m[1]!] = m[2]!;
  if (!env['NODE_OPTIONS']) throw new Error(`${manifest}: no NODE_OPTIONS for the agent`);
  return env;
}

/** Extra node flags for the shim or the agent from the environment (e.g. --heapsnapshot-signal=SIGUSR2), for finding a leak. */
function extraFlags(name: string): string[] {
  return (process.env[name] ?? '').split(/\s+/).filter(Boolean);
}

interface SoakPod { sb: LabSandbox; app: LabContainer; stopped: boolean }

const escapeRe = (s: string): string => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/**
 * Whether the answer to a rewritten `kind` probe of `app` (in sandbox `sb`, stopped or removed) is
 * the shim's refusal of a dead container: the agent's refusal passed on as a gRPC error (never an
 * exit code, which kubelet would take as the probe's verdict), for one of the two reasons a dead
 * container has (agent/prober/container-lookup.ts, agent/netns/resolver.ts, agent/api/exec-sync.ts):
 *  - NOT_FOUND "probe-agent refused the <kind> probe: container <id> is not known on this node"
 *    (the runtime has no such container: removed);
 *  - UNAVAILABLE "probe-agent refused the <kind> probe: netns of pod <ns>/<name> (<uid>) not
 *    resolvable: ... no READY sandbox" (its sandbox is stopped; the wording differs once the
 *    resolver saw the pod run: "the runtime no longer has a READY sandbox for it").
 * Any other error is not: the agent not reached or too slow ("did not run"), a refusal for load
 * (RESOURCE_EXHAUSTED), the shim's own INVALID_ARGUMENT or INTERNAL, or another pod named.
 */
export function isDeadContainerRefusal(a: CriAnswer<unknown>, kind: 'readiness' | 'liveness', sb: Pick<LabSandbox, 'namespace' | 'name' | 'uid'>, app: Pick<LabContainer, 'id'>): boolean {
  if (a.ok) return false;
  const refused = `^probe-agent refused the ${kind} probe: `;
  if (a.code === grpc.status.NOT_FOUND) {
    return new RegExp(`${refused}container ${escapeRe(app.id.slice(0, 12))}[0-9a-f]* is not known on this node( \\(|$)`).test(a.details);
  }
  if (a.code === grpc.status.UNAVAILABLE) {
    const pod = escapeRe(`${sb.namespace}/${sb.name} (${sb.uid})`);
    return new RegExp(`${refused}netns of pod ${pod} not resolvable: .*\\bno(?: longer has a)? READY sandbox\\b`).test(a.details);
  }
  return false;
}

/** Runs one soak; never throws for a wrong answer or growth (see `failures`), only for a broken setup. */
export async function runShimSoak(o: ShimSoakOptions): Promise<ShimSoakResult> {
  const scratch = mkdtempSync(path.join(tmpdir(), 'probe-agent-shim-soak-'));
  const procs: ChildProcess[] = [];
  let lab: ContainerdLab | undefined;
  let kubelet: FakeKubelet | undefined;
  let cri: KubeletCri | undefined;
  const probes = { healthy: { ok: 0, wrong: 0, unknown: 0 }, dead: { ok: 0, wrong: 0 } };
  const unknownExamples: string[] = [];
  const wrongExamples: string[] = [];
  const wrong = (what: string): void => {
    if (wrongExamples.length < 20) wrongExamples.push(what);
    o.log(`WRONG ${what}`);
  };
  const samples: MemorySample[] = [];
  let replaced = 0;
  try {
    lab = await createContainerdLab();
    importBusyboxImage(lab.socket);
    const newPod = async (i: number): Promise<SoakPod> => {
      const sb = await lab!.runSandbox({ name: `soak-${i}`, namespace: NS });
      const app = await lab!.runContainer(sb, { name: 'app', image: BUSYBOX_IMAGE_REF, command: ['/bin/busybox', 'httpd', '-f', '-p', String(PORT), '-h', '/etc'] });
      // A healthy target from its first probe on: httpd listening (kubelet would see "refused" before, rightly).
      for (let tries = 0; ; tries++) {
        const r = await lab!.exec(sb, 'bash', ['-c', `exec 3<>/dev/tcp/127.0.0.1/${PORT}`]);
        if (r.code === 0) break;
        if (tries >= 300) throw new Error(`httpd in ${sb.name} not listening on ${PORT}: ${r.stderr}`);
        await new Promise((res) => setTimeout(res, 100));
      }
      return { sb, app, stopped: false };
    };
    const pods: SoakPod[] = [];
    for (let i = 0; i < o.pods; i += 4) pods.push(...await Promise.all(Array.from({ length: Math.min(4, o.pods - i) }, (_, j) => newPod(i + j))));
    let nextIndex = o.pods;
    kubelet = await FakeKubelet.start({ pods: pods.map((p) => podSpec(p.sb, p.app)) });

    const agentSock = path.join(scratch, 'probe.sock');
    const cli = builtEntry('cli.js');
    const agentEnv = { ...process.env, NODE_OPTIONS: AGENT_NODE_OPTIONS };
    const agentStart = await spawnReady(process.execPath, [...launcherNodeFlags(), ...extraFlags('SOAK_AGENT_NODE_FLAGS'), cli, 'run', `--kubelet-url=${kubelet.httpUrl}`, '--kubelet-token-file=',
      '--netns-resolvers=cri', `--cri-endpoint=${lab.endpoint}`, `--netns-dir=${lab.netnsDir}`, `--socket=${agentSock}`, '--metrics-address=127.0.0.1:0', '--log-format=json'],
    /metrics listener started[^\n]*"address":"([^"]+)"/, 'agent', agentEnv);
    procs.push(agentStart.child);
    const metricsUrl = `http://${agentStart.match[1]}/metrics`;
    const shimSock = path.join(scratch, 'cri.sock');
    // As the systemd unit runs it: its node flags and environment (SOAK_SHIM_UNIT_FLAGS=0: neither, to compare).
    const asUnit = process.env['SOAK_SHIM_UNIT_FLAGS'] !== '0';
    const unitFlags = asUnit ? shimUnitNodeFlags() : [];
    const shimStart = await spawnReady(process.execPath, [...unitFlags, ...extraFlags('SOAK_SHIM_NODE_FLAGS'), builtEntry('shim/main.js'), '--listen', `unix://${shimSock}`, '--runtime-endpoint', lab.endpoint, '--probe-socket', agentSock], /shim listening/, 'shim',
      { ...process.env, ...(asUnit ? shimUnitEnv() : {}) });
    procs.push(shimStart.child);
    const shimPid = shimStart.child.pid!;
    const agentPid = agentStart.child.pid!;
    cri = new KubeletCri(shimSock, o.authority === 'path' ? { 'grpc.default_authority': shimSock } : {});
    o.log(`shim-soak: ${o.pods} pods, ${o.replacePods} replaced every ${o.replaceEverySeconds} s, ${o.minutes} min, :authority ${o.authority === 'path' ? shimSock : 'localhost'}; shim pid ${shimPid}, agent pid ${agentPid}`);

    const t0 = Date.now();
    const endAt = t0 + o.minutes * 60_000;
    /** Set when a churn step failed: the run stops (workers first), then the error is thrown. */
    let broken: Error | undefined;
    const running = () => broken === undefined && Date.now() < endAt;
    const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

    const agentHeapMB = async (): Promise<number> => {
      try {
        const body = await (await fetch(metricsUrl, { signal: AbortSignal.timeout(5000) })).text();
        const m = /^nodejs_heap_size_used_bytes (\S+)$/m.exec(body);
        return m ? Number(m[1]) / 1048576 : 0;
      } catch {
        return 0;
      }
    };
    const sampleOnce = async (): Promise<void> => {
      const shim = rssOf(shimPid).rssMB;
      // The agent's container holds the agent and its netns helpers.
      const agent = rssOf(agentPid).rssMB + childrenOf(agentPid).reduce((s, c) => s + rssOf(c).rssMB, 0);
      const s = { tSec: Math.round((Date.now() - t0) / 100) / 10, shimRssMB: Math.round(shim * 10) / 10, agentRssMB: Math.round(agent * 10) / 10, agentHeapUsedMB: Math.round((await agentHeapMB()) * 10) / 10 };
      samples.push(s);
      if (samples.length % 12 === 1) o.log(`t=${s.tSec}s shim ${s.shimRssMB} MB, agent ${s.agentRssMB} MB (heap ${s.agentHeapUsedMB}), probes ok ${probes.healthy.ok} wrong ${probes.healthy.wrong} unknown ${probes.healthy.unknown}, dead refused ${probes.dead.ok} wrong ${probes.dead.wrong}, replaced ${replaced}`);
    };

    // kubelet's probe worker: one per pod and probe, a tick every period, the next tick only after the probe returned.
    const worker = async (p: SoakPod, kind: 'readiness' | 'liveness'): Promise<void> => {
      const cmd = kind === 'readiness' ? readinessCmd : livenessCmd;
      await sleep(Math.random() * 1000);
      while (running() && !p.stopped) {
        const started = Date.now();
        const a = await cri!.execSync(p.app.id, cmd, PROBE_TIMEOUT_S);
        if (p.stopped) break; // answered while kubelet was killing the pod: kubelet drops such a result too
        if (a.ok && a.msg.exitCode === 0) probes.healthy.ok++;
        else if (!a.ok) {
          probes.healthy.unknown++;
          if (unknownExamples.length < 5) unknownExamples.push(`${kind} of running ${p.sb.name}: ${describeAnswer(a)}`);
        } else {
          probes.healthy.wrong++;
          wrong(`${kind} of running ${p.sb.name} (${p.app.id.slice(0, 12)}): ${describeAnswer(a)}`);
        }
        await sleep(Math.max(0, 1000 - (Date.now() - started)));
      }
    };
    const workers: Promise<void>[] = [];
    const startWorkers = (p: SoakPod): void => {
      workers.push(worker(p, 'readiness'), worker(p, 'liveness'));
    };
    pods.forEach(startWorkers);

    const deadProbe = async (p: SoakPod, when: string): Promise<void> => {
      for (const [kind, cmd] of [['readiness', readinessCmd], ['liveness', livenessCmd]] as const) {
        const a = await cri!.execSync(p.app.id, cmd, PROBE_TIMEOUT_S);
        if (isDeadContainerRefusal(a, kind, p.sb, p.app)) probes.dead.ok++;
        else {
          probes.dead.wrong++;
          wrong(`${kind} probe of ${when} ${p.sb.name} (${p.app.id.slice(0, 12)}) not refused as a dead container: ${describeAnswer(a)}`);
        }
      }
    };
    // Churn: every replaceEverySeconds, the oldest replacePods pods are replaced (new UID, sandbox, container ID).
    const churn = async (): Promise<void> => {
      while (running()) {
        await sleep(o.replaceEverySeconds * 1000);
        if (!running()) break;
        const going = pods.splice(0, o.replacePods);
        await Promise.all(going.map(async (p) => {
          p.stopped = true;
          await lab!.stopSandbox(p.sb.id);
          await deadProbe(p, 'stopped');
          await lab!.removeSandbox(p.sb.id);
          await deadProbe(p, 'removed');
          const fresh = await newPod(nextIndex++);
          pods.push(fresh);
          kubelet!.setPods(pods.map((q) => podSpec(q.sb, q.app)));
          startWorkers(fresh);
          replaced++;
        }));
      }
    };
    const sampler = async (): Promise<void> => {
      while (running()) {
        await sampleOnce();
        await sleep(o.sampleEverySeconds * 1000);
      }
      await sampleOnce();
    };
    await Promise.all([churn().catch((err: unknown) => {
      broken = new Error(`churn step failed after ${replaced} replacements: ${(err as Error).message}`, { cause: err });
    }), sampler()]);
    await Promise.all(workers);
    if (broken) throw broken;
    const seconds = Math.round((Date.now() - t0) / 1000);

    const result: ShimSoakResult = {
      options: { ...o, log: undefined } as unknown as Omit<ShimSoakOptions, 'log'>,
      seconds, replaced, probes, wrongExamples, samples,
      shimRss: summarise(samples, (s) => s.shimRssMB),
      agentRss: summarise(samples, (s) => s.agentRssMB),
      agentHeapUsed: summarise(samples, (s) => s.agentHeapUsedMB),
      failures: [],
    };
    delete (result.options as { log?: unknown }).log;
    if (probes.healthy.wrong > 0) result.failures.push(`${probes.healthy.wrong} probes of running pods answered a failure`);
    const all = probes.healthy.ok + probes.healthy.wrong + probes.healthy.unknown;
    if (probes.healthy.unknown > all * UNKNOWN_SHARE_MAX) result.failures.push(`${probes.healthy.unknown} of ${all} probes of running pods ended Unknown (gRPC error), more than ${UNKNOWN_SHARE_MAX * 100} %: ${unknownExamples.join('; ')}`);
    if (result.shimRss.peakMB > o.shimPeakBoundMB) result.failures.push(`shim RSS peaked at ${result.shimRss.peakMB} MB (bound ${o.shimPeakBoundMB})`);
    if (probes.dead.wrong > 0) result.failures.push(`${probes.dead.wrong} probes of stopped/removed containers were not refused as dead containers (answered, or another error)`);
    if (probes.healthy.ok === 0) result.failures.push('no probe succeeded');
    if (result.shimRss.slopeMBPerMin > o.shimSlopeBoundMBPerMin) result.failures.push(`shim RSS grew ${result.shimRss.slopeMBPerMin} MB/min over the second half (bound ${o.shimSlopeBoundMBPerMin})`);
    if (result.agentRss.peakMB > o.agentLimitMB) result.failures.push(`agent RSS peaked at ${result.agentRss.peakMB} MB, over its limit of ${o.agentLimitMB} MB`);
    for (const [what, c] of [['shim', shimStart.child], ['agent', agentStart.child]] as const) {
      if (c.exitCode !== null || c.signalCode !== null) result.failures.push(`${what} exited during the soak (${c.exitCode ?? c.signalCode})`);
    }
    return result;
  } finally {
    cri?.close();
    for (const p of procs) p.kill('SIGKILL');
    await kubelet?.stop().catch(() => {});
    await lab?.destroy().catch(() => {});
    rmSync(scratch, { recursive: true, force: true });
  }
}

/** The result as a few markdown lines. */
export function formatResult(r: ShimSoakResult): string {
  const row = (name: string, s: SeriesSummary): string => `| ${name} | ${s.startMB} | ${s.peakMB} | ${s.endMB} | ${s.slopeMBPerMin} |`;
  return [
    `shim-soak: ${r.seconds} s, :authority ${r.options.authority}, ${r.options.pods} pods, ${r.replaced} replaced; probes of running pods ${r.probes.healthy.ok} ok / ${r.probes.healthy.wrong} wrong / ${r.probes.healthy.unknown} unknown (gRPC error); probes of dead containers ${r.probes.dead.ok} refused / ${r.probes.dead.wrong} wrong`,
    '',
    '| series | start MB | peak MB | end MB | slope over 2nd half MB/min |',
    '|---|---|---|---|---|',
    row('shim RSS', r.shimRss),
    row('agent + helpers RSS', r.agentRss),
    row('agent V8 heap used', r.agentHeapUsed),
    '',
    r.failures.length ? `FAIL: ${r.failures.join('; ')}` : 'PASS',
    ...r.wrongExamples.map((w) => `  wrong: ${w}`),
  ].join('\n');
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const log = (l: string): void => void process.stderr.write(`${new Date().toISOString()} ${l}\n`);
  const r = await runShimSoak(optionsFromEnv(log));
  process.stdout.write(`${formatResult(r)}\n`);
  const out = process.env['SOAK_OUT'];
  if (out) writeFileSync(out, JSON.stringify(r, null, 2));
  process.exit(r.failures.length ? 1 : 0);
}
