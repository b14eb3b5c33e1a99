/**
 * A unary-call client on our HTTP/2 connection core (the shim's ProbeService client rides it): one
 * connection to a unix socket, many concurrent streams on it, each one request (HEADERS + DATA,
 * END_STREAM) and one response (HEADERS, DATA, trailers). The connection's rules (SETTINGS, PING,
 * flow control both ways, GOAWAY, CONTINUATION, HPACK) are connection.ts's; what is kept here is
 * what the caller needs to decide whether a failed call may be sent again: a call that never
 * reached the socket, a stream the server refused (REFUSED_STREAM), or a stream above a GOAWAY's
 * last-stream-id was certainly not started (notStarted). When every connection is at the server's
 * SETTINGS_MAX_CONCURRENT_STREAMS another is opened (up to a bound); beyond it, calls wait for a
 * stream to close. Before a connection's stream ids run out (2^31-1) new calls go to a new
 * connection; the old one closes after its last answer.
 *
 * We announce a 16 MiB stream window and a 1 GiB connection window, given back as we read, so the
 * server never waits on us.
 */
import { H2_LIMITS } from './authority.ts';
import { H2Connection, H2ConnectionError, type H2Handler } from './connection.ts';
import type { HeaderField } from './hpack.ts';
import { isInformationalBlock, MAX_1XX_RESPONSES } from './informational.ts';
import { H2Error, type Frame } from './wire.ts';
import { BodyReader } from '../grpc/frame.ts';
import { LeanSocket } from '../io/lean-socket.ts';

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
  /** Connections opened when every open one is at the server's stream cap (default 16). */
  maxConnections?: number;
  /** The first stream id of each connection (default 1): a test reaches the last id fast. */
  firstStreamId?: number;
}

const STREAM_WINDOW = 16 * 1024 * 1024;
const CONN_WINDOW = 2 ** 30;
/**
 * The server's MAX_CONCURRENT_STREAMS until its SETTINGS say: 100 (what nghttp2 assumes, and RFC
 * 9113 6.5.2 advises a server to allow at least), so that a burst of calls on a new connection is
 * not refused before the server's SETTINGS arrive.
 */
const ASSUMED_MAX_STREAMS = 100;
const DEFAULT_MAX_CONNECTIONS = 16;
const NOT_LISTENING = new Set(['ECONNREFUSED', 'ENOENT', 'EACCES', 'ENOTSOCK']);

interface Stream {
  id: number;
  cb: UnaryH2Callbacks;
  headers: HeaderField[] | undefined;
  trailers: HeaderField[] | undefined;
  body: BodyReader;
  /** 1xx heads skipped so far. */
  informational: number;
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
  readonly #h2: H2Connection;
  readonly #label: string;
  readonly #opts: UnaryH2ClientOptions;
  readonly #streams = new Map<number, Stream>();
  readonly #queue: Pending[] = [];
  #connected = false;
  /** Set once no new stream may start here (GOAWAY received, failure, close). */
  #closed = false;

  /** The server's stream cap assumed until its SETTINGS arrive. */
  readonly #assumedMaxStreams: number;

