/**
 * Data-plane faults against the real daemon (`probe-agent run` on a test kubelet and lab pods):
 * hostile targets (hung, slowloris, endless and dripping bodies, a 1 MiB header block, a redirect
 * loop, garbage instead of HTTP/2, RST_STREAM), a hung or killed per-probe helper child, a killed
 * or stuck resident helper, a pod netns deleted mid-probe, a missing helper binary and a tiny
 * probe queue. Every probe must end with kubelet's result and a clear reason within its deadline,
 * our own trouble must show as 'error' (never as a failure that could restart a container), and
 * the agent must stay healthy: /healthz answers, RSS and fds stay flat.
 *
 * Helper children are held hung with a tiny ptrace tracer (compiled here with gcc): it seizes the
 * resident helper and leaves every child it forks stopped at birth, like a child stuck in the kernel.
 * So the helper runs without its pool of workers here (NetnsHelperPool=false).
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'gcc', 'prlimit']);

import { execFileSync, spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync, readlinkSync, realpathSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApiError } from '../../agent/api/client.ts';
import { resolveHelperPath } from '../../agent/netns/helper-protocol.ts';
import type { ProbeHandler, ProbeOutcome } from '../../agent/probe/types.ts';
import type { ProbeStatus } from '../../agent/scheduler/types.ts';
import { createLab, type Lab, type LabPod, type RunningServer } from '../lab/lab.ts';
import { startHostileServer, type HostileServer } from '../lab/hostile-server.ts';
import { startAgent, type AgentHandle } from '../support/agent-harness.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { makePod } from '../support/pod-factory.ts';

const NS = 'faults';
const HELPER = realpathSync(resolveHelperPath());
/**
 * A probe may overrun its timeout by this much inside the agent (timers, a loaded 2-core CI box):
 * far below the helper's 5 s, so the probe's own deadline (not a helper timeout) is what ended it.
 */
const MARGIN_S = 1.5;

const HOLD_C = String.raw`
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
int main(int argc, char **argv) {
  if (argc != 2) return 2;
  pid_t target = (pid_t)atoi(argv[1]);
  if (ptrace(PTRACE_SEIZE, target, 0, PTRACE_O_TRACEFORK | PTRACE_O_TRACEVFORK | PTRACE_O_TRACECLONE) < 0) { perror("seize"); return 1; }
  printf("ready\n"); fflush(stdout);
  for (;;) {
    int st; pid_t p = waitpid(-1, &st, __WALL);
    if (p < 0) { if (errno == EINTR) continue; return 0; }
    if (WIFEXITED(st) || WIFSIGNALED(st)) { if (p == target) return 0; continue; }
    if (!WIFSTOPPED(st) || p != target) continue; /* a new child stays stopped: hung */
    int event = st >> 16;
    if (event == PTRACE_EVENT_FORK || event == PTRACE_EVENT_VFORK || event == PTRACE_EVENT_CLONE) {
      unsigned long child = 0; ptrace(PTRACE_GETEVENTMSG, p, 0, &child);
      printf("child %lu\n", child); fflush(stdout);
      ptrace(PTRACE_CONT, p, 0, 0);
    } else if (event == PTRACE_EVENT_STOP) ptrace(PTRACE_LISTEN, p, 0, 0);
    else ptrace(PTRACE_CONT, p, 0, (void *)(long)WSTOPSIG(st));
  }
}
`;

let scratch: string;
let lab: Lab;
let podA: LabPod;
let podB: LabPod;
let podC: LabPod;
let srvA: RunningServer;
let srvC: RunningServer;
let hostile: HostileServer;
let kubelet: FakeKubelet;
/** The pods the fake kubelet serves (a test that needs the helper to itself swaps them out and back). */
let allPods: Record<string, unknown>[];
let agent: AgentHandle;

const sha = (s: string): string => createHash('sha256').update(s).digest('hex');
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
/** `pred` holds for every item of a list that is not empty (`.every` alone is true for an empty one). */
const allOf = <T,>(list: T[], pred: (x: T) => boolean): boolean => list.length > 0 && list.every(pred);

