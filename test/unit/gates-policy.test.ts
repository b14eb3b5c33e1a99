/**
 * deploy/components/gates/status-policy.yaml, run by the CEL subset evaluator as the API server runs a
 * ValidatingAdmissionPolicy: the agent's pod-bound token may change only probe-agent.io/* conditions
 * of pods on its own node; everything else is denied, each by its own rule; a missing optional field
 * never turns into an error that denies a good write. deploy/components/gates-lease/status-policy.yaml
 * likewise: the webhook's lease controller may only set probe-agent.io/* conditions False.
 */
import { describe, expect, it } from 'vitest';
import { admitByPolicy, loadPolicy, type Decision } from '../support/admission-policy.ts';

type Obj = Record<string, any>;

const { policy: agentPolicy, binding } = loadPolicy('gates/status-policy.yaml');
const policy = agentPolicy;
const { policy: leasePolicy, binding: leaseBinding } = loadPolicy('gates-lease/status-policy.yaml');

/** The API server's decision with `policy` (default the agent's) for one AdmissionRequest. */
const admit = (request: Obj, policy: Obj = agentPolicy): Decision => admitByPolicy(policy, request);

const NODE_EXTRA = 'authentication.kubernetes.io/node-name';

function pod(node: string, conditions: Obj[]): Obj {
  return {
    apiVersion: 'v1', kind: 'Pod',
    metadata: { name: 'web', namespace: 'shop', uid: 'u1', labels: { app: 'web' } },
    spec: { nodeName: node, containers: [{ name: 'app', image: 'app' }] },
    status: { phase: 'Running', podIP: '10.0.0.5', podIPs: [{ ip: '10.0.0.5' }], conditions, containerStatuses: [{ name: 'app', ready: true }] },
  };
}
const base = [{ type: 'Ready', status: 'False' }, { type: 'probe-agent.io/ready', status: 'False' }];
const flipped = [{ type: 'Ready', status: 'False' }, { type: 'probe-agent.io/ready', status: 'True', reason: 'ProbesSucceeded' }];

/** The AdmissionRequest of the agent of `tokenNode` patching a pod of `podNode`. */
function request(tokenNode: string | null, podNode: string, edit: (o: Obj) => void = (o) => (o.status.conditions = structuredClone(flipped)), user = 'system:serviceaccount:probe-agent:probe-agent'): Obj {
  const oldObject = pod(podNode, structuredClone(base));
  const object = structuredClone(oldObject);
  edit(object);
  return {
    uid: 'r1', operation: 'UPDATE', subResource: 'status',
    resource: { group: '', version: 'v1', resource: 'pods' },
    userInfo: { username: user, ...(tokenNode === null ? {} : { extra: { [NODE_EXTRA]: [tokenNode] } }) },
    object, oldObject,
  };
}

