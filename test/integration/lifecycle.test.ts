/**
 * The daemon's lifecycle as a DaemonSet pod lives it (`probe-agent run`, a real process):
 * SIGTERM with a Probe call to a hung target in flight (longer, then shorter than the grace
 * period), a worker probe hanging, and a watcher open; SIGKILL, after which nothing of the old
 * instance lingers and a new instance rebuilds every probe from the kubelet and the CRI at its
 * first poll; and kubelet's restart grace, so that the new instance never reports a healthy,
 * long-running pod not ready (no flap across a restart).
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nsenter', 'containerd', 'ctr']);

import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ApiError, ProbeApiClient, type WatchMessage } from '../../agent/api/client.ts';
import type { ProbeHandler } from '../../agent/probe/types.ts';
import type { ProbeStatus } from '../../agent/scheduler/types.ts';
import { createContainerdLab, type ContainerdLab, type LabSandbox } from '../lab/containerd.ts';
import { startAgent, type AgentHandle, type AgentOptions } from '../support/agent-harness.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { descendants, logsSince, processInfo, sample, sleep, until } from '../soak/observe.ts';
import { podFor, SandboxServer } from '../soak/sandbox-server.ts';

const NS = 'lifecycle';
const HANG = 9999;
const POLL_MS = 500;
const HEALTHY = {
  readinessProbe: { httpGet: { path: '/healthz', port: 8080 }, periodSeconds: 1, failureThreshold: 2 },
  livenessProbe: { tcpSocket: { port: 8080 }, periodSeconds: 1, failureThreshold: 3 },
};
/** A readiness probe whose every run hangs for its full 10 s timeout. */
const STUCK = { readinessProbe: { httpGet: { path: '/', port: HANG }, periodSeconds: 1, timeoutSeconds: 10 } };
const hang: ProbeHandler = { kind: 'http', port: HANG, path: '/', scheme: 'HTTP', headers: [] };

let ctrd: ContainerdLab;
let kubelet: FakeKubelet;
let web: LabSandbox[] = [];
let stuck: LabSandbox;
const servers: SandboxServer[] = [];
const agents: AgentHandle[] = [];

function pods(): Record<string, unknown>[] {
  return [...web.map((sb) => podFor(sb, NS, HEALTHY)), podFor(stuck, NS, STUCK)];
}

async function run(opts: Partial<AgentOptions> = {}): Promise<AgentHandle> {
  const a = await startAgent({
    kubeletUrl: kubelet.httpUrl,
    resolvers: 'cri',
    pollInterval: `${POLL_MS}ms`,
    ...opts,
    args: [`--cri-endpoint=${ctrd.endpoint}`, `--netns-dir=${ctrd.netnsDir}`, ...(opts.args ?? [])],
  });
  agents.push(a);
  return a;
}

const healthyReady = (s: ProbeStatus[]): boolean =>
  web.every((sb) => s.some((x) => x.podName === sb.name && x.key.probeType === 'Readiness' && x.result === 'success' && x.ready));

/** Settles a promise into 'OK:<result>' or the gRPC status name. */
async function settle(p: Promise<{ result: string }>): Promise<string> {
  try {
    return `OK:${(await p).result}`;
  } catch (err) {
    return err instanceof ApiError ? String(err.code) : `thrown: ${String(err)}`;
  }
}

beforeAll(async () => {
  ctrd = await createContainerdLab();
  web = await Promise.all(['web-a', 'web-b', 'web-c'].map((name) => ctrd.runSandbox({ name, namespace: NS })));
  stuck = await ctrd.runSandbox({ name: 'stuck', namespace: NS });
  servers.push(...await Promise.all([
    ...web.map((sb) => SandboxServer.start(sb, { http: 8080 })),
    SandboxServer.start(stuck, { http: 8080, hang: HANG }),
  ]));
  kubelet = await FakeKubelet.start({ pods: pods() });
}, 60_000);

afterEach(async () => {
  await kubelet.setFault('none');
});

afterAll(async () => {
  await Promise.all(agents.map((a) => a.stop('SIGKILL').catch(() => {})));
  await kubelet?.stop();
  await Promise.all(servers.map((s) => s.stop()));
  await ctrd?.destroy();
});

