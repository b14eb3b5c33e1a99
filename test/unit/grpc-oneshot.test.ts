/**
 * The gRPC probe's one-shot HTTP/2 exchange (agent/http2/unary-oneshot.ts) against raw frame peers
 * on real loopback TCP: each peer reads the client's preface and frames with our FrameSplitter and
 * writes its answer by hand, so what a naive codec gets wrong shows: an answer split into one-octet
 * reads, header blocks over CONTINUATION, Huffman strings and dynamic-table references (as grpc-go
 * and grpc-js send them), trailers-only answers, RST_STREAM, GOAWAY (fatal and graceful), flow
 * control both ways, PING, an over-size body, and peers that do not speak HTTP/2 at all.
 */
import * as net from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { FrameSplitter } from '../../agent/http2/connection.ts';
import { encodeInteger, encodeLiteralBlock, HpackDecoder, type HeaderField } from '../../agent/http2/hpack.ts';
import { huffmanEncode } from '../../agent/http2/huffman.ts';
import { exchangeOnce, type OneShotEnd, type OneShotRequest } from '../../agent/http2/unary-oneshot.ts';
import { LeanSocket } from '../../agent/io/lean-socket.ts';
import {
  CLIENT_PREFACE, Flag, frameBytes, FrameType, goawayFrame, H2Error, rstStreamFrame, Setting, windowUpdateFrame, type Frame,
} from '../../agent/http2/wire.ts';
import { parseSettings, settingsFrame } from '../support/raw-h2.ts';

const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanups.splice(0)) c();
});

/** The server side of one connection: frames the client sent, in order, and a way to write. */
class Peer {
  readonly socket: net.Socket;
  readonly #reader = new FrameSplitter(true);
  readonly #frames: Frame[] = [];
  #wake: (() => void) | undefined;
  closed = false;

