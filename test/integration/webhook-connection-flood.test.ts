/**
 * The webhook answers the API server while other clients flood its connections: idle TCP sockets,
 * TLS handshakes that never end, and finished handshakes that send nothing, each reopened as soon
 * as the server cuts it, from one address and spread over many. Meanwhile a client with the API
 * server's admission client certificate sends 20 AdmissionReviews, each on a new connection (the
 * worst case: a new handshake each time). Every one must be answered with its patch, the server's
 * anonymous RSS must stay under the deployment's 128Mi limit, and the flood must really have been cut (the
 * eviction metric). The webhook runs as a process of its own from the CLI, with the deployment's
 * heap cap, so its memory is its own.
 */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { get as httpGet } from 'node:http';
import { request } from 'node:https';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MUTATE_PATH } from '../../agent/webhook/admission.ts';
import type { FloodMode } from '../lab/connection-flood.ts';
import { builtEntry } from '../support/built-cli.ts';
import { startWebhookProcess, type WebhookProcess } from '../support/webhook-process.ts';
import { issueCert } from '../support/issue-cert.ts';

let dir: string;
const f = (name: string): string => path.join(dir, name);
/** The deployment's container limit, read from deploy/components/rewrite-webhook/deployment.yaml. */
const MEMORY_LIMIT_BYTES = (() => {
  const yaml = readFileSync(path.join(fileURLToPath(new URL('../..', import.meta.url)), 'deploy/components/rewrite-webhook/deployment.yaml'), 'utf8');
  const mi = /limits:\n(?:\s*#.*\n)*\s*memory: (\d+)Mi/.exec(yaml)?.[1];
  if (!mi) throw new Error('no memory limit in the webhook deployment');
  return Number(mi) * 1024 * 1024;
})();
const REVIEWS = 20;

/** A CA and a certificate it signed, `<name>-ca.crt`, `<name>.crt`, `<name>.key`, in the test's directory. */
const issue = (name: string, cn: string, ext: string): void => issueCert(dir, name, cn, ext);

function review(i: number): string {
  return JSON.stringify({
    apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview',
    request: {
      uid: `705ab4f5-6393-11e8-b7cc-42010a8000${String(i).padStart(2, '0')}`, kind: { group: '', version: 'v1', kind: 'Pod' }, resource: { group: '', version: 'v1', resource: 'pods' },
      namespace: 'shop', operation: 'CREATE', userInfo: { username: 'system:serviceaccount:kube-system:replicaset-controller' },
      object: { apiVersion: 'v1', kind: 'Pod', metadata: { generateName: 'web-' }, spec: { containers: [{ name: 'web', image: 'nginx', readinessProbe: { httpGet: { path: '/', port: 80 } } }] } },
      oldObject: null,
    },
  });
}

async function startWebhook(clientCa: boolean): Promise<WebhookProcess & { metricsPort: number }> {
  // The deployment's heap cap (NODE_OPTIONS there).
  const webhook = await startWebhookProcess(process.execPath, ['--max-old-space-size=64', builtEntry('cli.js'), 'webhook', '--listen', '127.0.0.1:0',
    '--tls-cert-file', f('serving.crt'), '--tls-key-file', f('serving.key'), '--metrics-listen', '127.0.0.1:0', '--log-format', 'text',
    ...(clientCa ? ['--client-ca-file', f('apiserver-ca.crt')] : ['--no-client-ca-file'])]);
  if (webhook.metricsPort === undefined) throw new Error(`no metrics listener logged: ${webhook.stderr()}`);
  return { ...webhook, metricsPort: webhook.metricsPort };
}

/** One review on a new connection, as the API server with its admission client certificate. */
function apiServerReview(port: number, i: number): Promise<{ status: number; body: string; ms: number } | { error: string }> {
  return new Promise((resolve) => {
    const t0 = Date.now();
    // Where a review that gets no answer stopped: TCP, TLS or the answer.
    const marks: string[] = [];
    const req = request({
      host: '127.0.0.1', port, path: MUTATE_PATH, method: 'POST', agent: false, servername: 'localhost',
      ca: readFileSync(f('serving-ca.crt')), cert: readFileSync(f('apiserver.crt')), key: readFileSync(f('apiserver.key')),
      headers: { 'content-type': 'application/json' }, timeout: 20_000,
    }, (res) => {
      let body = '';
      res.on('data', (c) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body, ms: Date.now() - t0 }));
      res.on('error', (err) => resolve({ error: String(err) }));
    });
    req.on('socket', (s) => {
      s.once('connect', () => marks.push(`connect ${Date.now() - t0}`));
      s.once('secureConnect', () => marks.push(`tls ${Date.now() - t0}`));
    });
    req.on('timeout', () => req.destroy(new Error(`no answer within 20 s: ${marks.join(', ')}`)));
    req.on('error', (err) => resolve({ error: String(err) }));
    req.end(review(i));
  });
}

