/**
 * One HTTP/2 connection endpoint: the only place the connection-level rules live. It reads the
 * preface and frames (bounded by the SETTINGS_MAX_FRAME_SIZE we advertise), validates and
 * acknowledges the peer's SETTINGS (RFC 9113 6.5.2), answers PING, keeps both connection windows
 * (the peer's, which our DATA waits for, and ours, refilled as the owner consumes, with the
 * stream's window for DATA the owner reads itself), joins
 * CONTINUATION frames, decodes header blocks with this connection's HPACK state, parses GOAWAY,
 * refuses streams beyond our SETTINGS_MAX_CONCURRENT_STREAMS and closes on protocol errors with
 * GOAWAY. Stream-level events go to the owner (`H2Handler`): the unary client and server, the
 * one-shot gRPC exchange and both sides of the shim's relay are owners of this one class.
 *
 * What we send is literal HPACK only (the peer's dynamic table is never touched, so our encoder
 * has no state), DATA within the peer's connection and stream windows (split to its frame size,
 * queued per stream otherwise, streams served round-robin), and header blocks in stream order
 * behind that stream's queued DATA. The window rules are flow-control.ts's; output is written by
 * writer.ts, once per turn of the event loop. A peer that does not read is bounded: DATA waits in
 * our queue (bounded by the windows the owner grants) while the writer is blocked, and a
 * connection whose unsent octets pass `maxBufferedOutput` anyway (control frames it provokes and
 * never reads) is cut.
 *
 * Reads come from agent/io/lean-socket.ts, as views of a buffer the next read reuses: a frame
 * handed to the owner is valid during that call only (an owner copies what it keeps), and what
 * outlives the read here (a partial frame, DATA waiting for a window) is copied.
 *
 * Every frame a peer sends costs bounded work (the CONTINUATION and empty-frame floods): a header
 * block takes at most `maxContinuations` CONTINUATION frames, and frames that move no stream
 * forward (PING, SETTINGS, empty DATA, RST_STREAM or WINDOW_UPDATE on closed streams, refused
 * HEADERS, informational 1xx heads, PRIORITY, unknown types...) spend a per-connection budget that
 * progress (a header block or DATA with octets on a live stream, each way) and time refill, and a
 * shared one when the owner gives it (the gRPC prober: the pod's, across its connections;
 * frame-budget.ts); a peer that spends either is closed with GOAWAY ENHANCE_YOUR_CALM. Stream ids
 * of ours stop at 2^31-1: `mayStart` turns false and the owner opens a new connection.
 */
import type { Duplex } from 'node:stream';
import { encodeLiteralBlock, HpackDecoder, HpackError, type HeaderField } from './hpack.ts';
import {
  CLIENT_PREFACE, dataPayload, DEFAULT_WINDOW, Flag, FRAME_HEADER, frameBytes, FrameType, goawayFrame, H2ConnectionError, H2Error, H2InputError, parseGoaway,
  rstStreamFrame, Setting, windowUpdateFrame, type Frame,
} from './wire.ts';
import { checkInitialWindowSize, FlowControl, type StreamWindows } from './flow-control.ts';
import { FrameWriter } from './writer.ts';
import { FrameBudgetError, SHARED_FREE_FRAMES, TokenBucket, type SharedFrameBudget } from './frame-budget.ts';
import { isInformationalBlock } from './informational.ts';
import { channelOf, isTransient, keep, type ByteChannel } from '../io/lean-socket.ts';

export { H2ConnectionError } from './wire.ts';

/** SETTINGS values of one side (RFC 9113 6.5.2); maxConcurrentStreams Infinity when never set. */
export interface H2Settings {
  headerTableSize: number;
  enablePush: number;
  maxConcurrentStreams: number;
  initialWindowSize: number;
  maxFrameSize: number;
  maxHeaderListSize: number;
}

/** The protocol's initial values, which hold until a SETTINGS frame says otherwise. */
export const INITIAL_SETTINGS: Readonly<H2Settings> = {
  headerTableSize: 4096, enablePush: 1, maxConcurrentStreams: Infinity, initialWindowSize: DEFAULT_WINDOW,
  maxFrameSize: 16_384, maxHeaderListSize: Infinity,
};

const SETTING_KEYS: Record<number, keyof H2Settings> = {
  [Setting.HEADER_TABLE_SIZE]: 'headerTableSize', [Setting.ENABLE_PUSH]: 'enablePush',
  [Setting.MAX_CONCURRENT_STREAMS]: 'maxConcurrentStreams', [Setting.INITIAL_WINDOW_SIZE]: 'initialWindowSize',
  [Setting.MAX_FRAME_SIZE]: 'maxFrameSize', [Setting.MAX_HEADER_LIST_SIZE]: 'maxHeaderListSize',
};

/** Where DATA octets are credited back once they have left (the relay's other side). */
export interface Credit {
  consumed(octets: number): void;
}

/**
 * What the owner of a connection is told. Every method but `idle` is called synchronously from a
 * read. A method may throw H2InputError (or H2ConnectionError) for a violation only the owner sees,
 * such as a malformed response: the connection closes as for any protocol error.
 */
export interface H2Handler {
  /**
   * A complete header block. `opened`: it opened a stream the peer started (a request on a server);
   * otherwise it is a response or trailers on a stream already open here. `verbatim`: the block's
   * octets when they read nothing from this connection's HPACK state (hpack.ts
   * lastBlockSelfContained), so another connection may carry them as they are; a view that is
   * valid during the call only.
   */
  headers(streamId: number, fields: HeaderField[], endStream: boolean, opened: boolean, verbatim?: Buffer): void;
  /**
   * DATA on an open stream: the frame as received and its payload without padding. The connection
   * window it took (f.payload.length) comes back to the peer only through `consumed()`.
   */
  data(streamId: number, f: Frame, payload: Buffer, endStream: boolean): void;
  /** An open stream was reset: by the peer, or by us for its protocol error on the stream (`code` then is ours). */
  reset(streamId: number, code: number): void;
  /** The peer's WINDOW_UPDATE on an open stream (already applied to our send window). */
  windowUpdate?(streamId: number, increment: number): void;
  /** The peer's SETTINGS, applied and acknowledged (`values`: the entries the frame carried). */
  settings?(values: ReadonlyMap<keyof H2Settings, number>): void;
  /** The peer's GOAWAY. Streams of ours above `lastStreamId` are already closed here, unanswered. */
  goaway(lastStreamId: number, code: number, debug: string): void;
  /** No stream is open any more (our last output on it written to the socket); called after the turn it happened in. */
  idle?(): void;
  /** The connection is gone (err: why, for a protocol error or socket error). Called once. */
  closed(err: Error | undefined): void;
}

