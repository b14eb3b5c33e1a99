/**
 * One unary HTTP/2 exchange on a connection (a socket or byte channel), then done: the client preface
 * and SETTINGS, one request on stream 1 (HEADERS + DATA, END_STREAM), and its response read to the
 * end (HEADERS, DATA, trailers, or a trailers-only HEADERS). Used by the gRPC probe, which makes a
 * fresh connection per probe as kubelet does; a node:http2 session (nghttp2 session, settings and
 * stream objects) per probe cost more CPU than the probe itself. The connection is our HTTP/2 core
 * (connection.ts: SETTINGS acknowledged, PINGs answered, windows given back as we read, so a
 * server is never stuck on us), in grpc-go's client's manner: frames on streams it never opened
 * are ignored. What is kept here is the one response and how the exchange ended, in the terms
 * kubelet's grpc-go prober judges it by: a response head whose :status is not 200 (1xx included)
 * ends the exchange at once, as it fails grpc-go's call. Frames without progress spend the
 * connection's budget and the caller's shared one (the pod's; frame-budget.ts). The caller owns the
 * socket and destroys it.
 */
import type { Duplex } from 'node:stream';
import type { ByteChannel } from '../io/lean-socket.ts';
import { H2Connection } from './connection.ts';
import { FrameBudgetError, type SharedFrameBudget } from './frame-budget.ts';
import type { HeaderField } from './hpack.ts';
import { DEFAULT_WINDOW, H2Error, H2InputError } from './wire.ts';
import { BodyReader } from '../grpc/frame.ts';

/** The request of a one-shot exchange and the bounds its response is held to. */
export interface OneShotRequest {
  /** The request's header block, HPACK-encoded (literal representations: our encoder state never matters). */
  block: Buffer;
  body: Buffer;
  /** Largest response body (DATA octets, padding excluded); beyond it the exchange ends 'too-large'. */
  maxResponseBytes: number;
  /** Our SETTINGS_MAX_HEADER_LIST_SIZE; a larger response header list is a protocol error. */
  maxHeaderListSize: number;
  /** A frame budget shared with the caller's other exchanges (the pod's). */
  sharedBudget?: SharedFrameBudget;
}

/** How the exchange ended (reported once). */
export type OneShotEnd =
  /**
   * The stream ended (END_STREAM): trailers is undefined for a trailers-only response. Or the
   * response head's :status is not 200: the exchange ends on it (body empty, stream reset).
   */
  | { kind: 'response'; headers: HeaderField[]; trailers: HeaderField[] | undefined; body: Buffer }
  /** The server reset our stream with this HTTP/2 error code (what had come of the response with it). */
  | { kind: 'reset'; code: number; headers: HeaderField[] | undefined; trailers: HeaderField[] | undefined; body: Buffer }
  /** The response body passed maxResponseBytes (size: octets received so far). */
  | { kind: 'too-large'; size: number }
  /** The server sent GOAWAY that ends our stream: an error code, or a last-stream-id below it (processed: false). */
  | { kind: 'goaway'; code: number; debug: string; processed: boolean }
  /** The connection closed (EOF) before the stream ended (what had come of the response with it). */
  | { kind: 'eof'; headers: HeaderField[] | undefined; trailers: HeaderField[] | undefined; body: Buffer }
  /** A socket error or a protocol violation by the server (message says which); `flood`: a frame budget ended it. */
  | { kind: 'broken'; message: string; flood?: 'connection' | 'shared' };

/** A running exchange: what has been seen so far, and cancel() to stop it (nothing more is reported). */
export interface OneShotExchange {
  /** Whether the server's SETTINGS arrived (its connection preface: the "transport is ready"). */
  readonly settingsSeen: boolean;
  /** Whether the response's HEADERS arrived. */
  readonly responseStarted: boolean;
  /** Resets the stream (RST_STREAM CANCEL) if it is open and stops reading. */
  cancel(): void;
}

/** Runs one unary exchange on `socket` (connected, not yet written to); `onEnd` gets the outcome once. */
export function exchangeOnce(socket: Duplex | ByteChannel, req: OneShotRequest, onEnd: (end: OneShotEnd) => void): OneShotExchange {
  let ended = false;
  let headers: HeaderField[] | undefined;
  let trailers: HeaderField[] | undefined;
  const reader = new BodyReader(req.maxResponseBytes);
  let id = 0;

  const end = (e: OneShotEnd): void => {
    if (ended) return;
    ended = true;
    onEnd(e);
  };
  const body = (): Buffer => reader.take();

  // The protocol's initial windows: a health answer is a few octets, and we give them back as we read.
  const conn = new H2Connection(socket, {
    role: 'client', settings: { maxHeaderListSize: req.maxHeaderListSize }, connectionWindow: DEFAULT_WINDOW, ignoreIdleStreams: true,
    ...(req.sharedBudget ? { sharedBudget: req.sharedBudget } : {}),
  });
  conn.start({
    headers: (_id, fields, endStream) => {
      if (ended) return;
      if (headers === undefined) {
        const status = fields.find((x) => x.name === ':status')?.value;
        if (status === undefined) throw new H2InputError('response HEADERS without :status');
        headers = fields;
        if (status !== '200' && !endStream) {
          // grpc-go fails the call on this head (and resets the stream): nothing after it is read.
          conn.reset(id, H2Error.PROTOCOL_ERROR);
          return end({ kind: 'response', headers, trailers: undefined, body: body() });
        }
      } else {
        trailers = fields;
        if (!endStream) throw new H2InputError('trailers without END_STREAM');
      }
      if (endStream) end({ kind: 'response', headers, trailers, body: body() });
    },
    data: (_id, f, payload, endStream) => {
      conn.consumed(f.payload.length, id);
      if (ended) return;
      if (headers === undefined) throw new H2InputError('DATA before the response HEADERS');
      if (!reader.add(payload)) {
        conn.reset(id, H2Error.CANCEL);
        return end({ kind: 'too-large', size: reader.size });
      }
      if (endStream) end({ kind: 'response', headers, trailers, body: body() });
    },
    reset: (_id, code) => end({ kind: 'reset', code, headers, trailers, body: body() }),
    goaway: (lastStreamId, code, debug) => {
      // A graceful GOAWAY that covers our stream lets it finish (RFC 9113 6.8).
      if (code === H2Error.NO_ERROR && lastStreamId >= id) return;
      end({ kind: 'goaway', code, debug, processed: lastStreamId >= id });
    },
    closed: (err) => {
      if (err === undefined) end({ kind: 'eof', headers, trailers, body: body() });
      else end({ kind: 'broken', message: err.message, ...(err instanceof FrameBudgetError ? { flood: err.scope } : {}) });
    },
  });
  // Preface, SETTINGS, HEADERS and the DATA the (initial) windows take go out in one write.
  id = conn.request(req.block, false);
  conn.data(id, req.body, true);

  return {
    get settingsSeen() {
      return conn.settingsSeen;
    },
    get responseStarted() {
      return headers !== undefined;
    },
    cancel() {
      if (ended) return;
      ended = true;
      conn.reset(id, H2Error.CANCEL);
    },
  };
}
