/**
 * Gates mode end to end: the real agent (`probe-agent run --gates`) against a REAL containerd (the
 * containerd lab) whose sandbox netns runs real servers: a readiness server, a liveness server
 * (both test/lab/pod-server.ts, switched healthy/unhealthy from inside the netns) and a recording
 * server answering the preStop hook. The test kubelet lists the pod as the gates rewrite left it;
 * the API server is the stand-in (test/support/api-server-standin.ts: a real kube-apiserver cannot
 * run in CI), which records every write; the test kubelet shows the condition the stand-in holds,
 * re-listed after each write as kubelet's pod watch does. Asserted: a readiness transition is exactly one
 * pods/status patch of our condition (True on success, False on failure, none while nothing
 * changes); a new container ID clears the condition before its first probe; a liveness failure at
 * its threshold runs the HTTP preStop hook in the pod netns once (the container still running while
 * it is answered) and then really stops the container in containerd (EXITED), once; a False
 * someone else wrote (the lease controller after an expiry) is written True again; a pod with
 * terminationGracePeriodSeconds 400000000000 whose liveness fails is stopped with the grace clamped
 * (it used to make the agent exit), and the agent goes on writing its neighbour's condition.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'nsenter', 'containerd', 'ctr']);

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { CriContainerState } from '../../agent/netns/cri-client.ts';
import { GATES_CONDITION_TYPE } from '../../agent/pods/pod-model.ts';
import { rewritePodGates } from '../../agent/rewrite/gates-rewrite.ts';
import { BUSYBOX_IMAGE_REF, importBusyboxImage } from '../lab/busybox-image.ts';
import { createContainerdLab, type ContainerdLab, type LabContainer, type LabSandbox } from '../lab/containerd.ts';
import { startRecordingServer, type RecordingServer } from '../lab/recording-server.ts';
import { PodServerProcess } from '../lab/server.ts';
import { startAgent, type AgentHandle } from '../support/agent-harness.ts';
import { startApiServerStandIn, type ApiServerStandIn } from '../support/api-server-standin.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { makePod } from '../support/pod-factory.ts';

type Obj = Record<string, any>;

const NS = 'e2e-gates';
const READY_PORT = 8080;
const LIVE_PORT = 8081;
const HOOK_PORT = 9090;
const LIVENESS_GRACE = 10;
/** The preStop hook takes this long to answer: the container must still run meanwhile. */
const HOOK_MS = 4000;
const HOOK_PATH = `/slow?ms=${HOOK_MS}`;

let ctrd: ContainerdLab;
let sb: LabSandbox;
let api: ApiServerStandIn;
let kubelet: FakeKubelet;
let agent: AgentHandle;
let readySrv: PodServerProcess;
let liveSrv: PodServerProcess;
let hook: RecordingServer;
/** The exec-hook case's own pod servers. */
const extra: Array<{ stop(): Promise<unknown> }> = [];
/** The app container kubelet lists as running. */
let current: LabContainer;
/** The pod as the gates rewrite made it (the API object). */
let pod: Obj;

/** `apiPod` as kubelet's /pods shows it: `status`, with our condition as the API server holds it now. */
function listedAs(apiPod: Obj, status: Obj): Obj {
  const stored = api.pods.find((p) => p.metadata.uid === apiPod.metadata.uid)?.status?.conditions?.filter((c: Obj) => c.type === GATES_CONDITION_TYPE) ?? [];
  return { ...structuredClone(apiPod), status: { ...structuredClone(status), conditions: [...(status.conditions ?? []), ...structuredClone(stored)] } };
}

/** The pod as kubelet's /pods shows it, running container `c`. */
function kubeletView(c: LabContainer, restartCount: number): Obj {
  const listed = makePod({ uid: sb.uid, name: sb.name, namespace: NS, ips: sb.ips, containerID: `containerd://${c.id}`, restartCount, probe: 'none' });
  return listedAs(pod, listed.status as Obj);
}

/** What the test kubelet lists, each re-made after every status write (kubelet's pod watch, in small). */
let views: Array<() => Obj> = [];
function show(...v: Array<() => Obj>): void {
  views = v;
  kubelet.setPods(views.map((f) => f()));
}

/** The pods/status patches of one pod, in order. */
const patchesOf = (name: string): string[] => api.requests.filter((r) => r.method === 'PATCH' && r.url.endsWith(`/pods/${name}/status`)).map((r) => (r.body as Obj).status.conditions[0].status as string);

/** The pods/status patches the agent sent, in order: the status of our condition in each. */
function patches(): string[] {
  return api.requests.filter((r) => r.method === 'PATCH' && r.url.endsWith('/status')).map((r) => {
    const conditions = (r.body as Obj).status.conditions as Obj[];
    expect(conditions.map((c) => c.type)).toEqual([GATES_CONDITION_TYPE]);
    return conditions[0]!.status as string;
  });
}