/** How a connection is set up. */
export interface H2ConnectionOptions {
  role: 'client' | 'server';
  /** What we advertise beyond the initial values (enablePush is always 0 from a client). */
  settings: Partial<H2Settings>;
  /** Our connection receive window (the peer may send this much before `consumed()` gives it back). */
  connectionWindow: number;
  /** Unsent octets beyond which a peer that does not read is cut (default 4 MiB). */
  maxBufferedOutput?: number;
  /** Largest header block (its fragments together) accepted (default 64 KiB). */
  maxHeaderBlock?: number;
  /** Connection-window octets given back at once, rather than batched with other output (default a quarter of the window). */
  creditBatch?: number;
  /**
   * Frames on streams that were never opened are ignored rather than a connection error (RFC 9113
   * 5.1), as grpc-go's client does: for a prober that must judge a server as kubelet does.
   */
  ignoreIdleStreams?: boolean;
  /** CONTINUATION frames one header block may take (default 8, as nghttp2; at least what maxHeaderBlock needs in 16 KiB frames). */
  maxContinuations?: number;
  /**
   * Frames without progress the peer may send in a burst (default 1000): each spends one; each
   * frame of progress either way gives one back, and the budget refills in full over 10 s.
   */
  noProgressBudget?: number;
  /**
   * A budget shared with other connections (the gRPC prober's, per pod) that frames without
   * progress also spend, past the first SHARED_FREE_FRAMES of this connection; progress gives
   * nothing back to it. Spent, the connection is cut as for its own budget.
   */
  sharedBudget?: SharedFrameBudget;
  /** The first stream id we start (client role; default 1): a test drives a connection to the last id fast. */
  firstStreamId?: number;
}

/** The highest stream id (RFC 9113 5.1.1): a client needs a new connection past it. */
export const MAX_STREAM_ID = 2 ** 31 - 1;
/** Default frames without progress per connection burst (as nghttp2's and Node's 1000 invalid or queued control frames). */
export const NO_PROGRESS_BUDGET = 1000;
/** Default CONTINUATION frames per header block (nghttp2's limit). */
export const MAX_CONTINUATIONS = 8;
/** The no-progress budget refills in full over this long. */
const BUDGET_REFILL_MS = 10_000;
const TYPE_NAMES = ['DATA', 'HEADERS', 'PRIORITY', 'RST_STREAM', 'SETTINGS', 'PUSH_PROMISE', 'PING', 'GOAWAY', 'WINDOW_UPDATE', 'CONTINUATION'];

/** One queued item of a stream's output: a header block (already framed) or DATA. */
interface Pending {
  /** Framed header block, or null for DATA. */
  frames: Buffer | null;
  /** DATA: its payload (what the peer's windows are charged). */
  payload: Buffer;
  end: boolean;
  /** DATA: the frame as received, reused when it goes out whole and unpadded. */
  raw: Buffer | null;
  /** DATA: octets to credit back to `credit` when it leaves (the source's flow-controlled length). */
  creditOctets: number;
  credit: Credit | null;
}

/** A stream's state here; its windows (StreamWindows) follow flow-control.ts's rules. */
interface StreamState extends StreamWindows {
  queue: Pending[];
  /** We sent END_STREAM (or it is queued). */
  localEnded: boolean;
  /** The peer sent END_STREAM. */
  remoteEnded: boolean;
  /** Started by the peer. */
  remote: boolean;
}

const SETTINGS_ACK = frameBytes(FrameType.SETTINGS, Flag.ACK, 0);
const EMPTY = Buffer.alloc(0);

/**
 * Splits a byte stream into the client preface (server role) and frames. Frames are subarrays of
 * the reads; only a frame split across reads is copied (a large answer would otherwise be copied
 * again on every read).
 */
export class FrameSplitter {
  #buf: Buffer = EMPTY;
  /** A split frame completed by push(), returned first. */
  #ready: Buffer | null = null;
  #preface: boolean;
  /** The largest frame payload accepted (our SETTINGS_MAX_FRAME_SIZE). */
  maxFrame: number;

  constructor(expectPreface: boolean, maxFrame = INITIAL_SETTINGS.maxFrameSize) {
    this.#preface = !expectPreface;
    this.maxFrame = maxFrame;
  }

  /** Octets received but not yet returned as a frame. */
  get pending(): Buffer {
    return this.#buf;
  }

  /** Whether the client preface has been read (or none was expected). */
  get prefaceSeen(): boolean {
    return this.#preface;
  }

  /** Copies the octets held for the next frame, which the read they came in would take along. */
  keepPending(): void {
    this.#buf = keep(this.#buf);
  }

  /** Adds a read; call next() until null before the next push. */
  push(chunk: Buffer): void {
    let b = this.#buf;
    if (b.length === 0) {
      this.#buf = chunk;
      return;
    }
    if (!this.#preface) {
      this.#buf = Buffer.concat([b, chunk]);
      return;
    }
    for (;;) {
      const need = this.#unitLength(b) - b.length;
      if (need <= 0) break;
      if (chunk.length <= need) {
        this.#buf = Buffer.concat([b, chunk]);
        return;
      }
      b = Buffer.concat([b, chunk.subarray(0, need)]);
      chunk = chunk.subarray(need);
    }
    this.#ready = b;
    this.#buf = chunk;
  }

