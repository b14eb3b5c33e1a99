/**
 * A misbehaving application for lab pods: the targets a well-behaved pod server never plays. Each
 * behaviour gets its own port (dual-stack on `::`, 0 = any free port):
 *
 * - `endlessBody`:  HTTP 200, chunked, body never ends (as fast as the client reads)
 * - `dripBody`:     HTTP 200 announcing 1 MB, then one body byte every 50 ms
 * - `hugeHeaders`:  HTTP 200 with a 1 MiB header block, then a short body
 * - `resetMidBody`: HTTP 200 announcing 100 bytes, 7 of them, then a reset (RST) of the connection
 * - `garbageH2`:    answers the HTTP/2 preface with random bytes and keeps the connection open
 * - `rstStream`:    real HTTP/2; every stream is reset (RST_STREAM INTERNAL_ERROR) before any header
 * - `rstAfterHeaders`: real HTTP/2; gRPC response headers and 2 bytes of a message, then RST_STREAM INTERNAL_ERROR
 * - `h2<Flood>` (H2_FLOODS): a raw HTTP/2 server that answers the client's first request with its
 *   SETTINGS (and response HEADERS), then floods one kind of frame as fast as the client reads:
 *   empty CONTINUATIONs, empty DATA, PING, SETTINGS, RST_STREAM on idle streams, server-opened
 *   HEADERS, WINDOW_UPDATE 0 on idle streams, padding-only DATA within the client's windows, and
 *   (h2Informational) endless informational `:status: 100` heads on the response's stream, no
 *   final response ever. Each new connection gets a new flood.
 *
 * Run as `ip netns exec <ns> node test/lab/hostile-server.ts '<json HostileOptions>'` (or through
 * startHostileServer()); prints `ready {ports}` once listening. Stdin lines: `stats` answers
 * `stats {json}` (open connections and bytes written per behaviour). Exits when stdin closes.
 */
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import * as http2 from 'node:http2';
import * as net from 'node:net';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { startNetnsScript } from './netns-script.ts';

/** The behaviours, each a port key in the options and in the ready line. */
/** The frame floods, each a behaviour of its own (the attacks of issue 31 items 1 and 4). */
export const H2_FLOODS = ['h2Continuation', 'h2EmptyData', 'h2Ping', 'h2Settings', 'h2RstIdle', 'h2ServerHeaders', 'h2WindowUpdate0', 'h2Padded', 'h2Informational'] as const;
export type H2Flood = (typeof H2_FLOODS)[number];
export const HOSTILE_BEHAVIOURS = ['endlessBody', 'dripBody', 'hugeHeaders', 'resetMidBody', 'garbageH2', 'rstStream', 'rstAfterHeaders', ...H2_FLOODS] as const;
export type HostileBehaviour = (typeof HOSTILE_BEHAVIOURS)[number];
/** Which behaviours to serve, and on which port (0 = any). */
export type HostileOptions = Partial<Record<HostileBehaviour, number>>;
/** Counters per behaviour, for "did the client let go" assertions. */
export interface HostileStats {
  open: Record<string, number>;
  accepted: Record<string, number>;
  bytesWritten: Record<string, number>;
}

/** Size of the hugeHeaders block: 1 MiB (Go's server-side DefaultMaxHeaderBytes; its client allows 10 MiB). */
export const HUGE_HEADER_BYTES = 1024 * 1024;
const DRIP_MS = 50;
/** One chunked-encoding frame of 16 KiB, written again and again. */
const CHUNK_FRAME = Buffer.concat([Buffer.from('4000\r\n'), Buffer.alloc(16 * 1024, 'e'), Buffer.from('\r\n')]);

const stats: HostileStats = { open: {}, accepted: {}, bytesWritten: {} };

/** Books a new connection of `kind` (accepted, open until it closes). */
function count(kind: string, socket: net.Socket): void {
  stats.accepted[kind] = (stats.accepted[kind] ?? 0) + 1;
  stats.open[kind] = (stats.open[kind] ?? 0) + 1;
  socket.on('error', () => {});
  socket.once('close', () => { stats.open[kind] = (stats.open[kind] ?? 1) - 1; });
}

/** Writes and counts; returns socket.write's backpressure verdict (false once destroyed). */
function write(kind: string, socket: net.Socket, data: string | Buffer): boolean {
  if (socket.destroyed) return false;
  stats.bytesWritten[kind] = (stats.bytesWritten[kind] ?? 0) + Buffer.byteLength(data);
  return socket.write(data);
}

/** Waits for the end of the request head, so the answer never races the client's request. */
function afterRequestHead(socket: net.Socket, then: () => void): void {
  let seen = '';
  const onData = (d: Buffer): void => {
    seen = (seen + d.toString('latin1')).slice(-4096);
    if (!seen.includes('\r\n\r\n')) return;
    socket.off('data', onData);
    then();
  };
  socket.on('data', onData);
}

function endlessBody(socket: net.Socket): void {
  afterRequestHead(socket, () => {
    write('endlessBody', socket, 'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n');
    const pump = (): void => {
      // Backpressure: a client that stops reading stops us too, so memory stays flat on both sides.
      while (write('endlessBody', socket, CHUNK_FRAME)) {
        // until the socket's buffer is full
      }
      if (!socket.destroyed) socket.once('drain', pump);
    };
    pump();
  });
}

