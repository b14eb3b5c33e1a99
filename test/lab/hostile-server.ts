/**
 * A misbehaving application for lab pods: the targets a well-behaved pod server never plays. Each
 * behaviour gets its own port (dual-stack on `::`, 0 = any free port):
 *
 * - `endlessBody`:  HTTP 200, chunked, body never ends (as fast as the client reads)
 * - `dripBody`:     HTTP 200 announcing 1 MB, then one body byte every 50 ms
 * - `hugeHeaders`:  HTTP 200 with a 1 MiB header block, then a short body
 * - `garbageH2`:    answers the HTTP/2 preface with random bytes and keeps the connection open
 * - `rstStream`:    real HTTP/2; every stream is reset (RST_STREAM INTERNAL_ERROR) before any header
 * - `rstAfterHeaders`: real HTTP/2; gRPC response headers and 2 bytes of a message, then RST_STREAM INTERNAL_ERROR
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
export const HOSTILE_BEHAVIOURS = ['endlessBody', 'dripBody', 'hugeHeaders', 'garbageH2', 'rstStream', 'rstAfterHeaders'] as const;
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
  garbageH2: () => rawServer('garbageH2', garbageH2),
  rstStream: () => h2Server('rstStream'),
  rstAfterHeaders: () => h2Server('rstAfterHeaders'),
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
