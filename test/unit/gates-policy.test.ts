/**
 * Gates mode's ValidatingAdmissionPolicies, run by the CEL subset evaluator as the API server runs
 * them (a real v1.33 API server runs them in `make e2e-policies`):
 * - gates/status-policy.yaml: the agent's pod-bound token may change only probe-agent.io/* conditions
 *   of pods on its own node, the webhook's lease controller only set them False; everything else in
 *   the pod (host IPs, finalizers, a status field no rule names) must stay, except what the API
 *   server itself changes on a status patch (managedFields, resourceVersion, generation);
 * - gates/events-policy.yaml: the agent's events are about a pod of that namespace, signed with its
 *   own node, never in kube-system or its own namespace;
 * - gates-lease/lease-policy.yaml: the agent writes only the Lease probe-agent-<its node>, held by
 *   its node, in its own namespace; the webhook only its leader-election Lease.
 * The good writes are the ones agent/gates/api-writer.ts really sends (captured by the API server
 * stand-in), and each refusal is shown to come from exactly the rule meant for it.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApiWriter } from '../../agent/gates/api-writer.ts';
import { nodeLeaseName } from '../../agent/gates/lease.ts';
import { GATES_CONDITION_TYPE } from '../../agent/pods/pod-model.ts';
import { admitByPolicy, loadPolicy, validationVerdicts, type Decision } from '../support/admission-policy.ts';
import { startApiServerStandIn, type ApiServerStandIn } from '../support/api-server-standin.ts';

type Obj = Record<string, any>;

const status = loadPolicy('gates/status-policy.yaml');
const events = loadPolicy('gates/events-policy.yaml');
const leases = loadPolicy('gates-lease/lease-policy.yaml');

const NODE_EXTRA = 'authentication.kubernetes.io/node-name';
const AGENT = 'system:serviceaccount:probe-agent:probe-agent';
const WEBHOOK = 'system:serviceaccount:probe-agent:probe-agent-webhook';

const userInfo = (user: string, node: string | null): Obj => ({ username: user, uid: 'sa-uid', groups: ['system:serviceaccounts', 'system:authenticated'], ...(node === null ? {} : { extra: { [NODE_EXTRA]: [node] } }) });

/** The message of the one validation that refuses `request`, failing the test if none or several do. */
function refusedBy(policy: Obj, request: Obj): string {
  const failed = validationVerdicts(policy, request).filter((v) => v.failed !== undefined);
  expect(failed.map((f) => f.failed), 'exactly one rule refuses').toHaveLength(1);
  return failed[0]!.message;
}

function allowed(policy: Obj, request: Obj): void {
  expect(admitByPolicy(policy, request)).toEqual({ decision: 'allowed' } satisfies Decision);
}

let api: ApiServerStandIn;
let writerA: ApiWriter;
beforeAll(async () => {
  api = await startApiServerStandIn();
  writerA = new ApiWriter({ url: api.url, nodeName: 'node-a', conditionType: GATES_CONDITION_TYPE });
});
afterAll(async () => {
  await writerA.close();
  await api.close();
});

/** A pod as the API server stores it: server-set metadata, host and pod IPs, kubelet's conditions. */
function storedPod(node: string, conditions: Obj[]): Obj {
  return {
    apiVersion: 'v1', kind: 'Pod',
    metadata: {
      name: 'web', namespace: 'shop', uid: 'u1', resourceVersion: '812', creationTimestamp: '2026-12-07T05:00:00Z',
      labels: { app: 'web' }, annotations: { 'probe-agent.io/original-handlers': '{"mode":"gates"}' },
      ownerReferences: [{ apiVersion: 'apps/v1', kind: 'ReplicaSet', name: 'web-5d9', uid: 'rs1', controller: true, blockOwnerDeletion: true }],
      managedFields: [{ manager: 'kube-controller-manager', operation: 'Update', apiVersion: 'v1', time: '2026-12-07T05:00:00Z', fieldsType: 'FieldsV1', fieldsV1: { 'f:metadata': {} } }],
    },
    spec: { nodeName: node, containers: [{ name: 'app', image: 'app' }], readinessGates: [{ conditionType: GATES_CONDITION_TYPE }] },
    status: {
      phase: 'Running', hostIP: '192.0.2.10', hostIPs: [{ ip: '192.0.2.10' }], podIP: '10.0.0.5', podIPs: [{ ip: '10.0.0.5' }],
      qosClass: 'BestEffort', startTime: '2026-12-07T05:00:01Z', conditions,
      containerStatuses: [{ name: 'app', ready: true, restartCount: 0, image: 'app', imageID: 'sha256:1', started: true, state: { running: { startedAt: '2026-12-07T05:00:02Z' } } }],
    },
  };
}

