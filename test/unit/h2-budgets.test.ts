/**
 * The connection core's frame budgets (agent/http2/connection.ts), each role, over an in-memory
 * duplex with a raw peer writing frames by hand (issue 31 items 1, 4, 6):
 *  - a header block takes at most 8 CONTINUATIONs, empty ones included (connection and the
 *    HeaderBlockJoiner on its own);
 *  - frames without progress spend a per-connection budget: each flood ends with GOAWAY
 *    ENHANCE_YOUR_CALM and a reason naming it, after about the budget's frames, not the flood's;
 *  - an ordinary peer's traffic (a PING, WINDOW_UPDATEs and a SETTINGS per call) never spends it;
 *  - a 1xx head on a stream of ours is no progress: endless ones end the connection as any flood;
 *  - a budget shared across connections (the prober's, per pod) is not re-armed by a new
 *    connection: a pod that spent it is cut after a connection's free frames, its neighbour keeps
 *    its own, and its streak is logged once;
 *  - stream ids stop at 2^31-1, and the unary client moves to a new connection with no call lost.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import * as net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { duplexPair, type Duplex } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { H2Connection, H2ConnectionError, HeaderBlockJoiner, MAX_STREAM_ID, NO_PROGRESS_BUDGET, type H2Handler } from '../../agent/http2/connection.ts';
import { encodeLiteralBlock, type HeaderField } from '../../agent/http2/hpack.ts';
import { UnaryH2Client, type UnaryH2Response } from '../../agent/http2/unary-client.ts';
import { UnaryH2Server } from '../../agent/http2/unary-server.ts';
import { CLIENT_PREFACE, Flag, frameBytes, FrameType, H2Error, parseGoaway } from '../../agent/http2/wire.ts';
import { FrameBudgetError, SHARED_FREE_FRAMES } from '../../agent/http2/frame-budget.ts';
import { PodFrameBudgets } from '../../agent/probe/pod-frame-budgets.ts';
import { createLogger } from '../../agent/log.ts';

const REQUEST = encodeLiteralBlock([
  { name: ':method', value: 'POST' }, { name: ':scheme', value: 'http' }, { name: ':path', value: '/x' }, { name: ':authority', value: 'a' },
]);
const RESPONSE = encodeLiteralBlock([{ name: ':status', value: '200' }]);
const TRAILERS = encodeLiteralBlock([{ name: 'grpc-status', value: '0' }]);
const PING = frameBytes(FrameType.PING, 0, 0, Buffer.alloc(8));
const u32 = (n: number): Buffer => {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n);
  return b;
};

/** What the raw peer saw of the connection: its GOAWAY and whether it closed. */
interface Rig {
  conn: H2Connection;
  peer: Duplex;
  goaway: { code: number; debug: string } | undefined;
  closedWith: Error | undefined | null;
  /** Frames the peer wrote before the connection closed. */
  written: number;
  heard: HeaderField[][];
}

/** An H2Connection of `role` on one end of a duplex pair; the peer end has sent its preface (and our stream 1's HEADERS if a client). */
function rig(role: 'client' | 'server', extra: Partial<ConstructorParameters<typeof H2Connection>[1]> = {}): Rig {
  const [a, peer] = duplexPair();
  const conn = new H2Connection(a, { role, settings: { maxConcurrentStreams: 100 }, connectionWindow: 1 << 20, ...extra });
  const r: Rig = { conn, peer, goaway: undefined, closedWith: null, written: 0, heard: [] };
  let buf = Buffer.alloc(0);
  peer.on('data', (d: Buffer) => {
    buf = Buffer.concat([buf, d]);
    if (role === 'client' && buf.subarray(0, CLIENT_PREFACE.length).equals(CLIENT_PREFACE)) buf = buf.subarray(CLIENT_PREFACE.length);
    while (buf.length >= 9) {
      const len = buf.readUIntBE(0, 3);
      if (buf.length < 9 + len) break;
      if (buf[3] === FrameType.GOAWAY) {
        const g = parseGoaway(buf.subarray(9, 9 + len))!;
        r.goaway = { code: g.code, debug: g.debug };
      }
      buf = buf.subarray(9 + len);
    }
  });
  peer.on('error', () => {});
  // A server answers as gRPC does: HEADERS, a message, trailers.
  const answer = (id: number): void => {
    conn.headers(id, RESPONSE, false);
    conn.data(id, Buffer.alloc(7), false);
    conn.headers(id, TRAILERS, true);
  };
  const h: H2Handler = {
    headers: (id, fields, endStream, opened) => {
      r.heard.push(fields);
      if (opened && endStream) answer(id);
    },
    data: (id, f, _payload, endStream) => {
      conn.consumed(f.payload.length, id);
      if (endStream && role === 'server') answer(id);
    },
    reset: () => {},
    goaway: () => {},
    closed: (err) => {
      r.closedWith = err;
    },
  };
  conn.start(h);
  const hello = [frameBytes(FrameType.SETTINGS, 0, 0)];
  if (role === 'server') hello.unshift(CLIENT_PREFACE);
  peer.write(Buffer.concat(hello));
  if (role === 'client') conn.request(REQUEST, true);
  return r;
}

