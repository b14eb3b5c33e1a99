/**
 * HPACK (RFC 7541), as much as the shim needs to rewrite a client's request headers: a stateful,
 * bounded decoder (integers, strings, Huffman, static and dynamic tables, size updates) and an
 * encoder that writes literal representations only, so the peer's dynamic table is never used and
 * the rewritten stream needs no shared state with the client's. Malformed input is an HpackError,
 * never anything else.
 */
import { huffmanDecode } from './huffman.ts';

/** A malformed or over-limit header block (a COMPRESSION_ERROR in HTTP/2 terms). */
export class HpackError extends Error {
  constructor(message: string) {
    super(`hpack: ${message}`);
    this.name = 'HpackError';
  }
}

/** One header field. Names and values are latin1 strings, so any octets survive a decode/encode round trip. */
export interface HeaderField {
  name: string;
  value: string;
  /** Sent as "never indexed" (RFC 7541 6.2.3): an intermediary must keep it so. */
  neverIndexed?: boolean;
}

/** The static table (RFC 7541 Appendix A); index 1 is STATIC_TABLE[0]. */
export const STATIC_TABLE: ReadonlyArray<readonly [string, string]> = [
  [':authority', ''], [':method', 'GET'], [':method', 'POST'], [':path', '/'], [':path', '/index.html'],
  [':scheme', 'http'], [':scheme', 'https'], [':status', '200'], [':status', '204'], [':status', '206'],
  [':status', '304'], [':status', '400'], [':status', '404'], [':status', '500'], ['accept-charset', ''],
  ['accept-encoding', 'gzip, deflate'], ['accept-language', ''], ['accept-ranges', ''], ['accept', ''],
  ['access-control-allow-origin', ''], ['age', ''], ['allow', ''], ['authorization', ''], ['cache-control', ''],
  ['content-disposition', ''], ['content-encoding', ''], ['content-language', ''], ['content-length', ''],
  ['content-location', ''], ['content-range', ''], ['content-type', ''], ['cookie', ''], ['date', ''],
  ['etag', ''], ['expect', ''], ['expires', ''], ['from', ''], ['host', ''], ['if-match', ''],
  ['if-modified-since', ''], ['if-none-match', ''], ['if-range', ''], ['if-unmodified-since', ''],
  ['last-modified', ''], ['link', ''], ['location', ''], ['max-forwards', ''], ['proxy-authenticate', ''],
  ['proxy-authorization', ''], ['range', ''], ['referer', ''], ['refresh', ''], ['retry-after', ''],
  ['server', ''], ['set-cookie', ''], ['strict-transport-security', ''], ['transfer-encoding', ''],
  ['user-agent', ''], ['vary', ''], ['via', ''], ['www-authenticate', ''],
];

/** First static index of each name, for the encoder. */
const STATIC_NAME_INDEX = new Map<string, number>();
STATIC_TABLE.forEach(([name], i) => {
  if (!STATIC_NAME_INDEX.has(name)) STATIC_NAME_INDEX.set(name, i + 1);
});

/** RFC 7541 4.1: an entry's size is its name and value lengths plus 32. */
const ENTRY_OVERHEAD = 32;
/** Integers beyond this are never meaningful here (lengths, indices, table sizes) and would overflow. */
const MAX_INTEGER = 2 ** 30;

/** Limits a decoder holds its peer to. */
export interface HpackLimits {
  /** The largest dynamic table the peer may use: our SETTINGS_HEADER_TABLE_SIZE (HTTP/2 default 4096). */
  maxTableSize: number;
  /** The largest decoded header list (sum of name + value + 32 per field), as SETTINGS_MAX_HEADER_LIST_SIZE. */
  maxHeaderListSize: number;
}

/** A stateful HPACK decoder for one direction of one connection. */
export class HpackDecoder {
  readonly #limits: HpackLimits;
  /** Newest first. */
  readonly #table: Array<[string, string]> = [];
  #tableSize = 0;
  #tableMax: number;
  #selfContained = true;

  constructor(limits: HpackLimits) {
    this.#limits = limits;
    this.#tableMax = limits.maxTableSize;
  }

  /** Current dynamic table size in octets (RFC 7541 4.1), for tests. */
  get tableSize(): number {
    return this.#tableSize;
  }

  /**
   * Whether the last block decoded read nothing from the dynamic table and changed no table size:
   * its octets then mean the same to any decoder, so it may be sent on another connection as it is.
   */
  get lastBlockSelfContained(): boolean {
    return this.#selfContained;
  }

  /** The dynamic table, newest first, for tests. */
  get dynamicTable(): ReadonlyArray<readonly [string, string]> {
    return this.#table;
  }