describe('SIGTERM', () => {
  it('with a Probe call to a hung target outlasting the grace period: the call is cut at the grace, the agent exits 0 right after', async () => {
    const agent = await run({ args: ['--shutdown-grace-period=2s'] });
    agent.expectLogs({ level: 'warn', msg: 'grace period over, cancelling calls', why: 'a call to a hung target outlasts the grace period on purpose' });
    await agent.waitForStatuses(healthyReady);
    // A worker probe of the stuck pod is hanging too (its first run takes its whole 10 s timeout).
    await until(async () => (sample((await agent.http('/metrics')).body, 'probe_agent_probes_in_flight') ?? 0) >= 1, 5000, 'a worker probe in flight');
    const caller = new ProbeApiClient(agent.socket);
    const watcher = new ProbeApiClient(agent.socket);
    const watched: WatchMessage[] = [];
    let watchEnd: unknown;
    const watch = (async () => {
      for await (const m of watcher.watch()) watched.push(m);
    })().catch((err: unknown) => (watchEnd = err));
    try {
      const call = settle(caller.probe({ pod: { uid: stuck.uid }, handler: hang, timeoutSeconds: 30, deadlineMs: 60_000 }));
      await until(() => watched.length > 0, 5000, 'the watch snapshot');
      await sleep(300);
      const t0 = Date.now();
      const exit = agent.stop('SIGTERM', 10_000);
      const callEnd = await call;
      const callMs = Date.now() - t0;
      const code = await exit;
      const exitMs = Date.now() - t0;
      await watch;
      console.log(`SIGTERM, grace 2 s: Probe call ended (${callEnd}) after ${callMs} ms, exit ${code} after ${exitMs} ms`);
      expect(code).toBe(0);
      // Cut by the grace period, not by its own 30 s timeout; and the exit follows the drain, not the hard deadline (grace + 2 s, exit 1).
      expect(callEnd).not.toMatch(/^OK/);
      expect(callMs).toBeGreaterThanOrEqual(1800);
      expect(callMs).toBeLessThan(15_000);
      // Exit code 0 (checked above) is what shows the drain, not the hard deadline (exit 1), ended the process.
      expect(exitMs).toBeGreaterThanOrEqual(callMs);
      expect((watchEnd as ApiError).grpcCode).toBe(14);
      expect((watchEnd as ApiError).message).toMatch(/shutting down; resume from revision \d+/);
      expect(logsSince(agent.logs, 0, 'grace period over, cancelling calls')).toHaveLength(1);
      expect(logsSince(agent.logs, 0, 'probe-agent stopped')).toHaveLength(1);
      expect(logsSince(agent.logs, 0, 'shutdown grace period exceeded, exiting')).toHaveLength(0);
    } finally {
      caller.close();
      watcher.close();
    }
  }, 30_000);

  it('with a Probe call shorter than the grace period: the call completes with its own result, new calls are refused, exit 0 soon after', async () => {
    const agent = await run({ args: ['--shutdown-grace-period=8s'] });
    await agent.waitForStatuses(healthyReady);
    const caller = new ProbeApiClient(agent.socket);
    try {
      // The connection is set up (and routed past the socket's first-request peek) before the timed
      // call, so that call is surely in flight when SIGTERM comes 200 ms later; a connection still
      // being set up at SIGTERM is refused like any new call.
      await caller.version();
      const call = settle(caller.probe({ pod: { uid: stuck.uid }, handler: hang, timeoutSeconds: 1, deadlineMs: 30_000 }));
      await sleep(200);
      const t0 = Date.now();
      const exit = agent.stop('SIGTERM', 15_000);
      await sleep(100);
      const late = await settle(caller.probe({ pod: { uid: web[0]!.uid }, handler: { kind: 'tcp', port: 8080 }, timeoutSeconds: 1 }));
      const callEnd = await call;
      const code = await exit;
      const exitMs = Date.now() - t0;
      console.log(`SIGTERM, grace 8 s: in-flight call -> ${callEnd}, call during drain -> ${late}, exit ${code} after ${exitMs} ms`);
      // Drained: the probe ran to its own 1 s timeout and reported a failure, as kubelet would.
      expect(callEnd).toBe('OK:failure');
      expect(late).not.toMatch(/^OK/);
      expect(code).toBe(0);
      // The worker probe hanging on the stuck pod (10 s timeout) is aborted, not waited for.
      expect(exitMs).toBeLessThan(7500);
      expect(logsSince(agent.logs, 0, 'grace period over, cancelling calls')).toHaveLength(0);
    } finally {
      caller.close();
    }
  }, 30_000);
});

