/**
 * The webhook's own bounds over real HTTPS: reviews beyond the concurrency cap or the in-flight
 * bytes budget (counted once their whole body has arrived: slow senders are webhook-slow-body.test.ts)
 * are answered 429 with Retry-After, and the server keeps answering the rest; with --client-ca-file only a caller whose client certificate verifies is
 * answered on the admission paths and /metrics (healthz stays open for kubelet); /metrics is never
 * open on the admission port without that, and --metrics-listen serves it on a port of its own.
 * (How many 3 MiB reviews it survives in its pod's limit: test/bench/webhook-memory.ts, docs/rewrite.md.)
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { get as httpGet, type ClientRequest } from 'node:http';
import { request } from 'node:https';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MUTATE_PATH } from '../../agent/webhook/admission.ts';
import { startWebhookServer, type WebhookServer } from '../../agent/webhook/server.ts';
import { ApiServerReader } from '../../agent/webhook/cluster-reader.ts';
import { startApiServerStandIn, type ApiServerStandIn } from '../support/api-server-standin.ts';
import { issueCert } from '../support/issue-cert.ts';
import { createLogger } from '../../agent/log.ts';

let dir: string;
const f = (name: string): string => path.join(dir, name);
const servers: WebhookServer[] = [];

/** A CA and a certificate it signed, `<name>-ca.crt`, `<name>.crt`, `<name>.key`, in the test's directory. */
const issue = (name: string, cn: string, ext: string): void => issueCert(dir, name, cn, ext);

interface Reply { status: number; body: string; headers: Record<string, string | string[] | undefined> }
interface ClientCert { cert: Buffer; key: Buffer }

function send(server: WebhookServer, pathName: string, opts: { body?: string; method?: string; client?: ClientCert } = {}): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const req = request({
      host: '127.0.0.1', port: server.port, path: pathName, method: opts.method ?? (opts.body === undefined ? 'GET' : 'POST'),
      ca: readFileSync(f('serving-ca.crt')), servername: 'localhost', agent: false, headers: { 'content-type': 'application/json' },
      ...(opts.client ?? {}),
    }, (res) => {
      let text = '';
      res.on('data', (c) => (text += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: text, headers: res.headers }));
    });
    req.on('error', reject);
    req.end(opts.body);
  });
}

/**
 * A whole review of `size` bytes (padded with spaces) for a pod whose RuntimeClass the webhook must
 * read from the API server: it holds its review slot until the slow stand-in answers.
 */
function hold(server: WebhookServer, size: number): { req: ClientRequest; reply: Promise<Reply> } {
  const body = Buffer.alloc(size, 0x20);
  Buffer.from(JSON.stringify(review({ runtimeClassName: 'slow' }))).copy(body, 0);
  let resolveReply!: (r: Reply) => void;
  const reply = new Promise<Reply>((r) => (resolveReply = r));
  const req = request({
    host: '127.0.0.1', port: server.port, path: MUTATE_PATH, method: 'POST', ca: readFileSync(f('serving-ca.crt')), servername: 'localhost', agent: false,
    headers: { 'content-type': 'application/json', 'content-length': String(size) },
  }, (res) => {
    let text = '';
    res.on('data', (c) => (text += c));
    res.on('end', () => resolveReply({ status: res.statusCode ?? 0, body: text, headers: res.headers }));
  });
  req.on('error', () => undefined);
  req.end(body);
  return { req, reply };
}

function review(spec: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview',
    request: {
      uid: '705ab4f5-6393-11e8-b7cc-42010a800002', kind: { group: '', version: 'v1', kind: 'Pod' }, resource: { group: '', version: 'v1', resource: 'pods' },
      namespace: 'shop', operation: 'CREATE', userInfo: { username: 'system:serviceaccount:kube-system:replicaset-controller' },
      object: { apiVersion: 'v1', kind: 'Pod', metadata: { generateName: 'web-' }, spec: { containers: [{ name: 'web', image: 'nginx', livenessProbe: { httpGet: { path: '/', port: 80 } } }], ...spec } },
      oldObject: null,
    },
  };
}

async function start(extra: Partial<Parameters<typeof startWebhookServer>[0]> = {}): Promise<WebhookServer> {
  const s = await startWebhookServer({ host: '127.0.0.1', port: 0, certFile: f('serving.crt'), keyFile: f('serving.key'), ...extra });
  servers.push(s);
  return s;
}

/** Waits until the server has taken the held reviews in (read, and waiting on the API server). */
async function settle(): Promise<void> {
  await new Promise((r) => setTimeout(r, 300));
}

/** An API server stand-in whose RuntimeClass `slow` is answered after `delayMs`, and the webhook's reader of it. */
let apiServer: ApiServerStandIn;
function slowCluster(delayMs: number): { admission: { cluster: ApiServerReader } } {
  apiServer.delayMs = delayMs;
  return { admission: { cluster: new ApiServerReader({ url: apiServer.url, timeoutMs: 5000 }) } };
}

beforeAll(async () => {
  apiServer = await startApiServerStandIn();
  apiServer.runtimeClasses.set('slow', { apiVersion: 'node.k8s.io/v1', kind: 'RuntimeClass', metadata: { name: 'slow' }, handler: 'runc' });
  dir = mkdtempSync(path.join(tmpdir(), 'probe-agent-webhook-limits-'));
  issue('serving', 'probe-agent-webhook.probe-agent.svc', 'subjectAltName=DNS:localhost,IP:127.0.0.1');
  // The API server's admission client certificate, from a CA of its own, and an impostor's from another.
  issue('apiserver', 'kube-apiserver-admission', 'extendedKeyUsage=clientAuth');
  issue('impostor', 'kube-apiserver-admission', 'extendedKeyUsage=clientAuth');
});

