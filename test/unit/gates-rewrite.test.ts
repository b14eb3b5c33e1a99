/**
 * The gates-mode rewrite (agent/rewrite/gates-rewrite.ts) and its admission (agent/webhook/admission.ts):
 * network probes leave the spec and are recorded whole, exec probes and hooks stay, the readiness
 * gate is added once, the undo gives the probes back, and each pod gates mode cannot serve is left
 * as written with its reason.
 */
import { describe, expect, it } from 'vitest';
import { GATES_CONDITION, MODE_ANNOTATION, rewritePodGates } from '../../agent/rewrite/gates-rewrite.ts';
import { transformObject } from '../../agent/rewrite/objects.ts';
import { ORIGINAL_HANDLERS_ANNOTATION, rewritePod, undoPod } from '../../agent/rewrite/pod-rewrite.ts';
import { admit, MUTATE_GATES_PATH, REVIEWED_ANNOTATION } from '../../agent/webhook/admission.ts';
import { applyJsonPatch } from '../support/json-patch-apply.ts';

type Obj = Record<string, any>;

const readiness = { httpGet: { path: '/ready', port: 8080 }, periodSeconds: 2, failureThreshold: 1 };
const liveness = { tcpSocket: { port: 'http' }, initialDelaySeconds: 1, terminationGracePeriodSeconds: 5 };
const startup = { grpc: { port: 9000 }, failureThreshold: 30 };
const execProbe = { exec: { command: ['true'] } };
const preStop = { httpGet: { path: '/drain', port: 8080 } };

function pod(spec: Obj = {}, metadata: Obj = { name: 'p', namespace: 'ns' }): Obj {
  return {
    metadata,
    spec: {
      containers: [{ name: 'web', image: 'nginx', ports: [{ name: 'http', containerPort: 8080 }], readinessProbe: readiness, livenessProbe: liveness, startupProbe: startup, lifecycle: { preStop } }],
      initContainers: [{ name: 'side', image: 'envoy', restartPolicy: 'Always', readinessProbe: execProbe, livenessProbe: { httpGet: { port: 15021, path: '/healthz' } } }],
      ...spec,
    },
  };
}

const record = (p: Obj): Obj => JSON.parse(p.metadata.annotations[ORIGINAL_HANDLERS_ANNOTATION]);

describe('rewritePodGates', () => {
  it('takes the network probes out, records them whole, keeps exec probes and hooks, adds the gate', () => {
    const input = pod();
    const before = structuredClone(input);
    const { pod: out, changed } = rewritePodGates(input) as { pod: Obj; changed: boolean };
    expect(changed).toBe(true);
    expect(input).toEqual(before);
    const web = out.spec.containers[0];
    expect(web.readinessProbe).toBeUndefined();
    expect(web.livenessProbe).toBeUndefined();
    expect(web.startupProbe).toBeUndefined();
    expect(web.lifecycle).toEqual({ preStop });
    const side = out.spec.initContainers[0];
    expect(side.readinessProbe).toEqual(execProbe);
    expect(side.livenessProbe).toBeUndefined();
    expect(out.spec.readinessGates).toEqual([{ conditionType: GATES_CONDITION }]);
    const rec = record(out);
    expect(rec.mode).toBe('gates');
    expect(rec.handlers).toEqual({ 'web/livenessProbe': liveness, 'web/readinessProbe': readiness, 'web/startupProbe': startup, 'side/livenessProbe': { httpGet: { port: 15021, path: '/healthz' } } });
    expect(rec.added).toEqual(['/spec/readinessGates', '/metadata/annotations']);
  });

  it('undo gives the probes back and removes the gate and the record', () => {
    const input = pod();
    const undone = undoPod(rewritePodGates(input).pod);
    expect(undone.changed).toBe(true);
    expect(undone.pod).toEqual(input);
  });

  it('keeps a gate the user wrote and adds ours after it; idempotent', () => {
    const input = pod({ readinessGates: [{ conditionType: 'example.com/warm' }] });
    const once = rewritePodGates(input).pod as Obj;
    expect(once.spec.readinessGates).toEqual([{ conditionType: 'example.com/warm' }, { conditionType: GATES_CONDITION }]);
    const twice = rewritePodGates(once);
    expect(twice.changed).toBe(false);
    expect(undoPod(once).pod).toEqual(input);
  });

  it('leaves a pod with only exec probes alone', () => {
    const input = { metadata: { name: 'x' }, spec: { containers: [{ name: 'a', readinessProbe: execProbe }] } };
    expect(rewritePodGates(input)).toEqual({ pod: input, changed: false });
  });

  const refusals: Array<[string, Obj, RegExp]> = [
    ['a static (mirror) pod', pod({}, { name: 'p', annotations: { 'kubernetes.io/config.mirror': 'abc' } }), /static \(mirror\) pod/],
    ['restartPolicy OnFailure with a liveness probe', pod({ restartPolicy: 'OnFailure' }), /restartPolicy OnFailure/],
    ['restartPolicy Never with a startup probe', { spec: { restartPolicy: 'Never', containers: [{ name: 'a', startupProbe: startup }] } }, /restartPolicy Never/],
    ['a sandboxed runtime class', pod({ runtimeClassName: 'kata-qemu' }), /sandboxed/],
    ['hostNetwork', pod({ hostNetwork: true }), /hostNetwork/],
    ['a foreign host', { spec: { containers: [{ name: 'a', readinessProbe: { httpGet: { host: '10.0.0.1', port: 80 } } }] } }, /own addresses/],
  ];
  for (const [what, input, reason] of refusals) {
    it(`leaves ${what} as written, with the reason`, () => {
      const r = rewritePodGates(input);
      expect(r.changed).toBe(false);
      expect(r.pod).toBe(input);
      expect(r.skipped).toMatch(reason);
    });
  }

  it('serves OnFailure pods whose only network probes are readiness (nothing is stopped)', () => {
    const r = rewritePodGates({ spec: { restartPolicy: 'OnFailure', containers: [{ name: 'a', readinessProbe: readiness }] } });
    expect(r.changed).toBe(true);
  });

  it('takes the refused runtime classes from the caller', () => {
    expect(rewritePodGates(pod({ runtimeClassName: 'fast' }), '', { sandboxedRuntimeClasses: ['fast'] }).skipped).toMatch(/sandboxed/);
    expect(rewritePodGates(pod({ runtimeClassName: 'kata' }), '', { sandboxedRuntimeClasses: ['fast'] }).changed).toBe(true);
    expect(rewritePodGates(pod({ runtimeClassName: 'secure' }), '', { runtimeHandlers: new Map([['secure', 'runsc']]) }).skipped).toMatch(/sandboxed/);
  });

  it('the two modes never stack: a shim pod is not taken for gates, a gates pod is not rewritten for the shim', () => {
    const shim = rewritePod(pod()).pod;
    expect(rewritePodGates(shim).skipped).toMatch(/kubelet shim already/);
    const gates = rewritePodGates(pod()).pod;
    const again = rewritePod(gates);
    expect(again.changed).toBe(false);
    expect(again.skipped).toMatch(/gates mode/);
  });

  it('rewrites workload templates from manifests, DaemonSets included (no node affinity in gates mode)', () => {
    for (const kind of ['Deployment', 'DaemonSet']) {
      const obj = { apiVersion: 'apps/v1', kind, metadata: { name: 'd' }, spec: { template: pod() } };
      const r = transformObject(obj, 'rewrite', '', { mode: 'gates' }) as { object: Obj; changed: boolean };
      expect(r.changed).toBe(true);
      expect(r.object.spec.template.spec.readinessGates).toEqual([{ conditionType: GATES_CONDITION }]);
      expect(r.object.spec.template.spec.affinity).toBeUndefined();
      expect(transformObject(r.object, 'undo').object).toEqual(obj);
    }
  });
});

