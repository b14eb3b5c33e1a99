/**
 * Every behaviour of the lab's pod server, exercised over the real network from the node (in a lab
 * with policy 'none', so the node may connect) and from inside the pod's netns where it matters.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'openssl', 'curl']);

import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { protoPath } from 'grpc-health-check';
import { once } from 'node:events';
import * as http from 'node:http';
import * as https from 'node:https';
import * as net from 'node:net';
import * as tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLab, type Lab, type LabPod, type RunningServer } from '../lab/lab.ts';

interface Got { status: number; headers: http.IncomingHttpHeaders; body: string }

/** One GET without redirect following; rejects with 'timeout' when no full answer within timeoutMs. */
function get(url: string, timeoutMs = 2000, headers: Record<string, string> = {}): Promise<Got> {
  return new Promise((resolve, reject) => {
    const mod = url.startsWith('https:') ? https : http;
    const req = mod.get(url, { headers, rejectUnauthorized: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (d: Buffer) => chunks.push(d));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }));
    });
    req.setTimeout(timeoutMs, () => req.destroy(new Error('timeout')));
    req.on('error', reject);
  });
}

/** Health.Check over plaintext gRPC; resolves the status name or the gRPC error code. */
function grpcCheck(target: string, service: string): Promise<string> {
  const def = protoLoader.loadSync(protoPath, { keepCase: true, enums: String });
  const pkg = grpc.loadPackageDefinition(def) as unknown as {
    grpc: { health: { v1: { Health: new (t: string, c: grpc.ChannelCredentials) => grpc.Client & {
      Check(req: { service: string }, opts: grpc.CallOptions, cb: (e: grpc.ServiceError | null, r?: { status: string }) => void): void } } } };
  };
  const client = new pkg.grpc.health.v1.Health(target, grpc.credentials.createInsecure());
  return new Promise((resolve) => {
    client.Check({ service }, { deadline: Date.now() + 2000 }, (err, res) => {
      client.close();
      resolve(err ? `code ${err.code}` : res!.status);
    });
  });
}

