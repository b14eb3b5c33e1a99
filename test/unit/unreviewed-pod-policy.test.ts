/**
 * The rewrite webhook's ValidatingAdmissionPolicy (deploy/components/rewrite-webhook/
 * unreviewed-pod-policy.yaml): an opted-in pod that the webhook did not review (its review failed
 * open) is refused, so its controller creates it again; every pod the webhook did decide passes,
 * whatever the decision. The pods here are what the API server would hold after the mutating phase:
 * the pod as written (the webhook failed), or the pod with the webhook's own answer applied (the
 * real admission code, agent/webhook/admission.ts). The policy's CEL, read from the YAML the
 * component ships, is evaluated by the repo's CEL subset with the API server's steps
 * (test/support/admission-policy.ts): resource rules and namespaceSelector, lazy variables,
 * matchConditions (without variables or the namespace, as a real v1.33 API server runs them),
 * validations, failurePolicy.
 * Not covered: the API server's compiler and cost limits (a real v1.33 control plane is
 * test/e2e-cluster).
 */
import { describe, expect, it } from 'vitest';
import { admit as webhookAdmit, MUTATE_ANNOTATED_PATH, MUTATE_GATES_PATH, MUTATE_PATH } from '../../agent/webhook/admission.ts';
import { admitByPolicy, loadPolicy, type Decision } from '../support/admission-policy.ts';
import { applyJsonPatch } from '../support/json-patch-apply.ts';

type Obj = Record<string, any>;

const { policy, binding } = loadPolicy('rewrite-webhook/unreviewed-pod-policy.yaml');

function namespace(name: string, labels: Record<string, string> = {}): Obj {
  return { apiVersion: 'v1', kind: 'Namespace', metadata: { name, labels: { 'kubernetes.io/metadata.name': name, ...labels } } };
}

/** The API server's decision with this policy for one pod `operation` in `ns`. */
function policyAdmit(pod: Obj, ns: Obj, operation = 'CREATE'): Decision {
  const request = { operation, namespace: ns.metadata.name, resource: { group: '', version: 'v1', resource: 'pods' }, object: pod };
  return admitByPolicy(policy, request, ns);
}

const OPTED_IN = namespace('shop', { 'probe-agent.io/rewrite': 'enabled' });
const PLAIN = namespace('blog');
const GATES = namespace('shop', { 'probe-agent.io/mode': 'gates' });

function pod(extra: { annotations?: Record<string, string>; spec?: Obj } = {}): Obj {
  return {
    apiVersion: 'v1', kind: 'Pod',
    metadata: { generateName: 'web-', namespace: 'shop', ...(extra.annotations ? { annotations: extra.annotations } : {}) },
    spec: { containers: [{ name: 'web', image: 'nginx', readinessProbe: { httpGet: { path: '/', port: 80 } } }], ...extra.spec },
  };
}

/** The pod after the webhook's answer on `route`: what the API server stores when the review succeeds. */
async function reviewed(p: Obj, route: string = MUTATE_PATH): Promise<Obj> {
  const review = {
    apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview',
    request: { uid: 'u-1', kind: { group: '', version: 'v1', kind: 'Pod' }, resource: { group: '', version: 'v1', resource: 'pods' }, namespace: 'shop', operation: 'CREATE', object: p, oldObject: null },
  };
  const { review: answer } = await webhookAdmit(review, route === MUTATE_PATH ? 'all' : route === MUTATE_GATES_PATH ? 'gates' : 'annotated');
  const r = answer.response;
  return r.patch ? applyJsonPatch(structuredClone(p), JSON.parse(Buffer.from(r.patch, 'base64').toString('utf8'))) : p;
}

const REFUSED = { decision: 'denied', message: expect.stringMatching(/^probe-agent: the rewrite webhook did not review this pod/) };

