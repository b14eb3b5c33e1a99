/**
 * The shim's frame relay (`--relay frames`): one kubelet connection carried to one runtime
 * connection at the HTTP/2 frame level. Frames are forwarded as they are (read, parse the 9-octet
 * header, rewrite the stream id, write); no node:http2 object exists for a passed-through call.
 * Only ExecSync is looked at: its request is held until complete (at most MAX_BUFFERED_EXEC) and
 * then either answered by the shim (a probe-agent command, through `RelayHost.intercept`) with
 * frames the shim writes itself, or forwarded.
 *
 * Why each piece is as it is:
 *
 * - HPACK. Kubelet's request header blocks are written against its encoder's dynamic table, which
 *   the runtime's decoder mirrors. A held ExecSync whose HEADERS the runtime never sees would desync
 *   that mirror. So the relay decodes every request header block (its own mirror of kubelet's
 *   table) and re-encodes what it forwards with literal representations that neither read nor
 *   change the runtime's table (any SETTINGS_HEADER_TABLE_SIZE the runtime sets is then moot). The
 *   runtime's SETTINGS_HEADER_TABLE_SIZE is clamped to 4096 in passing, the bound our decoder
 *   holds kubelet to. Re-encoding gives the `:authority` fix for kubelet < 1.31 (the socket path)
 *   for free. Response blocks pass unchanged: the runtime's encoder and kubelet's decoder stay in
 *   step because the shim's own answers use static-table names and literals without indexing.
 *
 * - Stream ids. A held ExecSync that is not ours reaches the runtime after later streams may have
 *   opened there, and ids must increase (RFC 9113 5.1.1). So the runtime side has its own counter,
 *   assigned when a stream's HEADERS is forwarded, and every stream-scoped frame (HEADERS,
 *   CONTINUATION, DATA, RST_STREAM, WINDOW_UPDATE, PRIORITY) is renumbered both ways. Intercepted
 *   streams never reach the runtime (a gap in its ids is allowed). After kubelet resets a stream,
 *   a bounded tombstone keeps its ids so that the runtime's in-flight header blocks for it still
 *   reach kubelet's decoder (dropping one would desync kubelet's HPACK table).
 *
 * - Flow control. Runtime to kubelet, the shim is the connection-level endpoint: kubelet's
 *   WINDOW_UPDATE(0) is kept, runtime DATA and the shim's answers go out only within kubelet's
 *   connection window (queued in order otherwise), and the shim grants the runtime its own
 *   connection window (RUNTIME_CONN_WINDOW) as it forwards, so the shim's answers can never make
 *   the runtime overrun kubelet. Kubelet to runtime, the runtime's WINDOW_UPDATE(0) passes through
 *   and the shim adds WINDOW_UPDATE(0) for every kubelet DATA octet it does not forward (an
 *   intercepted request, data on a reset stream): kubelet's view of the window is then never above
 *   the runtime's, and nothing leaks. Stream windows pass through (renumbered) for forwarded streams;
 *   for an intercepted stream the shim keeps kubelet's window itself (SETTINGS_INITIAL_WINDOW_SIZE
 *   read in passing) and splits its answer into frames within it. Window credit kubelet gives a held
 *   stream is replayed if the stream is forwarded. A held request stops being held before it can
 *   exhaust the runtime's initial stream window (kubelet would wait for credit the runtime cannot
 *   give for a stream it has not seen).
 *
 * - CONTINUATION. Request blocks are collected whole and written whole; the shim's own frames to
 *   kubelet wait while a runtime header block is open in the queue.
 *
 * - SETTINGS, PING and their ACKs pass end to end (MAX_FRAME_SIZE clamped to 1 MiB both ways, to
 *   bound one frame in memory). Without a runtime the shim answers them itself.
 *
 * - Failure. The runtime connection failing or sending GOAWAY never kills intercepted calls: the
 *   shim sends kubelet its own GOAWAY (kubelet opens a new connection for new calls), answers
 *   forwarded calls that have no response yet with UNAVAILABLE (as the streams path did; kubelet's
 *   prober and PLEG treat it as a transient error), resets those already answering, lets intercepted
 *   calls finish and then closes. A runtime that refuses the connection: the shim serves the
 *   connection itself, answers ordinary calls UNAVAILABLE ("runtime ... unavailable", as before),
 *   still answers rewritten probes and hooks from the agent, and sends GOAWAY after the first
 *   ordinary call so that kubelet's next call opens a new connection, which tries the runtime
 *   again. Closing kubelet's connection instead would put kubelet's dialer into its reconnect
 *   backoff (up to minutes) and fail rewritten probes that need no runtime at all. Kubelet's
 *   connection closing aborts the intercepted calls (their AbortSignal) and closes the runtime's.
 *
 * - Bounds: frames ≤ 1 MiB, header blocks ≤ 64 KiB (authority.ts), a held request ≤ 64 KiB and all
 *   held requests together within kubelet's connection window (their octets are credited only once
 *   decided), at most MAX_STREAMS streams per connection (more are refused), the queue to kubelet
 *   bounded by RUNTIME_CONN_WINDOW of DATA plus header blocks, 1,024 tombstones, and socket
 *   backpressure both ways.
 */