/** Writes frames from `make` in batches until the connection closes or `max` are written. */
async function flood(r: Rig, make: (i: number) => Buffer, max: number): Promise<void> {
  while (r.written < max && r.closedWith === null) {
    const batch: Buffer[] = [];
    for (let i = 0; i < 500; i++) batch.push(make(r.written + i));
    r.written += 500;
    r.peer.write(Buffer.concat(batch));
    await new Promise((res) => setImmediate(res));
  }
  for (let i = 0; i < 20 && r.goaway === undefined; i++) await new Promise((res) => setImmediate(res));
}

describe('CONTINUATION frames per header block are bounded', () => {
  for (const role of ['client', 'server'] as const) {
    it(`${role}: empty CONTINUATIONs end the connection with ENHANCE_YOUR_CALM after 8`, async () => {
      const r = rig(role, role === 'client' ? { ignoreIdleStreams: true } : {});
      const id = 1;
      r.peer.write(frameBytes(FrameType.HEADERS, 0, id, role === 'client' ? RESPONSE : REQUEST));
      await flood(r, () => frameBytes(FrameType.CONTINUATION, 0, id), 200_000);
      expect(r.closedWith).toBeInstanceOf(H2ConnectionError);
      expect((r.closedWith as H2ConnectionError).code).toBe(H2Error.ENHANCE_YOUR_CALM);
      expect(r.closedWith!.message).toMatch(/more than 8 CONTINUATION frames/);
      expect(r.goaway?.code).toBe(H2Error.ENHANCE_YOUR_CALM);
      expect(r.written, 'the connection closed within the first batch').toBeLessThanOrEqual(1000);
    });
  }

  it('the joiner on its own takes a block in 8 CONTINUATIONs and refuses the 9th', () => {
    const j = new HeaderBlockJoiner(64 * 1024);
    const f = (type: number, flags: number, payload: Buffer = Buffer.alloc(0)) => {
      const raw = frameBytes(type, flags, 1, payload);
      return { type, flags, streamId: 1, payload: raw.subarray(9), raw };
    };
    expect(j.take(f(FrameType.HEADERS, 0, REQUEST.subarray(0, 3)))).toBeNull();
    for (let i = 0; i < 7; i++) expect(j.take(f(FrameType.CONTINUATION, 0))).toBeNull();
    expect(j.take(f(FrameType.CONTINUATION, Flag.END_HEADERS, REQUEST.subarray(3)))!.block).toEqual(REQUEST);
    expect(j.take(f(FrameType.HEADERS, 0, REQUEST))).toBeNull();
    for (let i = 0; i < 8; i++) j.take(f(FrameType.CONTINUATION, 0));
    expect(() => j.take(f(FrameType.CONTINUATION, 0))).toThrow(/more than 8 CONTINUATION/);
  });
});

