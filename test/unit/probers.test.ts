/**
 * The probers against real servers on loopback (127.0.0.1 and ::1), through plain node-netns
 * sockets: every kubelet rule for HTTP, TCP and gRPC, with the servers reporting what they saw.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import http from 'node:http';
import http2 from 'node:http2';
import https from 'node:https';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TLSSocket } from 'node:tls';
import * as grpc from '@grpc/grpc-js';
import { HealthImplementation } from 'grpc-health-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { Deadline } from '../../agent/probe/connect.ts';
import { decodeHealthStatus, encodeHealthCheckRequest, goDuration } from '../../agent/probe/grpc-wire.ts';
import { encodeFrame } from '../../agent/grpc/frame.ts';
import { decodeGrpcMessage } from '../../agent/grpc/headers.ts';
import { probeHttp } from '../../agent/probe/http.ts';
import { runProbe } from '../../agent/probe/run.ts';
import type { HttpGetHandler, ProbeContext, ProbeHandler, SocketFactory } from '../../agent/probe/types.ts';
import { HelperError } from '../../agent/errors.ts';

const sockets = new NodeSocketFactory();
const closers: (() => Promise<void> | void)[] = [];

function ctx(over: Partial<ProbeContext> = {}): ProbeContext {
  return {
    netns: undefined,
    podIPs: ['127.0.0.1'],
    timeoutSeconds: 1,
    sockets,
    nodeSockets: sockets,
    kubeVersion: '1.34',
    hostFieldPolicy: 'refuse',
    happyEyeballs: false,
    ...over,
  };
}

function httpGet(port: number, path: string, over: Partial<HttpGetHandler> = {}): HttpGetHandler {
  return { kind: 'http', port, path, scheme: 'HTTP', headers: [], ...over };
}

/** Server-side sockets still open per server: a probe that leaks its connection shows up here. */
const openConnections = new Map<string, Set<net.Socket>>();

async function listen(server: net.Server, host: string, opts: { ipv6Only?: boolean } = {}): Promise<number> {
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen({ port: 0, host, ipv6Only: opts.ipv6Only }, resolve);
  });
  const port = (server.address() as net.AddressInfo).port;
  const open = new Set<net.Socket>();
  openConnections.set(`${host}:${port}`, open);
  server.on('connection', (s: net.Socket) => {
    open.add(s);
    s.once('close', () => open.delete(s));
  });
  closers.push(
    () =>
      new Promise<void>((resolve) => {
        for (const s of open) s.destroy();
        server.close(() => resolve());
      }),
  );
  return port;
}

/** A port nothing listens on (bound then released). */
async function closedPort(): Promise<number> {
  const s = net.createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const port = (s.address() as net.AddressInfo).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

/** Every request the HTTP servers saw, for asserting what went on the wire. */
interface Seen {
  url: string;
  rawHeaders: string[];
  /** HTTPS only: the SNI name the client sent (TLSSocket.servername: false or null when it sent none). */
  servername?: string | false | null;
  /** HTTPS only: whether the client resumed an earlier TLS session. */
  reused?: boolean;
}
const seen: Seen[] = [];
let bigBodyBytesWritten = 0;

function handler(tlsPort: () => number) {
  return (req: http.IncomingMessage, res: http.ServerResponse): void => {
    const u = new URL(req.url ?? '/', 'http://x');
    seen.push({ url: req.url ?? '', rawHeaders: req.rawHeaders, servername: (req.socket as TLSSocket).servername, reused: (req.socket as TLSSocket).isSessionReused?.() });
    const code = Number(u.searchParams.get('code') ?? 302);
    if (u.pathname.startsWith('/status/')) {
      const status = Number(u.pathname.slice(8));
      res.writeHead(status, status >= 300 && status < 400 ? {} : undefined).end(`status ${status}`);
    } else if (u.pathname === '/redirect') {
      res.writeHead(code, { location: u.searchParams.get('to') ?? '/' }).end(`<a href="${u.searchParams.get('to')}">moved</a>`);
    } else if (u.pathname === '/chain') {
      const n = Number(u.searchParams.get('n') ?? 0);
      res.writeHead(302, { location: n > 1 ? `/chain?n=${n - 1}` : '/echo' }).end();
    } else if (u.pathname === '/to-tls') {
      res.writeHead(302, { location: `https://127.0.0.1:${tlsPort()}/echo` }).end();
    } else if (u.pathname === '/loop') {
      res.writeHead(302, { location: '/loop' }).end();
    } else if (u.pathname === '/echo') {
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ url: req.url, rawHeaders: req.rawHeaders }));
    } else if (u.pathname === '/big') {
      const total = Number(u.searchParams.get('bytes'));
      res.writeHead(200, { 'content-length': String(total) });
      const chunk = Buffer.alloc(64 * 1024, 'b');
      let sent = 0;
      const pump = (): void => {
        while (sent < total) {
          const n = Math.min(chunk.length, total - sent);
          sent += n;
          bigBodyBytesWritten = sent;
          if (!res.write(chunk.subarray(0, n))) return void res.once('drain', pump);
        }
        res.end();
      };
      res.on('close', () => (bigBodyBytesWritten = sent));
      pump();
    } else if (u.pathname === '/write-continue') {
      res.writeContinue();
      res.writeHead(200).end('after continue');
    } else if (u.pathname === '/secret') {
      res.writeHead(500).end('TOP-SECRET-BODY');
    } else if (u.pathname === '/hang') {
      // never answers
    } else if (u.pathname === '/slow-body') {
      res.writeHead(200, { 'content-length': '100' });
      res.write('partial');
    } else {
      res.writeHead(404).end('not found');
    }
  };
}

