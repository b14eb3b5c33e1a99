/**
 * The hand-written unary HTTP/2 client and server of the shim <-> agent hop (agent/http2/unary-*.ts),
 * on real unix sockets. Each side is also driven by a raw peer that writes frames by hand, so
 * what a naive codec gets wrong shows: frames split across reads, CONTINUATION, flow control
 * (an answer larger than the window waits for WINDOW_UPDATE), PING, GOAWAY with streams above its
 * last-stream-id (not started), RST_STREAM either way, a garbage preface, over-size header blocks
 * and messages, and many concurrent calls beyond the server's MAX_CONCURRENT_STREAMS.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import * as http2 from 'node:http2';
import * as net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { FrameSplitter } from '../../agent/http2/connection.ts';
import { encodeLiteralBlock, HpackDecoder, type HeaderField } from '../../agent/http2/hpack.ts';
import { UnaryH2Client, UnaryH2Error, type UnaryH2Response } from '../../agent/http2/unary-client.ts';
import { UnaryH2Server, type UnaryH2Stream } from '../../agent/http2/unary-server.ts';
import {
  CLIENT_PREFACE, Flag, frameBytes, FrameType, goawayFrame, H2Error, parseGoaway, rstStreamFrame, Setting, windowUpdateFrame, type Frame,
} from '../../agent/http2/wire.ts';
import { parseSettings, settingsFrame } from '../support/raw-h2.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'unary-h2-'));
let n = 0;
const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanups.splice(0)) c();
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function sockPath(): string {
  return path.join(dir, `s${n++}.sock`);
}

async function listen(onConn: (s: net.Socket) => void): Promise<string> {
  const p = sockPath();
  const srv = net.createServer(onConn);
  await new Promise<void>((r) => srv.listen(p, r));
  cleanups.push(() => srv.close());
  return p;
}

/** A UnaryH2Server on a socket; `handler` answers each call (default: echo the body as the message). */
async function startServer(handler?: (s: UnaryH2Stream) => void, limits: Partial<ConstructorParameters<typeof UnaryH2Server>[0]> = {}): Promise<{ server: UnaryH2Server; path: string }> {
  const server = new UnaryH2Server({ maxRequestBytes: 1024 * 1024, maxConcurrentStreams: 64, ...limits }, handler ?? ((s) => s.message(s.body.subarray(5))));
  const p = await listen((sock) => server.emit('connection', sock));
  cleanups.push(() => server.destroy());
  return { server, path: p };
}

function grpcBody(msg: Buffer): Buffer {
  const b = Buffer.alloc(5 + msg.length);
  b.writeUInt32BE(msg.length, 1);
  msg.copy(b, 5);
  return b;
}

function requestBlock(extra: HeaderField[] = []): Buffer {
  return encodeLiteralBlock([
    { name: ':method', value: 'POST' }, { name: ':scheme', value: 'http' }, { name: ':path', value: '/t.S/M' },
    { name: ':authority', value: 'x' }, { name: 'content-type', value: 'application/grpc' }, ...extra,
  ]);
}

function call(c: UnaryH2Client, body: Buffer, extra: HeaderField[] = []): { done: Promise<UnaryH2Response>; cancel: () => void } {
  let cancel = (): void => {};
  const done = new Promise<UnaryH2Response>((resolve, reject) => {
    cancel = c.call(requestBlock(extra), body, { done: resolve, fail: reject }).cancel;
  });
  return { done, cancel };
}

const field = (fs: HeaderField[] | undefined, name: string): string | undefined => fs?.find((f) => f.name === name)?.value;

/** A peer writing and reading frames by hand. */
class RawPeer {
  readonly socket: net.Socket;
  readonly frames: Frame[] = [];
  readonly decoder = new HpackDecoder({ maxTableSize: 4096, maxHeaderListSize: 1 << 20 });
  closed = false;
  readonly #reader: FrameSplitter;
  #waiters: (() => void)[] = [];

