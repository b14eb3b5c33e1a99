/**
 * A property test of the HTTP/2 connection core (agent/http2/connection.ts) in each role: random
 * frame sequences, valid-ish and garbage, cut into random reads, fed to an H2Connection over an
 * in-memory duplex whose owner behaves as ours do (a server answers each request, a client sends a
 * few and reads the answers). For every sequence: nothing is thrown out of the connection (a
 * violation closes it), the connection closes once the peer ends (no hang), and what it holds stays
 * bounded (open streams, queued DATA; the heap across all sequences). Seeded: a failure names its
 * seed (SEED=<n> reruns just that one).
 */
import { duplexPair } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { FrameSplitter, H2Connection, H2ConnectionError, HeaderBlockJoiner } from '../../agent/http2/connection.ts';
import { encodeLiteralBlock } from '../../agent/http2/hpack.ts';
import { CLIENT_PREFACE, Flag, frameBytes, FrameType, H2Error, H2InputError } from '../../agent/http2/wire.ts';
import { mulberry32 } from '../support/prng.ts';

const REQUEST = encodeLiteralBlock([
  { name: ':method', value: 'POST' }, { name: ':scheme', value: 'http' }, { name: ':path', value: '/p' }, { name: ':authority', value: 'a' },
]);
const RESPONSE = encodeLiteralBlock([{ name: ':status', value: '200' }, { name: 'content-type', value: 'application/grpc' }]);
const TRAILERS = encodeLiteralBlock([{ name: 'grpc-status', value: '0' }]);

type Role = 'client' | 'prober' | 'server';

/** One random frame (or a run of garbage octets) a peer of `role`'s connection might send. */
function randomUnit(rnd: () => number, role: Role): Buffer {
  const int = (n: number): number => Math.floor(rnd() * n);
  const bytes = (n: number): Buffer => Buffer.from(Array.from({ length: n }, () => int(256)));
  const stream = (): number => [0, 1, 2, 3, 5, 7, 2 ** 31 - 1][int(7)]!;
  const u32 = (v: number): Buffer => {
    const b = Buffer.alloc(4);
    b.writeUInt32BE(v >>> 0);
    return b;
  };
  const pick = rnd();
  const flags = int(256) & (rnd() < 0.8 ? Flag.END_HEADERS | Flag.END_STREAM : 0xff);
  if (pick < 0.02) return bytes(1 + int(40)); // garbage
  if (pick < 0.14) {
    const s = [[1, 4096], [2, 0], [3, 100], [4, 65_535], [5, 16_384], [6, 8192], [int(20), int(2 ** 32)]] as const;
    const n = int(4);
    const p = Buffer.alloc(6 * n);
    for (let i = 0; i < n; i++) {
      const [id, v] = s[int(s.length)]!;
      p.writeUInt16BE(id, 6 * i);
      p.writeUInt32BE(v >>> 0, 6 * i + 2);
    }
    return frameBytes(FrameType.SETTINGS, rnd() < 0.2 ? Flag.ACK : 0, rnd() < 0.95 ? 0 : 1, rnd() < 0.95 ? p : bytes(int(9)));
  }
  if (pick < 0.22) return frameBytes(FrameType.PING, rnd() < 0.3 ? Flag.ACK : 0, rnd() < 0.95 ? 0 : 1, bytes(rnd() < 0.95 ? 8 : int(12)));
  if (pick < 0.45) {
    const block = role === 'server' ? REQUEST : rnd() < 0.5 ? RESPONSE : TRAILERS;
    const body = rnd() < 0.9 ? block : bytes(int(30));
    const cut = rnd() < 0.2 ? int(body.length) : body.length;
    const f = rnd() < 0.8 ? flags | (cut === body.length ? Flag.END_HEADERS : 0) : flags;
    return frameBytes(FrameType.HEADERS, f & ~(Flag.PADDED | Flag.PRIORITY) | (rnd() < 0.05 ? Flag.PADDED : 0), role === 'server' ? 1 + 2 * int(6) : stream(), body.subarray(0, cut));
  }
  if (pick < 0.5) return frameBytes(FrameType.CONTINUATION, rnd() < 0.5 ? Flag.END_HEADERS : 0, stream(), rnd() < 0.5 ? Buffer.alloc(0) : REQUEST.subarray(0, int(REQUEST.length)));
  if (pick < 0.7) {
    const n = int(4) === 0 ? 0 : int(200);
    const padded = rnd() < 0.1;
    const payload = padded ? Buffer.concat([Buffer.from([int(n + 2)]), Buffer.alloc(n)]) : Buffer.alloc(n);
    return frameBytes(FrameType.DATA, (rnd() < 0.3 ? Flag.END_STREAM : 0) | (padded ? Flag.PADDED : 0), role === 'server' ? 1 + 2 * int(6) : stream(), payload);
  }
  if (pick < 0.77) return frameBytes(FrameType.RST_STREAM, 0, stream(), rnd() < 0.95 ? u32(int(14)) : bytes(int(8)));
  if (pick < 0.87) return frameBytes(FrameType.WINDOW_UPDATE, 0, stream(), rnd() < 0.95 ? u32(rnd() < 0.1 ? 0 : rnd() < 0.05 ? 2 ** 31 - 1 : int(70_000)) : bytes(int(8)));
  if (pick < 0.9) return frameBytes(FrameType.PRIORITY, 0, stream(), bytes(rnd() < 0.9 ? 5 : int(8)));
  if (pick < 0.93) return frameBytes(FrameType.GOAWAY, 0, rnd() < 0.9 ? 0 : 1, Buffer.concat([u32(int(10)), u32(int(14)), bytes(int(10))]));
  if (pick < 0.94) return frameBytes(FrameType.PUSH_PROMISE, Flag.END_HEADERS, 1, Buffer.concat([u32(2), RESPONSE]));
  return frameBytes(10 + int(240), int(256), stream(), bytes(int(20)));
}