/**
 * Byte-exact HTTP/1.1 responses, by request path, for what node:http will not send (1xx before the
 * final response, a body cut short or reset, a stall after the status line).
 */
const RAW: Record<string, (s: net.Socket) => void> = {
  '/continue': (s) => s.end('HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok'),
  '/early-hints': (s) => s.end('HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\nHTTP/1.1 100\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n'),
  '/six-1xx': (s) => s.end('HTTP/1.1 102 Processing\r\n\r\n'.repeat(6) + 'HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n'),
  '/after-500ms': (s) => void setTimeout(() => s.end('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok'), 500),
  '/untrimmed': (s) => s.end('HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n  ok \n\t\n'),
  '/reset-body': (s) => {
    s.write('HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial');
    setTimeout(() => s.resetAndDestroy(), 50);
  },
  '/short-body': (s) => s.end('HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial'),
  '/stall-500': (s) => void s.write('HTTP/1.1 500 Internal Server Error\r\nContent-Length: 100\r\n\r\nx'),
  '/reset-503': (s) => {
    s.write('HTTP/1.1 503 Service Unavailable\r\nContent-Length: 100\r\n\r\nx');
    setTimeout(() => s.resetAndDestroy(), 50);
  },
  // A followed redirect whose body never ends: Go drains (up to 2 KiB) a body of unknown length, so the deadline runs out.
  '/redirect-stall-unknown': (s) => void s.write('HTTP/1.1 302 Found\r\nLocation: /continue\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nmoved\r\n'),
  // The same with a big declared length: Go does not read it and follows at once.
  '/redirect-stall-big': (s) => void s.write('HTTP/1.1 302 Found\r\nLocation: /continue\r\nContent-Length: 100000\r\n\r\nmoved'),
};

let httpPort = 0;
let rawPort = 0;
let httpsPort = 0;
let v6OnlyPort = 0;
let hangPort = 0;
let garbagePort = 0;
let eofPort = 0;
let certDir = '';

beforeAll(async () => {
  certDir = mkdtempSync(join(tmpdir(), 'probers-cert-'));
  execFileSync('openssl', [
    'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', '1',
    '-keyout', join(certDir, 'key.pem'), '-out', join(certDir, 'cert.pem'), '-subj', '/CN=probers-test',
  ], { stdio: 'ignore' });
  const h = handler(() => httpsPort);
  // '::' is dual-stack: the same port answers on 127.0.0.1 and ::1.
  httpPort = await listen(http.createServer(h), '::');
  httpsPort = await listen(https.createServer({ key: readFileSync(join(certDir, 'key.pem')), cert: readFileSync(join(certDir, 'cert.pem')) }, h), '::');
  hangPort = await listen(net.createServer((s) => s.resume()), '::');
  rawPort = await listen(
    net.createServer((s) => {
      let buf = '';
      s.on('data', (d) => {
        buf += d.toString('latin1');
        const end = buf.indexOf('\r\n\r\n');
        if (end === -1) return;
        s.removeAllListeners('data');
        s.resume();
        const path = buf.split(' ')[1] ?? '/';
        const reply = RAW[path];
        if (reply) reply(s);
        else s.end('HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n');
      });
      s.on('error', () => {});
    }),
    '::',
  );
  garbagePort = await listen(net.createServer((s) => s.resume().end('this is not HTTP at all\r\n\r\n')), '::');
  eofPort = await listen(net.createServer((s) => s.once('data', () => s.end())), '::');
  v6OnlyPort = await listen(http.createServer(h), '::1', { ipv6Only: true });
});

afterAll(async () => {
  for (const close of closers.reverse()) await close();
  rmSync(certDir, { recursive: true, force: true });
});

async function run(h: ProbeHandler, over: Partial<ProbeContext> = {}) {
  return runProbe(h, ctx(over));
}

