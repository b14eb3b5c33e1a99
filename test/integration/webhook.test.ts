/**
 * The rewrite webhook over real HTTPS with real AdmissionReview v1 JSON: the returned JSONPatch,
 * applied by an independent RFC 6902 implementation, gives exactly what `probe-agent rewrite`
 * (the built CLI) makes of the same pods; opt-in and opt-out; certificate rotation seen by new
 * connections; bad requests answered clearly while the server keeps serving; and the
 * `probe-agent webhook` process itself (start, health, clean stop, refusing bad TLS files).
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { get as httpGet } from 'node:http';
import { request, type RequestOptions } from 'node:https';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { connect, type PeerCertificate } from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { transformObject } from '../../agent/rewrite/objects.ts';
import { ORIGINAL_HANDLERS_ANNOTATION } from '../../agent/rewrite/pod-rewrite.ts';
import { CLOSED_HOLE_TOLERATION, SHIM_ROLLBACK_ANNOTATION } from '../../agent/rewrite/placement.ts';
import { ApiServerReader } from '../../agent/webhook/cluster-reader.ts';
import { nodeObject, startApiServerStandIn, type ApiServerStandIn } from '../support/api-server-standin.ts';
import { MUTATE_ANNOTATED_PATH, MUTATE_PATH, OPT_IN_ANNOTATION, REVIEWED_ANNOTATION } from '../../agent/webhook/admission.ts';
import { startWebhookServer, type WebhookServer } from '../../agent/webhook/server.ts';
import { builtCli, REPO } from '../support/built-cli.ts';
import { startWebhookProcess } from '../support/webhook-process.ts';
import { applyJsonPatch } from '../support/json-patch-apply.ts';

type Obj = Record<string, any>;
const CORPUS = path.join(REPO, 'test/fixtures/rewrite');

let dir: string;
/** bin/probe-agent, set once dist/ is known to be a build of the current sources. */
let CLI: string;
let server: WebhookServer;
/** CA-signed serving pairs: `a` and `b` from two different CAs, so a rotation is visible. */
const pairs: Record<'a' | 'b', { cert: string; key: string; ca: string }> = {} as never;
const CERT = () => path.join(dir, 'tls.crt');
const KEY = () => path.join(dir, 'tls.key');

function openssl(args: string[]): void {
  execFileSync('openssl', args, { stdio: ['ignore', 'ignore', 'pipe'] });
}

function makePair(name: 'a' | 'b'): void {
  const p = (f: string) => path.join(dir, `${name}-${f}`);
  openssl(['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', p('ca.key'), '-out', p('ca.crt'), '-days', '2', '-subj', `/CN=probe-agent test CA ${name}`]);
  openssl(['req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', p('tls.key'), '-out', p('tls.csr'), '-subj', '/CN=probe-agent-webhook.probe-agent.svc']);
  writeFileSync(p('ext'), 'subjectAltName=DNS:probe-agent-webhook.probe-agent.svc,DNS:localhost,IP:127.0.0.1\n');
  openssl(['x509', '-req', '-in', p('tls.csr'), '-CA', p('ca.crt'), '-CAkey', p('ca.key'), '-CAcreateserial', '-out', p('tls.crt'), '-days', '2', '-extfile', p('ext')]);
  pairs[name] = { cert: readFileSync(p('tls.crt'), 'utf8'), key: readFileSync(p('tls.key'), 'utf8'), ca: readFileSync(p('ca.crt'), 'utf8') };
}

/** Replaces the serving files the way a Secret volume update does: new files renamed into place. */
function install(name: 'a' | 'b'): void {
  writeFileSync(`${CERT()}.new`, pairs[name].cert);
  writeFileSync(`${KEY()}.new`, pairs[name].key);
  renameSync(`${KEY()}.new`, KEY());
  renameSync(`${CERT()}.new`, CERT());
}

interface Reply { status: number; body: string; json?: Obj }

/** One request on a new TLS connection, verifying the server against `ca`. */
function post(pathName: string, body: string | Buffer, opts: { method?: string; ca?: string; headers?: Record<string, string>; port?: number; client?: { cert: string; key: string } } = {}): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const o: RequestOptions = {
      host: '127.0.0.1', port: opts.port ?? server.port, path: pathName, method: opts.method ?? 'POST', ca: opts.ca ?? pairs.a.ca, agent: false,
      headers: { 'content-type': 'application/json', ...opts.headers },
      ...(opts.client ?? {}),
    };
    const req = request(o, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        let json: Obj | undefined;
        try { json = JSON.parse(text); } catch { /* plain text answers */ }
        resolve({ status: res.statusCode ?? 0, body: text, ...(json ? { json } : {}) });
      });
    });
    req.on('error', reject);
    req.end(body);
  });
}

