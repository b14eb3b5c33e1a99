/**
 * Gates mode's runtime watch (agent/gates/runtime-watch.ts) against a REAL containerd: by default
 * the machine's (Debian 12: 1.6, which answers GetContainerEvents with UNIMPLEMENTED), with
 * CONTAINERD_17_BIN=/path/to/containerd a containerd 1.7 or later (its event stream; `make
 * e2e-containerd-events`), with RUNTIME=crio CRIO_BIN=/path/to/crio a CRI-O (test/lab/crio.ts, pod
 * events on: its stream). The source the agent must choose follows from the runtime's version,
 * and the metric must say it. Either way:
 * - a new pod's container is probed without waiting for the agent's next kubelet poll (5 s, as
 *   deployed); the latency from the container's start to its first probe and to the condition
 *   write is logged, not asserted;
 * - a container the runtime kills and restarts while kubelet's list still shows the old one clears
 *   the condition. With the event stream that write reaches the API server before a concurrent
 *   reader of the runtime (as kubelet's relist is) sees the new container running;
 * - with the stream, a runtime restart ends it; the agent subscribes again and catches up.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'nsenter', 'containerd', 'ctr']);

import { execFileSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { GATES_CONDITION_TYPE } from '../../agent/pods/pod-model.ts';
import { rewritePodGates } from '../../agent/rewrite/gates-rewrite.ts';
import { createContainerdLab, type ContainerdLab, type LabContainer, type LabSandbox } from '../lab/containerd.ts';
import { createCrioLab } from '../lab/crio.ts';
import { startRecordingServer, type RecordingServer } from '../lab/recording-server.ts';
import { startAgent, type AgentHandle } from '../support/agent-harness.ts';
import { startApiServerStandIn, type ApiServerStandIn } from '../support/api-server-standin.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { makePod } from '../support/pod-factory.ts';

type Obj = Record<string, any>;

const CRIO = process.env['RUNTIME'] === 'crio';
const BIN = CRIO ? process.env['CRIO_BIN'] : process.env['CONTAINERD_17_BIN'] || undefined;
const NS = 'e2e-gates-events';
const READY_PORT = 8080;
/** What kubelet takes to list a started container as running: its relist (1 s) and its status write. */
const KUBELET_LAG_MS = 1000;
const PERIOD_S = 3;

/** "1.7.24~ds1" -> [1, 7]. */
function minor(version: string): [number, number] {
  const m = /^v?(\d+)\.(\d+)/.exec(version);
  if (!m) throw new Error(`not a containerd version: ${JSON.stringify(version)}`);
  return [Number(m[1]), Number(m[2])];
}
const atLeast17 = (v: string): boolean => { const [a, b] = minor(v); return a > 1 || (a === 1 && b >= 7); };

let ctrd: ContainerdLab;
let sb: LabSandbox;
let api: ApiServerStandIn;
let kubelet: FakeKubelet;
let agent: AgentHandle;
let srv: RecordingServer;
let pod: Obj;
let expected: 'events' | 'list';
let runtimeVersion = '';
let agentStarted = 0;

/** The pod as kubelet's /pods shows it: container `c` running since `startedAt`, or (no `c`) waiting to be created. */
function kubeletView(c: LabContainer | undefined, restartCount: number, startedAt = Date.now()): Obj {
  const listed = makePod({ uid: sb.uid, name: sb.name, namespace: NS, ips: sb.ips, ...(c ? { containerID: `${CRIO ? 'cri-o' : 'containerd'}://${c.id}` } : {}), restartCount, probe: 'none' });
  const status = structuredClone(listed.status) as Obj;
  if (c) status.containerStatuses[0].state.running.startedAt = new Date(Math.floor(startedAt / 1000) * 1000).toISOString();
  else {
    status.phase = 'Pending';
    status.containerStatuses = (status.containerStatuses as Obj[]).map((s) => ({ name: s.name, image: s.image, imageID: '', ready: false, started: false, restartCount: 0, state: { waiting: { reason: 'ContainerCreating' } } }));
    status.conditions = [];
  }
  return { ...structuredClone(pod), status };
}

/** The condition patches the agent sent: [status, time received]. */
function patches(): Array<[string, number]> {
  return api.requests.filter((r) => r.method === 'PATCH' && r.url.endsWith('/status')).map((r) => {
    const c = ((r.body as Obj).status.conditions as Obj[]).find((x) => x.type === GATES_CONDITION_TYPE)!;
    return [c.status as string, r.time];
  });
}

