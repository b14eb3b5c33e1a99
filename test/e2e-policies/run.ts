/**
 * `make e2e-policies KUBE_BIN_DIR=/dir`: gates mode's rights tried as an attacker would, on a real
 * API server (KUBE_BIN_DIR/kube-apiserver and kubectl, v1.30 or later; Debian's etcd; no kubelet,
 * controller-manager or scheduler: pods are API objects with spec.nodeName, Node objects need no
 * kubelet), with the pod-bound service-account tokens of two nodes' agents (the token's node-name
 * extra is what the policies read).
 * For each install, the manifests before (POLICIES_BEFORE_REF, default the commit issue 43 measured)
 * and now, each rendered two ways (kustomize: deploy/base + containerd, rewrite-webhook, gates,
 * gates-lease; and the Helm chart with the same choices), the RBAC, policy and flow-control objects
 * are applied and every attack is made with node-a's token: the HTTP code of each, before and after,
 * is a row of the table (the allowed writes go through agent/gates/api-writer.ts itself).
 * Then fairness: the API server runs with small in-flight limits so the agents' priority level
 * queues; node-a's tenant flaps 200 pods (200 writes in flight: 50 writers of its token, which is
 * what 50 agents writing for one tenant look like to API Priority and Fairness: one user, one
 * namespace) while node-b writes its own pod's condition; node-b's latency with the old FlowSchema
 * (ByUser) and the new (ByNamespace). Numbers are printed, not judged by time: the check is that
 * node-b's writes all succeed under the new one. Root not needed; not part of `make test`.
 */
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Agent, request } from 'undici';
import { parseAllDocuments } from 'yaml';
import { ApiWriteError, ApiWriter } from '../../agent/gates/api-writer.ts';
import { nodeLeaseName } from '../../agent/gates/lease.ts';
import { GATES_CONDITION_TYPE } from '../../agent/pods/pod-model.ts';
import { startControlPlane, type ControlPlane } from '../e2e-cluster/control-plane.ts';
import { check, checks, Cleanups, runHarness, say, sayAs, sleep, waitFor } from '../e2e-kubelet/lib.ts';

type Obj = Record<string, any>;

sayAs('e2e-policies');
const REPO = fileURLToPath(new URL('../..', import.meta.url));
const NS = 'probe-agent';
const TENANT_A = 'tenant-a';
const TENANT_B = 'tenant-b';
const FLAPPING_PODS = Number(process.env['POLICIES_FLAPPING_PODS'] ?? 200);
const FLOOD_WRITERS = Number(process.env['POLICIES_FLOOD_WRITERS'] ?? 50);
const MEASURE_WRITES = Number(process.env['POLICIES_MEASURE_WRITES'] ?? 60);
/** The kinds of the manifests that decide who may write what (the workloads cannot run without kubelets). */
const KINDS = new Set(['Namespace', 'ServiceAccount', 'ClusterRole', 'ClusterRoleBinding', 'Role', 'RoleBinding', 'ValidatingAdmissionPolicy', 'ValidatingAdmissionPolicyBinding', 'FlowSchema', 'PriorityLevelConfiguration']);

function usage(msg: string): never {
  console.error(`e2e-policies: ${msg}\nusage: node test/e2e-policies/run.ts --kube-bin-dir DIR [--before-ref REF]`);
  process.exit(2);
}

function arg(flag: string): string | undefined {
  const i = process.argv.indexOf(flag);
  return i >= 0 ? process.argv[i + 1] : undefined;
}

const binDir = path.resolve(arg('--kube-bin-dir') ?? process.env['KUBE_BIN_DIR'] ?? usage('--kube-bin-dir is required'));
const beforeRef = arg('--before-ref') ?? process.env['POLICIES_BEFORE_REF'] ?? 'b3d6c29';
const cleanups = new Cleanups('e2e-policies');
const scratch = mkdtempSync(path.join(tmpdir(), 'probe-agent-e2e-policies-'));
cleanups.push(() => {
  if (process.env['E2E_KEEP_LOGS'] !== '1') rmSync(scratch, { recursive: true, force: true });
  else say(`logs kept in ${scratch}`);
});

// ---------- rendering ----------

const tool = (name: 'kubectl' | 'helm'): string => path.join(REPO, '.tools/bin', name);

function docs(text: string): Obj[] {
  return parseAllDocuments(text, { version: '1.1' }).map((d) => d.toJS() as Obj).filter((o) => o && KINDS.has(o.kind));
}

/** The deploy/ tree of `ref` ('' = the working tree). */
function deployTree(ref: string): string {
  if (!ref) return path.join(REPO, 'deploy');
  const dir = path.join(scratch, `tree-${ref}`);
  mkdirSync(dir, { recursive: true });
  execFileSync('sh', ['-c', `git -C '${REPO}' archive '${ref}' deploy | tar -x -C '${dir}'`]);
  return path.join(dir, 'deploy');
}