function dripBody(socket: net.Socket): void {
  afterRequestHead(socket, () => {
    write('dripBody', socket, 'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 1000000\r\n\r\n');
    const t = setInterval(() => write('dripBody', socket, 'd'), DRIP_MS);
    socket.once('close', () => clearInterval(t));
  });
}

function hugeHeaders(socket: net.Socket): void {
  afterRequestHead(socket, () => {
    const line = `X-Pad: ${'h'.repeat(1016)}\r\n`; // 1 KiB per line
    write('hugeHeaders', socket, 'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n');
    write('hugeHeaders', socket, line.repeat(HUGE_HEADER_BYTES / line.length));
    write('hugeHeaders', socket, 'Content-Length: 2\r\nConnection: close\r\n\r\nok');
  });
}

function resetMidBody(socket: net.Socket): void {
  afterRequestHead(socket, () => {
    write('resetMidBody', socket, 'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\npartial');
    // Once the answer is out, so that the reset never overtakes it.
    socket.write('', () => socket.resetAndDestroy());
  });
}

function garbageH2(socket: net.Socket): void {
  // No valid SETTINGS frame can start with 0xff bytes of length: the client must give up on its own.
  socket.once('data', () => write('garbageH2', socket, Buffer.concat([Buffer.alloc(9, 0xff), randomBytes(503)])));
}

function h2Server(kind: 'rstStream' | 'rstAfterHeaders'): net.Server {
  const server = http2.createServer();
  server.on('connection', (socket: net.Socket) => count(kind, socket));
  server.on('sessionError', () => {});
  server.on('stream', (stream) => {
    stream.on('error', () => {});
    if (kind === 'rstStream') return void stream.close(http2.constants.NGHTTP2_INTERNAL_ERROR);
    // close() would end the stream (END_STREAM) before its RST_STREAM; destroy() resets it for real.
    stream.respond({ ':status': 200, 'content-type': 'application/grpc' });
    stream.write(Buffer.from([0, 0]));
    setTimeout(() => stream.destroy(new Error('reset after headers')), 20);
  });
  return server;
}

function h2Frame(type: number, flags: number, id: number, payload: Buffer = Buffer.alloc(0)): Buffer {
  const h = Buffer.alloc(9);
  h.writeUIntBE(payload.length, 0, 3);
  h[3] = type;
  h[4] = flags;
  h.writeUInt32BE(id, 5);
  return Buffer.concat([h, payload]);
}

/** `:status: 200`, `content-type: application/grpc`, as HPACK literals without indexing. */
const GRPC_RESPONSE = Buffer.concat([Buffer.from([0x08, 0x03]), Buffer.from('200'), Buffer.from([0x0f, 0x10, 0x10]), Buffer.from('application/grpc')]);
/** `:status: 100` (an informational head), an HPACK literal without indexing. */
const CONTINUE_100 = Buffer.concat([Buffer.from([0x08, 0x03]), Buffer.from('100')]);

/** One flood frame (`i`: how many came before it). */
function floodFrame(kind: H2Flood, i: number): Buffer {
  switch (kind) {
    case 'h2Continuation': return h2Frame(9, 0, 1);
    case 'h2EmptyData': return h2Frame(0, 0, 1);
    case 'h2Ping': return h2Frame(6, 0, 0, Buffer.alloc(8, i & 0xff));
    case 'h2Settings': return h2Frame(4, 0, 0);
    case 'h2RstIdle': return h2Frame(3, 0, 3 + 2 * (i % 1e9), Buffer.alloc(4));
    case 'h2ServerHeaders': return h2Frame(1, 0x5, 2 + 2 * (i % 1e9), GRPC_RESPONSE);
    case 'h2WindowUpdate0': return h2Frame(8, 0, 3 + 2 * (i % 1e9), Buffer.alloc(4));
    // 255 octets of padding and none of data: flow-controlled, so sent only within the client's windows.
    case 'h2Padded': return h2Frame(0, 0x8, 1, Buffer.concat([Buffer.from([255]), Buffer.alloc(255)]));
    case 'h2Informational': return h2Frame(1, 0x4, 1, CONTINUE_100);
  }
}

