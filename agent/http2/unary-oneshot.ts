/**
 * One unary HTTP/2 exchange on a socket that is already connected, then done: the client preface
 * and SETTINGS, one request on stream 1 (HEADERS + DATA, END_STREAM), and its response read to the
 * end (HEADERS, DATA, trailers, or a trailers-only HEADERS). Used by the gRPC probe, which makes a
 * fresh connection per probe as kubelet does; a node:http2 session (nghttp2 session, settings and
 * stream objects) per probe cost more CPU than the probe itself. Frames are split by authority.ts's
 * FrameReader, header blocks joined by its HeaderBlockCollector and decoded by our HPACK decoder
 * (Huffman and the dynamic table included); the request is literal HPACK, sent within the server's
 * flow-control windows (SendWindows). SETTINGS are acknowledged, PINGs answered, WINDOW_UPDATEs
 * sent as we read, so a server is never stuck on us. The caller owns the socket and destroys it.
 */
import type { Socket } from 'node:net';
import { FrameReader, HeaderBlockCollector } from './authority.ts';
import { HpackDecoder, HpackError, type HeaderField } from './hpack.ts';
import {
  applyPeerSettings, dataPayload, DEFAULT_WINDOW, frameBytes, goawayFrame, H2Error, parseGoaway, rstStreamFrame, SendWindows, Setting, settingsFrame, u31,
  windowUpdateFrame,
  CLIENT_PREFACE, Flag, FrameType, H2InputError, type Frame,
} from './wire.ts';

/** The request of a one-shot exchange and the bounds its response is held to. */
export interface OneShotRequest {
  /** The request's header block, HPACK-encoded (literal representations: our encoder state never matters). */
  block: Buffer;
  body: Buffer;
  /** Largest response body (DATA octets, padding excluded); beyond it the exchange ends 'too-large'. */
  maxResponseBytes: number;
  /** Our SETTINGS_MAX_HEADER_LIST_SIZE; a larger response header list is a protocol error. */
  maxHeaderListSize: number;
}

/** How the exchange ended (reported once). */
export type OneShotEnd =
  /** The stream ended (END_STREAM): trailers is undefined for a trailers-only response. */
  | { kind: 'response'; headers: HeaderField[]; trailers: HeaderField[] | undefined; body: Buffer }
  /** The server reset our stream with this HTTP/2 error code (what had come of the response with it). */
  | { kind: 'reset'; code: number; headers: HeaderField[] | undefined; trailers: HeaderField[] | undefined; body: Buffer }
  /** The response body passed maxResponseBytes (size: octets received so far). */
  | { kind: 'too-large'; size: number }
  /** The server sent GOAWAY that ends our stream: an error code, or a last-stream-id below it (processed: false). */
  | { kind: 'goaway'; code: number; debug: string; processed: boolean }
  /** The connection closed (EOF) before the stream ended (what had come of the response with it). */
  | { kind: 'eof'; headers: HeaderField[] | undefined; trailers: HeaderField[] | undefined; body: Buffer }
  /** A socket error or a protocol violation by the server (message says which). */
  | { kind: 'broken'; message: string };

/** A running exchange: what has been seen so far, and cancel() to stop it (nothing more is reported). */
export interface OneShotExchange {
  /** Whether the server's SETTINGS arrived (its connection preface: the "transport is ready"). */
  readonly settingsSeen: boolean;
  /** Whether the response's (non-informational) HEADERS arrived. */
  readonly responseStarted: boolean;
  /** Resets the stream (RST_STREAM CANCEL) if it is open and stops reading. */
  cancel(): void;
}

const STREAM_ID = 1;
/** We never raise SETTINGS_MAX_FRAME_SIZE or SETTINGS_HEADER_TABLE_SIZE from the protocol's initial values. */
const TABLE_SIZE = 4096;
/** SETTINGS_MAX_FRAME_SIZE's initial value, which any server accepts. */
const MAX_FRAME = 16_384;
const SETTINGS_ACK = frameBytes(FrameType.SETTINGS, Flag.ACK, 0);
/** Flow-controlled octets read before we give the window back (half the initial window, as nghttp2 does). */
const WINDOW_REFILL = DEFAULT_WINDOW >>> 1;