/** Each flood: the role it is aimed at and its frames (stream 1 is open: the client's request, or the peer's). */
const FLOODS: Record<string, { role: 'client' | 'server'; setup?: Buffer; frame: (i: number) => Buffer }> = {
  'empty DATA': { role: 'server', setup: frameBytes(FrameType.HEADERS, Flag.END_HEADERS, 1, REQUEST), frame: () => frameBytes(FrameType.DATA, 0, 1) },
  'padded empty DATA': {
    role: 'server', setup: frameBytes(FrameType.HEADERS, Flag.END_HEADERS, 1, REQUEST),
    frame: () => frameBytes(FrameType.DATA, Flag.PADDED, 1, Buffer.from([3, 0, 0, 0])),
  },
  PING: { role: 'server', frame: () => PING },
  'PING ACK': { role: 'client', frame: () => frameBytes(FrameType.PING, Flag.ACK, 0, Buffer.alloc(8)) },
  SETTINGS: { role: 'server', frame: () => frameBytes(FrameType.SETTINGS, 0, 0) },
  'RST_STREAM on closed streams': {
    role: 'server', setup: frameBytes(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 1, REQUEST),
    frame: () => frameBytes(FrameType.RST_STREAM, 0, 1, u32(H2Error.CANCEL)),
  },
  'RST_STREAM on idle streams (prober)': { role: 'client', frame: (i) => frameBytes(FrameType.RST_STREAM, 0, 3 + 2 * i, u32(0)) },
  'server-opened HEADERS (prober)': { role: 'client', frame: (i) => frameBytes(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 2 + 2 * i, RESPONSE) },
  'refused HEADERS (beyond MAX_CONCURRENT_STREAMS)': { role: 'server', frame: (i) => frameBytes(FrameType.HEADERS, Flag.END_HEADERS, 1 + 2 * i, REQUEST) },
  'WINDOW_UPDATE 0 on a closed stream': {
    role: 'server', setup: frameBytes(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 1, REQUEST),
    frame: () => frameBytes(FrameType.WINDOW_UPDATE, 0, 1, u32(0)),
  },
  'WINDOW_UPDATE 1 on the connection': { role: 'client', frame: () => frameBytes(FrameType.WINDOW_UPDATE, 0, 0, u32(1)) },
  PRIORITY: { role: 'server', frame: () => frameBytes(FrameType.PRIORITY, 0, 5, Buffer.from([0, 0, 0, 0, 16])) },
  'unknown frame type': { role: 'client', frame: () => frameBytes(0xfa, 0, 0, Buffer.alloc(4)) },
  '1xx HEADERS on our open stream (prober)': { role: 'client', frame: () => frameBytes(FrameType.HEADERS, Flag.END_HEADERS, 1, encodeLiteralBlock([{ name: ':status', value: '100' }])) },
};

describe('frames without progress spend a per-connection budget', () => {
  for (const [name, a] of Object.entries(FLOODS)) {
    it(`${name} (${a.role}): GOAWAY ENHANCE_YOUR_CALM after about ${NO_PROGRESS_BUDGET} frames, whatever the flood`, async () => {
      const r = rig(a.role, a.role === 'client' ? { ignoreIdleStreams: true } : { settings: { maxConcurrentStreams: name.startsWith('refused') ? 0 : 100 } });
      if (a.setup) r.peer.write(a.setup);
      await flood(r, a.frame, 200_000);
      expect(r.closedWith, 'the connection closed').toBeInstanceOf(H2ConnectionError);
      expect(r.closedWith!.message).toMatch(/peer flooded frames without progress .*budget of 1000 spent/);
      expect((r.closedWith as H2ConnectionError).code).toBe(H2Error.ENHANCE_YOUR_CALM);
      expect(r.goaway?.code).toBe(H2Error.ENHANCE_YOUR_CALM);
      expect(r.goaway?.debug).toMatch(/without progress/);
      // The budget, what time refilled meanwhile, and the batch in flight when it closed.
      expect(r.written).toBeLessThan(20_000);
    });
  }

  it("an ordinary peer: 5,000 calls, each with a PING (grpc-go's BDP ping) and a connection WINDOW_UPDATE, a SETTINGS every 10th, never spend it", async () => {
    const r = rig('server', { noProgressBudget: 100 });
    for (let i = 0; i < 5000; i++) {
      const id = 1 + 2 * i;
      r.peer.write(Buffer.concat([
        frameBytes(FrameType.HEADERS, Flag.END_HEADERS, id, REQUEST),
        frameBytes(FrameType.DATA, Flag.END_STREAM, id, Buffer.alloc(10)),
        PING,
        frameBytes(FrameType.WINDOW_UPDATE, 0, 0, u32(100)),
        ...(i % 10 === 0 ? [frameBytes(FrameType.SETTINGS, 0, 0), frameBytes(FrameType.SETTINGS, Flag.ACK, 0)] : []),
      ]));
      if (i % 100 === 0) await new Promise((res) => setImmediate(res));
    }
    await new Promise((res) => setImmediate(res));
    expect(r.closedWith).toBeNull();
    expect(r.heard.length).toBe(5000);
    r.conn.destroy();
  });

  it('progress gives back: frames without progress between calls, fewer than the budget per call, go on for ever', async () => {
    const r = rig('server', { noProgressBudget: 50 });
    for (let i = 0; i < 400; i++) {
      const id = 1 + 2 * i;
      // HEADERS and DATA with octets give back two; one PING spends one.
      r.peer.write(Buffer.concat([frameBytes(FrameType.HEADERS, Flag.END_HEADERS, id, REQUEST), frameBytes(FrameType.DATA, Flag.END_STREAM, id, Buffer.alloc(1)), PING]));
    }
    await new Promise((res) => setImmediate(res));
    expect(r.closedWith).toBeNull();
    r.conn.destroy();
  });
});