describe('HTTP prober', () => {
  it('2xx is success with the body as message', async () => {
    const out = await run(httpGet(httpPort, '/status/204'));
    expect(out).toMatchObject({ result: 'success', address: `127.0.0.1:${httpPort}` });
    const ok = await run(httpGet(httpPort, '/status/200'));
    expect(ok).toMatchObject({ result: 'success', message: 'status 200' });
    expect(ok.phases.connect).toBeGreaterThan(0);
    expect(ok.phases.firstByte).toBeGreaterThan(0);
    expect(ok.phases.total).toBe(ok.durationSeconds);
  });

  it('3xx that is not followed (399) is a warning with the body', async () => {
    expect(await run(httpGet(httpPort, '/status/399'))).toMatchObject({ result: 'warning', message: 'Probe terminated redirects, Response body: status 399' });
  });

  it.each([400, 404, 500, 503])('%i is a failure with kubelet\'s message', async (status) => {
    expect(await run(httpGet(httpPort, `/status/${status}`))).toMatchObject({
      result: 'failure', reason: 'status', message: `HTTP probe failed with statuscode: ${status}`,
    });
  });

  it('never puts a failure body in the message', async () => {
    const out = await run(httpGet(httpPort, '/secret'));
    expect(out.result).toBe('failure');
    expect(out.message).toBe('HTTP probe failed with statuscode: 500');
    expect(JSON.stringify(out)).not.toContain('TOP-SECRET');
  });

  it('a redirect to another host is not followed: warning with the redirect body', async () => {
    const before = seen.length;
    const out = await run(httpGet(httpPort, `/redirect?to=${encodeURIComponent('http://0.0.0.0/')}`));
    expect(out).toMatchObject({ result: 'warning', message: 'Probe terminated redirects, Response body: <a href="http://0.0.0.0/">moved</a>' });
    expect(seen.length - before).toBe(1);
  });

  it('a same-host chain is followed, new headers include Referer, last response decides', async () => {
    const before = seen.length;
    const out = await run(httpGet(httpPort, '/chain?n=3', { headers: [{ name: 'x-probe', value: 'v' }] }));
    expect(out.result).toBe('success');
    const hops = seen.slice(before);
    expect(hops.map((s) => s.url)).toEqual(['/chain?n=3', '/chain?n=2', '/chain?n=1', '/echo']);
    const last = hops[3] as Seen;
    expect(last.rawHeaders).toContain('Referer');
    expect(last.rawHeaders[last.rawHeaders.indexOf('Referer') + 1]).toBe(`http://127.0.0.1:${httpPort}/chain?n=1`);
    expect(last.rawHeaders).toContain('X-Probe');
  });

  it('a port-only change on the same host is followed (here to the HTTPS port)', async () => {
    const out = await run(httpGet(httpPort, '/to-tls'));
    expect(out.result).toBe('success');
    expect(out.address).toBe(`127.0.0.1:${httpsPort}`);
    expect(out.phases.tls).toBeGreaterThan(0);
  });

  it('a redirect loop fails after 10 requests with Go\'s message', async () => {
    const before = seen.length;
    const out = await run(httpGet(httpPort, '/loop'));
    expect(out).toMatchObject({ result: 'failure', reason: 'redirects', message: 'Get "/loop": stopped after 10 redirects' });
    expect(seen.length - before).toBe(10);
  });

  it('sends exactly kubelet\'s headers in Go\'s order: Host with port, UA, Accept, canonical repeats, Connection: close', async () => {
    const out = await run(httpGet(httpPort, '/echo?q=1', {
      headers: [{ name: 'x-b', value: '2' }, { name: 'x-a', value: '1' }, { name: 'X-B', value: '3' }],
    }));
    const echo = JSON.parse(out.message) as { url: string; rawHeaders: string[] };
    expect(echo.url).toBe('/echo?q=1');
    // Go's bytes: Host first, Connection: close last (net/http transport.go persistConn.roundTrip puts it in
    // extraHeaders when DisableKeepAlives, which Request.write writes after the header map; undici wrote both first).
    expect(echo.rawHeaders).toEqual([
      'Host', `127.0.0.1:${httpPort}`,
      'User-Agent', 'kube-probe/1.34', 'Accept', '*/*', 'X-A', '1', 'X-B', '2', 'X-B', '3', 'Connection', 'close',
    ]);
    expect(echo.rawHeaders.map((h) => h.toLowerCase())).not.toContain('accept-encoding');
  });

  it('empty Accept removes it; custom Host and UA are used', async () => {
    const out = await run(httpGet(httpPort, '/echo', {
      headers: [{ name: 'accept', value: '' }, { name: 'host', value: 'app.example' }, { name: 'user-agent', value: 'mine' }],
    }));
    const { rawHeaders } = JSON.parse(out.message) as { rawHeaders: string[] };
    expect(rawHeaders).toEqual(['Host', 'app.example', 'User-Agent', 'mine', 'Connection', 'close']);
  });

  it('IPv6 pod IP: Host is bracketed', async () => {
    const out = await run(httpGet(httpPort, '/echo'), { podIPs: ['::1'] });
    const { rawHeaders } = JSON.parse(out.message) as { rawHeaders: string[] };
    expect(rawHeaders.slice(0, 2)).toEqual(['Host', `[::1]:${httpPort}`]);
    expect(out.address).toBe(`[::1]:${httpPort}`);
  });

  it('reads at most 10 KiB of body and stops the transfer', async () => {
    const d = new Deadline(5000);
    try {
      const plan = { host: '127.0.0.1', port: httpPort, ips: ['127.0.0.1'], netns: undefined, sockets, legacyNode: false };
      const t0 = performance.now();
      const r = await probeHttp(httpGet(httpPort, '/big?bytes=67108864'), plan, d, '1.34');
      expect(r.result).toBe('success');
      expect(r.message).toBe('b'.repeat(10 * 1024));
      // The message is the proof of the cap; this is only a liveness bound.
      expect(performance.now() - t0).toBeLessThan(5000);
    } finally {
      d.dispose();
    }
    await new Promise((r) => setTimeout(r, 100));
    expect(bigBodyBytesWritten).toBeLessThan(64 * 1024 * 1024);
  });

  it('bounds the outcome message to 1 KiB', async () => {
    const out = await run(httpGet(httpPort, '/big?bytes=5000'));
    expect(out.result).toBe('success');
    expect(Buffer.byteLength(out.message)).toBeLessThanOrEqual(1024);
    expect(out.message.endsWith('(truncated)')).toBe(true);
  });

  it('HTTPS with a self-signed certificate is accepted, and no SNI is sent for an IP', async () => {
    const before = seen.length;
    const out = await run(httpGet(httpsPort, '/echo', { scheme: 'HTTPS' }));
    expect(out.result).toBe('success');
    expect(out.phases.tls).toBeGreaterThan(0);
    expect(seen[before]?.servername).toBeFalsy();
  });

  it('every HTTPS probe makes a full handshake: no TLS session is resumed (kubelet: a new connection per probe)', async () => {
    const before = seen.length;
    for (let i = 0; i < 3; i++) expect((await run(httpGet(httpsPort, '/echo', { scheme: 'HTTPS' }))).result).toBe('success');
    expect(seen.slice(before).map((s) => s.reused)).toEqual([false, false, false]);
  });

  it('HTTPS to a name (legacy host field from the node) sends it as SNI', async () => {
    const before = seen.length;
    const out = await run(httpGet(httpsPort, '/echo', { scheme: 'HTTPS', host: 'localhost' }));
    expect(out.result).toBe('success');
    expect(seen[before]?.servername).toBe('localhost');
    const { rawHeaders } = JSON.parse(out.message) as { rawHeaders: string[] };
    expect(rawHeaders.slice(0, 2)).toEqual(['Host', `localhost:${httpsPort}`]);
  });

  it('HTTPS against a plain HTTP port fails with a TLS reason', async () => {
    expect(await run(httpGet(httpPort, '/', { scheme: 'HTTPS' }))).toMatchObject({ result: 'failure', reason: 'tls' });
  });

  it('a server that never answers times out within the timeout', async () => {
    const t0 = performance.now();
    const out = await run(httpGet(httpPort, '/hang'));
    const took = performance.now() - t0;
    expect(out).toMatchObject({
      result: 'failure', reason: 'timeout',
      message: `Get "http://127.0.0.1:${httpPort}/hang": context deadline exceeded (Client.Timeout exceeded while awaiting headers)`,
    });
    expect(took).toBeGreaterThanOrEqual(990);
    expect(took).toBeLessThan(10_000);
  });

  it('a body that stops coming after a 2xx is a prober error (kubelet: ReadAtMost fails, the result is thrown away)', async () => {
    const out = await run(httpGet(httpPort, '/slow-body'));
    expect(out).toMatchObject({
      result: 'error', reason: 'timeout',
      message: 'context deadline exceeded (Client.Timeout or context cancellation while reading body)',
    });
  });

  it.each([
    ['/continue', 'success', 'ok'],
    ['/early-hints', 'success', ''],
    ['/untrimmed', 'success', '  ok \n\t\n'],
  ])('skips 1xx before the final response and keeps the body as read: %s', async (path, result, message) => {
    expect(await run(httpGet(rawPort, path))).toMatchObject({ result, message });
  });

  it('time spent waiting for the netns helper is not the target\'s: only connect and protocol count against timeoutSeconds', async () => {
    const slow = (ms: number): SocketFactory => ({
      mode: 'slow-helper',
      createSocket: async (netns, family, signal) => {
        await new Promise<void>((resolve, reject) => {
          const t = setTimeout(resolve, ms);
          signal?.addEventListener('abort', () => {
            clearTimeout(t);
            reject(new HelperError('aborted while waiting', {}));
          }, { once: true });
        });
        return sockets.createSocket(netns, family, signal);
      },
    });
    // 2.6 s of helper plus a 500 ms answer within a 3 s timeout: 3.1 s of wall time, 0.5 s of it the
    // target's (2.5 s to spare, so a loaded machine cannot turn it into a timeout).
    const ok = await run(httpGet(rawPort, '/after-500ms'), { sockets: slow(2600), timeoutSeconds: 3 });
    expect(ok).toMatchObject({ result: 'success', message: 'ok' });
    expect(ok.phases.helper).toBeGreaterThanOrEqual(2.55);
    // A helper slower than the whole timeout: our trouble, an error (thrown away by the worker), never a failure.
    const tooSlow = await run(httpGet(rawPort, '/continue'), { sockets: slow(1500) });
    expect(tooSlow).toMatchObject({ result: 'error', reason: 'helper-error' });
    expect(await run({ kind: 'tcp', port: rawPort }, { sockets: slow(1500) })).toMatchObject({ result: 'error', reason: 'helper-error' });
  });

  /**
   * A factory that connects by itself, as the resident helper's op "connect" does inside the pod's
   * netns (test/integration/netns-helper.test.ts runs the real one): here it waits `helperMs` of its
   * own time, connects on loopback, then waits `connectMs` more as a slow handshake would, and reports that.
   */
  const connecting = (helperMs: number, connectMs = 0): SocketFactory => ({
    mode: 'connecting-helper',
    createSocket: (netns, family, signal) => sockets.createSocket(netns, family, signal),
    connectSocket: async (_netns, target, signal) => {
      await new Promise((r) => setTimeout(r, helperMs));
      if (signal?.aborted) throw new HelperError('aborted while waiting', {});
      const socket = net.connect({ host: target.ip, port: target.port });
      const err = await new Promise<NodeJS.ErrnoException | undefined>((resolve) => {
        socket.once('connect', () => resolve(undefined));
        socket.once('error', resolve);
      });
      await new Promise((r) => setTimeout(r, connectMs));
      const connectSeconds = connectMs / 1000;
      if (err) return { outcome: 'error' as const, code: err.code ?? 'EIO', connectSeconds, helperSeconds: helperMs / 1000 };
      return { outcome: 'connected' as const, won: 0 as const, socket, connectSeconds, helperSeconds: helperMs / 1000 };
    },
  });

  it('a connection the factory makes itself: its own time is held out, the connect is the target\'s, errors keep Go\'s text', async () => {
    const netns = '/run/netns/unit-test';
    // 2.6 s of the factory's own time plus a 500 ms answer within a 3 s timeout: success, as on the
    // socket route (2.5 s to spare for the target, so load cannot decide it).
    const ok = await run(httpGet(rawPort, '/after-500ms'), { sockets: connecting(2600), netns, timeoutSeconds: 3 });
    expect(ok).toMatchObject({ result: 'success', message: 'ok' });
    expect(ok.phases.helper).toBeCloseTo(2.6, 6);
    // A connect that took 600 ms is the target's: with the 500 ms answer it no longer fits in 1 s.
    const late = await run(httpGet(rawPort, '/after-500ms'), { sockets: connecting(0, 600), netns });
    expect(late).toMatchObject({ result: 'failure', reason: 'timeout' });
    expect(late.phases.connect).toBeCloseTo(0.6, 6);
    const port = await closedPort();
    expect(await run(httpGet(port, '/x'), { sockets: connecting(0), netns })).toMatchObject({
      result: 'failure', reason: 'refused', message: `Get "http://127.0.0.1:${port}/x": dial tcp 127.0.0.1:${port}: connect: connection refused`,
    });
    // A factory that will not take it now: Node connects the factory's socket instead.
    const declining: SocketFactory = { ...connecting(0), connectSocket: () => Promise.resolve(undefined) };
    expect(await run(httpGet(rawPort, '/continue'), { sockets: declining, netns })).toMatchObject({ result: 'success', message: 'ok' });
  });

  it('the pod and its namespace reach the factory with every connect it makes itself (its per-tenant shares)', async () => {
    const tenant = { group: 'ns-a', owner: 'uid-a' };
    const seen: unknown[] = [];
    const base = connecting(0);
    const recording: SocketFactory = {
      ...base,
      connectSocket: (netns, target, signal, t) => { seen.push(t); return (base.connectSocket as NonNullable<SocketFactory['connectSocket']>)(netns, target, signal, t); },
      connectProbe: (_netns, _target, _signal, t) => { seen.push(t); return Promise.resolve(undefined); },
    };
    const netns = '/run/netns/unit-test';
    expect(await run(httpGet(rawPort, '/continue'), { sockets: recording, netns, tenant })).toMatchObject({ result: 'success' });
    expect(await run({ kind: 'tcp', port: httpPort }, { sockets: recording, netns, tenant })).toMatchObject({ result: 'success' });
    // HTTP: its connection; TCP: the probe in the factory, declined, then its connection.
    expect(seen).toEqual([tenant, tenant, tenant]);
  });

  it('skips a 100 Continue over HTTP and HTTPS alike (node:http writeContinue)', async () => {
    expect(await run(httpGet(httpPort, '/write-continue'))).toMatchObject({ result: 'success', message: 'after continue' });
    expect(await run(httpGet(httpsPort, '/write-continue', { scheme: 'HTTPS' }))).toMatchObject({ result: 'success', message: 'after continue' });
  });

  it('more than five 1xx responses fail as in Go', async () => {
    expect(await run(httpGet(rawPort, '/six-1xx'))).toMatchObject({
      result: 'failure', reason: 'protocol', message: `Get "http://127.0.0.1:${rawPort}/six-1xx": net/http: HTTP/1.x transport connection broken: net/http: too many 1xx informational responses`,
    });
  });

  it.each([
    ['/reset-body', 'reset', 'read: connection reset by peer'],
    ['/short-body', 'protocol', 'unexpected EOF'],
    ['/stall-500', 'timeout', 'context deadline exceeded (Client.Timeout or context cancellation while reading body)'],
    ['/reset-503', 'reset', 'read: connection reset by peer'],
  ])('a body read error is a prober error whatever the status (kubelet reads every body): %s', async (path, reason, message) => {
    expect(await run(httpGet(rawPort, path))).toMatchObject({ result: 'error', reason, message });
  });

  it('a followed redirect\'s body is drained as Go drains it: unknown length read (a stall times out), big length skipped', async () => {
    expect(await run(httpGet(rawPort, '/redirect-stall-unknown'))).toMatchObject({ result: 'failure', reason: 'timeout' });
    expect(await run(httpGet(rawPort, '/redirect-stall-big'))).toMatchObject({ result: 'success', message: 'ok' });
  });

  it('a TCP server that accepts but never speaks times out', async () => {
    const out = await run(httpGet(hangPort, '/'));
    expect(out).toMatchObject({ result: 'failure', reason: 'timeout' });
  });

  it('garbage instead of HTTP is a protocol failure', async () => {
    expect(await run(httpGet(garbagePort, '/'))).toMatchObject({ result: 'failure', reason: 'protocol' });
  });

  it('a server closing without a response is EOF', async () => {
    expect(await run(httpGet(eofPort, '/'))).toMatchObject({ result: 'failure', reason: 'protocol', message: `Get "http://127.0.0.1:${eofPort}/": EOF` });
  });

  it('a closed port is refused with Go\'s dial error', async () => {
    const port = await closedPort();
    expect(await run(httpGet(port, '/x'))).toMatchObject({
      result: 'failure', reason: 'refused', message: `Get "http://127.0.0.1:${port}/x": dial tcp 127.0.0.1:${port}: connect: connection refused`,
    });
  });
});

