/**
 * Gates mode on the agent's side (agent/gates/): the pod model reads the probes the gates rewrite
 * took, the real ProbeManager runs them with kubelet's state machine, and the GatesController writes
 * the probe-agent.io/ready condition through the real ApiWriter to the API server stand-in: only on
 * a change, False for a restarted container before it has a decision, and on a liveness failure the
 * events, the condition False, then a stop with the probe's grace period. The runtime is a recording
 * stand-in here (test/integration/gates-agent.test.ts stops a real containerd container).
 */
import { afterEach, describe, expect, it } from 'vitest';
import { ApiWriter } from '../../agent/gates/api-writer.ts';
import { desiredCondition, GatesController } from '../../agent/gates/controller.ts';
import { silentLogger } from '../../agent/log.ts';
import { GATES_CONDITION_TYPE, parsePodList } from '../../agent/pods/pod-model.ts';
import type { PodInfo } from '../../agent/pods/types.ts';
import type { ProbeOutcome } from '../../agent/probe/types.ts';
import { rewritePodGates } from '../../agent/rewrite/gates-rewrite.ts';
import { ProbeManager } from '../../agent/scheduler/manager.ts';
import { ResultsStore } from '../../agent/scheduler/results-store.ts';
import { startApiServerStandIn, type ApiServerStandIn } from '../support/api-server-standin.ts';

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
function kubeletView(pod: Obj, id: string, condition = ''): PodInfo {
  const status = {
    phase: 'Running', podIP: '10.0.0.5', podIPs: [{ ip: '10.0.0.5' }],
    conditions: condition ? [{ type: GATES_CONDITION_TYPE, status: condition }] : [],
    containerStatuses: [{ name: 'app', containerID: `containerd://${id}`, ready: true, started: true, restartCount: 0, state: { running: { startedAt: new Date().toISOString().replace(/\.\d+Z$/, 'Z') } } }],
  };
  const { pods, errors } = parsePodList({ kind: 'PodList', apiVersion: 'v1', items: [{ ...pod, status }] });
  expect(errors).toEqual([]);
  return pods[0]!;
}

const until = async (what: string, pred: () => boolean, timeoutMs = 20_000): Promise<void> => {
  const end = Date.now() + timeoutMs;
  while (!pred()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
};

let cleanup: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  for (const c of cleanup.reverse()) await c();
  cleanup = [];
});

interface Rig {
  api: ApiServerStandIn;
  manager: ProbeManager;
  controller: GatesController;
  outcomes: { readiness: ProbeOutcome['result']; liveness: ProbeOutcome['result'] };
  log: string[];
  stops: Array<{ id: string; timeout: number }>;
  patches: () => Obj[];
  sync: (p: PodInfo) => void;
}

async function rig(): Promise<Rig> {
  const api = await startApiServerStandIn();
  cleanup.push(() => api.close());
  const pod = apiPod();
  api.pods.push(structuredClone(pod));
  const store = new ResultsStore();
  const outcomes = { readiness: 'success' as ProbeOutcome['result'], liveness: 'success' as ProbeOutcome['result'] };
  const manager = new ProbeManager({
    store,
    classify: () => undefined,
    // The prober boundary: what the pod's servers would answer (the integration test uses real ones).
    runProbe: async (_pod, _c, spec) => {
      const result = spec.handler.kind === 'http' ? outcomes.readiness : outcomes.liveness;
      return { result, message: result === 'success' ? '' : 'HTTP probe failed with statuscode: 503', durationSeconds: 0, phases: {} } as unknown as ProbeOutcome;
    },
    agentStart: Date.now() - 60_000,
  });
  cleanup.push(() => manager.stop());
  const writer = new ApiWriter({ url: api.url, nodeName: 'node-a', conditionType: GATES_CONDITION_TYPE });
  cleanup.push(() => writer.close());
  const log: string[] = [];
  const stops: Rig['stops'] = [];
  const ops: string[] = [];
  const controller = new GatesController({
    results: store,
    writer: {
      patchCondition: async (...a) => {
        log.push(`condition ${a[3].status}`);
        await writer.patchCondition(...a);
      },
      recordEvent: async (e) => {
        log.push(`event ${e.reason}`);
        await writer.recordEvent(e);
      },
    },
    stopper: { stopContainer: async (id, timeout) => { log.push('stop'); stops.push({ id, timeout }); } },
    log: silentLogger,
    minWriteIntervalMs: 200,
    onOp: (op, ok) => ops.push(`${op}:${ok}`),
  });
  cleanup.push(() => controller.close());
  const sync = (p: PodInfo) => {
    manager.sync([p]);
    controller.sync([p]);
  };
  const patches = () => api.requests.filter((r) => r.method === 'PATCH' && r.url.endsWith('/status')).map((r) => r.body as Obj);
  return { api, manager, controller, outcomes, log, stops, patches, sync };
}

