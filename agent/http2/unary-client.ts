/**
 * A hand-written HTTP/2 client for unary calls (the shim's ProbeService client rides it): one
 * connection to a unix socket, many concurrent streams on it, each one request (HEADERS + DATA,
 * END_STREAM) and one response (HEADERS, DATA, trailers). No node:http2: frames are read with
 * authority.ts's FrameReader, header blocks decoded with our HPACK decoder, requests written with
 * literal HPACK. What the caller needs to decide whether a failed call may be sent again is kept
 * exact: a call that never reached the socket, a stream the server refused (REFUSED_STREAM), or a
 * stream above a GOAWAY's last-stream-id was certainly not started (notStarted).
 *
 * Flow control: we announce a 16 MiB stream window and a 1 GiB connection window (topped up as we
 * read), so the server never waits on us; we send within the server's windows (SendWindows).
 */
import * as net from 'node:net';
import { FrameReader, H2_LIMITS, HeaderBlockCollector } from './authority.ts';
import { HpackDecoder, HpackError, type HeaderField } from './hpack.ts';
import {
  applyPeerSettings, dataPayload, frameBytes, goawayFrame, H2Error, parseGoaway, rstStreamFrame, SendWindows, Setting, settingsFrame, u31,
  windowUpdateFrame,
  CLIENT_PREFACE, Flag, FrameType, H2InputError, type Frame,
} from './wire.ts';

/** Why a call got no response: 'unreachable' (never sent), 'broken' (the connection or stream failed), 'too-large'. */
export type UnaryH2Failure = 'unreachable' | 'broken' | 'too-large';

/** A call that got no complete response. notStarted: the server certainly did not start it. */
export class UnaryH2Error extends Error {
  readonly failure: UnaryH2Failure;
  readonly notStarted: boolean;
  /** The RST_STREAM code when the server reset the stream. */
  readonly resetCode: number | undefined;
  constructor(failure: UnaryH2Failure, message: string, notStarted: boolean, resetCode?: number) {
    super(message);
    this.name = 'UnaryH2Error';
    this.failure = failure;
    this.notStarted = notStarted;
    this.resetCode = resetCode;
  }
}

/** A complete response: its headers, trailers (absent for a trailers-only response) and body. */
export interface UnaryH2Response {
  headers: HeaderField[];
  trailers: HeaderField[] | undefined;
  body: Buffer;
}

/** Where a call's outcome goes (called once). */
export interface UnaryH2Callbacks {
  done(response: UnaryH2Response): void;
  fail(error: UnaryH2Error): void;
}

/** A call in progress; cancel() resets its stream (RST_STREAM CANCEL) and nothing more is reported. */
export interface UnaryH2Call {
  cancel(): void;
}

/** Bounds of the client. */
export interface UnaryH2ClientOptions {
  /** Largest response body (DATA octets) accepted; beyond it the call fails 'too-large' and its stream is reset. */
  maxResponseBytes: number;
}

/** Our SETTINGS: no push, 16 MiB stream windows, header lists up to 64 KiB. */
const STREAM_WINDOW = 16 * 1024 * 1024;
const CONN_WINDOW = 2 ** 30;
const OUR_SETTINGS = settingsFrame([
  [Setting.ENABLE_PUSH, 0],
  [Setting.INITIAL_WINDOW_SIZE, STREAM_WINDOW],
  [Setting.MAX_HEADER_LIST_SIZE, H2_LIMITS.maxHeaderList],
]);
const SETTINGS_ACK = frameBytes(FrameType.SETTINGS, Flag.ACK, 0);
const HELLO = Buffer.concat([CLIENT_PREFACE, OUR_SETTINGS, windowUpdateFrame(0, CONN_WINDOW - 65_535)]);
const NOT_LISTENING = new Set(['ECONNREFUSED', 'ENOENT', 'EACCES', 'ENOTSOCK']);

interface Stream {
  id: number;
  cb: UnaryH2Callbacks;
  headers: HeaderField[] | undefined;
  trailers: HeaderField[] | undefined;
  chunks: Buffer[];
  size: number;
}