import * as net from 'node:net';
import {
  authorityAcceptable, clientHeaderDecoder, CLIENT_PREFACE, Flag, frame, FRAME_HEADER, FrameType, H2InputError,
  HeaderBlockCollector, headerFrames, withAcceptableAuthority, type Frame, type HeaderBlock,
} from '../http2/authority.ts';
import { encodeLiteralBlock, HpackError, type HeaderField } from '../http2/hpack.ts';
import { dataPayload, DEFAULT_WINDOW, goawayFrame, H2Error, rstStreamFrame, Setting, windowUpdateFrame } from '../http2/unary-wire.ts';
import { encodeGrpcMessage, grpcFrame } from '../api/protowire.ts';
import { GrpcCode } from '../api/shim-client.ts';
import type { ExecSyncAnswer } from './answer.ts';
import { encodeExecSyncResponse, EXEC_SYNC_PATH } from './exec-sync.ts';

/** What a relay needs from the shim. */
export interface RelayHost {
  readonly runtimeSocket: string;
  /** A complete ExecSync request: the shim's answer, or null when it is not a probe-agent command. */
  intercept(body: Buffer, fields: readonly HeaderField[], signal: AbortSignal): Promise<ExecSyncAnswer> | null;
  /** One call forwarded to the runtime. */
  forwarded(path: string | undefined): void;
  /** One call answered UNAVAILABLE or reset because the runtime was not there. */
  runtimeError(err: Error): void;
  /** Kubelet's connection is not HTTP/2 the relay can carry (closed). */
  refused(err: Error): void;
  /** Kubelet's first request sent an `:authority` that is rewritten on this connection. */
  rewritingAuthority(authority: string | undefined): void;
}

/** ExecSync requests larger than this are not ours (a rewritten command is < 17 KiB) and stream through unread. */
export const MAX_BUFFERED_EXEC = 64 * 1024;
/** The connection window the shim grants the runtime: what it may have queued for kubelet. */
const RUNTIME_CONN_WINDOW = 1 << 20;
/** Live streams per connection (kubelet's own limit is the runtime's MAX_CONCURRENT_STREAMS). */
const MAX_STREAMS = 4096;
/** Kept ids of streams kubelet reset, for the runtime's header blocks in flight. */
const MAX_TOMBSTONES = 1024;
/** Largest frame either side may send through the relay (SETTINGS_MAX_FRAME_SIZE is clamped to it). */
const MAX_FRAME = 1 << 20;
const DEFAULT_FRAME = 16_384;
const MAX_TABLE = 4096;
/** Unacknowledged octets after which a WINDOW_UPDATE goes out on its own. */
const KUBELET_CREDIT_BATCH = 16 * 1024;
const RUNTIME_CREDIT_BATCH = RUNTIME_CONN_WINDOW / 4;

/** One kubelet stream. */
interface RelayStream {
  kid: number;
  /** Runtime-side id once forwarded, else 0. */
  rid: number;
  state: 'held' | 'forwarded' | 'ours';
  path: string | undefined;
  /** Request header fields (held streams, for the forward or the agent call). */
  fields: HeaderField[] | null;
  /** Held: raw DATA frames as received, their flow-controlled octets, and stream credit kubelet gave meanwhile. */
  held: Buffer[];
  heldFlow: number;
  heldCredit: number;
  /** Forwarded: kubelet has ended its side / the runtime has ended its side / the runtime has answered. */
  kubeletDone: boolean;
  runtimeDone: boolean;
  responded: boolean;
  /** Ours: kubelet's stream window for the answer, the call's cancel. */
  window: number;
  cancel: AbortController | null;
}

/** An item queued for kubelet: octets, and how much connection (and own-stream) window its DATA takes. */
interface Outgoing {
  buf: Buffer;
  flow: number;
  own: RelayStream | null;
  /** The last frame of the shim's answer on this stream: the stream is done once it is written. */
  ends?: RelayStream | null;
}

/**
 * Reads frames with a changeable size bound (the peer's SETTINGS_MAX_FRAME_SIZE, clamped). Frames
 * are subarrays of the chunks read; only a frame split across two reads is copied (not the rest of
 * the second read, which a large answer would otherwise copy again on every read).
 */
export class FrameSplitter {
  #buf: Buffer = Buffer.alloc(0);
  /** A split frame completed by push(), returned first. */
  #ready: Buffer | null = null;
  #preface: boolean;
  maxFrame = DEFAULT_FRAME;

