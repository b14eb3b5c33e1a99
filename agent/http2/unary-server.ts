/**
 * A server for unary gRPC calls on our HTTP/2 connection core (the agent serves the shim's
 * connections with it, agent/api/hot-unary.ts): each stream is one request (HEADERS, DATA with one
 * gRPC message, END_STREAM) answered by HEADERS + DATA + trailers, or trailers-only. The
 * connection's rules (preface, SETTINGS, PING, flow control, CONTINUATION, HPACK, GOAWAY, refusing
 * streams beyond SETTINGS_MAX_CONCURRENT_STREAMS with REFUSED_STREAM, which the client knows was
 * not started) are connection.ts's; what is kept here is the calls.
 *
 * Bounded per connection: header blocks and lists (64 KiB), one request's body (maxRequestBytes +
 * the 5-octet gRPC prefix; beyond it RESOURCE_EXHAUSTED), request octets held (the connection
 * window, given back as requests complete), and answers the client does not read (the connection
 * is cut beyond maxBufferedOutput, in the socket or waiting for the client's windows).
 * A drain (close()) sends GOAWAY with the last stream it took, so the client knows every stream
 * above it was not started; calls in flight finish, then the connection closes.
 */
import type { Duplex } from 'node:stream';
import { H2_LIMITS } from './authority.ts';
import { H2Connection, type H2Handler } from './connection.ts';
import type { HeaderField } from './hpack.ts';
import { H2Error, H2InputError, MAX_WINDOW, type Frame } from './wire.ts';
import { BodyReader, encodeFrame, FRAME_PREFIX, framedLimit } from '../grpc/frame.ts';
import { OK_TRAILERS_WITH_MESSAGE_BLOCK, responseHeadersBlock, trailersOnlyBlock } from '../grpc/headers.ts';
import { GrpcCode } from '../grpc/status.ts';
import { channelOf, type ByteChannel } from '../io/lean-socket.ts';

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
  /** Answers with a trailers-only response: grpc-status, grpc-message (`message`'s first 4,096 characters) and `extra` fields. */
  status(code: number, message: string, extra?: readonly HeaderField[]): void;
}

/** grpc-js's content-type, which the agent's answers have always carried. */
const CONTENT_TYPE = 'application/grpc+proto';
const MAX_MESSAGE_CHARS = 4096;

class ServerStream implements UnaryH2Stream {
  readonly streamId: number;
  readonly headers: HeaderField[];
  body: Buffer = Buffer.alloc(0);
  readonly peer: string;
  oncancel: (() => void) | undefined;
  reader: BodyReader;
  /** Request octets received (with padding: what the connection window counts). */
  received = 0;
  /** The client's END_STREAM came. */
  ended = false;
  /** Our answer is queued: nothing more is sent. */
  answered = false;
  readonly #conn: ServerConnection;

  constructor(conn: ServerConnection, streamId: number, headers: HeaderField[], peer: string, maxRequestBytes: number) {
    this.#conn = conn;
    this.reader = new BodyReader(framedLimit(maxRequestBytes));
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
    this.#conn.answer(this, responseHeadersBlock(CONTENT_TYPE), encodeFrame(message));
  }

  status(code: number, message: string, extra?: readonly HeaderField[]): void {
    if (!this.open) return;
    this.answered = true;
    this.#conn.answer(this, trailersOnlyBlock(CONTENT_TYPE, code, message, MAX_MESSAGE_CHARS, extra), undefined);
  }
}

/** One connection's calls. */
class ServerConnection {
  readonly #socket: ByteChannel;
  readonly #h2: H2Connection;
  readonly #limits: Required<UnaryH2ServerLimits>;
  readonly #onCall: (s: UnaryH2Stream) => void;
  readonly #streams = new Map<number, ServerStream>();
  readonly #peer: string;
  /** A drain or the client's GOAWAY: close once every call is answered and written. */
  #leaving = false;
  readonly closed: Promise<void>;