function kustomized(deploy: string, name: string): Obj[] {
  const dir = path.join(scratch, `overlay-${name}`);
  mkdirSync(dir, { recursive: true });
  const rel = (p: string): string => path.relative(dir, path.join(deploy, p));
  writeFileSync(path.join(dir, 'kustomization.yaml'), [
    `resources: [${rel('base')}]`,
    `components: [${['containerd', 'rewrite-webhook', 'gates', 'gates-lease'].map((c) => rel(`components/${c}`)).join(', ')}]`,
    'configMapGenerator:',
    '  - name: probe-agent-webhook-network-policy',
    '    literals: [API_SERVER_CIDR=127.0.0.1/32]',
    '    options: {disableNameSuffixHash: true, annotations: {config.kubernetes.io/local-config: "true"}}',
  ].join('\n') + '\n');
  return docs(execFileSync(tool('kubectl'), ['kustomize', dir], { encoding: 'utf8', maxBuffer: 64 << 20, stdio: ['ignore', 'pipe', 'pipe'] }));
}

function charted(deploy: string, name: string): Obj[] {
  const values = path.join(scratch, `values-${name}.json`);
  writeFileSync(values, JSON.stringify({
    mode: 'gates', runtime: 'containerd', gatesLease: { enabled: true },
    webhook: { enabled: true, apiServerCIDRs: ['127.0.0.1/32'], certManager: false, caBundle: Buffer.from('unused').toString('base64') },
  }));
  const env = { ...process.env, HELM_CACHE_HOME: path.join(scratch, 'helm/cache'), HELM_CONFIG_HOME: path.join(scratch, 'helm/config'), HELM_DATA_HOME: path.join(scratch, 'helm/data') };
  return docs(execFileSync(tool('helm'), ['template', 'probe-agent', path.join(deploy, 'helm/probe-agent'), '--namespace', NS, '--kube-version', '1.33.0', '-f', values], { encoding: 'utf8', env, maxBuffer: 64 << 20, stdio: ['ignore', 'pipe', 'pipe'] }));
}

// ---------- the API server, as admin and as the agents ----------

interface Api {
  server: string;
  ca: string;
  admin: Agent;
  anon: Agent;
}

interface Answer {
  status: number;
  body: Obj;
}

async function call(api: Api, who: { token: string } | 'admin', method: string, p: string, body?: unknown, contentType = 'application/json'): Promise<Answer> {
  const headers: Record<string, string> = { accept: 'application/json', ...(body === undefined ? {} : { 'content-type': contentType }) };
  if (who !== 'admin') headers.authorization = `Bearer ${who.token}`;
  const res = await request(new URL(p, api.server), { method, headers, body: body === undefined ? null : JSON.stringify(body), dispatcher: who === 'admin' ? api.admin : api.anon, signal: AbortSignal.timeout(30_000) });
  const text = await res.body.text();
  let parsed: Obj = {};
  try { parsed = JSON.parse(text) as Obj; } catch { parsed = { text }; }
  return { status: res.statusCode, body: parsed };
}

async function must(api: Api, method: string, p: string, body?: unknown, contentType?: string): Promise<Obj> {
  const r = await call(api, 'admin', method, p, body, contentType);
  if (r.status >= 300) throw new Error(`admin ${method} ${p}: HTTP ${r.status} ${String(r.body.message ?? '').slice(0, 300)}`);
  return r.body;
}

/** Creates `obj` at `collection`, or replaces nothing if it exists (409 is fine). */
async function ensure(api: Api, collection: string, obj: Obj): Promise<void> {
  const r = await call(api, 'admin', 'POST', collection, obj);
  if (r.status >= 300 && r.status !== 409) throw new Error(`admin POST ${collection}: HTTP ${r.status} ${String(r.body.message ?? '').slice(0, 300)}`);
}

const podPath = (ns: string, name: string): string => `/api/v1/namespaces/${ns}/pods/${name}`;
const leasePath = (ns: string, name = ''): string => `/apis/coordination.k8s.io/v1/namespaces/${ns}/leases${name ? `/${name}` : ''}`;

function podObject(ns: string, name: string, node: string, extra: Obj = {}): Obj {
  return {
    apiVersion: 'v1', kind: 'Pod', metadata: { name, namespace: ns, labels: { app: name } },
    spec: { nodeName: node, automountServiceAccountToken: false, containers: [{ name: 'app', image: 'registry.invalid/app:1' }], readinessGates: [{ conditionType: GATES_CONDITION_TYPE }], ...extra },
  };
}