describe('SIGKILL and restart', () => {
  it('leaves nothing behind; a new instance rebuilds every probe at its first poll and never reports a healthy pod not ready', async () => {
    const first = await run();
    const before = await first.waitForStatuses(healthyReady);
    const oldTree = descendants(first.pid);
    expect(oldTree.length).toBeGreaterThanOrEqual(1);
    expect(await first.stop('SIGKILL')).toBe('SIGKILL');
    // The resident helper exits when its channel to the agent closes: no orphan, no zombie.
    await until(() => oldTree.every((p) => processInfo(p.pid) === undefined), 3000, 'the old helper processes to exit');

    // Hold the new instance's first poll back a moment, so that its whole history can be watched.
    await kubelet.setFault('slow', { delayMs: 1500 });
    const started = Date.now();
    const second = await run();
    const c = new ProbeApiClient(second.socket);
    const ac = new AbortController();
    const seen: { at: number; m: WatchMessage }[] = [];
    const watch = (async () => {
      for await (const m of c.watch({ signal: ac.signal })) seen.push({ at: Date.now(), m });
    })();
    try {
      await until(() => seen.length > 0, 3000, 'the first snapshot');
      const first0 = seen[0]!.m;
      expect(first0.kind === 'snapshot' && first0.statuses.length).toBe(0);
      await kubelet.setFault('none');
      // The first poll is answered 1.5 s after it was asked; everything follows from that answer.
      const firstPoll = await until(() => kubelet.requests.find((r) => r.time >= started), 3000, 'the first poll');
      const pollAt = firstPoll.time + 1500;
      // Waited for longer than the bound below, so that a slow start fails the bound, with its number.
      const statuses = await second.waitForStatuses(healthyReady, 30_000);
      const readyMs = Date.now() - pollAt;
      ac.abort();
      await watch;

      const events = seen.filter((s) => s.m.kind === 'event').map((s) => ({ at: s.at, e: (s.m as Extract<WatchMessage, { kind: 'event' }>).event }));
      const added = events.filter((x) => x.e.type === 'added');
      // Every worker of the old instance is back, all added at the first poll (one batch), nothing else.
      const key = (s: ProbeStatus): string => `${s.podName}/${s.key.containerName}/${s.key.probeType}`;
      expect(new Set(added.map((x) => key(x.e.status)))).toEqual(new Set(before.map(key)));
      // One batch: one sync adds every worker at once, so no other event falls between two of its 'added' events.
      const addedAt = events.flatMap((x, i) => (x.e.type === 'added' ? [i] : []));
      expect(addedAt.length).toBeGreaterThan(0);
      expect((addedAt.at(-1) ?? 0) - (addedAt[0] ?? 0) + 1).toBe(addedAt.length);
      expect(statuses.map(key).sort()).toEqual(before.map(key).sort());
      console.log(`restart: ${added.length} workers added at the first poll, healthy pods probed and ready ${readyMs} ms after it`);
      // First probes run within one period (1 s) of the first poll, plus the start jitter of one period.
      expect(readyMs).toBeLessThan(15_000);

      // kubelet's restart grace: containers that started long before the agent keep ready=true until a probe says otherwise.
      const healthyEvents = events.filter((x) => web.some((sb) => sb.name === x.e.status.podName));
      expect(healthyEvents.length).toBeGreaterThan(0);
      const notReady = healthyEvents.filter((x) => !x.e.status.ready || !x.e.status.started || ['failure', 'error'].includes(x.e.status.result));
      expect(notReady.map((x) => [x.e.type, key(x.e.status), x.e.status.result, x.e.status.ready])).toEqual([]);
    } finally {
      ac.abort();
      c.close();
    }
    expect(await second.stop('SIGTERM')).toBe(0);
  }, 75_000);
});