/**
 * One frame a conforming peer might send (the floods of issue 31 among them): streams it may use,
 * HEADERS with END_HEADERS or followed by CONTINUATIONs, PINGs of 8 octets, and so on.
 */
function validUnit(rnd: () => number, role: Role, st: { next: number }): Buffer {
  const int = (n: number): number => Math.floor(rnd() * n);
  const u32 = (v: number): Buffer => {
    const b = Buffer.alloc(4);
    b.writeUInt32BE(v >>> 0);
    return b;
  };
  // A server's streams are the client's requests 1, 3, 5; a client's, the ones it opened.
  const open = (): number => (role === 'server' ? Math.max(1, st.next - 2 * (1 + int(3))) : 1 + 2 * int(3));
  const pick = rnd();
  if (pick < 0.15) {
    let id = open();
    if (role === 'server') {
      id = st.next;
      st.next += 2;
    } else if (role === 'prober' && rnd() < 0.3) {
      id = 2 + 2 * int(100); // server-opened: ignored by the prober
    }
    const block = role === 'server' ? REQUEST : rnd() < 0.5 ? RESPONSE : TRAILERS;
    const end = rnd() < 0.5 ? Flag.END_STREAM : 0;
    if (rnd() < 0.8) return frameBytes(FrameType.HEADERS, Flag.END_HEADERS | end, id, block);
    const parts = [frameBytes(FrameType.HEADERS, end, id, block.subarray(0, 2))];
    for (let i = 0, n = rnd() < 0.9 ? int(8) : int(40); i < n; i++) parts.push(frameBytes(FrameType.CONTINUATION, 0, id, Buffer.alloc(0)));
    parts.push(frameBytes(FrameType.CONTINUATION, Flag.END_HEADERS, id, block.subarray(2)));
    return Buffer.concat(parts);
  }
  if (pick < 0.45) return frameBytes(FrameType.DATA, rnd() < 0.1 ? Flag.END_STREAM : 0, open(), Buffer.alloc(rnd() < 0.5 ? 0 : int(300)));
  if (pick < 0.55) return frameBytes(FrameType.PING, rnd() < 0.2 ? Flag.ACK : 0, 0, Buffer.alloc(8));
  if (pick < 0.62) return frameBytes(FrameType.SETTINGS, rnd() < 0.5 ? Flag.ACK : 0, 0);
  if (pick < 0.72) return frameBytes(FrameType.WINDOW_UPDATE, 0, rnd() < 0.5 ? 0 : open(), u32(1 + int(1000)));
  if (pick < 0.8) return frameBytes(FrameType.RST_STREAM, 0, role === 'server' ? open() : 1 + 2 * int(3), u32(H2Error.CANCEL));
  if (pick < 0.9) return frameBytes(FrameType.PRIORITY, 0, 1 + 2 * int(50), Buffer.from([0, 0, 0, 0, 16]));
  return frameBytes(0xf0, 0, 0, Buffer.alloc(int(16)));
}

