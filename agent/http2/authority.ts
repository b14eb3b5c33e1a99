/**
 * Gives a CRI client's requests an `:authority` Node's HTTP/2 server accepts. Kubelet before 1.31,
 * crictl before 1.31 and grpc-java send the socket path (`/run/containerd/containerd.sock`) as
 * `:authority`, and nghttp2 (inside Node) resets such a stream with PROTOCOL_ERROR before any
 * JavaScript sees it; it does the same to an empty or missing `:authority`. The AuthorityRewriter
 * sits on the client→server bytes of such a connection: it parses the frames, decodes every header
 * block with the client's HPACK state, and re-encodes it with literal representations, replacing an
 * unacceptable `:authority` (or `host`) by `localhost` and adding one where a request has none.
 * Every other frame passes untouched; nothing about the call changes but that header.
 */
import { encodeLiteralBlock, HpackDecoder, HpackError, type HeaderField } from './hpack.ts';
import { FrameSplitter, HeaderBlockJoiner, headerBlockFrames, type HeaderBlock } from './connection.ts';
import { CLIENT_PREFACE, Flag, FRAME_HEADER, FrameType, H2InputError, type Frame } from './wire.ts';

/** What replaces an authority nghttp2 would refuse (what k8s.io/cri-client itself sends from 1.31). */
export const SUBSTITUTE_AUTHORITY = 'localhost';

/**
 * The octets nghttp2 accepts in `:authority` and `host` (found by sending each of 0x21..0x7e to
 * Node 24's server): letters, digits and !$%&'()*+,-.:;=[]_~. Empty is refused too.
 */