describe('TCP prober', () => {
  it('an open port succeeds with an empty message', async () => {
    expect(await run({ kind: 'tcp', port: httpPort })).toMatchObject({ result: 'success', message: '' });
  });

  it('a port that accepts and never speaks succeeds (the handshake is all kubelet checks)', async () => {
    expect((await run({ kind: 'tcp', port: hangPort })).result).toBe('success');
  });

  it('a closed port fails with kubelet\'s dial text', async () => {
    const port = await closedPort();
    expect(await run({ kind: 'tcp', port })).toMatchObject({
      result: 'failure', reason: 'refused', message: `dial tcp 127.0.0.1:${port}: connect: connection refused`,
    });
    expect(await run({ kind: 'tcp', port }, { podIPs: ['::1'] })).toMatchObject({ message: `dial tcp [::1]:${port}: connect: connection refused` });
  });

  it('sends no bytes', async () => {
    let received = 0;
    const srv = net.createServer((s) => s.on('data', (d) => (received += d.length)));
    const port = await listen(srv, '127.0.0.1');
    const accepted = new Promise<void>((r) => srv.once('connection', (s) => s.once('close', () => r())));
    expect((await run({ kind: 'tcp', port })).result).toBe('success');
    await accepted;
    expect(received).toBe(0);
  });
});

