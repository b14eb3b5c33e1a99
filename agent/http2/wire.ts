/**
 * HTTP/2 on the wire, shared by every endpoint (connection.ts) and by the shim's authority
 * rewrite (authority.ts): the preface, frame types, flags, error codes and SETTINGS identifiers,
 * and the frames built outside a connection's own flow control.
 */
/** Octets or frames from a peer that are not HTTP/2 we can take: the connection is closed (an H2ConnectionError says with which code). */
export class H2InputError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'H2InputError';
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

/** A SETTINGS frame with these values. */
export function settingsFrame(values: ReadonlyArray<readonly [number, number]>): Buffer {
  const p = Buffer.allocUnsafe(6 * values.length);
  values.forEach(([id, v], i) => {
    p.writeUInt16BE(id, i * 6);
    p.writeUInt32BE(v, i * 6 + 2);
  });
  return frameBytes(FrameType.SETTINGS, 0, 0, p);
}

/** The values of a SETTINGS frame's payload; undefined when its length is no multiple of 6. */
export function parseSettings(payload: Buffer): Array<[number, number]> | undefined {
  if (payload.length % 6 !== 0) return undefined;
  const out: Array<[number, number]> = [];
  for (let i = 0; i < payload.length; i += 6) out.push([payload.readUInt16BE(i), payload.readUInt32BE(i + 2)]);
  return out;
}

/**
 * Checks a peer's (non-ACK) SETTINGS frame and applies what flow control needs from it to
 * `windows`; returns its values for the settings the caller keeps itself. Throws H2InputError.
 */