  /**
   * Decodes one complete header block. Throws HpackError on malformed input; after an error the
   * decoder's state is unspecified and the connection must be closed (as HTTP/2 requires).
   */
  decode(block: Buffer): HeaderField[] {
    const fields: HeaderField[] = [];
    let listSize = 0;
    const r = { buf: block, pos: 0 };
    this.#selfContained = true;
    while (r.pos < block.length) {
      const b = block[r.pos]!;
      let field: HeaderField;
      if (b & 0x80) {
        const [name, value] = this.#entry(readInteger(r, 7));
        field = { name, value };
      } else if (b & 0x40) {
        field = this.#literal(r, 6);
        this.#insert(field.name, field.value);
      } else if (b & 0x20) {
        // A size update is only allowed before the block's first field (RFC 7541 4.2).
        if (fields.length > 0) throw new HpackError('dynamic table size update after a header field');
        const size = readInteger(r, 5);
        this.#selfContained = false;
        if (size > this.#limits.maxTableSize) throw new HpackError(`dynamic table size update to ${size} beyond the allowed ${this.#limits.maxTableSize}`);
        this.#tableMax = size;
        this.#evict(0);
        continue;
      } else {
        field = this.#literal(r, 4);
        if (b & 0x10) field.neverIndexed = true;
      }
      listSize += field.name.length + field.value.length + ENTRY_OVERHEAD;
      if (listSize > this.#limits.maxHeaderListSize) throw new HpackError(`header list larger than ${this.#limits.maxHeaderListSize} octets`);
      fields.push(field);
    }
    return fields;
  }

  #literal(r: Reader, prefix: number): HeaderField {
    const index = readInteger(r, prefix);
    const name = index === 0 ? readString(r) : this.#entry(index)[0];
    return { name, value: readString(r) };
  }

  #entry(index: number): readonly [string, string] {
    if (index === 0) throw new HpackError('index 0');
    if (index <= STATIC_TABLE.length) return STATIC_TABLE[index - 1]!;
    this.#selfContained = false;
    const e = this.#table[index - STATIC_TABLE.length - 1];
    if (e === undefined) throw new HpackError(`index ${index} beyond the tables (${STATIC_TABLE.length} static, ${this.#table.length} dynamic)`);
    return e;
  }

  #insert(name: string, value: string): void {
    const size = name.length + value.length + ENTRY_OVERHEAD;
    // An entry larger than the table empties it and is not added (RFC 7541 4.4).
    this.#evict(size);
    if (size > this.#tableMax) return;
    this.#table.unshift([name, value]);
    this.#tableSize += size;
  }

  /** Evicts the oldest entries until `room` more octets fit. */
  #evict(room: number): void {
    while (this.#table.length > 0 && this.#tableSize + room > this.#tableMax) {
      const [n, v] = this.#table.pop()!;
      this.#tableSize -= n.length + v.length + ENTRY_OVERHEAD;
    }
  }
}

interface Reader {
  buf: Buffer;
  pos: number;
}

/** RFC 7541 5.1: an integer with an N-bit prefix. */
function readInteger(r: Reader, prefix: number): number {
  if (r.pos >= r.buf.length) throw new HpackError('truncated integer');
  const max = (1 << prefix) - 1;
  let value = r.buf[r.pos++]! & max;
  if (value < max) return value;
  let shift = 0;
  for (;;) {
    if (r.pos >= r.buf.length) throw new HpackError('truncated integer');
    const b = r.buf[r.pos++]!;
    value += (b & 0x7f) * 2 ** shift;
    if (value > MAX_INTEGER) throw new HpackError('integer too large');
    if ((b & 0x80) === 0) return value;
    shift += 7;
    if (shift > 28) throw new HpackError('integer too long');
  }
}

/** RFC 7541 5.2: a string literal, Huffman-coded or raw, as latin1. */
function readString(r: Reader): string {
  if (r.pos >= r.buf.length) throw new HpackError('truncated string');
  const huffman = (r.buf[r.pos]! & 0x80) !== 0;
  const length = readInteger(r, 7);
  if (length > r.buf.length - r.pos) throw new HpackError(`string of ${length} octets overruns the block`);
  const raw = r.buf.subarray(r.pos, r.pos + length);
  r.pos += length;
  if (!huffman) return raw.toString('latin1');
  const decoded = huffmanDecode(raw);
  if (typeof decoded === 'string') throw new HpackError(decoded);
  return decoded.toString('latin1');
}

/** RFC 7541 5.1: writes `value` with an N-bit prefix, `high` holding the representation's leading bits. */
export function writeInteger(out: number[], value: number, prefix: number, high: number): void {
  const max = (1 << prefix) - 1;
  if (value < max) {
    out.push(high | value);
    return;
  }
  out.push(high | max);
  let rest = value - max;
  while (rest >= 128) {
    out.push((rest % 128) | 0x80);
    rest = Math.floor(rest / 128);
  }
  out.push(rest);
}

/** RFC 7541 5.2: a string literal without Huffman coding (latin1 octets). */
export function writeRawString(out: number[], s: string): void {
  writeInteger(out, s.length, 7, 0);
  for (let i = 0; i < s.length; i++) out.push(s.charCodeAt(i) & 0xff);
}

/**
 * Encodes a header list with literal representations only ("without indexing", or "never indexed"
 * where the field was), names by static index where the static table has them, strings raw. The
 * decoder's dynamic table is neither read nor changed.
 */
export function encodeLiteralBlock(fields: readonly HeaderField[]): Buffer {
  const out: number[] = [];
  for (const f of fields) {
    const high = f.neverIndexed ? 0x10 : 0x00;
    const index = STATIC_NAME_INDEX.get(f.name);
    if (index !== undefined) {
      writeInteger(out, index, 4, high);
    } else {
      out.push(high);
      writeRawString(out, f.name);
    }
    writeRawString(out, f.value);
  }
  return Buffer.from(out);
}

/** Encodes an integer with an N-bit prefix (exported for tests that craft their own blocks). */
export function encodeInteger(value: number, prefix: number, high = 0): Buffer {
  const out: number[] = [];
  writeInteger(out, value, prefix, high);
  return Buffer.from(out);
}