afterAll(async () => {
  for (const s of servers) await s.close();
  await apiServer?.close();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe('webhook load shedding', () => {
  it('answers 429 with Retry-After beyond the concurrency cap, and serves again once a slot frees', async () => {
    const server = await start({ maxConcurrentRequests: 2, metricsListen: { host: '127.0.0.1', port: 0 }, ...slowCluster(1500) });
    const held = [hold(server, 4096), hold(server, 4096)];
    await settle();
    const shed = await send(server, MUTATE_PATH, { body: JSON.stringify(review()) });
    expect(shed.status, shed.body).toBe(429);
    expect(shed.headers['retry-after']).toBe('1');
    expect(shed.body).toMatch(/too many admission requests in flight \(concurrency\)/);
    expect((await send(server, '/healthz')).status).toBe(200);
    expect((await held[0]!.reply).status).toBe(200);
    expect((await held[1]!.reply).status).toBe(200);
    const after = await send(server, MUTATE_PATH, { body: JSON.stringify(review()) });
    expect(after.status).toBe(200);
    expect(JSON.parse(after.body).response.patchType).toBe('JSONPatch');
    const metrics = await new Promise<string>((resolve, reject) => {
      httpGet({ host: '127.0.0.1', port: server.metricsPort, path: '/metrics' }, (res) => {
        let t = '';
        res.on('data', (c) => (t += c));
        res.on('end', () => resolve(t));
      }).on('error', reject);
    });
    expect(metrics).toMatch(/^probe_agent_webhook_shed_total\{reason="concurrency"\} 1$/m);
    expect(metrics).toMatch(/^probe_agent_webhook_requests_total\{path="\/mutate",outcome="overloaded"\} 1$/m);
    expect(metrics).toMatch(/^probe_agent_webhook_requests_in_flight 0$/m);
  });

  it('answers 429 when the bytes of the reviews in flight would pass the budget, but always admits one review alone', async () => {
    const server = await start({ maxRequestBytes: 256 * 1024, maxInflightBytes: 300 * 1024, maxConcurrentRequests: 16, ...slowCluster(1500) });
    const big = hold(server, 200 * 1024);
    await settle();
    const second = hold(server, 200 * 1024);
    const shed = await second.reply;
    expect(shed.status).toBe(429);
    expect(shed.body).toMatch(/\(bytes\)/);
    // A small review still fits beside the big one.
    const small = await send(server, MUTATE_PATH, { body: JSON.stringify(review()) });
    expect(small.status).toBe(200);
    // Padded with spaces after the JSON: still one JSON document.
    expect((await big.reply).status).toBe(200);
  });
});

describe('webhook caller verification', () => {
  const client = (name: string): ClientCert => ({ cert: readFileSync(f(`${name}.crt`)), key: readFileSync(f(`${name}.key`)) });

  it('with --client-ca-file answers the admission paths and /metrics only to a verified client certificate; /healthz stays open', async () => {
    const server = await start({ clientCaFile: f('apiserver-ca.crt') });
    const body = JSON.stringify(review());
    const anonymous = await send(server, MUTATE_PATH, { body });
    expect(anonymous.status).toBe(403);
    expect(anonymous.body).toBe('caller not verified: no client certificate\n');
    const impostor = await send(server, MUTATE_PATH, { body, client: client('impostor') });
    expect(impostor.status).toBe(403);
    expect(impostor.body).toMatch(/^caller not verified: client certificate not verified: /);
    const apiserver = await send(server, MUTATE_PATH, { body, client: client('apiserver') });
    expect(apiserver.status).toBe(200);
    expect(JSON.parse(apiserver.body).response.patchType).toBe('JSONPatch');
    expect((await send(server, '/healthz')).status).toBe(200);
    expect((await send(server, '/metrics')).status).toBe(403);
    const metrics = await send(server, '/metrics', { client: client('apiserver') });
    expect(metrics.status).toBe(200);
    expect(metrics.body).toMatch(/^probe_agent_webhook_requests_total\{path="\/mutate",outcome="unauthorized"\} 2$/m);
  });

  it('says at start, as a warning, when its callers are not verified, and not when they are', async () => {
    const lines: { level: string; msg: string }[] = [];
    const log = createLogger({ level: 'info', write: (l) => lines.push(JSON.parse(l) as { level: string; msg: string }) });
    await start({ log });
    const unverified = lines.filter((l) => l.level === 'warn');
    expect(unverified).toHaveLength(1);
    expect(unverified[0]!.msg).toMatch(/^admission callers are not verified \(no --client-ca-file\): anything that reaches this port can send reviews/);
    lines.length = 0;
    await start({ log, clientCaFile: f('apiserver-ca.crt') });
    expect(lines.filter((l) => l.level === 'warn' || l.level === 'error')).toEqual([]);
    expect(lines.find((l) => l.msg === 'webhook listening')).toMatchObject({ verifyCaller: true });
  });

  it('without a client CA never serves /metrics on the admission port', async () => {
    const server = await start();
    const r = await send(server, '/metrics');
    expect(r.status).toBe(403);
    expect(r.body).toMatch(/needs a verified client certificate \(--client-ca-file\); or scrape --metrics-listen/);
  });

  it('refuses to start on a client CA file that holds no certificate', async () => {
    writeFileSync(f('junk-ca.crt'), 'not a certificate\n');
    await expect(start({ clientCaFile: f('junk-ca.crt') })).rejects.toThrow(/the client CA file .*junk-ca\.crt holds no PEM certificate/);
  });
});
