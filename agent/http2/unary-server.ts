/**
 * A hand-written HTTP/2 server for unary gRPC calls (the agent serves the shim's connections with
 * it, agent/api/hot-unary.ts): each stream is one request (HEADERS, DATA with one gRPC message,
 * END_STREAM) answered by HEADERS + DATA + trailers, or trailers-only. No node:http2 stream
 * objects: frames are read with authority.ts's FrameReader, header blocks joined by its
 * HeaderBlockCollector and decoded with our HPACK decoder; answers are literal HPACK.
 *
 * Bounded per connection: header blocks and lists (H2_LIMITS, 64 KiB), one request's body
 * (maxRequestBytes + the 5-octet gRPC prefix; beyond it RESOURCE_EXHAUSTED), concurrent streams
 * (SETTINGS_MAX_CONCURRENT_STREAMS; more are refused with REFUSED_STREAM, which the client knows
 * was not started), request octets held (the connection window, given back as requests complete),
 * and output the client does not read (the connection is cut beyond maxBufferedOutput).
 * A drain (close()) sends GOAWAY with the last stream it took, so the client knows every stream
 * above it was not started; calls in flight finish, then the connection closes.
 */
import type { Duplex } from 'node:stream';
import { FrameReader, H2_LIMITS, HeaderBlockCollector, clientHeaderDecoder } from './authority.ts';
import { encodeLiteralBlock, HpackError, type HeaderField } from './hpack.ts';
import {
  applyPeerSettings, dataPayload, frameBytes, goawayFrame, H2Error, MAX_WINDOW, parseGoaway, rstStreamFrame, SendWindows, Setting, settingsFrame, u31,
  windowUpdateFrame,
  Flag, FrameType, H2InputError, type Frame,
} from './wire.ts';

/** Limits of the server. */
export interface UnaryH2ServerLimits {
  /** Largest gRPC message in a request; a larger one is answered RESOURCE_EXHAUSTED. */
  maxRequestBytes: number;
  /** SETTINGS_MAX_CONCURRENT_STREAMS. */
  maxConcurrentStreams: number;
  /** Request octets a connection may have outstanding (its connection window; default 64 MiB). */
  maxConnectionWindow?: number;
  /** Answer octets a connection may have unwritten before it is cut (default 4 MiB). */
  maxBufferedOutput?: number;
}

/** One call, handed to onCall when its request is complete. */
export interface UnaryH2Stream {
  readonly streamId: number;
  /** The request's header fields, as decoded. */
  readonly headers: HeaderField[];
  /** The request body (all DATA octets). */
  readonly body: Buffer;
  /** The connection's peer, as grpc-js's getPeer() says it for a unix socket. */
  readonly peer: string;
  /** Set when the client reset the stream or the connection closed before the answer. */
  oncancel: (() => void) | undefined;
  /** Whether an answer may still be sent. */
  readonly open: boolean;
  /** Answers with one gRPC message: HEADERS, DATA, trailers grpc-status 0. */
  message(message: Buffer): void;
  /** Answers with a trailers-only response: grpc-status, grpc-message (`message`, already percent-encoded) and `extra` fields. */
  status(code: number, message: string, extra?: readonly HeaderField[]): void;
}

const RESPONSE_HEADERS = encodeLiteralBlock([{ name: ':status', value: '200' }, { name: 'content-type', value: 'application/grpc+proto' }]);
const OK_TRAILERS = encodeLiteralBlock([{ name: 'grpc-status', value: '0' }, { name: 'grpc-message', value: 'OK' }]);
const SETTINGS_ACK = frameBytes(FrameType.SETTINGS, Flag.ACK, 0);
const GRPC_RESOURCE_EXHAUSTED = 8;

/** A header block as HEADERS (+ CONTINUATION) frames. */
function headerFrames(streamId: number, block: Buffer, endStream: boolean): Buffer {
  const max = H2_LIMITS.maxFrameSize;
  const es = endStream ? Flag.END_STREAM : 0;
  if (block.length <= max) return frameBytes(FrameType.HEADERS, es | Flag.END_HEADERS, streamId, block);
  const out = [frameBytes(FrameType.HEADERS, es, streamId, block.subarray(0, max))];
  for (let pos = max; pos < block.length; pos += max) {
    const end = Math.min(pos + max, block.length);
    out.push(frameBytes(FrameType.CONTINUATION, end === block.length ? Flag.END_HEADERS : 0, streamId, block.subarray(pos, end)));
  }
  return Buffer.concat(out);
}