describe('the unreviewed-pod policy', () => {
  it('is a Deny binding on CREATE of pods, failing open on its own errors', () => {
    expect(binding.spec).toEqual({ policyName: policy.metadata.name, validationActions: ['Deny'] });
    expect(policy.spec.failurePolicy).toBe('Ignore');
    expect(policy.spec.matchConstraints.resourceRules).toEqual([{ apiGroups: [''], apiVersions: ['v1'], operations: ['CREATE'], resources: ['pods'] }]);
  });

  it('refuses an opted-in pod whose review failed (the pod as written), by namespace or by annotation', () => {
    expect(policyAdmit(pod(), OPTED_IN)).toEqual(REFUSED);
    expect(policyAdmit(pod({ annotations: { 'probe-agent.io/rewrite': 'enabled' } }), PLAIN)).toEqual(REFUSED);
    // Without probes too: it would miss the closed-hole toleration all the same.
    expect(policyAdmit({ ...pod(), spec: { containers: [{ name: 'a', image: 'i' }] } }, OPTED_IN)).toEqual(REFUSED);
  });

  it('allows every pod the webhook decided, whatever the decision', async () => {
    const cases: Array<[string, Obj, string]> = [
      ['rewritten', pod(), MUTATE_PATH],
      ['no probes: toleration only', { ...pod(), spec: { containers: [{ name: 'a', image: 'i' }] } }, MUTATE_PATH],
      ['left to kubelet (loopback host)', pod({ spec: { containers: [{ name: 'a', image: 'i', livenessProbe: { httpGet: { host: '10.0.0.1', port: 1 } } }] } }), MUTATE_PATH],
      ['refused by the rewrite (two handlers)', pod({ spec: { containers: [{ name: 'a', image: 'i', livenessProbe: { httpGet: { port: 1 }, tcpSocket: { port: 2 } } }] } }), MUTATE_PATH],
      ['no metadata.annotations at all', { apiVersion: 'v1', kind: 'Pod', metadata: { name: 'bare' }, spec: { containers: [{ name: 'a', image: 'i' }] } }, MUTATE_PATH],
      ['annotated in another namespace', pod({ annotations: { 'probe-agent.io/rewrite': 'enabled' } }), MUTATE_ANNOTATED_PATH],
    ];
    for (const [name, p, route] of cases) {
      expect(policyAdmit(p, route === MUTATE_PATH ? OPTED_IN : PLAIN), `${name}, as written`).toEqual(REFUSED);
      const after = await reviewed(p, route);
      expect(after.metadata.annotations['probe-agent.io/reviewed'], name).toMatch(/^(rewritten|unchanged|skipped|refused)$/);
      expect(policyAdmit(after, route === MUTATE_PATH ? OPTED_IN : PLAIN), name).toEqual({ decision: 'allowed' });
    }
  });

  it('covers gates namespaces too: refused as written, allowed once the gates webhook decided', async () => {
    const cases: Array<[string, Obj]> = [
      ['rewritten to a readiness gate', pod()],
      ['no network probes', { ...pod(), spec: { containers: [{ name: 'a', image: 'i' }] } }],
      ['left to kubelet (liveness with restartPolicy Never)', pod({ spec: { restartPolicy: 'Never', containers: [{ name: 'a', image: 'i', livenessProbe: { tcpSocket: { port: 1 } } }] } })],
    ];
    for (const [name, p] of cases) {
      expect(policyAdmit(p, GATES), `${name}, as written`).toEqual(REFUSED);
      const after = await reviewed(p, MUTATE_GATES_PATH);
      expect(after.metadata.annotations['probe-agent.io/reviewed'], name).toMatch(/^(rewritten|unchanged|gates-refused)$/);
      expect(policyAdmit(after, GATES), name).toEqual({ decision: 'allowed' });
    }
    expect(policyAdmit(pod(), namespace('shop', { 'probe-agent.io/mode': 'shim' }))).toEqual({ decision: 'allowed' });
  });

  it('leaves alone what the webhook leaves alone: other namespaces, opted-out pods, bound pods, kube-system, its own namespace', () => {
    expect(policyAdmit(pod(), PLAIN)).toEqual({ decision: 'allowed' });
    expect(policyAdmit(pod({ annotations: { 'probe-agent.io/rewrite': 'disabled' } }), OPTED_IN)).toEqual({ decision: 'not-matched' });
    expect(policyAdmit(pod({ spec: { nodeName: 'node-a' } }), OPTED_IN)).toEqual({ decision: 'not-matched' });
    expect(policyAdmit(pod(), namespace('kube-system', { 'probe-agent.io/rewrite': 'enabled' }))).toEqual({ decision: 'not-matched' });
    expect(policyAdmit(pod({ annotations: { 'probe-agent.io/rewrite': 'enabled' } }), namespace('probe-agent'))).toEqual({ decision: 'not-matched' });
    expect(policyAdmit(pod(), OPTED_IN, 'UPDATE')).toEqual({ decision: 'not-matched' });
  });
});
