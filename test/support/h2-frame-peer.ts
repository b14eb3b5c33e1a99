/**
 * A scripted HTTP/2 endpoint on a raw socket, for black-box tests of the shim's frame relay
 * (agent/shim/relay.ts): a kubelet stand-in (client role) and a containerd stand-in (server role)
 * whose every frame a test chooses, and which record and check every frame they receive.
 *
 * Frames, flow control and the trace are this file's own (nothing from agent/http2/ but HPACK's
 * decoder and static table), so that the tests do not change with the relay's HTTP/2 code. The
 * peer is a correct HTTP/2 endpoint as far as the tests need one:
 *  - it sends DATA only within the windows the other side granted (SETTINGS_INITIAL_WINDOW_SIZE,
 *    WINDOW_UPDATE) and in frames no larger than its SETTINGS_MAX_FRAME_SIZE, queueing the rest;
 *  - it ACKs SETTINGS (applying them first) and PINGs;
 *  - its header blocks are HPACK with incremental indexing (as grpc-go's encoder writes them), so a
 *    relay that passes a block to the wrong decoder, or drops one, shows as a decoding error.
 *
 * What it checks in what it receives (each breach is a `violation`, with the frame that made it):
 *  - DATA within the windows this peer granted, in frames within its own SETTINGS_MAX_FRAME_SIZE
 *    (a lowered value counts only once the other side has ACKed it);
 *  - no frame on a stream the other side already ended (DATA/HEADERS after its END_STREAM) or reset,
 *    no DATA/HEADERS on a stream this peer never opened or was never told of;
 *  - no frame other than PRIORITY on a stream this peer reset or fully closed, once a PING sent
 *    after that (a barrier) has been answered: whatever was in flight has arrived by then;
 *  - header blocks that decode, CONTINUATION where it belongs;
 *  - PING ACKs only for PINGs this peer sent, each once.
 */
import * as net from 'node:net';
import { HpackDecoder, STATIC_TABLE, writeInteger, writeRawString, type HeaderField } from '../../agent/http2/hpack.ts';

export const T = { DATA: 0, HEADERS: 1, PRIORITY: 2, RST_STREAM: 3, SETTINGS: 4, PUSH_PROMISE: 5, PING: 6, GOAWAY: 7, WINDOW_UPDATE: 8, CONTINUATION: 9 } as const;
export const FL = { END_STREAM: 0x1, ACK: 0x1, END_HEADERS: 0x4, PADDED: 0x8, PRIORITY: 0x20 } as const;
export const SET = { HEADER_TABLE_SIZE: 1, ENABLE_PUSH: 2, MAX_CONCURRENT_STREAMS: 3, INITIAL_WINDOW_SIZE: 4, MAX_FRAME_SIZE: 5, MAX_HEADER_LIST_SIZE: 6 } as const;
export const ERR = { NO_ERROR: 0, PROTOCOL_ERROR: 1, INTERNAL_ERROR: 2, FLOW_CONTROL_ERROR: 3, STREAM_CLOSED: 5, FRAME_SIZE_ERROR: 6, REFUSED_STREAM: 7, CANCEL: 8, COMPRESSION_ERROR: 9, ENHANCE_YOUR_CALM: 11 } as const;
export const PREFACE = Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n', 'latin1');
export const DEFAULT_WINDOW = 65_535;
export const DEFAULT_MAX_FRAME = 16_384;

const TYPE_NAMES = ['DATA', 'HEADERS', 'PRIORITY', 'RST_STREAM', 'SETTINGS', 'PUSH_PROMISE', 'PING', 'GOAWAY', 'WINDOW_UPDATE', 'CONTINUATION'];

export function encodeFrame(type: number, flags: number, streamId: number, payload: Buffer = Buffer.alloc(0)): Buffer {
  const h = Buffer.alloc(9);
  h.writeUIntBE(payload.length, 0, 3);
  h[3] = type;
  h[4] = flags;
  h.writeUInt32BE(streamId >>> 0 & 0x7fffffff, 5);
  return Buffer.concat([h, payload]);
}

export function settingsPayload(values: ReadonlyArray<readonly [number, number]>): Buffer {
  const p = Buffer.alloc(values.length * 6);
  values.forEach(([id, v], i) => {
    p.writeUInt16BE(id, i * 6);
    p.writeUInt32BE(v >>> 0, i * 6 + 2);
  });
  return p;
}

export function parseSettings(payload: Buffer): Array<[number, number]> {
  const out: Array<[number, number]> = [];
  for (let i = 0; i + 6 <= payload.length; i += 6) out.push([payload.readUInt16BE(i), payload.readUInt32BE(i + 2)]);
  return out;
}