  constructor(expectPreface: boolean) {
    this.#preface = !expectPreface;
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

  next(): Frame | null {
    if (this.#ready !== null) {
      const r = this.#ready;
      this.#ready = null;
      return this.#take(r, r.length);
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
    const f = this.#take(b, b.length);
    if (f !== null) this.#buf = b.subarray(f.raw.length);
    return f;
  }

  /** The frame at the start of `b`, or null when it is not complete yet. Throws on an oversized one. */
  #take(b: Buffer, available: number): Frame | null {
    const length = (b[0]! << 16) | (b[1]! << 8) | b[2]!;
    if (length > this.maxFrame) throw new H2InputError(`frame of ${length} octets exceeds SETTINGS_MAX_FRAME_SIZE ${this.maxFrame}`);
    const end = FRAME_HEADER + length;
    if (available < end) return null;
    const raw = b.subarray(0, end);
    return { type: raw[3]!, flags: raw[4]!, streamId: raw.readUInt32BE(5) & 0x7fffffff, payload: raw.subarray(FRAME_HEADER), raw };
  }
}

/** A connection-level failure: the connection is closed with GOAWAY(code). */
class RelayProtocolError extends Error {
  readonly code: number;
  constructor(message: string, code: number = H2Error.PROTOCOL_ERROR) {
    super(message);
    this.code = code;
    this.name = 'RelayProtocolError';
  }
}

function setId(raw: Buffer, id: number): void {
  raw.writeUInt32BE(id, 5);
}

/** Clamps SETTINGS values in place (table size, frame size); returns the entries seen. */
function readSettings(payload: Buffer, clampTable: boolean): Map<number, number> {
  if (payload.length % 6 !== 0) throw new RelayProtocolError('SETTINGS length not a multiple of 6');
  const seen = new Map<number, number>();
  for (let i = 0; i < payload.length; i += 6) {
    const id = payload.readUInt16BE(i);
    let v = payload.readUInt32BE(i + 2);
    if (id === Setting.HEADER_TABLE_SIZE && clampTable && v > MAX_TABLE) payload.writeUInt32BE((v = MAX_TABLE), i + 2);
    if (id === Setting.MAX_FRAME_SIZE && v > MAX_FRAME) payload.writeUInt32BE((v = MAX_FRAME), i + 2);
    seen.set(id, v);
  }
  return seen;
}

/** One kubelet connection and its runtime connection. */
export class FrameRelay {
  readonly #host: RelayHost;
  readonly #k: net.Socket;
  #r: net.Socket | null = null;
  /** 'connecting' → 'up' → 'closing' (its GOAWAY: no new streams) → 'gone'; or 'absent' (refused from the start). */
  #runtime: 'connecting' | 'up' | 'closing' | 'gone' | 'absent' = 'connecting';
  readonly #kReader = new FrameSplitter(true);
  readonly #rReader = new FrameSplitter(false);
  readonly #blocks = new HeaderBlockCollector();
  readonly #decoder = clientHeaderDecoder();
  readonly #streams = new Map<number, RelayStream>();
  readonly #byRid = new Map<number, RelayStream>();
  readonly #tombstones = new Map<number, number>();
  #lastKid = 0;
  #nextRid = 1;
  #firstRequest = true;
  /** Kubelet's receive window for the whole connection, and its initial stream window / frame size. */
  #kWindow = DEFAULT_WINDOW;
  #kInitialWindow = DEFAULT_WINDOW;
  #kMaxFrame = DEFAULT_FRAME;
  /** The runtime's initial stream window (bounds a held request). */
  #rInitialWindow = DEFAULT_WINDOW;
  readonly #queue: Outgoing[] = [];
  #queueHead = 0;
  /** The shim's own frames waiting for a runtime header block in the queue to end. */
  #deferred: Outgoing[] = [];
  #rBlockOpen = false;
  #kCredit = 0;
  #rCredit = 0;
  #toRuntime: Buffer[] = [];
  #settingsForwarded = false;
  /** GOAWAY sent to kubelet: the last stream id it announced, else -1. */
  #goaway = -1;
  #closed = false;
  #destroyed = false;
  #onClose: (() => void) | null = null;

