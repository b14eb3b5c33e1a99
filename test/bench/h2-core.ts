/**
 * CPU of the HTTP/2 connection core alone (`node test/bench/h2-core.ts`; H2CORE_CALLS, H2CORE_STREAMS,
 * H2CORE_BODY): a client and a server H2Connection on two ends of a unix socket in this process,
 * unary exchanges (HEADERS + DATA, answered HEADERS + DATA + trailers) with `streams` in flight.
 * Prints the process's CPU per exchange (user + system) of the best of five rounds.
 */
import net from 'node:net';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { H2Connection as Core } from '../../agent/http2/connection.ts';
import { encodeLiteralBlock } from '../../agent/http2/hpack.ts';

// H2CORE_MODULE: another build's connection.ts, to compare two cores in one run.
const { H2Connection } = (await import(process.env.H2CORE_MODULE ?? '../../agent/http2/connection.ts')) as { H2Connection: typeof Core };
type H2Connection = Core;

const CALLS = Number(process.env.H2CORE_CALLS ?? 20_000);
const STREAMS = Number(process.env.H2CORE_STREAMS ?? 16);
const BODY = Number(process.env.H2CORE_BODY ?? 200);

const REQUEST = encodeLiteralBlock([
  { name: ':method', value: 'POST' }, { name: ':scheme', value: 'http' }, { name: ':path', value: '/runtime.v1.RuntimeService/ExecSync' },
  { name: ':authority', value: 'localhost' }, { name: 'content-type', value: 'application/grpc' }, { name: 'te', value: 'trailers' },
]);
const RESPONSE = encodeLiteralBlock([{ name: ':status', value: '200' }, { name: 'content-type', value: 'application/grpc' }]);
const TRAILERS = encodeLiteralBlock([{ name: 'grpc-status', value: '0' }]);

async function pair(): Promise<{ a: net.Socket; b: net.Socket; done: () => void }> {
  const dir = mkdtempSync(path.join(tmpdir(), 'h2core-'));
  const sock = path.join(dir, 's');
  const server = net.createServer();
  await new Promise<void>((r) => server.listen(sock, r));
  const accepted = new Promise<net.Socket>((r) => server.once('connection', r));
  const a = net.connect(sock);
  await new Promise<void>((r) => a.once('connect', r));
  const b = await accepted;
  return { a, b, done: () => { a.destroy(); b.destroy(); server.close(); rmSync(dir, { recursive: true, force: true }); } };
}

async function round(): Promise<number> {
  const { a, b, done } = await pair();
  const body = Buffer.alloc(BODY, 7);
  const server: H2Connection = new H2Connection(b, { role: 'server', settings: { maxConcurrentStreams: 1000 }, connectionWindow: 1 << 24 }).start({
    headers: () => {},
    data: (id, f, _payload, end) => {
      server.consumed(f.payload.length, id);
      if (!end) return;
      server.headers(id, RESPONSE, false);
      server.data(id, Buffer.from(body), false);
      server.headers(id, TRAILERS, true);
    },
    reset: () => {},
    goaway: () => {},
    closed: () => {},
  });
  let started = 0;
  let finished = 0;
  let resolve!: () => void;
  const all = new Promise<void>((r) => (resolve = r));
  const client: H2Connection = new H2Connection(a, { role: 'client', settings: {}, connectionWindow: 1 << 24 }).start({
    headers: (_id, _fields, end) => {
      if (!end) return;
      if (++finished === CALLS) resolve();
      else if (started < CALLS) call();
    },
    data: (id, f) => client.consumed(f.payload.length, id),
    reset: () => {},
    goaway: () => {},
    closed: () => {},
  });
  const call = (): void => {
    started++;
    const id = client.request(REQUEST, false);
    client.data(id, Buffer.from(body), true);
  };
  const t0 = process.cpuUsage();
  for (let i = 0; i < STREAMS; i++) call();
  await all;
  const t = process.cpuUsage(t0);
  done();
  return (t.user + t.system) / CALLS;
}

const rounds: number[] = [];
await round(); // warm-up
for (let i = 0; i < 5; i++) rounds.push(await round());
console.log(JSON.stringify({ calls: CALLS, streams: STREAMS, body: BODY, cpuUsPerCall: Math.min(...rounds).toFixed(2), rounds: rounds.map((r) => r.toFixed(2)) }));