function u32(n: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n >>> 0, 0);
  return b;
}

/** One received frame (payload as sent, padding included). */
export interface RecvFrame {
  seq: number;
  type: number;
  flags: number;
  streamId: number;
  payload: Buffer;
}

/** A shared, time-stamped log of both peers' frames, printed when a test fails. */
export class Trace {
  readonly #t0 = performance.now();
  readonly lines: string[] = [];
  readonly #max: number;

  constructor(max = 4000) {
    this.#max = max;
  }

  log(line: string): void {
    this.lines.push(`${(performance.now() - this.#t0).toFixed(1).padStart(8)}ms ${line}`);
    if (this.lines.length > this.#max) this.lines.splice(0, this.lines.length - this.#max);
  }

  tail(n = 150): string {
    return this.lines.slice(-n).join('\n');
  }
}

/** A one-line description of a frame for the trace. */
export function describeFrame(type: number, flags: number, streamId: number, payload: Buffer): string {
  const name = TYPE_NAMES[type] ?? `TYPE${type}`;
  const fl: string[] = [];
  if (type === T.DATA || type === T.HEADERS) {
    if (flags & FL.END_STREAM) fl.push('END_STREAM');
  }
  if (type === T.HEADERS || type === T.CONTINUATION) {
    if (flags & FL.END_HEADERS) fl.push('END_HEADERS');
  }
  if ((type === T.SETTINGS || type === T.PING) && flags & FL.ACK) fl.push('ACK');
  if ((type === T.DATA || type === T.HEADERS) && flags & FL.PADDED) fl.push('PADDED');
  if (type === T.HEADERS && flags & FL.PRIORITY) fl.push('PRIORITY');
  let detail = '';
  switch (type) {
    case T.DATA:
    case T.HEADERS:
    case T.CONTINUATION:
      detail = ` len=${payload.length}`;
      break;
    case T.SETTINGS:
      detail = ` ${parseSettings(payload).map(([id, v]) => `${id}=${v}`).join(',')}`;
      break;
    case T.PING:
      detail = ` ${payload.toString('hex')}`;
      break;
    case T.WINDOW_UPDATE:
    case T.RST_STREAM:
      detail = payload.length === 4 ? ` ${payload.readUInt32BE(0) & (type === T.WINDOW_UPDATE ? 0x7fffffff : 0xffffffff)}` : ` bad-length=${payload.length}`;
      break;
    case T.GOAWAY:
      detail = payload.length >= 8 ? ` last=${payload.readUInt32BE(0) & 0x7fffffff} code=${payload.readUInt32BE(4)} ${JSON.stringify(payload.subarray(8).toString('latin1'))}` : ' short';
      break;
    case T.PRIORITY:
      detail = payload.length === 5 ? ` dep=${payload.readUInt32BE(0) & 0x7fffffff}${payload[0]! & 0x80 ? ' excl' : ''} w=${payload[4]}` : ` bad-length=${payload.length}`;
      break;
    default:
      break;
  }
  return `${name} s=${streamId}${fl.length ? ` [${fl.join(',')}]` : ''}${detail}`;
}

/**
 * An HPACK encoder that indexes every field (literal with incremental indexing, then indexed
 * representations for repeats), as grpc-go and nghttp2 do for request headers, within 4096 octets
 * or the peer's SETTINGS_HEADER_TABLE_SIZE, announced by a size update as grpc-go's encoder does.
 */
export class IndexingEncoder {
  /** Newest first. */
  readonly #table: Array<[string, string]> = [];
  #size = 0;
  #max = 4096;
  #update = -1;

  /** The peer's SETTINGS_HEADER_TABLE_SIZE: the next block opens with a size update. */
  setMaxSize(max: number): void {
    this.#max = Math.min(max, 4096);
    this.#update = this.#max;
    this.#evict();
  }

  #evict(): void {
    while (this.#size > this.#max) {
      const [n, v] = this.#table.pop()!;
      this.#size -= n.length + v.length + 32;
    }
  }