/** Answers the client's first frames, then floods `kind` with backpressure until the client goes. */
function h2Flood(kind: H2Flood, socket: net.Socket): void {
  socket.once('data', () => {
    const head = [h2Frame(4, 0, 0), h2Frame(4, 1, 0)];
    // The response's HEADERS, left open (no END_HEADERS) for the CONTINUATION flood; never for 1xx heads.
    if (kind !== 'h2Informational') head.push(h2Frame(1, kind === 'h2Continuation' ? 0 : 0x4, 1, GRPC_RESPONSE));
    write(kind, socket, Buffer.concat(head));
    // Padding counts against the windows: the client's initial 65,535 (it gives them back as it reads).
    const window = kind === 'h2Padded' ? [65_535, 65_535] : [Infinity, Infinity];
    let sent = 0;
    const pump = (): void => {
      while (!socket.destroyed) {
        const n = Math.min(1000, Math.floor(Math.min(window[0]!, window[1]!) / 256));
        if (n === 0) return;
        const batch: Buffer[] = [];
        for (let i = 0; i < n; i++) batch.push(floodFrame(kind, sent + i));
        sent += n;
        if (kind === 'h2Padded') {
          window[0]! -= 256 * n;
          window[1]! -= 256 * n;
        }
        if (!write(kind, socket, Buffer.concat(batch))) return void socket.once('drain', pump);
      }
    };
    if (kind === 'h2Padded') {
      // Window credit from the client (WINDOW_UPDATE on the connection and on stream 1) lets more padding go.
      socket.on('data', (d: Buffer) => {
        for (let at = 0; at + 9 <= d.length;) {
          const len = d.readUIntBE(at, 3);
          const id = d.readUInt32BE(at + 5);
          if (d[at + 3] === 8 && id <= 1 && len === 4 && at + 13 <= d.length) window[id]! += d.readUInt32BE(at + 9) & 0x7fffffff;
          at += 9 + len;
        }
        pump();
      });
    }
    pump();
  });
}

function rawServer(kind: HostileBehaviour, serve: (s: net.Socket) => void): net.Server {
  return net.createServer((socket) => {
    count(kind, socket);
    serve(socket);
  });
}

const SERVERS: Record<HostileBehaviour, () => net.Server> = {
  endlessBody: () => rawServer('endlessBody', endlessBody),
  dripBody: () => rawServer('dripBody', dripBody),
  hugeHeaders: () => rawServer('hugeHeaders', hugeHeaders),
  resetMidBody: () => rawServer('resetMidBody', resetMidBody),
  garbageH2: () => rawServer('garbageH2', garbageH2),
  rstStream: () => h2Server('rstStream'),
  rstAfterHeaders: () => h2Server('rstAfterHeaders'),
  ...Object.fromEntries(H2_FLOODS.map((k) => [k, () => rawServer(k, (s) => h2Flood(k, s))])) as Record<H2Flood, () => net.Server>,
};

function parseOptions(raw: string | undefined): HostileOptions {
  const o = JSON.parse(raw ?? '{}') as Record<string, unknown>;
  if (typeof o !== 'object' || o === null || Array.isArray(o)) throw new Error('options must be a JSON object');
  for (const [k, v] of Object.entries(o)) {
    if (!(HOSTILE_BEHAVIOURS as readonly string[]).includes(k)) throw new Error(`unknown behaviour ${k}; known: ${HOSTILE_BEHAVIOURS.join(', ')}`);
    if (!Number.isInteger(v) || (v as number) < 0 || (v as number) > 65535) throw new Error(`${k} must be a port 0..65535`);
  }
  return o as HostileOptions;
}

async function main(): Promise<void> {
  const opts = parseOptions(process.argv[2]);
  const ports: HostileOptions = {};
  for (const kind of HOSTILE_BEHAVIOURS) {
    const port = opts[kind];
    if (port === undefined) continue;
    const server = SERVERS[kind]();
    server.on('error', (err) => {
      process.stderr.write(`hostile-server: ${kind}: ${String(err)}\n`);
      process.exit(2);
    });
    server.listen({ host: '::', port });
    await once(server, 'listening');
    ports[kind] = (server.address() as net.AddressInfo).port;
  }
  const lines = createInterface({ input: process.stdin });
  lines.on('line', (line) => {
    if (line.trim() === 'stats') process.stdout.write(`stats ${JSON.stringify(stats)}\n`);
  });
  lines.on('close', () => process.exit(0));
  process.on('SIGTERM', () => process.exit(0));
  process.stdout.write(`ready ${JSON.stringify(ports)}\n`);
}

/** A hostile server running inside a netns. */
export interface HostileServer {
  pid: number;
  ports: HostileOptions;
  /** Current counters (asks the server over stdin). */
  stats(): Promise<HostileStats>;
  /** Closes its stdin (it exits), then SIGKILL after 2 s; resolves once it is gone. Idempotent. */
  stop(): Promise<void>;
}

/** Starts hostile-server.ts inside the named netns (e.g. a lab pod's `name`) and waits until it listens. */
export async function startHostileServer(netnsName: string, opts: HostileOptions): Promise<HostileServer> {
  const waiters: ((s: HostileStats) => void)[] = [];
  const onLine = (line: string): void => {
    if (line.startsWith('stats ')) waiters.shift()?.(JSON.parse(line.slice(6)) as HostileStats);
  };
  const started = await startNetnsScript<HostileOptions>('hostile server', netnsName, fileURLToPath(import.meta.url), [JSON.stringify(opts)], 10_000, onLine);
  const child = started.child;
  return {
    pid: child.pid as number,
    ports: started.ready,
    stats: () => new Promise((resolve) => {
      waiters.push(resolve);
      child.stdin.write('stats\n');
    }),
    stop: started.stop,
  };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  main().catch((err: unknown) => {
    process.stderr.write(`hostile-server: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(2);
  });
}