const KUBELET_CONDITIONS = [{ type: 'Ready', status: 'False' }, { type: 'ContainersReady', status: 'True' }];

/**
 * The AdmissionRequest of `user` (token of `tokenNode`) patching a pod of `podNode` the way
 * ApiWriter.patchCondition does (the stand-in applies the strategic merge patch), then `edit` on the
 * result; the API server's own changes of a status patch (a managedFields entry) are in `object`.
 */
async function statusRequest(o: { tokenNode: string | null; podNode?: string; user?: string; condition?: 'True' | 'False'; old?: Obj[]; edit?: (pod: Obj) => void }): Promise<Obj> {
  const oldObject = storedPod(o.podNode ?? 'node-a', structuredClone(o.old ?? [...KUBELET_CONDITIONS, { type: GATES_CONDITION_TYPE, status: 'False' }]));
  api.pods.length = 0;
  api.pods.push(structuredClone(oldObject));
  await writerA.patchCondition('shop', 'web', 'u1', { status: o.condition ?? 'True', reason: 'ProbesSucceeded', message: '' });
  const object = structuredClone(api.pods[0]!);
  object.metadata.managedFields.push({ manager: 'probe-agent', operation: 'Update', apiVersion: 'v1', time: '2026-12-07T05:01:00Z', fieldsType: 'FieldsV1', fieldsV1: { 'f:status': {} }, subresource: 'status' });
  o.edit?.(object);
  return {
    uid: 'r1', kind: { group: '', version: 'v1', kind: 'Pod' }, resource: { group: '', version: 'v1', resource: 'pods' }, subResource: 'status',
    name: 'web', namespace: 'shop', operation: 'UPDATE', userInfo: userInfo(o.user ?? AGENT, o.tokenNode), object, oldObject,
  };
}

