/**
 * Pods injected by Istio's sidecar injector go through our rewrite whichever webhook runs first
 * (docs/rewrite.md, "Service meshes (Istio)"). Istio's side is a test-only stand-in
 * (test/support/istio-injector.ts) checked against the hand-written Istio-shaped fixtures
 * (test/fixtures/rewrite/istio-*.yaml); our side is the webhook's admission function, its JSON
 * patch applied by the independent RFC 6902 implementation, and the built CLI.
 *
 * - Istio first: the app's probes already point at pilot-agent (:15020 /app-health/...); we turn
 *   them and istio-proxy's own probes into shim commands aimed at the same place, leave
 *   ISTIO_KUBE_APP_PROBERS as Istio wrote it, and the undo gives back Istio's form;
 * - ours first: Istio leaves our exec probes alone and adds istio-proxy with network probes; the
 *   API server re-invokes our webhook (reinvocationPolicy: IfNeeded), which rewrites only those,
 *   merges the record and adds no second affinity or toleration; a further call is a no-op.
 */
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { parse, parseAllDocuments } from 'yaml';
import { transformObject } from '../../agent/rewrite/objects.ts';
import { ORIGINAL_HANDLERS_ANNOTATION } from '../../agent/rewrite/pod-rewrite.ts';
import { CLOSED_HOLE_TOLERATION, SHIM_AFFINITY_REQUIREMENT } from '../../agent/rewrite/placement.ts';
import { decodeShimCommand } from '../../agent/contract/shim-command.ts';
import { admit, REVIEWED_ANNOTATION } from '../../agent/webhook/admission.ts';
import { builtCli, REPO } from '../support/built-cli.ts';
import { appProbers, containerOf, istioInject, ISTIO_PROXY, REWRITE_APP_PROBERS_ANNOTATION } from '../support/istio-injector.ts';
import { applyJsonPatch } from '../support/json-patch-apply.ts';

type Obj = Record<string, any>;
const FIXTURES = path.join(REPO, 'test/fixtures/rewrite');
const fixture = (name: string): Obj => parse(readFileSync(path.join(FIXTURES, name), 'utf8'));
const APP = 'istio-app-pod.yaml';
const SIDECAR = 'istio-sidecar-injected.yaml';
const NATIVE = 'istio-native-sidecar-injected.yaml';

let uid = 0;
function review(pod: Obj): Obj {
  return {
    apiVersion: 'admission.k8s.io/v1',
    kind: 'AdmissionReview',
    request: {
      uid: `mesh-${++uid}`,
      kind: { group: '', version: 'v1', kind: 'Pod' },
      resource: { group: '', version: 'v1', resource: 'pods' },
      namespace: pod.metadata?.namespace ?? 'shop',
      operation: 'CREATE',
      object: pod,
    },
  };
}

/**
 * What the API server does with one call of our webhook: the pod after our patch, and the patch,
 * both without the review mark (its last operation, on every pod decided at creation: the
 * unreviewed-pod policy's business, unreviewed-pod-policy.test.ts), so they compare with the CLI's rewrite.
 */
async function throughWebhook(pod: Obj): Promise<{ pod: Obj; ops: Obj[]; outcome: string }> {
  const decision = await admit(review(pod), 'all');
  const response = decision.review.response;
  expect(response.allowed).toBe(true);
  expect(response.warnings).toBeUndefined();
  const all = JSON.parse(Buffer.from(response.patch!, 'base64').toString('utf8')) as Obj[];
  const mark = all.pop()!;
  const marked = applyJsonPatch(pod, [...all, mark]) as Obj;
  expect(marked.metadata.annotations[REVIEWED_ANNOTATION]).toBe(decision.outcome);
  return { pod: applyJsonPatch(pod, all) as Obj, ops: all, outcome: decision.outcome };
}

const PROBES = ['livenessProbe', 'readinessProbe', 'startupProbe'];
const HOOKS = ['postStart', 'preStop'];
const NETWORK = ['httpGet', 'tcpSocket', 'grpc'];

/** Every probe and hook of the pod as `<container>/<field>` -> the handler object holding it. */
function slots(pod: Obj): Map<string, Obj> {
  const out = new Map<string, Obj>();
  for (const c of [...(pod.spec.initContainers ?? []), ...pod.spec.containers]) {
    for (const f of PROBES) if (c[f]) out.set(`${c.name}/${f}`, c[f]);
    for (const f of HOOKS) if (c.lifecycle?.[f]) out.set(`${c.name}/lifecycle/${f}`, c.lifecycle[f]);
  }
  return out;
}

/** The slots kubelet would still run over the network (node->pod), sorted. */
const networkSlots = (pod: Obj): string[] => [...slots(pod)].filter(([, h]) => NETWORK.some((k) => h[k])).map(([k]) => k).sort();

/** The handler a slot's shim command carries (throws when the slot is not a shim command). */
function commandOf(pod: Obj, key: string): Obj {
  const decoded = decodeShimCommand(slots(pod).get(key)!.exec.command);
  if (!decoded) throw new Error(`${key} is not a probe-agent command`);
  return decoded.handler;
}