/** A real AdmissionReview v1 request as kube-apiserver sends it for a pod CREATE. */
function review(pod: Obj, overrides: Obj = {}): Obj {
  return {
    apiVersion: 'admission.k8s.io/v1',
    kind: 'AdmissionReview',
    request: {
      uid: `705ab4f5-6393-11e8-b7cc-${Math.random().toString(16).slice(2, 14).padEnd(12, '0')}`,
      kind: { group: '', version: 'v1', kind: 'Pod' },
      resource: { group: '', version: 'v1', resource: 'pods' },
      requestKind: { group: '', version: 'v1', kind: 'Pod' },
      requestResource: { group: '', version: 'v1', resource: 'pods' },
      name: pod.metadata?.name ?? '',
      namespace: 'shop',
      operation: 'CREATE',
      userInfo: { username: 'system:serviceaccount:kube-system:replicaset-controller', uid: 'a7e0a0d5-0c2f-4c5e-9a8f-0d9d1b1f2a3c', groups: ['system:serviceaccounts', 'system:serviceaccounts:kube-system', 'system:authenticated'] },
      object: pod,
      oldObject: null,
      dryRun: false,
      options: { kind: 'CreateOptions', apiVersion: 'meta.k8s.io/v1', fieldManager: 'kube-controller-manager' },
      ...overrides,
    },
  };
}

/** Every pod of the corpus, as the Pod a controller would create from it (what the API server sends). */
function corpusPods(): Obj[] {
  const pods: Obj[] = [];
  const add = (o: Obj | null): void => {
    if (!o || typeof o !== 'object') return;
    if (o.kind === 'List') return o.items.forEach(add);
    const template = o.kind === 'Pod' ? o : o.kind === 'CronJob' ? o.spec?.jobTemplate?.spec?.template : o.spec?.template;
    if (!template?.spec) return;
    pods.push({ apiVersion: 'v1', kind: 'Pod', metadata: { generateName: `${o.metadata?.name ?? 'x'}-`, namespace: 'shop', ...template.metadata }, spec: { ...template.spec, restartPolicy: template.spec.restartPolicy ?? 'Always', dnsPolicy: 'ClusterFirst', schedulerName: 'default-scheduler', enableServiceLinks: true } });
  };
  for (const f of readdirSync(CORPUS).sort()) {
    const text = readFileSync(path.join(CORPUS, f), 'utf8');
    if (f.endsWith('.json')) add(JSON.parse(text));
    else for (const d of parseAllDocuments(text)) add(d.toJS());
  }
  return pods;
}

/** The CA of whichever pair is installed now (the rotation test swaps them). */
async function currentCa(): Promise<string> {
  const cert = readFileSync(CERT(), 'utf8');
  return cert === pairs.a.cert ? pairs.a.ca : pairs.b.ca;
}

async function serving(ca: string): Promise<PeerCertificate> {
  return new Promise((resolve, reject) => {
    const s = connect({ host: '127.0.0.1', port: server.port, ca, servername: 'localhost' }, () => {
      const cert = s.getPeerCertificate();
      s.end();
      resolve(cert);
    });
    s.on('error', reject);
  });
}

beforeAll(async () => {
  CLI = builtCli();
  dir = mkdtempSync(path.join(tmpdir(), 'probe-agent-webhook-'));
  makePair('a');
  makePair('b');
  install('a');
  server = await startWebhookServer({ host: '127.0.0.1', port: 0, certFile: CERT(), keyFile: KEY(), tlsReloadIntervalMs: 100, maxRequestBytes: 256 * 1024, metricsListen: { host: '127.0.0.1', port: 0 } });
});