  encode(fields: readonly HeaderField[]): Buffer {
    const out: number[] = [];
    if (this.#update >= 0) {
      writeInteger(out, this.#update, 5, 0x20);
      this.#update = -1;
    }
    for (const f of fields) {
      const staticFull = STATIC_TABLE.findIndex(([n, v]) => n === f.name && v === f.value);
      if (staticFull >= 0) {
        writeInteger(out, staticFull + 1, 7, 0x80);
        continue;
      }
      const dyn = this.#table.findIndex(([n, v]) => n === f.name && v === f.value);
      if (dyn >= 0) {
        writeInteger(out, STATIC_TABLE.length + 1 + dyn, 7, 0x80);
        continue;
      }
      const entry = f.name.length + f.value.length + 32;
      const staticName = STATIC_TABLE.findIndex(([n]) => n === f.name);
      if (entry > this.#max) {
        // Too large to index: literal without indexing.
        if (staticName >= 0) writeInteger(out, staticName + 1, 4, 0);
        else {
          out.push(0);
          writeRawString(out, f.name);
        }
        writeRawString(out, f.value);
        continue;
      }
      if (staticName >= 0) writeInteger(out, staticName + 1, 6, 0x40);
      else {
        out.push(0x40);
        writeRawString(out, f.name);
      }
      writeRawString(out, f.value);
      this.#table.unshift([f.name, f.value]);
      this.#size += entry;
      this.#evict();
    }
    return Buffer.from(out);
  }
}

/** One stream as one peer sees it. */
export interface PeerStream {
  id: number;
  /** Header blocks received, decoded, in order. */
  blocks: HeaderField[][];
  /** DATA payloads received (padding removed). */
  data: Buffer[];
  dataLength: number;
  /** The other side ended its half / reset the stream (the code). */
  recvEnd: boolean;
  recvRst: number | undefined;
  /** This peer ended its half / reset the stream. */
  sentEnd: boolean;
  sentRst: number | undefined;
  /** The PING counter when this peer reset or fully closed the stream (barrier rule). */
  closedAtPing: number | undefined;
  /** Flow-controlled octets received, and the credit this peer gave on top of the initial window. */
  recvUsed: number;
  recvCredit: number;
  /** Credit this peer has yet to return for this stream (auto-credit). */
  recvUnreturned: number;
  /** DATA payload octets this peer sent on it. */
  sentData: number;
  /** The other side's credit for this peer's sends on top of its initial window, minus what was sent. */
  sendDelta: number;
  /** DATA waiting for window, then header frames (trailers) to follow it. */
  queue: Array<{ data: Buffer; end: boolean }>;
  queued: number;
  trailers: { fields: HeaderField[]; } | undefined;
  /** Every frame received on it. */
  frames: RecvFrame[];
}

export type CreditPolicy = 'eager' | 'half' | 'manual';

export interface PeerOptions {
  role: 'client' | 'server';
  /** Four ASCII letters: the first octets of every PING payload this peer sends (KUBE, RUNT). */
  tag: string;
  trace: Trace;
  /** The SETTINGS of this peer's preface. */
  settings?: ReadonlyArray<readonly [number, number]>;
  /** When to give credit back for DATA received. */
  credit?: CreditPolicy;
  /** Answer PINGs (default true). */
  autoPingAck?: boolean;
  /** ACK the other side's SETTINGS (default true; false: this peer writes nothing unasked). */
  autoSettingsAck?: boolean;
}

type Waiter = { check: () => boolean; resolve: () => void };

/** A scripted HTTP/2 endpoint on one socket. */
export class FramePeer {
  readonly socket: net.Socket;
  readonly role: 'client' | 'server';
  readonly tag: string;
  readonly trace: Trace;
  readonly name: string;
  readonly violations: string[] = [];
  /** Every frame received, in order. */
  readonly frames: RecvFrame[] = [];
  readonly streams = new Map<number, PeerStream>();
  credit: CreditPolicy;
  autoPingAck: boolean;
  autoSettingsAck: boolean;
  /** Counters (flow-controlled DATA octets) for bounds on what a relay holds. */
  dataSent = 0;
  dataRecv = 0;
  /** GOAWAY received / sent. */
  goawayRecv: { last: number; code: number; debug: string } | undefined;
  goawaySent: { last: number; code: number } | undefined;
  closed = false;
  /** Set when the socket ended or errored; why, and when (performance.now()). */
  closeReason = '';
  closedAt = Infinity;
  readonly #encoder = new IndexingEncoder();
  readonly #decoder = new HpackDecoder({ maxTableSize: 4096, maxHeaderListSize: 1 << 20 });
  #buf: Buffer = Buffer.alloc(0);
  #prefaceLeft: number;
  #seq = 0;
  /** A header block being received: its stream, frames, fragments. */
  #block: { streamId: number; flags: number; fragments: Buffer[] } | null = null;
  #nextId: number;
  /** Highest stream id the other side opened (server role). */
  lastPeerStream = 0;
  // Settings this peer sent and the other side has not ACKed yet; the values in force once ACKed.
  readonly #pendingSettings: Array<Array<[number, number]>> = [];
  #ackedInitialWindow = DEFAULT_WINDOW;
  #ackedMaxFrame = DEFAULT_MAX_FRAME;
  settingsAcked = 0;
  settingsRecv: Array<Array<[number, number]>> = [];
  // The other side's settings, as this peer applies them.
  peerInitialWindow = DEFAULT_WINDOW;
  peerMaxFrame = DEFAULT_MAX_FRAME;
  #sendConn = DEFAULT_WINDOW;
  #recvConnUsed = 0;
  #recvConnCredit = 0;
  #recvConnUnreturned = 0;
  // PINGs: sent (payload hex → counter), answered; the highest counter answered.
  #pingCounter = 0;
  readonly #pingsOut = new Map<string, number>();
  pingAckedUpTo = 0;
  readonly pingsRecv: Buffer[] = [];
  readonly #waiters = new Set<Waiter>();
  /** Called for each complete header block received (server role: requests; client role: responses). */
  onBlock: ((s: PeerStream, fields: HeaderField[], endStream: boolean) => void) | undefined;
  /** Called when the other side ends its half of a stream (END_STREAM), after onBlock for a HEADERS. */
  onEnd: ((s: PeerStream) => void) | undefined;
  onFrame: ((f: RecvFrame) => void) | undefined;