/** A kubelet pod whose containers each carry one readiness probe (period 1 s, timeout 1 s, threshold 1). */
function podWithProbes(name: string, ips: string[], probes: Record<string, Record<string, unknown>>, timing: Record<string, number> = {}): Record<string, unknown> {
  const pod = makePod({ name, namespace: NS, ips, probe: 'none' });
  const spec = pod['spec'] as { containers: Record<string, unknown>[] };
  const status = pod['status'] as { containerStatuses: Record<string, unknown>[] };
  const app = spec.containers[0] as Record<string, unknown>;
  const appStatus = status.containerStatuses[0] as Record<string, unknown>;
  spec.containers = Object.entries(probes).map(([c, handler]) => ({
    ...app, name: c, readinessProbe: { periodSeconds: 1, timeoutSeconds: 1, failureThreshold: 1, ...timing, ...handler },
  }));
  status.containerStatuses = Object.keys(probes).map((c) => ({ ...appStatus, name: c, containerID: `containerd://${sha(`${name}/${c}`)}` }));
  return pod;
}

/** Adds a liveness probe (same handler, threshold 1) to every container: what would restart a container. */
function withLiveness(pod: Record<string, unknown>): Record<string, unknown> {
  for (const c of (pod['spec'] as { containers: Record<string, unknown>[] }).containers) c['livenessProbe'] = { ...(c['readinessProbe'] as object) };
  return pod;
}

/** prober_probe_total{result="successful"} per pod name, from the agent's /metrics/probes. */
async function successes(a: AgentHandle): Promise<Map<string, number>> {
  const out = new Map<string, number>();
  for (const line of (await a.http('/metrics/probes')).body.split('\n')) {
    const m = /^prober_probe_total\{.*pod="([^"]+)".*result="successful"\} (\d+)$/.exec(line);
    if (m) out.set(m[1] as string, (out.get(m[1] as string) ?? 0) + Number(m[2]));
  }
  return out;
}

const httpGet = (port: number, path = '/'): ProbeHandler => ({ kind: 'http', port, path, scheme: 'HTTP', headers: [] });

/** One on-demand probe through the agent's API; returns the outcome and the wall-clock seconds. */
async function probeVia(a: AgentHandle, pod: string, handler: ProbeHandler, timeoutSeconds = 1): Promise<{ out: ProbeOutcome; wall: number }> {
  const t0 = performance.now();
  const out = await a.client.probe({ pod: { namespace: NS, name: pod }, handler, timeoutSeconds });
  return { out, wall: (performance.now() - t0) / 1000 };
}

/** The status of one container's probe (the first probe type found). */
function statusOf(list: ProbeStatus[], pod: string, container: string): ProbeStatus | undefined {
  return list.find((s) => s.podName === pod && s.key.containerName === container);
}

/** Resident set size of a process, in MiB. */
function rssMiB(pid: number): number {
  const kb = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1];
  return Number(kb) / 1024;
}

const fdCount = (pid: number): number => readdirSync(`/proc/${pid}/fd`).length;

