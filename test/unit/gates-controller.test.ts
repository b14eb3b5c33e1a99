/**
 * Gates mode's pure parts (agent/gates/): the pod model reads the probes the gates rewrite took,
 * desiredCondition turns decisions into the condition, and the ApiWriter's status patch carries the
 * pod UID as a precondition (against the API server stand-in: a real one cannot run in CI). The
 * controller end to end (real probes, real containerd StopContainer) is
 * test/integration/gates-agent.test.ts.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { ApiWriter } from '../../agent/gates/api-writer.ts';
import { desiredCondition, GatesController, podAsRuntimeSees, podAsRuntimeStarted, preStopPlan } from '../../agent/gates/controller.ts';
import { runtimeContainers, type RuntimeContainer } from '../../agent/gates/runtime-watch.ts';
import { createLogger } from '../../agent/log.ts';
import { ResultsStore } from '../../agent/scheduler/results-store.ts';
import { GATES_CONDITION_TYPE, parsePodList } from '../../agent/pods/pod-model.ts';
import type { PodInfo } from '../../agent/pods/types.ts';
import { rewritePodGates } from '../../agent/rewrite/gates-rewrite.ts';
import { startApiServerStandIn } from '../support/api-server-standin.ts';
import { until } from '../support/api-harness.ts';

type Obj = Record<string, any>;

const UID = '6f1c2a8e-0000-4000-8000-000000000001';

function apiPod(): Obj {
  const written = {
    metadata: { name: 'web', namespace: 'shop', uid: UID },
    spec: {
      nodeName: 'node-a',
      terminationGracePeriodSeconds: 20,
      containers: [{
        name: 'app', image: 'app', ports: [{ name: 'http', containerPort: 8080 }],
        readinessProbe: { httpGet: { path: '/ready', port: 'http' }, periodSeconds: 1, failureThreshold: 1 },
        livenessProbe: { tcpSocket: { port: 8080 }, periodSeconds: 1, failureThreshold: 2, terminationGracePeriodSeconds: 7 },
        lifecycle: { preStop: { exec: { command: ['true'] } } },
      }],
    },
  };
  return rewritePodGates(written).pod as Obj;
}

/** The pod as kubelet's /pods shows it: running container `id`, and our condition as last written. */
function kubeletView(pod: Obj, id: string, condition = '', lastTransitionTime?: string): PodInfo {
  const status = {
    phase: 'Running', podIP: '10.0.0.5', podIPs: [{ ip: '10.0.0.5' }],
    conditions: condition ? [{ type: GATES_CONDITION_TYPE, status: condition, ...(lastTransitionTime ? { lastTransitionTime } : {}) }] : [],
    containerStatuses: [{ name: 'app', containerID: `containerd://${id}`, ready: true, started: true, restartCount: 0, state: { running: { startedAt: new Date().toISOString().replace(/\.\d+Z$/, 'Z') } } }],
  };
  const { pods, errors } = parsePodList({ kind: 'PodList', apiVersion: 'v1', items: [{ ...pod, status }] });
  expect(errors).toEqual([]);
  return pods[0]!;
}

let cleanup: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  for (const c of cleanup.reverse()) await c();
  cleanup = [];
});

/** An API server stand-in with a writer to it, a log kept as lines, and kubelet's view of a pod whose container stopped. */
async function writeLogFixture() {
  const api = await startApiServerStandIn();
  cleanup.push(() => api.close());
  const writer = new ApiWriter({ url: api.url, nodeName: 'node-a', conditionType: GATES_CONDITION_TYPE });
  cleanup.push(() => writer.close());
  const lines: string[] = [];
  const log = createLogger({ level: 'info', write: (l) => lines.push(l) });
  const info = kubeletView(apiPod(), 'c1', 'True');
  const stopped = { ...info, containers: [{ ...info.containers[0]!, state: { ...info.containers[0]!.state!, running: false } }] };
  return { api, writer, lines, log, stopped };
}

/** The API stand-in holding the pod (with our condition `stored`, if given) and a writer to it. */
async function apiFixture(stored?: 'True') {
  const api = await startApiServerStandIn();
  cleanup.push(() => api.close());
  const pod = apiPod();
  api.pods.push(stored ? { ...structuredClone(pod), status: { conditions: [{ type: GATES_CONDITION_TYPE, status: stored }] } } : structuredClone(pod));
  const writer = new ApiWriter({ url: api.url, nodeName: 'node-a', conditionType: GATES_CONDITION_TYPE });
  cleanup.push(() => writer.close());
  return { api, pod, writer };
}

