/**
 * The shim installer's ValidatingAdmissionPolicy (deploy/components/kubelet-shim/node-label-policy.yaml):
 * the installer's service account may change only the probe-agent.io/shim label, only on the node
 * its own pod runs on. There is no API server here, so the policy's own CEL expressions, read from
 * the YAML the component ships, are evaluated by a small CEL evaluator (test/support/cel-subset.ts)
 * against a real-shaped AdmissionRequest (test/fixtures/admission/installer-node-label-patch.json:
 * a JSON merge patch of the label by the installer's pod-bound token on node-a) and variants of it.
 *
 * Covered: the logic of the matchConstraints' resource rules, the matchCondition, the variables and
 * every validation, with the policy's failurePolicy applied to evaluation errors; that the component
 * ships the policy and a Deny binding for it. Not covered: the API server's CEL compiler and type
 * checker (a policy that does not compile is refused at apply time), its cost limits, how it builds
 * `request` from the AdmissionRequest, and that the service account token carries the node-name
 * extra (Kubernetes >= 1.30): a token without it is denied (tested), so the failure is closed.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { admitByPolicy, loadPolicy, type Decision } from '../support/admission-policy.ts';
import { CelError, cel } from '../support/cel-subset.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
type Obj = Record<string, any>;

const { policy, binding } = loadPolicy('kubelet-shim/node-label-policy.yaml');
const fixture = (): Obj => JSON.parse(readFileSync(path.join(ROOT, 'test/fixtures/admission/installer-node-label-patch.json'), 'utf8'));

/** The API server's decision with this policy for one AdmissionRequest. */
const admit = (request: Obj): Decision => admitByPolicy(policy, request);

/** The fixture with `edit` applied to its new object. */
function withNew(edit: (o: Obj) => void, req = fixture()): Obj {
  edit(req.object);
  return req;
}

