/**
 * The application a lab pod runs: HTTP/HTTPS test endpoints, a TCP port that accepts and closes, a
 * gRPC health server and a port that accepts and never answers. Started by lab.startServer() as
 * `ip netns exec <ns> node test/lab/pod-server.ts '<json ServerOptions>'`; prints one
 * `ready {ports}` line on stdout once every listener is up. Control requests arrive on stdin as
 * `<id> <path>` lines and are replayed as real GETs against the server's own port from inside the
 * netns; answers go to stdout as `ctl <id> <status> <json body>`. Exits when stdin closes, so a
 * crashed test never leaves a server behind.
 */
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import * as http from 'node:http';
import * as https from 'node:https';
import * as net from 'node:net';
import { createInterface } from 'node:readline';

type ServingStatus = 'SERVING' | 'NOT_SERVING' | 'UNKNOWN';
const STATUSES: readonly string[] = ['SERVING', 'NOT_SERVING', 'UNKNOWN'];
type PortKey = 'http' | 'https' | 'tcp' | 'grpc' | 'hang';
const PORT_KEYS: readonly PortKey[] = ['http', 'https', 'tcp', 'grpc', 'hang'];
const KNOWN_KEYS: readonly string[] = [...PORT_KEYS, 'grpcServices', 'bind'];

interface Options {
  http?: number; https?: number; tcp?: number; grpc?: number; hang?: number;
  grpcServices?: Record<string, ServingStatus>;
  bind?: 'all' | 'loopback';
}

/** Upper bounds on request parameters, so a typo in a test cannot exhaust the node. */
const MAX_BIG_BYTES = 64 * 1024 * 1024;
const MAX_SLOW_MS = 10 * 60_000;
const SLOWLORIS_BYTE_MS = 200;

function fail(message: string): never {
  process.stderr.write(`pod-server: ${message}\n`);
  process.exit(2);
}

function parseOptions(raw: string | undefined): Options {
  let o: Options;
  try {
    o = JSON.parse(raw ?? '{}') as Options;
  } catch (err) {
    fail(`options are not JSON: ${String(err)}`);
  }
  if (typeof o !== 'object' || o === null || Array.isArray(o)) fail('options must be a JSON object');
  const unknown = Object.keys(o).filter((k) => !KNOWN_KEYS.includes(k));
  if (unknown.length > 0) fail(`unknown option(s) ${unknown.join(', ')}; known: ${KNOWN_KEYS.join(', ')}`);
  for (const k of PORT_KEYS) {
    const p = o[k];
    if (p !== undefined && !(Number.isInteger(p) && p >= 0 && p <= 65535)) fail(`${k} must be a port 0..65535`);
  }
  if (o.bind !== undefined && o.bind !== 'all' && o.bind !== 'loopback') fail("bind must be 'all' or 'loopback'");
  for (const [name, status] of Object.entries(o.grpcServices ?? {})) {
    if (!STATUSES.includes(status)) fail(`grpcServices[${JSON.stringify(name)}] must be one of ${STATUSES.join(', ')}`);
  }
  return o;
}

const opts = parseOptions(process.argv[2]);
const hosts = opts.bind === 'loopback' ? ['127.0.0.1', '::1'] : ['::'];
const state = { healthy: true };
const ports: Partial<Record<PortKey | 'control', number>> = {};
let setGrpcStatus: ((service: string, status: ServingStatus) => void) | undefined;

function ignore(): void {}

function send(res: http.ServerResponse, code: number, body: string, headers: http.OutgoingHttpHeaders = {}): void {
  // 204 and 304 must not carry a body (nor a Content-Length that announces one).
  if (code === 204 || code === 304) return void res.writeHead(code, headers).end();
  res.writeHead(code, { 'Content-Type': 'text/plain', 'Content-Length': Buffer.byteLength(body), ...headers });
  res.end(body);
}

/** Runs the endpoint; a request that makes it throw (say, a Location with CR/LF) gets a 400, never a crash. */
function handleSafely(req: http.IncomingMessage, res: http.ServerResponse): void {
  try {
    handle(req, res);
  } catch (err) {
    if (res.headersSent) return void res.destroy();
    res.removeHeader('Location');
    send(res, 400, `bad request: ${err instanceof Error ? err.message : String(err)}`);
  }
}