/** What kubelet would have written: host and pod IPs, its conditions, our gate False. */
async function resetPodStatus(api: Api, ns: string, name: string, hostIP: string, podIP: string): Promise<void> {
  await must(api, 'PATCH', podPath(ns, name), { metadata: { finalizers: null, labels: { app: name } } }, 'application/merge-patch+json');
  const pod = await must(api, 'GET', podPath(ns, name));
  const now = new Date().toISOString().replace(/\.\d+Z$/, 'Z');
  pod.status = {
    phase: 'Running', hostIP, hostIPs: [{ ip: hostIP }], podIP, podIPs: [{ ip: podIP }], startTime: now,
    conditions: [{ type: 'Ready', status: 'False', lastTransitionTime: now }, { type: GATES_CONDITION_TYPE, status: 'False', lastTransitionTime: now }],
  };
  delete pod.metadata.resourceVersion;
  await must(api, 'PUT', `${podPath(ns, name)}/status`, pod);
}

async function lease(api: Api, ns: string, name: string, holder: string): Promise<void> {
  await call(api, 'admin', 'DELETE', leasePath(ns, name));
  await must(api, 'POST', leasePath(ns), { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name, namespace: ns }, spec: { holderIdentity: holder, leaseDurationSeconds: 40, renewTime: new Date().toISOString().replace('Z', '000Z') } });
}

// ---------- one install ----------

interface Tokens {
  a: string;
  b: string;
  unbound: string;
  webhook: string;
  files: { a: string; b: string };
}

function mintTokens(cp: ControlPlane, tag: string): Tokens {
  const token = (sa: string, pod?: string): string =>
    cp.admin.must(['-n', NS, 'create', 'token', sa, '--duration', '2h', ...(pod ? ['--bound-object-kind', 'Pod', '--bound-object-name', pod] : [])]).trim();
  const t = { a: token('probe-agent', 'agent-a'), b: token('probe-agent', 'agent-b'), unbound: token('probe-agent'), webhook: token('probe-agent-webhook') };
  const files = { a: path.join(scratch, `token-a-${tag}`), b: path.join(scratch, `token-b-${tag}`) };
  writeFileSync(files.a, t.a, { mode: 0o600 });
  writeFileSync(files.b, t.b, { mode: 0o600 });
  return { ...t, files };
}

async function install(cp: ControlPlane, api: Api, objects: Obj[]): Promise<void> {
  const r = cp.admin.apply(objects);
  if (!r.ok) throw new Error(`kubectl apply: ${r.stderr.trim().slice(0, 600)}`);
  // The API server's policy informer picks the objects up within moments (their status is the
  // controller-manager's, which does not run here: nothing to wait on but time).
  await sleep(5000);
}

async function uninstall(cp: ControlPlane, objects: Obj[]): Promise<void> {
  // The namespace and service accounts stay: the agents' pods (and their tokens) refer to them.
  const gone = objects.filter((o) => o.kind !== 'Namespace' && o.kind !== 'ServiceAccount');
  const r = cp.admin.run(['delete', '--ignore-not-found', '--wait=true', '-f', '-'], gone.map((o) => JSON.stringify(o)).join('\n'));
  if (!r.ok) throw new Error(`kubectl delete: ${r.stderr.trim().slice(0, 600)}`);
  await sleep(3000);
}

interface Row {
  what: string;
  /** What a safe install answers: 'refused' (4xx) or 'allowed' (2xx). */
  want: 'refused' | 'allowed';
}

/** An attack's outcome: the HTTP status ('ok': an api-writer call that succeeded), who refused, and for an accepted write whether it stuck. */
interface Outcome {
  status: number | 'ok' | string;
  by?: string;
  stuck?: boolean;
  message?: string;
}
type Attack = (api: Api, t: Tokens, tag: string) => Promise<Outcome>;
const attacks: Array<Row & { run: Attack; stuck?: (api: Api, tag: string) => Promise<boolean> }> = [];
/** `stuck`: reads back whether an accepted write changed the stored object (the API server may drop a field). */
function attack(what: string, want: Row['want'], run: Attack, stuck?: (api: Api, tag: string) => Promise<boolean>): void {
  attacks.push({ what, want, run, ...(stuck ? { stuck } : {}) });
}

function cell(o: Outcome): string {
  return `${o.status}${o.by ? ` ${o.by}` : ''}${o.stuck === false ? ' (dropped)' : ''}`;
}

/** Who refused: RBAC (403), a ValidatingAdmissionPolicy (its name), or the API's own validation. */
function refuser(a: Answer): string | undefined {
  if (a.status < 400) return undefined;
  const m = /ValidatingAdmissionPolicy '([^']+)'/.exec(String(a.body.message ?? ''));
  if (m) return `vap:${m[1]!.replace(/^probe-agent-/, '')}`;
  return a.status === 403 ? 'rbac' : 'invalid';
}

