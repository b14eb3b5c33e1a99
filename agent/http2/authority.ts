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
import { CLIENT_PREFACE, FrameType, H2InputError } from './wire.ts';

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
