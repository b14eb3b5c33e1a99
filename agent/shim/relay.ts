/**
 * The shim's relay: one kubelet connection carried to one runtime connection. Each side is an
 * HTTP/2 endpoint of its own (agent/http2/connection.ts): connection-level frames (SETTINGS, PING,
 * WINDOW_UPDATE on stream 0, GOAWAY) end at each hop and are never forwarded; stream frames are,
 * under the other side's stream ids. Forwarding kubelet's PINGs would make the runtime's gRPC
 * server count strikes against pings it never earned with data (the shim answers rewritten probes
 * itself) and close the connection with GOAWAY "too_many_pings".
 *
 * - Streams. Kubelet's request HEADERS are decoded (this side's HPACK state) and sent on a new
 *   runtime stream as literals. The runtime's HEADERS go back as they came: the shim tells the
 *   runtime its HPACK table holds nothing (SETTINGS_HEADER_TABLE_SIZE 0), so its blocks read no
 *   state and mean the same to kubelet; a block that does read some (the table size update that
 *   opens a connection) is sent as literals. The shim's own blocks never touch kubelet's table. DATA frames are passed as
 *   received (their id rewritten in place). RST_STREAM and stream WINDOW_UPDATEs pass both ways.
 * - Flow control. Stream windows match on both hops: each side advertises the other side's
 *   SETTINGS_INITIAL_WINDOW_SIZE (mirrored as it changes) and stream WINDOW_UPDATEs are passed on,
 *   so neither peer may send a stream more than the far end allows. Connection windows are each
 *   hop's own: DATA is credited back to its sender only once it has been written to the other
 *   side, so what the shim holds for a connection is bounded by the windows it grants.
 * - ExecSync. Its HEADERS wait for the first DATA: argv[0] (within the first hundred octets)
 *   says whether it is a probe-agent command. Every other call, and every other ExecSync, goes to
 *   the runtime at once. Ours is read to its end (bounded) and answered by `RelayHost.intercept`:
 *   the agent's ExecSyncResponse bytes as they came, or a status the shim writes itself.
 * - Failure. The runtime's GOAWAY refuses the streams above its last id to kubelet (REFUSED_STREAM,
 *   which gRPC retries) and sends kubelet a GOAWAY of the shim's, so kubelet's next call opens a
 *   connection that gets a runtime connection of its own. A lost runtime fails forwarded calls
 *   (UNAVAILABLE, or a reset once answering began); intercepted calls finish. A runtime that
 *   refuses the connection: the shim serves the connection itself, answers ordinary calls
 *   UNAVAILABLE and rewritten probes from the agent, and sends GOAWAY after the first ordinary call
 *   so that kubelet's next call tries the runtime again (closing the connection instead would put
 *   kubelet's dialer into its reconnect backoff). Kubelet's connection closing aborts intercepted
 *   calls and closes the runtime's.
 */
import type { Duplex } from 'node:stream';
import { authorityAcceptable, withAcceptableAuthority } from '../http2/authority.ts';
import { H2Connection, H2ConnectionError, type H2Handler, type H2Settings } from '../http2/connection.ts';
import type { HeaderField } from '../http2/hpack.ts';
import { dataPayload, FRAME_HEADER, H2Error, type Frame } from '../http2/wire.ts';
import { framedLimit } from '../grpc/frame.ts';
import { OK_TRAILERS_BLOCK, responseHeadersBlock, trailersOnlyBlock } from '../grpc/headers.ts';
import { GrpcCode } from '../grpc/status.ts';
import type { ExecSyncAnswer } from './answer.ts';
import { classifyExecSyncPrefix, EXEC_SYNC_PATH } from './exec-sync.ts';
import { keep, LeanSocket, type ByteChannel } from '../io/lean-socket.ts';