const recordOf = (pod: Obj): Obj => JSON.parse(pod.metadata.annotations[ORIGINAL_HANDLERS_ANNOTATION]);
const closedHoleTolerations = (pod: Obj): number => (pod.spec.tolerations ?? []).filter((t: Obj) => JSON.stringify(t) === JSON.stringify(CLOSED_HOLE_TOLERATION)).length;
function shimRequirementsPerTerm(pod: Obj): number[] {
  const terms = pod.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms as Obj[];
  return terms.map((t) => (t.matchExpressions ?? []).filter((e: Obj) => JSON.stringify(e) === JSON.stringify(SHIM_AFFINITY_REQUIREMENT)).length);
}

describe('the Istio stand-in and the Istio-shaped fixtures', () => {
  it('injecting the app pod gives the hand-written sidecar fixture, and the native, no-rewrite one', () => {
    const app = fixture(APP);
    expect(istioInject(app)).toEqual(fixture(SIDECAR));
    const optedOut = { ...app, metadata: { ...app.metadata, name: 'shop-web-native', annotations: { [REWRITE_APP_PROBERS_ANNOTATION]: 'false' } } };
    expect(istioInject(optedOut, { native: true })).toEqual(fixture(NATIVE));
    // Istio hands pilot-agent the originals (named ports resolved) and leaves exec probes alone.
    expect(Object.keys(appProbers(fixture(SIDECAR))!)).toEqual(['/app-health/web/readyz', '/app-health/web/livez', '/app-health/web/startupz', '/app-health/web/prestopz']);
    expect(containerOf(fixture(SIDECAR), 'worker')!.livenessProbe).toEqual(app.spec.containers[1].livenessProbe);
  });
});

describe('Istio first, then our webhook', () => {
  it('turns every network probe and hook into a shim command aimed where Istio aimed it, and leaves ISTIO_KUBE_APP_PROBERS as Istio wrote it', async () => {
    const injected = fixture(SIDECAR);
    expect(networkSlots(injected)).toEqual(['istio-proxy/readinessProbe', 'web/lifecycle/preStop', 'web/livenessProbe', 'web/readinessProbe', 'web/startupProbe']);
    const { pod, outcome } = await throughWebhook(injected);
    expect(outcome).toBe('rewritten');
    expect(networkSlots(pod)).toEqual([]);
    // The agent probes pilot-agent's port inside the pod netns; pilot-agent probes the app.
    for (const [key, suffix] of [['web/livenessProbe', 'livez'], ['web/readinessProbe', 'readyz'], ['web/startupProbe', 'startupz'], ['web/lifecycle/preStop', 'prestopz']] as const) {
      expect(commandOf(pod, key).httpGet).toMatchObject({ path: `/app-health/web/${suffix}`, port: 15020 });
    }
    // Istio keeps the probe's headers on its rewritten probe: their values stay out of the command.
    expect(commandOf(pod, 'web/livenessProbe').httpGet.httpHeaders).toEqual([{ name: 'X-Probe-Token', valueFrom: 'annotation' }]);
    expect(commandOf(pod, 'istio-proxy/readinessProbe')).toEqual({ httpGet: { path: '/healthz/ready', port: 15021 } });
    expect(containerOf(pod, 'worker')).toEqual(containerOf(injected, 'worker'));
    expect(containerOf(pod, ISTIO_PROXY)!.env).toEqual(containerOf(injected, ISTIO_PROXY)!.env);
    expect(appProbers(pod)).toEqual(appProbers(injected));
    expect(closedHoleTolerations(pod)).toBe(1);
    expect(shimRequirementsPerTerm(pod)).toEqual([1]);
    // The undo gives back Istio's form, and a second call of our webhook changes nothing.
    expect(transformObject(pod, 'undo').object).toEqual(injected);
    expect((await throughWebhook(pod)).ops).toEqual([]);
  });

  it('the CLI does the same to the manifest, and --undo gives the file back byte for byte', () => {
    const cli = builtCli();
    const file = path.join(FIXTURES, SIDECAR);
    const rewritten = spawnSync(cli, ['rewrite', '-f', file], { encoding: 'utf8' });
    expect(rewritten.stderr).toBe('');
    expect(rewritten.status).toBe(0);
    const docs = parseAllDocuments(rewritten.stdout).map((d) => d.toJS() as Obj);
    expect(docs).toHaveLength(1);
    const pod = docs[0]!;
    expect(networkSlots(pod)).toEqual([]);
    expect(commandOf(pod, 'web/readinessProbe')).toEqual({ httpGet: { path: '/app-health/web/readyz', port: 15020 } });
    expect(appProbers(pod)).toEqual(appProbers(fixture(SIDECAR)));
    const undone = spawnSync(cli, ['rewrite', '--undo', '-f', '-'], { input: rewritten.stdout, encoding: 'utf8' });
    expect(undone.status).toBe(0);
    expect(undone.stdout).toBe(readFileSync(file, 'utf8'));
  });
});