describe('a frame budget shared across connections (the prober\'s, per pod)', () => {
  const SETTINGS = (): Buffer => frameBytes(FrameType.SETTINGS, 0, 0);
  /** The frames without progress a closed connection counted, from its error ("(SETTINGS n)"). */
  const ATTACKER = { uid: 'a', namespace: 'ns', name: 'attacker' };
  const P = { uid: 'p', namespace: 'ns', name: 'p' };
  const spent = (r: Rig): number => Number(/\(SETTINGS (\d+)\)/.exec(r.closedWith?.message ?? '')?.[1] ?? NaN);

  it('a SETTINGS flood on each new connection: cut at the pod\'s budget, then after a connection\'s free frames; the neighbour keeps its own; one warning per streak', async () => {
    const lines: string[] = [];
    const budgets = new PodFrameBudgets({ max: 200, refillMs: 3_600_000, log: createLogger({ level: 'info', format: 'json', write: (l) => lines.push(l) }) });
    const first = rig('client', { ignoreIdleStreams: true, sharedBudget: budgets.of(ATTACKER) });
    await flood(first, SETTINGS, 200_000);
    expect(first.closedWith).toBeInstanceOf(FrameBudgetError);
    expect((first.closedWith as FrameBudgetError).scope).toBe('shared');
    expect(first.closedWith!.message).toMatch(/peer flooded frames without progress \(SETTINGS \d+\): the pod's frame budget \(200 frames without progress per 3600 s, over all its probes' connections\) is spent/);
    expect(first.goaway?.code).toBe(H2Error.ENHANCE_YOUR_CALM);
    // Its own 200 past the connection's free frames (and the peer's first SETTINGS).
    expect(spent(first)).toBeLessThanOrEqual(200 + SHARED_FREE_FRAMES + 2);
    for (let i = 0; i < 3; i++) {
      const again = rig('client', { ignoreIdleStreams: true, sharedBudget: budgets.of(ATTACKER) });
      await flood(again, SETTINGS, 200_000);
      expect(again.closedWith).toBeInstanceOf(FrameBudgetError);
      expect(spent(again), 'a new connection is not a new budget').toBeLessThanOrEqual(SHARED_FREE_FRAMES + 2);
    }
    // The neighbour: 150 frames without progress on one connection spend only its own bucket.
    const neighbour = rig('client', { ignoreIdleStreams: true, sharedBudget: budgets.of({ uid: 'n', namespace: 'ns', name: 'neighbour' }) });
    neighbour.peer.write(Buffer.concat(Array.from({ length: 150 }, SETTINGS)));
    for (let i = 0; i < 20; i++) await new Promise((res) => setImmediate(res));
    expect(neighbour.closedWith).toBeNull();
    neighbour.conn.destroy();
    const warned = lines.filter((l) => l.includes('"level":"warn"'));
    expect(warned).toHaveLength(1);
    expect(warned[0]).toContain('ns/attacker');
  });

  it('a pod whose budget refilled runs in full again (its streak ends, logged)', async () => {
    const lines: string[] = [];
    const budgets = new PodFrameBudgets({ max: 50, refillMs: 100, log: createLogger({ level: 'info', format: 'json', write: (l) => lines.push(l) }) });
    const r = rig('client', { ignoreIdleStreams: true, sharedBudget: budgets.of(P) });
    r.peer.write(Buffer.concat(Array.from({ length: 20_000 }, SETTINGS)));
    for (let i = 0; i < 20 && r.closedWith === null; i++) await new Promise((res) => setImmediate(res));
    expect(r.closedWith).toBeInstanceOf(FrameBudgetError);
    expect(lines.filter((l) => l.includes('floods the prober'))).toHaveLength(1);
    await new Promise((res) => setTimeout(res, 300));
    budgets.of(P);
    budgets.of(P);
    expect(lines.filter((l) => l.includes('no longer floods'))).toHaveLength(1);
    // Refilled: a new connection takes its whole budget again before it is cut.
    const after = rig('client', { ignoreIdleStreams: true, sharedBudget: budgets.of(P) });
    after.peer.write(Buffer.concat(Array.from({ length: 40 }, SETTINGS)));
    for (let i = 0; i < 20; i++) await new Promise((res) => setImmediate(res));
    expect(after.closedWith).toBeNull();
    after.conn.destroy();
  });
});