const nowMicro = (): string => new Date().toISOString().replace('Z', '000Z');
const merge = 'application/merge-patch+json';
const smp = 'application/strategic-merge-patch+json';
const statusPatch = (extra: Obj): Obj => ({ status: { conditions: [{ type: GATES_CONDITION_TYPE, status: 'True', reason: 'ProbesSucceeded', message: '' }] }, ...extra });
const code = async (p: Promise<Answer>): Promise<Outcome> => {
  const a = await p;
  const by = refuser(a);
  return { status: a.status, ...(by ? { by, message: String(a.body.message ?? '').slice(0, 400) } : {}) };
};
/** An ApiWriter call: 'ok', or the HTTP status it failed with. */
const viaWriter = async (f: () => Promise<void>): Promise<Outcome> => {
  try {
    await f();
    return { status: 'ok' };
  } catch (err) {
    return { status: err instanceof ApiWriteError ? err.status : String(err) };
  }
};
const writer = (api: Api, tokenFile: string, node: string): ApiWriter => new ApiWriter({ url: api.server, caFile: api.ca, tokenFile, nodeName: node, conditionType: GATES_CONDITION_TYPE, timeoutMs: 10_000 });

attack("renew another node's agent Lease (probe-agent-node-b)", 'refused', (api, t) => code(call(api, { token: t.a }, 'PATCH', leasePath(NS, nodeLeaseName('node-b')), { spec: { holderIdentity: 'node-b', renewTime: nowMicro() } }, merge)));
attack("renew node-b's kube-node-lease heartbeat", 'refused', (api, t) => code(call(api, { token: t.a }, 'PATCH', leasePath('kube-node-lease', 'node-b'), { spec: { renewTime: nowMicro() } }, merge)));
attack('take kube-system/kube-controller-manager', 'refused', (api, t) => code(call(api, { token: t.a }, 'PATCH', leasePath('kube-system', 'kube-controller-manager'), { spec: { holderIdentity: 'node-a', renewTime: nowMicro() } }, merge)));
attack('take kube-system/kube-scheduler', 'refused', (api, t) => code(call(api, { token: t.a }, 'PATCH', leasePath('kube-system', 'kube-scheduler'), { spec: { holderIdentity: 'node-a', renewTime: nowMicro() } }, merge)));
attack('create a Lease in kube-system', 'refused', (api, t) => code(call(api, { token: t.a }, 'POST', leasePath('kube-system'), { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: nodeLeaseName('node-a') }, spec: { holderIdentity: 'node-a', leaseDurationSeconds: 40, renewTime: nowMicro() } })));
attack('forge Lease probe-agent-x held by node-b', 'refused', (api, t) => code(call(api, { token: t.a }, 'POST', leasePath(NS), { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: 'probe-agent-x' }, spec: { holderIdentity: 'node-b', leaseDurationSeconds: 40, renewTime: nowMicro() } })));
attack('own Lease name, node-b as holder', 'refused', (api, t) => code(call(api, { token: t.a }, 'POST', leasePath(NS), { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: nodeLeaseName('node-a') }, spec: { holderIdentity: 'node-b', leaseDurationSeconds: 40, renewTime: nowMicro() } })));
attack("patch a pod status on node-b (tenant-b/web-b)", 'refused', (api, t) => code(call(api, { token: t.a }, 'PATCH', `${podPath(TENANT_B, 'web-b')}/status`, statusPatch({}), smp)));
attack("read a pod status on node-b (get pods/status)", 'refused', (api, t) => code(call(api, { token: t.a }, 'GET', `${podPath(TENANT_B, 'web-b')}/status`)));
attack('change status.hostIP of its own pod', 'refused', (api, t) => code(call(api, { token: t.a }, 'PATCH', `${podPath(TENANT_A, 'web-a')}/status`, { status: { hostIP: '127.0.0.99', hostIPs: [{ ip: '127.0.0.99' }] } }, smp)));
attack('add a status.hostIPs entry of its own pod', 'refused', (api, t) => code(call(api, { token: t.a }, 'PATCH', `${podPath(TENANT_A, 'web-a')}/status`, { status: { hostIPs: [{ ip: '127.0.0.10' }, { ip: 'fd00::10' }] } }, smp)),
  async (api) => ((await must(api, 'GET', podPath(TENANT_A, 'web-a'))).status?.hostIPs ?? []).length === 2);
attack('add a finalizer through pods/status', 'refused', (api, t) => code(call(api, { token: t.a }, 'PATCH', `${podPath(TENANT_A, 'web-a')}/status`, { metadata: { finalizers: ['example.com/hold'] } }, merge)),
  async (api) => ((await must(api, 'GET', podPath(TENANT_A, 'web-a'))).metadata.finalizers ?? []).includes('example.com/hold'));
attack('add a label through pods/status', 'refused', (api, t) => code(call(api, { token: t.a }, 'PATCH', `${podPath(TENANT_A, 'web-a')}/status`, { metadata: { labels: { app: 'evil' } } }, merge)),
  async (api) => (await must(api, 'GET', podPath(TENANT_A, 'web-a'))).metadata.labels?.app === 'evil');
attack('set status.hostIP of its pod kubelet has not reported', 'refused', (api, t, tag) => code(call(api, { token: t.a }, 'PATCH', `${podPath(TENANT_A, `fresh-${tag}`)}/status`, { status: { hostIP: '127.0.0.99', hostIPs: [{ ip: '127.0.0.99' }] } }, smp)),
  async (api, tag) => (await must(api, 'GET', podPath(TENANT_A, `fresh-${tag}`))).status?.hostIP === '127.0.0.99');