  constructor(socket: net.Socket, opts: PeerOptions) {
    this.socket = socket;
    this.role = opts.role;
    this.tag = opts.tag;
    this.trace = opts.trace;
    this.name = opts.tag;
    this.credit = opts.credit ?? 'eager';
    this.autoPingAck = opts.autoPingAck ?? true;
    this.autoSettingsAck = opts.autoSettingsAck ?? true;
    this.#nextId = opts.role === 'client' ? 1 : 2;
    this.#prefaceLeft = opts.role === 'server' ? PREFACE.length : 0;
    socket.on('data', (c: Buffer) => this.#onData(c));
    socket.on('error', (err) => this.#onClose(`error: ${err.message}`));
    socket.on('end', () => this.#onClose('end'));
    socket.on('close', () => this.#onClose('close'));
    const settings = opts.settings ?? [];
    if (opts.role === 'client') this.#writeRaw(PREFACE);
    this.settings(settings);
  }

  // ---- waiting ----

  /** Resolves when `check()` holds (re-checked after every frame and on close); rejects after `ms`. */
  waitFor(check: () => boolean, ms: number, what: string): Promise<void> {
    if (check()) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const w: Waiter = { check, resolve: () => {
        clearTimeout(timer);
        resolve();
      } };
      const timer = setTimeout(() => {
        this.#waiters.delete(w);
        reject(new Error(`${this.name}: timed out after ${ms} ms waiting for ${what}`));
      }, ms);
      this.#waiters.add(w);
    });
  }

  #wake(): void {
    for (const w of [...this.#waiters]) {
      if (w.check()) {
        this.#waiters.delete(w);
        w.resolve();
      }
    }
  }

  /** Re-checks every waiter (for conditions that depend on more than this peer's frames). */
  poke(): void {
    this.#wake();
  }

  // ---- sending ----

  #writeRaw(b: Buffer): void {
    if (this.closed || this.socket.destroyed) return;
    this.socket.write(b);
  }

  #send(type: number, flags: number, streamId: number, payload: Buffer = Buffer.alloc(0)): void {
    if (this.closed || this.socket.destroyed) return;
    this.trace.log(`${this.name}> ${describeFrame(type, flags, streamId, payload)}`);
    this.socket.write(encodeFrame(type, flags, streamId, payload));
  }

  /** Writes a frame exactly as given, bypassing every rule (for malformed input). */
  sendRawFrame(type: number, flags: number, streamId: number, payload: Buffer = Buffer.alloc(0)): void {
    this.#send(type, flags, streamId, payload);
  }

  stream(id: number): PeerStream {
    let s = this.streams.get(id);
    if (!s) {
      s = {
        id, blocks: [], data: [], dataLength: 0, recvEnd: false, recvRst: undefined, sentEnd: false, sentRst: undefined, closedAtPing: undefined,
        recvUsed: 0, recvCredit: 0, recvUnreturned: 0, sentData: 0, sendDelta: 0, queue: [], queued: 0, trailers: undefined, frames: [],
      };
      this.streams.set(id, s);
    }
    return s;
  }

  /** The next stream id this peer would open. */
  get nextStreamId(): number {
    return this.#nextId;
  }

  /** Opens a stream with a request (client) header block; returns its id. */
  open(fields: readonly HeaderField[], endStream = false, priority?: { dep: number; weight: number; exclusive: boolean }): number {
    const id = this.#nextId;
    this.#nextId += 2;
    this.stream(id);
    this.headers(id, fields, endStream, priority);
    return id;
  }