async function until(what: string, pred: () => boolean | Promise<boolean>, timeoutMs = 20_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!(await pred())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}; patches ${JSON.stringify(patches())}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

async function containerState(id: string): Promise<CriContainerState | undefined> {
  return (await ctrd.client.listContainers({ id }))[0]?.state;
}

async function podServer(port: number, netnsPath = sb.netnsPath): Promise<PodServerProcess> {
  const s = new PodServerProcess(netnsPath, JSON.stringify({ http: port }));
  await s.ready();
  return s;
}

beforeAll(async () => {
  ctrd = await createContainerdLab();
  sb = await ctrd.runSandbox({ name: 'web', namespace: NS });
  [readySrv, liveSrv, hook, api] = await Promise.all([
    podServer(READY_PORT), podServer(LIVE_PORT), startRecordingServer(sb.netnsPath, { http: HOOK_PORT }), startApiServerStandIn(),
  ]);
  const written = makePod({ uid: sb.uid, name: sb.name, namespace: NS, ips: sb.ips, probe: 'none' });
  delete written.status;
  const app = (written.spec as Obj).containers[0] as Obj;
  app.readinessProbe = { httpGet: { path: '/healthz', port: READY_PORT }, periodSeconds: 1, failureThreshold: 1 };
  app.livenessProbe = { httpGet: { path: '/healthz', port: LIVE_PORT }, periodSeconds: 1, failureThreshold: 2, terminationGracePeriodSeconds: LIVENESS_GRACE };
  app.lifecycle = { preStop: { httpGet: { path: HOOK_PATH, port: HOOK_PORT } } };
  pod = rewritePodGates(written).pod as Obj;
  expect(pod.spec.readinessGates).toEqual([{ conditionType: GATES_CONDITION_TYPE }]);
  expect(pod.spec.containers[0].readinessProbe).toBeUndefined();
  api.pods.push(structuredClone(pod));
  kubelet = await FakeKubelet.start({ pods: [] });
  api.onPodStatus = () => kubelet.setPods(views.map((f) => f()));
  agent = await startAgent({
    kubeletUrl: kubelet.httpUrl,
    resolvers: 'cri',
    args: [`--cri-endpoint=${ctrd.endpoint}`, `--netns-dir=${ctrd.netnsDir}`, '--gates', `--api-server=${api.url}`, '--node-name=node-a'],
  });
}, 60_000);

afterAll(async () => {
  await agent?.stop('SIGKILL').catch(() => {});
  await kubelet?.stop();
  await Promise.all([readySrv?.stop(), liveSrv?.stop(), hook?.stop(), api?.close(), ...extra.map((e) => e.stop())]);
  await ctrd?.destroy();
});