attack('the Ready condition of its own pod', 'refused', (api, t) => code(call(api, { token: t.a }, 'PATCH', `${podPath(TENANT_A, 'web-a')}/status`, { status: { conditions: [{ type: 'Ready', status: 'True' }] } }, smp)));
attack('a token not bound to a pod, own pod status', 'refused', (api, t) => code(call(api, { token: t.unbound }, 'PATCH', `${podPath(TENANT_A, 'web-a')}/status`, statusPatch({}), smp)));
attack('an event in kube-system', 'refused', (api, t) => code(call(api, { token: t.a }, 'POST', '/api/v1/namespaces/kube-system/events', eventBody('kube-system', 'node-a'))));
attack('an event signed as node-b', 'refused', (api, t) => code(call(api, { token: t.a }, 'POST', `/api/v1/namespaces/${TENANT_B}/events`, eventBody(TENANT_B, 'node-b'))));
attack('webhook: forge Lease probe-agent-x', 'refused', (api, t) => code(call(api, { token: t.webhook }, 'POST', leasePath(NS), { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: 'probe-agent-x' }, spec: { holderIdentity: 'node-b', leaseDurationSeconds: 40 } })));
attack('webhook: set a gate True', 'refused', (api, t) => code(call(api, { token: t.webhook }, 'PATCH', `${podPath(TENANT_B, 'web-b')}/status`, statusPatch({}), smp)));
attack('own Lease, create (api-writer renewLease)', 'allowed', (api, t) => viaWriter(async () => {
  const w = writer(api, t.files.a, 'node-a');
  try { await w.renewLease(NS, nodeLeaseName('node-a'), 40); } finally { await w.close(); }
}));
attack('own Lease, renew (api-writer renewLease)', 'allowed', (api, t) => viaWriter(async () => {
  const w = writer(api, t.files.a, 'node-a');
  try { await w.renewLease(NS, nodeLeaseName('node-a'), 40); } finally { await w.close(); }
}));
attack('own pod probe-agent.io/ready True (api-writer)', 'allowed', (api, t) => viaWriter(async () => {
  const w = writer(api, t.files.a, 'node-a');
  const uid = (await must(api, 'GET', podPath(TENANT_A, 'web-a'))).metadata.uid as string;
  try { await w.patchCondition(TENANT_A, 'web-a', uid, { status: 'True', reason: 'ProbesSucceeded', message: '' }); } finally { await w.close(); }
}));
attack('own pod being deleted: probe-agent.io/ready False (api-writer)', 'allowed', (api, t, tag) => viaWriter(async () => {
  // A pod kept by a finalizer after its deletion: deletionTimestamp set, as while its containers stop.
  const name = `term-${tag}`;
  const pod = podObject(TENANT_A, name, 'node-a');
  pod.metadata.finalizers = ['e2e-policies/keep'];
  await ensure(api, `/api/v1/namespaces/${TENANT_A}/pods`, pod);
  await must(api, 'DELETE', podPath(TENANT_A, name));
  const uid = (await must(api, 'GET', podPath(TENANT_A, name))).metadata.uid as string;
  const w = writer(api, t.files.a, 'node-a');
  try { await w.patchCondition(TENANT_A, name, uid, { status: 'False', reason: 'ContainerNotRunning', message: '' }); } finally { await w.close(); }
}));
attack('event for its gates pod (api-writer)', 'allowed', (api, t) => viaWriter(async () => {
  const w = writer(api, t.files.a, 'node-a');
  const uid = (await must(api, 'GET', podPath(TENANT_A, 'web-a'))).metadata.uid as string;
  try { await w.recordEvent({ namespace: TENANT_A, podName: 'web-a', podUID: uid, container: 'app', type: 'Warning', reason: 'Unhealthy', message: 'Liveness probe failed: e2e-policies' }); } finally { await w.close(); }
}));
attack('webhook: leader-election Lease gates-lease-controller', 'allowed', (api, t) => code(call(api, { token: t.webhook }, 'POST', leasePath(NS), { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: 'gates-lease-controller' }, spec: { holderIdentity: 'probe-agent-webhook-0', leaseDurationSeconds: 15 } })));
attack('webhook: renew gates-lease-controller (get, then update)', 'allowed', async (api, t) => {
  const got = await call(api, { token: t.webhook }, 'GET', leasePath(NS, 'gates-lease-controller'));
  if (got.status !== 200) return code(Promise.resolve(got));
  return code(call(api, { token: t.webhook }, 'PUT', leasePath(NS, 'gates-lease-controller'), { ...got.body, spec: { ...got.body.spec, holderIdentity: 'probe-agent-webhook-1', renewTime: nowMicro() } }));
});
attack('webhook: set a gate False on node-b', 'allowed', async (api, t) => {
  await must(api, 'PATCH', `${podPath(TENANT_B, 'web-b')}/status`, { status: { conditions: [{ type: GATES_CONDITION_TYPE, status: 'True' }] } }, smp);
  return code(call(api, { token: t.webhook }, 'PATCH', `${podPath(TENANT_B, 'web-b')}/status`, { status: { conditions: [{ type: GATES_CONDITION_TYPE, status: 'False', reason: 'NodeLeaseExpired', message: '' }] } }, smp));
});