  constructor(socketPath: string, opts: UnaryH2ClientOptions, assumedMaxStreams = ASSUMED_MAX_STREAMS) {
    this.#label = socketPath;
    this.#assumedMaxStreams = assumedMaxStreams;
    this.#opts = opts;
    const lean = LeanSocket.connect(socketPath);
    const socket = lean.socket;
    socket.unref();
    socket.on('connect', () => {
      this.#connected = true;
    });
    this.#h2 = new H2Connection(lean, {
      role: 'client',
      settings: { initialWindowSize: STREAM_WINDOW, maxHeaderListSize: H2_LIMITS.maxHeaderList },
      connectionWindow: CONN_WINDOW,
      ...(opts.firstStreamId === undefined ? {} : { firstStreamId: opts.firstStreamId }),
    }).start(this.#handler());
  }

  /** Whether a new call may go here: every call queued here still gets a stream id before they run out. */
  get usable(): boolean {
    return !this.#closed && this.#h2.streamsLeft > this.#queue.length;
  }

  /** Whether a new call would start now rather than wait for a stream to close. */
  get hasRoom(): boolean {
    return !this.#closed && this.#queue.length === 0 && this.#mayStart();
  }

  /** Calls waiting here for a stream. */
  get waiting(): number {
    return this.#queue.length;
  }

  /** Closes the connection; calls on it fail as the connection breaking. */
  destroy(): void {
    this.#h2.destroy();
  }

  /** Starts (or queues, beyond the server's MAX_CONCURRENT_STREAMS) one call. */
  call(block: Buffer, body: Buffer, cb: UnaryH2Callbacks): UnaryH2Call {
    const p: Pending = { block, body, cb, stream: undefined, cancelled: false };
    if (this.#mayStart()) this.#start(p);
    else this.#queue.push(p);
    return { cancel: () => this.#cancel(p) };
  }

  #mayStart(): boolean {
    return this.#h2.mayStart && (this.#h2.settingsSeen || this.#h2.localStreams < this.#assumedMaxStreams);
  }

  /** The server's SETTINGS_MAX_CONCURRENT_STREAMS once its SETTINGS came. */
  get serverMaxStreams(): number | undefined {
    return this.#h2.settingsSeen ? this.#h2.peer.maxConcurrentStreams : undefined;
  }

  #start(p: Pending): void {
    const id = this.#h2.request(p.block, false);
    const s: Stream = { id, cb: p.cb, headers: undefined, trailers: undefined, body: new BodyReader(this.#opts.maxResponseBytes), informational: 0 };
    p.stream = s;
    this.#streams.set(id, s);
    this.#h2.data(id, p.body, true);
  }

  /** Starts queued calls in the slots free now. */
  #startQueued(): void {
    while (!this.#closed && this.#queue.length > 0 && this.#mayStart()) this.#start(this.#queue.shift()!);
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
    this.#h2.reset(s.id, H2Error.CANCEL);
    this.#end(s);
  }

  /** Forgets a finished stream and starts queued calls in its slot. */
  #end(s: Stream): void {
    this.#streams.delete(s.id);
    // A response complete before our request was all sent: the rest is not wanted.
    if (this.#h2.has(s.id)) this.#h2.reset(s.id, H2Error.CANCEL);
    this.#startQueued();
    // After GOAWAY, or with its stream ids used up, the last answer closes the connection.
    if ((this.#closed || !this.usable) && this.#streams.size === 0 && this.#queue.length === 0) {
      this.#h2.goaway(H2Error.NO_ERROR);
      this.#h2.end();
    }
  }

  #handler(): H2Handler {
    return {
      headers: (id, fields, endStream) => {
        const s = this.#streams.get(id);
        if (!s) return;
        if (s.headers === undefined && isInformationalBlock(fields)) {
          // A 1xx head: the response is still to come; Go's client takes MAX_1XX_RESPONSES of them.
          if (!endStream && ++s.informational <= MAX_1XX_RESPONSES) return;
          this.#h2.reset(id, H2Error.PROTOCOL_ERROR);
          this.#end(s);
          const why = endStream ? 'a 1xx response ended the stream' : `more than ${MAX_1XX_RESPONSES} 1xx informational responses`;
          s.cb.fail(new UnaryH2Error('broken', `${this.#label}: ${why}`, false));
          return;
        }
        if (s.headers === undefined) s.headers = fields;
        else s.trailers = fields;
        if (endStream) this.#complete(s);
      },
      data: (id, f, payload, endStream) => this.#data(id, f, payload, endStream),
      reset: (id, code) => {
        const s = this.#streams.get(id);
        if (!s) return;
        this.#end(s);
        const refused = code === H2Error.REFUSED_STREAM;
        s.cb.fail(new UnaryH2Error('broken', `${this.#label}: stream reset by the server (HTTP/2 error ${code}${refused ? ', REFUSED_STREAM' : ''})`, refused, code));
      },
      settings: () => this.#startQueued(),
      goaway: (lastStreamId, code, debug) => this.#goaway(lastStreamId, code, debug),
      closed: (err) => this.#fail(err),
    };
  }

  #data(id: number, f: Frame, payload: Buffer, endStream: boolean): void {
    const s = this.#streams.get(id);
    this.#h2.consumed(f.payload.length, s ? id : 0);
    if (!s) return;
    if (!s.body.add(payload)) {
      this.#h2.reset(id, H2Error.CANCEL);
      this.#end(s);
      s.cb.fail(new UnaryH2Error('too-large', `response larger than ${this.#opts.maxResponseBytes} bytes`, false));
      return;
    }
    if (endStream) this.#complete(s);
  }

  #complete(s: Stream): void {
    this.#end(s);
    s.cb.done({ headers: s.headers ?? [], trailers: s.trailers, body: s.body.take() });
  }

  #goaway(lastStreamId: number, code: number, debug: string): void {
    this.#closed = true;
    const why = `${this.#label}: the server sent GOAWAY (HTTP/2 error ${code}${debug ? `: ${debug}` : ''})`;
    // Streams above last-stream-id were never processed (RFC 9113 6.8): the server did not start them.
    for (const s of [...this.#streams.values()]) {
      if (s.id <= lastStreamId) continue;
      this.#streams.delete(s.id);
      s.cb.fail(new UnaryH2Error('broken', `${why}; the call was not started`, true));
    }
    for (const p of this.#queue.splice(0)) p.cb.fail(new UnaryH2Error('unreachable', `${why}; the call was not sent`, true));
    if (this.#streams.size === 0) this.#h2.end();
  }

  /** The connection is gone (err: the socket's error, or the server's protocol error): every call on it fails. */
  #fail(err: (Error & { code?: string }) | undefined): void {
    this.#closed = true;
    const unreachable = !this.#connected || NOT_LISTENING.has(err?.code ?? '');
    let why = err ? err.message : 'connection closed without an answer';
    if (err instanceof H2ConnectionError) why = `protocol error from the server: ${why}`;
    for (const s of [...this.#streams.values()]) {
      this.#streams.delete(s.id);
      s.cb.fail(new UnaryH2Error(unreachable ? 'unreachable' : 'broken', `${this.#label}: ${why}`, unreachable));
    }
    for (const p of this.#queue.splice(0)) p.cb.fail(new UnaryH2Error('unreachable', `${this.#label}: ${why}; the call was not sent`, true));
  }
}

/**
 * Unary calls to a unix socket over a few connections, opened on demand and again after they break.
 * A call goes to the first connection with a stream free under the server's
 * SETTINGS_MAX_CONCURRENT_STREAMS; when every connection is full another is opened (up to
 * maxConnections, as grpc-go does when a server's stream cap is reached), so the server's per-tenant
 * admission, not its per-connection stream cap, decides which calls wait. Beyond that a call waits
 * on the connection with the shortest queue until a stream closes or the caller cancels it.
 */
export class UnaryH2Client {
  readonly #socketPath: string;
  readonly #opts: UnaryH2ClientOptions;
  readonly #maxConnections: number;
  #conns: Connection[] = [];

  constructor(socketPath: string, opts: UnaryH2ClientOptions) {
    this.#socketPath = socketPath;
    this.#opts = opts;
    this.#maxConnections = Math.max(1, Math.floor(opts.maxConnections ?? DEFAULT_MAX_CONNECTIONS));
  }

  /** Connections open (usable) now, for tests and metrics. */
  get connections(): number {
    return this.#conns.filter((c) => c.usable).length;
  }

  /** Sends a request (its HPACK header block and body); the outcome goes to `cb` once, unless cancelled. */
  call(block: Buffer, body: Buffer, cb: UnaryH2Callbacks): UnaryH2Call {
    this.#conns = this.#conns.filter((c) => c.usable);
    let pick = this.#conns.find((c) => c.hasRoom);
    if (!pick && this.#conns.length < this.#maxConnections) {
      // The same server: a new connection takes no more streams before its SETTINGS than the others were allowed.
      const known = this.#conns.find((c) => c.serverMaxStreams !== undefined)?.serverMaxStreams;
      pick = new Connection(this.#socketPath, this.#opts, known === undefined ? ASSUMED_MAX_STREAMS : Math.min(ASSUMED_MAX_STREAMS, known));
      this.#conns.push(pick);
    }
    if (!pick) pick = this.#conns.reduce((a, b) => (b.waiting < a.waiting ? b : a));
    return pick.call(block, body, cb);
  }

  /** Closes every connection; calls in flight fail, a later call opens a new one. */
  close(): void {
    const conns = this.#conns;
    this.#conns = [];
    for (const c of conns) c.destroy();
  }
}
