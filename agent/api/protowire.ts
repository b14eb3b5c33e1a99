/**
 * A tiny protobuf reader and writer for the few messages the kubelet shim reads and writes by
 * hand (ExecSync, Probe, RunLifecycleHandler): no descriptors, no reflection, so the shim
 * starts fast and spends microseconds per message. Only the wire types proto3 scalars,
 * strings, bytes and sub-messages use are supported.
 */

/** A malformed protobuf message. */
export class WireError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'WireError';
  }
}

/** One decoded field: varints as numbers (exact up to 2^53), length-delimited as buffers, fixed64 as 8 bytes. */
export type WireValue = number | Buffer;

/** A 10-byte varint: a negative int32/int64 (two's complement), exactly; past 2^53 as near as a double goes. */
function signedInt64(buf: Buffer, start: number): number {
  let v = 0n;
  for (let i = 9; i >= 0; i--) v = (v << 7n) | BigInt((buf[start + i] as number) & 0x7f);
  return Number(BigInt.asIntN(64, v));
}

/** Calls `onField` for every field of a message, in wire order. */
export function readFields(buf: Buffer, onField: (field: number, value: WireValue, wireType: number) => void): void {
  let pos = 0;
  const varint = (): number => {
    let result = 0;
    let mul = 1;
    const start = pos;
    for (let i = 0; i < 10; i++) {
      if (pos >= buf.length) throw new WireError('truncated varint');
      const b = buf[pos++] as number;
      result += (b & 0x7f) * mul;
      if (b < 0x80) return i === 9 ? signedInt64(buf, start) : result;
      mul *= 128;
    }
    throw new WireError('varint longer than 10 bytes');
  };
  while (pos < buf.length) {
    const key = varint();
    const field = Math.floor(key / 8);
    const wireType = key & 7;
    if (field === 0) throw new WireError('field number 0');
    switch (wireType) {
      case 0:
        onField(field, varint(), 0);
        break;
      case 1:
        if (pos + 8 > buf.length) throw new WireError('truncated fixed64');
        onField(field, buf.subarray(pos, pos + 8), 1);
        pos += 8;
        break;
      case 2: {
        const len = varint();
        if (pos + len > buf.length) throw new WireError(`field ${field}: length ${len} past the end`);
        onField(field, buf.subarray(pos, pos + len), 2);
        pos += len;
        break;
      }
      case 5:
        if (pos + 4 > buf.length) throw new WireError('truncated fixed32');
        pos += 4;
        break;
      default:
        throw new WireError(`unsupported wire type ${wireType}`);
    }
  }
}

/** One-byte varints 0..127, shared (never written to). */
const SMALL_VARINTS: Buffer[] = Array.from({ length: 128 }, (_, i) => Buffer.from([i]));

/** Builds a message field by field; `finish()` returns the bytes. */
export class WireWriter {
  readonly #parts: Buffer[] = [];
  #len = 0;

  #push(b: Buffer): void {
    this.#parts.push(b);
    this.#len += b.length;
  }

  #varint(n: number): void {
    if (n >= 0 && n < 0x80) {
      // The common case (tags, small lengths and values): one byte, no BigInt.
      this.#push(SMALL_VARINTS[n] as Buffer);
      return;
    }
    if (n > 0 && n <= 0xffffffff) {
      const bytes: number[] = [];
      let v = n;
      while (v >= 0x80) {
        bytes.push((v % 0x80) | 0x80);
        v = Math.floor(v / 0x80);
      }
      bytes.push(v);
      this.#push(Buffer.from(bytes));
      return;
    }
    const bytes: number[] = [];
    // Negative int32/int64 are 10-byte two's complement varints.
    let v = n < 0 ? BigInt.asUintN(64, BigInt(n)) : BigInt(n);
    do {
      let b = Number(v & 0x7fn);
      v >>= 7n;
      if (v > 0n) b |= 0x80;
      bytes.push(b);
    } while (v > 0n);
    this.#push(Buffer.from(bytes));
  }

  /** An int32/int64/enum/bool field; zero is omitted (proto3 default). */
  varint(field: number, n: number | boolean): this {
    const v = typeof n === 'boolean' ? (n ? 1 : 0) : Math.trunc(n);
    if (v === 0) return this;
    this.#varint(field * 8);
    this.#varint(v);
    return this;
  }

  /** A string, bytes or sub-message field; an empty string is omitted, an empty message is kept when `keepEmpty`. */
  bytes(field: number, value: string | Buffer, keepEmpty = false): this {
    const b = typeof value === 'string' ? Buffer.from(value, 'utf8') : value;
    if (b.length === 0 && !keepEmpty) return this;
    this.#varint(field * 8 + 2);
    this.#varint(b.length);
    this.#push(b);
    return this;
  }

  /** A double field; zero is omitted. */
  double(field: number, n: number): this {
    if (n === 0) return this;
    this.#varint(field * 8 + 1);
    const b = Buffer.allocUnsafe(8);
    b.writeDoubleLE(n);
    this.#push(b);
    return this;
  }

  /** A double field written even when zero (proto3 `optional`). */
  doubleAlways(field: number, n: number): this {
    this.#varint(field * 8 + 1);
    const b = Buffer.allocUnsafe(8);
    b.writeDoubleLE(n);
    this.#push(b);
    return this;
  }

  finish(): Buffer {
    return Buffer.concat(this.#parts, this.#len);
  }
}

/** Wraps a message in a gRPC length-prefixed frame (uncompressed). */
export function grpcFrame(message: Buffer): Buffer {
  const out = Buffer.allocUnsafe(5 + message.length);
  out[0] = 0;
  out.writeUInt32BE(message.length, 1);
  message.copy(out, 5);
  return out;
}

/**
 * Reads exactly one uncompressed gRPC frame from a complete request body; null when the body is
 * not exactly one uncompressed frame (the caller then forwards it untouched).
 */
export function readSingleGrpcFrame(body: Buffer): Buffer | null {
  if (body.length < 5 || body[0] !== 0) return null;
  const len = body.readUInt32BE(1);
  if (5 + len !== body.length) return null;
  return body.subarray(5);
}

/** grpc-message is percent-encoded (gRPC HTTP/2 spec): printable ASCII except '%' stays as is. */
export function encodeGrpcMessage(msg: string): string {
  let out = '';
  for (const b of Buffer.from(msg, 'utf8')) {
    out += b >= 0x20 && b <= 0x7e && b !== 0x25 ? String.fromCharCode(b) : `%${b.toString(16).toUpperCase().padStart(2, '0')}`;
  }
  return out;
}

/** Inverse of encodeGrpcMessage. */
export function decodeGrpcMessage(msg: string): string {
  try {
    return decodeURIComponent(msg);
  } catch {
    return msg;
  }
}