async function until<T>(what: string, get: () => T | undefined | Promise<T | undefined>, timeoutMs = 30_000): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await get();
    if (v !== undefined && v !== false) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}; patches ${JSON.stringify(patches().map((p) => p[0]))}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

async function metric(re: RegExp): Promise<number | undefined> {
  const m = re.exec((await agent.http('/metrics')).body);
  return m ? Number(m[1]) : undefined;
}

beforeAll(async () => {
  if (BIN && !CRIO) {
    // Set but broken is an error, never a silent fallback to the machine's containerd.
    let out: string;
    try {
      out = execFileSync(BIN, ['--version'], { encoding: 'utf8', timeout: 10_000 });
    } catch (err) {
      throw new Error(`CONTAINERD_17_BIN=${BIN} does not run: ${(err as Error).message}`);
    }
    const v = /containerd \S+ (\S+)/.exec(out)?.[1] ?? '';
    if (!v || !atLeast17(v)) throw new Error(`CONTAINERD_17_BIN=${BIN} is containerd ${v || `"${out.trim()}"`}; the event stream needs 1.7 or later`);
  }
  if (CRIO && !BIN) throw new Error('RUNTIME=crio needs CRIO_BIN=/path/to/crio');
  ctrd = CRIO ? await createCrioLab({ binary: BIN! }) : await createContainerdLab(BIN ? { binary: BIN } : {});
  runtimeVersion = (await ctrd.client.version()).runtimeVersion;
  if (BIN && !CRIO) expect(atLeast17(runtimeVersion), `the lab runs containerd ${runtimeVersion}, not ${BIN}`).toBe(true);
  // The lab's CRI-O has pod events on.
  expected = CRIO || atLeast17(runtimeVersion) ? 'events' : 'list';
  sb = await ctrd.runSandbox({ name: 'web', namespace: NS });
  [srv, api] = await Promise.all([startRecordingServer(sb.netnsPath, { http: READY_PORT }), startApiServerStandIn()]);
  const written = makePod({ uid: sb.uid, name: sb.name, namespace: NS, ips: sb.ips, probe: 'none' });
  delete written.status;
  (written.spec as Obj).containers[0].readinessProbe = { httpGet: { path: '/ready', port: READY_PORT }, periodSeconds: PERIOD_S, failureThreshold: 1 };
  pod = rewritePodGates(written).pod as Obj;
  api.pods.push(structuredClone(pod));
  kubelet = await FakeKubelet.start({ pods: [] });
  agentStarted = Date.now();
  agent = await startAgent({
    kubeletUrl: kubelet.httpUrl,
    resolvers: 'cri',
    // As deployed: new pods are not found by this poll's luck.
    pollInterval: '5s',
    args: [`--cri-endpoint=${ctrd.endpoint}`, `--netns-dir=${ctrd.netnsDir}`, '--gates', `--api-server=${api.url}`, '--node-name=node-a'],
  });
  await until('the runtime watch source', () => metric(new RegExp(`probe_agent_gates_runtime_watch_source\\{source="${expected}"\\} (1)`)));
}, 90_000);

afterAll(async () => {
  await agent?.stop('SIGKILL').catch(() => {});
  await kubelet?.stop();
  await Promise.all([srv?.stop(), api?.close()]);
  await ctrd?.destroy();
});