function eventBody(ns: string, node: string): Obj {
  const now = new Date().toISOString();
  return {
    apiVersion: 'v1', kind: 'Event', metadata: { generateName: 'web.', namespace: ns },
    involvedObject: { apiVersion: 'v1', kind: 'Pod', namespace: ns, name: 'web-b' },
    reason: 'Killing', message: 'forged', type: 'Normal', source: { component: 'probe-agent', host: node },
    reportingComponent: 'probe-agent', reportingInstance: node, firstTimestamp: now, lastTimestamp: now, count: 1,
  };
}

/** What each attack left behind, undone so every install starts alike. */
async function resetFixtures(api: Api): Promise<void> {
  for (const name of ['probe-agent-x', nodeLeaseName('node-a'), 'gates-lease-controller']) await call(api, 'admin', 'DELETE', leasePath(NS, name));
  await call(api, 'admin', 'DELETE', leasePath('kube-system', nodeLeaseName('node-a')));
  await lease(api, NS, nodeLeaseName('node-b'), 'node-b');
  await lease(api, 'kube-node-lease', 'node-b', 'node-b');
  await lease(api, 'kube-system', 'kube-controller-manager', 'cm-0');
  await lease(api, 'kube-system', 'kube-scheduler', 'sched-0');
  await resetPodStatus(api, TENANT_A, 'web-a', '127.0.0.10', '10.0.0.5');
  await resetPodStatus(api, TENANT_B, 'web-b', '127.0.0.11', '10.0.1.5');
}

// ---------- fairness ----------

interface Latency {
  writes: number;
  failed: number;
  p50: number;
  p99: number;
  max: number;
  failures: string;
}

function pct(sorted: number[], q: number): number {
  return sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]! : NaN;
}

/** node-b writes its pod's condition MEASURE_WRITES times, 100 ms apart; its latencies. */
async function measureB(api: Api, t: Tokens, uidB: string): Promise<Latency> {
  const w = writer(api, t.files.b, 'node-b');
  const ms: number[] = [];
  const errors = new Map<string, number>();
  try {
    for (let i = 0; i < MEASURE_WRITES; i++) {
      const start = performance.now();
      try {
        await w.patchCondition(TENANT_B, 'web-b', uidB, { status: i % 2 ? 'True' : 'False', reason: 'E2E', message: '' });
        ms.push(performance.now() - start);
      } catch (err) {
        const key = err instanceof ApiWriteError ? String(err.status) : 'error';
        errors.set(key, (errors.get(key) ?? 0) + 1);
      }
      await sleep(100);
    }
  } finally {
    await w.close();
  }
  ms.sort((x, y) => x - y);
  const failed = [...errors.values()].reduce((x, y) => x + y, 0);
  return { writes: MEASURE_WRITES, failed, p50: pct(ms, 0.5), p99: pct(ms, 0.99), max: ms.at(-1) ?? NaN, failures: [...errors].map(([k, v]) => `${v}x${k}`).join(' ') || '-' };
}