describe('our webhook first, then Istio, then our webhook again (reinvocationPolicy: IfNeeded)', () => {
  for (const native of [false, true]) {
    it(`${native ? 'native sidecar' : 'classic sidecar'}: the re-invocation rewrites only istio-proxy's probes, merges the record, duplicates nothing`, async () => {
      const app = fixture(APP);
      const first = await throughWebhook(app);
      expect(first.outcome).toBe('rewritten');
      const firstRecord = recordOf(first.pod);

      // Istio leaves exec probes alone: pilot-agent is handed nothing, the app's probes stay ours.
      const injected = istioInject(first.pod, { native });
      expect(appProbers(injected)).toBeUndefined();
      expect(containerOf(injected, 'web')).toEqual(containerOf(first.pod, 'web'));
      // istio-proxy's probes are network probes nobody rewrote: kubelet would run them over the node->pod path.
      const proxyProbes = native ? ['istio-proxy/readinessProbe', 'istio-proxy/startupProbe'] : ['istio-proxy/readinessProbe'];
      expect(networkSlots(injected)).toEqual(proxyProbes);

      const again = await throughWebhook(injected);
      expect(again.outcome).toBe('rewritten');
      expect(networkSlots(again.pod)).toEqual([]);
      for (const key of proxyProbes) expect(commandOf(again.pod, key)).toEqual({ httpGet: { path: '/healthz/ready', port: 15021 } });
      // Only the new probes and the record change: no second affinity requirement or toleration.
      const proxyPath = native ? '/spec/initContainers/1/' : '/spec/containers/2/';
      for (const op of again.ops) expect(op.path).toMatch(new RegExp(`^(${proxyPath}(readinessProbe|startupProbe)/|/metadata/annotations/probe-agent.io~1original-handlers$)`));
      expect(closedHoleTolerations(again.pod)).toBe(1);
      expect(shimRequirementsPerTerm(again.pod)).toEqual([1]);
      const record = recordOf(again.pod);
      expect(Object.keys(record.handlers).sort()).toEqual([...Object.keys(firstRecord.handlers), ...proxyProbes].sort());
      for (const [key, handler] of Object.entries(firstRecord.handlers)) expect(record.handlers[key]).toEqual(handler);
      expect(record.added).toEqual(firstRecord.added);
      // The app's probes still carry the original target (named port resolved).
      expect(commandOf(again.pod, 'web/livenessProbe').httpGet).toMatchObject({ path: '/healthz', port: 8080 });
      // A further call (the API server may call more than once) is a no-op.
      expect((await throughWebhook(again.pod)).ops).toEqual([]);
      // The undo takes away everything of ours: the app's probes as its author wrote them (Istio
      // never saw them, so they are not aimed at pilot-agent) next to Istio's injection as Istio made it.
      const undone = transformObject(again.pod, 'undo').object as Obj;
      expect(containerOf(undone, 'web')).toEqual(containerOf(app, 'web'));
      expect(containerOf(undone, ISTIO_PROXY)).toEqual(containerOf(injected, ISTIO_PROXY));
      expect(undone.metadata.annotations[ORIGINAL_HANDLERS_ANNOTATION]).toBeUndefined();
      expect(undone.spec.affinity).toBeUndefined();
      expect(undone.spec.tolerations).toBeUndefined();
    });
  }

  it('the deployed webhook configuration asks the API server to re-invoke it after later mutations, on both entries', () => {
    const config = parse(readFileSync(path.join(REPO, 'deploy/components/rewrite-webhook/mutatingwebhookconfiguration.yaml'), 'utf8')) as Obj;
    expect(config.webhooks.map((w: Obj) => [w.name, w.reinvocationPolicy])).toEqual([
      ['namespaces.rewrite.probe-agent.io', 'IfNeeded'],
      ['pods.rewrite.probe-agent.io', 'IfNeeded'],
    ]);
  });
});

describe('sidecar.istio.io/rewriteAppHTTPProbers: "false"', () => {
  it('the app keeps its own probes through Istio; our rewrite takes them and istio-proxy\'s, and leaves the exec hooks', async () => {
    const injected = fixture(NATIVE);
    expect(appProbers(injected)).toBeUndefined();
    const { pod } = await throughWebhook(injected);
    expect(networkSlots(pod)).toEqual([]);
    expect(commandOf(pod, 'web/livenessProbe')).toEqual({ httpGet: { path: '/healthz', port: 8080, httpHeaders: [{ name: 'X-Probe-Token', valueFrom: 'annotation' }] } });
    expect(commandOf(pod, 'web/readinessProbe')).toEqual({ grpc: { port: 9090 } });
    expect(commandOf(pod, 'web/startupProbe')).toEqual({ tcpSocket: { port: 8080 } });
    expect(commandOf(pod, 'istio-proxy/startupProbe')).toEqual({ httpGet: { path: '/healthz/ready', port: 15021 } });
    expect(containerOf(pod, ISTIO_PROXY)!.lifecycle).toEqual(containerOf(injected, ISTIO_PROXY)!.lifecycle);
    expect(transformObject(pod, 'undo').object).toEqual(injected);
  });
});