describe('Happy Eyeballs across pod IPs', () => {
  it('off (kubelet): only the primary IP is tried', async () => {
    expect(await run({ kind: 'tcp', port: v6OnlyPort }, { podIPs: ['127.0.0.1', '::1'] })).toMatchObject({ result: 'failure', reason: 'refused' });
  });

  it('on: the other family answers when the primary refuses', async () => {
    const out = await run({ kind: 'tcp', port: v6OnlyPort }, { podIPs: ['127.0.0.1', '::1'], happyEyeballs: true });
    expect(out).toMatchObject({ result: 'success', address: `[::1]:${v6OnlyPort}` });
  });

  it('on: HTTP keeps kubelet\'s Host (the primary IP) whichever family answered', async () => {
    const out = await run(httpGet(v6OnlyPort, '/echo'), { podIPs: ['127.0.0.1', '::1'], happyEyeballs: true });
    expect(out.result).toBe('success');
    expect((JSON.parse(out.message) as { rawHeaders: string[] }).rawHeaders.slice(0, 2)).toEqual(['Host', `127.0.0.1:${v6OnlyPort}`]);
  });

  it('on: all refused reports the primary address', async () => {
    const port = await closedPort();
    expect(await run({ kind: 'tcp', port }, { podIPs: ['127.0.0.1', '::1'], happyEyeballs: true })).toMatchObject({
      result: 'failure', address: `127.0.0.1:${port}`, message: `dial tcp 127.0.0.1:${port}: connect: connection refused`,
    });
  });
});