  /** Sends a header block on a stream (HEADERS + CONTINUATION within the other side's frame size). */
  headers(id: number, fields: readonly HeaderField[], endStream: boolean, priority?: { dep: number; weight: number; exclusive: boolean }): void {
    const s = this.stream(id);
    const block = this.#encoder.encode(fields);
    const prio = priority ? Buffer.concat([u32((priority.dep & 0x7fffffff) | (priority.exclusive ? 0x80000000 : 0)), Buffer.from([priority.weight])]) : Buffer.alloc(0);
    const room = this.peerMaxFrame - prio.length;
    let pos = Math.min(room, block.length);
    const out: Buffer[] = [];
    const flags = (endStream ? FL.END_STREAM : 0) | (priority ? FL.PRIORITY : 0) | (pos === block.length ? FL.END_HEADERS : 0);
    const first = Buffer.concat([prio, block.subarray(0, pos)]);
    this.trace.log(`${this.name}> ${describeFrame(T.HEADERS, flags, id, first)} ${summarize(fields)}`);
    out.push(encodeFrame(T.HEADERS, flags, id, first));
    while (pos < block.length) {
      const end = Math.min(pos + this.peerMaxFrame, block.length);
      const cf = end === block.length ? FL.END_HEADERS : 0;
      this.trace.log(`${this.name}> ${describeFrame(T.CONTINUATION, cf, id, block.subarray(pos, end))}`);
      out.push(encodeFrame(T.CONTINUATION, cf, id, block.subarray(pos, end)));
      pos = end;
    }
    if (endStream) this.#sentEnd(s);
    this.#writeRaw(Buffer.concat(out));
  }

  /** Queues DATA on a stream; it goes out within the other side's windows. */
  data(id: number, data: Buffer, end: boolean): void {
    const s = this.stream(id);
    s.queue.push({ data, end });
    s.queued += data.length;
    this.pump();
  }

  /** Queues trailers after the stream's queued DATA. */
  trailers(id: number, fields: HeaderField[]): void {
    const s = this.stream(id);
    s.trailers = { fields };
    this.pump();
  }

  /** Sends what the windows allow of every stream's queue. */
  pump(): void {
    if (this.closed) return;
    for (const s of this.streams.values()) {
      if (s.sentRst !== undefined) continue;
      while (s.queue.length > 0) {
        const head = s.queue[0]!;
        const room = Math.min(this.#sendConn, this.peerInitialWindow + s.sendDelta, this.peerMaxFrame);
        if (head.data.length > 0 && room <= 0) break;
        const take = Math.max(0, Math.min(room, head.data.length));
        const chunk = head.data.subarray(0, take);
        const last = take === head.data.length;
        if (last) s.queue.shift();
        else head.data = head.data.subarray(take);
        s.queued -= take;
        this.#sendConn -= take;
        s.sendDelta -= take;
        this.dataSent += take;
        s.sentData += take;
        const end = last && head.end && s.trailers === undefined;
        this.#send(T.DATA, end ? FL.END_STREAM : 0, s.id, chunk);
        if (end) this.#sentEnd(s);
      }
      if (s.queue.length === 0 && s.trailers !== undefined) {
        const t = s.trailers;
        s.trailers = undefined;
        this.headers(s.id, t.fields, true);
      }
    }
  }

  /** Octets queued (waiting for window) over all streams. */
  get queued(): number {
    let n = 0;
    for (const s of this.streams.values()) if (s.sentRst === undefined) n += s.queued;
    return n;
  }

  /** This peer's view of the other side's window for its sends on a stream. */
  sendWindowOf(id: number): number {
    return this.peerInitialWindow + this.stream(id).sendDelta;
  }

  /** This peer's view of the other side's connection window for its sends. */
  get sendWindow(): number {
    return this.#sendConn;
  }

  #sentEnd(s: PeerStream): void {
    s.sentEnd = true;
    if (s.recvEnd && s.closedAtPing === undefined) s.closedAtPing = this.#pingCounter;
  }

  rst(id: number, code: number): void {
    const s = this.stream(id);
    if (s.sentRst !== undefined) return;
    s.sentRst = code;
    if (s.closedAtPing === undefined) s.closedAtPing = this.#pingCounter;
    s.queue = [];
    s.queued = 0;
    s.trailers = undefined;
    this.#send(T.RST_STREAM, 0, id, u32(code));
  }

  settings(values: ReadonlyArray<readonly [number, number]>): void {
    this.#pendingSettings.push(values.map(([a, b]) => [a, b] as [number, number]));
    this.#send(T.SETTINGS, 0, 0, settingsPayload(values));
  }

  /** WINDOW_UPDATE: credit for the other side's sends (counted in this peer's receive bounds). */
  windowUpdate(id: number, increment: number): void {
    if (id === 0) this.#recvConnCredit += increment;
    else this.stream(id).recvCredit += increment;
    this.#send(T.WINDOW_UPDATE, 0, id, u32(increment));
  }