const ACCEPTABLE = /^[A-Za-z0-9!$%&'()*+,\-.:;=[\]_~]+$/;

/** Whether Node's HTTP/2 server (nghttp2) accepts `value` as a request's `:authority` or `host`. */
export function acceptableAuthority(value: string): boolean {
  return ACCEPTABLE.test(value);
}

/** Whether a decoded request header list passes nghttp2's authority checks as it is. */
export function authorityAcceptable(fields: readonly HeaderField[]): boolean {
  let authority = false;
  for (const f of fields) {
    if (f.name === ':authority') {
      if (!acceptableAuthority(f.value)) return false;
      authority = true;
    } else if (f.name === 'host' && !acceptableAuthority(f.value)) {
      return false;
    }
  }
  return authority;
}

/** The request header list with an acceptable `:authority` (and `host`), in place of or beside the client's. */
export function withAcceptableAuthority(fields: readonly HeaderField[]): HeaderField[] {
  const out: HeaderField[] = [];
  let authority = false;
  let lastPseudo = -1;
  for (const f of fields) {
    if (f.name === ':authority') {
      authority = true;
      out.push(acceptableAuthority(f.value) ? f : { ...f, value: SUBSTITUTE_AUTHORITY });
    } else if (f.name === 'host' && !acceptableAuthority(f.value)) {
      out.push({ ...f, value: SUBSTITUTE_AUTHORITY });
    } else {
      out.push(f);
    }
    if (f.name.startsWith(':')) lastPseudo = out.length - 1;
  }
  // Pseudo-headers come first (RFC 9113 8.3): add ours after the client's.
  if (!authority) out.splice(lastPseudo + 1, 0, { name: ':authority', value: SUBSTITUTE_AUTHORITY });
  return out;
}

/** The bounds the shim holds a client to. */
export const H2_LIMITS = {
  /** SETTINGS_MAX_FRAME_SIZE: the shim never raises it from the protocol's initial 16384. */
  maxFrameSize: 16_384,
  /** One header block's encoded fragments together. */
  maxHeaderBlock: 64 * 1024,
  /** SETTINGS_HEADER_TABLE_SIZE: the shim never raises it from the protocol's initial 4096. */
  maxTableSize: 4096,
  /** Decoded header list, as nghttp2 counts it (name + value + 32 per field). */
  maxHeaderList: 64 * 1024,
};

/**
 * Splits a client's byte stream into its preface and frames, bounded by H2_LIMITS.maxFrameSize
 * (`expectPreface` false: a server's stream, frames from the first octet).
 */
export class FrameReader {
  #buf: Buffer = Buffer.alloc(0);
  #prefaceSeen: boolean;

  constructor(expectPreface = true) {
    this.#prefaceSeen = !expectPreface;
  }

  /** Octets received but not yet returned as a frame. */
  get pending(): Buffer {
    return this.#buf;
  }

  /** Adds received octets. */
  push(chunk: Buffer): void {
    this.#buf = this.#buf.length === 0 ? chunk : Buffer.concat([this.#buf, chunk]);
  }

  /** Whether the whole preface has been read (it is consumed, not returned as a frame). */
  get prefaceSeen(): boolean {
    return this.#prefaceSeen;
  }

  /** The next complete frame, or null until more octets arrive. Throws H2InputError. */
  next(): Frame | null {
    if (!this.#prefaceSeen) {
      const n = Math.min(this.#buf.length, CLIENT_PREFACE.length);
      if (!this.#buf.subarray(0, n).equals(CLIENT_PREFACE.subarray(0, n))) throw new H2InputError('not an HTTP/2 client preface');
      if (n < CLIENT_PREFACE.length) return null;
      this.#buf = this.#buf.subarray(CLIENT_PREFACE.length);
      this.#prefaceSeen = true;
    }
    if (this.#buf.length < FRAME_HEADER) return null;
    const length = this.#buf.readUIntBE(0, 3);
    if (length > H2_LIMITS.maxFrameSize) throw new H2InputError(`frame of ${length} octets exceeds SETTINGS_MAX_FRAME_SIZE ${H2_LIMITS.maxFrameSize}`);
    if (this.#buf.length < FRAME_HEADER + length) return null;
    const raw = this.#buf.subarray(0, FRAME_HEADER + length);
    this.#buf = this.#buf.subarray(FRAME_HEADER + length);
    return { type: raw[3]!, flags: raw[4]!, streamId: raw.readUInt32BE(5) & 0x7fffffff, payload: raw.subarray(FRAME_HEADER), raw };
  }
}

/** A header block being collected from HEADERS and CONTINUATION frames. */
interface OpenBlock {
  streamId: number;
  flags: number;
  /** The 5 priority octets of a HEADERS with PRIORITY, kept as sent. */
  priority: Buffer | null;
  fragments: Buffer[];
  size: number;
}

/**
 * Joins HEADERS and CONTINUATION frames into header blocks (RFC 9113 6.2, 6.10), stripping
 * padding. Returns null for a frame that is not the end of a block; throws H2InputError on frames
 * that break the sequence.
 */
export class HeaderBlockCollector {
  #open: OpenBlock | null = null;

  /** Whether a block is open (only CONTINUATION may come next). */
  get open(): boolean {
    return this.#open !== null;
  }

  /** Takes a HEADERS or CONTINUATION frame; other frames must not be passed while a block is open. */
  take(f: Frame): HeaderBlock | null {
    let fragment = f.payload;
    if (f.type === FrameType.HEADERS) {
      if (this.#open) throw new H2InputError(`HEADERS on stream ${f.streamId} inside the header block of stream ${this.#open.streamId}`);
      if (f.streamId === 0) throw new H2InputError('HEADERS on stream 0');
      if (f.flags & Flag.PADDED) {
        if (fragment.length < 1) throw new H2InputError('PADDED HEADERS without a pad length');
        const pad = fragment[0]!;
        if (pad > fragment.length - 1) throw new H2InputError('HEADERS padding longer than the frame');
        fragment = fragment.subarray(1, fragment.length - pad);
      }
      let priority: Buffer | null = null;
      if (f.flags & Flag.PRIORITY) {
        if (fragment.length < 5) throw new H2InputError('HEADERS with PRIORITY shorter than 5 octets');
        priority = Buffer.from(fragment.subarray(0, 5));
        fragment = fragment.subarray(5);
      }
      this.#open = { streamId: f.streamId, flags: f.flags, priority, fragments: [], size: 0 };
    } else if (f.type === FrameType.CONTINUATION) {
      if (!this.#open || this.#open.streamId !== f.streamId) throw new H2InputError(`CONTINUATION on stream ${f.streamId} without a header block open on it`);
    } else {
      throw new H2InputError(`frame type ${f.type} passed as a header block frame`);
    }
    const open = this.#open;
    open.size += fragment.length;
    if (open.size > H2_LIMITS.maxHeaderBlock) throw new H2InputError(`header block on stream ${open.streamId} larger than ${H2_LIMITS.maxHeaderBlock} octets`);
    open.fragments.push(Buffer.from(fragment));
    if ((f.flags & Flag.END_HEADERS) === 0) return null;
    this.#open = null;
    return { streamId: open.streamId, endStream: (open.flags & Flag.END_STREAM) !== 0, priority: open.priority, block: Buffer.concat(open.fragments, open.size) };
  }
}

/** A decoder bound to H2_LIMITS, for the client→server direction of one connection. */
export function clientHeaderDecoder(): HpackDecoder {
  return new HpackDecoder({ maxTableSize: H2_LIMITS.maxTableSize, maxHeaderListSize: H2_LIMITS.maxHeaderList });
}

/**
 * The client→server transform of one connection whose requests need an authority nghttp2 accepts.
 * Feed it the client's octets from the first (the preface included); it returns the octets to give
 * the server. Throws H2InputError on input it cannot carry (close the connection).
 */
export class AuthorityRewriter {
  readonly #frames = new FrameSplitter(true, H2_LIMITS.maxFrameSize);
  readonly #blocks = new HeaderBlockJoiner(H2_LIMITS.maxHeaderBlock);
  readonly #decoder = clientHeaderDecoder();
  #prefaceSent = false;
  /** Client streams only grow (RFC 9113 5.1.1): a HEADERS on a stream at or below this one is trailers. */
  #lastRequestStream = 0;

  /** Rewrites the next octets from the client. */
  transform(chunk: Buffer): Buffer {
    this.#frames.push(chunk);
    const out: Buffer[] = [];
    for (;;) {
      const f = this.#frames.next();
      if (!this.#prefaceSent && this.#frames.prefaceSeen) {
        out.push(CLIENT_PREFACE);
        this.#prefaceSent = true;
      }
      if (f === null) break;
      const h = this.#blocks.take(f);
      if (f.type === FrameType.HEADERS || f.type === FrameType.CONTINUATION) {
        if (h !== null) out.push(this.#rewrite(h));
        continue;
      }
      // A client never sends PUSH_PROMISE; its header block would change HPACK state we re-encode.
      if (f.type === FrameType.PUSH_PROMISE) throw new H2InputError('PUSH_PROMISE from a client');
      out.push(f.raw);
    }
    return out.length === 1 ? out[0]! : Buffer.concat(out);
  }

  #rewrite(h: HeaderBlock): Buffer {
    let fields: HeaderField[];
    try {
      fields = this.#decoder.decode(h.block);
    } catch (err) {
      if (err instanceof HpackError) throw new H2InputError(`stream ${h.streamId}: ${err.message}`);
      throw err;
    }
    if (h.streamId > this.#lastRequestStream) {
      this.#lastRequestStream = h.streamId;
      fields = withAcceptableAuthority(fields);
    }
    return headerBlockFrames(h.streamId, encodeLiteralBlock(fields), h.endStream, H2_LIMITS.maxFrameSize, h.priority);
  }
}