/** The client preface and our SETTINGS (no push; header lists bounded), for one limit. */
const helloCache = new Map<number, Buffer>();
function hello(maxHeaderListSize: number): Buffer {
  let b = helloCache.get(maxHeaderListSize);
  if (!b) {
    b = Buffer.concat([CLIENT_PREFACE, settingsFrame([[Setting.ENABLE_PUSH, 0], [Setting.MAX_HEADER_LIST_SIZE, maxHeaderListSize]])]);
    helloCache.set(maxHeaderListSize, b);
  }
  return b;
}

/** Runs one unary exchange on `socket` (connected, not yet written to); `onEnd` gets the outcome once. */
export function exchangeOnce(socket: Socket, req: OneShotRequest, onEnd: (end: OneShotEnd) => void): OneShotExchange {
  const reader = new FrameReader(false);
  const blocks = new HeaderBlockCollector();
  const decoder = new HpackDecoder({ maxTableSize: TABLE_SIZE, maxHeaderListSize: req.maxHeaderListSize });
  let ended = false;
  let settingsSeen = false;
  let headers: HeaderField[] | undefined;
  let trailers: HeaderField[] | undefined;
  const chunks: Buffer[] = [];
  let size = 0;
  let connUnacked = 0;
  let streamUnacked = 0;
  let streamOpen = true;

  const write = (octets: Buffer): void => {
    if (!socket.destroyed) socket.write(octets);
  };
  const windows = new SendWindows(write);

  const end = (e: OneShotEnd): void => {
    if (ended) return;
    ended = true;
    socket.off('data', onData);
    socket.off('error', onError);
    socket.off('close', onClose);
    // A socket error after we let go must not become an uncaught 'error' event.
    socket.on('error', () => {});
    onEnd(e);
  };
  const protocolError = (code: number, message: string): void => {
    write(goawayFrame(0, code, message));
    end({ kind: 'broken', message });
  };

  const onFrame = (f: Frame): void => {
    // The server's connection preface is a SETTINGS frame (RFC 9113 3.4).
    if (!settingsSeen && f.type !== FrameType.SETTINGS) throw new H2InputError(`first frame from the server was type ${f.type}, not SETTINGS`);
    switch (f.type) {
      case FrameType.DATA: {
        connUnacked += f.payload.length;
        if (connUnacked >= WINDOW_REFILL) {
          write(windowUpdateFrame(0, connUnacked));
          connUnacked = 0;
        }
        if (f.streamId !== STREAM_ID || !streamOpen) return;
        if (headers === undefined) throw new H2InputError('DATA before the response HEADERS');
        const data = dataPayload(f.flags, f.payload);
        if (data === undefined) throw new H2InputError('malformed DATA padding');
        size += data.length;
        if (size > req.maxResponseBytes) {
          streamOpen = false;
          write(rstStreamFrame(STREAM_ID, H2Error.CANCEL));
          return end({ kind: 'too-large', size });
        }
        if (data.length > 0) chunks.push(data);
        if (f.flags & Flag.END_STREAM) return finish();
        streamUnacked += f.payload.length;
        if (streamUnacked >= WINDOW_REFILL) {
          write(windowUpdateFrame(STREAM_ID, streamUnacked));
          streamUnacked = 0;
        }
        return;
      }
      case FrameType.HEADERS:
      case FrameType.CONTINUATION: {
        const h = blocks.take(f);
        if (h === null) return;
        // Decoded whatever the stream: the HPACK state is the connection's.
        const fields = decoder.decode(h.block);
        if (h.streamId !== STREAM_ID || !streamOpen) return;
        if (headers === undefined) {
          const status = fields.find((x) => x.name === ':status')?.value;
          if (status === undefined) throw new H2InputError('response HEADERS without :status');
          // 1xx: informational, the response is still to come.
          if (/^1\d\d$/.test(status) && !h.endStream) return;
          headers = fields;
        } else {
          trailers = fields;
          if (!h.endStream) throw new H2InputError('trailers without END_STREAM');
        }
        if (h.endStream) finish();
        return;
      }
      case FrameType.RST_STREAM: {
        const code = u31(f.payload);
        if (code === undefined || f.streamId === 0) throw new H2InputError('malformed RST_STREAM');
        if (f.streamId !== STREAM_ID || !streamOpen) return;
        streamOpen = false;
        return end({ kind: 'reset', code, headers, trailers, body: Buffer.concat(chunks, size) });
      }
      case FrameType.SETTINGS: {
        if (f.streamId !== 0) throw new H2InputError('SETTINGS on a stream');
        if (f.flags & Flag.ACK) return;
        applyPeerSettings(f.streamId, f.payload, windows);
        settingsSeen = true;
        write(SETTINGS_ACK);
        return;
      }
      case FrameType.PING:
        if (f.streamId !== 0 || f.payload.length !== 8) throw new H2InputError('malformed PING');
        if (!(f.flags & Flag.ACK)) write(frameBytes(FrameType.PING, Flag.ACK, 0, f.payload));
        return;
      case FrameType.GOAWAY: {
        const g = parseGoaway(f.payload);
        if (!g) throw new H2InputError('malformed GOAWAY');
        // A graceful GOAWAY that covers our stream lets it finish (RFC 9113 6.8).
        if (g.code === H2Error.NO_ERROR && g.lastStreamId >= STREAM_ID) return;
        streamOpen = false;
        return end({ kind: 'goaway', code: g.code, debug: g.debug, processed: g.lastStreamId >= STREAM_ID });
      }
      case FrameType.WINDOW_UPDATE: {
        const inc = u31(f.payload);
        if (inc === undefined) throw new H2InputError('malformed WINDOW_UPDATE');
        if (inc === 0) return;
        if (!windows.update(f.streamId, inc)) throw new H2InputError('WINDOW_UPDATE beyond 2^31-1');
        return;
      }
      case FrameType.PUSH_PROMISE:
        throw new H2InputError('PUSH_PROMISE although SETTINGS_ENABLE_PUSH is 0');
      default:
        return; // PRIORITY and unknown types
    }
  };

  const finish = (): void => {
    streamOpen = false;
    const body = chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, size);
    end({ kind: 'response', headers: headers ?? [], trailers, body });
  };

  function onData(chunk: Buffer): void {
    reader.push(chunk);
    try {
      for (let f = reader.next(); f !== null && !ended; f = reader.next()) {
        if (blocks.open && f.type !== FrameType.CONTINUATION) throw new H2InputError(`frame type ${f.type} inside a header block`);
        onFrame(f);
      }
    } catch (err) {
      if (err instanceof HpackError) return protocolError(H2Error.COMPRESSION_ERROR, err.message);
      if (err instanceof H2InputError) return protocolError(H2Error.PROTOCOL_ERROR, err.message);
      throw err;
    }
  }
  function onError(err: Error): void {
    end({ kind: 'broken', message: err.message });
  }
  function onClose(): void {
    end({ kind: 'eof', headers, trailers, body: Buffer.concat(chunks, size) });
  }

  if (req.block.length > MAX_FRAME) throw new RangeError('request header block larger than one frame');
  socket.on('data', onData);
  socket.on('error', onError);
  socket.on('close', onClose);
  // One write: preface, SETTINGS, HEADERS and the DATA the (initial) windows take; the rest waits for them.
  // A small body fits the protocol's initial windows, which hold until the server's SETTINGS say otherwise.
  const hdrs = frameBytes(FrameType.HEADERS, Flag.END_HEADERS, STREAM_ID, req.block);
  if (req.body.length <= MAX_FRAME) {
    socket.write(Buffer.concat([hello(req.maxHeaderListSize), hdrs, frameBytes(FrameType.DATA, Flag.END_STREAM, STREAM_ID, req.body)]));
  } else {
    windows.open(STREAM_ID);
    socket.write(Buffer.concat([hello(req.maxHeaderListSize), hdrs]));
    windows.data(STREAM_ID, req.body, true);
  }

  return {
    get settingsSeen() {
      return settingsSeen;
    },
    get responseStarted() {
      return headers !== undefined;
    },
    cancel() {
      if (ended) return;
      if (streamOpen) write(rstStreamFrame(STREAM_ID, H2Error.CANCEL));
      streamOpen = false;
      ended = true;
      socket.off('data', onData);
      socket.off('error', onError);
      socket.off('close', onClose);
      socket.on('error', () => {});
    },
  };
}
