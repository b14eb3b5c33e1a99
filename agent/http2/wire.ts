/**
 * HTTP/2 on the wire, shared by the connection core (connection.ts), the shim's authority rewrite
 * (authority.ts) and tests' raw peers: the preface, frame types, flags, error codes, SETTINGS
 * identifiers, and building or reading one frame. Connection state is connection.ts's alone.
 */
/** Octets or frames from a peer that are not HTTP/2 we can take: the connection is closed (an H2ConnectionError says with which code). */
export class H2InputError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'H2InputError';
  }
}

/** A connection error: GOAWAY with `code`, then close. */
export class H2ConnectionError extends H2InputError {
  readonly code: number;
  constructor(code: number, message: string) {
    super(message);
    this.name = 'H2ConnectionError';
    this.code = code;
  }
}

/** The client connection preface (RFC 9113 3.4). */
export const CLIENT_PREFACE = Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n', 'latin1');

export const FRAME_HEADER = 9;
export const FrameType = { DATA: 0, HEADERS: 1, PRIORITY: 2, RST_STREAM: 3, SETTINGS: 4, PUSH_PROMISE: 5, PING: 6, GOAWAY: 7, WINDOW_UPDATE: 8, CONTINUATION: 9 } as const;
export const Flag = { END_STREAM: 0x1, ACK: 0x1, END_HEADERS: 0x4, PADDED: 0x8, PRIORITY: 0x20 } as const;

/** One frame: its header fields, payload and the raw octets (header + payload) as received. */
export interface Frame {
  type: number;
  flags: number;
  streamId: number;
  payload: Buffer;
  raw: Buffer;
}

/** HTTP/2 error codes (RFC 9113 7). */
export const H2Error = {
  NO_ERROR: 0x0, PROTOCOL_ERROR: 0x1, INTERNAL_ERROR: 0x2, FLOW_CONTROL_ERROR: 0x3, SETTINGS_TIMEOUT: 0x4, STREAM_CLOSED: 0x5,
  FRAME_SIZE_ERROR: 0x6, REFUSED_STREAM: 0x7, CANCEL: 0x8, COMPRESSION_ERROR: 0x9, ENHANCE_YOUR_CALM: 0xb,
} as const;

/** SETTINGS identifiers (RFC 9113 6.5.2). */
export const Setting = { HEADER_TABLE_SIZE: 1, ENABLE_PUSH: 2, MAX_CONCURRENT_STREAMS: 3, INITIAL_WINDOW_SIZE: 4, MAX_FRAME_SIZE: 5, MAX_HEADER_LIST_SIZE: 6 } as const;

/** The protocol's initial flow-control window, of a connection and of each stream. */
export const DEFAULT_WINDOW = 65_535;
/** The largest window HTTP/2 allows. */
export const MAX_WINDOW = 2 ** 31 - 1;

/** One frame's octets (header + payload) in one buffer. */
export function frameBytes(type: number, flags: number, streamId: number, payload?: Buffer): Buffer {
  const len = payload?.length ?? 0;
  const b = Buffer.allocUnsafe(FRAME_HEADER + len);
  b[0] = (len >>> 16) & 0xff;
  b[1] = (len >>> 8) & 0xff;
  b[2] = len & 0xff;
  b[3] = type;
  b[4] = flags;
  b.writeUInt32BE(streamId & 0x7fffffff, 5);
  if (payload) payload.copy(b, FRAME_HEADER);
  return b;
}

/** WINDOW_UPDATE by `increment` (1..2^31-1). */
export function windowUpdateFrame(streamId: number, increment: number): Buffer {
  const p = Buffer.allocUnsafe(4);
  p.writeUInt32BE(increment & 0x7fffffff, 0);
  return frameBytes(FrameType.WINDOW_UPDATE, 0, streamId, p);
}

/** RST_STREAM with `code`. */
export function rstStreamFrame(streamId: number, code: number): Buffer {
  const p = Buffer.allocUnsafe(4);
  p.writeUInt32BE(code, 0);
  return frameBytes(FrameType.RST_STREAM, 0, streamId, p);
}

/** GOAWAY: the highest stream the sender processed (or will), an error code and debug text. */
export function goawayFrame(lastStreamId: number, code: number, debug = ''): Buffer {
  const d = Buffer.from(debug.slice(0, 512), 'utf8');
  const p = Buffer.allocUnsafe(8 + d.length);
  p.writeUInt32BE(lastStreamId & 0x7fffffff, 0);
  p.writeUInt32BE(code, 4);
  d.copy(p, 8);
  return frameBytes(FrameType.GOAWAY, 0, 0, p);
}

/** A GOAWAY payload, or undefined when it is shorter than 8 octets. */
export function parseGoaway(payload: Buffer): { lastStreamId: number; code: number; debug: string } | undefined {
  if (payload.length < 8) return undefined;
  return { lastStreamId: payload.readUInt32BE(0) & 0x7fffffff, code: payload.readUInt32BE(4), debug: payload.subarray(8).toString('utf8') };
}

/** A DATA frame's payload without its padding; undefined when the padding is malformed. */
export function dataPayload(flags: number, payload: Buffer): Buffer | undefined {
  if ((flags & 0x8) === 0) return payload;
  if (payload.length < 1) return undefined;
  const pad = payload[0]!;
  if (pad > payload.length - 1) return undefined;
  return payload.subarray(1, payload.length - pad);
}