describe('the gates pod-status policy', () => {
  it('is bound with Deny and fails closed', () => {
    expect(binding.spec).toEqual({ policyName: policy.metadata.name, validationActions: ['Deny'] });
    expect(policy.spec.failurePolicy).toBe('Fail');
  });

  it('allows the agent to flip probe-agent.io/ready on a pod of its own node', () => {
    expect(admit(request('node-a', 'node-a'))).toEqual({ decision: 'allowed' });
  });

  it('allows adding the condition to a pod that has none yet, and with no optional fields at all', () => {
    expect(admit(request('node-a', 'node-a', (o) => o.status.conditions.splice(1, 1)))).toEqual({ decision: 'allowed' });
    const bare = request('node-a', 'node-a');
    for (const o of [bare.object, bare.oldObject]) {
      delete o.metadata.labels;
      delete o.status.podIP;
      delete o.status.podIPs;
      delete o.status.phase;
      delete o.status.containerStatuses;
    }
    delete bare.oldObject.status.conditions;
    bare.object.status.conditions = [flipped[1]];
    expect(admit(bare)).toEqual({ decision: 'allowed' });
  });

  const denied: Array<[string, Obj, RegExp]> = [
    ['a pod of another node', request('node-a', 'node-b'), /own node/],
    ['a token not bound to a pod (no node-name extra)', request(null, 'node-a'), /own node/],
    ['the Ready condition', request('node-a', 'node-a', (o) => (o.status.conditions[0].status = 'True')), /probe-agent.io\/\* conditions/],
    ['removing another condition', request('node-a', 'node-a', (o) => o.status.conditions.splice(0, 1)), /probe-agent.io\/\* conditions/],
    ['a label through the status subresource', request('node-a', 'node-a', (o) => (o.metadata.labels.app = 'evil')), /labels and annotations must stay/],
    ['a pod IP', request('node-a', 'node-a', (o) => (o.status.podIP = '10.0.0.9')), /phase, IPs/],
    ['a container status', request('node-a', 'node-a', (o) => (o.status.containerStatuses[0].ready = false)), /container statuses/],
  ];
  for (const [what, req, message] of denied) {
    it(`denies ${what}`, () => {
      const d = admit(req);
      expect(d.decision).toBe('denied');
      expect((d as { message: string }).message).toMatch(message);
    });
  }

  it('does not apply to other users (kubelet, controllers)', () => {
    expect(admit(request('node-a', 'node-b', undefined, 'system:node:node-b'))).toEqual({ decision: 'not-matched' });
    expect(admit(request('node-a', 'node-b', undefined, 'system:serviceaccount:kube-system:endpoint-controller'))).toEqual({ decision: 'not-matched' });
  });
});

describe("the lease controller's pod-status policy", () => {
  const WEBHOOK = 'system:serviceaccount:probe-agent:probe-agent-webhook';
  const webhookRequest = (edit: (o: Obj) => void): Obj => request(null, 'node-a', edit, WEBHOOK);
  const up = [{ type: 'Ready', status: 'True' }, { type: 'probe-agent.io/ready', status: 'True' }];
  const withOld = (r: Obj, conditions: Obj[]): Obj => {
    r.oldObject.status.conditions = structuredClone(conditions);
    return r;
  };

  it('is bound with Deny and fails closed', () => {
    expect(leaseBinding.spec).toEqual({ policyName: leasePolicy.metadata.name, validationActions: ['Deny'] });
    expect(leasePolicy.spec.failurePolicy).toBe('Fail');
  });

  it('allows the webhook to set probe-agent.io/ready False on any node', () => {
    const r = withOld(webhookRequest((o) => (o.status.conditions = [up[0], { type: 'probe-agent.io/ready', status: 'False', reason: 'NodeLeaseExpired' }])), up);
    expect(admit(r, leasePolicy)).toEqual({ decision: 'allowed' });
  });

  const denied: Array<[string, Obj, RegExp]> = [
    ['setting the gate True', webhookRequest((o) => (o.status.conditions = structuredClone(flipped))), /only set probe-agent.io\/\* conditions False/],
    ['the Ready condition', withOld(webhookRequest((o) => (o.status.conditions[0].status = 'False')), up), /only set probe-agent.io\/\* conditions False/],
    ['a pod IP', webhookRequest((o) => (o.status.podIP = '10.0.0.9')), /phase, IPs/],
  ];
  for (const [what, req, message] of denied) {
    it(`denies ${what}`, () => {
      const d = admit(req, leasePolicy);
      expect(d.decision).toBe('denied');
      expect((d as { message: string }).message).toMatch(message);
    });
  }

  it('does not apply to the agent, nor the agent\'s policy to the webhook', () => {
    expect(admit(request('node-a', 'node-a'), leasePolicy)).toEqual({ decision: 'not-matched' });
    expect(admit(webhookRequest((o) => (o.status.conditions = structuredClone(flipped))))).toEqual({ decision: 'not-matched' });
  });
});
