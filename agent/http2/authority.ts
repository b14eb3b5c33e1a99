/**
 * Gives a CRI client's requests an `:authority` Node's HTTP/2 server accepts. Kubelet before 1.31,
 * crictl before 1.31 and grpc-java send the socket path (`/run/containerd/containerd.sock`) as
 * `:authority`, and nghttp2 (inside Node) resets such a stream with PROTOCOL_ERROR before any
 * JavaScript sees it; it does the same to an empty or missing `:authority`. The shim's relay
 * (agent/shim/relay.ts) gives such a request `localhost` (withAcceptableAuthority) and passes
 * every other header as it came. Also the HTTP/2 bounds the shim and the agent hold a peer to.
 */
import type { HeaderField } from './hpack.ts';

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
