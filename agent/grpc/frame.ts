/**
 * gRPC's length-prefixed message (gRPC over HTTP/2): a compressed flag octet, a 4-octet big-endian
 * length, the message. Written uncompressed only (we never negotiate compression). Read whole from
 * a complete body, or DATA by DATA with a bound on what is held.
 */
import { isTransient } from '../io/lean-socket.ts';

/** The prefix's octets. */
export const FRAME_PREFIX = 5;

/** Why a body holds no message: fewer octets than a prefix, compressed, shorter or longer than its prefix says. */
export type FrameFault = 'short' | 'compressed' | 'truncated' | 'trailing';

/** A message in a length-prefixed frame (uncompressed). */
export function encodeFrame(message: Buffer): Buffer {
  const out = Buffer.allocUnsafe(FRAME_PREFIX + message.length);
  out[0] = 0;
  out.writeUInt32BE(message.length, 1);
  message.copy(out, FRAME_PREFIX);
  return out;
}

/**
 * The first uncompressed message of a complete body (a view), or why there is none. `exact`: the
 * body must be that one message and nothing after it (a unary request or answer as we take it);
 * else octets after it are ignored (grpc-go's client reading a unary answer).
 */
export function readFrame(body: Buffer, exact: boolean): Buffer | FrameFault {
  if (body.length < FRAME_PREFIX) return 'short';
  if (body[0] !== 0) return 'compressed';
  const end = FRAME_PREFIX + body.readUInt32BE(1);
  if (body.length < end) return 'truncated';
  if (exact && body.length > end) return 'trailing';
  return body.subarray(FRAME_PREFIX, end);
}

/** Exactly one uncompressed message (a view), or null: the caller forwards such a body untouched or refuses it. */
export function readSingleFrame(body: Buffer): Buffer | null {
  const m = readFrame(body, true);
  return typeof m === 'string' ? null : m;
}

/**
 * The message length a frame's first octets declare, once the prefix is in; undefined before.
 * For an incremental reader that decides on a message's first octets.
 */
export function declaredLength(first: Buffer): number | undefined {
  return first.length < FRAME_PREFIX ? undefined : first.readUInt32BE(1);
}

/**
 * A body read DATA by DATA, held up to `limit` octets: add() says false once the body passes it
 * (what was held is dropped). `copy` keeps copies, not views of the reads the octets came in.
 */
export class BodyReader {
  readonly limit: number;
  readonly #copy: boolean;
  #chunks: Buffer[] = [];
  #held = 0;
  /** Octets added so far (the refused ones included). */
  size = 0;

  constructor(limit: number, copy = false) {
    this.limit = limit;
    this.#copy = copy;
  }

  add(payload: Buffer): boolean {
    this.size += payload.length;
    if (this.size > this.limit) {
      this.#chunks = [];
      this.#held = 0;
      return false;
    }
    if (payload.length > 0) {
      // A view of a reused read buffer is valid during its read only (agent/io/lean-socket.ts).
      this.#chunks.push(this.#copy || isTransient(payload) ? Buffer.from(payload) : payload);
      this.#held += payload.length;
    }
    return true;
  }

  /** The body so far, in one buffer; the reader holds nothing after. */
  take(): Buffer {
    const c = this.#chunks;
    const held = this.#held;
    this.#chunks = [];
    this.#held = 0;
    return c.length === 1 ? c[0]! : Buffer.concat(c, held);
  }
}

/** What a body bounded to messages of `maxMessage` octets may hold: the message and its prefix. */
export function framedLimit(maxMessage: number): number {
  return maxMessage + FRAME_PREFIX;
}
