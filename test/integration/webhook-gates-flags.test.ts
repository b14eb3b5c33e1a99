/**
 * The webhook's gates flags as an operator gives them to the real process: with
 * `--gates-refused-runtime-classes` the given list replaces the default sandboxed list on
 * /mutate-gates, a malformed list stops the start with a clear error (exit 2), and
 * `--gates-lease-controller` without an API server, or with a leader Lease too short to act in, is refused at start.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { request } from 'node:https';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LogLines, trackLogs } from '../support/log-check.ts';

type Obj = Record<string, any>;

const CLI = path.join(new URL('../..', import.meta.url).pathname, 'agent/cli.ts');
let dir: string;
let cert: string;
let key: string;
let webhook: ChildProcess;
let port = 0;

function review(runtimeClassName: string): Obj {
  return {
    apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview',
    request: {
      uid: `u-${runtimeClassName}`, kind: { group: '', version: 'v1', kind: 'Pod' }, resource: { group: '', version: 'v1', resource: 'pods' }, operation: 'CREATE',
      object: {
        apiVersion: 'v1', kind: 'Pod', metadata: { name: 'p', namespace: 'shop' },
        spec: { runtimeClassName, containers: [{ name: 'app', image: 'app', readinessProbe: { httpGet: { path: '/ready', port: 8080 } } }] },
      },
    },
  };
}

function post(body: Obj): Promise<Obj> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path: '/mutate-gates', method: 'POST', ca: readFileSync(cert), servername: 'localhost', headers: { 'content-type': 'application/json' } }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (text += c));
      res.on('end', () => resolve(JSON.parse(text) as Obj));
    });
    req.on('error', reject);
    req.end(JSON.stringify(body));
  });
}

beforeAll(async () => {
  dir = mkdtempSync(path.join(tmpdir(), 'pa-webhook-gates-'));
  key = path.join(dir, 'tls.key');
  cert = path.join(dir, 'tls.crt');
  const ssl = spawnSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', key, '-out', cert, '-subj', '/CN=localhost', '-addext', 'subjectAltName=DNS:localhost', '-days', '1'], { encoding: 'utf8' });
  if (ssl.status !== 0) throw new Error(`openssl: ${ssl.stderr}`);
  webhook = spawn(process.execPath, [CLI, 'webhook', '--listen=127.0.0.1:0', `--tls-cert-file=${cert}`, `--tls-key-file=${key}`, '--gates-refused-runtime-classes=fast, secure-rc', '--log-format=json'], { stdio: ['ignore', 'ignore', 'pipe'] });
  const lines = new LogLines();
  webhook.stderr!.setEncoding('utf8');
  webhook.stderr!.on('data', (c: string) => {
    for (const r of lines.push(c)) if (r.msg === 'webhook listening') port = Number(r.port);
  });
  trackLogs(`webhook pid ${webhook.pid}`, lines.records, [
    { level: 'warn', msg: /^admission callers are not verified/, why: 'no client CA: the test itself posts the reviews' },
    { level: 'warn', msg: /^no API server/, why: 'not in a pod and no --api-server-url: RuntimeClasses are taken by name, as this test wants' },
  ]);
  const end = Date.now() + 20_000;
  while (port === 0) {
    if (Date.now() > end || webhook.exitCode !== null) throw new Error(`webhook did not start: ${JSON.stringify(lines.records.slice(-3))}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}, 30_000);

afterAll(async () => {
  if (webhook && webhook.exitCode === null) {
    const gone = new Promise((r) => webhook.once('exit', r));
    webhook.kill('SIGTERM');
    await gone;
  }
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe('probe-agent webhook: gates flags', () => {
  it('--gates-refused-runtime-classes replaces the default list', async () => {
    for (const rc of ['fast', 'secure-rc']) {
      const r = (await post(review(rc))).response;
      expect(r.warnings?.[0], rc).toMatch(new RegExp(`^probe-agent: gates mode: probes left unchanged: runtimeClassName "${rc}" is sandboxed`));
    }
    // runsc is on the default list only: with the operator's list it is served.
    const runsc = (await post(review('runsc'))).response;
    expect(runsc.warnings).toBeUndefined();
    const ops = JSON.parse(Buffer.from(runsc.patch, 'base64').toString('utf8')) as Obj[];
    expect(ops.some((o) => o.path === '/spec/readinessGates')).toBe(true);
  });

  it('refuses a malformed list, and the lease controller without an API server, at start', () => {
    const bad = spawnSync(process.execPath, [CLI, 'webhook', '--listen=127.0.0.1:0', `--tls-cert-file=${cert}`, `--tls-key-file=${key}`, '--gates-refused-runtime-classes=Kata Fast'], { encoding: 'utf8' });
    expect(bad.status).toBe(2);
    expect(bad.stderr).toMatch(/^probe-agent webhook: cannot start: --gates-refused-runtime-classes: not a RuntimeClass or handler name: "Kata Fast"/);
    const lease = spawnSync(process.execPath, [CLI, 'webhook', '--listen=127.0.0.1:0', `--tls-cert-file=${cert}`, `--tls-key-file=${key}`, '--gates-lease-controller'], { encoding: 'utf8', env: { ...process.env, KUBERNETES_SERVICE_HOST: '' } });
    expect(lease.status).toBe(2);
    expect(lease.stderr).toMatch(/--gates-lease-controller needs the API server/);
    // A leader Lease shorter than the request timeout and margin twice over would leave a leader no time to act.
    const short = spawnSync(process.execPath, [CLI, 'webhook', '--listen=127.0.0.1:0', `--tls-cert-file=${cert}`, `--tls-key-file=${key}`, '--gates-lease-controller',
      '--api-server-url=https://127.0.0.1:1', '--gates-leader-lease-duration=5s'], { encoding: 'utf8' });
    expect(short.status).toBe(2);
    expect(short.stderr).toMatch(/--gates-leader-lease-duration: want 12s\.\.5m, got "5s"/);
  });
});