describe('gates controller', () => {
  it('the pod model finds the taken probes, the grace period and our condition', () => {
    const info = kubeletView(apiPod(), 'c1', 'True');
    expect(info.gates).toEqual({ taken: { app: ['Liveness', 'Readiness'] }, condition: 'True', terminationGracePeriodSeconds: 20 });
    expect(Object.keys(info.containers[0]!.probes).sort()).toEqual(['Liveness', 'Readiness']);
    expect(info.containers[0]!.probes.Liveness).toMatchObject({ ok: true, spec: { terminationGracePeriodSeconds: 7 } });
  });

  it('writes only its own condition, only on a change; a new container ID is not ready until it proves it', async () => {
    const r = await rig();
    const pod = apiPod();
    r.sync(kubeletView(pod, 'c1'));
    await until('True', () => r.patches().length === 1);
    const first = r.patches()[0]!;
    expect(first).toMatchObject({ metadata: { uid: UID }, status: { conditions: [{ type: GATES_CONDITION_TYPE, status: 'True' }] } });
    expect(first.status.conditions).toHaveLength(1);
    expect(Object.keys(first)).toEqual(['metadata', 'status']);
    // Several periods of the same decision: no write.
    for (let i = 0; i < 4; i++) {
      r.sync(kubeletView(pod, 'c1', 'True'));
      await new Promise((res) => setTimeout(res, 600));
    }
    expect(r.patches()).toHaveLength(1);
    r.outcomes.readiness = 'failure';
    await until('False', () => r.patches().length === 2);
    expect(r.patches()[1]!.status.conditions[0]).toMatchObject({ status: 'False', reason: 'ReadinessProbeFailed' });
    r.outcomes.readiness = 'success';
    await until('True again', () => r.patches().length === 3);
    // The container restarted: False from the pod list alone, before any probe of the new container.
    r.sync(kubeletView(pod, 'c2', 'True'));
    await until(`False for the new container ${JSON.stringify(r.log)}`, () => r.patches().length >= 4, 5000);
    expect(r.patches()[3]!.status.conditions[0].status).toBe('False');
    await until('True for the new container', () => r.patches().length === 5);
    const stored = r.api.pods[0]!.status.conditions.filter((c: Obj) => c.type === GATES_CONDITION_TYPE);
    expect(stored).toHaveLength(1);
    expect(stored[0].status).toBe('True');
  });

  it('a liveness failure at the threshold: events, condition False, then one stop with the probe grace period', async () => {
    const r = await rig();
    const pod = apiPod();
    r.sync(kubeletView(pod, 'c1'));
    await until('True', () => r.patches().length === 1);
    r.outcomes.liveness = 'failure';
    await until('stop', () => r.stops.length === 1);
    expect(r.stops[0]).toEqual({ id: 'c1', timeout: 7 });
    expect(r.log.slice(r.log.indexOf('condition True') + 1)).toEqual(['condition False', 'event Unhealthy', 'event Killing', 'stop']);
    const events = r.api.events.map((e) => [e.reason, e.message, e.involvedObject.uid, e.involvedObject.fieldPath]);
    expect(events).toEqual([
      ['Unhealthy', 'Liveness probe failed: HTTP probe failed with statuscode: 503', UID, 'spec.containers{app}'],
      ['Killing', 'Container app failed liveness probe, will be restarted', UID, 'spec.containers{app}'],
    ]);
    // The worker holds until a new container ID: no second stop for the same container.
    await new Promise((res) => setTimeout(res, 2500));
    r.sync(kubeletView(pod, 'c1', 'False'));
    await new Promise((res) => setTimeout(res, 1500));
    expect(r.stops).toHaveLength(1);
  });

  it('a pod recreated under the same name is not written (the UID precondition)', async () => {
    const r = await rig();
    r.api.pods[0]!.metadata.uid = 'another-uid';
    r.sync(kubeletView(apiPod(), 'c1'));
    await until('the refused write', () => r.api.requests.some((q) => q.url.endsWith('/status')));
    await new Promise((res) => setTimeout(res, 300));
    expect(r.api.pods[0]!.status?.conditions ?? []).toEqual([]);
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
});