/** What a relay needs from the shim. */
export interface RelayHost {
  readonly runtimeSocket: string;
  /** A complete probe-agent ExecSync request (gRPC-framed): the shim's answer, or null when it is not one after all. */
  intercept(body: Buffer, fields: readonly HeaderField[], signal: AbortSignal): Promise<ExecSyncAnswer> | null;
  /** One call forwarded to the runtime. */
  forwarded(path: string | undefined): void;
  /** Kubelet started a call on this connection (whatever becomes of it). */
  called?(): void;
  /** One call answered UNAVAILABLE or reset because the runtime was not there. */
  runtimeError(err: Error): void;
  /** Kubelet's connection is not HTTP/2 the relay can carry (closed). */
  refused(err: Error): void;
  /** Kubelet's first request sent an `:authority` that is rewritten on this connection. */
  rewritingAuthority(authority: string | undefined): void;
  /** The runtime closed its connection with an error GOAWAY (e.g. ENHANCE_YOUR_CALM "too_many_pings"). */
  runtimeGoaway?(code: number, debug: string): void;
}

/** A probe-agent ExecSync body larger than this is refused (a rewritten command is < 17 KiB). */
export const MAX_BUFFERED_EXEC = 64 * 1024;
/**
 * What reading one ExecSync may cost: its DATA frames' octets as sent (padding included) and 9 per
 * frame, so that empty or padded frames count. A whole request of the largest size in 16 KiB
 * frames is far below it.
 */
const MAX_EXEC_COST = framedLimit(MAX_BUFFERED_EXEC) + 1024;
/** What an ExecSync's first DATA may cost (as above) before "ours or not" must be decided (argv[0] is near the start). */
const MAX_UNDECIDED = 4096;
/** Connection windows each side grants: what the shim may hold for one connection, each way. */
const CONN_WINDOW = 1 << 20;
/** Live streams per kubelet connection (lower when the runtime says so). */
const MAX_STREAMS = 4096;
const HEADER_LIST = 64 * 1024;

/** One kubelet stream. */
interface RelayStream {
  kid: number;
  /** Runtime-side id once forwarded, else 0. */
  rid: number;
  state: 'held' | 'forwarded' | 'ours';
  path: string | undefined;
  /** Request header fields (held streams, for the forward or the agent call). */
  fields: HeaderField[] | null;
  /** Held: DATA frames as received. Ours: their payloads (non-empty copies). Octets of connection window they took. */
  held: Frame[];
  payloads: Buffer[];
  size: number;
  heldFlow: number;
  /** Held or ours: what its DATA frames cost (octets as sent, padding included, and 9 per frame). */
  cost: number;
  /** Held: the payload octets so far, in one buffer (classified again only when octets come). */
  prefix: Buffer | null;
  /** Held: stream credit kubelet gave meanwhile, replayed to the runtime if forwarded. */
  heldCredit: number;
  kubeletDone: boolean;
  responded: boolean;
  cancel: AbortController | null;
}

/** One kubelet connection and its runtime connection. */
export class FrameRelay {
  readonly #host: RelayHost;
  readonly #k: H2Connection;
  #r: H2Connection | null = null;
  /** 'connecting' → 'up' → 'closing' (its GOAWAY) → 'gone'; or 'absent' (refused from the start). */
  #runtime: 'none' | 'connecting' | 'up' | 'closing' | 'gone' | 'absent' = 'none';
  readonly #streams = new Map<number, RelayStream>();
  readonly #byRid = new Map<number, RelayStream>();
  #firstRequest = true;
  #kubeletLeaving = false;
  #closed = false;
  #onClose: (() => void) | null = null;

