/**
 * The servers of kubelet's own prober tests (pkg/probe/http/http_test.go, request_test.go,
 * tcp/tcp_test.go, grpc/grpc_test.go), rebuilt for a lab pod: the handlers those tests register,
 * written again here by what they do (not copied), plus byte-exact HTTP responses for what Go's
 * client reads and node:http will not send (1xx, bodies cut short or stalled).
 *
 * Ports (all dual-stack on `::`): `http` and `newport` (the same handlers; kubelet's "newport"
 * redirect cases need a second port), `https`, `raw` (scripted bytes by request path),
 * `grpcServing`, `grpcNotServing`, `grpcSlow` (answers after 4 s), `grpcNoHealth` (a gRPC server
 * without the health service), `closed` (nothing listens).
 *
 * Run as `ip netns exec <ns> node test/lab/conformance-server.ts` (or startConformanceServer());
 * prints `ready {ports}` once listening; exits when stdin closes.
 */
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import * as http from 'node:http';
import * as https from 'node:https';
import * as net from 'node:net';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import * as grpc from '@grpc/grpc-js';
import { HealthImplementation, service as healthService } from 'grpc-health-check';
import { ensureLabCert } from './certs.ts';
import { startNetnsScript } from './netns-script.ts';

/** The ports a conformance server listens on. */
export interface ConformancePorts {
  http: number;
  newport: number;
  https: number;
  raw: number;
  grpcServing: number;
  grpcNotServing: number;
  grpcSlow: number;
  grpcNoHealth: number;
  /** Bound then released: nothing listens there. */
  closed: number;
}

/** kubelet's maxRespBodyLength. */
export const KUBELET_MAX_BODY = 10 * 1024;

/** Go's canonical header key ("x-muffins" -> "X-Muffins"), as Go's server puts names in r.Header. */
function canonical(name: string): string {
  return name.toLowerCase().replace(/(^|-)([a-z])/g, (_m, dash: string, c: string) => dash + c.toUpperCase());
}

/** Go's http.Redirect for a GET: the status, Location, and its small HTML body. */
function goRedirect(res: http.ServerResponse, location: string, status: number): void {
  const text = http.STATUS_CODES[status] ?? '';
  res.writeHead(status, { location, 'content-type': 'text/html; charset=utf-8' }).end(`<a href="${location}">${text}</a>.\n\n`);
}

/** The handlers of kubelet's HTTP prober tests, by path. */
function handle(req: http.IncomingMessage, res: http.ServerResponse): void {
  const u = new URL(req.url ?? '/', 'http://conformance.invalid');
  const p = u.pathname;
  const q = u.searchParams;
  if (p === '/ok-body') return void res.writeHead(200).end('ok body');
  if (p === '/status') return void res.writeHead(Number(q.get('code'))).end(q.get('body') ?? '');
  if (p === '/echo-headers') {
    // kubelet's headerEchoHandler: "Name: value\n" for every value of every header Go's server puts in r.Header.
    let out = '';
    for (let i = 0; i < req.rawHeaders.length; i += 2) {
      const name = canonical(req.rawHeaders[i] as string);
      if (name === 'Host') continue;
      out += `${name}: ${req.rawHeaders[i + 1]}\n`;
    }
    return void res.writeHead(200).end(out);
  }
  if (p === '/echo-host') return void res.writeHead(200).end(req.headers.host ?? '');
  if (p === '/echo-request') return void res.writeHead(200).end(`${req.method} ${req.url}\nHost: ${req.headers.host ?? ''}`);
  // kubelet's FailureCode: WriteHeader(-1) panics in the handler; Go's server drops the connection.
  if (p === '/panic') return void req.socket.destroy();
  if (p === '/sleep') return void setTimeout(() => res.writeHead(200).end(), 3000).unref();
  // redirectHandler(code, bad): "/" of the case redirects to "new", which answers 500 when bad.
  const m = /^\/redirect-(\d{3})-(ok|bad)(\/new)?$/.exec(p);
  if (m) {
    if (!m[3]) return goRedirect(res, `${p}/new`, Number(m[1]));
    if (m[2] === 'bad') return void res.writeHead(500, { 'content-type': 'text/plain; charset=utf-8' }).end('\n');
    return void res.writeHead(200).end();
  }
  // redirectHandlerWithBody: a 3xx without Location, with a body.
  if (p === '/redirect-with-body') return void res.writeHead(Number(q.get('code'))).end(q.get('body') ?? '');
  if (p === '/redirect') return goRedirect(res, q.get('loc') ?? '/', 302);
  if (p === '/loop') return goRedirect(res, '/loop', 302);
  if (p === '/success') return void res.writeHead(200).end();
  if (p === '/host-redirect') return goRedirect(res, '/host-success', 302);
  if (p === '/host-success') {
    if (req.headers.host === 'www.success.com') return void res.writeHead(200).end();
    return void res.writeHead(400).end('\n');
  }
  if (p === '/payload') return void res.writeHead(200).end('a'.repeat(Number(q.get('n'))));
  res.writeHead(500, { 'content-type': 'text/plain; charset=utf-8' }).end('\n');
}