/** node-a's tenant flapping (flood.ts, its own process) until stop(); its writes by answer. */
async function flood(api: Api, t: Tokens, pods: Array<{ name: string; uid: string }>): Promise<{ stop: () => Promise<Record<string, number>> }> {
  const config = { server: api.server, ca: api.ca, tokenFile: t.files.a, node: 'node-a', namespace: TENANT_A, writers: FLOOD_WRITERS, pods };
  const child = spawn(process.execPath, [path.join(REPO, 'test/e2e-policies/flood.ts'), JSON.stringify(config)], { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  cleanups.push(() => { if (child.exitCode === null) child.kill('SIGKILL'); });
  await waitFor('the flood to start', 30_000, () => out.includes('flooding') || undefined, 100);
  return {
    stop: async () => {
      child.kill('SIGTERM');
      await exited;
      try { return JSON.parse(out.split('\n').filter(Boolean).at(-1) ?? '{}') as Record<string, number>; } catch { return { unreadable: 1 }; }
    },
  };
}

/** The API server's own numbers for the agents' priority level: seats, requests rejected. */
async function apfNumbers(api: Api): Promise<string> {
  const r = await request(new URL('/metrics', api.server), { dispatcher: api.admin });
  const text = await r.body.text();
  const value = (name: string): string => {
    const line = text.split('\n').find((l) => l.startsWith(`${name}{`) && l.includes('priority_level="probe-agent-gates"'));
    return line ? line.slice(line.lastIndexOf(' ') + 1) : '-';
  };
  const rejected = text.split('\n').filter((l) => l.startsWith('apiserver_flowcontrol_rejected_requests_total{') && l.includes('priority_level="probe-agent-gates"'))
    .reduce((n, l) => n + Number(l.slice(l.lastIndexOf(' ') + 1)), 0);
  return `seats nominal ${value('apiserver_flowcontrol_nominal_limit_seats')}, current ${value('apiserver_flowcontrol_current_limit_seats')}, rejected ${rejected}`;
}

// ---------- main ----------

let heading = 'e2e-policies: not started';

async function main(): Promise<number> {
  for (const b of ['kube-apiserver', 'kubectl']) {
    const r = spawnSync(path.join(binDir, b), ['--version'], { encoding: 'utf8' });
    if (r.status !== 0 && b === 'kube-apiserver') usage(`${path.join(binDir, b)} does not run`);
  }
  let renders: Array<{ name: string; when: 'before' | 'after'; how: 'kustomize' | 'helm'; objects: Obj[] }> = [];
  for (const [when, ref] of [['before', beforeRef], ['after', '']] as const) {
    const tree = deployTree(ref);
    renders.push({ name: `${when}-kustomize`, when, how: 'kustomize', objects: kustomized(tree, `${when}-k`) });
    renders.push({ name: `${when}-helm`, when, how: 'helm', objects: charted(tree, `${when}-h`) });
  }
  // POLICIES_ONLY=after-kustomize,... runs some installs only (a quicker look while changing a policy).
  const only = process.env['POLICIES_ONLY']?.split(',');
  if (only) renders = renders.filter((r) => only.includes(r.name));
  say(`rendered: ${renders.map((r) => `${r.name} ${r.objects.length} objects`).join(', ')}`);

  // Small in-flight limits: the agents' priority level has a seat or two (a few more borrowed from
  // idle levels), so it queues long before this shared machine's CPU is the limit (fairness below).
  const [reads, writes] = (process.env['POLICIES_INFLIGHT'] ?? '4,2').split(',');
  const cp = await startControlPlane({
    binDir, scratch, nodeIp: '127.0.0.1', controllers: false,
    apiserverArgs: [`--max-requests-inflight=${reads}`, `--max-mutating-requests-inflight=${writes}`],
  });
  cleanups.push(() => cp.stop());
  const version = JSON.parse(cp.admin.raw('/version') || '{}') as Obj;
  heading = `e2e-policies on kube-apiserver ${version.gitVersion ?? '?'} (before: ${beforeRef})`;
  const pkiDir = cp.pki.dir;
  const api: Api = {
    server: cp.server, ca: cp.ca.cert,
    admin: new Agent({ connect: { ca: readFileSync(cp.ca.cert), cert: readFileSync(path.join(pkiDir, 'admin.crt')), key: readFileSync(path.join(pkiDir, 'admin.key')) }, connections: 8 }),
    anon: new Agent({ connect: { ca: readFileSync(cp.ca.cert) }, connections: 8 }),
  };
  cleanups.push(async () => { await api.admin.close(); await api.anon.close(); });

  // Fixtures: two nodes, two gates namespaces, a gates pod on each node, the agents' pods.
  for (const n of ['node-a', 'node-b']) await ensure(api, '/api/v1/nodes', { apiVersion: 'v1', kind: 'Node', metadata: { name: n } });
  for (const ns of [NS, TENANT_A, TENANT_B]) {
    await ensure(api, '/api/v1/namespaces', { apiVersion: 'v1', kind: 'Namespace', metadata: { name: ns, labels: ns === NS ? {} : { 'probe-agent.io/mode': 'gates' } } });
    // No controller-manager: the service-account admission wants `default` to exist.
    await ensure(api, `/api/v1/namespaces/${ns}/serviceaccounts`, { apiVersion: 'v1', kind: 'ServiceAccount', metadata: { name: 'default' } });
  }
  await ensure(api, `/api/v1/namespaces/${TENANT_A}/pods`, podObject(TENANT_A, 'web-a', 'node-a'));
  await ensure(api, `/api/v1/namespaces/${TENANT_B}/pods`, podObject(TENANT_B, 'web-b', 'node-b'));

  const table = new Map<string, Record<string, Outcome>>();
  let agentsMade = false;
  for (const r of renders) {
    say(`install ${r.name}`);
    await install(cp, api, r.objects);
    if (!agentsMade) {
      for (const [name, node] of [['agent-a', 'node-a'], ['agent-b', 'node-b']]) {
        await ensure(api, `/api/v1/namespaces/${NS}/pods`, podObject(NS, name!, node!, { serviceAccountName: 'probe-agent', readinessGates: [] }));
      }
      agentsMade = true;
    }
    const tokens = mintTokens(cp, r.name);
    await resetFixtures(api);
    await ensure(api, `/api/v1/namespaces/${TENANT_A}/pods`, podObject(TENANT_A, `fresh-${r.name}`, 'node-a'));
    for (const a of attacks) {
      const got = await a.run(api, tokens, r.name);
      if (a.stuck && (got.status === 'ok' || (typeof got.status === 'number' && got.status < 300))) got.stuck = await a.stuck(api, r.name);
      (table.get(a.what) ?? table.set(a.what, {}).get(a.what)!)[r.name] = got;
    }
    if (r.how === 'kustomize' && process.env['POLICIES_FAIRNESS'] !== '0') await fairness(api, tokens, r.name);
    await uninstall(cp, r.objects);
  }

  // The table: each attack's answer per install; a check per attack that the new manifests answer as they should.
  const cols = renders.map((r) => r.name);
  console.log(`\n${"attack (node-a's pod-bound token unless named)".padEnd(58)} ${cols.map((c) => c.padEnd(24)).join(' ')}`);
  for (const a of attacks) {
    const row = table.get(a.what)!;
    console.log(`${a.what.padEnd(58)} ${cols.map((c) => cell(row[c]!).padEnd(24)).join(' ')}`);
    if (process.env['POLICIES_DEBUG'] === '1') for (const c of cols) if (row[c]!.message) console.log(`    ${c}: ${row[c]!.message}`);
  }
  console.log('');
  for (const a of attacks) {
    const row = table.get(a.what)!;
    for (const c of cols.filter((x) => x.startsWith('after'))) {
      const v = row[c]!;
      const accepted = v.status === 'ok' || (typeof v.status === 'number' && v.status >= 200 && v.status < 300);
      const refused = typeof v.status === 'number' && v.status >= 400 && v.status < 500;
      // An accepted attack the API server itself dropped (read back unchanged) did nothing.
      const ok = a.want === 'allowed' ? accepted : refused || (accepted && v.stuck === false);
      const before = row[c.replace('after', 'before')];
      check(`${c}: ${a.what}`, ok, `${cell(v)} (before: ${before ? cell(before) : '-'}), want ${a.want}${v.message ? `: ${v.message}` : ''}`);
    }
  }
  for (const f of fairnessRows) console.log(f);
  return checks.some((c) => c.outcome === 'FAIL') ? 1 : 0;
}

const fairnessRows: string[] = [];

async function fairness(api: Api, t: Tokens, name: string): Promise<void> {
  const pods: Array<{ name: string; uid: string }> = [];
  const existing = await must(api, 'GET', `/api/v1/namespaces/${TENANT_A}/pods?labelSelector=flap%3Dyes`);
  if ((existing.items as Obj[]).length < FLAPPING_PODS) {
    say(`creating ${FLAPPING_PODS} flapping pods on node-a`);
    for (let i = 0; i < FLAPPING_PODS; i++) {
      const pod = podObject(TENANT_A, `flap-${i}`, 'node-a');
      pod.metadata.labels.flap = 'yes';
      await ensure(api, `/api/v1/namespaces/${TENANT_A}/pods`, pod);
    }
  }
  for (const p of (await must(api, 'GET', `/api/v1/namespaces/${TENANT_A}/pods?labelSelector=flap%3Dyes`)).items as Obj[]) pods.push({ name: p.metadata.name, uid: p.metadata.uid });
  const uidB = (await must(api, 'GET', podPath(TENANT_B, 'web-b'))).metadata.uid as string;
  const fs = (await must(api, 'GET', '/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas/probe-agent-gates')).spec.distinguisherMethod?.type;
  say(`fairness (${name}, FlowSchema ${fs}): node-b alone`);
  const alone = await measureB(api, t, uidB);
  say(`fairness (${name}): node-b while node-a's ${pods.length} pods flap`);
  const f = await flood(api, t, pods);
  const floodStart = performance.now();
  await sleep(3000);
  const loaded = await measureB(api, t, uidB);
  const apf = await apfNumbers(api);
  const a = await f.stop();
  const rate = Object.values(a).reduce((x, y) => x + y, 0) / ((performance.now() - floodStart) / 1000);
  const row = (l: Latency): string => `${l.writes - l.failed}/${l.writes} ok, p50 ${l.p50.toFixed(0)} ms, p99 ${l.p99.toFixed(0)} ms, max ${l.max.toFixed(0)} ms, failed ${l.failures}`;
  fairnessRows.push(`fairness ${name} (FlowSchema ${fs}): node-b alone: ${row(alone)}`);
  say(fairnessRows.at(-1)!);
  fairnessRows.push(`fairness ${name} (FlowSchema ${fs}): node-b under node-a's flapping: ${row(loaded)}; node-a's writes by answer ${JSON.stringify(a)} (${rate.toFixed(0)}/s); probe-agent-gates ${apf}`);
  say(fairnessRows.at(-1)!);
  if (name.startsWith('after')) check(`${name}: node-b's writes all succeed while node-a's ${pods.length} pods flap`, loaded.failed === 0 && alone.failed === 0, row(loaded));
}

await runHarness('e2e-policies', main, cleanups, () => heading, 100);