describe('the gates pod-status policy', () => {
  const policy = status.policy;
  const rule = {
    node: /only write the status of pods on its own node/,
    conditions: /only probe-agent.io\/\* conditions may change \(/,
    status: /every other status field/,
    metadata: /metadata must stay/,
    spec: /spec .* must stay/,
  };

  it('is bound with Deny and fails closed', () => {
    expect(status.binding.spec).toEqual({ policyName: policy.metadata.name, validationActions: ['Deny'] });
    expect(policy.spec.failurePolicy).toBe('Fail');
  });

  it("allows the agent's patch of probe-agent.io/ready on a pod of its node, with the server's managedFields entry", async () => {
    const r = await statusRequest({ tokenNode: 'node-a' });
    expect(r.object.status.conditions.find((c: Obj) => c.type === GATES_CONDITION_TYPE).status).toBe('True');
    expect(r.object.metadata.managedFields).not.toEqual(r.oldObject.metadata.managedFields);
    allowed(policy, r);
    allowed(policy, await statusRequest({ tokenNode: 'node-a', condition: 'False' }));
  });

  it('allows adding the condition to a pod that has none, with no optional fields at all', async () => {
    allowed(policy, await statusRequest({ tokenNode: 'node-a', old: KUBELET_CONDITIONS }));
    const bare = await statusRequest({ tokenNode: 'node-a', old: [] });
    for (const o of [bare.object, bare.oldObject]) {
      delete o.metadata.labels;
      delete o.metadata.annotations;
      delete o.metadata.ownerReferences;
      o.status = o === bare.object ? { conditions: o.status.conditions } : {};
    }
    allowed(policy, bare);
  });

  it('allows a resourceVersion or generation the server moved', async () => {
    allowed(policy, await statusRequest({ tokenNode: 'node-a', edit: (p) => Object.assign(p.metadata, { resourceVersion: '813', generation: 2 }) }));
  });

  const denied: Array<[string, Parameters<typeof statusRequest>[0], RegExp]> = [
    ['a pod of another node', { tokenNode: 'node-a', podNode: 'node-b' }, rule.node],
    ['a token not bound to a pod (no node-name extra)', { tokenNode: null }, rule.node],
    ['the Ready condition', { tokenNode: 'node-a', edit: (p) => (p.status.conditions[0].status = 'True') }, rule.conditions],
    ['removing another condition', { tokenNode: 'node-a', edit: (p) => p.status.conditions.splice(1, 1) }, rule.conditions],
    ['a condition of another type', { tokenNode: 'node-a', edit: (p) => p.status.conditions.push({ type: 'example.com/gate', status: 'True' }) }, rule.conditions],
    ['a changed status.hostIP', { tokenNode: 'node-a', edit: (p) => (p.status.hostIP = '192.0.2.99') }, rule.status],
    ['a changed status.hostIPs', { tokenNode: 'node-a', edit: (p) => (p.status.hostIPs = [{ ip: '192.0.2.10' }, { ip: '2001:db8::99' }]) }, rule.status],
    ['a pod IP', { tokenNode: 'node-a', edit: (p) => (p.status.podIP = '10.0.0.9') }, rule.status],
    ['the phase', { tokenNode: 'node-a', edit: (p) => (p.status.phase = 'Failed') }, rule.status],
    ['a container status', { tokenNode: 'node-a', edit: (p) => (p.status.containerStatuses[0].ready = false) }, rule.status],
    ['a status field no rule names', { tokenNode: 'node-a', edit: (p) => (p.status.resize = 'Proposed') }, rule.status],
    ['removing a status field', { tokenNode: 'node-a', edit: (p) => delete p.status.qosClass }, rule.status],
    ['a finalizer added through the status subresource', { tokenNode: 'node-a', edit: (p) => (p.metadata.finalizers = ['example.com/hold']) }, rule.metadata],
    ['a label', { tokenNode: 'node-a', edit: (p) => (p.metadata.labels.app = 'evil') }, rule.metadata],
    ['an annotation', { tokenNode: 'node-a', edit: (p) => (p.metadata.annotations['probe-agent.io/original-handlers'] = '{}') }, rule.metadata],
    ['dropping the owner reference', { tokenNode: 'node-a', edit: (p) => delete p.metadata.ownerReferences }, rule.metadata],
    ['the spec', { tokenNode: 'node-a', edit: (p) => (p.spec.readinessGates = []) }, rule.spec],
  ];
  for (const [what, req, message] of denied) {
    it(`denies ${what}, by its own rule`, async () => {
      const r = await statusRequest(req);
      expect(admitByPolicy(policy, r).decision).toBe('denied');
      expect(refusedBy(policy, r)).toMatch(message);
    });
  }

  it('does not apply to other users (kubelet, controllers)', async () => {
    expect(admitByPolicy(policy, await statusRequest({ tokenNode: 'node-a', podNode: 'node-b', user: 'system:node:node-b' }))).toEqual({ decision: 'not-matched' });
    expect(admitByPolicy(policy, await statusRequest({ tokenNode: null, user: 'system:serviceaccount:kube-system:endpoint-controller', edit: (p) => (p.status.hostIP = '1.2.3.4') }))).toEqual({ decision: 'not-matched' });
  });

  describe("the webhook's lease controller", () => {
    const up = [...KUBELET_CONDITIONS, { type: GATES_CONDITION_TYPE, status: 'True' }];

    it('may set probe-agent.io/ready False on a pod of any node', async () => {
      allowed(policy, await statusRequest({ tokenNode: null, podNode: 'node-b', user: WEBHOOK, condition: 'False', old: up }));
    });

    const webhookDenied: Array<[string, Parameters<typeof statusRequest>[0], RegExp]> = [
      ['setting the gate True', { tokenNode: null, user: WEBHOOK, condition: 'True' }, rule.conditions],
      ['the Ready condition', { tokenNode: null, user: WEBHOOK, condition: 'False', old: up, edit: (p) => (p.status.conditions[0].status = 'True') }, rule.conditions],
      ['a pod IP', { tokenNode: null, user: WEBHOOK, condition: 'False', old: up, edit: (p) => (p.status.podIP = '10.0.0.9') }, rule.status],
      ['a host IP', { tokenNode: null, user: WEBHOOK, condition: 'False', old: up, edit: (p) => (p.status.hostIP = '192.0.2.99') }, rule.status],
      ['a finalizer', { tokenNode: null, user: WEBHOOK, condition: 'False', old: up, edit: (p) => (p.metadata.finalizers = ['x/y']) }, rule.metadata],
    ];
    for (const [what, req, message] of webhookDenied) {
      it(`may not change ${what}`, async () => {
        const r = await statusRequest(req);
        expect(admitByPolicy(policy, r).decision).toBe('denied');
        expect(refusedBy(policy, r)).toMatch(message);
      });
    }
  });
});

describe('the gates events policy', () => {
  const policy = events.policy;
  const rule = { identity: /as probe-agent on its own node/, pod: /about a pod in the event's namespace/, namespace: /kube-system nor in its own namespace/ };

  /** The Event ApiWriter.recordEvent sends (as node-a), then `edit`, as a CREATE by `user` with a token of `tokenNode`. */
  async function eventRequest(o: { tokenNode: string | null; namespace?: string; user?: string; edit?: (e: Obj) => void }): Promise<Obj> {
    const namespace = o.namespace ?? 'shop';
    api.events.length = 0;
    await writerA.recordEvent({ namespace, podName: 'web', podUID: 'u1', container: 'app', type: 'Warning', reason: 'Unhealthy', message: 'Liveness probe failed: HTTP probe failed with statuscode: 500' });
    const object = structuredClone(api.events[0]!);
    object.metadata.name = `web.${'187f'}`;
    o.edit?.(object);
    return {
      uid: 'r2', kind: { group: '', version: 'v1', kind: 'Event' }, resource: { group: '', version: 'v1', resource: 'events' },
      name: object.metadata.name, namespace, operation: 'CREATE', userInfo: userInfo(o.user ?? AGENT, o.tokenNode), object, oldObject: null,
    };
  }

  it('is bound with Deny and fails closed', () => {
    expect(events.binding.spec).toEqual({ policyName: policy.metadata.name, validationActions: ['Deny'] });
    expect(policy.spec.failurePolicy).toBe('Fail');
  });

  it("allows the agent's own event about a pod, in a tenant namespace", async () => {
    allowed(policy, await eventRequest({ tokenNode: 'node-a' }));
    allowed(policy, await eventRequest({ tokenNode: 'node-a', namespace: 'other-tenant' }));
  });

  const denied: Array<[string, Parameters<typeof eventRequest>[0], RegExp]> = [
    ['a token not bound to a pod', { tokenNode: null }, rule.identity],
    ["another node's token (source.host)", { tokenNode: 'node-b' }, rule.identity],
    ['another node as reportingInstance', { tokenNode: 'node-a', edit: (e) => (e.reportingInstance = 'node-b') }, rule.identity],
    ['an event signed as kubelet', { tokenNode: 'node-a', edit: (e) => (e.source.component = 'kubelet') }, rule.identity],
    ['no reporting component', { tokenNode: 'node-a', edit: (e) => delete e.reportingComponent }, rule.identity],
    ['an event about a Node', { tokenNode: 'node-a', edit: (e) => Object.assign(e.involvedObject, { kind: 'Node', name: 'node-b', namespace: '' }) }, rule.pod],
    ['an event about a pod of another namespace', { tokenNode: 'node-a', edit: (e) => (e.involvedObject.namespace = 'bank') }, rule.pod],
    ['an event with a related object', { tokenNode: 'node-a', edit: (e) => (e.related = { kind: 'Secret', namespace: 'shop', name: 'x' }) }, rule.pod],
    ['an event in kube-system', { tokenNode: 'node-a', namespace: 'kube-system' }, rule.namespace],
    ["an event in the agent's own namespace", { tokenNode: 'node-a', namespace: 'probe-agent' }, rule.namespace],
  ];
  for (const [what, req, message] of denied) {
    it(`denies ${what}, by its own rule`, async () => {
      const r = await eventRequest(req);
      expect(admitByPolicy(policy, r).decision).toBe('denied');
      expect(refusedBy(policy, r)).toMatch(message);
    });
  }

  it('does not apply to other users', async () => {
    expect(admitByPolicy(policy, await eventRequest({ tokenNode: null, user: 'system:node:node-b', namespace: 'kube-system' }))).toEqual({ decision: 'not-matched' });
  });
});

describe('the gates Lease policy', () => {
  const policy = leases.policy;
  const rule = { namespace: /only in the writer's own namespace/, name: /only write the Lease probe-agent-<its own node>/, holder: /held by its own node/ };

  /**
   * A Lease write: CREATE of what ApiWriter.renewLease creates (as node-a, the stand-in had none),
   * UPDATE of its renewal (the merge patch it sends, applied), or DELETE; named `name` in `namespace`,
   * then `edit`.
   */
  async function leaseRequest(o: { op: 'CREATE' | 'UPDATE' | 'DELETE'; tokenNode: string | null; name?: string; namespace?: string; user?: string; edit?: (l: Obj) => void }): Promise<Obj> {
    const namespace = o.namespace ?? 'probe-agent';
    const name = o.name ?? nodeLeaseName('node-a');
    api.leases.clear();
    await writerA.renewLease(namespace, name, 40);
    const created = structuredClone(api.leases.get(`${namespace}/${name}`)!);
    created.metadata = { ...created.metadata, uid: 'l1', resourceVersion: '900', creationTimestamp: '2026-12-07T05:00:00Z' };
    let object: Obj | null = created;
    let oldObject: Obj | null = null;
    if (o.op !== 'CREATE') {
      oldObject = structuredClone(created);
      await writerA.renewLease(namespace, name, 40);
      object = o.op === 'DELETE' ? null : { ...structuredClone(api.leases.get(`${namespace}/${name}`)!), metadata: created.metadata };
    }
    if (object) o.edit?.(object);
    return {
      uid: 'r3', kind: { group: 'coordination.k8s.io', version: 'v1', kind: 'Lease' }, resource: { group: 'coordination.k8s.io', version: 'v1', resource: 'leases' },
      name, namespace, operation: o.op, userInfo: userInfo(o.user ?? AGENT, o.tokenNode), object, oldObject,
    };
  }

  it('is bound with Deny and fails closed', () => {
    expect(leases.binding.spec).toEqual({ policyName: policy.metadata.name, validationActions: ['Deny'] });
    expect(policy.spec.failurePolicy).toBe('Fail');
  });

  it('allows the agent to create and renew its own Lease as api-writer.ts does (and delete it, were it granted)', async () => {
    const created = await leaseRequest({ op: 'CREATE', tokenNode: 'node-a' });
    expect(created.object.spec.holderIdentity).toBe('node-a');
    allowed(policy, created);
    const renewed = await leaseRequest({ op: 'UPDATE', tokenNode: 'node-a' });
    expect(renewed.object.spec.renewTime).not.toBe(undefined);
    allowed(policy, renewed);
    allowed(policy, await leaseRequest({ op: 'DELETE', tokenNode: 'node-a' }));
  });

  it('allows a node name whose Lease name is cut to 253 characters, as lease.ts cuts it', async () => {
    const long = `n${'x'.repeat(250)}`;
    const name = nodeLeaseName(long);
    expect(name.length).toBe(253);
    allowed(policy, await leaseRequest({ op: 'CREATE', tokenNode: long, name, edit: (l) => (l.spec.holderIdentity = long) }));
  });

  const denied: Array<[string, Parameters<typeof leaseRequest>[0], RegExp]> = [
    ["another node's Lease", { op: 'UPDATE', tokenNode: 'node-b', edit: (l) => (l.spec.holderIdentity = 'node-b') }, rule.name],
    ["creating another node's Lease (held by itself)", { op: 'CREATE', tokenNode: 'node-a', name: nodeLeaseName('node-b') }, rule.name],
    ['its own Lease with another node as holder', { op: 'UPDATE', tokenNode: 'node-a', edit: (l) => (l.spec.holderIdentity = 'node-b') }, rule.holder],
    ['its own Lease without a holder', { op: 'CREATE', tokenNode: 'node-a', edit: (l) => delete l.spec.holderIdentity }, rule.holder],
    ["deleting another node's Lease", { op: 'DELETE', tokenNode: 'node-b' }, rule.name],
  ];
  for (const [what, req, message] of denied) {
    it(`denies ${what}, by its own rule`, async () => {
      const r = await leaseRequest(req);
      expect(admitByPolicy(policy, r).decision).toBe('denied');
      expect(refusedBy(policy, r)).toMatch(message);
    });
  }

  it('denies a forged Lease probe-agent-x held by another node, by both the name and the holder rule', async () => {
    const forged = await leaseRequest({ op: 'CREATE', tokenNode: 'node-a', name: 'probe-agent-x', edit: (l) => (l.spec.holderIdentity = 'node-b') });
    expect(validationVerdicts(policy, forged).filter((v) => v.failed).map((v) => v.message)).toEqual([expect.stringMatching(rule.name), expect.stringMatching(rule.holder)]);
  });

  it("denies a node's kube-node-lease heartbeat and kube-system leader election", async () => {
    const heartbeat = await leaseRequest({ op: 'UPDATE', tokenNode: 'node-a', namespace: 'kube-node-lease', name: 'node-b', edit: (l) => (l.spec.holderIdentity = 'node-b') });
    expect(validationVerdicts(policy, heartbeat).filter((v) => v.failed).map((v) => v.message)).toEqual([
      expect.stringMatching(rule.namespace), expect.stringMatching(rule.name), expect.stringMatching(rule.holder),
    ]);
    for (const name of ['kube-controller-manager', 'kube-scheduler']) {
      const r = await leaseRequest({ op: 'UPDATE', tokenNode: 'node-a', namespace: 'kube-system', name });
      expect(admitByPolicy(policy, r)).toMatchObject({ decision: 'denied', message: expect.stringMatching(rule.namespace) });
    }
    // Even its own Lease's name, in another namespace.
    expect(refusedBy(policy, await leaseRequest({ op: 'CREATE', tokenNode: 'node-a', namespace: 'kube-node-lease' }))).toMatch(rule.namespace);
  });

  it('lets the webhook write only its leader-election Lease, in its namespace', async () => {
    allowed(policy, await leaseRequest({ op: 'CREATE', tokenNode: null, user: WEBHOOK, name: 'gates-lease-controller', edit: (l) => (l.spec.holderIdentity = 'probe-agent-webhook-5d9-x') }));
    allowed(policy, await leaseRequest({ op: 'UPDATE', tokenNode: null, user: WEBHOOK, name: 'gates-lease-controller', edit: (l) => (l.spec.holderIdentity = 'probe-agent-webhook-5d9-y') }));
    expect(refusedBy(policy, await leaseRequest({ op: 'CREATE', tokenNode: null, user: WEBHOOK, name: 'probe-agent-x', edit: (l) => (l.spec.holderIdentity = 'node-b') }))).toMatch(/the lease controller only gates-lease-controller/);
    expect(refusedBy(policy, await leaseRequest({ op: 'UPDATE', tokenNode: null, user: WEBHOOK, namespace: 'kube-system', name: 'gates-lease-controller' }))).toMatch(rule.namespace);
  });

  it('does not apply to other users (kubelet heartbeats, controllers)', async () => {
    expect(admitByPolicy(policy, await leaseRequest({ op: 'UPDATE', tokenNode: null, user: 'system:node:node-b', namespace: 'kube-node-lease', name: 'node-b' }))).toEqual({ decision: 'not-matched' });
    expect(admitByPolicy(policy, await leaseRequest({ op: 'UPDATE', tokenNode: null, user: 'system:kube-controller-manager', namespace: 'kube-system', name: 'kube-controller-manager' }))).toEqual({ decision: 'not-matched' });
  });
});