describe('pod server', () => {
  let lab: Lab;
  let pod: LabPod;
  let srv: RunningServer;
  let base: string;

  beforeAll(async () => {
    lab = await createLab({ pods: 2, policy: 'none', tag: 'pod-server.test' });
    pod = lab.pods[0]!;
    srv = await lab.startServer(pod, { http: 8080, https: 8443, tcp: 9000, grpc: 9090, hang: 9999, grpcServices: { svc: 'NOT_SERVING' } });
    base = `http://${pod.ipv4}:8080`;
  });
  afterAll(() => lab?.destroy());

  it('serves /healthz and flips it through control', async () => {
    expect(await get(`${base}/healthz`)).toMatchObject({ status: 200, body: 'ok' });
    await srv.control('/control/health?ok=0');
    expect(await get(`http://[${pod.ipv6}]:8080/healthz`)).toMatchObject({ status: 503 });
    await srv.control('/control/health?ok=1');
    expect((await get(`${base}/healthz`)).status).toBe(200);
  });

  it('answers /status/<code>, /secret, unknown paths and bad parameters', async () => {
    expect(await get(`${base}/status/418`)).toMatchObject({ status: 418, body: 'status 418' });
    expect(await get(`${base}/status/503`)).toMatchObject({ status: 503, body: 'status 503' });
    expect(await get(`${base}/secret`)).toMatchObject({ status: 500, body: 'TOP-SECRET-BODY' });
    expect((await get(`${base}/nope`)).status).toBe(404);
    expect((await get(`${base}/status/099`)).status).toBe(400);
    expect((await get(`${base}/big?bytes=-1`)).status).toBe(400);
    expect((await get(`${base}/redirect?code=200&to=/x`)).status).toBe(400);
    const noBody = await get(`${base}/status/204`);
    expect([noBody.status, noBody.body, noBody.headers['content-length']]).toEqual([204, '', undefined]);
    // A Location with CR/LF cannot be sent: the server must answer 400 and live on.
    expect((await get(`${base}/redirect?to=${encodeURIComponent('/x\r\nSet-Cookie: a=b')}`)).status).toBe(400);
    expect((await get(`${base}/healthz`)).status).toBe(200);
  });

  it('redirects as asked, and /loop forever', async () => {
    const to = 'http://example.invalid/landing?x=1';
    const r = await get(`${base}/redirect?to=${encodeURIComponent(to)}&code=307`);
    expect(r.status).toBe(307);
    expect(r.headers.location).toBe(to);
    const l = await get(`${base}/loop`);
    expect([l.status, l.headers.location]).toEqual([302, '/loop']);
  });

  it('echoes the request', async () => {
    const r = await get(`${base}/echo?q=1`, 2000, { 'X-Probe': 'yes' });
    const e = JSON.parse(r.body) as { method: string; url: string; rawHeaders: string[]; remoteAddress: string; localAddress: string };
    expect(e.method).toBe('GET');
    expect(e.url).toBe('/echo?q=1');
    expect(e.rawHeaders).toEqual(expect.arrayContaining(['X-Probe', 'yes']));
    expect(e.remoteAddress).toBe(`::ffff:${lab.gatewayV4}`);
    expect(e.localAddress).toBe(`::ffff:${pod.ipv4}`);
  });

  it('sends /big bodies of the asked size and answers /slow late', async () => {
    expect((await get(`${base}/big?bytes=300000`)).body.length).toBe(300_000);
    const t0 = performance.now();
    expect((await get(`${base}/slow?ms=300`)).status).toBe(200);
    expect(performance.now() - t0).toBeGreaterThanOrEqual(290);
  });

  it('never answers /hang and dribbles /slowloris', async () => {
    await expect(get(`${base}/hang`, 300)).rejects.toThrow('timeout');
    const s = net.connect({ host: pod.ipv4, port: 8080 });
    s.on('error', () => {});
    s.write('GET /slowloris HTTP/1.1\r\nHost: x\r\n\r\n');
    let got = '';
    s.on('data', (d: Buffer) => { got += d.toString(); });
    await new Promise((r) => setTimeout(r, 1100));
    s.destroy();
    expect(got.length).toBeGreaterThanOrEqual(3);
    expect(got.length).toBeLessThanOrEqual(7);
    expect('HTTP/1.1 200 OK'.startsWith(got)).toBe(true);
  });

  it('serves HTTPS with the self-signed lab certificate', async () => {
    expect(await get(`https://${pod.ipv4}:8443/status/201`)).toMatchObject({ status: 201, body: 'status 201' });
    const s = tls.connect({ host: pod.ipv6, port: 8443, rejectUnauthorized: false });
    await once(s, 'secureConnect');
    expect(s.getPeerCertificate().subject.CN).toBe('probe-agent-lab');
    expect(s.authorized).toBe(false);
    s.destroy();
  });

  it('accepts and closes on the TCP port, and never answers on the hang port', async () => {
    const t = net.connect({ host: pod.ipv4, port: 9000 });
    let data = '';
    t.on('data', (d: Buffer) => { data += d.toString(); });
    await once(t, 'end');
    expect(data).toBe('');
    t.destroy();
    const h = net.connect({ host: pod.ipv6, port: 9999 });
    await once(h, 'connect');
    h.write('hello?');
    let answered = false;
    h.on('data', () => { answered = true; });
    h.on('end', () => { answered = true; });
    await new Promise((r) => setTimeout(r, 300));
    expect(answered).toBe(false);
    h.destroy();
  });

  it('serves grpc.health.v1 and changes statuses through control', async () => {
    const target = `${pod.ipv4}:9090`;
    expect(await grpcCheck(target, '')).toBe('SERVING');
    expect(await grpcCheck(`[${pod.ipv6}]:9090`, 'svc')).toBe('NOT_SERVING');
    expect(await grpcCheck(target, 'missing')).toBe(`code ${grpc.status.NOT_FOUND}`);
    await srv.control('/control/grpc?service=svc&status=SERVING');
    expect(await grpcCheck(target, 'svc')).toBe('SERVING');
    await srv.control('/control/grpc?service=&status=NOT_SERVING');
    expect(await grpcCheck(target, '')).toBe('NOT_SERVING');
    await expect(srv.control('/control/grpc?service=svc&status=BOGUS')).rejects.toThrow(/400/);
  });

  it('survives client resets on every port', async () => {
    for (const port of [8080, 8443, 9000, 9090, 9999]) {
      const s = net.connect({ host: pod.ipv4, port });
      s.on('error', () => {});
      await once(s, 'connect');
      s.write('GET /hang HTTP/1.1\r\nHost: x\r\n\r\n');
      await new Promise((r) => setTimeout(r, 20));
      s.resetAndDestroy();
    }
    await new Promise((r) => setTimeout(r, 100));
    expect((await get(`${base}/healthz`)).status).toBe(200);
  });

  it('binds to loopback only when asked, and controls a server without HTTP', async () => {
    const other = lab.pods[1]!;
    const lo = await lab.startServer(other, { http: 0, grpc: 0, bind: 'loopback' });
    await expect(get(`http://${other.ipv4}:${lo.ports.http}/healthz`, 1000)).rejects.toThrow(/ECONNREFUSED/);
    for (const host of ['127.0.0.1', '[::1]']) {
      const r = await lab.exec(other, 'curl', ['-s', '-g', `http://${host}:${lo.ports.http}/healthz`]);
      expect(r.stdout, host).toBe('ok');
    }
    await lo.stop();
    const g = await lab.startServer(other, { grpc: 0 });
    expect(g.ports.control).toBeGreaterThan(0);
    await g.control('/control/grpc?service=&status=NOT_SERVING');
    expect(await grpcCheck(`${other.ipv4}:${g.ports.grpc}`, '')).toBe('NOT_SERVING');
    await g.stop();
    await g.stop();
    expect(() => process.kill(g.pid, 0)).toThrow();
    await expect(g.control('/healthz')).rejects.toThrow(/exited/);
    await expect(lab.startServer(other, { htpp: 8080 } as never)).rejects.toThrow(/unknown option\(s\) htpp/);
  });
});