function intParam(q: URLSearchParams, name: string, min: number, max: number, dflt?: number): number | undefined {
  const raw = q.get(name);
  if (raw === null) return dflt;
  const n = Number(raw);
  return Number.isInteger(n) && n >= min && n <= max ? n : undefined;
}

/** Serves every HTTP(S) endpoint of the pod server. */
function handle(req: http.IncomingMessage, res: http.ServerResponse): void {
  const url = new URL(req.url ?? '/', 'http://pod.invalid');
  const q = url.searchParams;
  const p = url.pathname;
  const status = /^\/status\/(\d{3})$/.exec(p);
  if (p === '/healthz') return state.healthy ? send(res, 200, 'ok') : send(res, 503, 'unhealthy');
  if (status) {
    const code = Number(status[1]);
    return code >= 200 && code <= 599 ? send(res, code, `status ${code}`) : send(res, 400, 'status must be 200..599');
  }
  if (p === '/redirect') {
    const to = q.get('to');
    const code = intParam(q, 'code', 300, 399, 302);
    if (!to || code === undefined) return send(res, 400, 'need to=<location> and code=300..399');
    return send(res, code, `redirect to ${to}`, { Location: to });
  }
  if (p === '/loop') return send(res, 302, 'loop', { Location: '/loop' });
  if (p === '/echo') {
    const s = req.socket;
    const body = JSON.stringify({ method: req.method, url: req.url, rawHeaders: req.rawHeaders,
      remoteAddress: s.remoteAddress, localAddress: s.localAddress });
    return send(res, 200, body, { 'Content-Type': 'application/json' });
  }
  if (p === '/big') return big(res, q);
  if (p === '/slow') {
    const ms = intParam(q, 'ms', 0, MAX_SLOW_MS, 1000);
    if (ms === undefined) return send(res, 400, `ms must be 0..${MAX_SLOW_MS}`);
    const t = setTimeout(() => send(res, 200, `slept ${ms} ms`), ms);
    res.on('close', () => clearTimeout(t));
    return;
  }
  if (p === '/secret') return send(res, 500, 'TOP-SECRET-BODY');
  if (p === '/hang') return; // never answer; the socket lives until the client gives up
  if (p === '/slowloris') return slowloris(req.socket);
  if (p === '/control/health') {
    const ok = q.get('ok');
    if (ok !== '0' && ok !== '1') return send(res, 400, 'ok must be 0 or 1');
    state.healthy = ok === '1';
    return send(res, 200, `healthy=${state.healthy}`);
  }
  if (p === '/control/grpc') {
    const service = q.get('service') ?? '';
    const st = q.get('status') ?? '';
    if (!STATUSES.includes(st)) return send(res, 400, `status must be one of ${STATUSES.join(', ')}`);
    if (!setGrpcStatus) return send(res, 409, 'this server has no grpc port');
    setGrpcStatus(service, st as ServingStatus);
    return send(res, 200, `grpc ${JSON.stringify(service)}=${st}`);
  }
  send(res, 404, 'not found');
}

function big(res: http.ServerResponse, q: URLSearchParams): void {
  const total = intParam(q, 'bytes', 0, MAX_BIG_BYTES);
  if (total === undefined) return send(res, 400, `bytes must be 0..${MAX_BIG_BYTES}`);
  res.writeHead(200, { 'Content-Type': 'application/octet-stream', 'Content-Length': total });
  const chunk = Buffer.alloc(64 * 1024, 'x');
  let left = total;
  const pump = (): void => {
    while (left > 0) {
      const n = Math.min(left, chunk.length);
      left -= n;
      if (!res.write(n === chunk.length ? chunk : chunk.subarray(0, n))) return void res.once('drain', pump);
    }
    res.end();
  };
  res.on('close', () => { left = 0; });
  pump();
}

/** Writes a response head one byte per 200 ms, and never finishes it. */
function slowloris(socket: net.Socket): void {
  const head = 'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n';
  let i = 0;
  const t = setInterval(() => {
    const text = i < head.length ? head : 'X-Slowloris: 1\r\n';
    const at = i < head.length ? i : (i - head.length) % text.length;
    i++;
    if (!socket.destroyed) socket.write(text[at] ?? ' ');
  }, SLOWLORIS_BYTE_MS);
  socket.on('close', () => clearInterval(t));
}