  constructor(kubelet: Duplex | ByteChannel, host: RelayHost) {
    this.#host = host;
    this.#k = new H2Connection(kubelet, {
      role: 'server',
      settings: { maxConcurrentStreams: MAX_STREAMS, maxHeaderListSize: HEADER_LIST },
      connectionWindow: CONN_WINDOW,
    });
    this.#k.start(this.#kubeletSide());
  }

  /** Called once when both connections are closed. */
  onClose(fn: () => void): void {
    if (this.#closed) fn();
    else this.#onClose = fn;
  }

  /** Graceful close: GOAWAY to kubelet, calls in flight finish, then both connections close. */
  drain(): void {
    this.#k.goaway(H2Error.NO_ERROR, 'probe-agent shim is stopping');
    this.#maybeFinish();
  }

  /** Closes both connections now (intercepted calls are aborted). */
  destroy(): void {
    // Finished first: the runtime side closing now is not a runtime failure to report.
    this.#finish();
    this.#k.destroy();
    this.#r?.destroy();
  }

  // ---- the runtime connection ----

  #connectRuntime(initialWindowSize: number): void {
    this.#runtime = 'connecting';
    const lean = LeanSocket.connect(this.#host.runtimeSocket);
    lean.socket.once('connect', () => {
      if (this.#runtime === 'connecting') this.#runtime = 'up';
    });
    this.#r = new H2Connection(lean, {
      role: 'client',
      // No HPACK table for the runtime's encoder: its blocks can then be passed on verbatim.
      settings: { initialWindowSize, maxHeaderListSize: HEADER_LIST, headerTableSize: 0 },
      connectionWindow: CONN_WINDOW,
    });
    this.#r.start(this.#runtimeSide());
  }

  #runtimeSide(): H2Handler {
    return {
      headers: (rid, fields, endStream, _opened, verbatim) => {
        const s = this.#byRid.get(rid);
        if (!s) return;
        s.responded = true;
        this.#k.headers(s.kid, verbatim ?? fields, endStream);
        if (endStream) this.#runtimeEnded(s);
      },
      data: (rid, f, payload, endStream) => {
        const s = this.#byRid.get(rid);
        if (!s) {
          this.#r!.consumed(f.payload.length);
          return;
        }
        this.#k.data(s.kid, payload, endStream, this.#r, f.payload.length, f.raw);
        if (endStream) this.#runtimeEnded(s);
      },
      reset: (rid, code) => {
        const s = this.#byRid.get(rid);
        if (!s) return;
        this.#forget(s);
        this.#k.reset(s.kid, code);
        this.#maybeFinish();
      },
      windowUpdate: (rid, inc) => {
        const s = this.#byRid.get(rid);
        if (s) this.#k.windowUpdate(s.kid, inc);
      },
      settings: (values) => this.#mirror(this.#k, values),
      goaway: (lastRid, code, debug) => this.#runtimeGoaway(lastRid, code, debug),
      closed: (err) => this.#runtimeClosed(err),
    };
  }

  /** Advertises to `to` what the other side's peer allows, so stream windows match on both hops. */
  #mirror(to: H2Connection, values: ReadonlyMap<keyof H2Settings, number>): void {
    const change: Partial<H2Settings> = {};
    const iw = values.get('initialWindowSize');
    if (iw !== undefined) change.initialWindowSize = iw;
    const mcs = values.get('maxConcurrentStreams');
    if (mcs !== undefined && to === this.#k) change.maxConcurrentStreams = Math.min(mcs, MAX_STREAMS);
    to.updateSettings(change);
  }

  #runtimeEnded(s: RelayStream): void {
    // Kubelet's later DATA on it (if it had not ended its side) is dropped by the kubelet side.
    this.#forget(s);
    this.#maybeFinish();
  }

  /** The runtime's GOAWAY: streams it will not process are refused to kubelet, new calls go elsewhere. */
  #runtimeGoaway(lastRid: number, code: number, debug: string): void {
    if (code !== H2Error.NO_ERROR) this.#host.runtimeGoaway?.(code, debug);
    // A graceful shutdown sends two: the first with the largest id, the second with the real last one.
    if (this.#runtime === 'up' || this.#runtime === 'connecting') this.#runtime = 'closing';
    for (const s of [...this.#byRid.values()]) {
      if (s.rid <= lastRid) continue;
      this.#forget(s);
      this.#k.reset(s.kid, H2Error.REFUSED_STREAM);
    }
    this.#k.goaway(H2Error.NO_ERROR);
    this.#maybeFinish();
  }

  #runtimeClosed(err: Error | undefined): void {
    if (this.#closed) return;
    const before = this.#runtime;
    if (before === 'connecting') {
      // Refused: the shim is the server on this connection now.
      this.#runtime = 'absent';
      this.#r = null;
      for (const s of [...this.#byRid.values()]) this.#answerUnavailable(s, new Error(err ? `connection refused (${err.message})` : 'connection refused'));
      if (this.#streams.size > 0 || this.#k.lastPeerStream > 0) this.#k.goaway(H2Error.NO_ERROR);
      this.#maybeFinish();
      return;
    }
    if (before === 'gone' || before === 'absent') return;
    this.#runtime = 'gone';
    const why = err ?? new Error('connection closed');
    for (const s of [...this.#byRid.values()]) {
      if (s.responded) {
        this.#forget(s);
        this.#host.runtimeError(why);
        this.#k.reset(s.kid, H2Error.INTERNAL_ERROR);
      } else {
        this.#answerUnavailable(s, why);
      }
    }
    this.#k.goaway(H2Error.NO_ERROR);
    this.#maybeFinish();
  }

  // ---- the kubelet connection ----

  #kubeletSide(): H2Handler {
    return {
      headers: (kid, fields, endStream, opened) => {
        if (opened) this.#request(kid, fields, endStream);
        else this.#trailers(kid, fields, endStream);
      },
      data: (kid, f, payload, endStream) => this.#kubeletData(kid, f, payload, endStream),
      reset: (kid) => this.#kubeletReset(kid),
      windowUpdate: (kid, inc) => {
        const s = this.#streams.get(kid);
        if (!s) return;
        if (s.state === 'forwarded') this.#r?.windowUpdate(s.rid, inc);
        else if (s.state === 'held') s.heldCredit += inc;
      },
      settings: (values) => {
        if (this.#runtime === 'none') this.#connectRuntime(values.get('initialWindowSize') ?? this.#k.peer.initialWindowSize);
        else if (this.#r !== null) this.#mirror(this.#r, values);
      },
      goaway: () => {
        // Kubelet is leaving: calls in flight finish, then both connections close.
        this.#kubeletLeaving = true;
        this.#r?.goaway(H2Error.NO_ERROR);
        this.#maybeFinish();
      },
      // The last answer that waited for kubelet's window is out: a leaving connection may close now.
      idle: () => this.#maybeFinish(),
      closed: (err) => {
        // Before any request, or a protocol violation (a flood among them) at any time.
        if (err !== undefined && (this.#firstRequest || err instanceof H2ConnectionError)) this.#host.refused(err);
        this.destroy();
      },
    };
  }

  #request(kid: number, fields: HeaderField[], endStream: boolean): void {
    this.#host.called?.();
    if (this.#firstRequest) {
      this.#firstRequest = false;
      if (!authorityAcceptable(fields)) this.#host.rewritingAuthority(fields.find((x) => x.name === ':authority')?.value);
    }
    let path: string | undefined;
    for (const x of fields) if (x.name === ':path') path = x.value;
    const s: RelayStream = {
      kid, rid: 0, state: 'held', path, fields: withAcceptableAuthority(fields), held: [], payloads: [], size: 0, heldFlow: 0,
      cost: 0, prefix: null, heldCredit: 0, kubeletDone: endStream, responded: false, cancel: null,
    };
    this.#streams.set(kid, s);
    if (path === EXEC_SYNC_PATH && !endStream) {
      // Waits for its first DATA, which kubelet may send whatever the runtime's stream window (the
      // one kubelet sees): the shim reads those octets itself.
      const short = MAX_UNDECIDED - this.#k.local.initialWindowSize;
      if (short > 0) this.#k.windowUpdate(kid, short);
      return;
    }
    this.#forward(s);
  }

  #trailers(kid: number, fields: HeaderField[], endStream: boolean): void {
    const s = this.#streams.get(kid);
    if (!s) return;
    if (s.state === 'held') this.#forward(s);
    if (s.state === 'forwarded' && this.#r !== null) {
      this.#r.headers(s.rid, fields, endStream);
    } else if (s.state === 'ours' && endStream) {
      this.#decide(s);
    }
    if (endStream) s.kubeletDone = true;
  }

  #kubeletData(kid: number, f: Frame, payload: Buffer, end: boolean): void {
    const flow = f.payload.length;
    const s = this.#streams.get(kid);
    if (!s) {
      this.#k.consumed(flow);
      return;
    }
    if (end) s.kubeletDone = true;
    if (s.state === 'forwarded') {
      if (this.#r === null || !this.#r.has(s.rid)) {
        this.#k.consumed(flow);
        return;
      }
      this.#r.data(s.rid, payload, end, this.#k, flow, f.raw);
      return;
    }
    s.cost += FRAME_HEADER + flow;
    if (s.state === 'ours') {
      // The runtime never reads it: the shim gives kubelet the stream's window back too.
      this.#k.consumed(flow, kid);
      // A copy: a view would keep the whole read it came in.
      if (payload.length > 0) s.payloads.push(Buffer.from(payload));
      s.size += payload.length;
      if (s.size > framedLimit(MAX_BUFFERED_EXEC) || s.cost > MAX_EXEC_COST) this.#tooLarge(s);
      else if (end) this.#decide(s);
      return;
    }
    // Held past this read: copies (the read's buffer is reused, agent/io/lean-socket.ts).
    const raw = keep(f.raw);
    s.held.push(raw === f.raw ? f : { ...f, raw, payload: raw.subarray(FRAME_HEADER) });
    s.heldFlow += flow;
    let verdict: 'ours' | 'not-ours' | 'more' = 'more';
    if (payload.length > 0) {
      s.size += payload.length;
      s.prefix = s.prefix === null ? keep(payload) : Buffer.concat([s.prefix, payload]);
      verdict = classifyExecSyncPrefix(s.prefix);
    } else if (end && s.prefix !== null) {
      verdict = classifyExecSyncPrefix(s.prefix);
    }
    if (verdict === 'not-ours' || (verdict === 'more' && !end && s.cost > MAX_UNDECIDED)) {
      this.#forward(s);
      return;
    }
    if (verdict === 'more' && !end) return;
    // Ours (or complete): the shim reads the rest itself.
    s.state = 'ours';
    s.held = [];
    // The prefix is the stream's own (copied as it came).
    s.payloads = s.prefix === null ? [] : [s.prefix];
    s.prefix = null;
    this.#k.consumed(s.heldFlow, kid);
    if (end) this.#decide(s);
  }

  #tooLarge(s: RelayStream): void {
    this.#forget(s);
    const message = s.size > framedLimit(MAX_BUFFERED_EXEC)
      ? `probe-agent shim: ExecSync request larger than ${MAX_BUFFERED_EXEC} octets`
      : `probe-agent shim: ExecSync request in frames costing more than ${MAX_EXEC_COST} octets (9 per frame, padding included)`;
    this.#k.headers(s.kid, trailersOnly(GrpcCode.RESOURCE_EXHAUSTED, message), true);
    // The rest of the request is not wanted (RFC 9113 8.1).
    if (!s.kubeletDone) this.#k.reset(s.kid, H2Error.NO_ERROR);
  }

  #kubeletReset(kid: number): void {
    const s = this.#streams.get(kid);
    if (!s) return;
    this.#forget(s);
    if (s.state === 'forwarded') this.#r?.reset(s.rid, H2Error.CANCEL);
    else if (s.state === 'ours') s.cancel?.abort();
    else this.#k.consumed(s.heldFlow);
    this.#maybeFinish();
  }

  /**
   * Sends a stream's request to the runtime under a new runtime id (its held DATA after it, or
   * `body`, a request the shim read whole and already credited), or answers it UNAVAILABLE when
   * there is no runtime to take it.
   */
  #forward(s: RelayStream, body?: Buffer): void {
    const fields = s.fields!;
    s.fields = null;
    const held = s.held;
    s.held = [];
    s.payloads = [];
    s.prefix = null;
    const r = this.#r;
    const live = r !== null && (this.#runtime === 'up' || this.#runtime === 'connecting' || this.#runtime === 'closing');
    if (!live || !r.mayStart) {
      this.#k.consumed(s.heldFlow);
      if (live) {
        // The runtime is leaving (its GOAWAY) or at its stream limit: not processed, so refused
        // (gRPC retries such a call, on a new connection after the shim's GOAWAY).
        this.#forget(s);
        this.#k.reset(s.kid, H2Error.REFUSED_STREAM);
        // Its stream ids used up: kubelet's next call takes a new connection, with a runtime connection of its own.
        if (r.streamsLeft === 0) this.#k.goaway(H2Error.NO_ERROR);
        return;
      }
      this.#answerUnavailable(s, new Error(this.#runtime === 'absent' ? 'connection refused' : 'connection closed'));
      if (this.#runtime === 'absent') this.#k.goaway(H2Error.NO_ERROR);
      return;
    }
    s.state = 'forwarded';
    const endNow = s.kubeletDone && held.length === 0 && body === undefined;
    s.rid = r.request(fields, endNow);
    this.#byRid.set(s.rid, s);
    this.#host.forwarded(s.path);
    for (let i = 0; i < held.length; i++) {
      const f = held[i]!;
      const last = i === held.length - 1;
      // The connection checked its padding when it came.
      r.data(s.rid, dataPayload(f.flags, f.payload)!, last && s.kubeletDone, this.#k, f.payload.length, f.raw);
    }
    if (body !== undefined) r.data(s.rid, body, true);
    if (s.heldCredit > 0) r.windowUpdate(s.rid, s.heldCredit);
    s.heldCredit = 0;
  }

  /** A probe-agent ExecSync is complete: the agent's answer, or the runtime's after all. */
  #decide(s: RelayStream): void {
    const body = s.payloads.length === 1 ? s.payloads[0]! : Buffer.concat(s.payloads, s.size);
    s.payloads = [];
    const cancel = new AbortController();
    const pending = this.#host.intercept(body, s.fields!, cancel.signal);
    if (pending === null) {
      // Not ours after all (the prefix only looked so): the runtime gets it as kubelet sent it.
      s.state = 'held';
      s.held = [];
      s.heldFlow = 0;
      this.#forward(s, body);
      return;
    }
    s.fields = null;
    s.cancel = cancel;
    pending.then(
      (answer) => this.#answer(s, answer),
      (err: Error) => this.#answer(s, { kind: 'error', grpcCode: GrpcCode.INTERNAL, message: `probe-agent shim: ${err.message}` }),
    );
  }

  #answer(s: RelayStream, answer: ExecSyncAnswer): void {
    s.cancel = null;
    if (this.#streams.get(s.kid) !== s) return; // kubelet reset it or went away
    this.#forget(s);
    if (answer.kind === 'error') {
      this.#k.headers(s.kid, trailersOnly(answer.grpcCode, answer.message), true);
    } else {
      // The agent's ExecSyncResponse, gRPC-framed, as the agent sent it.
      this.#k.headers(s.kid, responseHeadersBlock(CONTENT_TYPE), false);
      this.#k.data(s.kid, answer.body, false);
      this.#k.headers(s.kid, OK_TRAILERS_BLOCK, true);
    }
    this.#maybeFinish();
  }

  #answerUnavailable(s: RelayStream, err: Error): void {
    this.#forget(s);
    this.#host.runtimeError(err);
    this.#k.headers(s.kid, trailersOnly(GrpcCode.UNAVAILABLE, `probe-agent shim: runtime ${this.#host.runtimeSocket} unavailable: ${err.message}`), true);
    if (!s.kubeletDone) this.#k.reset(s.kid, H2Error.NO_ERROR);
  }

  #forget(s: RelayStream): void {
    if (this.#streams.get(s.kid) === s) this.#streams.delete(s.kid);
    if (s.rid !== 0 && this.#byRid.get(s.rid) === s) this.#byRid.delete(s.rid);
  }

  /** After a GOAWAY either way, both connections close once no stream is left. */
  #maybeFinish(): void {
    if (this.#closed) return;
    const leaving = this.#kubeletLeaving || this.#k.goawaySent;
    if (!leaving || this.#streams.size > 0 || this.#k.streamCount > 0) return;
    this.#r?.end();
    this.#k.end();
    this.#finish();
  }

  #finish(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const s of this.#streams.values()) s.cancel?.abort();
    this.#streams.clear();
    this.#byRid.clear();
    const fn = this.#onClose;
    this.#onClose = null;
    fn?.();
  }
}

/** containerd's content-type (grpc-go's), which the shim's own answers carry too. */
const CONTENT_TYPE = 'application/grpc';

function trailersOnly(code: number, message: string): Buffer {
  return trailersOnlyBlock(CONTENT_TYPE, code, message, 1024);
}