  constructor(socket: net.Socket, isServer: boolean) {
    this.socket = socket;
    this.#reader = new FrameSplitter(isServer);
    socket.on('data', (c: Buffer) => {
      this.#reader.push(c);
      for (let f = this.#reader.next(); f !== null; f = this.#reader.next()) this.frames.push({ ...f, payload: Buffer.from(f.payload) });
      for (const w of this.#waiters.splice(0)) w();
    });
    socket.on('error', () => {});
    socket.on('close', () => {
      this.closed = true;
      for (const w of this.#waiters.splice(0)) w();
    });
  }

  /** Waits (up to 10 s) for a frame matching `pred` that arrived at or after index `from`. */
  async frame(pred: (f: Frame) => boolean, from = 0): Promise<Frame> {
    const deadline = Date.now() + 10_000;
    for (;;) {
      const f = this.frames.slice(from).find(pred);
      if (f) return f;
      if (this.closed) throw new Error('connection closed while waiting for a frame');
      if (Date.now() > deadline) throw new Error('no such frame within 10 s');
      await new Promise<void>((r) => {
        this.#waiters.push(r);
        setTimeout(r, 200);
      });
    }
  }

  async whenClosed(): Promise<void> {
    const deadline = Date.now() + 10_000;
    while (!this.closed) {
      if (Date.now() > deadline) throw new Error('connection still open after 10 s');
      await new Promise((r) => setTimeout(r, 20));
    }
  }

  write(...frames: Buffer[]): void {
    this.socket.write(Buffer.concat(frames));
  }
}

async function rawClient(p: string, settings: Array<[number, number]> = []): Promise<RawPeer> {
  const s = net.connect(p);
  await new Promise<void>((r) => s.once('connect', () => r()));
  const peer = new RawPeer(s, false);
  cleanups.push(() => s.destroy());
  peer.write(CLIENT_PREFACE, settingsFrame(settings));
  return peer;
}

/** A raw server: every connection becomes a RawPeer (the preface read), its SETTINGS written. */
async function rawServer(settings: Array<[number, number]> = []): Promise<{ path: string; peers: RawPeer[]; next: () => Promise<RawPeer> }> {
  const peers: RawPeer[] = [];
  const p = await listen((sock) => {
    const peer = new RawPeer(sock, true);
    cleanups.push(() => sock.destroy());
    peers.push(peer);
    peer.write(settingsFrame(settings));
  });
  return {
    path: p,
    peers,
    next: async () => {
      const deadline = Date.now() + 10_000;
      while (peers.length === 0) {
        if (Date.now() > deadline) throw new Error('no connection');
        await new Promise((r) => setTimeout(r, 10));
      }
      return peers[peers.length - 1]!;
    },
  };
}

const isHeaders = (id: number) => (f: Frame): boolean => f.type === FrameType.HEADERS && f.streamId === id;

/** Answers one stream of a raw server with a gRPC message and OK trailers. */
function rawAnswer(peer: RawPeer, id: number, msg: Buffer): void {
  peer.write(
    frameBytes(FrameType.HEADERS, Flag.END_HEADERS, id, encodeLiteralBlock([{ name: ':status', value: '200' }])),
    frameBytes(FrameType.DATA, 0, id, grpcBody(msg)),
    frameBytes(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, id, encodeLiteralBlock([{ name: 'grpc-status', value: '0' }])),
  );
}

describe('the unary HTTP/2 server', () => {
  it('reads a request split into one-octet reads and answers HEADERS, DATA and trailers', async () => {
    const { path: p } = await startServer();
    const peer = await rawClient(p);
    const bytes = Buffer.concat([
      frameBytes(FrameType.HEADERS, Flag.END_HEADERS, 1, requestBlock()),
      frameBytes(FrameType.DATA, Flag.END_STREAM, 1, grpcBody(Buffer.from('hello'))),
    ]);
    for (const b of bytes) {
      peer.socket.write(Buffer.from([b]));
      await new Promise((r) => setImmediate(r));
    }
    const h = await peer.frame(isHeaders(1));
    expect(field(peer.decoder.decode(h.payload), ':status')).toBe('200');
    const d = await peer.frame((f) => f.type === FrameType.DATA && f.streamId === 1);
    expect(d.payload.subarray(5).toString()).toBe('hello');
    const t = await peer.frame((f) => isHeaders(1)(f) && (f.flags & Flag.END_STREAM) !== 0);
    expect(field(peer.decoder.decode(t.payload), 'grpc-status')).toBe('0');
  });

  it('joins a request header block sent as HEADERS + CONTINUATION frames', async () => {
    let seen = '';
    const { path: p } = await startServer((s) => {
      seen = field(s.headers, 'x-big') ?? '';
      s.message(Buffer.from('ok'));
    });
    const peer = await rawClient(p);
    const block = requestBlock([{ name: 'x-big', value: 'v'.repeat(30_000) }]);
    peer.write(
      frameBytes(FrameType.HEADERS, 0, 1, block.subarray(0, 10_000)),
      frameBytes(FrameType.CONTINUATION, 0, 1, block.subarray(10_000, 20_000)),
      frameBytes(FrameType.CONTINUATION, Flag.END_HEADERS, 1, block.subarray(20_000)),
      frameBytes(FrameType.DATA, Flag.END_STREAM, 1, grpcBody(Buffer.alloc(0))),
    );
    await peer.frame((f) => isHeaders(1)(f) && (f.flags & Flag.END_STREAM) !== 0);
    expect(seen).toBe('v'.repeat(30_000));
  });

  it('sends an answer larger than the client\'s window only as WINDOW_UPDATEs open it', async () => {
    const big = Buffer.alloc(100, 7);
    const { path: p } = await startServer((s) => s.message(big));
    const peer = await rawClient(p, [[Setting.INITIAL_WINDOW_SIZE, 10]]);
    peer.write(frameBytes(FrameType.HEADERS, Flag.END_HEADERS, 1, requestBlock()), frameBytes(FrameType.DATA, Flag.END_STREAM, 1, grpcBody(Buffer.alloc(0))));
    await peer.frame((f) => f.type === FrameType.DATA);
    await new Promise((r) => setTimeout(r, 200));
    const sent = (): number => peer.frames.filter((f) => f.type === FrameType.DATA).reduce((a, f) => a + f.payload.length, 0);
    expect(sent()).toBe(10);
    expect(peer.frames.some((f) => isHeaders(1)(f) && (f.flags & Flag.END_STREAM) !== 0)).toBe(false);
    peer.write(windowUpdateFrame(1, 50));
    await new Promise((r) => setTimeout(r, 200));
    expect(sent()).toBe(60);
    peer.write(windowUpdateFrame(1, 1000));
    await peer.frame((f) => isHeaders(1)(f) && (f.flags & Flag.END_STREAM) !== 0);
    expect(sent()).toBe(105);
    const body = Buffer.concat(peer.frames.filter((f) => f.type === FrameType.DATA).map((f) => f.payload));
    expect(body.subarray(5)).toEqual(big);
  });

  it('answers PING with its payload, ACKs SETTINGS, and sends its MAX_CONCURRENT_STREAMS', async () => {
    const { path: p } = await startServer(undefined, { maxConcurrentStreams: 7 });
    const peer = await rawClient(p);
    const settings = await peer.frame((f) => f.type === FrameType.SETTINGS && (f.flags & Flag.ACK) === 0);
    expect(parseSettings(settings.payload)).toContainEqual([Setting.MAX_CONCURRENT_STREAMS, 7]);
    await peer.frame((f) => f.type === FrameType.SETTINGS && (f.flags & Flag.ACK) !== 0);
    const ping = Buffer.from('12345678');
    peer.write(frameBytes(FrameType.PING, 0, 0, ping));
    const ack = await peer.frame((f) => f.type === FrameType.PING && (f.flags & Flag.ACK) !== 0);
    expect(ack.payload).toEqual(ping);
  });

  it('on drain: GOAWAY with the last stream taken; that call is answered, a stream above it is not started, then the connection closes', async () => {
    const held: UnaryH2Stream[] = [];
    const { server, path: p } = await startServer((s) => held.push(s));
    const peer = await rawClient(p);
    peer.write(frameBytes(FrameType.HEADERS, Flag.END_HEADERS, 1, requestBlock()), frameBytes(FrameType.DATA, Flag.END_STREAM, 1, grpcBody(Buffer.alloc(0))));
    while (held.length === 0) await new Promise((r) => setTimeout(r, 10));
    const closed = server.close();
    const g = parseGoaway((await peer.frame((f) => f.type === FrameType.GOAWAY)).payload)!;
    expect(g.lastStreamId).toBe(1);
    expect(g.code).toBe(H2Error.NO_ERROR);
    peer.write(frameBytes(FrameType.HEADERS, Flag.END_HEADERS, 3, requestBlock()), frameBytes(FrameType.DATA, Flag.END_STREAM, 3, grpcBody(Buffer.alloc(0))));
    await new Promise((r) => setTimeout(r, 100));
    expect(held.length).toBe(1);
    held[0]!.message(Buffer.from('last'));
    await closed;
    await peer.whenClosed();
    expect(peer.frames.some((f) => isHeaders(1)(f) && (f.flags & Flag.END_STREAM) !== 0)).toBe(true);
    expect(peer.frames.some((f) => f.streamId === 3)).toBe(false);
  });

  it('on drain, an answer waiting for the client\'s window is still sent whole; then the connection closes', async () => {
    const { server, path: p } = await startServer((s) => s.message(Buffer.alloc(100, 9)));
    const peer = await rawClient(p, [[Setting.INITIAL_WINDOW_SIZE, 10]]);
    peer.write(frameBytes(FrameType.HEADERS, Flag.END_HEADERS, 1, requestBlock()), frameBytes(FrameType.DATA, Flag.END_STREAM, 1, grpcBody(Buffer.alloc(0))));
    await peer.frame((f) => f.type === FrameType.DATA);
    const closed = server.close();
    await peer.frame((f) => f.type === FrameType.GOAWAY);
    await new Promise((r) => setTimeout(r, 200));
    expect(peer.closed).toBe(false);
    peer.write(windowUpdateFrame(1, 1000));
    await closed;
    await peer.whenClosed();
    const body = Buffer.concat(peer.frames.filter((f) => f.type === FrameType.DATA).map((f) => f.payload));
    expect(body.subarray(5)).toEqual(Buffer.alloc(100, 9));
    expect(peer.frames.some((f) => isHeaders(1)(f) && (f.flags & Flag.END_STREAM) !== 0)).toBe(true);
  });

  it('a client RST_STREAM cancels the call in flight; the connection serves the next one', async () => {
    let cancelled = 0;
    const { path: p } = await startServer((s) => {
      if (s.streamId === 1) s.oncancel = () => cancelled++;
      else s.message(Buffer.from('fine'));
    });
    const peer = await rawClient(p);
    peer.write(frameBytes(FrameType.HEADERS, Flag.END_HEADERS, 1, requestBlock()), frameBytes(FrameType.DATA, Flag.END_STREAM, 1, grpcBody(Buffer.alloc(0))));
    await new Promise((r) => setTimeout(r, 100));
    peer.write(rstStreamFrame(1, H2Error.CANCEL));
    peer.write(frameBytes(FrameType.HEADERS, Flag.END_HEADERS, 3, requestBlock()), frameBytes(FrameType.DATA, Flag.END_STREAM, 3, grpcBody(Buffer.alloc(0))));
    await peer.frame((f) => f.type === FrameType.DATA && f.streamId === 3);
    expect(cancelled).toBe(1);
  });

  it('closes a connection whose preface is garbage (GOAWAY PROTOCOL_ERROR) and keeps serving others', async () => {
    const { path: p } = await startServer();
    const s = net.connect(p);
    const bad = new RawPeer(s, false);
    cleanups.push(() => s.destroy());
    s.write('GET / HTTP/1.1\r\nHost: x\r\n\r\n');
    const g = parseGoaway((await bad.frame((f) => f.type === FrameType.GOAWAY)).payload)!;
    expect(g.code).toBe(H2Error.PROTOCOL_ERROR);
    expect(g.debug).toContain('not an HTTP/2 client preface');
    await bad.whenClosed();
    const c = new UnaryH2Client(p, { maxResponseBytes: 1024 });
    cleanups.push(() => c.close());
    expect((await call(c, grpcBody(Buffer.from('still'))).done).body.subarray(5).toString()).toBe('still');
  });

  it('bounds a header block (GOAWAY naming the limit) and a message (RESOURCE_EXHAUSTED) with clear errors', async () => {
    const { path: p } = await startServer(undefined, { maxRequestBytes: 1000 });
    const c = new UnaryH2Client(p, { maxResponseBytes: 1 << 20 });
    cleanups.push(() => c.close());
    const big = await call(c, grpcBody(Buffer.alloc(5000))).done;
    expect(field(big.headers, 'grpc-status')).toBe('8');
    expect(decodeURIComponent(field(big.headers, 'grpc-message') ?? '')).toContain('larger than max');
    expect((await call(c, grpcBody(Buffer.from('small'))).done).body.subarray(5).toString()).toBe('small');
    const err = await call(c, grpcBody(Buffer.alloc(1)), [{ name: 'x-huge', value: 'h'.repeat(70_000) }]).done.then(() => undefined, (e: unknown) => e);
    expect(err).toBeInstanceOf(UnaryH2Error);
    expect((err as UnaryH2Error).message).toMatch(/header block on stream 5 larger than 65536 octets/);
  });

  it('cuts a connection whose answers pile up unread (a zero window) beyond maxBufferedOutput', async () => {
    let answered = 0;
    const { path: p, server } = await startServer((s) => {
      answered++;
      s.message(Buffer.alloc(1000));
    }, { maxBufferedOutput: 10_000 });
    const peer = await rawClient(p, [[Setting.INITIAL_WINDOW_SIZE, 0]]);
    for (let id = 1; id <= 39; id += 2) peer.write(frameBytes(FrameType.HEADERS, Flag.END_HEADERS, id, requestBlock()), frameBytes(FrameType.DATA, Flag.END_STREAM, id, grpcBody(Buffer.alloc(0))));
    await peer.whenClosed();
    expect(answered).toBeGreaterThanOrEqual(9);
    expect(answered).toBeLessThan(20);
    expect(peer.frames.some((f) => f.type === FrameType.DATA)).toBe(false);
    for (let i = 0; i < 100 && server.connections > 0; i++) await new Promise((r) => setTimeout(r, 20));
    expect(server.connections).toBe(0);
  });

  it('refuses streams beyond MAX_CONCURRENT_STREAMS with REFUSED_STREAM', async () => {
    const { path: p } = await startServer(() => {}, { maxConcurrentStreams: 1 });
    const peer = await rawClient(p);
    for (const id of [1, 3]) peer.write(frameBytes(FrameType.HEADERS, Flag.END_HEADERS, id, requestBlock()), frameBytes(FrameType.DATA, Flag.END_STREAM, id, grpcBody(Buffer.alloc(0))));
    const rst = await peer.frame((f) => f.type === FrameType.RST_STREAM);
    expect(rst.streamId).toBe(3);
    expect(rst.payload.readUInt32BE(0)).toBe(H2Error.REFUSED_STREAM);
  });
});

describe('the unary HTTP/2 client', () => {
  it('reads an answer split into one-octet reads', async () => {
    const raw = await rawServer();
    const c = new UnaryH2Client(raw.path, { maxResponseBytes: 1024 });
    cleanups.push(() => c.close());
    const pending = call(c, grpcBody(Buffer.from('q'))).done;
    const peer = await raw.next();
    await peer.frame((f) => f.type === FrameType.DATA && (f.flags & Flag.END_STREAM) !== 0);
    const answer = Buffer.concat([
      frameBytes(FrameType.HEADERS, Flag.END_HEADERS, 1, encodeLiteralBlock([{ name: ':status', value: '200' }])),
      frameBytes(FrameType.DATA, 0, 1, grpcBody(Buffer.from('split'))),
      frameBytes(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 1, encodeLiteralBlock([{ name: 'grpc-status', value: '0' }])),
    ]);
    for (const b of answer) {
      peer.socket.write(Buffer.from([b]));
      await new Promise((r) => setImmediate(r));
    }
    const res = await pending;
    expect(res.body.subarray(5).toString()).toBe('split');
    expect(field(res.trailers, 'grpc-status')).toBe('0');
  });

  it('splits a large request header block into CONTINUATION frames and reads trailers sent as HEADERS + CONTINUATION', async () => {
    const raw = await rawServer();
    const c = new UnaryH2Client(raw.path, { maxResponseBytes: 1024 });
    cleanups.push(() => c.close());
    const pending = call(c, grpcBody(Buffer.alloc(0)), [{ name: 'x-big', value: 'b'.repeat(40_000) }]).done;
    const peer = await raw.next();
    await peer.frame((f) => f.type === FrameType.DATA);
    expect(peer.frames.filter((f) => f.type === FrameType.CONTINUATION).length).toBeGreaterThanOrEqual(2);
    const req = Buffer.concat(peer.frames.filter((f) => f.type === FrameType.HEADERS || f.type === FrameType.CONTINUATION).map((f) => f.payload));
    expect(field(peer.decoder.decode(req), 'x-big')).toBe('b'.repeat(40_000));
    const trailers = encodeLiteralBlock([{ name: 'grpc-status', value: '5' }, { name: 'x-t', value: 't'.repeat(20_000) }]);
    peer.write(
      frameBytes(FrameType.HEADERS, Flag.END_STREAM, 1, trailers.subarray(0, 100)),
      frameBytes(FrameType.CONTINUATION, 0, 1, trailers.subarray(100, 10_000)),
      frameBytes(FrameType.CONTINUATION, Flag.END_HEADERS, 1, trailers.subarray(10_000)),
    );
    const res = await pending;
    expect(field(res.headers, 'grpc-status')).toBe('5');
    expect(field(res.headers, 'x-t')).toBe('t'.repeat(20_000));
  });

  it('sends a request larger than the server\'s stream window only as WINDOW_UPDATEs open it, and answers PING', async () => {
    const raw = await rawServer([[Setting.INITIAL_WINDOW_SIZE, 16]]);
    const c = new UnaryH2Client(raw.path, { maxResponseBytes: 1024 });
    cleanups.push(() => c.close());
    // The first request waits for the server's SETTINGS only if it is sent after them: send after.
    const peer0 = call(c, grpcBody(Buffer.alloc(0)));
    const peer = await raw.next();
    await peer.frame((f) => f.type === FrameType.SETTINGS && (f.flags & Flag.ACK) !== 0);
    rawAnswer(peer, 1, Buffer.from('a'));
    await peer0.done;
    const body = grpcBody(Buffer.alloc(100, 1));
    const pending = call(c, body).done;
    await peer.frame((f) => f.type === FrameType.DATA && f.streamId === 3);
    await new Promise((r) => setTimeout(r, 200));
    const got = (): number => peer.frames.filter((f) => f.type === FrameType.DATA && f.streamId === 3).reduce((a, f) => a + f.payload.length, 0);
    expect(got()).toBe(16);
    peer.write(frameBytes(FrameType.PING, 0, 0, Buffer.from('abcdefgh')));
    expect((await peer.frame((f) => f.type === FrameType.PING && (f.flags & Flag.ACK) !== 0)).payload.toString()).toBe('abcdefgh');
    peer.write(windowUpdateFrame(3, 200));
    await peer.frame((f) => f.type === FrameType.DATA && f.streamId === 3 && (f.flags & Flag.END_STREAM) !== 0);
    expect(got()).toBe(105);
    rawAnswer(peer, 3, Buffer.from('b'));
    expect((await pending).body.subarray(5).toString()).toBe('b');
  });

  it('GOAWAY mid-call: streams above last-stream-id fail as not started, the one below is answered, a new call opens a new connection', async () => {
    const raw = await rawServer();
    const c = new UnaryH2Client(raw.path, { maxResponseBytes: 1024 });
    cleanups.push(() => c.close());
    const calls = [call(c, grpcBody(Buffer.from('1'))), call(c, grpcBody(Buffer.from('3'))), call(c, grpcBody(Buffer.from('5')))];
    const outcomes = calls.map((x) => x.done.then((r) => r, (e: unknown) => e as UnaryH2Error));
    const peer = await raw.next();
    await peer.frame((f) => f.type === FrameType.DATA && f.streamId === 5);
    peer.write(goawayFrame(1, H2Error.NO_ERROR, 'draining'));
    const [, e3, e5] = await Promise.all([new Promise((r) => setTimeout(r, 100)), outcomes[1], outcomes[2]]);
    for (const e of [e3, e5]) {
      expect(e).toBeInstanceOf(UnaryH2Error);
      expect((e as UnaryH2Error).notStarted).toBe(true);
      expect((e as UnaryH2Error).message).toContain('draining');
    }
    rawAnswer(peer, 1, Buffer.from('one'));
    expect(((await outcomes[0]) as UnaryH2Response).body.subarray(5).toString()).toBe('one');
    await peer.whenClosed();
    const again = call(c, grpcBody(Buffer.from('x'))).done;
    while (raw.peers.length < 2) await new Promise((r) => setTimeout(r, 10));
    const peer2 = raw.peers[1]!;
    await peer2.frame((f) => f.type === FrameType.DATA && f.streamId === 1);
    rawAnswer(peer2, 1, Buffer.from('two'));
    expect((await again).body.subarray(5).toString()).toBe('two');
  });

  it('RST_STREAM from the server: REFUSED_STREAM is not started, CANCEL is broken; a cancelled call sends RST_STREAM CANCEL', async () => {
    const raw = await rawServer();
    const c = new UnaryH2Client(raw.path, { maxResponseBytes: 1024 });
    cleanups.push(() => c.close());
    const a = call(c, grpcBody(Buffer.alloc(0)));
    const b = call(c, grpcBody(Buffer.alloc(0)));
    const x = call(c, grpcBody(Buffer.alloc(0)));
    const peer = await raw.next();
    await peer.frame((f) => f.type === FrameType.DATA && f.streamId === 5);
    peer.write(rstStreamFrame(1, H2Error.REFUSED_STREAM), rstStreamFrame(3, H2Error.CANCEL));
    const ea = (await a.done.catch((e: unknown) => e)) as UnaryH2Error;
    const eb = (await b.done.catch((e: unknown) => e)) as UnaryH2Error;
    expect([ea.failure, ea.notStarted, ea.resetCode]).toEqual(['broken', true, H2Error.REFUSED_STREAM]);
    expect([eb.failure, eb.notStarted, eb.resetCode]).toEqual(['broken', false, H2Error.CANCEL]);
    x.cancel();
    const rst = await peer.frame((f) => f.type === FrameType.RST_STREAM);
    expect([rst.streamId, rst.payload.readUInt32BE(0)]).toEqual([5, H2Error.CANCEL]);
  });

  it('1xx heads: five are skipped before the answer (Go\'s client); a sixth fails the call, its stream reset PROTOCOL_ERROR', async () => {
    const raw = await rawServer();
    const c = new UnaryH2Client(raw.path, { maxResponseBytes: 1024 });
    cleanups.push(() => c.close());
    const informational = (id: number): Buffer => frameBytes(FrameType.HEADERS, Flag.END_HEADERS, id, encodeLiteralBlock([{ name: ':status', value: '103' }, { name: 'link', value: '</a>' }]));
    const five = call(c, grpcBody(Buffer.alloc(0)));
    const six = call(c, grpcBody(Buffer.alloc(0)));
    const peer = await raw.next();
    await peer.frame((f) => f.type === FrameType.DATA && f.streamId === 3);
    peer.write(
      ...Array.from({ length: 5 }, () => informational(1)),
      frameBytes(FrameType.HEADERS, Flag.END_HEADERS, 1, encodeLiteralBlock([{ name: ':status', value: '200' }])),
      frameBytes(FrameType.DATA, 0, 1, grpcBody(Buffer.from('ok'))),
      frameBytes(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 1, encodeLiteralBlock([{ name: 'grpc-status', value: '0' }])),
      ...Array.from({ length: 6 }, () => informational(3)),
    );
    const r = await five.done;
    expect(field(r.headers, ':status')).toBe('200');
    expect(r.body.subarray(5).toString()).toBe('ok');
    const e = (await six.done.catch((err: unknown) => err)) as UnaryH2Error;
    expect([e.failure, e.notStarted]).toEqual(['broken', false]);
    expect(e.message).toMatch(/more than 5 1xx informational responses/);
    const rst = await peer.frame((f) => f.type === FrameType.RST_STREAM && f.streamId === 3);
    expect(rst.payload.readUInt32BE(0)).toBe(H2Error.PROTOCOL_ERROR);
  });

  it('a socket nobody listens on is unreachable and not started; an answer over the limit is too-large', async () => {
    const c = new UnaryH2Client(path.join(dir, 'nobody.sock'), { maxResponseBytes: 10 });
    const e = (await call(c, grpcBody(Buffer.alloc(0))).done.catch((err: unknown) => err)) as UnaryH2Error;
    expect([e.failure, e.notStarted]).toEqual(['unreachable', true]);
    const { path: p } = await startServer((s) => s.message(Buffer.alloc(100)));
    const c2 = new UnaryH2Client(p, { maxResponseBytes: 10 });
    cleanups.push(() => c2.close());
    const e2 = (await call(c2, grpcBody(Buffer.alloc(0))).done.catch((err: unknown) => err)) as UnaryH2Error;
    expect([e2.failure, e2.notStarted]).toEqual(['too-large', false]);
  });
});

describe('client and server together', () => {
  for (const maxConnections of [1, 4]) {
    it(`many concurrent calls beyond MAX_CONCURRENT_STREAMS, at most ${maxConnections} connection(s): ${maxConnections > 1 ? 'more connections open, ' : ''}the rest wait in the client, none is refused, every call gets its own answer`, async () => {
      let active = 0;
      let peak = 0;
      const { path: p, server } = await startServer((s) => {
        active++;
        peak = Math.max(peak, active);
        setTimeout(() => {
          active--;
          s.message(s.body.subarray(5));
        }, 1 + (s.streamId % 7));
      }, { maxConcurrentStreams: 16 });
      const c = new UnaryH2Client(p, { maxResponseBytes: 1024, maxConnections });
      cleanups.push(() => c.close());
      // Let the server's SETTINGS arrive first, as they do for the shim's long-lived connection.
      await call(c, grpcBody(Buffer.from('warm'))).done;
      const answers = await Promise.all(Array.from({ length: 400 }, (_, i) => call(c, grpcBody(Buffer.from(`call-${i}`))).done));
      expect(answers.map((a) => a.body.subarray(5).toString())).toEqual(Array.from({ length: 400 }, (_, i) => `call-${i}`));
      expect(peak).toBeLessThanOrEqual(16 * maxConnections);
      expect(peak).toBeGreaterThan(maxConnections > 1 ? 16 : 1);
      expect(server.connections).toBe(maxConnections);
      expect(c.connections).toBe(maxConnections);
    });
  }

  it('a client cancel reaches the server as RST_STREAM: the handler sees oncancel', async () => {
    let cancelled = false;
    let seen = false;
    const { path: p } = await startServer((s) => {
      seen = true;
      s.oncancel = () => {
        cancelled = true;
      };
    });
    const c = new UnaryH2Client(p, { maxResponseBytes: 1024 });
    cleanups.push(() => c.close());
    const x = call(c, grpcBody(Buffer.alloc(0)));
    while (!seen) await new Promise((r) => setTimeout(r, 10));
    x.cancel();
    const deadline = Date.now() + 10_000;
    while (!cancelled && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
    expect(cancelled).toBe(true);
  });
});

describe('across versions', () => {
  it('the client against node:http2\'s server (the agent before this change): Huffman and dynamic-table answers, its MAX_CONCURRENT_STREAMS kept, a trailers-only status', async () => {
    const srv = http2.createServer({ settings: { maxConcurrentStreams: 4 } });
    let seen = 0;
    srv.on('stream', (stream, headers) => {
      seen++;
      stream.on('data', () => {});
      stream.on('end', () => {
        if (headers['x-mode'] === 'status') {
          stream.respond({ ':status': 200, 'content-type': 'application/grpc+proto', 'grpc-status': '5', 'grpc-message': 'not%20found', 'probe-agent-not-started': 'draining' }, { endStream: true });
          return;
        }
        stream.respond({ ':status': 200, 'content-type': 'application/grpc+proto', 'x-echo': String(headers['x-n']) }, { waitForTrailers: true });
        stream.once('wantTrailers', () => stream.sendTrailers({ 'grpc-status': '0', 'grpc-message': 'OK' }));
        stream.end(grpcBody(Buffer.from(String(headers['x-n']))));
      });
    });
    const p = await listen((sock) => srv.emit('connection', sock));
    cleanups.push(() => srv.close());
    const c = new UnaryH2Client(p, { maxResponseBytes: 1024 });
    cleanups.push(() => c.close());
    // The connection's first call; then bursts of 10 the client must queue within the server's 4 streams.
    await call(c, grpcBody(Buffer.alloc(3)), [{ name: 'x-n', value: 'first' }]).done;
    // Repeated answers: node's encoder indexes them in its dynamic table, which our decoder must follow.
    for (let round = 0; round < 3; round++) {
      const answers = await Promise.all(Array.from({ length: 10 }, (_, i) => call(c, grpcBody(Buffer.alloc(3)), [{ name: 'x-n', value: `${round}-${i}` }]).done));
      expect(answers.map((a) => [a.body.subarray(5).toString(), field(a.headers, 'x-echo'), field(a.trailers, 'grpc-status')])).toEqual(
        Array.from({ length: 10 }, (_, i) => [`${round}-${i}`, `${round}-${i}`, '0']));
    }
    const st = await call(c, grpcBody(Buffer.alloc(0)), [{ name: 'x-mode', value: 'status' }]).done;
    expect([field(st.headers, 'grpc-status'), field(st.headers, 'grpc-message'), field(st.headers, 'probe-agent-not-started')]).toEqual(['5', 'not%20found', 'draining']);
    expect(seen).toBe(32);
  });
});