interface Pending {
  block: Buffer;
  body: Buffer;
  cb: UnaryH2Callbacks;
  stream: Stream | undefined;
  cancelled: boolean;
}

/** One connection. After GOAWAY or a failure it takes no new calls; the client opens another. */
class Connection {
  readonly #socket: net.Socket;
  readonly #label: string;
  readonly #opts: UnaryH2ClientOptions;
  readonly #reader = new FrameReader(false);
  readonly #blocks = new HeaderBlockCollector();
  readonly #decoder = new HpackDecoder({ maxTableSize: H2_LIMITS.maxTableSize, maxHeaderListSize: H2_LIMITS.maxHeaderList });
  readonly #windows: SendWindows;
  readonly #streams = new Map<number, Stream>();
  readonly #queue: Pending[] = [];
  #nextId = 1;
  /**
   * The server's MAX_CONCURRENT_STREAMS; until a SETTINGS frame carries one, 100 (what nghttp2
   * assumes, and RFC 9113 6.5.2 advises a server to allow at least), so that a burst of calls on a
   * new connection is not refused before the server's SETTINGS arrive.
   */
  #maxConcurrent = 100;
  #connected = false;
  /** Set once no new stream may start here (GOAWAY received, failure, close). */
  #closed = false;
  /** DATA octets read since our last connection WINDOW_UPDATE. */
  #unacked = 0;
  #batch: Buffer[] | undefined;