/** Listens on every bind address with a fresh server from `make`; loopback's second address reuses the first's port. */
async function listen(make: () => net.Server, port: number): Promise<number> {
  let bound = port;
  for (const host of hosts) {
    const s = guarded(make());
    s.listen({ host, port: bound });
    await once(s, 'listening');
    bound = (s.address() as net.AddressInfo).port;
  }
  return bound;
}

/** Makes sure no socket or client error can crash the process: a client RST is routine here. */
function guarded(s: net.Server): net.Server {
  s.on('connection', (sock: net.Socket) => sock.on('error', ignore));
  s.on('error', (err) => fail(`listener error: ${String(err)}`));
  if (s instanceof http.Server || s instanceof https.Server) s.on('clientError', (_e: Error, sock: net.Socket) => sock.destroy());
  if (s instanceof https.Server) s.on('tlsClientError', ignore);
  return s;
}

async function startGrpc(port: number): Promise<number> {
  const grpc = await import('@grpc/grpc-js');
  const { HealthImplementation } = await import('grpc-health-check');
  const health = new HealthImplementation({ '': 'SERVING', ...opts.grpcServices });
  setGrpcStatus = (service, status) => health.setStatus(service, status);
  const server = new grpc.Server();
  health.addToServer(server);
  let bound = port;
  for (const host of hosts) {
    const addr = host.includes(':') ? `[${host}]:${bound}` : `${host}:${bound}`;
    bound = await new Promise<number>((resolve, reject) =>
      server.bindAsync(addr, grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))));
  }
  return bound;
}

/** Replays a control request as a GET against our own HTTP(S) port from inside the netns. */
function control(id: string, path: string): void {
  const reply = (code: number, body: string): void => void process.stdout.write(`ctl ${id} ${code} ${JSON.stringify(body)}\n`);
  if (!path.startsWith('/')) return reply(400, 'path must start with /');
  const useHttps = ports.http === undefined && ports.https !== undefined;
  const port = ports.http ?? ports.https ?? ports.control;
  const get = useHttps ? https.get : http.get;
  const req = get({ host: '127.0.0.1', port, path, rejectUnauthorized: false, timeout: 5000 }, (res) => {
    let body = '';
    res.setEncoding('utf8');
    res.on('data', (d: string) => { if (body.length < 4096) body += d; });
    res.on('end', () => reply(res.statusCode ?? 0, body));
  });
  req.on('timeout', () => req.destroy(new Error('control request timed out')));
  req.on('error', (err) => reply(599, String(err)));
}

async function main(): Promise<void> {
  if (opts.http !== undefined) ports.http = await listen(() => http.createServer(handleSafely), opts.http);
  if (opts.https !== undefined) {
    // Imported lazily: most servers have no HTTPS port and start faster without it.
    const { ensureLabCert } = await import('./certs.ts');
    const { certPath, keyPath } = ensureLabCert();
    const tls = { cert: readFileSync(certPath), key: readFileSync(keyPath) };
    ports.https = await listen(() => https.createServer(tls, handleSafely), opts.https);
  }
  if (opts.tcp !== undefined) ports.tcp = await listen(() => net.createServer((s) => s.end()), opts.tcp);
  if (opts.hang !== undefined) {
    // pauseOnConnect: the kernel buffers whatever the client sends and we never read or write.
    ports.hang = await listen(() => net.createServer({ pauseOnConnect: true }, ignore), opts.hang);
  }
  if (opts.grpc !== undefined) ports.grpc = await startGrpc(opts.grpc);
  if (ports.http === undefined && ports.https === undefined) {
    // Control must still work for a gRPC/TCP-only server: a private loopback port serves it.
    const s = guarded(http.createServer(handleSafely));
    s.listen({ host: '127.0.0.1', port: 0 });
    await once(s, 'listening');
    ports.control = (s.address() as net.AddressInfo).port;
  }
  const lines = createInterface({ input: process.stdin });
  lines.on('line', (line) => {
    const sp = line.indexOf(' ');
    if (sp > 0) control(line.slice(0, sp), line.slice(sp + 1));
  });
  lines.on('close', () => process.exit(0));
  process.on('SIGTERM', () => process.exit(0));
  process.stdout.write(`ready ${JSON.stringify({ pid: process.pid, ...ports })}\n`);
}

main().catch((err: unknown) => fail(`startup failed: ${err instanceof Error ? err.stack ?? err.message : String(err)}`));