  /** Octets of the frame `b` begins (its header's 9 until that is complete; an oversized one ends at once, to be refused). */
  #unitLength(b: Buffer): number {
    if (b.length < FRAME_HEADER) return FRAME_HEADER;
    const length = (b[0]! << 16) | (b[1]! << 8) | b[2]!;
    return length > this.maxFrame ? b.length : FRAME_HEADER + length;
  }

  /** The next complete frame, or null until more octets come. Throws H2ConnectionError. */
  next(): Frame | null {
    if (this.#ready !== null) {
      const r = this.#ready;
      this.#ready = null;
      return this.#take(r);
    }
    if (!this.#preface) {
      const n = Math.min(this.#buf.length, CLIENT_PREFACE.length);
      if (!this.#buf.subarray(0, n).equals(CLIENT_PREFACE.subarray(0, n))) throw new H2InputError('not an HTTP/2 client preface');
      if (n < CLIENT_PREFACE.length) return null;
      this.#buf = this.#buf.subarray(CLIENT_PREFACE.length);
      this.#preface = true;
    }
    const b = this.#buf;
    if (b.length < FRAME_HEADER) return null;
    const f = this.#take(b);
    if (f !== null) this.#buf = b.subarray(f.raw.length);
    return f;
  }

  #take(b: Buffer): Frame | null {
    const length = (b[0]! << 16) | (b[1]! << 8) | b[2]!;
    if (length > this.maxFrame) throw new H2ConnectionError(H2Error.FRAME_SIZE_ERROR, `frame of ${length} octets exceeds SETTINGS_MAX_FRAME_SIZE ${this.maxFrame}`);
    const end = FRAME_HEADER + length;
    if (b.length < end) return null;
    const raw = b.subarray(0, end);
    return { type: raw[3]!, flags: raw[4]!, streamId: ((raw[5]! & 0x7f) << 24 | raw[6]! << 16 | raw[7]! << 8 | raw[8]!) >>> 0, payload: raw.subarray(FRAME_HEADER), raw };
  }
}

/** Checks one SETTINGS entry against RFC 9113 6.5.2; throws H2ConnectionError. */
function checkSetting(id: number, v: number): void {
  if (id === Setting.ENABLE_PUSH && v > 1) throw new H2ConnectionError(H2Error.PROTOCOL_ERROR, `SETTINGS_ENABLE_PUSH ${v}`);
  if (id === Setting.INITIAL_WINDOW_SIZE) checkInitialWindowSize(v);
  if (id === Setting.MAX_FRAME_SIZE && (v < 16_384 || v > 16_777_215)) throw new H2ConnectionError(H2Error.PROTOCOL_ERROR, `SETTINGS_MAX_FRAME_SIZE ${v} outside 16384..16777215`);
}

/** Encodes SETTINGS entries. */
function settingsPayload(s: Partial<H2Settings>): Buffer {
  const entries: Array<[number, number]> = [];
  for (const [id, key] of Object.entries(SETTING_KEYS)) {
    const v = s[key];
    if (v !== undefined && Number.isFinite(v)) entries.push([Number(id), v]);
  }
  const p = Buffer.allocUnsafe(6 * entries.length);
  entries.forEach(([id, v], i) => {
    p.writeUInt16BE(id, i * 6);
    p.writeUInt32BE(v, i * 6 + 2);
  });
  return p;
}

/**
 * Frames a header block as HEADERS + CONTINUATION no larger than `maxFrame`; `priority`: the 5
 * octets a HEADERS with PRIORITY carries (the shim's authority rewrite keeps a client's).
 */
export function headerBlockFrames(streamId: number, block: Buffer, endStream: boolean, maxFrame: number, priority: Buffer | null = null): Buffer {
  const first = maxFrame - (priority?.length ?? 0);
  const flags = (endStream ? Flag.END_STREAM : 0) | (priority ? Flag.PRIORITY : 0);
  if (block.length <= first) return frameBytes(FrameType.HEADERS, flags | Flag.END_HEADERS, streamId, priority ? Buffer.concat([priority, block]) : block);
  const head = block.subarray(0, first);
  const out = [frameBytes(FrameType.HEADERS, flags, streamId, priority ? Buffer.concat([priority, head]) : head)];
  for (let pos = first; pos < block.length; pos += maxFrame) {
    const end = Math.min(pos + maxFrame, block.length);
    out.push(frameBytes(FrameType.CONTINUATION, end === block.length ? Flag.END_HEADERS : 0, streamId, block.subarray(pos, end)));
  }
  return Buffer.concat(out);
}

/** A header block joined from its HEADERS and CONTINUATION frames. */
export interface HeaderBlock {
  streamId: number;
  endStream: boolean;
  /** The HEADERS frame's 5 priority octets, or null. */
  priority: Buffer | null;
  /** The HPACK octets, padding removed. */
  block: Buffer;
}

/**
 * Joins HEADERS and CONTINUATION frames into header blocks (RFC 9113 6.2, 6.10), padding removed,
 * bounded by `maxBlock` octets and by `maxContinuations` CONTINUATION frames (empty ones add no
 * octets but cost a frame each). Every frame read goes through take(): a frame other than the open
 * block's CONTINUATION is a connection error.
 */
export class HeaderBlockJoiner {
  #open: { streamId: number; endStream: boolean; priority: Buffer | null; fragments: Buffer[]; size: number; continuations: number } | null = null;
  readonly #maxBlock: number;
  readonly #maxContinuations: number;

  constructor(maxBlock: number, maxContinuations = MAX_CONTINUATIONS) {
    this.#maxBlock = maxBlock;
    // A block of maxBlock octets in the smallest frames a peer may be held to still fits.
    this.#maxContinuations = Math.max(maxContinuations, Math.ceil(maxBlock / INITIAL_SETTINGS.maxFrameSize));
  }