class ServerStream implements UnaryH2Stream {
  readonly streamId: number;
  readonly headers: HeaderField[];
  body: Buffer = Buffer.alloc(0);
  readonly peer: string;
  oncancel: (() => void) | undefined;
  chunks: Buffer[] = [];
  /** Request octets received (with padding: what the connection window counts). */
  received = 0;
  size = 0;
  /** The client's END_STREAM came. */
  ended = false;
  /** Our answer is queued: nothing more is sent. */
  answered = false;
  readonly #conn: ServerConnection;

  constructor(conn: ServerConnection, streamId: number, headers: HeaderField[], peer: string) {
    this.#conn = conn;
    this.streamId = streamId;
    this.headers = headers;
    this.peer = peer;
  }

  get open(): boolean {
    return !this.answered && this.#conn.has(this);
  }

  message(message: Buffer): void {
    if (!this.open) return;
    this.answered = true;
    const framed = Buffer.allocUnsafe(5 + message.length);
    framed[0] = 0;
    framed.writeUInt32BE(message.length, 1);
    message.copy(framed, 5);
    this.#conn.answer(this, headerFrames(this.streamId, RESPONSE_HEADERS, false), framed, headerFrames(this.streamId, OK_TRAILERS, true));
  }

  status(code: number, message: string, extra?: readonly HeaderField[]): void {
    if (!this.open) return;
    this.answered = true;
    const fields: HeaderField[] = [
      { name: ':status', value: '200' },
      { name: 'content-type', value: 'application/grpc+proto' },
      { name: 'grpc-status', value: String(code) },
      { name: 'grpc-message', value: message },
      ...(extra ?? []),
    ];
    this.#conn.answer(this, headerFrames(this.streamId, encodeLiteralBlock(fields), true), undefined, undefined);
  }
}

/** One connection's state. */
class ServerConnection {
  readonly #socket: Duplex;
  readonly #limits: Required<UnaryH2ServerLimits>;
  readonly #onCall: (s: UnaryH2Stream) => void;
  readonly #reader = new FrameReader(true);
  readonly #blocks = new HeaderBlockCollector();
  readonly #decoder = clientHeaderDecoder();
  readonly #windows: SendWindows;
  readonly #streams = new Map<number, ServerStream>();
  readonly #peer: string;
  /** The highest stream the client opened (client streams only grow). */
  #lastStream = 0;
  /** Set by a drain: streams above it are ignored (the GOAWAY told the client they were not started). */
  #goawayLast: number | undefined;
  /** Request octets the client may still send before we give window back. */
  #clientWindow: number;
  /** Octets read whose window is not yet given back. */
  #toReturn = 0;
  #closed = false;
  /** Frames of one answer being built, written together. */
  #batch: Buffer[] | undefined;
  readonly closed: Promise<void>;

  constructor(socket: Duplex, limits: Required<UnaryH2ServerLimits>, onCall: (s: UnaryH2Stream) => void) {
    this.#socket = socket;
    this.#limits = limits;
    this.#onCall = onCall;
    this.#peer = (socket as { remoteAddress?: string }).remoteAddress ?? 'unix:';
    this.#windows = new SendWindows((b) => this.#write(b));
    this.#clientWindow = limits.maxConnectionWindow;
    this.closed = new Promise((resolve) => socket.once('close', () => resolve()));
    socket.on('data', (chunk: Buffer) => this.#onData(chunk));
    socket.on('error', () => this.#onClose());
    socket.on('close', () => this.#onClose());
    // Our SETTINGS: the stream window takes a whole request of the largest size, so a client never waits for us.
    const streamWindow = Math.min(MAX_WINDOW, limits.maxRequestBytes + 5 + H2_LIMITS.maxFrameSize);
    this.#write(Buffer.concat([
      settingsFrame([
        [Setting.MAX_CONCURRENT_STREAMS, limits.maxConcurrentStreams],
        [Setting.INITIAL_WINDOW_SIZE, streamWindow],
        [Setting.MAX_HEADER_LIST_SIZE, H2_LIMITS.maxHeaderList],
        [Setting.ENABLE_PUSH, 0],
      ]),
      windowUpdateFrame(0, limits.maxConnectionWindow - 65_535),
    ]));
    socket.resume();
  }

  has(s: ServerStream): boolean {
    return this.#streams.get(s.streamId) === s;
  }

  get streams(): number {
    return this.#streams.size;
  }