/**
 * The process's anonymous resident memory: what its container's limit is spent on. (Its file pages,
 * the node binary's ~50 MiB, are shared page cache and reclaimable.)
 */
function rssBytes(pid: number): number {
  const m = /^RssAnon:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) * 1024 : 0;
}

function scrape(port: number): Promise<string> {
  return new Promise((resolve, reject) => {
    httpGet({ host: '127.0.0.1', port, path: '/metrics' }, (res) => {
      let t = '';
      res.on('data', (c) => (t += c));
      res.on('end', () => resolve(t));
    }).on('error', reject);
  });
}

const range = (prefix: string, n: number): string[] => Array.from({ length: n }, (_, i) => `${prefix}${i + 1}`);

/** The floods in a process of their own (connection-flood.ts says why); `stop` returns their counts. */
async function startFloods(port: number, floods: Array<{ mode: FloodMode; from: string[]; sockets: number }>) {
  const child = spawn(process.execPath, [fileURLToPath(new URL('../lab/connection-flood.ts', import.meta.url)),
    JSON.stringify(floods.map((fl) => ({ host: '127.0.0.1', port, ...fl })))], { stdio: ['pipe', 'pipe', 'inherit'] });
  let out = '';
  child.stdout!.on('data', (d) => (out += d));
  while (!out.startsWith('ready\n')) {
    if (child.exitCode !== null) throw new Error('the flood process exited before it started');
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    stop: async (): Promise<Array<{ opened: number; cut: number }>> => {
      const exited = once(child, 'exit');
      child.stdin!.end();
      await exited;
      return JSON.parse(out.slice('ready\n'.length)) as Array<{ opened: number; cut: number }>;
    },
  };
}

/** Runs the floods while the API server's reviews go through; returns what it saw. */
async function underFlood(webhook: WebhookProcess & { metricsPort: number }, floods: Array<{ mode: FloodMode; from: string[]; sockets: number }>) {
  const running = await startFloods(webhook.port, floods);
  let peak = 0;
  const sampler = setInterval(() => (peak = Math.max(peak, rssBytes(webhook.child.pid!))), 100);
  let counts: Array<{ opened: number; cut: number }> | undefined;
  try {
    // Let the floods fill every slot they can, and the server cut some of them.
    await new Promise((r) => setTimeout(r, 3000));
    const answers = [];
    for (let i = 0; i < REVIEWS; i++) answers.push(await apiServerReview(webhook.port, i));
    peak = Math.max(peak, rssBytes(webhook.child.pid!));
    const metrics = await scrape(webhook.metricsPort);
    counts = await running.stop();
    return { answers, peak, floods: counts, metrics };
  } finally {
    clearInterval(sampler);
    if (!counts) await running.stop();
  }
}