interface Outcome {
  closed: boolean;
  /** A close for a reason other than a protocol error or the socket's. */
  unexpected: string | undefined;
  /** Why it closed before the peer ended (a protocol error's message), if it did. */
  reason: string | undefined;
  maxStreams: number;
  maxQueued: number;
  frames: number;
}

/** Runs one seeded sequence against a connection of `role`. */
async function runSequence(seed: number, role: Role): Promise<Outcome> {
  const rnd = mulberry32(seed);
  const [ours, peer] = duplexPair();
  peer.on('data', () => {}); // a peer that reads everything
  peer.on('error', () => {});
  const conn = new H2Connection(ours, {
    role: role === 'server' ? 'server' : 'client', settings: { maxConcurrentStreams: 50, maxHeaderListSize: 16_384 }, connectionWindow: 1 << 20,
    ...(role === 'prober' ? { ignoreIdleStreams: true } : {}),
  });
  let closed = false;
  let unexpected: string | undefined;
  let reason: string | undefined;
  const answer = (id: number): void => {
    conn.headers(id, RESPONSE, false);
    conn.data(id, Buffer.alloc(100), false);
    conn.headers(id, TRAILERS, true);
  };
  conn.start({
    headers: (id, _fields, endStream, opened) => {
      if (opened && endStream) answer(id);
    },
    data: (id, f, _payload, endStream) => {
      conn.consumed(f.payload.length, id);
      if (endStream && role === 'server') answer(id);
    },
    reset: () => {},
    goaway: () => {},
    closed: (err) => {
      closed = true;
      reason = err?.message;
      // Whatever closed it is named as a protocol error or the socket's; nothing else escapes.
      if (err !== undefined && !(err instanceof H2ConnectionError) && !(err as { code?: string }).code) unexpected = err.stack;
      if (err instanceof H2ConnectionError && /unexpected/.test(err.message)) unexpected = err.message;
    },
  });
  if (role !== 'server') for (let i = 0; i < 3; i++) conn.data(conn.request(REQUEST, false), Buffer.alloc(50), true);
  const units: Buffer[] = [];
  if (role === 'server' && rnd() < 0.97) units.push(CLIENT_PREFACE);
  if (rnd() < 0.9) units.push(frameBytes(FrameType.SETTINGS, 0, 0));
  // Mostly short; some long enough to spend the no-progress budget.
  const n = rnd() < 0.2 ? 1500 + Math.floor(rnd() * 2000) : 1 + Math.floor(rnd() * 120);
  // Garbage in some sequences; the others conform, with now and then one bad frame.
  const chaos = rnd() < 0.3 ? 0.5 : 0.002;
  const st = { next: 1 };
  if (role === 'server' && chaos < 0.5) {
    units.push(frameBytes(FrameType.HEADERS, Flag.END_HEADERS, 1, REQUEST));
    st.next = 3;
  }
  for (let i = 0; i < n; i++) units.push(rnd() < chaos ? randomUnit(rnd, role) : validUnit(rnd, role, st));
  const all = Buffer.concat(units);
  let maxStreams = 0;
  let maxQueued = 0;
  for (let pos = 0; pos < all.length && !closed;) {
    const len = 1 + Math.floor(rnd() * (rnd() < 0.5 ? 64 : 8192));
    peer.write(all.subarray(pos, pos + len));
    pos += len;
    if (rnd() < 0.3) await new Promise((r) => setImmediate(r));
    maxStreams = Math.max(maxStreams, conn.streamCount);
    maxQueued = Math.max(maxQueued, conn.queuedData);
  }
  peer.end();
  for (let i = 0; i < 200 && !closed; i++) await new Promise((r) => setTimeout(r, 5));
  const wasClosed = closed;
  conn.destroy();
  peer.destroy();
  return { closed: wasClosed, unexpected, reason, maxStreams, maxQueued, frames: n };
}