  /** The complete block a HEADERS or CONTINUATION frame ends, else null. Throws H2ConnectionError. */
  take(f: Frame): HeaderBlock | null {
    let fragment = f.payload;
    if (f.type === FrameType.CONTINUATION) {
      if (this.#open === null || this.#open.streamId !== f.streamId) throw new H2ConnectionError(H2Error.PROTOCOL_ERROR, `CONTINUATION on stream ${f.streamId} without a header block open on it`);
      if (++this.#open.continuations > this.#maxContinuations) {
        throw new H2ConnectionError(H2Error.ENHANCE_YOUR_CALM, `header block on stream ${f.streamId} in more than ${this.#maxContinuations} CONTINUATION frames`);
      }
    } else if (this.#open !== null) {
      throw new H2ConnectionError(H2Error.PROTOCOL_ERROR, `frame type ${f.type} inside a header block`);
    } else if (f.type !== FrameType.HEADERS) {
      return null;
    } else {
      if (f.streamId === 0) throw new H2ConnectionError(H2Error.PROTOCOL_ERROR, 'HEADERS on stream 0');
      if (f.flags & Flag.PADDED) {
        if (fragment.length < 1) throw new H2ConnectionError(H2Error.PROTOCOL_ERROR, 'PADDED HEADERS without a pad length');
        const pad = fragment[0]!;
        if (pad > fragment.length - 1) throw new H2ConnectionError(H2Error.PROTOCOL_ERROR, 'HEADERS padding longer than the frame');
        fragment = fragment.subarray(1, fragment.length - pad);
      }
      let priority: Buffer | null = null;
      if (f.flags & Flag.PRIORITY) {
        if (fragment.length < 5) throw new H2ConnectionError(H2Error.PROTOCOL_ERROR, 'HEADERS with PRIORITY shorter than 5 octets');
        priority = Buffer.from(fragment.subarray(0, 5));
        fragment = fragment.subarray(5);
      }
      this.#open = { streamId: f.streamId, endStream: (f.flags & Flag.END_STREAM) !== 0, priority, fragments: [], size: 0, continuations: 0 };
    }
    const b = this.#open;
    b.size += fragment.length;
    if (b.size > this.#maxBlock) throw new H2ConnectionError(H2Error.ENHANCE_YOUR_CALM, `header block on stream ${b.streamId} larger than ${this.#maxBlock} octets`);
    if ((f.flags & Flag.END_HEADERS) === 0) {
      // The fragment is a view of this read: keep a copy, the next read may reuse nothing of it.
      if (fragment.length > 0) b.fragments.push(Buffer.from(fragment));
      return null;
    }
    if (fragment.length > 0 || b.fragments.length === 0) b.fragments.push(fragment);
    this.#open = null;
    return { streamId: b.streamId, endStream: b.endStream, priority: b.priority, block: b.fragments.length === 1 ? b.fragments[0]! : Buffer.concat(b.fragments, b.size) };
  }
}

/** One HTTP/2 connection on a connected duplex (a socket), client or server. */
export class H2Connection implements Credit {
  readonly role: 'client' | 'server';
  /** What we advertised (the latest SETTINGS we sent). */
  readonly local: H2Settings;
  /** The peer's SETTINGS as applied. */
  readonly peer: H2Settings = { ...INITIAL_SETTINGS };
  readonly #socket: ByteChannel;
  #h: H2Handler | null = null;
  readonly #splitter: FrameSplitter;
  readonly #decoder: HpackDecoder;
  readonly #streams = new Map<number, StreamState>();
  /** Streams with queued output, in the order they are served. */
  readonly #ready = new Set<number>();
  readonly #blocks: HeaderBlockJoiner;
  readonly #flow: FlowControl;
  readonly #writer: FrameWriter;
  /** The highest stream id the peer started; the next id we start. */
  #lastPeerStream = 0;
  #nextOwnStream: number;
  #remoteOpen = 0;
  #localOpen = 0;
  readonly #ignoreIdle: boolean;
  #settingsSeen = false;
  #goawaySent = false;
  #goawayReceived = false;
  #closed = false;
  #ending = false;
  #idleQueued = false;
  /** The no-progress budget, the shared one (and frames charged to it), and what was spent by frame type. */
  readonly #budget: TokenBucket;
  readonly #shared: SharedFrameBudget | undefined;
  #sharedCharged = 0;
  readonly #spent = new Map<string, number>();

  constructor(socket: Duplex | ByteChannel, opts: H2ConnectionOptions) {
    this.role = opts.role;
    this.#socket = channelOf(socket);
    this.local = { ...INITIAL_SETTINGS, ...opts.settings, ...(opts.role === 'client' ? { enablePush: 0 } : {}) };
    this.#splitter = new FrameSplitter(opts.role === 'server', this.local.maxFrameSize);
    this.#decoder = new HpackDecoder({ maxTableSize: this.local.headerTableSize, maxHeaderListSize: this.local.maxHeaderListSize });
    this.#writer = new FrameWriter(this.#socket, opts.maxBufferedOutput ?? 4 * 1024 * 1024, {
      beforeWrite: (queued) => {
        const credit = this.#flow.connectionCredit(queued);
        if (credit > 0) this.#writer.add(windowUpdateFrame(0, credit));
      },
      onOverflow: (unsent) => this.destroy(new H2ConnectionError(H2Error.ENHANCE_YOUR_CALM, `peer does not read: ${unsent} octets unsent`)),
    });
    this.#blocks = new HeaderBlockJoiner(opts.maxHeaderBlock ?? 64 * 1024, opts.maxContinuations);
    this.#budget = new TokenBucket(opts.noProgressBudget ?? NO_PROGRESS_BUDGET, BUDGET_REFILL_MS);
    this.#shared = opts.sharedBudget;
    this.#flow = new FlowControl(opts.connectionWindow, opts.creditBatch);
    this.#nextOwnStream = opts.role === 'client' ? (opts.firstStreamId ?? 1) : 2;
    if (this.#nextOwnStream % 2 !== (opts.role === 'client' ? 1 : 0)) throw new RangeError(`first stream id ${this.#nextOwnStream} is not a ${opts.role}'s`);
    this.#ignoreIdle = opts.ignoreIdleStreams ?? false;
    // The preface: ours first (a client's magic, then SETTINGS), our connection window beyond the default.
    const hello = [frameBytes(FrameType.SETTINGS, 0, 0, settingsPayload({ ...opts.settings, ...(opts.role === 'client' ? { enablePush: 0 } : {}) }))];
    if (this.#flow.prefaceIncrement > 0) hello.push(windowUpdateFrame(0, this.#flow.prefaceIncrement));
    if (opts.role === 'client') hello.unshift(CLIENT_PREFACE);
    for (const b of hello) this.#writer.add(b);
  }

  /** Starts reading with `handler` (separate from the constructor so an owner can hold the connection first). */
  start(handler: H2Handler): this {
    this.#h = handler;
    this.#socket.start({
      data: (view) => this.#onRead(view),
      end: () => this.#gone(undefined),
      close: (err) => this.#gone(err),
      drain: () => this.#pump(),
    });
    this.#writer.schedule();
    return this;
  }