describe('runProbe dispatch', () => {
  it('leaves exec to kubelet', async () => {
    expect(await run({ kind: 'exec', command: ['true'] })).toMatchObject({ result: 'error', message: 'exec probes are run by kubelet' });
  });

  it('resolves a named port from the container ports', async () => {
    const out = await run({ kind: 'tcp', port: 'web' }, { containerPorts: [{ name: 'metrics', containerPort: 1 }, { name: 'web', containerPort: httpPort }] });
    expect(out.result).toBe('success');
  });

  it('an unknown named port is an error, kubelet\'s text', async () => {
    expect(await run({ kind: 'tcp', port: 'web' }, { containerPorts: [{ name: 'other', containerPort: 80 }] })).toMatchObject({
      result: 'error', reason: 'port-unresolved', message: 'port "web" not found',
    });
  });

  it('a pod without IPs is an error', async () => {
    expect(await run({ kind: 'tcp', port: 80 }, { podIPs: [] })).toMatchObject({ result: 'error', message: 'pod has no IP yet' });
  });

  it('an aborted probe ends at once as an error', async () => {
    const ac = new AbortController();
    const t0 = performance.now();
    const p = run(httpGet(httpPort, '/hang'), { signal: ac.signal, timeoutSeconds: 10 });
    setTimeout(() => ac.abort(), 50);
    expect(await p).toMatchObject({ result: 'error' });
    // Ended by the abort, not by the 10 s timeout.
    expect(performance.now() - t0).toBeLessThan(5000);
  });

  it('refuses a timeout outside 1..3600', async () => {
    expect(await run({ kind: 'tcp', port: 80 }, { timeoutSeconds: 0 })).toMatchObject({ result: 'error', reason: 'invalid-spec' });
  });
});