  /** Queues a stream's answer: header frames, then (for a message) DATA within the client's windows and the trailers. */
  answer(s: ServerStream, headers: Buffer, data: Buffer | undefined, trailers: Buffer | undefined): void {
    if (this.#closed) return;
    if (data === undefined) {
      this.#write(headers);
      this.#windows.close(s.streamId);
    } else {
      // One write: HEADERS, the DATA the client's windows take now and (if all of it) the trailers.
      const batch: Buffer[] = [headers];
      this.#batch = batch;
      this.#windows.data(s.streamId, data, true, trailers);
      this.#batch = undefined;
      this.#write(batch.length === 1 ? batch[0]! : Buffer.concat(batch));
    }
    if (!s.ended) {
      // Answered before the whole request came (too large): ask the client to stop sending (RFC 9113 8.1).
      this.#write(rstStreamFrame(s.streamId, H2Error.NO_ERROR));
      this.#giveBack(s.received);
      s.chunks = [];
    }
    this.#streams.delete(s.streamId);
    this.#maybeFinish();
  }

  /** GOAWAY with the last stream taken; the connection closes once its calls are answered. */
  drain(): void {
    if (this.#closed || this.#goawayLast !== undefined) return;
    this.#goawayLast = this.#lastStream;
    this.#write(goawayFrame(this.#lastStream, H2Error.NO_ERROR, 'probe-agent is draining'));
    this.#maybeFinish();
  }

  destroy(): void {
    this.#socket.destroy();
    this.#onClose();
  }

  #maybeFinish(): void {
    if (this.#goawayLast !== undefined && this.#streams.size === 0 && !this.#windows.queued) this.#socket.end();
  }

  #write(octets: Buffer): void {
    if (this.#batch) {
      this.#batch.push(octets);
      return;
    }
    if (this.#closed) return;
    this.#socket.write(octets);
    // Answers the client does not read, in the socket or waiting for its window: bounded.
    if (this.#socket.writableLength + this.#windows.queued > this.#limits.maxBufferedOutput) this.destroy();
  }

  /** A connection error: GOAWAY with the reason, then close. */
  #protocolError(code: number, why: string): void {
    if (this.#closed) return;
    this.#socket.end(goawayFrame(this.#lastStream, code, why));
    this.#onClose();
    // The GOAWAY gets a moment to reach the client; a client that does not close is cut.
    setTimeout(() => this.#socket.destroy(), 1000).unref();
  }

  #onClose(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const s of this.#streams.values()) s.oncancel?.();
    this.#streams.clear();
  }

  #onData(chunk: Buffer): void {
    if (this.#closed) return;
    this.#reader.push(chunk);
    try {
      for (let f = this.#reader.next(); f !== null; f = this.#reader.next()) {
        if (this.#blocks.open && f.type !== FrameType.CONTINUATION) throw new H2InputError(`frame type ${f.type} inside a header block`);
        this.#onFrame(f);
        if (this.#closed) return;
      }
    } catch (err) {
      if (err instanceof HpackError) this.#protocolError(H2Error.COMPRESSION_ERROR, err.message);
      else if (err instanceof H2InputError) this.#protocolError(H2Error.PROTOCOL_ERROR, err.message);
      else throw err;
    }
  }

  #onFrame(f: Frame): void {
    switch (f.type) {
      case FrameType.DATA: return this.#onDataFrame(f);
      case FrameType.HEADERS:
      case FrameType.CONTINUATION: {
        const h = this.#blocks.take(f);
        if (h !== null) this.#onHeaders(h.streamId, this.#decoder.decode(h.block), h.endStream);
        return;
      }
      case FrameType.RST_STREAM: {
        const s = this.#streams.get(f.streamId);
        if (u31(f.payload) === undefined) throw new H2InputError('RST_STREAM of a length other than 4');
        // An answer still waiting for window is dropped too.
        this.#windows.close(f.streamId);
        if (!s) {
          this.#maybeFinish();
          return;
        }
        this.#streams.delete(s.streamId);
        this.#windows.close(s.streamId);
        if (!s.ended) this.#giveBack(s.received);
        s.oncancel?.();
        this.#maybeFinish();
        return;
      }
      case FrameType.SETTINGS: {
        if (f.flags & Flag.ACK) return;
        applyPeerSettings(f.streamId, f.payload, this.#windows);
        this.#write(SETTINGS_ACK);
        return;
      }
      case FrameType.PING:
        if (f.payload.length !== 8 || f.streamId !== 0) throw new H2InputError('malformed PING');
        if (!(f.flags & Flag.ACK)) this.#write(frameBytes(FrameType.PING, Flag.ACK, 0, f.payload));
        return;
      case FrameType.WINDOW_UPDATE: {
        const inc = u31(f.payload);
        if (inc === undefined) throw new H2InputError('WINDOW_UPDATE of a length other than 4');
        if (inc > 0 && !this.#windows.update(f.streamId, inc)) throw new H2InputError('WINDOW_UPDATE beyond 2^31-1');
        this.#maybeFinish();
        return;
      }
      case FrameType.GOAWAY:
        if (!parseGoaway(f.payload)) throw new H2InputError('malformed GOAWAY');
        // The client opens no more streams: answer what is open, then close.
        this.#goawayLast ??= this.#lastStream;
        this.#maybeFinish();
        return;
      case FrameType.PUSH_PROMISE: throw new H2InputError('PUSH_PROMISE from a client');
      default: return; // PRIORITY and unknown types
    }
  }

  #onHeaders(id: number, fields: HeaderField[], endStream: boolean): void {
    const open = this.#streams.get(id);
    if (open) {
      // Trailers from the client: they must end the request.
      if (!endStream) throw new H2InputError(`second HEADERS on stream ${id} without END_STREAM`);
      this.#requestDone(open);
      return;
    }
    if (id % 2 === 0 || id <= this.#lastStream) {
      if (id % 2 === 0 || endStream === false) throw new H2InputError(`HEADERS on stream ${id}, which the client cannot open now`);
      return; // trailers of a stream we already answered or reset
    }
    this.#lastStream = id;
    // Above the GOAWAY we sent: ignored; the client knows it was not started.
    if (this.#goawayLast !== undefined && id > this.#goawayLast) return;
    if (this.#streams.size >= this.#limits.maxConcurrentStreams) {
      this.#write(rstStreamFrame(id, H2Error.REFUSED_STREAM));
      return;
    }
    const s = new ServerStream(this, id, fields, this.#peer);
    this.#streams.set(id, s);
    this.#windows.open(id);
    if (endStream) this.#requestDone(s);
  }

  #onDataFrame(f: Frame): void {
    const n = f.payload.length;
    if (n > this.#clientWindow) throw new H2InputError(`DATA beyond the connection window (${n} > ${this.#clientWindow})`);
    this.#clientWindow -= n;
    const s = this.#streams.get(f.streamId);
    if (!s || s.ended || s.answered) {
      // A stream we answered, reset or never took: its octets are dropped and given back.
      this.#giveBack(n);
      return;
    }
    const data = dataPayload(f.flags, f.payload);
    if (data === undefined) throw new H2InputError('malformed DATA padding');
    s.received += n;
    s.size += data.length;
    if (s.size > this.#limits.maxRequestBytes + 5) {
      s.status(GRPC_RESOURCE_EXHAUSTED, `Received message larger than max (${s.size - 5} vs. ${this.#limits.maxRequestBytes})`);
      return;
    }
    if (data.length > 0) s.chunks.push(data);
    if (f.flags & Flag.END_STREAM) this.#requestDone(s);
  }

  #requestDone(s: ServerStream): void {
    s.ended = true;
    s.body = s.chunks.length === 1 ? s.chunks[0]! : Buffer.concat(s.chunks, s.size);
    s.chunks = [];
    this.#giveBack(s.received);
    this.#onCall(s);
  }

  /**
   * Gives `n` octets of connection window back to the client: in batches, but at once when the
   * client's window runs low (so held requests can never starve the ones that would complete).
   */
  #giveBack(n: number): void {
    this.#toReturn += n;
    if (this.#toReturn === 0) return;
    if (this.#toReturn >= 1024 * 1024 || this.#clientWindow < this.#limits.maxConnectionWindow / 2) {
      this.#clientWindow += this.#toReturn;
      this.#write(windowUpdateFrame(0, this.#toReturn));
      this.#toReturn = 0;
    }
  }
}

/** The server: takes connections (ConnectionTarget-shaped emit), hands complete requests to onCall. */
export class UnaryH2Server {
  readonly #limits: Required<UnaryH2ServerLimits>;
  readonly #onCall: (s: UnaryH2Stream) => void;
  readonly #conns = new Set<ServerConnection>();
  #draining = false;

  constructor(limits: UnaryH2ServerLimits, onCall: (s: UnaryH2Stream) => void) {
    this.#limits = { maxConnectionWindow: 64 * 1024 * 1024, maxBufferedOutput: 4 * 1024 * 1024, ...limits };
    this.#onCall = onCall;
  }

  /** Takes a connection whose octets start with the client preface. */
  emit(event: 'connection', socket: Duplex): boolean {
    if (event !== 'connection') return false;
    const c = new ServerConnection(socket, this.#limits, this.#onCall);
    this.#conns.add(c);
    void c.closed.then(() => this.#conns.delete(c));
    if (this.#draining) c.drain();
    return true;
  }

  /** Connections open now. */
  get connections(): number {
    return this.#conns.size;
  }

  /** GOAWAY on every connection; resolves when all have closed (their calls answered). */
  close(): Promise<void> {
    this.#draining = true;
    for (const c of this.#conns) c.drain();
    return Promise.all([...this.#conns].map((c) => c.closed)).then(() => undefined);
  }

  /** Cuts every connection; calls in flight see their oncancel. */
  destroy(): void {
    this.#draining = true;
    for (const c of this.#conns) c.destroy();
  }
}