  /** Whether the peer's SETTINGS (its preface) arrived. */
  get settingsSeen(): boolean {
    return this.#settingsSeen;
  }

  /** Whether the connection is closed (no more reads or writes). */
  get closed(): boolean {
    return this.#closed;
  }

  /** Streams open here (either side's). */
  get streamCount(): number {
    return this.#streams.size;
  }

  /** Streams we started that are open here (what the peer's SETTINGS_MAX_CONCURRENT_STREAMS counts). */
  get localStreams(): number {
    return this.#localOpen;
  }

  /** Whether the stream is open here. */
  has(streamId: number): boolean {
    return this.#streams.has(streamId);
  }

  /** Octets queued for the peer's windows (not yet written), over all streams. */
  get queuedData(): number {
    let n = 0;
    for (const id of this.#ready) for (const p of this.#streams.get(id)?.queue ?? []) n += p.payload.length;
    return n;
  }

  /** The id the next stream we start gets (client role). */
  get nextStreamId(): number {
    return this.#nextOwnStream;
  }

  /** The highest stream the peer started. */
  get lastPeerStream(): number {
    return this.#lastPeerStream;
  }

  /** Sends new SETTINGS (changes of what we advertise, e.g. a window mirrored from the relay's other side). */
  updateSettings(values: Partial<H2Settings>): void {
    if (this.#closed) return;
    const changed: Partial<H2Settings> = {};
    for (const [k, v] of Object.entries(values) as Array<[keyof H2Settings, number]>) {
      if (this.local[k] !== v) changed[k] = v;
    }
    if (Object.keys(changed).length === 0) return;
    const delta = changed.initialWindowSize === undefined ? 0 : changed.initialWindowSize - this.local.initialWindowSize;
    Object.assign(this.local, changed);
    if (changed.maxFrameSize !== undefined) this.#splitter.maxFrame = Math.max(this.#splitter.maxFrame, changed.maxFrameSize);
    this.#push(frameBytes(FrameType.SETTINGS, 0, 0, settingsPayload(changed)));
    if (delta !== 0) {
      // The new initial window applies to open streams too (RFC 9113 6.9.2): one that shrank below
      // what the peer needs gets back what the owner already read, or it could never send again.
      for (const [id, st] of this.#streams) {
        this.#flow.localInitialWindow(st, delta);
        this.#refill(id, st);
      }
    }
  }

  /**
   * Starts a stream of ours with a header block (client role); returns its id, or 0 when no stream
   * may start. `fields` as in headers().
   */
  request(fields: readonly HeaderField[] | Buffer, endStream: boolean): number {
    if (this.#closed || this.#goawayReceived || this.#goawaySent || this.#nextOwnStream > MAX_STREAM_ID) return 0;
    const id = this.#nextOwnStream;
    this.#nextOwnStream += 2;
    this.#streams.set(id, { sendWindow: this.peer.initialWindowSize, queue: [], localEnded: false, remoteEnded: false, remote: false, unacked: 0, recvWindow: this.local.initialWindowSize });
    this.#localOpen++;
    this.headers(id, fields, endStream);
    return id;
  }

  /** Whether a stream of ours may start now (within the peer's SETTINGS_MAX_CONCURRENT_STREAMS). */
  get mayStart(): boolean {
    if (this.#closed || this.#goawayReceived || this.#goawaySent || this.#nextOwnStream > MAX_STREAM_ID) return false;
    return this.#localOpen < this.peer.maxConcurrentStreams;
  }

  /** Streams we may still start here before the ids run out (the owner moves to a new connection at 0). */
  get streamsLeft(): number {
    return this.#nextOwnStream > MAX_STREAM_ID ? 0 : ((MAX_STREAM_ID - this.#nextOwnStream) >>> 1) + 1;
  }

  /**
   * Sends a header block on an open stream (a response, or trailers with endStream), behind its
   * queued DATA. `fields` may come HPACK-encoded already: literals only, as encodeLiteralBlock
   * writes them (our encoder keeps no state, so a block encoded once may be sent on any stream).
   */
  headers(streamId: number, fields: readonly HeaderField[] | Buffer, endStream: boolean): void {
    const s = this.#streams.get(streamId);
    if (!s || s.localEnded || this.#closed) return;
    const block = Buffer.isBuffer(fields) ? fields : encodeLiteralBlock(fields);
    const frames = headerBlockFrames(streamId, block, endStream, this.peer.maxFrameSize);
    if (endStream) s.localEnded = true;
    if (s.queue.length === 0) {
      this.#push(frames);
      this.#progress();
      if (endStream) this.#localEnd(streamId, s);
    } else {
      s.queue.push({ frames, payload: EMPTY, end: endStream, raw: null, creditOctets: 0, credit: null });
    }
  }

  /** Sends DATA on an open stream within the peer's windows; `credit` learns when `creditOctets` have left. */
  data(streamId: number, payload: Buffer, endStream: boolean, credit: Credit | null = null, creditOctets = 0, raw: Buffer | null = null): void {
    const s = this.#streams.get(streamId);
    if (!s || s.localEnded || this.#closed) {
      if (credit !== null && creditOctets > 0) credit.consumed(creditOctets);
      return;
    }
    if (endStream) s.localEnded = true;
    const p: Pending = { frames: null, payload, end: endStream, raw, creditOctets, credit };
    s.queue.push(p);
    this.#ready.add(streamId);
    this.#pump();
    // Still waiting for a window: a view of a read must not wait with it.
    if (s.queue[s.queue.length - 1] === p && isTransient(p.payload)) {
      p.payload = Buffer.from(p.payload);
      p.raw = null;
    }
  }

  /** Resets a stream (its queued output is dropped, credited back). */
  reset(streamId: number, code: number): void {
    const s = this.#streams.get(streamId);
    if (this.#closed) return;
    if (s) this.#drop(streamId, s);
    else if (streamId > (this.#isPeerId(streamId) ? this.#lastPeerStream : this.#nextOwnStream - 2)) return; // idle: nothing to reset
    this.#push(rstStreamFrame(streamId, code));
  }

  /** Gives the peer more window on a stream it sends on. */
  windowUpdate(streamId: number, increment: number): void {
    const s = this.#streams.get(streamId);
    if (this.#closed || increment <= 0 || s === undefined) return;
    this.#flow.grant(s, increment);
    this.#push(windowUpdateFrame(streamId, increment));
  }

  /**
   * Gives `octets` of connection window back to the peer (batched). With `streamId`, the stream's
   * window too, for DATA the owner reads itself rather than passes on.
   */
  consumed(octets: number, streamId = 0): void {
    if (octets <= 0 || this.#closed) return;
    const s = streamId === 0 ? undefined : this.#streams.get(streamId);
    const due = this.#flow.consumed(octets, s);
    if (s !== undefined) this.#refill(streamId, s);
    if (due) this.#writer.schedule();
  }

  /** Sends what the stream-window refill rule (FlowControl.refill) gives back on a stream. */
  #refill(id: number, s: StreamState): void {
    const n = this.#flow.refill(s, this.local.initialWindowSize, s.remoteEnded);
    if (n > 0) this.#push(windowUpdateFrame(id, n));
  }

  /** GOAWAY: the last stream of the peer's we process; no new streams on either side after it. */
  goaway(code = H2Error.NO_ERROR, debug = ''): void {
    if (this.#closed || this.#goawaySent) return;
    this.#goawaySent = true;
    this.#push(goawayFrame(this.#lastPeerStream, code, debug));
  }

  /** Whether we sent GOAWAY. */
  get goawaySent(): boolean {
    return this.#goawaySent;
  }

  /** Ends the connection once what is queued is written. */
  end(): void {
    if (this.#closed || this.#ending) return;
    this.#ending = true;
    this.#writer.flush();
    this.#socket.end();
    // A peer that never closes its side is cut.
    setTimeout(() => this.destroy(), 1000).unref();
  }

  /** Closes the connection now. */
  destroy(err?: Error): void {
    this.#socket.destroy();
    this.#gone(err);
  }

  // ---- the no-progress budget ----

  /** A frame that moved no stream forward: spends one of each budget, which time refills; throws once one is gone. */
  #noProgress(f: Frame, name = TYPE_NAMES[f.type] ?? `type ${f.type}`): void {
    this.#spent.set(name, (this.#spent.get(name) ?? 0) + 1);
    if (!this.#budget.take()) throw new FrameBudgetError('connection', `peer flooded frames without progress (${this.#spentText()}): budget of ${this.#budget.max} spent`);
    const shared = this.#shared;
    if (shared !== undefined && ++this.#sharedCharged > SHARED_FREE_FRAMES && !shared.spend()) {
      throw new FrameBudgetError('shared', `peer flooded frames without progress (${this.#spentText()}): ${shared.spentWhy}`);
    }
  }

  #spentText(): string {
    return [...this.#spent].sort((a, b) => b[1] - a[1]).map(([k, v]) => `${k} ${v}`).join(', ');
  }

  /** A frame of progress, received or sent: gives one back (to this connection's budget only). */
  #progress(): void {
    this.#budget.giveBack();
  }

  // ---- reading ----

  #onRead(chunk: Buffer): void {
    if (this.#closed) return;
    try {
      this.#splitter.push(chunk);
      for (let f = this.#splitter.next(); f !== null; f = this.#splitter.next()) {
        this.#frame(f);
        if (this.#closed) return;
      }
      this.#splitter.keepPending();
    } catch (err) {
      this.#fail(err as Error);
    }
  }

  #fail(err: Error): void {
    let e: H2ConnectionError;
    if (err instanceof H2ConnectionError) e = err;
    else if (err instanceof HpackError) e = new H2ConnectionError(H2Error.COMPRESSION_ERROR, err.message);
    else if (err instanceof H2InputError) e = new H2ConnectionError(H2Error.PROTOCOL_ERROR, err.message);
    else e = new H2ConnectionError(H2Error.INTERNAL_ERROR, `unexpected: ${err.message}`);
    if (!this.#closed && !this.#goawaySent) {
      this.#goawaySent = true;
      this.#writer.add(goawayFrame(this.#lastPeerStream, e.code, e.message));
      this.#writer.flush();
    }
    if (!this.#socket.destroyed) this.#socket.end();
    this.#gone(e);
    setTimeout(() => this.#socket.destroy(), 1000).unref();
  }

  #isPeerId(id: number): boolean {
    return (id % 2 === 1) === (this.role === 'server');
  }

  /** A frame on a stream that was never opened (RFC 9113 5.1 "idle"), which is a connection error. */
  #idle(id: number): boolean {
    if (this.#ignoreIdle) return false;
    return this.#isPeerId(id) ? id > this.#lastPeerStream : id >= this.#nextOwnStream;
  }

  /** A stream error (RFC 9113 5.4.2) on an open stream: reset, and the owner told. */
  #streamError(id: number, code: number): void {
    const open = this.#streams.has(id);
    this.reset(id, code);
    if (open) this.#h!.reset(id, code);
  }

  #frame(f: Frame): void {
    if (!this.#settingsSeen && f.type !== FrameType.SETTINGS) {
      throw new H2ConnectionError(H2Error.PROTOCOL_ERROR, `first frame from the ${this.role === 'client' ? 'server' : 'client'} was type ${f.type}, not SETTINGS`);
    }
    const block = this.#blocks.take(f);
    switch (f.type) {
      case FrameType.DATA: return this.#onData(f);
      case FrameType.HEADERS:
      case FrameType.CONTINUATION:
        // Decoded whatever the stream's fate: the HPACK state is the connection's.
        if (block !== null) {
          const fields = this.#decoder.decode(block.block);
          const verbatim = this.#decoder.lastBlockSelfContained ? block.block : undefined;
          const moved = this.#headerBlock(block.streamId, fields, block.endStream, verbatim);
          if (moved !== true) this.#noProgress(f, moved === 'informational' ? '1xx HEADERS' : undefined);
        }
        return;
      case FrameType.RST_STREAM: return this.#onReset(f);
      case FrameType.SETTINGS: return this.#onSettings(f);
      case FrameType.PING:
        this.#noProgress(f);
        if (f.streamId !== 0) throw new H2ConnectionError(H2Error.PROTOCOL_ERROR, 'PING on a stream');
        if (f.payload.length !== 8) throw new H2ConnectionError(H2Error.FRAME_SIZE_ERROR, 'PING of a length other than 8');
        if (!(f.flags & Flag.ACK)) this.#push(frameBytes(FrameType.PING, Flag.ACK, 0, f.payload));
        return;
      case FrameType.GOAWAY: {
        this.#noProgress(f);
        if (f.streamId !== 0) throw new H2ConnectionError(H2Error.PROTOCOL_ERROR, 'GOAWAY on a stream');
        const g = parseGoaway(f.payload);
        if (!g) throw new H2ConnectionError(H2Error.FRAME_SIZE_ERROR, 'GOAWAY shorter than 8 octets');
        this.#goawayReceived = true;
        // Ours above its last stream were never processed (RFC 9113 6.8): closed here, no RST needed.
        for (const [id, s] of this.#streams) if (!s.remote && id > g.lastStreamId) this.#drop(id, s);
        this.#h!.goaway(g.lastStreamId, g.code, g.debug);
        return;
      }
      case FrameType.WINDOW_UPDATE: return this.#onWindowUpdate(f);
      case FrameType.PRIORITY:
        // Advisory; never passed on (its dependency would name this connection's ids).
        this.#noProgress(f);
        if (f.streamId === 0) throw new H2ConnectionError(H2Error.PROTOCOL_ERROR, 'PRIORITY on stream 0');
        if (f.payload.length !== 5) this.#streamError(f.streamId, H2Error.FRAME_SIZE_ERROR);
        return;
      case FrameType.PUSH_PROMISE:
        throw new H2ConnectionError(H2Error.PROTOCOL_ERROR, 'PUSH_PROMISE although SETTINGS_ENABLE_PUSH is 0');
      default:
        this.#noProgress(f);
        return; // unknown frame types are ignored (RFC 9113 5.5)
    }
  }

  #onSettings(f: Frame): void {
    this.#noProgress(f);
    if (f.streamId !== 0) throw new H2ConnectionError(H2Error.PROTOCOL_ERROR, 'SETTINGS on a stream');
    if (f.flags & Flag.ACK) {
      if (f.payload.length !== 0) throw new H2ConnectionError(H2Error.FRAME_SIZE_ERROR, 'SETTINGS ACK with a payload');
      return;
    }
    if (f.payload.length % 6 !== 0) throw new H2ConnectionError(H2Error.FRAME_SIZE_ERROR, 'SETTINGS length not a multiple of 6');
    const values = new Map<keyof H2Settings, number>();
    for (let i = 0; i < f.payload.length; i += 6) {
      const id = f.payload.readUInt16BE(i);
      const v = f.payload.readUInt32BE(i + 2);
      checkSetting(id, v);
      const key = SETTING_KEYS[id];
      if (key !== undefined) values.set(key, v);
    }
    this.#settingsSeen = true;
    const iw = values.get('initialWindowSize');
    if (iw !== undefined) this.#flow.peerInitialWindow(this.#streams.values(), iw - this.peer.initialWindowSize);
    for (const [k, v] of values) this.peer[k] = v;
    this.#push(SETTINGS_ACK);
    this.#h!.settings?.(values);
    if (iw !== undefined) this.#pump();
  }

  #onWindowUpdate(f: Frame): void {
    // A reader's WINDOW_UPDATEs follow the DATA we send, which gives them back.
    this.#noProgress(f);
    if (f.payload.length !== 4) throw new H2ConnectionError(H2Error.FRAME_SIZE_ERROR, 'WINDOW_UPDATE of a length other than 4');
    const inc = f.payload.readUInt32BE(0) & 0x7fffffff;
    if (f.streamId === 0) {
      this.#flow.connectionUpdate(inc);
      this.#pump();
      return;
    }
    const s = this.#streams.get(f.streamId);
    if (!s) {
      if (this.#idle(f.streamId)) throw new H2ConnectionError(H2Error.PROTOCOL_ERROR, `WINDOW_UPDATE on idle stream ${f.streamId}`);
      return;
    }
    const error = this.#flow.streamUpdate(s, inc);
    if (error !== 0) return this.#streamError(f.streamId, error);
    this.#h!.windowUpdate?.(f.streamId, inc);
    if (s.queue.length > 0) this.#pump();
  }

  #onReset(f: Frame): void {
    this.#noProgress(f);
    if (f.streamId === 0) throw new H2ConnectionError(H2Error.PROTOCOL_ERROR, 'RST_STREAM on stream 0');
    if (f.payload.length !== 4) throw new H2ConnectionError(H2Error.FRAME_SIZE_ERROR, 'RST_STREAM of a length other than 4');
    const s = this.#streams.get(f.streamId);
    if (!s) {
      if (this.#idle(f.streamId)) throw new H2ConnectionError(H2Error.PROTOCOL_ERROR, `RST_STREAM on idle stream ${f.streamId}`);
      return;
    }
    this.#drop(f.streamId, s);
    this.#h!.reset(f.streamId, f.payload.readUInt32BE(0));
  }

  #onData(f: Frame): void {
    if (f.streamId === 0) throw new H2ConnectionError(H2Error.PROTOCOL_ERROR, 'DATA on stream 0');
    const n = f.payload.length;
    this.#flow.received(n);
    const s = this.#streams.get(f.streamId);
    if (!s || s.remoteEnded) {
      if (!s && this.#idle(f.streamId)) throw new H2ConnectionError(H2Error.PROTOCOL_ERROR, `DATA on idle stream ${f.streamId}`);
      this.#noProgress(f);
      // A stream closed here (reset, or ended): its octets are dropped and given back.
      this.consumed(n);
      if (s) this.#streamError(f.streamId, H2Error.STREAM_CLOSED);
      return;
    }
    const payload = dataPayload(f.flags, f.payload);
    if (payload === undefined) throw new H2ConnectionError(H2Error.PROTOCOL_ERROR, 'DATA padding longer than the frame');
    this.#flow.receivedOn(s, n);
    const end = (f.flags & Flag.END_STREAM) !== 0;
    if (payload.length > 0 || end) this.#progress();
    else this.#noProgress(f);
    if (end) this.#remoteEnd(f.streamId, s);
    this.#h!.data(f.streamId, f, payload, end);
  }

  /**
   * A complete header block; false when it moved no stream forward (refused, ignored, on a closed
   * stream), 'informational' for a 1xx head on a stream of ours (passed on, but no progress: the
   * response is still to come, and a peer could send them for ever).
   */
  #headerBlock(id: number, fields: HeaderField[], endStream: boolean, verbatim: Buffer | undefined): boolean | 'informational' {
    const s = this.#streams.get(id);
    if (s) {
      if (s.remoteEnded) {
        this.#streamError(id, H2Error.STREAM_CLOSED);
        return false;
      }
      if (endStream) this.#remoteEnd(id, s);
      const informational = !s.remote && isInformationalBlock(fields);
      if (!informational) this.#progress();
      this.#h!.headers(id, fields, endStream, false, verbatim);
      return informational ? 'informational' : true;
    }
    if (!this.#isPeerId(id)) {
      if (this.#idle(id)) throw new H2ConnectionError(H2Error.PROTOCOL_ERROR, `HEADERS on idle stream ${id}`);
      return false; // a stream of ours already closed here
    }
    if (this.role === 'client') {
      if (this.#ignoreIdle) return false;
      throw new H2ConnectionError(H2Error.PROTOCOL_ERROR, `server started stream ${id}`);
    }
    if (id <= this.#lastPeerStream) return false; // closed (we reset it, or it ended)
    this.#lastPeerStream = id;
    if (this.#goawaySent) return false; // above our GOAWAY: not processed; the client retries it elsewhere
    if (this.#remoteOpen >= this.local.maxConcurrentStreams) {
      this.#push(rstStreamFrame(id, H2Error.REFUSED_STREAM));
      return false;
    }
    const st: StreamState = { sendWindow: this.peer.initialWindowSize, queue: [], localEnded: false, remoteEnded: false, remote: true, unacked: 0, recvWindow: this.local.initialWindowSize };
    this.#streams.set(id, st);
    this.#remoteOpen++;
    if (endStream) st.remoteEnded = true;
    this.#progress();
    this.#h!.headers(id, fields, endStream, true, verbatim);
    return true;
  }

  // ---- stream bookkeeping ----

  #remoteEnd(id: number, s: StreamState): void {
    s.remoteEnded = true;
    if (s.localEnded && s.queue.length === 0) this.#forget(id, s);
  }

  #localEnd(id: number, s: StreamState): void {
    if (s.remoteEnded) this.#forget(id, s);
  }

  #forget(id: number, s: StreamState): void {
    if (this.#streams.get(id) !== s) return;
    this.#streams.delete(id);
    this.#ready.delete(id);
    if (s.remote) this.#remoteOpen--;
    else this.#localOpen--;
    if (this.#streams.size === 0 && !this.#idleQueued && this.#h?.idle !== undefined) {
      // Later: a stream often closes inside an owner's own call (its last answer sent at once).
      this.#idleQueued = true;
      queueMicrotask(() => {
        this.#idleQueued = false;
        if (!this.#closed && this.#streams.size === 0) this.#h?.idle?.();
      });
    }
  }

  /** Drops a stream now (reset): what it had queued is credited back to its sources. */
  #drop(id: number, s: StreamState): void {
    for (const p of s.queue) if (p.credit !== null && p.creditOctets > 0) p.credit.consumed(p.creditOctets);
    s.queue = [];
    s.localEnded = true;
    s.remoteEnded = true;
    this.#forget(id, s);
  }

  // ---- writing ----

  #push(octets: Buffer): void {
    if (!this.#closed) this.#writer.push(octets);
  }

  /** Moves queued DATA (and the header blocks behind it) out within the windows, round-robin over streams. */
  #pump(): void {
    if (this.#closed) return;
    let progressed = true;
    while (progressed && this.#ready.size > 0) {
      progressed = false;
      for (const id of this.#ready) {
        if (this.#writer.blocked) return;
        const s = this.#streams.get(id);
        if (!s || s.queue.length === 0) {
          this.#ready.delete(id);
          continue;
        }
        if (this.#sendOne(id, s)) progressed = true;
        if (s.queue.length === 0) {
          this.#ready.delete(id);
          if (s.localEnded) this.#localEnd(id, s);
        }
      }
    }
  }

  /** Sends the head of a stream's queue (or the part of it the windows allow); false when nothing could go. */
  #sendOne(id: number, s: StreamState): boolean {
    const p = s.queue[0]!;
    if (p.frames !== null) {
      s.queue.shift();
      this.#push(p.frames);
      this.#progress();
      return true;
    }
    const len = p.payload.length;
    const room = this.#flow.room(s, this.peer.maxFrameSize);
    if (len > 0 && room <= 0) return false;
    const take = Math.min(len, room);
    const whole = take === len;
    const flags = whole && p.end ? Flag.END_STREAM : 0;
    if (whole && p.raw !== null && p.raw.length === FRAME_HEADER + len && (p.raw[4]! & ~Flag.END_STREAM) === 0) {
      // The frame as received (unpadded): its id and flags are rewritten in place, no copy.
      p.raw.writeUInt32BE(id, 5);
      p.raw[4] = flags;
      this.#push(p.raw);
    } else {
      this.#push(frameBytes(FrameType.DATA, flags, id, p.payload.subarray(0, take)));
    }
    this.#flow.charge(s, take);
    if (take > 0) this.#progress();
    if (whole) {
      s.queue.shift();
      if (p.credit !== null && p.creditOctets > 0) p.credit.consumed(p.creditOctets);
    } else {
      p.payload = p.payload.subarray(take);
      p.raw = null;
    }
    return true;
  }

  #gone(err: Error | undefined): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const [id, s] of this.#streams) this.#drop(id, s);
    this.#ready.clear();
    this.#writer.close();
    const h = this.#h;
    this.#h = null;
    h?.closed(err);
  }
}