describe('probe-agent run --gates against containerd and the API stand-in', () => {
  it('writes the condition on each readiness transition, and only then; a new container ID clears it', async () => {
    const c1 = await ctrd.runContainer(sb, { name: 'app' });
    show(() => kubeletView(c1, 0));
    await until('True', () => patches().length === 1);
    expect(patches()).toEqual(['True']);
    // Several periods of the same answer: nothing written.
    await sleep(4000);
    expect(patches()).toEqual(['True']);

    await readySrv.control('/control/health?ok=0');
    await until('False', () => patches().length === 2);
    expect(patches()).toEqual(['True', 'False']);
    const failed = api.requests.filter((r) => r.url.endsWith('/status')).at(-1)!.body as Obj;
    expect(failed.metadata).toEqual({ uid: sb.uid });
    expect(failed.status.conditions[0]).toMatchObject({ reason: 'ReadinessProbeFailed' });
    await sleep(3000);
    expect(patches()).toEqual(['True', 'False']);
    await readySrv.control('/control/health?ok=1');
    await until('True again', () => patches().length === 3);

    // kubelet restarted the container: the pod list shows a new ID. False before the new container
    // was probed (it has no decision yet), then True once it passes.
    await ctrd.client.stopContainer(c1.id, 0);
    const c2 = await ctrd.runContainer(sb, { name: 'app', attempt: 1 });
    show(() => kubeletView(c2, 1));
    await until('False, then True, for the new container', () => patches().length === 5);
    expect(patches()).toEqual(['True', 'False', 'True', 'False', 'True']);
    const stored = (api.pods[0]!.status.conditions as Obj[]).filter((c) => c.type === GATES_CONDITION_TYPE);
    expect(stored).toMatchObject([{ status: 'True', reason: 'ProbesSucceeded' }]);
    // The agent never writes Ready, and nothing was stopped.
    expect(api.pods[0]!.status.conditions.some((c: Obj) => c.type === 'Ready')).toBe(false);
    expect(hook.hits).toEqual([]);
    expect(await containerState(c2.id)).toBe('CONTAINER_RUNNING');
    current = c2;
  });

  it('a False someone else wrote (the lease controller, after an expiry) is written True again within a period, once', async () => {
    const before = patches().length;
    const ours = api.pods[0]!.status.conditions.find((c: Obj) => c.type === GATES_CONDITION_TYPE);
    Object.assign(ours, { status: 'False', reason: 'NodeLeaseExpired', message: "the probe-agent of this pod's node stopped renewing its Lease", lastTransitionTime: new Date().toISOString() });
    show(...views);
    await until('True written again', () => patches().length === before + 1);
    expect(patches().slice(before)).toEqual(['True']);
    expect(api.pods[0]!.status.conditions.find((c: Obj) => c.type === GATES_CONDITION_TYPE)).toMatchObject({ status: 'True', reason: 'ProbesSucceeded' });
    // Several periods more: right in kubelet's view, nothing written.
    await sleep(3000);
    expect(patches()).toHaveLength(before + 1);
  });

  it('a liveness failure at its threshold runs the preStop hook, then stops the container in containerd, once', async () => {
    const running = api.pods[0]!.status.conditions.find((c: Obj) => c.type === GATES_CONDITION_TYPE);
    expect(running.status).toBe('True');
    const before = patches().length;
    const id = current.id;
    expect(await containerState(id)).toBe('CONTAINER_RUNNING');

    await liveSrv.control('/control/health?ok=0');
    // The hook first: while it is being answered the container still runs.
    const hits = await hook.waitFor(1, 30_000);
    expect(await containerState(id)).toBe('CONTAINER_RUNNING');
    expect(hits.map((h) => [h.method, h.port, h.url])).toEqual([['GET', HOOK_PORT, HOOK_PATH]]);
    await until('the container EXITED', async () => (await containerState(id)) === 'CONTAINER_EXITED', 30_000);
    // Not ready before anything was stopped: one False, and kubelet's two events.
    expect(patches().slice(before)).toEqual(['False']);
    expect(api.events.map((e) => [e.reason, e.involvedObject.uid, e.involvedObject.fieldPath])).toEqual([
      ['Unhealthy', sb.uid, 'spec.containers{app}'],
      ['Killing', sb.uid, 'spec.containers{app}'],
    ]);
    expect(api.events[0]!.message).toMatch(/^Liveness probe failed: HTTP probe failed with statuscode: 503/);
    expect(api.events[1]!.message).toBe('Container app failed liveness probe, will be restarted');

    // The liveness server stays down and kubelet has not noticed yet (still lists it running):
    // the probe holds until a new container ID, so no second hook, no second stop.
    await sleep(4000);
    expect(hook.hits).toHaveLength(1);
    expect(api.events).toHaveLength(2);
    expect(patches().slice(before)).toEqual(['False']);
    const metrics = (await agent.http('/metrics')).body;
    expect(metrics).toMatch(/probe_agent_gates_operations_total\{op="stop",result="ok"\} 1\b/);
  });

  it('an exec preStop runs in the container through the runtime, its output bounded, then the container is stopped', async () => {
    importBusyboxImage(ctrd.socket);
    const sb2 = await ctrd.runSandbox({ name: 'worker', namespace: NS });
    const [live2, hook2] = await Promise.all([podServer(LIVE_PORT, sb2.netnsPath), startRecordingServer(sb2.netnsPath, { http: HOOK_PORT })]);
    extra.push(live2, hook2);
    const written = makePod({ uid: sb2.uid, name: sb2.name, namespace: NS, ips: sb2.ips, probe: 'none' });
    delete written.status;
    const app = (written.spec as Obj).containers[0] as Obj;
    app.livenessProbe = { httpGet: { path: '/healthz', port: LIVE_PORT }, periodSeconds: 1, failureThreshold: 2 };
    // busybox's wget from inside the container (it shares the pod netns): the recording server sees
    // the hook. Then it prints its own 2 MB binary, as a hostile hook would flood the agent: the reply
    // is refused past the agent's bound, and the hook is reported failed.
    app.lifecycle = { preStop: { exec: { command: ['/bin/sh', '-c', `wget -q -O /dev/null http://127.0.0.1:${HOOK_PORT}/exec-hook; cat /bin/busybox`] } } };
    const pod2 = rewritePodGates(written).pod as Obj;
    expect(pod2.spec.containers[0].lifecycle.preStop.exec.command[0]).toBe('/bin/sh');
    api.pods.push(structuredClone(pod2));
    const c = await ctrd.runContainer(sb2, { name: 'app', image: BUSYBOX_IMAGE_REF, command: ['/bin/sleep', '3600'] });
    const listed = makePod({ uid: sb2.uid, name: sb2.name, namespace: NS, ips: sb2.ips, containerID: `containerd://${c.id}`, restartCount: 0, probe: 'none' });
    show(() => listedAs(pod2, listed.status as Obj));
    // Healthy first (a few periods), then failing: the hook, run while the container still runs.
    await sleep(3000);
    expect(hook2.hits).toEqual([]);
    agent.expectLogs({ level: 'warn', msg: 'preStop hook could not run', line: /larger than max/, why: 'the hook prints more than the agent takes back, on purpose' });
    await live2.control('/control/health?ok=0');
    const hits = await hook2.waitFor(1, 30_000);
    expect(hits.map((h) => [h.method, h.url])).toEqual([['GET', '/exec-hook']]);
    await until('the worker container EXITED', async () => (await containerState(c.id)) === 'CONTAINER_EXITED', 30_000);
    const events = api.events.filter((e) => e.involvedObject.uid === sb2.uid);
    expect(events.map((e) => e.reason)).toEqual(['Unhealthy', 'Killing', 'FailedPreStopHook']);
    expect(events[2]!.message).toMatch(/^PreStopHook failed: .*RESOURCE_EXHAUSTED.*larger than max/);
    const m = (await agent.http('/metrics')).body;
    expect(m).toMatch(/probe_agent_gates_operations_total\{op="prestop",result="ok"\} 1\b/);
    expect(m).toMatch(/probe_agent_gates_operations_total\{op="prestop",result="error"\} 1\b/);
  });

  it('a pod with terminationGracePeriodSeconds 400000000000 whose liveness fails: the agent stays up, stops it with the grace clamped, and writes its neighbour\'s condition', async () => {
    // The first pod, running again (a new container), is the neighbour.
    await liveSrv.control('/control/health?ok=1');
    const c3 = await ctrd.runContainer(sb, { name: 'app', attempt: 2 });
    const sb3 = await ctrd.runSandbox({ name: 'crashloop', namespace: NS });
    const live3 = await podServer(LIVE_PORT, sb3.netnsPath);
    extra.push(live3);
    await live3.control('/control/health?ok=0');
    const written = makePod({ uid: sb3.uid, name: sb3.name, namespace: NS, ips: sb3.ips, probe: 'none' });
    delete written.status;
    // The API server admits any int64 >= 0 here.
    (written.spec as Obj).terminationGracePeriodSeconds = 400000000000;
    ((written.spec as Obj).containers[0] as Obj).livenessProbe = { httpGet: { path: '/healthz', port: LIVE_PORT }, periodSeconds: 1, failureThreshold: 1 };
    const pod3 = rewritePodGates(written).pod as Obj;
    api.pods.push(structuredClone(pod3));
    // The pause image: it exits on SIGTERM, so a stop whatever its grace ends at once.
    const c = await ctrd.runContainer(sb3, { name: 'app' });
    const listed3 = makePod({ uid: sb3.uid, name: sb3.name, namespace: NS, ips: sb3.ips, containerID: `containerd://${c.id}`, restartCount: 0, probe: 'none' });
    const neighbour = patchesOf('web').length;
    show(() => kubeletView(c3, 2), () => listedAs(pod3, listed3.status as Obj));
    await until('the crash-loop container EXITED', async () => (await containerState(c.id)) === 'CONTAINER_EXITED', 60_000);
    // Stopped with the pod's grace as kubelet's Duration holds it, by an agent that is still the same process.
    const said = agent.logs.filter((l) => l.msg === 'liveness probe failed; stopping the container' && l['pod'] === `${NS}/crashloop`);
    expect(said.map((l) => l['grace'])).toEqual([9223372036]);
    expect(agent.proc.exitCode).toBeNull();
    expect(agent.proc.signalCode).toBeNull();
    const m = (await agent.http('/metrics')).body;
    expect(m).toMatch(/probe_agent_gates_operations_total\{op="stop",result="ok"\} 3\b/);
    expect(m).not.toMatch(/op="stop",result="error"/);
    // The neighbour's condition is written on: True for its new container, then each transition.
    await until('the neighbour True for its new container', () => patchesOf('web').slice(neighbour).includes('True'));
    await readySrv.control('/control/health?ok=0');
    await until('the neighbour False', () => patchesOf('web').at(-1) === 'False');
    await readySrv.control('/control/health?ok=1');
    await until('the neighbour True again', () => patchesOf('web').at(-1) === 'True');
    expect(await containerState(c3.id)).toBe('CONTAINER_RUNNING');
  });
});