// ---------------------------------------------------------------- gRPC

let grpcServer: grpc.Server;
let grpcPort = 0;
let bareGrpcPort = 0;
let h2HangPort = 0;
let h2TrailersOnlyPort = 0;
let h2NotFoundPort = 0;
let h2SeenHeaders: http2.IncomingHttpHeaders | undefined;

async function grpcListen(server: grpc.Server): Promise<number> {
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))),
  );
  closers.push(() => server.forceShutdown());
  return port;
}

beforeAll(async () => {
  grpcServer = new grpc.Server();
  new HealthImplementation({ '': 'SERVING', db: 'NOT_SERVING', cache: 'UNKNOWN' }).addToServer(grpcServer);
  grpcPort = await grpcListen(grpcServer);
  bareGrpcPort = await grpcListen(new grpc.Server());
  const hang = http2.createServer();
  hang.on('stream', (_s, headers) => (h2SeenHeaders = headers));
  h2HangPort = await listen(hang, '127.0.0.1');
  const trailersOnly = http2.createServer();
  trailersOnly.on('stream', (s) => {
    s.respond({ ':status': 200, 'content-type': 'application/grpc', 'grpc-status': '7', 'grpc-message': 'caf%C3%A9 %E2%9C%93 denied%' }, { endStream: true });
  });
  h2TrailersOnlyPort = await listen(trailersOnly, '127.0.0.1');
  const notFound = http2.createServer();
  notFound.on('stream', (s) => s.respond({ ':status': 404 }, { endStream: true }));
  h2NotFoundPort = await listen(notFound, '127.0.0.1');
});

describe('gRPC prober', () => {
  const g = (port: number, service?: string): ProbeHandler => (service === undefined ? { kind: 'grpc', port } : { kind: 'grpc', port, service });

  it('SERVING is success', async () => {
    const out = await run(g(grpcPort));
    expect(out).toMatchObject({ result: 'success', message: 'service healthy', address: `127.0.0.1:${grpcPort}` });
    expect(out.phases.firstByte).toBeGreaterThan(0);
  });

  it('NOT_SERVING and UNKNOWN are failures naming the status', async () => {
    expect(await run(g(grpcPort, 'db'))).toMatchObject({ result: 'failure', reason: 'grpc-not-serving', message: 'service unhealthy (responded with "NOT_SERVING")' });
    expect(await run(g(grpcPort, 'cache'))).toMatchObject({ result: 'failure', message: 'service unhealthy (responded with "UNKNOWN")' });
  });

  it('an unknown service (NOT_FOUND) is a failure with the rpc error', async () => {
    const out = await run(g(grpcPort, 'nope'));
    expect(out).toMatchObject({ result: 'failure', reason: 'grpc-status' });
    expect(out.message).toMatch(/^error: health rpc probe failed: rpc error: code = NotFound desc = /);
  });

  it('a server without the health service is UNIMPLEMENTED', async () => {
    const out = await run(g(bareGrpcPort));
    expect(out).toMatchObject({ result: 'failure', reason: 'grpc-unimplemented' });
    expect(out.message).toMatch(/^error: this server does not implement the grpc health protocol \(grpc\.health\.v1\.Health\): .+/);
  });

  it('a trailers-only response: status and percent-decoded message', async () => {
    expect(await run(g(h2TrailersOnlyPort))).toMatchObject({
      result: 'failure', message: 'error: health rpc probe failed: rpc error: code = PermissionDenied desc = café ✓ denied%',
    });
  });

  it('HTTP 404 without grpc-status maps to Unimplemented like grpc-go', async () => {
    expect((await run(g(h2NotFoundPort))).message).toMatch(/^error: this server does not implement the grpc health protocol/);
  });

  it('an RPC that never completes: kubelet\'s deadline message, within the timeout; request headers as grpc-go', async () => {
    const t0 = performance.now();
    const out = await run(g(h2HangPort, 'svc'));
    expect(out).toMatchObject({ result: 'failure', reason: 'timeout', message: 'timeout: health rpc did not complete within 1s' });
    expect(performance.now() - t0).toBeLessThan(10_000);
    expect(h2SeenHeaders).toMatchObject({
      ':method': 'POST', ':path': '/grpc.health.v1.Health/Check', ':authority': `127.0.0.1:${h2HangPort}`,
      'content-type': 'application/grpc', te: 'trailers', 'user-agent': 'kube-probe/1.34',
    });
    expect(h2SeenHeaders?.['grpc-timeout']).toMatch(/^\d+m$/);
  });

  it('a target that accepts but never speaks HTTP/2: connect timeout message', async () => {
    expect(await run(g(hangPort))).toMatchObject({
      result: 'failure', reason: 'timeout', message: `timeout: failed to connect service "127.0.0.1:${hangPort}" within 1s: context deadline exceeded`,
    });
  });

  it('garbage instead of HTTP/2 is a failure, not a crash', async () => {
    const out = await run(g(garbagePort));
    expect(out.result).toBe('failure');
    expect(out.message).toMatch(/^error: failed to connect service at "127\.0\.0\.1:\d+": /);
  });

  it('a closed port: connect error message', async () => {
    const port = await closedPort();
    expect(await run(g(port))).toMatchObject({
      result: 'failure', reason: 'refused',
      message: `error: failed to connect service at "127.0.0.1:${port}": dial tcp 127.0.0.1:${port}: connect: connection refused`,
    });
  });

  it('IPv6 pod IP: :authority is bracketed', async () => {
    const out = await run(g(grpcPort), { podIPs: ['::1', '127.0.0.1'], happyEyeballs: true });
    expect(out).toMatchObject({ result: 'success', address: `127.0.0.1:${grpcPort}` });
  });
});