/** Children of `pid` across all its threads. */
function childrenOf(pid: number): number[] {
  const out: number[] = [];
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    try {
      out.push(...readFileSync(`/proc/${pid}/task/${tid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean).map(Number));
    } catch {
      // thread gone meanwhile
    }
  }
  return out;
}

/** The agent's resident netns helper, found through /proc (a child of the agent running the helper binary). */
function helperPid(a: AgentHandle): number | undefined {
  return childrenOf(a.pid).find((c) => {
    try {
      return readlinkSync(`/proc/${c}/exe`) === HELPER;
    } catch {
      return false;
    }
  });
}

/** Polls `get` until it yields a value (not undefined/false); throws naming `what` after `ms`. */
async function waitFor<T>(what: string, get: () => T | undefined | false | Promise<T | undefined | false>, ms = 5000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await get();
    if (v !== undefined && v !== false) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(25);
  }
}

/** A running tracer that keeps every child the traced process forks stopped until released. */
interface ChildHolder {
  /** Pids of the children held so far. */
  held: number[];
  release(): Promise<void>;
}

/** Attaches the tracer to `pid`; resolves once every child it forks from now on is held stopped. */
async function holdChildrenOf(pid: number): Promise<ChildHolder> {
  const proc: ChildProcessWithoutNullStreams = spawn(join(scratch, 'hold'), [String(pid)]);
  const held: number[] = [];
  const exited = new Promise<void>((r) => proc.once('close', () => r()));
  await new Promise<void>((resolve, reject) => {
    createInterface({ input: proc.stdout }).on('line', (line) => {
      if (line === 'ready') resolve();
      const m = /^child (\d+)$/.exec(line);
      if (m) held.push(Number(m[1]));
    });
    void exited.then(() => reject(new Error('tracer exited before attaching')));
  });
  return {
    held,
    release: async () => {
      // Killing the tracer detaches every tracee: held children run on and are reaped by the helper.
      proc.kill('SIGKILL');
      await exited;
    },
  };
}

/** Status code of the agent's /healthz. */
async function healthz(a: AgentHandle): Promise<number> {
  return (await a.http('/healthz')).status;
}

beforeAll(async () => {
  scratch = mkdtempSync(join(tmpdir(), 'pa-faults-dataplane-'));
  writeFileSync(join(scratch, 'hold.c'), HOLD_C);
  execFileSync('gcc', ['-O1', '-o', join(scratch, 'hold'), join(scratch, 'hold.c')], { stdio: 'pipe' });
  lab = await createLab({ pods: 3, policy: 'reject', tag: 'faults-dataplane.test' });
  [podA, podB, podC] = lab.pods as [LabPod, LabPod, LabPod];
  [srvA, hostile, srvC] = await Promise.all([
    lab.startServer(podA, { http: 0, hang: 0, grpc: 0 }),
    startHostileServer(podB.name, { endlessBody: 0, dripBody: 0, hugeHeaders: 0, resetMidBody: 0, garbageH2: 0, rstStream: 0, rstAfterHeaders: 0 }),
    lab.startServer(podC, { http: 0, hang: 0 }),
  ]);
  const a = srvA.ports;
  const h = hostile.ports;
  allPods = [
      withLiveness(podWithProbes('steady', podA.ips, { app: { httpGet: { path: '/healthz', port: a.http } } })),
      podWithProbes('slow', podA.ips, {
        slowloris: { httpGet: { path: '/slowloris', port: a.http } },
        loop: { httpGet: { path: '/loop', port: a.http } },
        hang: { httpGet: { path: '/', port: a.hang } },
      }),
      podWithProbes('hostile', podB.ips, {
        endless: { httpGet: { path: '/', port: h.endlessBody } },
        drip: { httpGet: { path: '/', port: h.dripBody } },
        huge: { httpGet: { path: '/', port: h.hugeHeaders } },
        garbage: { grpc: { port: h.garbageH2 } },
        rst: { grpc: { port: h.rstStream } },
        rstlate: { grpc: { port: h.rstAfterHeaders } },
      }),
      podWithProbes('doomed', podC.ips, { app: { tcpSocket: { port: srvC.ports.http } } }),
  ];
  kubelet = await FakeKubelet.start({ pods: allPods });
  agent = await startAgent({
    kubeletUrl: kubelet.httpUrl,
    pollInterval: '300ms',
    // The per-request child's faults: the tracer holds what the helper forks, and a pool worker is
    // forked once. The pool's own faults (hung, stuck, killed workers) are helper-pool.test.ts's.
    args: ['--feature-gates=NetnsHelperPool=false'],
    // Every test here injects a fault; each asserts the reason its probes end with.
    expectedLogs: [
      { level: 'warn', msg: 'probe errored; result kept', line: /"reason":"(helper-error|timeout|netns-unresolved)"/, why: 'hostile targets, helper faults, a deleted netns and EMFILE end probes as errors on purpose' },
      { level: 'warn', msg: 'netns helper died; restarting', why: 'the resident helper is killed on purpose' },
      { level: 'error', msg: 'netns helper stopped answering; killing it', why: 'the resident helper is stopped (stuck) on purpose' },
      { level: 'warn', msg: 'netns helper stderr', why: 'the helper says so when its children are killed or hung, or its agent runs out of fds, all on purpose' },
    ],
  });
  await agent.waitForStatuses((s) => s.length === 12 && s.every((x) => x.lastProbeTime > 0), 30_000);
});

afterAll(async () => {
  await agent?.stop('SIGKILL').catch(() => {});
  await kubelet?.stop();
  await hostile?.stop();
  await lab?.destroy();
  if (scratch) rmSync(scratch, { recursive: true, force: true });
});

describe('hostile targets', () => {
  it('each ends within its deadline with kubelet\'s result and a clear reason', async () => {
    const a = srvA.ports;
    const h = hostile.ports;
    const cases: [string, string, ProbeHandler, Partial<ProbeOutcome>, RegExp][] = [
      ['steady', 'accepts, never answers (HTTP)', httpGet(a.hang as number), { result: 'failure', reason: 'timeout' }, /awaiting headers\)$/],
      ['steady', 'accepts, never answers (TCP: the handshake is all kubelet checks)', { kind: 'tcp', port: a.hang as number }, { result: 'success' }, /^$/],
      ['steady', 'accepts, never answers (gRPC)', { kind: 'grpc', port: a.hang as number }, { result: 'failure', reason: 'timeout' }, /^timeout: failed to connect service ".*" within 1s: context deadline exceeded$/],
      ['steady', 'slowloris headers', httpGet(a.http as number, '/slowloris'), { result: 'failure', reason: 'timeout' }, /awaiting headers\)$/],
      ['steady', 'redirect loop', httpGet(a.http as number, '/loop'), { result: 'failure', reason: 'redirects' }, /^Get "\/loop": stopped after 10 redirects$/],
      ['hostile', 'endless body (kubelet reads 10 KiB and calls it a success)', httpGet(h.endlessBody as number), { result: 'success' }, /^e+… \(truncated\)$/],
      ['hostile', 'dripping body (kubelet: a body read error is a prober error, thrown away)', httpGet(h.dripBody as number), { result: 'error', reason: 'timeout' }, /while reading body\)$/],
      ['hostile', 'reset mid-body (a body read error too)', httpGet(h.resetMidBody as number), { result: 'error', reason: 'reset' }, /^read: connection reset by peer$/],
      // Over the agent's 64 KiB bound (Go's client allows 10 MiB): bounded memory wins, with Go's own words.
      ['hostile', '1 MiB header block', httpGet(h.hugeHeaders as number), { result: 'failure', reason: 'protocol' }, /: net\/http: HTTP\/1\.x transport connection broken: net\/http: server response headers exceeded 65536 bytes; aborted$/],
      ['hostile', 'garbage instead of HTTP/2', { kind: 'grpc', port: h.garbageH2 as number }, { result: 'failure', reason: 'protocol' }, /^error: failed to connect service at ".*": connection error: desc = "transport: /],
      ['hostile', 'RST_STREAM before any header', { kind: 'grpc', port: h.rstStream as number }, { result: 'failure', reason: 'grpc-status' },
        /^error: health rpc probe failed: rpc error: code = Internal desc = stream terminated by RST_STREAM with error code: INTERNAL_ERROR$/],
      ['hostile', 'RST_STREAM after the response headers', { kind: 'grpc', port: h.rstAfterHeaders as number }, { result: 'failure', reason: 'grpc-status' },
        /^error: health rpc probe failed: rpc error: code = Internal desc = stream terminated by RST_STREAM with error code: INTERNAL_ERROR$/],
    ];
    const results = await Promise.all(cases.map(([pod, , handler]) => probeVia(agent, pod, handler)));
    cases.forEach(([, name, , want, message], i) => {
      const { out, wall } = results[i] as { out: ProbeOutcome; wall: number };
      expect(out, name).toMatchObject(want);
      expect(out.message, name).toMatch(message);
      expect(out.durationSeconds, name).toBeLessThan(1 + MARGIN_S);
      expect(wall, name).toBeLessThan(10);
    });
  });

  it('the workers reach the same verdicts, and the agent stays healthy: /healthz, flat RSS and fds, pod connections closed', async () => {
    const want: [string, string, ProbeStatus['result'], string | undefined][] = [
      ['slow', 'slowloris', 'failure', 'timeout'], ['slow', 'loop', 'failure', 'redirects'], ['slow', 'hang', 'failure', 'timeout'],
      ['hostile', 'endless', 'success', undefined],
      // A body that stalls is a prober error: thrown away, so the decision keeps its initial value (no result yet).
      ['hostile', 'drip', 'unknown', 'timeout'], ['hostile', 'huge', 'failure', 'protocol'],
      ['hostile', 'garbage', 'failure', 'protocol'], ['hostile', 'rst', 'failure', 'grpc-status'], ['hostile', 'rstlate', 'failure', 'grpc-status'],
      ['steady', 'app', 'success', undefined],
    ];
    const matches = (s: ProbeStatus[]): boolean => want.every(([p, c, result, reason]) => {
      const st = statusOf(s, p, c);
      return st?.result === result && (reason === undefined || st.lastReason === reason);
    });
    await agent.waitForStatuses(matches, 10_000);
    const rss0 = rssMiB(agent.pid);
    const fds0 = fdCount(agent.pid);
    const accepted0 = (await hostile.stats()).accepted;
    // Several periods of every hostile probe, every second.
    await sleep(4000);
    const stats = await hostile.stats();
    const rss1 = rssMiB(agent.pid);
    const fds1 = fdCount(agent.pid);
    console.log(`agent RSS ${rss0.toFixed(1)} -> ${rss1.toFixed(1)} MiB, fds ${fds0} -> ${fds1}, hostile server`, stats);
    expect(matches((await agent.client.listStatus()).statuses)).toBe(true);
    expect(await healthz(agent)).toBe(200);
    expect(rss1).toBeLessThan(300);
    expect(rss1 - rss0).toBeLessThan(40);
    expect(fds1 - fds0).toBeLessThan(15);
    for (const kind of ['endlessBody', 'dripBody', 'hugeHeaders', 'garbageH2', 'rstStream', 'rstAfterHeaders']) {
      expect(stats.accepted[kind] ?? 0, kind).toBeGreaterThanOrEqual((accepted0[kind] ?? 0) + 2);
      // Only the probe of this very period (and one just ending) may still hold a connection.
      expect(stats.open[kind] ?? 0, kind).toBeLessThanOrEqual(2);
    }
  }, 30_000);
});

describe('netns helper faults', () => {
  it('a hung helper child ends the probe as a helper error within the deadline, never as a failure', async () => {
    const resident = await waitFor('the resident helper', () => helperPid(agent));
    const holder = await holdChildrenOf(resident);
    try {
      const { out, wall } = await probeVia(agent, 'steady', { kind: 'tcp', port: srvA.ports.http as number });
      expect(out).toMatchObject({ result: 'error', reason: 'helper-error' });
      // The socket route's wording, or the TCP probe done in the helper's child (op "tcp": the child has 500 ms to make its socket).
      expect(out.message).toMatch(/netns helper did not (hand over a socket within 1000 ms|make the probe's socket within 500 ms) \(not counted against the probe's timeout\)/);
      expect(out.durationSeconds).toBeLessThan(1 + MARGIN_S);
      expect(wall).toBeLessThan(10);
      expect(holder.held.length).toBeGreaterThan(0);
      // The workers see the same: our trouble is reported (reason) and thrown away, and a liveness probe
      // never fails (nor goes on hold, which is what makes kubelet restart a container) because of it.
      const live = (l: ProbeStatus[]): ProbeStatus | undefined => l.find((x) => x.podName === 'steady' && x.key.probeType === 'Liveness');
      const s = await agent.waitForStatuses((l) => live(l)?.lastReason === 'helper-error', 5000);
      expect(live(s)).toMatchObject({ result: 'success', onHold: false });
    } finally {
      await holder.release();
    }
    await agent.waitForStatuses((l) => allOf(l.filter((x) => x.podName === 'steady'), (x) => x.result === 'success'), 5000);
    expect(await healthz(agent)).toBe(200);
  });

  it('a killed helper child ends its probe at once with a helper error naming the signal', async () => {
    const resident = await waitFor('the resident helper', () => helperPid(agent));
    const holder = await holdChildrenOf(resident);
    try {
      const pending = probeVia(agent, 'steady', { kind: 'tcp', port: srvA.ports.http as number }, 5);
      let settled = false;
      void pending.finally(() => (settled = true));
      // Whatever the helper forks meanwhile (workers included) is killed, found through /proc.
      let killed = 0;
      while (!settled) {
        for (const child of childrenOf(resident)) {
          try {
            process.kill(child, 'SIGKILL');
            killed++;
          } catch {
            // reaped meanwhile
          }
        }
        await sleep(50);
      }
      const { out, wall } = await pending;
      expect(killed).toBeGreaterThan(0);
      expect(out).toMatchObject({ result: 'error', reason: 'helper-error' });
      expect(out.message).toMatch(/child killed by signal 9/);
      // The message shows the kill ended it; the bound only keeps it below the probe's own 5 s.
      expect(wall).toBeLessThan(4.5);
    } finally {
      await holder.release();
    }
    expect(await healthz(agent)).toBe(200);
  });

  it('a killed resident helper fails its in-flight requests with a reason and is restarted at once', async () => {
    const resident = await waitFor('the resident helper', () => helperPid(agent));
    // No probe workers meanwhile, so the held child is this test's request and not a timer probe's
    // (whose kill would let this request go to the restarted helper and rightly succeed).
    kubelet.setPods([makePod({ name: 'steady', namespace: NS, ips: podA.ips, probe: 'none' })]);
    await agent.waitForStatuses((l) => l.length === 0, 10_000);
    // One address, so one socket: with both families, Happy Eyeballs' second attempt can reach the
    // restarted helper and (rightly) succeed, which is not what this test looks at.
    const target = { kind: 'tcp', port: srvA.ports.http as number, host: podA.ipv4 } as const;
    try {
      // Resolved and cached first, so no netns address lookup is in flight in the helper either.
      expect((await probeVia(agent, 'steady', target)).out).toMatchObject({ result: 'success' });
      await waitFor('no helper child in flight', () => childrenOf(resident).length === 0 || undefined);
      const holder = await holdChildrenOf(resident);
      const pending = probeVia(agent, 'steady', target, 5);
      await waitFor('a held child', () => holder.held.length > 0);
      process.kill(resident, 'SIGKILL');
      const { out, wall } = await pending;
      await holder.release();
      expect(out).toMatchObject({ result: 'error', reason: 'helper-error' });
      expect(out.message).toMatch(/netns helper exited \(signal SIGKILL\) before answering/);
      expect(wall).toBeLessThan(4.5);
      const next = await waitFor('a new resident helper', () => { const p = helperPid(agent); return p !== resident && p; }, 3000);
      expect(next).not.toBe(resident);
      expect((await probeVia(agent, 'steady', { kind: 'tcp', port: srvA.ports.http as number })).out).toMatchObject({ result: 'success' });
      expect((await agent.http('/metrics')).body).toMatch(/^probe_agent_helper_restarts_total(\{[^}]*\})? 1$/m);
      expect(await healthz(agent)).toBe(200);
    } finally {
      kubelet.setPods(allPods);
      await agent.waitForStatuses((l) => l.length === 12 && l.every((x) => x.lastProbeTime > 0), 30_000);
    }
  });

  it('a stuck resident helper is replaced, and meanwhile probes end as helper errors within their deadline', async () => {
    const resident = await waitFor('the resident helper', () => helperPid(agent));
    process.kill(resident, 'SIGSTOP');
    try {
      const { out, wall } = await probeVia(agent, 'steady', { kind: 'tcp', port: srvA.ports.http as number });
      expect(out).toMatchObject({ result: 'error', reason: 'helper-error' });
      // Below the helper's 5 s request timeout: the probe's own deadline ended it.
      expect(wall).toBeLessThan(4.5);
      // Every caller gives up before the helper's 5 s request timeout; the agent must still notice
      // the silence (5 s after the probe's own 1 s), and on a loaded machine start the next one.
      const next = await waitFor('a replacement helper', () => { const p = helperPid(agent); return p !== resident && p; }, 20_000);
      expect(next).not.toBe(resident);
    } finally {
      try { process.kill(resident, 'SIGKILL'); } catch { /* replaced: gone already */ }
    }
    expect((await probeVia(agent, 'steady', { kind: 'tcp', port: srvA.ports.http as number })).out).toMatchObject({ result: 'success' });
    expect(await healthz(agent)).toBe(200);
  }, 40_000);

  it('a missing helper binary stops the daemon at start with a clear error and a non-zero exit', async () => {
    const err = await startAgent({ kubeletUrl: kubelet.httpUrl, args: ['--helper-path=/nonexistent/probe-agent-netns-helper'], expectedLogs: [{ level: 'error', msg: 'probe-agent failed to start', line: /nonexistent\/probe-agent-netns-helper/, why: 'the helper binary is missing on purpose' }] }).then(
      async (a) => { await a.stop('SIGKILL'); return undefined; },
      (e: Error) => e,
    );
    expect(err?.message).toMatch(/^agent exited \(1\) during start/);
    expect(err?.message).toContain('netns helper binary \\"/nonexistent/probe-agent-netns-helper\\" is not usable (ENOENT)');
    // --log-format=json holds to the end: no stack trace dumped on stderr.
    expect(err?.message).not.toContain('non-json');
  });
});

describe('pod gone', () => {
  it('netns deleted mid-probe: the in-flight probe ends at its deadline, the next ones with a netns reason', async () => {
    await agent.waitForStatuses((l) => statusOf(l, 'doomed', 'app')?.result === 'success');
    const inFlight = probeVia(agent, 'doomed', httpGet(srvC.ports.hang as number), 2);
    await sleep(300);
    execFileSync('ip', ['netns', 'del', podC.name]);
    const { out, wall } = await inFlight;
    // Its socket keeps the namespace alive: the target simply never answers.
    expect(out).toMatchObject({ result: 'failure', reason: 'timeout' });
    expect(wall).toBeLessThan(10);
    const next = await probeVia(agent, 'doomed', { kind: 'tcp', port: srvC.ports.http as number }).then(
      ({ out: o }) => `${o.result}/${o.reason}`,
      (e: unknown) => (e instanceof ApiError ? `rpc/${e.grpcCode}` : String(e)),
    );
    expect(['error/netns-gone', 'rpc/14']).toContain(next);
    const s = await agent.waitForStatuses((l) => ['netns-gone', 'netns-unresolved'].includes(statusOf(l, 'doomed', 'app')?.lastReason ?? ''));
    expect(statusOf(s, 'doomed', 'app')?.onHold).toBe(false);
    // The pod's processes die too: nothing is left of it.
    await srvC.stop();
    const before = statusOf(s, 'steady', 'app')?.lastProbeTime ?? 0;
    const after = await agent.waitForStatuses((l) => (statusOf(l, 'steady', 'app')?.lastProbeTime ?? 0) > before + 1000);
    expect(statusOf(after, 'steady', 'app')).toMatchObject({ result: 'success' });
    expect(statusOf(after, 'doomed', 'app')).toMatchObject({ onHold: false, lastReason: expect.stringMatching(/^netns-/) });
    expect(await healthz(agent)).toBe(200);
  }, 20_000);
});

describe('overload', () => {
  it('EMFILE: out of file descriptors, probes that need a passed fd end as errors (never failures), the agent lives on and recovers', async () => {
    const pid = String(agent.pid);
    const [soft, hard] = execFileSync('prlimit', ['--pid', pid, '--nofile', '--raw', '--noheadings', '-o', 'SOFT,HARD']).toString().trim().split(/\s+/);
    // A new fd takes the lowest free number below the limit: with the limit at or under the lowest
    // free number (Node's own fds fill the low numbers for good), every new fd, a passed socket or
    // an accepted connection, fails with EMFILE.
    const open = new Set(readdirSync(`/proc/${pid}/fd`).map(Number));
    let lowestFree = 0;
    while (open.has(lowestFree)) lowestFree++;
    execFileSync('prlimit', ['--pid', pid, `--nofile=${Math.min(lowestFree, 16)}:${hard}`]);
    try {
      // A probe whose connection must come over as an fd (the hung target's: the helper's child hands
      // it over at the timeout) ends as an error.
      const s = await agent.waitForStatuses((l) => statusOf(l, 'slow', 'hang')?.lastReason === 'helper-error', 8000);
      // Errors, thrown away: the decision stays where it was, nothing goes on hold.
      expect(statusOf(s, 'slow', 'hang')).toMatchObject({ result: 'failure', onHold: false });
      // An answer the helper's child read whole needs no fd: the steady pod stays a success.
      const steady = s.filter((x) => x.podName === 'steady');
      expect(steady).toHaveLength(2);
      for (const x of steady) expect(x, x.key.probeType).toMatchObject({ result: 'success', onHold: false });
      expect(agent.proc.exitCode).toBeNull();
    } finally {
      execFileSync('prlimit', ['--pid', pid, `--nofile=${soft}:${hard}`]);
    }
    await agent.waitForStatuses((l) => allOf(l.filter((x) => x.podName === 'steady'), (x) => x.result === 'success'), 15_000);
    expect(await healthz(agent)).toBe(200);
  }, 30_000);

  it('a full probe queue fails probes with queue-full, every pod still gets probed, nothing crashes', async () => {
    const port = srvA.ports.http as number;
    // Few pods, several probes each: every pod costs one (slow, slot-holding) netns resolution by address.
    const quick = Array.from({ length: 2 }, (_, i) => podWithProbes(`quick-${i}`, podA.ips, { a: { tcpSocket: { port } }, b: { tcpSocket: { port } }, c: { tcpSocket: { port } } }));
    const hog = (probe: Record<string, unknown>): Record<string, unknown> => podWithProbes('hog', podA.ips, { app: probe }, { periodSeconds: 2 });
    const small = await FakeKubelet.start({ pods: [hog({ tcpSocket: { port } }), ...quick] });
    const tiny = await startAgent({ kubeletUrl: small.httpUrl, pollInterval: '300ms', args: ['--max-concurrent-probes=1', '--max-queued-probes=1'], expectedLogs: [{ level: 'warn', msg: 'probe errored; result kept', line: /"reason":"queue-full"/, why: 'a queue of one overflows on purpose' }] });
    try {
      // Every pod probed once first: resolving a netns by address is slow on a node with many of them.
      await tiny.waitForStatuses((s) => s.length === 7 && s.every((x) => x.result === 'success'), 40_000);
      const before = await successes(tiny);
      // Now the hog holds the only slot for one second in every two: the others queue behind it, then overflow.
      small.setPods([hog({ httpGet: { path: '/hang', port } }), ...quick]);
      const seen = await tiny.waitForStatuses((s) => s.some((x) => x.lastReason === 'queue-full'), 10_000);
      expect(seen.find((x) => x.lastReason === 'queue-full')).toMatchObject({ onHold: false, lastMessage: expect.stringMatching(/^probe refused: node queue full for probes/) });
      const after = await waitFor('a new success for every quick pod', async () => {
        const now = await successes(tiny);
        return quick.every((_, i) => (now.get(`quick-${i}`) ?? 0) > (before.get(`quick-${i}`) ?? 0)) && now;
      }, 15_000);
      expect(after.size).toBeGreaterThanOrEqual(2);
      await tiny.waitForStatuses((s) => statusOf(s, 'hog', 'app')?.lastReason === 'timeout', 10_000);
      expect(await healthz(tiny)).toBe(200);
      expect(tiny.proc.exitCode).toBeNull();
    } finally {
      await tiny.stop('SIGKILL').catch(() => {});
      await small.stop();
    }
  }, 60_000);
});