describe('admission in gates mode', () => {
  const review = (object: Obj, operation = 'CREATE', oldObject?: Obj): Obj => ({
    apiVersion: 'admission.k8s.io/v1',
    kind: 'AdmissionReview',
    request: { uid: 'u1', kind: { group: '', version: 'v1', kind: 'Pod' }, resource: { group: '', version: 'v1', resource: 'pods' }, operation, object, ...(oldObject ? { oldObject } : {}) },
  });
  const patched = (input: Obj, d: Awaited<ReturnType<typeof admit>>): Obj =>
    applyJsonPatch(input, JSON.parse(Buffer.from(d.review.response.patch!, 'base64').toString('utf8'))) as Obj;

  it('the gates path rewrites for gates; the patch gives the rewrite', async () => {
    expect(MUTATE_GATES_PATH).toBe('/mutate-gates');
    const input = pod();
    const d = await admit(review(input), 'gates');
    expect(d.outcome).toBe('rewritten');
    // The rewrite, and the webhook's review mark (the unreviewed-pod policy's) with its outcome.
    const want = rewritePodGates(input).pod as Record<string, any>;
    want.metadata.annotations[REVIEWED_ANNOTATION] = 'rewritten';
    expect(patched(input, d)).toEqual(want);
  });

  it('a pod bound to its node at creation is served (gates mode needs no scheduler)', async () => {
    const d = await admit(review(pod({ nodeName: 'n1' })), 'gates');
    expect(d.outcome).toBe('rewritten');
  });

  it('the pod annotation chooses the mode on either path', async () => {
    const asGates = pod({}, { name: 'p', annotations: { [MODE_ANNOTATION]: 'gates' } });
    const d1 = await admit(review(asGates), 'all');
    expect(patched(asGates, d1).spec.readinessGates).toEqual([{ conditionType: GATES_CONDITION }]);
    const asShim = pod({}, { name: 'p', annotations: { [MODE_ANNOTATION]: 'shim' } });
    const d2 = await admit(review(asShim), 'gates');
    expect(patched(asShim, d2).spec.readinessGates).toBeUndefined();
    expect(patched(asShim, d2).spec.containers[0].readinessProbe.exec).toBeDefined();
  });

  it('a refusal is allowed unchanged, with a warning and its own outcome', async () => {
    const d = await admit(review(pod({ restartPolicy: 'Never' })), 'gates');
    expect(d.outcome).toBe('gates-refused');
    // Only the review mark: the pod is not refused by the unreviewed-pod policy, and runs as written.
    const input = pod({ restartPolicy: 'Never' }) as Record<string, any>;
    expect(patched(input, d)).toEqual({ ...input, metadata: { ...input.metadata, annotations: { ...input.metadata.annotations, [REVIEWED_ANNOTATION]: 'gates-refused' } } });
    expect(d.review.response.warnings?.[0]).toMatch(/^probe-agent: gates mode: probes left unchanged: restartPolicy Never/);
  });

  it('the configured runtime classes are refused', async () => {
    const d = await admit(review(pod({ runtimeClassName: 'fast' })), 'gates', { gatesRefusedRuntimeClasses: ['fast'] });
    expect(d.outcome).toBe('gates-refused');
  });

  it('an UPDATE of a gates pod is left alone', async () => {
    const rewritten = rewritePodGates(pod()).pod;
    const d = await admit(review(rewritten, 'UPDATE', rewritten), 'gates');
    expect(d.outcome).toBe('skipped');
    expect(d.review.response.patch).toBeUndefined();
  });
});