  constructor(kubelet: net.Socket, host: RelayHost) {
    this.#host = host;
    this.#k = kubelet;
    kubelet.pause();
    kubelet.on('error', () => this.#destroy());
    kubelet.on('close', () => this.#destroy());
    kubelet.on('end', () => this.#destroy());
    kubelet.on('data', (c: Buffer) => this.#fromKubelet(c));
    const r = net.connect(host.runtimeSocket);
    this.#r = r;
    r.on('connect', () => {
      this.#runtime = 'up';
      // Kubelet's preface is consumed by the reader; the runtime gets its own copy first.
      this.#toRuntime.push(CLIENT_PREFACE);
      this.#flushRuntime();
      kubelet.resume();
    });
    r.on('error', (err) => this.#runtimeLost(err));
    r.on('close', () => this.#runtimeLost(new Error('connection closed')));
    r.on('end', () => this.#runtimeLost(new Error('connection closed')));
    r.on('data', (c: Buffer) => this.#fromRuntime(c));
  }

  /** Called once when both connections are closed. */
  onClose(fn: () => void): void {
    this.#onClose = fn;
  }

  /** Graceful close: GOAWAY to kubelet, calls in flight finish, then both connections close. */
  drain(): void {
    this.#sendGoaway();
    this.#maybeFinish();
  }

  /** Closes both connections now (intercepted calls are aborted). */
  destroy(): void {
    this.#destroy();
  }

  // ---- kubelet → runtime ----

  #fromKubelet(chunk: Buffer): void {
    if (this.#closed) return;
    try {
      this.#kReader.push(chunk);
      for (let f = this.#kReader.next(); f !== null; f = this.#kReader.next()) this.#kubeletFrame(f);
    } catch (err) {
      this.#fail(err as Error);
      return;
    }
    this.#flushRuntime();
    this.#flushKubelet();
    this.#maybeFinish();
  }

  #kubeletFrame(f: Frame): void {
    if (this.#blocks.open && f.type !== FrameType.CONTINUATION) throw new RelayProtocolError(`frame type ${f.type} inside a header block`);
    switch (f.type) {
      case FrameType.DATA:
        this.#kubeletData(f);
        return;
      case FrameType.HEADERS:
      case FrameType.CONTINUATION: {
        const h = this.#blocks.take(f);
        if (h !== null) this.#kubeletBlock(h);
        return;
      }
      case FrameType.SETTINGS:
        if (f.streamId !== 0) throw new RelayProtocolError('SETTINGS on a stream');
        if (f.flags & Flag.ACK) {
          if (this.#rLive()) this.#toRuntime.push(f.raw);
          return;
        }
        this.#kubeletSettings(readSettings(f.payload, false));
        if (this.#rLive()) {
          this.#toRuntime.push(f.raw);
          if (!this.#settingsForwarded) {
            // The preface's SETTINGS is out: now the runtime may queue a full RUNTIME_CONN_WINDOW for kubelet.
            this.#settingsForwarded = true;
            this.#toRuntime.push(windowUpdateFrame(0, RUNTIME_CONN_WINDOW - DEFAULT_WINDOW));
          }
        } else {
          this.#own(frame(FrameType.SETTINGS, Flag.ACK, 0, Buffer.alloc(0)));
        }
        return;
      case FrameType.PING:
        if (this.#rLive()) this.#toRuntime.push(f.raw);
        else if (!(f.flags & Flag.ACK)) this.#own(frame(FrameType.PING, Flag.ACK, 0, f.payload));
        return;
      case FrameType.GOAWAY:
        // Kubelet is leaving: the runtime learns it too; calls in flight finish.
        if (this.#rLive()) this.#toRuntime.push(f.raw);
        return;
      case FrameType.WINDOW_UPDATE:
        this.#kubeletWindowUpdate(f);
        return;
      case FrameType.RST_STREAM:
        this.#kubeletReset(f);
        return;
      case FrameType.PRIORITY: {
        const s = this.#streams.get(f.streamId);
        if (s && s.rid !== 0 && this.#rLive()) {
          setId(f.raw, s.rid);
          this.#toRuntime.push(f.raw);
        }
        return;
      }
      case FrameType.PUSH_PROMISE:
        throw new RelayProtocolError('PUSH_PROMISE from a client');
      default:
        return; // unknown frame types are ignored (RFC 9113 5.5)
    }
  }

  #kubeletSettings(s: Map<number, number>): void {
    const iw = s.get(Setting.INITIAL_WINDOW_SIZE);
    if (iw !== undefined) {
      const delta = iw - this.#kInitialWindow;
      this.#kInitialWindow = iw;
      for (const st of this.#streams.values()) if (st.state === 'ours') st.window += delta;
    }
    const mf = s.get(Setting.MAX_FRAME_SIZE);
    if (mf !== undefined) {
      this.#kMaxFrame = mf;
      this.#rReader.maxFrame = Math.max(DEFAULT_FRAME, mf);
    }
  }

  #kubeletWindowUpdate(f: Frame): void {
    if (f.payload.length !== 4) throw new RelayProtocolError('WINDOW_UPDATE of the wrong size');
    const inc = f.payload.readUInt32BE(0) & 0x7fffffff;
    if (f.streamId === 0) {
      this.#kWindow += inc;
      return;
    }
    const s = this.#streams.get(f.streamId);
    if (!s) return;
    if (s.state === 'forwarded') {
      if (this.#rLive()) {
        setId(f.raw, s.rid);
        this.#toRuntime.push(f.raw);
      }
    } else if (s.state === 'ours') {
      s.window += inc;
    } else {
      s.heldCredit += inc;
    }
  }

  #kubeletReset(f: Frame): void {
    const s = this.#streams.get(f.streamId);
    if (!s) return;
    this.#streams.delete(s.kid);
    if (s.state === 'forwarded') {
      this.#byRid.delete(s.rid);
      if (!s.runtimeDone) {
        this.#tombstone(s);
        if (this.#rLive()) {
          setId(f.raw, s.rid);
          this.#toRuntime.push(f.raw);
        }
      }
    } else if (s.state === 'ours') {
      s.cancel?.abort();
      s.window = Infinity; // an answer still queued no longer waits for kubelet's credit
    } else {
      this.#creditKubelet(s.heldFlow);
    }
  }

  #tombstone(s: RelayStream): void {
    this.#tombstones.set(s.rid, s.kid);
    if (this.#tombstones.size > MAX_TOMBSTONES) this.#tombstones.delete(this.#tombstones.keys().next().value as number);
  }

  #kubeletData(f: Frame): void {
    const flow = f.payload.length;
    const s = this.#streams.get(f.streamId);
    if (!s || s.state === 'ours') {
      if (!s && f.streamId > this.#lastKid) throw new RelayProtocolError(`DATA on idle stream ${f.streamId}`);
      this.#creditKubelet(flow);
      return;
    }
    const end = (f.flags & Flag.END_STREAM) !== 0;
    if (s.state === 'forwarded') {
      if (!this.#rLive()) {
        this.#creditKubelet(flow);
        return;
      }
      setId(f.raw, s.rid);
      this.#toRuntime.push(f.raw);
      if (end) this.#kubeletEnded(s);
      return;
    }
    s.held.push(f.raw);
    s.heldFlow += flow;
    if (end) this.#decide(s);
    else if (s.heldFlow >= Math.min(MAX_BUFFERED_EXEC, this.#rInitialWindow)) this.#forwardHeld(s);
  }

  #kubeletEnded(s: RelayStream): void {
    s.kubeletDone = true;
    if (s.runtimeDone) this.#forget(s);
  }

  #forget(s: RelayStream): void {
    this.#streams.delete(s.kid);
    if (s.rid !== 0) this.#byRid.delete(s.rid);
  }

  #kubeletBlock(h: HeaderBlock): void {
    let fields: HeaderField[];
    try {
      fields = this.#decoder.decode(h.block);
    } catch (err) {
      if (err instanceof HpackError) throw new RelayProtocolError(`stream ${h.streamId}: ${err.message}`, H2Error.COMPRESSION_ERROR);
      throw err;
    }
    if (h.streamId <= this.#lastKid) {
      // Trailers (gRPC clients send none, but HTTP/2 allows them).
      const s = this.#streams.get(h.streamId);
      if (!s) return;
      if (s.state === 'held') this.#forwardHeld(s);
      if (s.state === 'forwarded' && this.#rLive()) {
        for (const fr of headerFrames({ ...h, streamId: s.rid, block: encodeLiteralBlock(fields) })) this.#toRuntime.push(fr);
        if (h.endStream) this.#kubeletEnded(s);
      }
      return;
    }
    if (h.streamId % 2 === 0) throw new RelayProtocolError(`request on even stream ${h.streamId}`);
    this.#lastKid = h.streamId;
    if (this.#goaway >= 0 && h.streamId > this.#goaway) return; // after our GOAWAY: not processed; the client retries it
    if (this.#firstRequest) {
      this.#firstRequest = false;
      if (!authorityAcceptable(fields)) this.#host.rewritingAuthority(fields.find((x) => x.name === ':authority')?.value);
    }
    fields = withAcceptableAuthority(fields);
    let path: string | undefined;
    for (const x of fields) if (x.name === ':path') path = x.value;
    if (this.#streams.size >= MAX_STREAMS) {
      this.#own(rstStreamFrame(h.streamId, H2Error.REFUSED_STREAM));
      return;
    }
    const s: RelayStream = {
      kid: h.streamId, rid: 0, state: 'held', path, fields, held: [], heldFlow: 0, heldCredit: 0,
      kubeletDone: h.endStream, runtimeDone: false, responded: false, window: 0, cancel: null,
    };
    this.#streams.set(s.kid, s);
    if (path === EXEC_SYNC_PATH && !h.endStream) return; // held until its request is complete
    // A priority signal would name kubelet's stream ids: dropped (advisory; gRPC sends none).
    this.#forwardHeld(s);
  }

  /**
   * Forwards a stream's HEADERS (and held DATA) to the runtime under a new runtime id, or answers it
   * UNAVAILABLE when there is no runtime to take it.
   */
  #forwardHeld(s: RelayStream): void {
    const fields = s.fields!;
    s.fields = null;
    if (!this.#runtimeUp()) {
      this.#creditKubelet(s.heldFlow);
      s.held = [];
      this.#answerUnavailable(s, new Error(this.#runtime === 'absent' ? 'connection refused' : 'connection closed'));
      if (this.#runtime === 'absent') this.#sendGoaway();
      return;
    }
    s.state = 'forwarded';
    s.rid = this.#nextRid;
    this.#nextRid += 2;
    this.#byRid.set(s.rid, s);
    this.#host.forwarded(s.path);
    const endStream = s.kubeletDone && s.held.length === 0;
    for (const fr of headerFrames({ streamId: s.rid, endStream, priority: null, block: encodeLiteralBlock(fields) })) this.#toRuntime.push(fr);
    for (const raw of s.held) {
      setId(raw, s.rid);
      this.#toRuntime.push(raw);
    }
    s.held = [];
    if (s.heldCredit > 0) this.#toRuntime.push(windowUpdateFrame(s.rid, s.heldCredit));
  }

  /** A held ExecSync is complete: the shim's or the runtime's. */
  #decide(s: RelayStream): void {
    s.kubeletDone = true;
    const body = Buffer.concat(s.held.map((raw) => {
      const payload = dataPayload(raw[4]!, raw.subarray(FRAME_HEADER));
      if (payload === undefined) throw new RelayProtocolError('DATA padding longer than the frame');
      return payload;
    }));
    const cancel = new AbortController();
    const pending = this.#host.intercept(body, s.fields!, cancel.signal);
    if (pending === null) {
      this.#forwardHeld(s);
      return;
    }
    s.state = 'ours';
    s.fields = null;
    s.held = [];
    s.cancel = cancel;
    s.window = this.#kInitialWindow + s.heldCredit;
    this.#creditKubelet(s.heldFlow);
    pending.then(
      (answer) => this.#answer(s, answer),
      (err: Error) => this.#answer(s, { kind: 'error', grpcCode: GrpcCode.INTERNAL, message: `probe-agent shim: ${err.message}` }),
    );
  }

  #answer(s: RelayStream, answer: ExecSyncAnswer): void {
    s.cancel = null;
    if (this.#closed || this.#streams.get(s.kid) !== s) return; // kubelet reset it or went away
    if (answer.kind === 'error') {
      this.#ownItems(this.#trailersOnly(s.kid, answer.grpcCode, answer.message).map((buf, i, all) => ({ buf, flow: 0, own: null, ends: i === all.length - 1 ? s : null })));
    } else {
      const head = headerFrames({ streamId: s.kid, endStream: false, priority: null, block: encodeLiteralBlock([{ name: ':status', value: '200' }, { name: 'content-type', value: 'application/grpc' }]) });
      const body = grpcFrame(encodeExecSyncResponse(answer.exitCode, answer.stdout));
      const data: Outgoing[] = [];
      for (let pos = 0; pos < body.length; pos += this.#kMaxFrame) {
        const part = body.subarray(pos, Math.min(body.length, pos + this.#kMaxFrame));
        data.push({ buf: frame(FrameType.DATA, 0, s.kid, part), flow: part.length, own: s });
      }
      const tail = headerFrames({ streamId: s.kid, endStream: true, priority: null, block: encodeLiteralBlock([{ name: 'grpc-status', value: '0' }]) });
      // The stream stays known (kubelet's WINDOW_UPDATEs for it count) until its trailers are written.
      this.#ownItems([...head.map((buf) => ({ buf, flow: 0, own: null })), ...data, ...tail.map((buf, i) => ({ buf, flow: 0, own: null, ends: i === tail.length - 1 ? s : null }))]);
    }
    this.#flushKubelet();
    this.#maybeFinish();
  }

  #trailersOnly(kid: number, code: number, message: string): Buffer[] {
    return headerFrames({
      streamId: kid, endStream: true, priority: null,
      block: encodeLiteralBlock([
        { name: ':status', value: '200' }, { name: 'content-type', value: 'application/grpc' },
        { name: 'grpc-status', value: String(code) }, { name: 'grpc-message', value: encodeGrpcMessage(message.slice(0, 1024)) },
      ]),
    });
  }

  #answerUnavailable(s: RelayStream, err: Error): void {
    this.#forget(s);
    this.#host.runtimeError(err);
    this.#own(...this.#trailersOnly(s.kid, GrpcCode.UNAVAILABLE, `probe-agent shim: runtime ${this.#host.runtimeSocket} unavailable: ${err.message}`));
  }

  // ---- runtime → kubelet ----

  #fromRuntime(chunk: Buffer): void {
    if (this.#closed) return;
    try {
      this.#rReader.push(chunk);
      for (let f = this.#rReader.next(); f !== null; f = this.#rReader.next()) this.#runtimeFrame(f);
    } catch (err) {
      // The runtime broke HTTP/2: as if its connection died.
      this.#r?.destroy();
      this.#runtimeLost(err as Error);
    }
    this.#flushKubelet();
    this.#flushRuntime();
    this.#maybeFinish();
  }

  #runtimeFrame(f: Frame): void {
    switch (f.type) {
      case FrameType.DATA: {
        const s = this.#byRid.get(f.streamId);
        if (!s) {
          this.#creditRuntime(f.payload.length);
          return;
        }
        setId(f.raw, s.kid);
        this.#queue.push({ buf: f.raw, flow: f.payload.length, own: null });
        if (f.flags & Flag.END_STREAM) this.#runtimeEnded(s);
        return;
      }
      case FrameType.HEADERS:
      case FrameType.CONTINUATION: {
        const s = this.#byRid.get(f.streamId);
        const kid = s ? s.kid : this.#tombstones.get(f.streamId);
        // A header block kubelet's decoder never sees would desync it: the connection cannot go on.
        if (kid === undefined) throw new RelayProtocolError(`runtime header block on unknown stream ${f.streamId}`);
        setId(f.raw, kid);
        this.#queue.push({ buf: f.raw, flow: 0, own: null });
        this.#rBlockOpen = (f.flags & Flag.END_HEADERS) === 0;
        if (s && f.type === FrameType.HEADERS) {
          s.responded = true;
          if (f.flags & Flag.END_STREAM) this.#runtimeEnded(s);
        }
        if (!this.#rBlockOpen && this.#deferred.length > 0) {
          for (const o of this.#deferred) this.#queue.push(o);
          this.#deferred = [];
        }
        return;
      }
      case FrameType.RST_STREAM: {
        const s = this.#byRid.get(f.streamId);
        if (!s) return;
        this.#forget(s);
        setId(f.raw, s.kid);
        this.#queue.push({ buf: f.raw, flow: 0, own: null });
        return;
      }
      case FrameType.WINDOW_UPDATE: {
        if (f.streamId === 0) {
          this.#queue.push({ buf: f.raw, flow: 0, own: null });
          return;
        }
        const s = this.#byRid.get(f.streamId);
        if (!s) return;
        setId(f.raw, s.kid);
        this.#queue.push({ buf: f.raw, flow: 0, own: null });
        return;
      }
      case FrameType.SETTINGS:
        if (!(f.flags & Flag.ACK)) {
          const s = readSettings(f.payload, true);
          const iw = s.get(Setting.INITIAL_WINDOW_SIZE);
          if (iw !== undefined) this.#rInitialWindow = iw;
          const mf = s.get(Setting.MAX_FRAME_SIZE);
          if (mf !== undefined) this.#kReader.maxFrame = Math.max(DEFAULT_FRAME, mf);
        }
        this.#queue.push({ buf: f.raw, flow: 0, own: null });
        return;
      case FrameType.PING:
        this.#queue.push({ buf: f.raw, flow: 0, own: null });
        return;
      case FrameType.GOAWAY: {
        if (f.payload.length < 8) throw new RelayProtocolError('short GOAWAY');
        this.#runtimeGoaway(f.payload.readUInt32BE(0) & 0x7fffffff);
        return;
      }
      case FrameType.PUSH_PROMISE:
        throw new RelayProtocolError('PUSH_PROMISE from the runtime');
      default:
        return;
    }
  }

  #runtimeEnded(s: RelayStream): void {
    // Done either way: kubelet's later DATA on it (if it had not ended its side) is dropped and credited.
    s.runtimeDone = true;
    this.#forget(s);
  }

  /** The runtime sent GOAWAY: streams it will not process are refused to kubelet, new calls go elsewhere. */
  #runtimeGoaway(lastRid: number): void {
    if (this.#runtime !== 'up') return;
    this.#runtime = 'closing';
    for (const s of [...this.#byRid.values()]) {
      if (s.rid <= lastRid) continue;
      this.#forget(s);
      this.#queue.push({ buf: rstStreamFrame(s.kid, H2Error.REFUSED_STREAM), flow: 0, own: null });
    }
    this.#sendGoaway();
  }

  /** The runtime connection is gone (or never came): forwarded calls fail, intercepted ones go on. */
  #runtimeLost(err: Error): void {
    if (this.#closed) return;
    const before = this.#runtime;
    if (before === 'absent') return;
    if (before === 'connecting') {
      this.#runtime = 'absent';
      this.#r = null;
      // The shim is the server on this connection now.
      this.#own(frame(FrameType.SETTINGS, 0, 0, Buffer.alloc(0)));
      this.#flushKubelet();
      this.#k.resume();
      return;
    }
    if (this.#r === null) return;
    this.#runtime = 'gone';
    const r = this.#r;
    this.#r = null;
    r.destroy();
    if (this.#rBlockOpen) {
      // Kubelet's decoder waits for the rest of a block that will never come.
      this.#destroy();
      return;
    }
    for (const s of [...this.#byRid.values()]) {
      if (s.responded) {
        this.#forget(s);
        this.#host.runtimeError(err);
        this.#own(rstStreamFrame(s.kid, H2Error.INTERNAL_ERROR));
      } else {
        this.#answerUnavailable(s, err);
      }
    }
    this.#tombstones.clear();
    this.#sendGoaway();
    this.#flushKubelet();
    this.#maybeFinish();
  }

  // ---- output ----

  /** Whether new streams may go to the runtime. */
  #runtimeUp(): boolean {
    return this.#runtime === 'up';
  }

  /** Whether frames of streams already there may go to the runtime (up, or closing after its GOAWAY). */
  #rLive(): boolean {
    return this.#r !== null && (this.#runtime === 'up' || this.#runtime === 'closing');
  }

  /** Queues the shim's own frames for kubelet (never inside a runtime header block). */
  #own(...bufs: Buffer[]): void {
    this.#ownItems(bufs.map((buf) => ({ buf, flow: 0, own: null })));
  }

  #ownItems(items: Outgoing[]): void {
    if (this.#rBlockOpen) this.#deferred.push(...items);
    else for (const o of items) this.#queue.push(o);
  }

  #creditKubelet(n: number): void {
    this.#kCredit += n;
  }

  #creditRuntime(n: number): void {
    this.#rCredit += n;
  }

  #flushKubelet(): void {
    if (this.#closed) return;
    const out: Buffer[] = [];
    const q = this.#queue;
    let i = this.#queueHead;
    for (; i < q.length; i++) {
      const o = q[i]!;
      if (o.flow > 0) {
        if (o.flow > this.#kWindow || (o.own !== null && o.flow > o.own.window)) break;
        this.#kWindow -= o.flow;
        if (o.own !== null) o.own.window -= o.flow;
        else this.#rCredit += o.flow;
      }
      out.push(o.buf);
      if (o.ends && this.#streams.get(o.ends.kid) === o.ends) this.#streams.delete(o.ends.kid);
    }
    // A WINDOW_UPDATE may not follow the first frames of a header block whose end is not yet here.
    const insideBlock = this.#rBlockOpen && i === q.length;
    if (i === q.length) {
      q.length = 0;
      this.#queueHead = 0;
    } else if (i > 1024) {
      q.splice(0, i);
      this.#queueHead = 0;
    } else {
      this.#queueHead = i;
    }
    if (this.#kCredit > 0 && (out.length > 0 || this.#kCredit >= KUBELET_CREDIT_BATCH) && !insideBlock) {
      out.push(windowUpdateFrame(0, this.#kCredit));
      this.#kCredit = 0;
    }
    if (out.length > 0) this.#write(this.#k, out);
    if (this.#rCredit >= RUNTIME_CREDIT_BATCH || (this.#rCredit > 0 && this.#toRuntime.length > 0)) this.#flushRuntime();
  }

  #flushRuntime(): void {
    const r = this.#r;
    if (r === null || this.#runtime === 'connecting' || this.#closed) return;
    // Credit rides along with other frames, or goes alone once a quarter of the grant is used:
    // a WINDOW_UPDATE of its own per answer would be a system call (and a wakeup of the runtime).
    if (this.#rCredit > 0 && this.#rLive() && this.#settingsForwarded && (this.#toRuntime.length > 0 || this.#rCredit >= RUNTIME_CREDIT_BATCH)) {
      this.#toRuntime.push(windowUpdateFrame(0, this.#rCredit));
      this.#rCredit = 0;
    }
    if (this.#toRuntime.length === 0) return;
    const out = this.#toRuntime;
    this.#toRuntime = [];
    if (this.#rLive()) this.#write(r, out);
  }

  #write(socket: net.Socket, out: Buffer[]): void {
    if (socket.destroyed) return;
    // Frames forwarded from one read lie back to back in its buffer (ids rewritten in place): one
    // subarray covers them, so a large answer is written without a copy.
    let merged = 0;
    for (let i = 1; i < out.length; i++) {
      const a = out[merged]!;
      const b = out[i]!;
      if (a.buffer === b.buffer && a.byteOffset + a.length === b.byteOffset) out[merged] = Buffer.from(a.buffer, a.byteOffset, a.length + b.length);
      else out[++merged] = b;
    }
    out.length = merged + 1;
    const ok = socket.write(out.length === 1 ? out[0]! : Buffer.concat(out));
    if (!ok) {
      // Backpressure: stop reading the side that feeds this socket until it drains.
      const feeder = socket === this.#k ? this.#r : this.#k;
      if (feeder && !feeder.isPaused()) {
        feeder.pause();
        socket.once('drain', () => {
          if (!this.#closed) feeder.resume();
        });
      }
    }
  }

  #sendGoaway(): void {
    if (this.#goaway >= 0 || this.#closed) return;
    this.#goaway = this.#lastKid;
    this.#own(goawayFrame(this.#lastKid, H2Error.NO_ERROR));
    this.#flushKubelet();
  }

  /** After GOAWAY, the connections close once no stream is left and kubelet has everything. */
  #maybeFinish(): void {
    if (this.#closed || this.#goaway < 0) return;
    if (this.#streams.size > 0) return;
    if (this.#queue.length > this.#queueHead || this.#deferred.length > 0) return;
    this.#closed = true;
    this.#r?.end();
    this.#k.end();
    setTimeout(() => this.#destroy(), 1000).unref();
  }

  #fail(err: Error): void {
    if (err instanceof H2InputError && !this.#settingsForwarded && this.#lastKid === 0) {
      this.#host.refused(err);
    } else if (!(err instanceof H2InputError) && !(err instanceof RelayProtocolError)) {
      this.#host.refused(new H2InputError(`unexpected: ${err.message}`));
    }
    const code = err instanceof RelayProtocolError ? err.code : H2Error.PROTOCOL_ERROR;
    if (!this.#k.destroyed && !this.#rBlockOpen) this.#k.write(goawayFrame(this.#lastKid, code));
    this.#destroy();
  }

  #destroy(): void {
    if (this.#destroyed) return;
    this.#destroyed = true;
    this.#closed = true;
    for (const s of this.#streams.values()) s.cancel?.abort();
    this.#streams.clear();
    this.#byRid.clear();
    this.#r?.destroy();
    this.#k.destroy();
    if (this.#onClose) {
      const fn = this.#onClose;
      this.#onClose = null;
      fn();
    }
  }
}