  constructor(socket: net.Socket) {
    this.socket = socket;
    socket.on('data', (c: Buffer) => {
      this.#reader.push(c);
      for (let f = this.#reader.next(); f !== null; f = this.#reader.next()) this.#frames.push(f);
      this.#wake?.();
    });
    socket.on('close', () => {
      this.closed = true;
      this.#wake?.();
    });
    socket.on('error', () => {});
  }

  /** The next frame from the client matching `want` (others are skipped), or null once it closed. */
  async next(want: (f: Frame) => boolean = () => true): Promise<Frame | null> {
    for (;;) {
      const i = this.#frames.findIndex(want);
      if (i >= 0) return this.#frames.splice(0, i + 1)[i]!;
      if (this.closed) return null;
      await new Promise<void>((r) => (this.#wake = r));
    }
  }

  /** The client's request: its decoded header fields and DATA octets up to END_STREAM. */
  async request(): Promise<{ headers: HeaderField[]; body: Buffer }> {
    const h = await this.next((f) => f.type === FrameType.HEADERS);
    const headers = new HpackDecoder({ maxTableSize: 4096, maxHeaderListSize: 65536 }).decode(h!.payload);
    const chunks: Buffer[] = [];
    for (;;) {
      const d = await this.next((f) => f.type === FrameType.DATA);
      chunks.push(d!.payload);
      if (d!.flags & Flag.END_STREAM) return { headers, body: Buffer.concat(chunks) };
    }
  }

  write(b: Buffer): void {
    this.socket.write(b);
  }

  /** Writes `b` one octet per write, with a pause between, so the client reads it in many pieces. */
  async drip(b: Buffer): Promise<void> {
    for (const octet of b) {
      this.socket.write(Buffer.from([octet]));
      await new Promise((r) => setTimeout(r, 1));
    }
  }
}

/** A loopback server whose connection is handed to `script`; the client runs one exchange against it, reading lean. */
async function exchange(script: (p: Peer) => Promise<void>, req: Partial<OneShotRequest> = {}): Promise<{ end: OneShotEnd; peer: Peer }> {
  let peer: Peer | undefined;
  const scriptDone: Promise<void>[] = [];
  const srv = net.createServer((s) => {
    peer = new Peer(s);
    scriptDone.push(script(peer).catch(() => {}));
  });
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  cleanups.push(() => srv.close());
  const sock = net.connect((srv.address() as net.AddressInfo).port, '127.0.0.1');
  cleanups.push(() => sock.destroy());
  await new Promise((r) => sock.once('connect', r));
  const request: OneShotRequest = {
    block: encodeLiteralBlock(HEALTH_HEADERS),
    body: Buffer.from([0, 0, 0, 0, 0]),
    maxResponseBytes: 16 * 1024,
    maxHeaderListSize: 16 * 1024,
    ...req,
  };
  // As the gRPC probe does: the connection read lean, into the reused buffer (a drip is many reads of it).
  const channel = LeanSocket.take(sock);
  expect(channel.lean).toBe(true);
  cleanups.push(() => channel.destroy());
  const end = await new Promise<OneShotEnd>((resolve) => {
    exchangeOnce(channel, request, resolve);
  });
  await Promise.all(scriptDone);
  return { end, peer: peer! };
}

const HEALTH_HEADERS: HeaderField[] = [
  { name: ':method', value: 'POST' }, { name: ':scheme', value: 'http' }, { name: ':path', value: '/grpc.health.v1.Health/Check' },
  { name: ':authority', value: '10.0.0.1:9000' }, { name: 'content-type', value: 'application/grpc' }, { name: 'te', value: 'trailers' },
];
const SERVING = Buffer.from([0, 0, 0, 0, 2, 0x08, 0x01]);
const SERVER_SETTINGS = settingsFrame([[Setting.MAX_CONCURRENT_STREAMS, 100]]);

/** An HPACK string literal, Huffman-coded. */
function huff(s: string): Buffer {
  const h = huffmanEncode(Buffer.from(s, 'latin1'));
  return Buffer.concat([encodeInteger(h.length, 7, 0x80), h]);
}
/** "Literal with incremental indexing" by static name index, Huffman value (what grpc-go and nghttp2 send). */
function indexedLiteral(nameIndex: number, value: string): Buffer {
  return Buffer.concat([encodeInteger(nameIndex, 6, 0x40), huff(value)]);
}
/** "Literal with incremental indexing" with a new Huffman name. */
function newNameLiteral(name: string, value: string): Buffer {
  return Buffer.concat([Buffer.from([0x40]), huff(name), huff(value)]);
}
const fieldValue = (fields: HeaderField[] | undefined, name: string): string | undefined => fields?.find((f) => f.name === name)?.value;

describe('one-shot unary HTTP/2 exchange', () => {
  it('sends preface, SETTINGS, the request headers and body; reads an answer dripped one octet per read, with Huffman and dynamic-table headers', async () => {
    let seen: { headers: HeaderField[]; body: Buffer } | undefined;
    let acked = false;
    const { end } = await exchange(async (p) => {
      seen = await p.request();
      p.write(SERVER_SETTINGS);
      // Response headers: :status 200 (static index 8), content-type added to the dynamic table (index 62),
      // grpc-status/grpc-message in the trailers as new names (grpc-go's encoder does the same).
      const headers = Buffer.concat([Buffer.from([0x88]), indexedLiteral(31, 'application/grpc')]);
      const trailers = Buffer.concat([newNameLiteral('grpc-status', '0'), newNameLiteral('grpc-message', 'ok%20then')]);
      await p.drip(Buffer.concat([
        frameBytes(FrameType.HEADERS, Flag.END_HEADERS, 1, headers),
        frameBytes(FrameType.DATA, 0, 1, SERVING),
        frameBytes(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 1, trailers),
      ]));
      acked = (await p.next((f) => f.type === FrameType.SETTINGS && (f.flags & Flag.ACK) !== 0)) !== null;
    });
    expect(seen?.headers).toEqual(HEALTH_HEADERS);
    expect(seen?.body).toEqual(Buffer.from([0, 0, 0, 0, 0]));
    expect(acked).toBe(true);
    expect(end.kind).toBe('response');
    if (end.kind !== 'response') return;
    expect(fieldValue(end.headers, ':status')).toBe('200');
    expect(fieldValue(end.headers, 'content-type')).toBe('application/grpc');
    expect(end.trailers).toEqual([{ name: 'grpc-status', value: '0' }, { name: 'grpc-message', value: 'ok%20then' }]);
    expect(end.body).toEqual(SERVING);
  });

  it('a second header block refers to entries the first one added to the dynamic table', async () => {
    const { end } = await exchange(async (p) => {
      await p.request();
      p.write(SERVER_SETTINGS);
      // Trailers' grpc-status by dynamic index 62 (added by the headers block), as an encoder that indexes everything does.
      const headers = Buffer.concat([Buffer.from([0x88]), indexedLiteral(31, 'application/grpc'), newNameLiteral('grpc-status', '5')]);
      p.write(Buffer.concat([
        frameBytes(FrameType.HEADERS, Flag.END_HEADERS, 1, headers),
        frameBytes(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 1, Buffer.from([0x80 | 62, 0x80 | 63])),
      ]));
    });
    expect(end.kind).toBe('response');
    if (end.kind !== 'response') return;
    expect(end.trailers).toEqual([{ name: 'grpc-status', value: '5' }, { name: 'content-type', value: 'application/grpc' }]);
  });

  it('header blocks split over HEADERS and CONTINUATION frames (both the response headers and the trailers)', async () => {
    const { end } = await exchange(async (p) => {
      await p.request();
      const headers = encodeLiteralBlock([{ name: ':status', value: '200' }, { name: 'content-type', value: 'application/grpc' }]);
      const trailers = encodeLiteralBlock([{ name: 'grpc-status', value: '0' }, { name: 'x-pad', value: 'p'.repeat(300) }]);
      p.write(Buffer.concat([
        SERVER_SETTINGS,
        frameBytes(FrameType.HEADERS, 0, 1, headers.subarray(0, 3)),
        frameBytes(FrameType.CONTINUATION, 0, 1, headers.subarray(3, 7)),
        frameBytes(FrameType.CONTINUATION, Flag.END_HEADERS, 1, headers.subarray(7)),
        frameBytes(FrameType.DATA, 0, 1, SERVING),
        frameBytes(FrameType.HEADERS, Flag.END_STREAM, 1, trailers.subarray(0, 100)),
        frameBytes(FrameType.CONTINUATION, Flag.END_HEADERS, 1, trailers.subarray(100)),
      ]));
    });
    expect(end.kind).toBe('response');
    if (end.kind !== 'response') return;
    expect(fieldValue(end.headers, 'content-type')).toBe('application/grpc');
    expect(fieldValue(end.trailers, 'grpc-status')).toBe('0');
    expect(fieldValue(end.trailers, 'x-pad')).toHaveLength(300);
    expect(end.body).toEqual(SERVING);
  });

  it('a trailers-only answer (one HEADERS with END_STREAM) ends the exchange without trailers', async () => {
    const { end } = await exchange(async (p) => {
      await p.request();
      const block = encodeLiteralBlock([{ name: ':status', value: '200' }, { name: 'content-type', value: 'application/grpc' }, { name: 'grpc-status', value: '12' }]);
      p.write(Buffer.concat([SERVER_SETTINGS, frameBytes(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 1, block)]));
    });
    expect(end).toMatchObject({ kind: 'response', trailers: undefined, body: Buffer.alloc(0) });
    if (end.kind === 'response') expect(fieldValue(end.headers, 'grpc-status')).toBe('12');
  });

  it('RST_STREAM on our stream ends it with the code; on another stream it is ignored', async () => {
    const { end } = await exchange(async (p) => {
      await p.request();
      p.write(Buffer.concat([SERVER_SETTINGS, rstStreamFrame(3, H2Error.CANCEL), rstStreamFrame(1, H2Error.INTERNAL_ERROR)]));
    });
    expect(end).toMatchObject({ kind: 'reset', code: H2Error.INTERNAL_ERROR, headers: undefined });
  });

  it('a GOAWAY with an error ends the exchange; a graceful one that covers stream 1 lets the answer finish', async () => {
    const fatal = await exchange(async (p) => {
      await p.request();
      p.write(Buffer.concat([SERVER_SETTINGS, goawayFrame(1, H2Error.ENHANCE_YOUR_CALM, 'calm down')]));
    });
    expect(fatal.end).toEqual({ kind: 'goaway', code: H2Error.ENHANCE_YOUR_CALM, debug: 'calm down', processed: true });
    const unprocessed = await exchange(async (p) => {
      await p.request();
      p.write(Buffer.concat([SERVER_SETTINGS, goawayFrame(0, H2Error.NO_ERROR)]));
    });
    expect(unprocessed.end).toMatchObject({ kind: 'goaway', code: 0, processed: false });
    const graceful = await exchange(async (p) => {
      await p.request();
      const headers = encodeLiteralBlock([{ name: ':status', value: '200' }, { name: 'content-type', value: 'application/grpc' }]);
      p.write(Buffer.concat([
        SERVER_SETTINGS, goawayFrame(1, H2Error.NO_ERROR),
        frameBytes(FrameType.HEADERS, Flag.END_HEADERS, 1, headers), frameBytes(FrameType.DATA, 0, 1, SERVING),
        frameBytes(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 1, encodeLiteralBlock([{ name: 'grpc-status', value: '0' }])),
      ]));
    });
    expect(graceful.end).toMatchObject({ kind: 'response', body: SERVING });
  });

  it('PING is answered with the same payload, ACK set', async () => {
    let pong: Frame | null = null;
    await exchange(async (p) => {
      await p.request();
      p.write(Buffer.concat([SERVER_SETTINGS, frameBytes(FrameType.PING, 0, 0, Buffer.from('12345678'))]));
      pong = await p.next((f) => f.type === FrameType.PING);
      p.write(frameBytes(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 1, encodeLiteralBlock([{ name: ':status', value: '200' }])));
    });
    expect(pong).toMatchObject({ flags: Flag.ACK, payload: Buffer.from('12345678') });
  });

  it('a request body larger than the server\'s window waits for WINDOW_UPDATE; frames respect the window', async () => {
    const body = Buffer.alloc(100_000, 7);
    let received = 0;
    let beforeUpdate = 0;
    const { end } = await exchange(async (p) => {
      p.write(SERVER_SETTINGS);
      // Take DATA until nothing more comes without a WINDOW_UPDATE (the initial 65535 window).
      while (received < 65_535) received += (await p.next((f) => f.type === FrameType.DATA))!.payload.length;
      await new Promise((r) => setTimeout(r, 100));
      beforeUpdate = received;
      p.write(Buffer.concat([windowUpdateFrame(0, 100_000), windowUpdateFrame(1, 100_000)]));
      for (;;) {
        const d = (await p.next((f) => f.type === FrameType.DATA))!;
        received += d.payload.length;
        if (d.flags & Flag.END_STREAM) break;
      }
      p.write(frameBytes(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 1, encodeLiteralBlock([{ name: ':status', value: '200' }])));
    }, { body });
    expect(beforeUpdate).toBe(65_535);
    expect(received).toBe(100_000);
    expect(end.kind).toBe('response');
  });

  it('gives the server window back as it reads, so an answer larger than the initial window arrives', async () => {
    const big = Buffer.alloc(150_000, 1);
    let updates = 0;
    const { end } = await exchange(async (p) => {
      await p.request();
      const headers = encodeLiteralBlock([{ name: ':status', value: '200' }, { name: 'content-type', value: 'application/grpc' }]);
      p.write(Buffer.concat([SERVER_SETTINGS, frameBytes(FrameType.HEADERS, Flag.END_HEADERS, 1, headers)]));
      // Send only within the windows the client gives (both start at 65535).
      let conn = 65_535;
      let stream = 65_535;
      let sent = 0;
      while (sent < big.length) {
        const n = Math.min(16_384, conn, stream, big.length - sent);
        if (n === 0) {
          const u = (await p.next((f) => f.type === FrameType.WINDOW_UPDATE))!;
          updates++;
          const inc = u.payload.readUInt32BE(0);
          if (u.streamId === 0) conn += inc;
          else stream += inc;
          continue;
        }
        p.write(frameBytes(FrameType.DATA, sent + n === big.length ? Flag.END_STREAM : 0, 1, big.subarray(sent, sent + n)));
        sent += n;
        conn -= n;
        stream -= n;
      }
    }, { maxResponseBytes: 1 << 20 });
    expect(updates).toBeGreaterThan(0);
    expect(end).toMatchObject({ kind: 'response' });
    if (end.kind === 'response') expect(end.body.length).toBe(150_000);
  });

  it('a body beyond maxResponseBytes ends the exchange as too-large and resets the stream (CANCEL)', async () => {
    let rst: Frame | null = null;
    const { end } = await exchange(async (p) => {
      await p.request();
      const headers = encodeLiteralBlock([{ name: ':status', value: '200' }]);
      p.write(Buffer.concat([SERVER_SETTINGS, frameBytes(FrameType.HEADERS, Flag.END_HEADERS, 1, headers), frameBytes(FrameType.DATA, 0, 1, Buffer.alloc(16_000)), frameBytes(FrameType.DATA, 0, 1, Buffer.alloc(1000))]));
      rst = await p.next((f) => f.type === FrameType.RST_STREAM);
    });
    expect(end).toEqual({ kind: 'too-large', size: 17_000 });
    expect(rst).toMatchObject({ streamId: 1, payload: Buffer.from([0, 0, 0, H2Error.CANCEL]) });
  });

  it('peers that do not speak HTTP/2: an HTTP/1.1 answer, a TLS alert, a first frame that is not SETTINGS', async () => {
    const http1 = await exchange(async (p) => void p.write(Buffer.from('HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n')));
    expect(http1.end).toMatchObject({ kind: 'broken', message: expect.stringMatching(/exceeds SETTINGS_MAX_FRAME_SIZE/) });
    // A TLS server answers our preface with a fatal alert (7 octets, less than a frame header) and closes.
    const tls = await exchange(async (p) => void p.socket.end(Buffer.from([0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x46])));
    expect(tls.end).toMatchObject({ kind: 'eof', headers: undefined });
    const noSettings = await exchange(async (p) => void p.write(frameBytes(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 1, encodeLiteralBlock([{ name: ':status', value: '200' }]))));
    expect(noSettings.end).toMatchObject({ kind: 'broken', message: 'first frame from the server was type 1, not SETTINGS' });
  });

  it('a server that closes at once, and one that closes mid-answer: eof', async () => {
    const atOnce = await exchange(async (p) => void p.socket.end());
    expect(atOnce.end).toMatchObject({ kind: 'eof', headers: undefined });
    const midway = await exchange(async (p) => {
      await p.request();
      p.socket.end(Buffer.concat([SERVER_SETTINGS, frameBytes(FrameType.HEADERS, Flag.END_HEADERS, 1, encodeLiteralBlock([{ name: ':status', value: '200' }]))]));
    });
    expect(midway.end).toMatchObject({ kind: 'eof', headers: [{ name: ':status', value: '200' }], trailers: undefined });
  });

  it('a header list beyond our SETTINGS_MAX_HEADER_LIST_SIZE is a protocol error, with GOAWAY to the server', async () => {
    let goaway: Frame | null = null;
    const { end } = await exchange(async (p) => {
      const s = await p.next((f) => f.type === FrameType.SETTINGS);
      expect(parseSettings(s!.payload)).toContainEqual([Setting.MAX_HEADER_LIST_SIZE, 1024]);
      p.write(Buffer.concat([SERVER_SETTINGS, frameBytes(FrameType.HEADERS, Flag.END_HEADERS, 1, encodeLiteralBlock([{ name: ':status', value: '200' }, { name: 'x-big', value: 'b'.repeat(2000) }]))]));
      goaway = await p.next((f) => f.type === FrameType.GOAWAY);
    }, { maxHeaderListSize: 1024 });
    expect(end).toMatchObject({ kind: 'broken', message: expect.stringMatching(/header list larger than 1024/) });
    expect(goaway).toMatchObject({ type: FrameType.GOAWAY });
  });

  it('the client preface comes first on the wire', async () => {
    let first: Buffer | undefined;
    const srv = net.createServer((s) => s.once('data', (c: Buffer) => {
      first = c;
      s.destroy();
    }));
    await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
    cleanups.push(() => srv.close());
    const sock = net.connect((srv.address() as net.AddressInfo).port, '127.0.0.1');
    cleanups.push(() => sock.destroy());
    await new Promise((r) => sock.once('connect', r));
    await new Promise<OneShotEnd>((r) => exchangeOnce(sock, { block: encodeLiteralBlock(HEALTH_HEADERS), body: Buffer.alloc(5), maxResponseBytes: 100, maxHeaderListSize: 1000 }, r));
    expect(first?.subarray(0, CLIENT_PREFACE.length)).toEqual(CLIENT_PREFACE);
  });
});