/** apiFixture with our condition True, and a readiness success for container c1. */
async function readyFixture() {
  const { api, pod, writer } = await apiFixture('True');
  const results = new ResultsStore();
  results.upsert({ key: { podUID: UID, containerName: 'app', probeType: 'Readiness' }, namespace: 'shop', podName: 'web', containerID: 'containerd://c1', result: 'success', consecutive: 1, lastProbeTime: 1, lastMessage: '', onHold: false, started: true, ready: true });
  return { api, pod, writer, results };
}

describe('gates controller', () => {
  it('the pod model finds the taken probes, the grace period and our condition', () => {
    const info = kubeletView(apiPod(), 'c1', 'True');
    expect(info.gates).toEqual({ taken: { app: ['Liveness', 'Readiness'] }, condition: 'True', terminationGracePeriodSeconds: 20 });
    expect(kubeletView(apiPod(), 'c1', 'False', '2026-12-07T06:00:01Z').gates).toMatchObject({ condition: 'False', conditionSince: Date.parse('2026-12-07T06:00:01Z') });
    expect(kubeletView(apiPod(), 'c1', 'False', 'yesterday').gates).toMatchObject({ condition: 'False' });
    expect(Object.keys(info.containers[0]!.probes).sort()).toEqual(['Liveness', 'Readiness']);
    expect(info.containers[0]!.probes.Liveness).toMatchObject({ ok: true, spec: { terminationGracePeriodSeconds: 7 } });
  });

  it('a pod recreated under the same name is not written (the UID precondition)', async () => {
    const api = await startApiServerStandIn();
    cleanup.push(() => api.close());
    const pod = apiPod();
    api.pods.push({ ...structuredClone(pod), metadata: { ...pod.metadata, uid: 'another-uid' } });
    const writer = new ApiWriter({ url: api.url, nodeName: 'node-a', conditionType: GATES_CONDITION_TYPE });
    cleanup.push(() => writer.close());
    await expect(writer.patchCondition('shop', 'web', UID, { status: 'True', reason: 'ProbesSucceeded', message: '' })).rejects.toMatchObject({ status: 409 });
    expect(api.pods[0]!.status?.conditions ?? []).toEqual([]);
    await writer.patchCondition('shop', 'web', 'another-uid', { status: 'False', reason: 'ReadinessProbeFailed', message: 'x' });
    expect(api.pods[0]!.status.conditions).toMatchObject([{ type: GATES_CONDITION_TYPE, status: 'False', reason: 'ReadinessProbeFailed' }]);
  });

  it('desiredCondition: not running, no decision, not started, not ready', () => {
    const info = kubeletView(apiPod(), 'c1');
    expect(desiredCondition(info, []).reason).toBe('NoDecisionYet');
    const stopped = { ...info, containers: [{ ...info.containers[0]!, state: { ...info.containers[0]!.state!, running: false } }] };
    expect(desiredCondition(stopped, []).reason).toBe('ContainerNotRunning');
    const st = { key: { podUID: UID, containerName: 'app', probeType: 'Readiness' as const }, namespace: 'shop', podName: 'web', containerID: 'containerd://c1', result: 'success' as const, consecutive: 1, lastProbeTime: 1, lastMessage: '', onHold: false, started: true, ready: true };
    expect(desiredCondition(info, [st]).status).toBe('True');
    expect(desiredCondition(info, [{ ...st, containerID: 'containerd://c0' }]).reason).toBe('NoDecisionYet');
    expect(desiredCondition(info, [{ ...st, started: false, ready: false }]).reason).toBe('NotStarted');
    expect(desiredCondition(info, [st], new Set(['containerd://c1'])).reason).toBe('ContainerStopping');
  });

  it('a deleted pod whose container stopped is not written False (kubelet shows it not Ready); a live one is', async () => {
    const { api, pod, writer } = await apiFixture();
    const controller = new GatesController({ results: new ResultsStore(), writer, log: createLogger({ level: 'error', write: () => {} }) });
    cleanup.push(() => controller.close());
    const info = kubeletView(pod, 'c1', 'True');
    const stopped = { ...info, containers: [{ ...info.containers[0]!, state: { ...info.containers[0]!.state!, running: false } }] };
    const patches = () => api.requests.filter((r) => r.method === 'PATCH' && r.url.includes('/status')).length;
    controller.sync([{ ...stopped, deletionTimestamp: Date.now() }]);
    await controller.close();
    expect(patches()).toBe(0);
    const live = new GatesController({ results: new ResultsStore(), writer, log: createLogger({ level: 'error', write: () => {} }) });
    cleanup.push(() => live.close());
    live.sync([stopped]);
    await live.close();
    expect(patches()).toBe(1);
    expect(api.pods[0]!.status.conditions).toMatchObject([{ type: GATES_CONDITION_TYPE, status: 'False', reason: 'ContainerNotRunning' }]);
  });

  it('a write for a pod already deleted is said at info, with the reason; an API server outage is a warning', async () => {
    const { api, writer, lines, log, stopped } = await writeLogFixture();
    const gone = new GatesController({ results: new ResultsStore(), writer, log });
    gone.sync([stopped]);
    await gone.close();
    expect(lines.filter((l) => l.includes('"level":"warn"'))).toEqual([]);
    expect(lines.join('')).toMatch(/pod condition not written: the pod is gone.*HTTP 404/);
    api.pods.push(apiPod());
    api.down = true;
    const outage = new GatesController({ results: new ResultsStore(), writer, log });
    outage.sync([stopped]);
    await outage.close();
    expect(lines.filter((l) => l.includes('"level":"warn"') && l.includes('pod condition not written'))).toHaveLength(1);
  });

  it('an API server outage is one warning, its retries are info, and the first write after it says so', async () => {
    const { api, writer, lines, log, stopped } = await writeLogFixture();
    api.pods.push(apiPod());
    api.down = true;
    const controller = new GatesController({ results: new ResultsStore(), writer, log, minWriteIntervalMs: 50 });
    cleanup.push(() => controller.close());
    controller.sync([stopped]);
    const failures = () => lines.filter((l) => l.includes('pod condition not written')).map((l) => JSON.parse(l).level as string);
    await until(() => failures().length >= 3, 10_000, 'three failed writes');
    api.down = false;
    await until(() => lines.some((l) => l.includes('pod condition writes recovered')), 10_000, 'a write after the outage');
    await controller.close();
    const levels = failures();
    expect(levels[0]).toBe('warn');
    expect(levels.slice(1).every((l) => l === 'info')).toBe(true);
    expect(JSON.parse(lines.find((l) => l.includes('writes recovered'))!)).toMatchObject({ level: 'info', failedSinceLastWrite: levels.length });
    expect(api.pods[0]!.status.conditions).toMatchObject([{ type: GATES_CONDITION_TYPE, status: 'False' }]);
  });

  it('a crash seen in the runtime\'s container list turns the condition False before kubelet\'s pod list shows it', async () => {
    const { api, pod, writer, results } = await readyFixture();
    const controller = new GatesController({ results, writer, log: createLogger({ level: 'error', write: () => {} }) });
    cleanup.push(() => controller.close());
    const patches = () => api.requests.filter((r) => r.method === 'PATCH' && r.url.includes('/status')).length;
    const info = kubeletView(pod, 'c1', 'True');
    controller.sync([info]);
    // The runtime as CRI ListContainers answers, kubelet's labels on each container.
    const listed = (items: Array<[string, string, number]>) => runtimeContainers(items.map(([id, state, created]) => ({
      id, podSandboxId: 's1', metadata: { name: 'app', attempt: 0 }, state: state as 'CONTAINER_RUNNING', createdAt: String(created), annotations: {},
      labels: { 'io.kubernetes.pod.uid': UID, 'io.kubernetes.container.name': 'app' },
    })));
    // Nothing new: no write. A list that does not hold c1 yet (older than kubelet's): no write.
    expect(controller.runtime(listed([['c1', 'CONTAINER_RUNNING', 1]]))).toBe(false);
    expect(controller.runtime(listed([['c0', 'CONTAINER_EXITED', 0]]))).toBe(false);
    await new Promise((r) => setTimeout(r, 100));
    expect(patches()).toBe(0);
    // c1 crashed and kubelet started c2: False at once, though kubelet's list still shows c1 running.
    // ... and kubelet's list is behind: the caller reads it again.
    expect(controller.runtime(listed([['c1', 'CONTAINER_EXITED', 1], ['c2', 'CONTAINER_RUNNING', 2]]))).toBe(true);
    await controller.close();
    expect(patches()).toBe(1);
    expect(api.pods[0]!.status.conditions).toMatchObject([{ type: GATES_CONDITION_TYPE, status: 'False', reason: 'NoDecisionYet' }]);
    // Exited with no successor yet: not running.
    expect(desiredCondition(podAsRuntimeSees(info, listed([['c1', 'CONTAINER_EXITED', 1]])), results.list()).reason).toBe('ContainerNotRunning');
    expect(podAsRuntimeSees(info, listed([['c1', 'CONTAINER_RUNNING', 1]]))).toBe(info);
  });

  it('podAsRuntimeStarted: a container the runtime started (with its start time) is running under kubelet\'s ID before kubelet lists it', () => {
    const rt = (id: string, running: boolean, created: bigint, started: bigint): RuntimeContainer => ({ id, podUID: UID, name: 'app', running, createdAt: created, startedAt: started });
    const listed = kubeletView(apiPod(), 'c1');
    const waiting: PodInfo = { ...listed, containers: listed.containers.map((c) => ({ ...c, state: undefined })) };
    const startNs = 1_700_000_000_123_456_789n;
    // Not created by kubelet's list yet: running, started, not ready, its start time kept for an initial delay.
    const seen = podAsRuntimeStarted(waiting, [rt('c9', true, 5n, startNs)], 'containerd://');
    expect(seen.containers[0]!.state).toEqual({ containerID: 'containerd://c9', running: true, startedAt: 1_700_000_000_123, terminated: false, started: true, ready: false, restartCount: 0 });
    // A newer container than kubelet's (a restart) replaces it; an older one or the same one changes nothing.
    expect(podAsRuntimeStarted(listed, [rt('c1', false, 1n, 1n), rt('c2', true, 2n, startNs)], 'containerd://').containers[0]!.state?.containerID).toBe('containerd://c2');
    expect(podAsRuntimeStarted(listed, [rt('c1', true, 2n, startNs), rt('c0', true, 1n, startNs)], 'containerd://')).toBe(listed);
    // No start time (a list), no prefix yet, or a list older than kubelet's view: kubelet's list as it is.
    expect(podAsRuntimeStarted(waiting, [rt('c9', true, 5n, 0n)], 'containerd://')).toBe(waiting);
    expect(podAsRuntimeStarted(waiting, [rt('c9', true, 5n, startNs)], undefined)).toBe(waiting);
    expect(podAsRuntimeStarted(listed, [rt('c2', true, 2n, startNs)], 'containerd://')).toBe(listed);
    // The condition sees the same container: no decision for it yet.
    expect(desiredCondition(podAsRuntimeSees(seen, [rt('c9', true, 5n, startNs)]), []).reason).toBe('NoDecisionYet');
  });

  it('podAsRuntimeStarted: a pod kubelet lists without an IP yet is probed only with the IP its sandbox event carries', () => {
    const listed = kubeletView(apiPod(), 'c1');
    const noIP: PodInfo = { ...listed, podIPs: [], containers: listed.containers.map((c) => ({ ...c, state: undefined })) };
    const started: RuntimeContainer = { id: 'c9', podUID: UID, name: 'app', running: true, createdAt: 5n, startedAt: 1_700_000_000_000_000_000n };
    // No IP anywhere: as kubelet, no probe yet (a probe now could only error).
    expect(podAsRuntimeStarted(noIP, [started], 'containerd://')).toBe(noIP);
    // The event's sandbox status names the IPs: running, with them.
    const seen = podAsRuntimeStarted(noIP, [{ ...started, podIPs: ['10.1.2.3', 'fd00::3'] }], 'containerd://');
    expect(seen.podIPs).toEqual(['10.1.2.3', 'fd00::3']);
    expect(seen.containers[0]!.state?.containerID).toBe('containerd://c9');
    // Kubelet's own IPs win when it lists them.
    expect(podAsRuntimeStarted({ ...noIP, podIPs: ['10.9.9.9'] }, [{ ...started, podIPs: ['10.1.2.3'] }], 'containerd://').podIPs).toEqual(['10.9.9.9']);
  });

  it('the probe workers see a container the runtime started, under the prefix kubelet\'s list spells (else the runtime\'s name)', async () => {
    const api = await startApiServerStandIn();
    cleanup.push(() => api.close());
    const writer = new ApiWriter({ url: api.url, nodeName: 'node-a', conditionType: GATES_CONDITION_TYPE });
    cleanup.push(() => writer.close());
    const controller = new GatesController({ results: new ResultsStore(), writer, log: createLogger({ level: 'error', write: () => {} }) });
    cleanup.push(() => controller.close());
    const listed = kubeletView(apiPod(), 'c1');
    const waiting: PodInfo = { ...listed, containers: listed.containers.map((c) => ({ ...c, state: undefined })) };
    const started: RuntimeContainer = { id: 'c9', podUID: UID, name: 'app', running: true, createdAt: 5n, startedAt: 1_700_000_000_000_000_000n };
    controller.sync([waiting]);
    // Kubelet's list is behind the runtime: read it again. No prefix known yet: kubelet's list as it is.
    expect(controller.runtime([started])).toBe(true);
    expect(controller.asRuntimeStarted([waiting])[0]).toBe(waiting);
    controller.setRuntimeName('containerd');
    expect(controller.asRuntimeStarted([waiting])[0]!.containers[0]!.state?.containerID).toBe('containerd://c9');
    // Kubelet's own spelling, from another pod it lists, wins; the runtime's name does not replace it.
    const other: PodInfo = { ...listed, uid: 'other', gates: undefined, containers: listed.containers.map((c) => ({ ...c, state: { ...c.state!, containerID: 'cri-o://x1' } })) };
    expect(controller.sync([waiting, other])).toBe(true);
    controller.setRuntimeName('containerd');
    expect(controller.asRuntimeStarted([waiting])[0]!.containers[0]!.state?.containerID).toBe('cri-o://c9');
    expect(controller.asRuntimeStarted([other])[0]).toBe(other);
  });

  it('converges on the condition the pod has now: a False someone else wrote goes True again, once; kubelet\'s lag costs no second write', async () => {
    const { api, pod, writer, results } = await readyFixture();
    const patches = () => api.requests.filter((r) => r.method === 'PATCH' && r.url.includes('/status')).map((r) => (r.body as Obj).status.conditions[0].status as string);
    const log = createLogger({ level: 'error', write: () => {} });
    // kubelet's list lags the API server for long (a window no test run outlasts): the value written counts meanwhile.
    const a = new GatesController({ results, writer, log, minWriteIntervalMs: 1, confirmWindowMs: 3_600_000 });
    cleanup.push(() => a.close());
    a.sync([kubeletView(pod, 'c1', 'True')]);
    // The lease controller (an expiry while this agent was cut off) wrote False; kubelet's list shows it.
    api.pods[0]!.status.conditions[0] = { type: GATES_CONDITION_TYPE, status: 'False', reason: 'NodeLeaseExpired' };
    a.sync([kubeletView(pod, 'c1', 'False')]);
    await until(() => patches().length === 1, 10_000, 'True written again');
    expect(api.pods[0]!.status.conditions[0]).toMatchObject({ status: 'True', reason: 'ProbesSucceeded' });
    // kubelet's list has not caught up with that write: nothing more.
    a.sync([kubeletView(pod, 'c1', 'False')]);
    a.sync([kubeletView(pod, 'c1', 'False')]);
    // A False no older than that write (its lastTransitionTime) is someone else's, not lag: written at once.
    a.sync([kubeletView(pod, 'c1', 'False', new Date(Date.now() + 1000).toISOString())]);
    await until(() => patches().length === 2, 10_000, 'True written over a newer False');
    // It shows it; then someone writes False again: written again.
    a.sync([kubeletView(pod, 'c1', 'True')]);
    a.sync([kubeletView(pod, 'c1', 'False')]);
    await until(() => patches().length === 3, 10_000, 'True written a third time');
    await a.close();
    expect(patches()).toEqual(['True', 'True', 'True']);

    // A list that never shows the write (overwritten at once): written again once the window is over.
    const b = new GatesController({ results, writer, log, minWriteIntervalMs: 1, confirmWindowMs: 100 });
    cleanup.push(() => b.close());
    b.sync([kubeletView(pod, 'c1', 'False')]);
    await until(() => patches().length === 4, 10_000, 'a fresh controller writes True');
    await until(() => {
      b.sync([kubeletView(pod, 'c1', 'False')]);
      return patches().length >= 5;
    }, 10_000, 'True again when the list still says False after the window');
    // Right in kubelet's view: nothing more, however often the list is read.
    b.sync([kubeletView(pod, 'c1', 'True')]);
    await b.close();
    const n = patches().length;
    const c = new GatesController({ results, writer, log, minWriteIntervalMs: 1, confirmWindowMs: 100 });
    cleanup.push(() => c.close());
    for (let i = 0; i < 5; i++) c.sync([kubeletView(pod, 'c1', 'True')]);
    await c.close();
    expect(patches()).toEqual(Array(n).fill('True'));
  });

  it('a liveness failure of a restarted container neither list shows yet is not lost: stopped once kubelet\'s list or the runtime\'s shows it', async () => {
    const { api, pod, writer } = await apiFixture();
    const stops: Array<[string, number]> = [];
    const results = new ResultsStore();
    const controller = new GatesController({
      results, writer, log: createLogger({ level: 'error', write: () => {} }), minWriteIntervalMs: 1,
      stopper: { stopContainer: async (id, t) => void stops.push([id, t]) },
    });
    cleanup.push(() => controller.close());
    const failed = (id: string) => results.upsert({
      key: { podUID: UID, containerName: 'app', probeType: 'Liveness' }, namespace: 'shop', podName: 'web', containerID: `containerd://${id}`,
      result: 'failure', consecutive: 2, lastProbeTime: Date.now(), lastMessage: 'dial tcp: connection refused', onHold: true, started: true, ready: false,
    });
    const rt = (id: string, running: boolean, created: bigint): RuntimeContainer => ({ id, podUID: UID, name: 'app', running, createdAt: created, startedAt: running ? 1_700_000_000_000_000_000n : 0n });
    controller.sync([kubeletView(pod, 'c1', 'True')]);
    // The worker probed c2 (kubelet restarted the container) and it failed at its threshold, before
    // kubelet's list or the runtime's list given here shows c2.
    failed('c2');
    await new Promise((r) => setTimeout(r, 50));
    expect(stops).toEqual([]);
    // The runtime shows it: stopped, with the probe's grace (7 s).
    controller.setRuntimeName('containerd');
    controller.runtime([rt('c1', false, 1n), rt('c2', true, 2n)]);
    await until(() => stops.length === 1, 10_000, 'the stop of c2');
    expect(stops).toEqual([['c2', 7]]);

    // Again with kubelet's list the first to show the new container (c3).
    failed('c3');
    await new Promise((r) => setTimeout(r, 50));
    expect(stops).toHaveLength(1);
    controller.sync([kubeletView(pod, 'c3', 'False')]);
    await until(() => stops.length === 2, 10_000, 'the stop of c3');
    expect(stops[1]).toEqual(['c3', 7]);

    // A failure whose worker moved on (a newer container's status replaced it) is dropped, not acted on late.
    failed('c4');
    results.upsert({ ...results.list({ podUID: UID }).find((s) => s.key.probeType === 'Liveness')!, containerID: 'containerd://c5', result: 'unknown', onHold: false });
    controller.sync([kubeletView(pod, 'c4', 'False')]);
    await controller.close();
    expect(stops.map(([id]) => id)).toEqual(['c2', 'c3']);
  });

  it('preStopPlan: HTTP, exec and sleep hooks as kubelet runs them, within the grace period; bad ones said', () => {
    expect(preStopPlan(undefined, 30)).toEqual({ kind: 'none' });
    expect(preStopPlan({ tcpSocket: { port: 80 } }, 30)).toEqual({ kind: 'none' });
    expect(preStopPlan({ httpGet: { path: '/stop', port: 8080 } }, 30)).toMatchObject({ kind: 'http', handler: { kind: 'http', port: 8080, path: '/stop' } });
    expect(preStopPlan({ httpGet: { path: '/stop' } }, 30).kind).toBe('invalid');
    expect(preStopPlan({ exec: { command: ['/bin/sh', '-c', 'nginx -s quit'] } }, 30)).toEqual({ kind: 'exec', cmd: ['/bin/sh', '-c', 'nginx -s quit'] });
    expect(preStopPlan({ exec: { command: [] } }, 30)).toEqual({ kind: 'invalid', message: 'exec hook: command must be a non-empty list of strings' });
    expect(preStopPlan({ exec: { command: ['a', 1] } }, 30).kind).toBe('invalid');
    expect(preStopPlan({ exec: { command: Array(1025).fill('x') } }, 30)).toMatchObject({ kind: 'invalid', message: /1024 arguments/ });
    expect(preStopPlan({ exec: { command: ['x'.repeat(65 * 1024)] } }, 30)).toMatchObject({ kind: 'invalid', message: /65536 bytes/ });
    expect(preStopPlan({ sleep: { seconds: 5 } }, 30)).toEqual({ kind: 'sleep', ms: 5000 });
    // Never past the grace period: the stop's own timeout is what is left of it.
    expect(preStopPlan({ sleep: { seconds: 120 } }, 7)).toEqual({ kind: 'sleep', ms: 7000 });
    expect(preStopPlan({ sleep: { seconds: -1 } }, 30).kind).toBe('invalid');
    expect(preStopPlan({ sleep: { seconds: '5' } }, 30).kind).toBe('invalid');
  });
});