  constructor(socketPath: string, opts: UnaryH2ClientOptions) {
    this.#label = socketPath;
    this.#opts = opts;
    this.#socket = net.connect(socketPath);
    this.#windows = new SendWindows((b) => this.#out(b));
    this.#socket.setNoDelay?.(true);
    this.#socket.unref();
    this.#socket.write(HELLO);
    this.#socket.on('connect', () => {
      this.#connected = true;
    });
    this.#socket.on('data', (chunk: Buffer) => this.#onData(chunk));
    this.#socket.on('error', (err: NodeJS.ErrnoException) => this.#fail(err));
    this.#socket.on('close', () => this.#fail(undefined));
  }

  /** Whether new calls may start here. */
  get usable(): boolean {
    return !this.#closed;
  }

  /** Closes the connection; calls on it fail as the connection breaking. */
  destroy(): void {
    this.#socket.destroy();
    this.#fail(undefined);
  }

  /** Starts (or queues, beyond the server's MAX_CONCURRENT_STREAMS) one call. */
  call(block: Buffer, body: Buffer, cb: UnaryH2Callbacks): UnaryH2Call {
    const p: Pending = { block, body, cb, stream: undefined, cancelled: false };
    if (this.#streams.size < this.#maxConcurrent) this.#start(p);
    else this.#queue.push(p);
    return { cancel: () => this.#cancel(p) };
  }

  #start(p: Pending): void {
    const id = this.#nextId;
    this.#nextId += 2;
    const s: Stream = { id, cb: p.cb, headers: undefined, trailers: undefined, chunks: [], size: 0 };
    p.stream = s;
    this.#streams.set(id, s);
    this.#windows.open(id);
    // One write: HEADERS (+ CONTINUATION) and the DATA the server's windows take now.
    const batch: Buffer[] = [];
    this.#batch = batch;
    this.#writeHeaders(id, p.block);
    this.#windows.data(id, p.body, true);
    this.#batch = undefined;
    this.#socket.write(batch.length === 1 ? batch[0]! : Buffer.concat(batch));
  }

  /** Writes frames, or collects them while a call's frames are built. */
  #out(octets: Buffer): void {
    if (this.#batch) this.#batch.push(octets);
    else this.#socket.write(octets);
  }

  #writeHeaders(id: number, block: Buffer): void {
    const max = H2_LIMITS.maxFrameSize;
    if (block.length <= max) {
      this.#out(frameBytes(FrameType.HEADERS, Flag.END_HEADERS, id, block));
      return;
    }
    this.#out(frameBytes(FrameType.HEADERS, 0, id, block.subarray(0, max)));
    for (let pos = max; pos < block.length; pos += max) {
      const end = Math.min(pos + max, block.length);
      this.#out(frameBytes(FrameType.CONTINUATION, end === block.length ? Flag.END_HEADERS : 0, id, block.subarray(pos, end)));
    }
  }

  #cancel(p: Pending): void {
    if (p.cancelled) return;
    p.cancelled = true;
    const s = p.stream;
    if (!s) {
      const i = this.#queue.indexOf(p);
      if (i >= 0) this.#queue.splice(i, 1);
      return;
    }
    if (this.#streams.get(s.id) !== s) return;
    this.#end(s);
    if (!this.#socket.destroyed) this.#socket.write(rstStreamFrame(s.id, H2Error.CANCEL));
  }

  /** Forgets a finished stream and starts queued calls in its slot. */
  #end(s: Stream): void {
    this.#streams.delete(s.id);
    this.#windows.close(s.id);
    while (!this.#closed && this.#queue.length > 0 && this.#streams.size < this.#maxConcurrent) this.#start(this.#queue.shift()!);
    // After GOAWAY, the last answer closes the connection.
    if (this.#closed && this.#streams.size === 0 && !this.#socket.destroyed) this.#socket.end();
  }

  #onData(chunk: Buffer): void {
    this.#reader.push(chunk);
    try {
      for (let f = this.#reader.next(); f !== null; f = this.#reader.next()) {
        if (this.#blocks.open && f.type !== FrameType.CONTINUATION) throw new H2InputError(`frame type ${f.type} inside a header block`);
        this.#onFrame(f);
        if (this.#socket.destroyed) return;
      }
    } catch (err) {
      if (!(err instanceof H2InputError || err instanceof HpackError)) throw err;
      const code = err instanceof HpackError ? H2Error.COMPRESSION_ERROR : H2Error.PROTOCOL_ERROR;
      this.#socket.end(goawayFrame(0, code, err.message));
      this.#fail(new Error(`protocol error from the server: ${err.message}`));
    }
  }

  #onFrame(f: Frame): void {
    switch (f.type) {
      case FrameType.DATA: return this.#onDataFrame(f);
      case FrameType.HEADERS:
      case FrameType.CONTINUATION: {
        const h = this.#blocks.take(f);
        if (h === null) return;
        // Decoded even for a stream we reset: the HPACK state is the connection's.
        const fields = this.#decoder.decode(h.block);
        const s = this.#streams.get(h.streamId);
        if (!s) return;
        if (s.headers === undefined) s.headers = fields;
        else s.trailers = fields;
        if (h.endStream) this.#complete(s);
        return;
      }
      case FrameType.RST_STREAM: {
        const s = this.#streams.get(f.streamId);
        const code = u31(f.payload);
        if (!s || code === undefined) return;
        this.#end(s);
        const refused = code === H2Error.REFUSED_STREAM;
        s.cb.fail(new UnaryH2Error('broken', `${this.#label}: stream reset by the server (HTTP/2 error ${code}${refused ? ', REFUSED_STREAM' : ''})`, refused, code));
        return;
      }
      case FrameType.SETTINGS: {
        if (f.flags & Flag.ACK) return;
        for (const [id, v] of applyPeerSettings(f.streamId, f.payload, this.#windows)) {
          if (id === Setting.MAX_CONCURRENT_STREAMS) this.#maxConcurrent = v;
        }
        this.#socket.write(SETTINGS_ACK);
        while (!this.#closed && this.#queue.length > 0 && this.#streams.size < this.#maxConcurrent) this.#start(this.#queue.shift()!);
        return;
      }
      case FrameType.PING:
        if (!(f.flags & Flag.ACK) && f.payload.length === 8) this.#socket.write(frameBytes(FrameType.PING, Flag.ACK, 0, f.payload));
        return;
      case FrameType.GOAWAY: return this.#onGoaway(f);
      case FrameType.WINDOW_UPDATE: {
        const inc = u31(f.payload);
        if (inc === undefined || inc === 0) return;
        if (!this.#windows.update(f.streamId, inc)) throw new H2InputError('WINDOW_UPDATE beyond 2^31-1');
        return;
      }
      case FrameType.PUSH_PROMISE: throw new H2InputError('PUSH_PROMISE although SETTINGS_ENABLE_PUSH is 0');
      default: return; // PRIORITY and unknown types
    }
  }

  #onDataFrame(f: Frame): void {
    this.#unacked += f.payload.length;
    if (this.#unacked >= CONN_WINDOW / 2) {
      this.#socket.write(windowUpdateFrame(0, this.#unacked));
      this.#unacked = 0;
    }
    const s = this.#streams.get(f.streamId);
    if (!s) return;
    const data = dataPayload(f.flags, f.payload);
    if (data === undefined) throw new H2InputError('malformed DATA padding');
    s.size += data.length;
    if (s.size > this.#opts.maxResponseBytes) {
      this.#end(s);
      this.#socket.write(rstStreamFrame(s.id, H2Error.CANCEL));
      s.cb.fail(new UnaryH2Error('too-large', `response larger than ${this.#opts.maxResponseBytes} bytes`, false));
      return;
    }
    if (data.length > 0) s.chunks.push(data);
    if (f.flags & Flag.END_STREAM) this.#complete(s);
  }

  #complete(s: Stream): void {
    this.#end(s);
    const body = s.chunks.length === 1 ? s.chunks[0]! : Buffer.concat(s.chunks, s.size);
    s.cb.done({ headers: s.headers ?? [], trailers: s.trailers, body });
  }

  #onGoaway(f: Frame): void {
    const g = parseGoaway(f.payload);
    if (!g) throw new H2InputError('malformed GOAWAY');
    this.#closed = true;
    const why = `${this.#label}: the server sent GOAWAY (HTTP/2 error ${g.code}${g.debug ? `: ${g.debug}` : ''})`;
    // Streams above last-stream-id were never processed (RFC 9113 6.8): the server did not start them.
    for (const s of [...this.#streams.values()]) {
      if (s.id <= g.lastStreamId) continue;
      this.#streams.delete(s.id);
      this.#windows.close(s.id);
      s.cb.fail(new UnaryH2Error('broken', `${why}; the call was not started`, true));
    }
    for (const p of this.#queue.splice(0)) p.cb.fail(new UnaryH2Error('unreachable', `${why}; the call was not sent`, true));
    if (this.#streams.size === 0) this.#socket.end();
  }

  /** The connection is gone (err: the socket's error, if any): every call on it fails. */
  #fail(err: (Error & { code?: string }) | undefined): void {
    this.#closed = true;
    if (!this.#socket.destroyed && err) this.#socket.destroy();
    const never = !this.#connected;
    const code = err?.code ?? '';
    const unreachable = never || NOT_LISTENING.has(code);
    const why = err ? err.message : 'connection closed without an answer';
    for (const s of [...this.#streams.values()]) {
      this.#streams.delete(s.id);
      this.#windows.close(s.id);
      s.cb.fail(new UnaryH2Error(unreachable ? 'unreachable' : 'broken', `${this.#label}: ${why}`, unreachable));
    }
    for (const p of this.#queue.splice(0)) p.cb.fail(new UnaryH2Error('unreachable', `${this.#label}: ${why}; the call was not sent`, true));
  }
}

/** Unary calls over one connection at a time to a unix socket, opened on demand and again after it breaks. */
export class UnaryH2Client {
  readonly #socketPath: string;
  readonly #opts: UnaryH2ClientOptions;
  #conn: Connection | undefined;

  constructor(socketPath: string, opts: UnaryH2ClientOptions) {
    this.#socketPath = socketPath;
    this.#opts = opts;
  }

  /** Sends a request (its HPACK header block and body); the outcome goes to `cb` once, unless cancelled. */
  call(block: Buffer, body: Buffer, cb: UnaryH2Callbacks): UnaryH2Call {
    let c = this.#conn;
    if (!c || !c.usable) {
      c = new Connection(this.#socketPath, this.#opts);
      this.#conn = c;
    }
    return c.call(block, body, cb);
  }

  /** Closes the connection; calls in flight fail, a later call opens a new one. */
  close(): void {
    const c = this.#conn;
    this.#conn = undefined;
    c?.destroy();
  }
}