describe('the shim installer node policy', () => {
  it('is shipped by the kubelet-shim component with a Deny binding', () => {
    // A component patches the base's DaemonSet, so it renders only on top of the base.
    const dir = mkdtempSync(path.join(tmpdir(), 'installer-policy-'));
    let out: string;
    try {
      const rel = (p: string): string => path.relative(dir, path.join(ROOT, 'deploy', p));
      writeFileSync(path.join(dir, 'kustomization.yaml'), `resources: [${rel('base')}]\ncomponents: [${rel('components/kubelet-shim')}]\n`);
      out = execFileSync('kubectl', ['kustomize', dir], { encoding: 'utf8' });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
    const kinds = parseAllDocuments(out).map((d) => (d.toJS() as Obj).kind);
    expect(kinds).toContain('ValidatingAdmissionPolicy');
    expect(kinds).toContain('ValidatingAdmissionPolicyBinding');
    expect(binding.spec).toEqual({ policyName: policy.metadata.name, validationActions: ['Deny'] });
    expect(policy.spec.failurePolicy).toBe('Fail');
  });

  it('allows the installer to set and to remove the shim label on its own node', () => {
    expect(admit(fixture())).toEqual({ decision: 'allowed' });
    const removal = fixture();
    [removal.object, removal.oldObject] = [removal.oldObject, removal.object];
    expect(admit(removal)).toEqual({ decision: 'allowed' });
    // A node that had no labels at all (has() and the empty-map defaults).
    const bare = fixture();
    delete bare.oldObject.metadata.labels;
    bare.object.metadata.labels = { 'probe-agent.io/shim': 'ready' };
    expect(admit(bare)).toEqual({ decision: 'allowed' });
  });

  it("denies the same patch of another node (the pod's node-name extra does not name it)", () => {
    const other = fixture();
    for (const o of [other.object, other.oldObject]) o.metadata.name = 'node-b';
    other.name = 'node-b';
    expect(admit(other)).toEqual({ decision: 'denied', message: 'the shim installer may only change the node its own pod runs on' });
  });

  it('denies a token without the node-name extra (pre-1.30 tokens, or a token not bound to a pod)', () => {
    const req = fixture();
    delete req.userInfo.extra['authentication.kubernetes.io/node-name'];
    expect(admit(req)).toMatchObject({ decision: 'denied', message: 'the shim installer may only change the node its own pod runs on' });
    const none = fixture();
    delete none.userInfo.extra;
    expect(admit(none)).toMatchObject({ decision: 'denied' });
  });

  it('denies any other change on its own node: labels, taints, unschedulable, annotations, finalizers', () => {
    const label = 'the shim installer may only change the probe-agent.io/shim label';
    const cases: Array<[string, (o: Obj) => void, string]> = [
      ['another label added', (o) => (o.metadata.labels['node-role.kubernetes.io/control-plane'] = ''), label],
      ['another label changed', (o) => (o.metadata.labels['topology.kubernetes.io/zone'] = 'europe-west1-c'), label],
      ['another label removed', (o) => delete o.metadata.labels['kubernetes.io/hostname'], label],
      ['a taint', (o) => (o.spec.taints = [{ key: 'evil', effect: 'NoSchedule' }]), `${label} (spec, annotations, finalizers and owners must stay as they are)`],
      ['cordon', (o) => (o.spec.unschedulable = true), `${label} (spec, annotations, finalizers and owners must stay as they are)`],
      ['an annotation', (o) => (o.metadata.annotations['kubeadm.alpha.kubernetes.io/cri-socket'] = 'unix:///tmp/evil.sock'), `${label} (spec, annotations, finalizers and owners must stay as they are)`],
      ['a finalizer', (o) => (o.metadata.finalizers = ['example.com/hold']), `${label} (spec, annotations, finalizers and owners must stay as they are)`],
    ];
    for (const [what, edit, message] of cases) expect(admit(withNew(edit)), what).toEqual({ decision: 'denied', message });
  });

  it('denies create, delete and subresources to the installer', () => {
    const del = fixture();
    del.operation = 'DELETE';
    del.object = null;
    del.options = { kind: 'DeleteOptions', apiVersion: 'meta.k8s.io/v1' };
    expect(admit(del)).toMatchObject({ decision: 'denied' });
    const create = fixture();
    create.operation = 'CREATE';
    create.oldObject = null;
    expect(admit(create)).toMatchObject({ decision: 'denied' });
    const status = fixture();
    status.subResource = 'status';
    expect(admit(status)).toMatchObject({ decision: 'denied' });
  });

  it('does not apply to anyone else (kubelet, the node controller, an admin), nor to other resources', () => {
    const kubelet = fixture();
    kubelet.userInfo = { username: 'system:node:node-a', groups: ['system:nodes', 'system:authenticated'] };
    expect(admit(withNew((o) => (o.spec.taints = [{ key: 'x', effect: 'NoSchedule' }]), kubelet))).toEqual({ decision: 'not-matched' });
    const admin = fixture();
    admin.userInfo = { username: 'kubernetes-admin', groups: ['kubeadm:cluster-admins', 'system:authenticated'] };
    expect(admit(admin)).toEqual({ decision: 'not-matched' });
    // Another namespace's account of the same name is held to the same rule (the policy only takes rights away).
    const renamed = fixture();
    renamed.userInfo.username = 'system:serviceaccount:platform:probe-agent-shim-installer';
    expect(admit(withNew((o) => (o.spec.unschedulable = true), renamed))).toMatchObject({ decision: 'denied' });
    const pod = fixture();
    pod.resource = { group: '', version: 'v1', resource: 'pods' };
    expect(admit(pod)).toEqual({ decision: 'not-matched' });
  });
});

describe('the CEL subset evaluator (the tool the policy test relies on)', () => {
  it("follows CEL's rules on the points the policy depends on", () => {
    expect(cel("{'a': 1} == {'a': 1} && [1, 2] != [2, 1]", {})).toBe(true);
    expect(cel("'k' in {'k': 'v'} && !('x' in {'k': 'v'}) && 'b' in ['a', 'b']", {})).toBe(true);
    expect(() => cel("{'k': 'v'}['x']", {})).toThrow(CelError);
    // Logical operators absorb an error when the other side decides.
    expect(cel("{'k': 'v'}['x'] == 'v' || true", {})).toBe(true);
    expect(cel("false && {'k': 'v'}['x'] == 'v'", {})).toBe(false);
    expect(() => cel("{'k': 'v'}['x'] == 'v' || false", {})).toThrow(CelError);
    expect(cel("{'a': 1, 'b': 2}.all(k, k in ['a', 'b']) && ![1, 2].all(x, x == 1) && [1, 2].exists(x, x == 2)", {})).toBe(true);
    expect(cel('has(o.a) && !has(o.b) && size(o) == 1', { o: { a: null } })).toBe(true);
    expect(cel("true ? 'x' : y", {})).toBe('x');
    expect(() => cel('o.a', { o: null })).toThrow(CelError);
    expect(() => cel("o.matches('x')", { o: 'x' })).toThrow(SyntaxError);
  });
});