describe(`gates mode's runtime watch on ${CRIO ? 'CRI-O' : 'containerd'}${BIN ? ` ${BIN}` : ''}`, () => {
  it('uses the event stream where the runtime has it, else the list, and says which', async () => {
    expect(await metric(/probe_agent_gates_runtime_watch_source\{source="events"\} (\d+)/)).toBe(expected === 'events' ? 1 : 0);
    expect(await metric(/probe_agent_gates_runtime_watch_source\{source="list"\} (\d+)/)).toBe(expected === 'list' ? 1 : 0);
    const fallback = agent.logs.filter((l) => l.msg === 'the runtime has no container event stream; its containers are listed every interval instead');
    if (expected === 'list') {
      expect(fallback).toHaveLength(1);
      expect(fallback[0]!.level).toBe('info');
      expect(String(fallback[0]!['reason'])).toMatch(/GetContainerEvents/);
    } else {
      expect(fallback).toHaveLength(0);
    }
    console.log(`${CRIO ? 'CRI-O' : 'containerd'} ${runtimeVersion}: runtime watch source ${expected}`);
  });

  it('probes a new pod\'s container without waiting for the next kubelet poll', async () => {
    // The pod is bound and kubelet lists it before its container starts, after the agent's last poll.
    // After the agent's first period: its workers then start without kubelet's start-up jitter.
    await until('the agent up for a probe period', () => Date.now() - agentStarted > PERIOD_S * 1000 || undefined, 20_000);
    const seen = kubelet.requests.length;
    await until('the next kubelet poll', () => kubelet.requests.length > seen || undefined, 10_000);
    kubelet.setPods([kubeletView(undefined, 0)]);
    const c1 = await ctrd.runContainer(sb, { name: 'app' });
    const started = Date.now();
    setTimeout(() => kubelet.setPods([kubeletView(c1, 0, started)]), KUBELET_LAG_MS);
    const hit = await until('the first probe', () => srv.hits.find((h) => h.url === '/ready'));
    const [, trueAt] = await until('True', () => patches().find(([s]) => s === 'True'));
    expect(patches().map(([s]) => s)).toEqual(['True']);
    const polls = kubelet.requests.filter((r) => r.url.startsWith('/pods') && r.time > started - 5000).map((r) => r.time - started);
    console.log(`new container (kubelet lists it running ${KUBELET_LAG_MS} ms after its start; agent polls kubelet every 5 s; source ${expected}): start -> first probe ${hit.time - started} ms, start -> condition True received ${trueAt - started} ms; kubelet polled at ${polls.join(', ')} ms`);
    current = c1;
  });

  it('a container the runtime kills and restarts clears the condition while kubelet still lists the old one', async () => {
    const before = patches().length;
    // What kubelet's relist sees: the sandbox's containers, read again and again.
    let newRunningAt: number | undefined;
    let reading = true;
    const reader = (async () => {
      while (reading) {
        const cs = await ctrd.client.listContainers({ podSandboxId: sb.id }).catch(() => []);
        if (newRunningAt === undefined && cs.some((c) => c.id !== current.id && c.state === 'CONTAINER_RUNNING')) newRunningAt = Date.now();
        await new Promise((r) => setTimeout(r, 5));
      }
    })();
    const killedAt = Date.now();
    await ctrd.client.stopContainer(current.id, 0);
    // Restarted at once, as kubelet does at the earliest (its event-driven PLEG).
    const c2 = await ctrd.runContainer(sb, { name: 'app', attempt: 1 });
    const [, falseAt] = await until('False', () => patches().slice(before).find(([s]) => s === 'False'));
    await until('the reader saw the new container running', () => newRunningAt);
    reading = false;
    await reader;
    console.log(`restart (source ${expected}): kill -> False received ${falseAt - killedAt} ms; the new container reported running ${newRunningAt! - killedAt} ms after the kill; False ${newRunningAt! - falseAt} ms before it`);
    // Kubelet's list never showed the kill: the runtime told.
    if (expected === 'events') expect(falseAt).toBeLessThan(newRunningAt!);
    kubelet.setPods([kubeletView(c2, 1)]);
    await until('True for the new container', () => patches().slice(before).map(([s]) => s).join() === 'False,True' || undefined);
    current = c2;
    if (expected === 'events') {
      expect(await metric(/probe_agent_gates_runtime_events_total\{type="started"\} (\d+)/)).toBeGreaterThanOrEqual(2);
      expect(await metric(/probe_agent_gates_runtime_events_total\{type="stopped"\} (\d+)/)).toBeGreaterThanOrEqual(1);
    }
  });

  it('after a runtime restart the watch comes back (the stream subscribed again and caught up)', async () => {
    agent.expectLogs({ level: 'warn', msg: /^runtime container list not read/, why: 'the runtime is stopped on purpose' });
    await ctrd.stopContainerd();
    await new Promise((r) => setTimeout(r, 1500));
    await ctrd.startContainerd();
    const before = patches().length;
    if (expected === 'events') {
      await until('the stream subscribed again', () => agent.logs.some((l) => l.msg === 'runtime container event stream ended; subscribing again') || undefined);
    }
    // Give the watch its resubscription, then kill the container: still seen before kubelet's list.
    await until('the runtime list read again', async () => ((await ctrd.client.listContainers({ id: current.id })).length > 0) || undefined);
    await new Promise((r) => setTimeout(r, 3000));
    await ctrd.client.stopContainer(current.id, 0);
    await until('False after the restart', () => patches().slice(before).find(([s]) => s === 'False'));
    expect(await metric(new RegExp(`probe_agent_gates_runtime_watch_source\\{source="${expected}"\\} (\\d+)`))).toBe(1);
  });
});

let current: LabContainer;
