/**
 * A tiny protobuf reader and writer for the few messages read and written by hand (ExecSync,
 * Probe, RunLifecycleHandler, the health check): no descriptors, no reflection, so the shim starts
 * fast and spends microseconds per message. Only the wire types proto3 scalars, strings, bytes and
 * sub-messages use are supported. The one varint reader and writer of the project.
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

/** A message ended inside a varint: more octets may complete it (an incremental reader waits for them). */
export class WireTruncated extends WireError {
  constructor() {
    super('truncated varint');
    this.name = 'WireTruncated';
  }
}

/** Reads varints from buf[pos, end). */
export class WireReader {
  readonly buf: Buffer;
  readonly end: number;
  pos: number;

  constructor(buf: Buffer, pos = 0, end = buf.length) {
    this.buf = buf;
    this.pos = pos;
    this.end = end;
  }

  /**
   * The next varint: exact up to 2^53; a 10-byte one (a negative int32/int64) signed. Throws
   * WireTruncated when `end` comes first, WireError when it runs past `maxBytes` octets.
   */
  varint(maxBytes = 10): number {
    const buf = this.buf;
    let result = 0;
    let mul = 1;
    const start = this.pos;
    for (let i = 0; i < maxBytes; i++) {
      if (this.pos >= this.end) throw new WireTruncated();
      const b = buf[this.pos++] as number;
      result += (b & 0x7f) * mul;
      if (b < 0x80) return i === 9 ? signedInt64(buf, start) : result;
      mul *= 128;
    }
    throw new WireError(`varint longer than ${maxBytes} bytes`);
  }

  /** The next varint's low 32 bits, signed, exactly: how an int32 or enum field reads (as Go and protobufjs read it). */
  int32(): number {
    const start = this.pos;
    this.varint();
    let lo = 0;
    for (let i = 0; i < 5 && start + i < this.pos; i++) lo |= ((this.buf[start + i] as number) & 0x7f) << (7 * i);
    return lo;
  }

  /** The wire type of the tag at the current position (its first octet's low 3 bits: exact however long the tag). */
  get wireType(): number {
    return (this.buf[this.pos] as number) & 7;
  }
}

/** Calls `onField` for every field of a message, in wire order. */
export function readFields(buf: Buffer, onField: (field: number, value: WireValue, wireType: number) => void): void {
  const r = new WireReader(buf);
  while (r.pos < buf.length) {
    const wireType = r.wireType;
    const field = Math.floor(r.varint() / 8);
    if (field === 0) throw new WireError('field number 0');
    const pos = r.pos;
    switch (wireType) {
      case 0:
        onField(field, r.varint(), 0);
        break;
      case 1:
        if (pos + 8 > buf.length) throw new WireError('truncated fixed64');
        onField(field, buf.subarray(pos, pos + 8), 1);
        r.pos += 8;
        break;
      case 2: {
        const len = r.varint();
        if (r.pos + len > buf.length) throw new WireError(`field ${field}: length ${len} past the end`);
        onField(field, buf.subarray(r.pos, r.pos + len), 2);
        r.pos += len;
        break;
      }
      case 5:
        if (pos + 4 > buf.length) throw new WireError('truncated fixed32');
        r.pos += 4;
        break;
      default:
        throw new WireError(`unsupported wire type ${wireType}`);
    }
  }
}

/** One-byte varints 0..127, shared (never written to). */
const SMALL_VARINTS: Buffer[] = Array.from({ length: 128 }, (_, i) => Buffer.from([i]));

/** A varint's octets (shared for 0..127: never written to); negative int32/int64 as 10-byte two's complement. */
export function varintBytes(n: number): Buffer {
  // The common case (tags, small lengths and values): one shared byte, no BigInt.
  if (n >= 0 && n < 0x80) return SMALL_VARINTS[n] as Buffer;
  const bytes: number[] = [];
  if (n > 0 && n <= 0xffffffff) {
    let v = n;
    while (v >= 0x80) {
      bytes.push((v % 0x80) | 0x80);
      v = Math.floor(v / 0x80);
    }
    bytes.push(v);
    return Buffer.from(bytes);
  }
  let v = n < 0 ? BigInt.asUintN(64, BigInt(n)) : BigInt(n);
  do {
    let b = Number(v & 0x7fn);
    v >>= 7n;
    if (v > 0n) b |= 0x80;
    bytes.push(b);
  } while (v > 0n);
  return Buffer.from(bytes);
}

/** Builds a message field by field; `finish()` returns the bytes. */
export class WireWriter {
  readonly #parts: Buffer[] = [];
  #len = 0;

  #push(b: Buffer): void {
    this.#parts.push(b);
    this.#len += b.length;
  }

  #varint(n: number): void {
    this.#push(varintBytes(n));
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