  constructor(socket: Duplex | ByteChannel, limits: Required<UnaryH2ServerLimits>, onCall: (s: UnaryH2Stream) => void) {
    // A socket of the shim's listener comes lean (agent/io/lean-socket.ts); any other stream is read as a stream.
    const ch = channelOf(socket);
    this.#socket = ch;
    this.#limits = limits;
    this.#onCall = onCall;
    this.#peer = ch.remoteAddress ?? 'unix:';
    this.closed = ch.closed;
    this.#h2 = new H2Connection(ch, {
      role: 'server',
      settings: {
        maxConcurrentStreams: limits.maxConcurrentStreams,
        // A stream window that takes a whole request of the largest size: a client never waits for us.
        initialWindowSize: Math.min(MAX_WINDOW, limits.maxRequestBytes + 5 + H2_LIMITS.maxFrameSize),
        maxHeaderListSize: H2_LIMITS.maxHeaderList,
      },
      connectionWindow: limits.maxConnectionWindow,
      maxBufferedOutput: limits.maxBufferedOutput,
      maxHeaderBlock: H2_LIMITS.maxHeaderBlock,
    }).start(this.#handler());
  }

  has(s: ServerStream): boolean {
    return this.#streams.get(s.streamId) === s;
  }

  /** Queues a stream's answer: its header block, then (for a message) DATA within the client's windows and the trailers. */
  answer(s: ServerStream, headers: Buffer, data: Buffer | undefined): void {
    this.#streams.delete(s.streamId);
    const id = s.streamId;
    if (data === undefined) {
      this.#h2.headers(id, headers, true);
    } else {
      this.#h2.headers(id, headers, false);
      this.#h2.data(id, data, false);
      this.#h2.headers(id, OK_TRAILERS_WITH_MESSAGE_BLOCK, true);
    }
    if (!s.ended) {
      // Answered before the whole request came (too large): ask the client to stop sending (RFC 9113 8.1).
      this.#h2.reset(id, H2Error.NO_ERROR);
      this.#h2.consumed(s.received);
      s.reader.take();
    }
    // Answers the client does not read, in the socket or waiting for its windows: bounded.
    if (this.#socket.unsent + this.#h2.queuedData > this.#limits.maxBufferedOutput) this.destroy();
    else this.#maybeFinish();
  }

  /** GOAWAY with the last stream taken; the connection closes once its calls are answered. */
  drain(): void {
    if (this.#h2.closed || this.#h2.goawaySent) return;
    this.#h2.goaway(H2Error.NO_ERROR, 'probe-agent is draining');
    this.#leaving = true;
    this.#maybeFinish();
  }

  destroy(): void {
    this.#h2.destroy();
  }

  #maybeFinish(): void {
    if (this.#leaving && this.#streams.size === 0 && this.#h2.streamCount === 0) this.#h2.end();
  }

  #handler(): H2Handler {
    return {
      headers: (id, fields, endStream, opened) => {
        if (opened) {
          const s = new ServerStream(this, id, fields, this.#peer, this.#limits.maxRequestBytes);
          this.#streams.set(id, s);
          if (endStream) this.#requestDone(s);
          return;
        }
        const s = this.#streams.get(id);
        if (!s) return; // trailers of a stream we already answered
        // Trailers from the client: they must end the request.
        if (!endStream) throw new H2InputError(`second HEADERS on stream ${id} without END_STREAM`);
        this.#requestDone(s);
      },
      data: (id, f, payload, endStream) => this.#data(id, f, payload, endStream),
      reset: (id) => {
        const s = this.#streams.get(id);
        if (!s) return;
        this.#streams.delete(id);
        if (!s.ended) this.#h2.consumed(s.received);
        s.oncancel?.();
        this.#maybeFinish();
      },
      goaway: () => {
        // The client opens no more streams: answer what is open, then close.
        this.#leaving = true;
        this.#maybeFinish();
      },
      idle: () => this.#maybeFinish(),
      closed: () => {
        for (const s of this.#streams.values()) s.oncancel?.();
        this.#streams.clear();
      },
    };
  }

  #data(id: number, f: Frame, payload: Buffer, endStream: boolean): void {
    const s = this.#streams.get(id);
    if (!s) {
      // A stream we answered or reset: its octets are dropped and given back.
      this.#h2.consumed(f.payload.length);
      return;
    }
    s.received += f.payload.length;
    if (!s.reader.add(payload)) {
      s.status(GrpcCode.RESOURCE_EXHAUSTED, `Received message larger than max (${s.reader.size - FRAME_PREFIX} vs. ${this.#limits.maxRequestBytes})`);
      return;
    }
    if (endStream) this.#requestDone(s);
  }

  #requestDone(s: ServerStream): void {
    s.ended = true;
    s.body = s.reader.take();
    this.#h2.consumed(s.received);
    this.#onCall(s);
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
  emit(event: 'connection', socket: Duplex | ByteChannel): boolean {
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