const ONLY = process.env.SEED === undefined ? undefined : Number(process.env.SEED);
const SEEDS = ONLY === undefined ? 300 : 1;

describe('the connection core under random frame sequences', () => {
  for (const role of ['client', 'prober', 'server'] as const) {
    it(`${role}: ${SEEDS} seeded sequences: no throw escapes, each ends closed, streams and queues bounded, heap bounded`, async () => {
      const heap0 = process.memoryUsage().heapUsed;
      let peak = heap0;
      const reasons = new Map<string, number>();
      /** Sequences read to their end, or to a budget: not cut short by a plain protocol error. */
      let lived = 0;
      for (let k = 0; k < SEEDS; k++) {
        const seed = ONLY ?? 1000 * (['client', 'prober', 'server'].indexOf(role) + 1) + k;
        const o = await runSequence(seed, role);
        expect(o.closed, `seed ${seed}: the connection closed once the peer ended`).toBe(true);
        expect(o.unexpected, `seed ${seed}: an error that is not a protocol error`).toBeUndefined();
        // Ours: 3 requests; the peer's: our SETTINGS_MAX_CONCURRENT_STREAMS (50).
        expect(o.maxStreams, `seed ${seed}: open streams`).toBeLessThanOrEqual(53);
        expect(o.maxQueued, `seed ${seed}: queued DATA`).toBeLessThanOrEqual(53 * 100);
        peak = Math.max(peak, process.memoryUsage().heapUsed);
        const r = (o.reason ?? 'the peer ended').replace(/\d+/g, 'N').slice(0, 60);
        reasons.set(r, (reasons.get(r) ?? 0) + 1);
        if (o.reason === undefined || /without progress|CONTINUATION frames/.test(o.reason)) lived++;
      }
      if (process.env.H2_PROPERTY_STATS) console.log(role, lived, [...reasons].sort((a, b) => b[1] - a[1]));
      // The sequences reach the budgets and carry streams, not only early protocol errors.
      expect([...reasons.keys()].some((r) => /without progress|CONTINUATION frames/.test(r)), 'some sequence spent a budget').toBe(true);
      expect(lived, 'sequences read to their end or to a budget').toBeGreaterThan(SEEDS / 4);
      expect(peak - heap0, 'heap growth over all sequences').toBeLessThan(96 * 1024 * 1024);
    }, 120_000);
  }

  it('the splitter and the joiner on their own throw only H2InputError on random octets', () => {
    for (let k = 0; k < 500; k++) {
      const rnd = mulberry32(9000 + k);
      const units: Buffer[] = [];
      for (let i = 0, n = 1 + Math.floor(rnd() * 200); i < n; i++) units.push(randomUnit(rnd, rnd() < 0.5 ? 'server' : 'client'));
      const split = new FrameSplitter(false);
      const join = new HeaderBlockJoiner(16 * 1024);
      try {
        split.push(Buffer.concat(units));
        for (let f = split.next(); f !== null; f = split.next()) join.take(f);
      } catch (err) {
        expect(err, `seed ${9000 + k}`).toBeInstanceOf(H2InputError);
      }
    }
  });
});