  /** PING with this peer's tag and a counter; resolves (true) on its ACK, false if the connection closes first. */
  ping(ms = 5000): Promise<boolean> {
    const n = ++this.#pingCounter;
    const payload = Buffer.alloc(8);
    payload.write(this.tag.slice(0, 4), 0, 'latin1');
    payload.writeUInt32BE(n, 4);
    this.#pingsOut.set(payload.toString('hex'), n);
    this.#send(T.PING, 0, 0, payload);
    return this.waitFor(() => this.pingAckedUpTo >= n || this.closed, ms, `the ACK of PING ${payload.toString('hex')}`).then(() => this.pingAckedUpTo >= n);
  }

  /** PINGs this peer has sent. */
  get pingsSent(): number {
    return this.#pingCounter;
  }

  /** The payload of this peer's n-th PING. */
  pingPayload(n: number): Buffer {
    const payload = Buffer.alloc(8);
    payload.write(this.tag.slice(0, 4), 0, 'latin1');
    payload.writeUInt32BE(n, 4);
    return payload;
  }

  goaway(last: number, code: number, debug: string): void {
    this.goawaySent = { last, code };
    this.#send(T.GOAWAY, 0, 0, Buffer.concat([u32(last), u32(code), Buffer.from(debug, 'latin1')]));
  }

  priority(id: number, dep: number, weight: number, exclusive: boolean): void {
    this.#send(T.PRIORITY, 0, id, Buffer.concat([u32((dep & 0x7fffffff) | (exclusive ? 0x80000000 : 0)), Buffer.from([weight])]));
  }

  /** Gives back all credit not returned yet (connection and streams). */
  returnCredit(): void {
    if (this.#recvConnUnreturned > 0) {
      const n = this.#recvConnUnreturned;
      this.#recvConnUnreturned = 0;
      this.windowUpdate(0, n);
    }
    for (const s of this.streams.values()) {
      if (s.recvUnreturned > 0 && !s.recvEnd && s.recvRst === undefined && s.sentRst === undefined) {
        const n = s.recvUnreturned;
        s.recvUnreturned = 0;
        this.windowUpdate(s.id, n);
      }
    }
  }

  close(): void {
    this.socket.destroy();
  }

  // ---- receiving ----

  #violation(msg: string): void {
    const line = `${this.name} VIOLATION: ${msg}`;
    this.violations.push(line);
    this.trace.log(line);
  }