describe('stream ids never wrap', () => {
  it('a client connection starts its last stream at 2^31-1, then request() returns 0 and mayStart is false', () => {
    const [a] = duplexPair();
    const conn = new H2Connection(a, { role: 'client', settings: {}, connectionWindow: 65_535, firstStreamId: MAX_STREAM_ID - 4 });
    conn.start({ headers: () => {}, data: () => {}, reset: () => {}, goaway: () => {}, closed: () => {} });
    expect(conn.streamsLeft).toBe(3);
    expect([conn.request(REQUEST, true), conn.request(REQUEST, true), conn.request(REQUEST, true)]).toEqual([MAX_STREAM_ID - 4, MAX_STREAM_ID - 2, MAX_STREAM_ID]);
    expect(conn.streamsLeft).toBe(0);
    expect(conn.mayStart).toBe(false);
    expect(conn.request(REQUEST, true)).toBe(0);
    conn.destroy();
  });

  it('the unary client moves to a new connection at the last id: 40 calls (sequential and 30 at once), every one answered', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'h2-ids-'));
    const sock = path.join(dir, 's.sock');
    const server = new UnaryH2Server({ maxRequestBytes: 1024, maxConcurrentStreams: 4 }, (s) => s.message(s.body.subarray(5)));
    let connections = 0;
    const srv = net.createServer((c) => {
      connections++;
      server.emit('connection', c);
    });
    await new Promise<void>((res) => srv.listen(sock, res));
    const client = new UnaryH2Client(sock, { maxResponseBytes: 1024, firstStreamId: MAX_STREAM_ID - 8 });
    const call = (i: number): Promise<UnaryH2Response> => new Promise((resolve, reject) => {
      const body = Buffer.alloc(6);
      body.writeUInt32BE(1, 1);
      body[5] = i & 0xff;
      client.call(REQUEST, body, { done: resolve, fail: reject });
    });
    try {
      for (let i = 0; i < 10; i++) expect((await call(i)).body.at(-1)).toBe(i);
      const many = await Promise.all(Array.from({ length: 30 }, (_, i) => call(100 + i)));
      expect(many.map((m) => m.body.at(-1))).toEqual(Array.from({ length: 30 }, (_, i) => 100 + i));
      // Five ids per connection: 40 calls need at least 8 connections.
      expect(connections).toBeGreaterThanOrEqual(8);
    } finally {
      client.close();
      server.destroy();
      srv.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