export function applyPeerSettings(streamId: number, payload: Buffer, windows: SendWindows): Array<[number, number]> {
  const values = parseSettings(payload);
  if (streamId !== 0 || values === undefined) throw new H2InputError('malformed SETTINGS');
  for (const [id, v] of values) {
    if (id === Setting.INITIAL_WINDOW_SIZE && !windows.setInitialWindow(v)) throw new H2InputError('SETTINGS_INITIAL_WINDOW_SIZE beyond 2^31-1');
    if (id === Setting.MAX_FRAME_SIZE && !windows.setMaxFrame(v)) throw new H2InputError('bad SETTINGS_MAX_FRAME_SIZE');
  }
  return values;
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

/** A 4-octet payload's value (RST_STREAM's code, WINDOW_UPDATE's increment); undefined if not 4 octets. */
export function u31(payload: Buffer): number | undefined {
  return payload.length === 4 ? payload.readUInt32BE(0) & 0x7fffffff : undefined;
}

/** A DATA frame's payload without its padding; undefined when the padding is malformed. */
export function dataPayload(flags: number, payload: Buffer): Buffer | undefined {
  if ((flags & 0x8) === 0) return payload;
  if (payload.length < 1) return undefined;
  const pad = payload[0]!;
  if (pad > payload.length - 1) return undefined;
  return payload.subarray(1, payload.length - pad);
}

/**
 * The send side of flow control for one connection: the peer's connection window, each stream's
 * window and the DATA waiting for room. `send` writes frames; DATA goes out in frames no larger
 * than the peer's SETTINGS_MAX_FRAME_SIZE and the windows allow, the rest when WINDOW_UPDATE comes.
 */
export class SendWindows {
  /** The peer's SETTINGS_INITIAL_WINDOW_SIZE. */
  #initial = DEFAULT_WINDOW;
  #conn = DEFAULT_WINDOW;
  #maxFrame = 16_384;
  readonly #streams = new Map<number, { window: number; queue: Buffer[]; queued: number; endStream: boolean; after: Buffer | undefined }>();
  readonly #send: (octets: Buffer) => void;

  constructor(send: (octets: Buffer) => void) {
    this.#send = send;
  }

  /** Octets waiting for window, over all streams. */
  #queued = 0;

  /** Octets waiting for window, over all streams. */
  get queued(): number {
    return this.#queued;
  }

  /** Starts accounting for a stream. */
  open(streamId: number): void {
    this.#streams.set(streamId, { window: this.#initial, queue: [], queued: 0, endStream: false, after: undefined });
  }

  /** Whether the stream still has octets waiting for window. */
  has(streamId: number): boolean {
    return this.#streams.has(streamId);
  }

  /** Forgets a stream (reset, or done sending): what it had queued is dropped. */
  close(streamId: number): void {
    const s = this.#streams.get(streamId);
    if (s) this.#queued -= s.queued;
    this.#streams.delete(streamId);
  }

  /** Applies the peer's SETTINGS_INITIAL_WINDOW_SIZE (to open streams too, RFC 9113 6.9.2); false if beyond 2^31-1. */
  setInitialWindow(size: number): boolean {
    if (size > MAX_WINDOW) return false;
    const delta = size - this.#initial;
    this.#initial = size;
    for (const s of this.#streams.values()) s.window += delta;
    this.#flush();
    return true;
  }

  /** Applies the peer's SETTINGS_MAX_FRAME_SIZE (16384..2^24-1; we never send more than 16384 anyway). */
  setMaxFrame(size: number): boolean {
    if (size < 16_384 || size > 16_777_215) return false;
    this.#maxFrame = Math.min(size, 16_384);
    return true;
  }

  /** A WINDOW_UPDATE from the peer; false when it overflows the window (FLOW_CONTROL_ERROR). */
  update(streamId: number, increment: number): boolean {
    if (streamId === 0) {
      this.#conn += increment;
      if (this.#conn > MAX_WINDOW) return false;
    } else {
      const s = this.#streams.get(streamId);
      if (!s) return true;
      s.window += increment;
      if (s.window > MAX_WINDOW) return false;
    }
    this.#flush();
    return true;
  }

  /**
   * Sends `data` on the stream as DATA frames (END_STREAM on the last when `endStream`), then
   * `after` (the trailers' frames) once all of it is out; what does not fit waits for window.
   */
  data(streamId: number, data: Buffer, endStream: boolean, after?: Buffer): void {
    const s = this.#streams.get(streamId);
    if (!s) return;
    if (data.length === 0 && s.queued === 0) {
      // Nothing to wait for: an empty DATA (END_STREAM) or the trailers go out now.
      this.#streams.delete(streamId);
      this.#send(after ?? frameBytes(FrameType.DATA, endStream ? 0x1 : 0, streamId));
      return;
    }
    s.queue.push(data);
    s.queued += data.length;
    this.#queued += data.length;
    s.endStream = endStream;
    s.after = after;
    this.#flushStream(streamId, s);
  }

  #flush(): void {
    for (const [id, s] of this.#streams) {
      if (s.queue.length > 0 || s.after) this.#flushStream(id, s);
      if (this.#conn <= 0) return;
    }
  }

  #flushStream(id: number, s: { window: number; queue: Buffer[]; queued: number; endStream: boolean; after: Buffer | undefined }): void {
    const out: Buffer[] = [];
    while (s.queued > 0) {
      const room = Math.min(this.#conn, s.window, this.#maxFrame, s.queued);
      if (room <= 0) break;
      const head = s.queue[0]!;
      const take = Math.min(room, head.length);
      const chunk = head.subarray(0, take);
      if (take === head.length) s.queue.shift();
      else s.queue[0] = head.subarray(take);
      s.queued -= take;
      this.#queued -= take;
      this.#conn -= take;
      s.window -= take;
      const last = s.queued === 0 && s.endStream && !s.after;
      out.push(frameBytes(FrameType.DATA, last ? 0x1 : 0, id, chunk));
    }
    if (s.queued === 0 && s.after) {
      out.push(s.after);
      s.after = undefined;
    }
    // All of the stream's last octets are out: nothing more will be sent on it.
    if (s.queued === 0 && s.endStream) this.#streams.delete(id);
    if (out.length > 0) this.#send(out.length === 1 ? out[0]! : Buffer.concat(out));
  }
}