afterAll(async () => {
  await server?.close();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

/**
 * An admission response with the webhook's review mark (REVIEWED_ANNOTATION, on every pod it decides
 * at creation) taken out of its patch, and the mark's value: the rest is the rewrite's own change.
 * Whatever the pod, the mark is the patch's last operation.
 */
function unmarked(response: Obj): Obj & { mark?: string } {
  if (!response?.patch) return response;
  const ops = JSON.parse(Buffer.from(response.patch, 'base64').toString('utf8')) as Obj[];
  const last = ops[ops.length - 1]!;
  let mark: string | undefined;
  if (last.path === `/metadata/annotations/${REVIEWED_ANNOTATION.replace('/', '~1')}`) mark = last.value;
  else if (last.path === '/metadata/annotations' && Object.keys(last.value).join() === REVIEWED_ANNOTATION) mark = last.value[REVIEWED_ANNOTATION];
  else if (last.path === '/metadata' && JSON.stringify(Object.keys(last.value)) === '["annotations"]' && Object.keys(last.value.annotations).join() === REVIEWED_ANNOTATION) mark = last.value.annotations[REVIEWED_ANNOTATION];
  if (mark === undefined) return response;
  const { patch: _p, patchType: _t, ...rest } = response;
  const own = ops.slice(0, -1);
  return { ...rest, ...(own.length ? { patchType: 'JSONPatch', patch: Buffer.from(JSON.stringify(own)).toString('base64') } : {}), mark };
}

describe('rewrite webhook over HTTPS', () => {
  it('patches every corpus pod into exactly what `probe-agent rewrite` makes of it', async () => {
    const pods = corpusPods();
    expect(pods.length).toBeGreaterThanOrEqual(10);
    const cli = spawnSync(CLI, ['rewrite', '-f', '-', '--output', 'json'], { input: JSON.stringify({ apiVersion: 'v1', kind: 'List', items: pods }), encoding: 'utf8' });
    expect(cli.status).toBe(0);
    // The hostNetwork and gVisor pods of left-to-kubelet.yaml are noted and left alone, by both.
    expect(cli.stderr.trim().split('\n').map((l) => l.replace(/items\[\d+\]/, 'items[i]'))).toEqual([
      'probe-agent rewrite: <stdin>: document 1: items[i].spec: left unchanged: hostNetwork pod: kubelet reaches it without crossing into a pod netns, its probes stay as written',
      'probe-agent rewrite: <stdin>: document 1: items[i].spec: left unchanged: runtimeClassName "gvisor" is sandboxed: the agent cannot probe inside it, its probes stay as written',
    ]);
    const expected = JSON.parse(cli.stdout).items as Obj[];
    let rewritten = 0;
    for (const [i, pod] of pods.entries()) {
      const req = review(pod);
      const r = await post(MUTATE_PATH, JSON.stringify(req));
      expect(r.status).toBe(200);
      const response = unmarked(r.json!.response);
      expect(response.mark, pod.metadata.generateName).toMatch(/^(rewritten|unchanged|skipped)$/);
      expect(r.json).toMatchObject({ apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview' });
      expect(response.uid).toBe(req.request.uid);
      expect(response.allowed).toBe(true);
      if (JSON.stringify(expected[i]) === JSON.stringify(pod)) {
        // Pods left to kubelet say why; pods with nothing to rewrite say nothing.
        if (pod.spec.hostNetwork || pod.spec.runtimeClassName) expect(response.warnings[0]).toMatch(/^probe-agent: probes left unchanged: (hostNetwork pod|runtimeClassName "gvisor")/);
        else expect(response.warnings).toBeUndefined();
        if (pod.spec.runtimeClassName) {
          expect(response.patch, pod.metadata.generateName).toBeUndefined();
          continue;
        }
        // Nothing of these needs the node->pod path: the only change is the closed-hole toleration.
        const patched = applyJsonPatch(pod, JSON.parse(Buffer.from(response.patch, 'base64').toString('utf8')));
        expect(patched).toEqual({ ...pod, spec: { ...pod.spec, tolerations: [...(pod.spec.tolerations ?? []), CLOSED_HOLE_TOLERATION] } });
        continue;
      }
      expect(response.warnings).toBeUndefined();
      rewritten++;
      expect(response.patchType).toBe('JSONPatch');
      const patch = JSON.parse(Buffer.from(response.patch, 'base64').toString('utf8'));
      const patched = applyJsonPatch(pod, patch);
      expect(patched, pod.metadata.generateName).toEqual(expected[i]);
      // And the undo of the patched pod is the pod the API server sent.
      expect(transformObject(patched, 'undo').object).toEqual(pod);
    }
    expect(rewritten).toBeGreaterThanOrEqual(8);
  });

  it('is idempotent: a pod already rewritten gets no patch but the review mark', async () => {
    const pod = corpusPods()[0]!;
    const once = transformObject(pod, 'rewrite').object as Obj;
    expect(once.metadata.annotations[ORIGINAL_HANDLERS_ANNOTATION]).toBeDefined();
    const r = await post(MUTATE_PATH, JSON.stringify(review(once)));
    expect(unmarked(r.json!.response)).toEqual({ uid: expect.any(String), allowed: true, mark: 'unchanged' });
  });

  it('rewrites on the annotated path only pods that opt in, and never pods that opt out', async () => {
    const pod = corpusPods().find((p) => JSON.stringify(p).includes('httpGet'))!;
    const plain = await post(MUTATE_ANNOTATED_PATH, JSON.stringify(review(pod)));
    expect(plain.json!.response.patch).toBeUndefined();
    const annotate = (value: string) => ({ ...pod, metadata: { ...pod.metadata, annotations: { ...pod.metadata.annotations, [OPT_IN_ANNOTATION]: value } } });
    const optedIn = await post(MUTATE_ANNOTATED_PATH, JSON.stringify(review(annotate('enabled'))));
    expect(optedIn.json!.response.patchType).toBe('JSONPatch');
    for (const p of [MUTATE_PATH, MUTATE_ANNOTATED_PATH]) {
      const optedOut = await post(p, JSON.stringify(review(annotate('disabled'))));
      expect(optedOut.json!.response).toEqual({ uid: expect.any(String), allowed: true });
    }
  });

  it('allows, unpatched and with a clear warning, what it cannot or must not rewrite', async () => {
    const base = corpusPods().find((p) => JSON.stringify(p).includes('httpGet'))!;
    const cases: Array<[Obj, RegExp]> = [
      [review({ ...base, spec: { ...base.spec, containers: [{ name: 'x', image: 'i', livenessProbe: { httpGet: { port: 1 }, tcpSocket: { port: 2 } } }] } }), /^probe-agent: probes left unchanged: spec\.containers\[0\]\.livenessProbe: more than one handler \(httpGet, tcpSocket\)/],
      [review({ ...base, spec: { ...base.spec, containers: [{ name: 'x', image: 'i', readinessProbe: { exec: { command: ['/.probe-agent/v1', 'readiness', '***'] } } }] } }), /spec\.containers\[0\]\.readinessProbe\.exec\.command: probe-agent exec command: handler is not base64url/],
      [review({ apiVersion: 'v1', kind: 'ConfigMap', data: {} }, { kind: { group: '', version: 'v1', kind: 'ConfigMap' }, resource: { group: '', version: 'v1', resource: 'configmaps' } }), /^probe-agent: not a pod \(ConfigMap\): left unchanged$/],
      [review(base, { subResource: 'ephemeralcontainers' }), /not a pod \(Pod\/ephemeralcontainers\)/],
      [review({ ...base, spec: { ...base.spec, nodeName: 'node-a' } }), /bound to node node-a at creation/],
      [review(base, { object: null }), /no pod object/],
      [review({ ...base, spec: { ...base.spec, containers: [{ name: 'x', image: 'i', livenessProbe: { httpGet: { host: '10.0.0.1', port: 2379, path: '/metrics' } } }] } }), /^probe-agent: probes left unchanged: spec\.containers\[0\]\.livenessProbe\.httpGet\.host is "10\.0\.0\.1"/],
    ];
    // A pod decided at creation is marked reviewed whatever the decision; what is no pod is not.
    const marks = ['refused', 'refused', undefined, undefined, 'skipped', undefined, 'skipped'];
    for (const [i, [req, warning]] of cases.entries()) {
      const r = await post(MUTATE_PATH, JSON.stringify(req));
      expect(r.status).toBe(200);
      const response = unmarked(r.json!.response);
      expect(response.allowed).toBe(true);
      expect(response.patch).toBeUndefined();
      expect(response.mark, String(warning)).toBe(marks[i]);
      expect(response.warnings).toHaveLength(1);
      expect(response.warnings[0]).toMatch(warning);
    }
    // A pod the webhook did not rewrite at creation is not rewritten by an UPDATE either.
    const update = await post(MUTATE_PATH, JSON.stringify(review(base, { operation: 'UPDATE', oldObject: base })));
    expect(update.json!.response).toEqual({ uid: expect.any(String), allowed: true });
  });

  it('rewrites a probe changed by an UPDATE of a pod it rewrote at creation (MutableContainerProbes), and nothing else', async () => {
    const pod = corpusPods().find((p) => JSON.stringify(p).includes('httpGet') && !p.spec.runtimeClassName && !p.spec.hostNetwork)!;
    const created = transformObject({ ...pod, spec: { ...pod.spec, nodeName: 'node-a' } }, 'rewrite').object as Obj;
    expect(created.metadata.annotations[ORIGINAL_HANDLERS_ANNOTATION]).toBeDefined();
    const changed = structuredClone(created);
    const c0 = changed.spec.containers[0];
    c0.readinessProbe = { httpGet: { path: '/changed-on-update', port: 8080 }, periodSeconds: 3 };
    for (const p of [MUTATE_PATH, MUTATE_ANNOTATED_PATH]) {
      const r = await post(p, JSON.stringify(review(changed, { operation: 'UPDATE', oldObject: created, options: { kind: 'UpdateOptions', apiVersion: 'meta.k8s.io/v1' } })));
      expect(r.json!.response.patchType, p).toBe('JSONPatch');
      const patched = applyJsonPatch(changed, JSON.parse(Buffer.from(r.json!.response.patch, 'base64').toString('utf8')));
      // The new probe runs through the shim like the others; the record holds its original; nothing else moved.
      const command = patched.spec.containers[0].readinessProbe.exec.command as string[];
      expect(command.slice(0, 2)).toEqual(['/.probe-agent/v1', 'readiness']);
      expect(JSON.parse(Buffer.from(command[2]!, 'base64url').toString('utf8'))).toMatchObject({ httpGet: { path: '/changed-on-update' } });
      expect(patched.spec.containers[0].readinessProbe.periodSeconds).toBe(3);
      expect(JSON.parse(patched.metadata.annotations[ORIGINAL_HANDLERS_ANNOTATION]).handlers[`${c0.name}/readinessProbe`]).toEqual({ httpGet: { path: '/changed-on-update', port: 8080 } });
      expect({ ...patched, spec: { ...patched.spec, containers: patched.spec.containers.slice(1) }, metadata: { ...patched.metadata, annotations: {} } })
        .toEqual({ ...created, spec: { ...created.spec, containers: created.spec.containers.slice(1) }, metadata: { ...created.metadata, annotations: {} } });
      expect(transformObject(patched, 'undo').object).toEqual(transformObject(changed, 'undo').object);
    }
    // An UPDATE that leaves the probes alone (labels, say) gets no patch.
    const relabelled = { ...created, metadata: { ...created.metadata, labels: { ...created.metadata.labels, tier: 'gold' } } };
    const same = await post(MUTATE_PATH, JSON.stringify(review(relabelled, { operation: 'UPDATE', oldObject: created })));
    expect(same.json!.response).toEqual({ uid: expect.any(String), allowed: true });
  });

  it('answers requests that are not AdmissionReviews with a clear HTTP error and keeps serving', async () => {
    const expectations: Array<[Promise<Reply>, number, RegExp]> = [
      [post(MUTATE_PATH, '{"apiVersion": '), 400, /^request body is not JSON: /],
      [post(MUTATE_PATH, JSON.stringify({ ...review({}), apiVersion: 'admission.k8s.io/v1beta1' })), 400, /want apiVersion admission\.k8s\.io\/v1, kind AdmissionReview; got admission\.k8s\.io\/v1beta1/],
      [post(MUTATE_PATH, JSON.stringify({ apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview', request: { kind: {} } })), 400, /request has no uid/],
      [post(MUTATE_PATH, '[]'), 400, /not an AdmissionReview object/],
      [post(MUTATE_PATH, '', { method: 'GET' }), 405, /takes POST/],
      [post('/validate', '{}'), 404, /no such path \/validate/],
      [post('/healthz', '', { method: 'GET' }), 200, /^ok\n$/],
    ];
    for (const [reply, status, body] of expectations) {
      const r = await reply;
      expect(r.status, r.body).toBe(status);
      expect(r.body).toMatch(body);
    }
  });

  it('refuses an oversized body (declared or streamed) with 413 and keeps serving', async () => {
    const big = Buffer.alloc(300 * 1024, 0x20);
    const declared = await post(MUTATE_PATH, big);
    expect(declared.status).toBe(413);
    expect(declared.body).toBe(`request body larger than ${256 * 1024} bytes\n`);
    // Chunked: no content-length, the limit is found while reading.
    const streamed = await new Promise<Reply>((resolve, reject) => {
      const req = request({ host: '127.0.0.1', port: server.port, path: MUTATE_PATH, method: 'POST', ca: pairs.a.ca, agent: false, headers: { 'transfer-encoding': 'chunked' } }, (res) => {
        let text = '';
        res.on('data', (c) => (text += c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: text }));
      });
      req.on('error', reject);
      // Keep writing until the server answers; it must not wait for the end.
      const chunk = Buffer.alloc(64 * 1024, 0x20);
      const pump = (): void => {
        if (req.destroyed || req.writableEnded) return;
        if (req.write(chunk)) setImmediate(pump);
        else req.once('drain', pump);
      };
      req.on('response', () => req.destroy());
      pump();
    });
    expect(streamed.status).toBe(413);
    const health = await post('/healthz', '', { method: 'GET' });
    expect(health.status).toBe(200);
  });

  it('counts every admission request by path and outcome on /metrics (after the tests above)', async () => {
    const r = await new Promise<Reply>((resolve, reject) => {
      httpGet({ host: '127.0.0.1', port: server.metricsPort, path: '/metrics' }, (res) => {
        let text = '';
        res.on('data', (c) => (text += c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: text }));
      }).on('error', reject);
    });
    expect(r.status).toBe(200);
    const value = (labels: string): number => Number(new RegExp(`^probe_agent_webhook_requests_total\\{${labels}\\} (\\d+)$`, 'm').exec(r.body)?.[1] ?? 0);
    expect(value('path="/mutate",outcome="rewritten"')).toBeGreaterThanOrEqual(8);
    expect(value('path="/mutate-annotated",outcome="rewritten"')).toBe(2); // an opted-in pod, and a probe changed by an UPDATE
    expect(value('path="/mutate",outcome="refused"')).toBe(3);
    expect(value('path="/mutate",outcome="bad-request"')).toBe(4);
    expect(value('path="/mutate",outcome="too-large"')).toBe(2);
    expect(r.body).toMatch(/^probe_agent_webhook_request_duration_seconds_count\{path="\/mutate"\} \d+$/m);
  });

  it('serves a rotated certificate to new connections without a restart, and keeps the old one when the new files do not load', async () => {
    const before = await serving(pairs.a.ca);
    expect(before.issuer.CN).toBe('probe-agent test CA a');
    install('b');
    const deadline = Date.now() + 10_000;
    let after: PeerCertificate | undefined;
    while (Date.now() < deadline) {
      try {
        after = await serving(pairs.b.ca);
        break;
      } catch {
        await new Promise((r) => setTimeout(r, 50));
      }
    }
    expect(after?.issuer.CN).toBe('probe-agent test CA b');
    const r = await post(MUTATE_PATH, JSON.stringify(review(corpusPods()[0]!)), { ca: pairs.b.ca });
    expect(r.status).toBe(200);
    // A half-written rotation (key of a, certificate of b): refused, b stays in use.
    writeFileSync(KEY(), pairs.a.key);
    expect(server.reloadTls()).toBe(false);
    expect((await serving(pairs.b.ca)).issuer.CN).toBe('probe-agent test CA b');
    writeFileSync(KEY(), pairs.b.key);
    install('a');
    expect(server.reloadTls()).toBe(true);
    expect((await serving(pairs.a.ca)).issuer.CN).toBe('probe-agent test CA a');
  });
});

describe('probe-agent webhook (built CLI)', () => {
  it('starts, answers /healthz and an AdmissionReview, and stops cleanly on SIGTERM', async () => {
    const { child, port, stderr } = await startWebhookProcess(CLI, ['webhook', '--listen', '127.0.0.1:0', '--tls-cert-file', CERT(), '--tls-key-file', KEY(), '--log-format', 'text']);
    try {
      const health = await post('/healthz', '', { method: 'GET', port });
      expect(health.status, stderr()).toBe(200);
      const r = await post(MUTATE_PATH, JSON.stringify(review(corpusPods()[0]!)), { port });
      expect(r.json!.response.patchType).toBe('JSONPatch');
    } finally {
      child.kill('SIGTERM');
    }
    const [code] = await once(child, 'exit');
    expect(code, stderr()).toBe(0);
  });

  it('runs as the rewrite-webhook component deploys it: its args, its probe path and scheme, its webhook paths', async () => {
    const kdir = mkdtempSync(path.join(dir, 'kustomize-'));
    const rel = (p: string) => path.relative(kdir, path.join(REPO, 'deploy', p));
    writeFileSync(path.join(kdir, 'kustomization.yaml'), `resources: [${rel('base')}]\ncomponents: [${rel('components/rewrite-webhook')}]\n`
      + 'configMapGenerator: [{name: probe-agent-webhook-network-policy, literals: [API_SERVER_CIDR=192.0.2.0/28], options: {disableNameSuffixHash: true, annotations: {config.kubernetes.io/local-config: "true"}}}]\n');
    const objects = parseAllDocuments(execFileSync('kubectl', ['kustomize', kdir], { encoding: 'utf8' })).map((d) => d.toJS() as Obj);
    const deployment = objects.find((o) => o.kind === 'Deployment')!;
    const c = deployment.spec.template.spec.containers[0];
    const mountPath = c.volumeMounts[0].mountPath as string;
    const clientCaMount = (c.volumeMounts as Obj[]).find((m) => m.name === 'client-ca')!.mountPath as string;
    // The API server's admission client certificate, from a client CA of the test's own.
    const clientDir = mkdtempSync(path.join(dir, 'client-ca-'));
    const cf = (f: string) => path.join(clientDir, f);
    openssl(['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', cf('ca.key'), '-out', cf('ca.crt'), '-days', '2', '-subj', '/CN=client CA']);
    openssl(['req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', cf('admission.key'), '-out', cf('admission.csr'), '-subj', '/CN=kube-apiserver-admission']);
    writeFileSync(cf('ext'), 'extendedKeyUsage=clientAuth\n');
    openssl(['x509', '-req', '-in', cf('admission.csr'), '-CA', cf('ca.crt'), '-CAkey', cf('ca.key'), '-CAcreateserial', '-out', cf('admission.crt'), '-days', '2', '-extfile', cf('ext')]);
    const apiServer = { cert: readFileSync(cf('admission.crt'), 'utf8'), key: readFileSync(cf('admission.key'), 'utf8') };
    // The deployed args, with the Secret mounts pointed at the test's files and a free port.
    const args = (c.args as string[]).map((a) => a.replace(mountPath, dir).replace(clientCaMount, clientDir).replace(/^--listen=:\d+$/, '--listen=127.0.0.1:0'));
    expect(args).toContain(`--tls-cert-file=${CERT()}`);
    expect(args).toContain(`--client-ca-file=${cf('ca.crt')}`);
    const { child, port, stderr } = await startWebhookProcess(CLI, args);
    try {
      const probe = c.readinessProbe.httpGet;
      expect(probe.scheme).toBe('HTTPS');
      expect((c.ports as Obj[]).find((p) => p.name === probe.port)?.containerPort).toBe(8443);
      const health = await post(probe.path, '', { method: 'GET', port, ca: (await currentCa()) });
      expect(health.status, stderr()).toBe(200);
      const pod = corpusPods().find((p) => JSON.stringify(p).includes('httpGet'))!;
      const annotated = { ...pod, metadata: { ...pod.metadata, annotations: { [OPT_IN_ANNOTATION]: 'enabled' } } };
      const config = objects.find((o) => o.kind === 'MutatingWebhookConfiguration')!;
      for (const w of config.webhooks as Obj[]) {
        const r = await post(w.clientConfig.service.path, JSON.stringify(review(annotated)), { port, ca: await currentCa(), client: apiServer });
        expect(r.json!.response.patchType, w.name).toBe('JSONPatch');
        // As deployed, a caller without the API server's certificate is not answered.
        const anonymous = await post(w.clientConfig.service.path, JSON.stringify(review(annotated)), { port, ca: await currentCa() });
        expect(anonymous.status, w.name).toBe(403);
      }
    } finally {
      child.kill('SIGTERM');
    }
    const [code] = await once(child, 'exit');
    expect(code, stderr()).toBe(0);
  });

  it('refuses to start, exit 2, on TLS files that do not load or a bad flag', () => {
    const garbage = path.join(dir, 'garbage.crt');
    writeFileSync(garbage, 'not a certificate\n');
    const bad = spawnSync(CLI, ['webhook', '--listen', '127.0.0.1:0', '--tls-cert-file', garbage, '--tls-key-file', KEY()], { encoding: 'utf8' });
    expect(bad.status).toBe(2);
    expect(bad.stderr).toMatch(/^probe-agent webhook: cannot start: the TLS certificate .*garbage\.crt and key .*tls\.key do not load: /);
    const missing = spawnSync(CLI, ['webhook', '--tls-cert-file', path.join(dir, 'none.crt'), '--tls-key-file', KEY()], { encoding: 'utf8' });
    expect(missing.status).toBe(2);
    expect(missing.stderr).toMatch(/cannot read the TLS certificate .*none\.crt: .*ENOENT/);
    const listen = spawnSync(CLI, ['webhook', '--listen', 'nowhere', '--tls-cert-file', CERT(), '--tls-key-file', KEY()], { encoding: 'utf8' });
    expect(listen.status).toBe(2);
    expect(listen.stderr).toMatch(/--listen: want host:port.*got "nowhere"/);
    for (const [flag, value] of [['--body-timeout', '0s'], ['--header-timeout', '45s']] as const) {
      const timeout = spawnSync(CLI, ['webhook', flag, value, '--tls-cert-file', CERT(), '--tls-key-file', KEY()], { encoding: 'utf8' });
      expect(timeout.status, flag).toBe(2);
      expect(timeout.stderr).toContain(`${flag}: want 100ms..30s, got "${value}"`);
    }
  });
});

describe('rewrite webhook reading the cluster (API server stand-in)', () => {
  let api: ApiServerStandIn;
  let reader: ApiServerReader;
  let hooked: WebhookServer;
  const probePod = (spec: Obj = {}): Obj => ({
    apiVersion: 'v1', kind: 'Pod', metadata: { generateName: 'agent-', namespace: 'shop' },
    spec: { containers: [{ name: 'a', image: 'i', ports: [{ name: 'http', containerPort: 8080 }], readinessProbe: { httpGet: { port: 'http' } }, lifecycle: { postStart: { httpGet: { port: 8080 } } } }], ...spec },
  });
  /** The affinity the DaemonSet controller gives the pod it makes for `node`. */
  const daemonPod = (node: string): Obj => probePod({
    tolerations: [{ key: 'node.kubernetes.io/not-ready', operator: 'Exists', effect: 'NoExecute' }],
    affinity: { nodeAffinity: { requiredDuringSchedulingIgnoredDuringExecution: { nodeSelectorTerms: [{ matchFields: [{ key: 'metadata.name', operator: 'In', values: [node] }] }] } } },
  });
  const admitOn = async (pod: Obj): Promise<Obj> => {
    const r = await post(MUTATE_PATH, JSON.stringify(review(pod)), { port: hooked.port });
    expect(r.status).toBe(200);
    const response = unmarked(r.json!.response);
    expect(response.mark).toBeDefined();
    return response;
  };

  beforeAll(async () => {
    api = await startApiServerStandIn();
    api.nodes.set('shim-node', nodeObject('shim-node', { 'probe-agent.io/shim': 'ready' }));
    api.nodes.set('plain-node', nodeObject('plain-node'));
    api.nodes.set('rolling-back', nodeObject('rolling-back', { 'probe-agent.io/shim': 'ready' }, { [SHIM_ROLLBACK_ANNOTATION]: 'true' }));
    api.runtimeClasses.set('untrusted', { apiVersion: 'node.k8s.io/v1', kind: 'RuntimeClass', metadata: { name: 'untrusted' }, handler: 'runsc' });
    api.runtimeClasses.set('kata', { apiVersion: 'node.k8s.io/v1', kind: 'RuntimeClass', metadata: { name: 'kata' }, handler: 'runc' });
    reader = new ApiServerReader({ url: api.url, ttlMs: 60_000 });
    hooked = await startWebhookServer({ host: '127.0.0.1', port: 0, certFile: CERT(), keyFile: KEY(), admission: { cluster: reader } });
  });
  afterAll(async () => {
    await hooked?.close();
    await reader?.close();
    await api?.close();
  });

  it('rewrites a DaemonSet pod made for a node whose kubelet uses the shim, and leaves one made for a node without it as written', async () => {
    const onShim = await admitOn(daemonPod('shim-node'));
    expect(onShim.patchType).toBe('JSONPatch');
    const patched = applyJsonPatch(daemonPod('shim-node'), JSON.parse(Buffer.from(onShim.patch, 'base64').toString('utf8')));
    expect(patched.spec.containers[0].readinessProbe.exec.command[0]).toBe('/.probe-agent/v1');
    // The controller's pin is kept, and the shim requirement is ANDed into it (the node has the label, so it matches).
    expect(patched.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms).toEqual([
      { matchFields: [{ key: 'metadata.name', operator: 'In', values: ['shim-node'] }], matchExpressions: [{ key: 'probe-agent.io/shim', operator: 'In', values: ['ready'] }] },
    ]);
    for (const [node, why] of [['plain-node', /whose kubelet does not use the shim/], ['rolling-back', /which is being rolled back/], ['gone-node', /which does not exist/]] as const) {
      const r = await admitOn(daemonPod(node));
      expect(r.patch, node).toBeUndefined();
      expect(r.warnings[0]).toMatch(why);
    }
    // It asked for exactly those nodes, one GET each (the first answer is cached), and nothing else.
    const before = api.requests.length;
    await admitOn(daemonPod('shim-node'));
    expect(api.requests.length).toBe(before);
    expect(api.requests.map((q) => `${q.method} ${q.url}`)).toEqual(['GET /api/v1/nodes/shim-node', 'GET /api/v1/nodes/plain-node', 'GET /api/v1/nodes/rolling-back', 'GET /api/v1/nodes/gone-node']);
    // A pod the scheduler places (no pin) needs no read; nor does a daemon pod with nothing to rewrite,
    // which only gets the closed-hole toleration.
    await admitOn(probePod());
    const clean = daemonPod('plain-node');
    clean.spec.containers = [{ name: 'a', image: 'i' }];
    const cleanAnswer = await admitOn(clean);
    expect(cleanAnswer.warnings).toBeUndefined();
    expect(applyJsonPatch(clean, JSON.parse(Buffer.from(cleanAnswer.patch, 'base64').toString('utf8'))).spec.tolerations).toEqual([...clean.spec.tolerations, CLOSED_HOLE_TOLERATION]);
    expect(api.requests.length).toBe(before);
  });

  it('leaves a DaemonSet pod as written when its node cannot be read (API outage), and without API access at all', async () => {
    api.down = true;
    try {
      const r = await admitOn(daemonPod('other-node'));
      expect(r.patch).toBeUndefined();
      expect(r.warnings[0]).toMatch(/made for node other-node, which cannot be read: .*HTTP 503/);
    } finally {
      api.down = false;
    }
    // The server without a cluster reader (the first describe's) never rewrites a pinned pod.
    const r = await post(MUTATE_PATH, JSON.stringify(review(daemonPod('shim-node'))));
    const response = unmarked(r.json!.response);
    expect(response.patch).toBeUndefined();
    expect(response.mark).toBe('skipped');
    expect(response.warnings[0]).toMatch(/cannot read nodes \(no API server access\)/);
  });

  it('decides sandboxed pods by the RuntimeClass handler it reads, not the class name', async () => {
    const untrusted = await admitOn(probePod({ runtimeClassName: 'untrusted' }));
    expect(untrusted.patch).toBeUndefined();
    expect(untrusted.warnings[0]).toMatch(/runtimeClassName "untrusted" \(runtime handler "runsc"\) is sandboxed/);
    const kata = await admitOn(probePod({ runtimeClassName: 'kata' }));
    expect(kata.patchType).toBe('JSONPatch');
    const missing = await admitOn(probePod({ runtimeClassName: 'nope' }));
    expect(missing.patch).toBeUndefined();
    expect(missing.warnings[0]).toMatch(/RuntimeClass nope not found/);
    expect(api.requests.filter((q) => q.url.includes('runtimeclasses')).map((q) => q.url)).toEqual([
      '/apis/node.k8s.io/v1/runtimeclasses/untrusted', '/apis/node.k8s.io/v1/runtimeclasses/kata', '/apis/node.k8s.io/v1/runtimeclasses/nope',
    ]);
    // The untrusted class cached: asked again, no new read.
    await admitOn(probePod({ runtimeClassName: 'untrusted' }));
    expect(api.requests.filter((q) => q.url.includes('runtimeclasses'))).toHaveLength(3);
  });

  it('resolves the named port and leaves header values out of the command it patches in', async () => {
    const pod = probePod();
    pod.spec.containers[0].livenessProbe = { httpGet: { port: 'http', httpHeaders: [{ name: 'Authorization', value: 'Bearer hunter2' }] } };
    const r = await admitOn(pod);
    const patchText = Buffer.from(r.patch, 'base64').toString('utf8');
    const patched = applyJsonPatch(pod, JSON.parse(patchText));
    const cmd = patched.spec.containers[0].livenessProbe.exec.command;
    expect(JSON.parse(Buffer.from(cmd[2], 'base64url').toString())).toEqual({ httpGet: { port: 8080, httpHeaders: [{ name: 'Authorization', valueFrom: 'annotation' }] } });
    // The value is only in the annotation (which kubelet copies onto the sandbox), never in a command.
    expect(JSON.parse(patched.metadata.annotations[ORIGINAL_HANDLERS_ANNOTATION]).handlers['a/livenessProbe'].httpGet.httpHeaders[0].value).toBe('Bearer hunter2');
    expect(JSON.stringify(patched.spec)).not.toContain('hunter2');
  });
});