describe('gRPC wire helpers', () => {
  it('encodes HealthCheckRequest like protobuf (empty service omitted)', () => {
    expect(encodeHealthCheckRequest('')).toEqual(Buffer.alloc(0));
    expect(encodeHealthCheckRequest('db')).toEqual(Buffer.from([0x0a, 2, 0x64, 0x62]));
    expect(encodeHealthCheckRequest('x'.repeat(200)).subarray(0, 3)).toEqual(Buffer.from([0x0a, 0xc8, 0x01]));
    expect(encodeFrame(Buffer.from([1, 2]))).toEqual(Buffer.from([0, 0, 0, 0, 2, 1, 2]));
  });

  it('decodes HealthCheckResponse.status, skipping unknown fields', () => {
    expect(decodeHealthStatus(Buffer.alloc(0))).toBe(0);
    expect(decodeHealthStatus(Buffer.from([0x08, 0x01]))).toBe(1);
    expect(decodeHealthStatus(Buffer.from([0x12, 0x02, 0x61, 0x62, 0x08, 0x02, 0x1d, 0, 0, 0, 0]))).toBe(2);
    expect(() => decodeHealthStatus(Buffer.from([0x08]))).toThrow('unexpected EOF');
    expect(() => decodeHealthStatus(Buffer.from([0x12, 0x09, 0x00]))).toThrow('unexpected EOF');
  });

  it('percent-decodes grpc-message leniently', () => {
    expect(decodeGrpcMessage('a%20b%zz%')).toBe('a b%zz%');
    expect(decodeGrpcMessage('%E2%9C%93')).toBe('\u2713');
  });

  it.each([[1000, '1s'], [500, '500ms'], [90_000, '1m30s'], [3_600_000, '1h0m0s'], [1500, '1.5s']])('goDuration(%i) = %s', (ms, want) => {
    expect(goDuration(ms)).toBe(want);
  });
});

describe('resources', () => {
  it('300 mixed probes (success, failure, timeout-free) leave no file descriptor behind', async () => {
    const fds = (): number => readdirSync('/proc/self/fd').length;
    const port = await closedPort();
    const handlers: ProbeHandler[] = [
      httpGet(httpPort, '/status/200'),
      httpGet(httpPort, '/secret'),
      httpGet(httpPort, '/chain?n=2'),
      httpGet(httpsPort, '/echo', { scheme: 'HTTPS' }),
      httpGet(garbagePort, '/'),
      { kind: 'tcp', port: httpPort },
      { kind: 'tcp', port },
      { kind: 'grpc', port: grpcPort },
      { kind: 'grpc', port: bareGrpcPort },
      { kind: 'grpc', port: garbagePort },
    ];
    await run(handlers[0] as ProbeHandler);
    const before = fds();
    for (let round = 0; round < 30; round++) {
      const outs = await Promise.all(handlers.map((h) => run(h, { podIPs: ['127.0.0.1', '::1'], happyEyeballs: true })));
      expect(outs.map((o) => o.result)).toEqual(['success', 'failure', 'success', 'success', 'failure', 'success', 'failure', 'success', 'failure', 'failure']);
    }
    await new Promise((r) => setTimeout(r, 100));
    expect(fds()).toBeLessThanOrEqual(before);
  });

  it('every probe above closed its connection (no server-side socket left open)', async () => {
    await new Promise((r) => setTimeout(r, 200));
    const leaked = [...openConnections].filter(([, open]) => open.size > 0).map(([k, open]) => `${k}=${open.size}`);
    expect(leaked).toEqual([]);
  });
});