  #onClose(why: string): void {
    if (this.closed) return;
    this.closed = true;
    this.closeReason = why;
    this.closedAt = performance.now();
    this.trace.log(`${this.name} socket ${why}`);
    if (!this.socket.destroyed) this.socket.destroy();
    this.#wake();
  }

  /** The largest initial window / frame size the other side may be using now (a lowered value counts once ACKed). */
  get #recvInitialBound(): number {
    let v = this.#ackedInitialWindow;
    for (const p of this.#pendingSettings) for (const [id, x] of p) if (id === SET.INITIAL_WINDOW_SIZE) v = Math.max(v, x);
    return v;
  }

  get #recvMaxFrameBound(): number {
    let v = this.#ackedMaxFrame;
    for (const p of this.#pendingSettings) for (const [id, x] of p) if (id === SET.MAX_FRAME_SIZE) v = Math.max(v, x);
    return v;
  }

  #onData(chunk: Buffer): void {
    if (this.closed) return;
    this.#buf = this.#buf.length === 0 ? chunk : Buffer.concat([this.#buf, chunk]);
    if (this.#prefaceLeft > 0) {
      const n = Math.min(this.#prefaceLeft, this.#buf.length);
      const want = PREFACE.subarray(PREFACE.length - this.#prefaceLeft, PREFACE.length - this.#prefaceLeft + n);
      if (!this.#buf.subarray(0, n).equals(want)) {
        this.#violation('bad client preface');
        this.socket.destroy();
        return;
      }
      this.#prefaceLeft -= n;
      this.#buf = this.#buf.subarray(n);
    }
    while (this.#buf.length >= 9) {
      const len = this.#buf.readUIntBE(0, 3);
      if (this.#buf.length < 9 + len) break;
      const f: RecvFrame = {
        seq: ++this.#seq, type: this.#buf[3]!, flags: this.#buf[4]!, streamId: this.#buf.readUInt32BE(5) & 0x7fffffff,
        payload: Buffer.from(this.#buf.subarray(9, 9 + len)),
      };
      this.#buf = this.#buf.subarray(9 + len);
      this.frames.push(f);
      this.trace.log(`${this.name}< ${describeFrame(f.type, f.flags, f.streamId, f.payload)}`);
      if (len > this.#recvMaxFrameBound) this.#violation(`frame of ${len} octets beyond this peer's SETTINGS_MAX_FRAME_SIZE ${this.#recvMaxFrameBound}`);
      try {
        this.#frame(f);
      } catch (err) {
        this.#violation(`handling ${describeFrame(f.type, f.flags, f.streamId, f.payload)}: ${(err as Error).message}`);
      }
      this.onFrame?.(f);
    }
    if (this.credit !== 'manual') this.#autoCredit();
    this.pump();
    this.#wake();
  }

  #autoCredit(): void {
    const half = this.credit === 'half';
    if (this.#recvConnUnreturned > 0 && (!half || this.#recvConnUnreturned >= (DEFAULT_WINDOW + 1) / 2)) {
      const n = this.#recvConnUnreturned;
      this.#recvConnUnreturned = 0;
      this.windowUpdate(0, n);
    }
    for (const s of this.streams.values()) {
      if (s.recvUnreturned === 0 || s.recvEnd || s.recvRst !== undefined || s.sentRst !== undefined) continue;
      if (half && s.recvUnreturned < this.#recvInitialBound / 2) continue;
      const n = s.recvUnreturned;
      s.recvUnreturned = 0;
      this.windowUpdate(s.id, n);
    }
  }

  #frame(f: RecvFrame): void {
    if (this.#block !== null && f.type !== T.CONTINUATION) {
      this.#violation(`frame ${TYPE_NAMES[f.type] ?? f.type} inside the header block of stream ${this.#block.streamId}`);
    }
    if (f.streamId !== 0) this.#streamRules(f);
    switch (f.type) {
      case T.DATA:
        this.#dataFrame(f);
        return;
      case T.HEADERS: {
        if (f.streamId === 0) return this.#violation('HEADERS on stream 0');
        let frag = f.payload;
        if (f.flags & FL.PADDED) {
          const pad = frag[0] ?? 0;
          frag = frag.subarray(1, frag.length - pad);
        }
        if (f.flags & FL.PRIORITY) frag = frag.subarray(5);
        this.#block = { streamId: f.streamId, flags: f.flags, fragments: [frag] };
        if (f.flags & FL.END_HEADERS) this.#endBlock();
        return;
      }
      case T.CONTINUATION:
        if (this.#block === null || this.#block.streamId !== f.streamId) return this.#violation(`CONTINUATION on stream ${f.streamId} without an open block`);
        this.#block.fragments.push(f.payload);
        if (f.flags & FL.END_HEADERS) this.#endBlock();
        return;
      case T.RST_STREAM: {
        const s = this.stream(f.streamId);
        s.recvRst = f.payload.readUInt32BE(0);
        s.queue = [];
        s.queued = 0;
        s.trailers = undefined;
        return;
      }
      case T.SETTINGS:
        if (f.streamId !== 0) return this.#violation('SETTINGS on a stream');
        if (f.flags & FL.ACK) {
          const p = this.#pendingSettings.shift();
          if (!p) return this.#violation('SETTINGS ACK with no SETTINGS outstanding');
          this.settingsAcked++;
          for (const [id, v] of p) {
            if (id === SET.INITIAL_WINDOW_SIZE) this.#ackedInitialWindow = v;
            if (id === SET.MAX_FRAME_SIZE) this.#ackedMaxFrame = v;
          }
          return;
        }
        this.#applyPeerSettings(parseSettings(f.payload));
        if (this.autoSettingsAck) this.#send(T.SETTINGS, FL.ACK, 0);
        return;
      case T.PING: {
        if (f.flags & FL.ACK) {
          const key = f.payload.toString('hex');
          const n = this.#pingsOut.get(key);
          if (n === undefined) return this.#violation(`PING ACK ${key} for no PING this peer sent (or answered twice)`);
          this.#pingsOut.delete(key);
          // Frames received from now on are checked against streams closed before PING n (#streamRules).
          this.pingAckedUpTo = Math.max(this.pingAckedUpTo, n);
          return;
        }
        this.pingsRecv.push(f.payload);
        if (this.autoPingAck) this.#send(T.PING, FL.ACK, 0, f.payload);
        return;
      }
      case T.GOAWAY:
        this.goawayRecv = { last: f.payload.readUInt32BE(0) & 0x7fffffff, code: f.payload.readUInt32BE(4), debug: f.payload.subarray(8).toString('latin1') };
        return;
      case T.WINDOW_UPDATE: {
        const inc = f.payload.readUInt32BE(0) & 0x7fffffff;
        if (f.streamId === 0) this.#sendConn += inc;
        else this.stream(f.streamId).sendDelta += inc;
        return;
      }
      case T.PUSH_PROMISE:
        return this.#violation('PUSH_PROMISE');
      default:
        return;
    }
  }

  #applyPeerSettings(values: Array<[number, number]>): void {
    this.settingsRecv.push(values);
    for (const [id, v] of values) {
      if (id === SET.INITIAL_WINDOW_SIZE) this.peerInitialWindow = v;
      if (id === SET.MAX_FRAME_SIZE) this.peerMaxFrame = v;
      if (id === SET.HEADER_TABLE_SIZE) this.#encoder.setMaxSize(v);
    }
  }

  /** Frame-on-stream rules common to every stream frame. */
  #streamRules(f: RecvFrame): void {
    const known = this.streams.get(f.streamId);
    const mine = (f.streamId % 2 === 1) === (this.role === 'client');
    const what = describeFrame(f.type, f.flags, f.streamId, f.payload);
    if (!known) {
      if (mine && f.type !== T.PRIORITY) this.#violation(`${what} on a stream this peer never opened`);
      else if (!mine && f.type !== T.HEADERS && f.type !== T.PRIORITY) this.#violation(`${what} on an idle stream`);
    } else {
      if (known.recvRst !== undefined && f.type !== T.PRIORITY) this.#violation(`${what} after the other side reset the stream`);
      else if (known.recvEnd && (f.type === T.DATA || f.type === T.HEADERS)) this.#violation(`${what} after the other side's END_STREAM`);
      else if (known.closedAtPing !== undefined && this.pingAckedUpTo > known.closedAtPing && f.type !== T.PRIORITY) {
        this.#violation(`${what} on a stream this peer ${known.sentRst !== undefined ? 'reset' : 'closed'} before PING ${known.closedAtPing + 1}, which was answered before it`);
      }
    }
    if (!known && !mine && f.type === T.HEADERS) this.lastPeerStream = Math.max(this.lastPeerStream, f.streamId);
    this.stream(f.streamId).frames.push(f);
  }

  #dataFrame(f: RecvFrame): void {
    const len = f.payload.length;
    this.dataRecv += len;
    this.#recvConnUsed += len;
    if (this.#recvConnUsed > DEFAULT_WINDOW + this.#recvConnCredit) {
      this.#violation(`DATA s=${f.streamId} len=${len}: ${this.#recvConnUsed} octets received on the connection, beyond the ${DEFAULT_WINDOW + this.#recvConnCredit} this peer granted`);
    }
    this.#recvConnUnreturned += len;
    if (f.streamId === 0) return this.#violation('DATA on stream 0');
    const s = this.stream(f.streamId);
    s.recvUsed += len;
    const bound = this.#recvInitialBound + s.recvCredit;
    if (s.recvUsed > bound) this.#violation(`DATA s=${f.streamId} len=${len}: ${s.recvUsed} octets received on the stream, beyond the ${bound} this peer granted`);
    s.recvUnreturned += len;
    let payload = f.payload;
    if (f.flags & FL.PADDED) {
      const pad = payload[0] ?? 0;
      payload = payload.subarray(1, payload.length - pad);
    }
    s.data.push(payload);
    s.dataLength += payload.length;
    if (f.flags & FL.END_STREAM) this.#recvEnd(s);
  }

  #endBlock(): void {
    const b = this.#block!;
    this.#block = null;
    const s = this.stream(b.streamId);
    let fields: HeaderField[];
    try {
      fields = this.#decoder.decode(Buffer.concat(b.fragments));
    } catch (err) {
      this.#violation(`header block on stream ${b.streamId} does not decode: ${(err as Error).message}`);
      fields = [];
    }
    this.trace.log(`${this.name}  block s=${b.streamId} ${summarize(fields)}`);
    s.blocks.push(fields);
    const end = (b.flags & FL.END_STREAM) !== 0;
    this.onBlock?.(s, fields, end);
    if (end) this.#recvEnd(s);
  }

  #recvEnd(s: PeerStream): void {
    s.recvEnd = true;
    if (s.sentEnd && s.closedAtPing === undefined) s.closedAtPing = this.#pingCounter;
    this.onEnd?.(s);
  }
}

function summarize(fields: readonly HeaderField[]): string {
  return `{${fields.map((f) => `${f.name}: ${f.value.length > 40 ? `${f.value.slice(0, 40)}…(${f.value.length})` : f.value}`).join(', ')}}`;
}

/** A header's value, or undefined. */
export function field(fields: readonly HeaderField[], name: string): string | undefined {
  return fields.find((f) => f.name === name)?.value;
}

/** All header fields received on a stream, blocks joined. */
export function allFields(s: PeerStream): HeaderField[] {
  return s.blocks.flat();
}