function expectAllAnswered(answers: Array<{ status: number; body: string; ms: number } | { error: string }>): void {
  const ok = answers.filter((a) => 'status' in a && a.status === 200 && JSON.parse(a.body).response?.patchType === 'JSONPatch').length;
  const ms = answers.flatMap((a) => ('ms' in a ? [a.ms] : [])).sort((a, b) => a - b);
  console.log(`webhook connection flood: ${ok}/${answers.length} reviews answered; connect to answer p50 ${ms[ms.length >> 1]} ms, max ${ms.at(-1)} ms`, answers.filter((a) => !('status' in a) || a.status !== 200).slice(0, 3));
  expect(ok).toBe(answers.length);
}

beforeAll(() => {
  dir = mkdtempSync(path.join(tmpdir(), 'probe-agent-webhook-flood-'));
  issue('serving', 'probe-agent-webhook.probe-agent.svc', 'subjectAltName=DNS:localhost,IP:127.0.0.1');
  issue('apiserver', 'kube-apiserver-admission', 'extendedKeyUsage=clientAuth');
});

afterAll(() => {
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const FLOODS: Array<{ mode: FloodMode; from: string[]; sockets: number }> = [
  { mode: 'idle', from: ['127.0.0.2'], sockets: 300 },
  { mode: 'slow-handshake', from: ['127.0.0.3'], sockets: 100 },
  { mode: 'tls-idle', from: ['127.0.0.4'], sockets: 100 },
  // Spread over many addresses, as many pods would be.
  { mode: 'idle', from: range('127.0.1.', 32), sockets: 10 },
  { mode: 'tls-idle', from: range('127.0.2.', 16), sockets: 4 },
];

describe('webhook under a connection flood', () => {
  it('with --client-ca-file: every review of the API server is answered, memory stays under the limit', async () => {
    const webhook = await startWebhook(true);
    try {
      const seen = await underFlood(webhook, FLOODS);
      console.log('flood', JSON.stringify(seen.floods), `peak anonymous RSS ${(seen.peak / 1048576).toFixed(1)} MiB`);
      expectAllAnswered(seen.answers);
      expect(seen.peak).toBeLessThan(MEMORY_LIMIT_BYTES);
      expect(seen.floods[0]!.cut).toBeGreaterThan(0);
      expect(seen.metrics).toMatch(/^probe_agent_webhook_connections_evicted_total\{pool="handshake"\} [1-9]\d*$/m);
      expect(seen.metrics).toMatch(/^probe_agent_webhook_connections_evicted_total\{pool="other"\} [1-9]\d*$/m);
      expect(seen.metrics).not.toMatch(/pool="verified"/);
      expect(seen.metrics).toMatch(new RegExp(`^probe_agent_webhook_requests_total\\{path="/mutate",outcome="rewritten"\\} ${REVIEWS}$`, 'm'));
      expect(webhook.child.exitCode).toBeNull();
    } finally {
      webhook.child.kill('SIGTERM');
      await once(webhook.child, 'exit');
    }
  }, 180_000);

  it('without a client CA: the flood is held to its own sources, and every review is answered', async () => {
    const webhook = await startWebhook(false);
    try {
      const seen = await underFlood(webhook, FLOODS);
      console.log('flood', JSON.stringify(seen.floods), `peak anonymous RSS ${(seen.peak / 1048576).toFixed(1)} MiB`);
      expectAllAnswered(seen.answers);
      expect(seen.peak).toBeLessThan(MEMORY_LIMIT_BYTES);
      expect(seen.metrics).toMatch(/^probe_agent_webhook_connections_evicted_total\{pool="handshake"\} [1-9]\d*$/m);
      expect(seen.metrics).toMatch(/^probe_agent_webhook_connections_refused_total [1-9]\d*$/m);
      expect(webhook.child.exitCode).toBeNull();
    } finally {
      webhook.child.kill('SIGTERM');
      await once(webhook.child, 'exit');
    }
  }, 180_000);
});