/** Byte-exact responses by request path (what Go's client must cope with). */
const RAW: Record<string, (s: net.Socket) => void> = {
  '/continue': (s) => s.end('HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nok body'),
  '/early-hints': (s) => s.end('HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok'),
  '/six-1xx': (s) => s.end('HTTP/1.1 102 Processing\r\n\r\n'.repeat(6) + 'HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n'),
  '/untrimmed': (s) => s.end('HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n\n  ok  \n\n'),
  '/stall-200': (s) => void s.write('HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial'),
  '/stall-503': (s) => void s.write('HTTP/1.1 503 Service Unavailable\r\nContent-Length: 100\r\n\r\npartial'),
  '/short-200': (s) => s.end('HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial'),
  '/redirect-stall': (s) => void s.write('HTTP/1.1 302 Found\r\nLocation: /continue\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nmoved\r\n'),
  '/redirect-big': (s) => void s.write('HTTP/1.1 302 Found\r\nLocation: /continue\r\nContent-Length: 100000\r\n\r\nmoved'),
};

function rawServer(): net.Server {
  return net.createServer((s) => {
    s.on('error', () => {});
    let head = '';
    const onData = (d: Buffer): void => {
      head += d.toString('latin1');
      if (head.length > 64 * 1024) return void s.destroy();
      if (!head.includes('\r\n\r\n')) return;
      s.off('data', onData);
      s.resume();
      const reply = RAW[head.split(' ')[1] ?? ''];
      if (reply) reply(s);
      else s.end('HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n');
    };
    s.on('data', onData);
  });
}

async function listen(server: net.Server, port = 0): Promise<number> {
  server.listen({ port, host: '::' });
  await once(server, 'listening');
  return (server.address() as net.AddressInfo).port;
}

async function grpcServer(setup: (s: grpc.Server) => void): Promise<number> {
  const server = new grpc.Server();
  setup(server);
  return new Promise<number>((resolve, reject) => {
    server.bindAsync('[::]:0', grpc.ServerCredentials.createInsecure(), (err, port) => (err ? reject(err) : resolve(port)));
  });
}

/** A health service whose Check answers `status` after `delayMs`. */
function healthWith(status: 'SERVING' | 'NOT_SERVING', delayMs = 0): (s: grpc.Server) => void {
  return (s) => {
    if (delayMs === 0) return new HealthImplementation({ '': status }).addToServer(s);
    s.addService(healthService as grpc.ServiceDefinition, {
      check: (_call: unknown, cb: (err: null, res: { status: string }) => void) => void setTimeout(() => cb(null, { status }), delayMs).unref(),
      watch: () => {},
    });
  };
}

async function main(): Promise<void> {
  const cert = ensureLabCert();
  const closedServer = net.createServer();
  const closed = await listen(closedServer);
  closedServer.close();
  const ports: ConformancePorts = {
    http: await listen(http.createServer(handle)),
    newport: await listen(http.createServer(handle)),
    https: await listen(https.createServer({ key: readFileSync(cert.keyPath), cert: readFileSync(cert.certPath) }, handle)),
    raw: await listen(rawServer()),
    grpcServing: await grpcServer(healthWith('SERVING')),
    grpcNotServing: await grpcServer(healthWith('NOT_SERVING')),
    grpcSlow: await grpcServer(healthWith('SERVING', 4000)),
    // A gRPC server with some other service only: Check is UNIMPLEMENTED.
    grpcNoHealth: await grpcServer(() => {}),
    closed,
  };
  createInterface({ input: process.stdin }).on('close', () => process.exit(0));
  process.on('SIGTERM', () => process.exit(0));
  process.stdout.write(`ready ${JSON.stringify(ports)}\n`);
}

/** A conformance server running in a netns. */
export interface ConformanceServer {
  ports: ConformancePorts;
  /** Closes its stdin (it exits), SIGKILL after 2 s. Idempotent. */
  stop(): Promise<void>;
}

/** Starts this server inside the named netns (a lab pod's `name`) and waits until every port listens. */
export async function startConformanceServer(netnsName: string): Promise<ConformanceServer> {
  const started = await startNetnsScript<ConformancePorts>('conformance server', netnsName, fileURLToPath(import.meta.url), [], 20_000);
  return { ports: started.ready, stop: started.stop };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  main().catch((err: unknown) => {
    process.stderr.write(`conformance-server: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(2);
  });
}
