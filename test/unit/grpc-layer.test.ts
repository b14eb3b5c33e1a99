/**
 * The one gRPC layer (agent/grpc/): varints, message framing, status codes, grpc-timeout,
 * grpc-message and the answer header blocks, each read back by an independent reader where one
 * exists (our HPACK decoder for the blocks, BigInt arithmetic for varints) and fed malformed input.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { BodyReader, declaredLength, encodeFrame, FRAME_PREFIX, framedLimit, readFrame, readSingleFrame } from '../../agent/grpc/frame.ts';
import {
  decodeGrpcMessage, encodeGrpcMessage, formatGrpcTimeout, OK_TRAILERS_BLOCK, OK_TRAILERS_WITH_MESSAGE_BLOCK, parseGrpcTimeout,
  responseHeadersBlock, trailersOnlyBlock,
} from '../../agent/grpc/headers.ts';
import { readFields, varintBytes, WireError, WireReader, WireTruncated, WireWriter } from '../../agent/grpc/protowire.ts';
import { codeFromHttpStatus, codeFromRstStream, goCodeName, GRPC_CODE_NAMES, GrpcCode, parseGrpcStatus } from '../../agent/grpc/status.ts';
import { HpackDecoder } from '../../agent/http2/hpack.ts';
import { decodeHealthStatus } from '../../agent/probe/grpc-wire.ts';

const decode = (block: Buffer): [string, string][] =>
  new HpackDecoder({ maxTableSize: 4096, maxHeaderListSize: 1 << 20 }).decode(block).map((f) => [f.name, f.value]);

/** A varint by BigInt arithmetic (unsigned 64-bit), independent of varintBytes. */
function referenceVarint(n: bigint): Buffer {
  const out: number[] = [];
  let v = BigInt.asUintN(64, n);
  do {
    const b = Number(v & 0x7fn);
    v >>= 7n;
    out.push(v > 0n ? b | 0x80 : b);
  } while (v > 0n);
  return Buffer.from(out);
}

describe('protobuf varints', () => {
  it('write and read back every int32 and every safe non-negative integer', () => {
    fc.assert(fc.property(fc.oneof(fc.integer(), fc.maxSafeNat()), (n) => {
      const bytes = varintBytes(n);
      expect(bytes).toEqual(referenceVarint(BigInt(n)));
      const r = new WireReader(bytes);
      expect(r.varint()).toBe(n);
      expect(r.pos).toBe(bytes.length);
    }));
  });

  it('a negative int32 is 10 octets and reads back signed', () => {
    expect(varintBytes(-1)).toEqual(Buffer.from([0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]));
    expect(new WireReader(varintBytes(-2147483648)).varint()).toBe(-2147483648);
  });

  it('reads from an offset up to an end, and says truncated when the end comes first', () => {
    const buf = Buffer.from([0x99, 0xac, 0x02, 0x05]);
    const r = new WireReader(buf, 1, 3);
    expect(r.varint()).toBe(300);
    expect(() => new WireReader(buf, 0, 2).varint()).toThrow(WireTruncated);
    expect(() => new WireReader(Buffer.alloc(0)).varint()).toThrow(WireTruncated);
  });

  it('refuses a varint past 10 octets, or past the bound a caller sets', () => {
    const eleven = Buffer.from([...Array<number>(10).fill(0x80), 0x01]);
    expect(() => new WireReader(eleven).varint()).toThrow('varint longer than 10 bytes');
    const six = Buffer.from([0x80, 0x80, 0x80, 0x80, 0x80, 0x01]);
    expect(new WireReader(six).varint()).toBe(2 ** 35);
    const e = (() => {
      try {
        new WireReader(six).varint(5);
      } catch (err) {
        return err;
      }
      return undefined;
    })();
    expect(e).toBeInstanceOf(WireError);
    expect(e).not.toBeInstanceOf(WireTruncated);
  });

  it('readFields rejects bad varints, lengths past the end and field 0, and reads what WireWriter writes', () => {
    expect(() => readFields(Buffer.from([0x08]), () => {})).toThrow('truncated varint');
    expect(() => readFields(Buffer.from([0x12, 0x05, 0x61]), () => {})).toThrow('length 5 past the end');
    expect(() => readFields(Buffer.from([0x00, 0x01]), () => {})).toThrow('field number 0');
    expect(() => readFields(Buffer.from([0x0b]), () => {})).toThrow('unsupported wire type 3');
    const got: [number, unknown][] = [];
    readFields(new WireWriter().varint(1, -5).bytes(2, 'hé').double(3, 1.5).finish(), (f, v) => got.push([f, Buffer.isBuffer(v) && f === 2 ? v.toString('utf8') : v]));
    expect(got.slice(0, 2)).toEqual([[1, -5], [2, 'hé']]);
    expect(got[2]![0]).toBe(3);
  });

  it('the health status reads as Go does: an enum keeps its low 32 bits; lengths past the end are EOF, never a loop', () => {
    // 1 + 2^35: Go's enum is an int32, so SERVING.
    expect(decodeHealthStatus(Buffer.from([0x08, 0x81, 0x80, 0x80, 0x80, 0x80, 0x01]))).toBe(1);
    // A 10-octet (negative) length on an unknown field.
    const negLen = Buffer.concat([Buffer.from([0x12]), varintBytes(-1), Buffer.from([0x08, 0x01])]);
    expect(() => decodeHealthStatus(negLen)).toThrow('unexpected EOF');
    expect(() => decodeHealthStatus(Buffer.from([0x08, ...Array<number>(10).fill(0xff), 0x01]))).toThrow('varint overflow');
    expect(() => decodeHealthStatus(Buffer.from([0x0b]))).toThrow('bad wire type 3');
  });
});

describe('length-prefixed messages', () => {
  it('round-trip any message', () => {
    fc.assert(fc.property(fc.uint8Array({ maxLength: 300 }), (m) => {
      const msg = Buffer.from(m);
      const framed = encodeFrame(msg);
      expect(framed.length).toBe(FRAME_PREFIX + msg.length);
      expect(framed[0]).toBe(0);
      expect(declaredLength(framed)).toBe(msg.length);
      expect(readSingleFrame(framed)).toEqual(msg);
      expect(readFrame(Buffer.concat([framed, Buffer.from([1, 2])]), false)).toEqual(msg);
    }));
  });

  it('says why a body holds no message', () => {
    expect(readFrame(Buffer.from([0, 0, 0, 0]), true)).toBe('short');
    expect(declaredLength(Buffer.from([0, 0, 0, 0]))).toBeUndefined();
    expect(readFrame(Buffer.from([1, 0, 0, 0, 0]), true)).toBe('compressed');
    expect(readFrame(Buffer.from([0, 0, 0, 0, 2, 9]), true)).toBe('truncated');
    expect(readFrame(Buffer.from([0, 0, 0, 0, 1, 9, 9]), true)).toBe('trailing');
    expect(readSingleFrame(Buffer.from([0, 0, 0, 0, 1, 9, 9]))).toBeNull();
    // The largest length a prefix can declare: truncated, nothing allocated for it.
    const huge = Buffer.from([0, 0xff, 0xff, 0xff, 0xff, 1, 2, 3]);
    expect(declaredLength(huge)).toBe(2 ** 32 - 1);
    expect(readFrame(huge, false)).toBe('truncated');
  });

  it('a body reader holds up to its bound and nothing past it', () => {
    const limit = framedLimit(10);
    expect(limit).toBe(15);
    const r = new BodyReader(limit);
    expect(r.add(Buffer.alloc(7, 1))).toBe(true);
    expect(r.add(Buffer.alloc(0))).toBe(true);
    expect(r.add(Buffer.alloc(8, 2))).toBe(true);
    expect(r.size).toBe(15);
    expect(r.take()).toEqual(Buffer.concat([Buffer.alloc(7, 1), Buffer.alloc(8, 2)]));
    expect(r.take()).toEqual(Buffer.alloc(0));
    const over = new BodyReader(limit);
    expect(over.add(Buffer.alloc(15))).toBe(true);
    expect(over.add(Buffer.alloc(1))).toBe(false);
    expect(over.size).toBe(16);
    expect(over.take()).toEqual(Buffer.alloc(0));
  });

  it('a copying reader holds no view of the reads', () => {
    const read = Buffer.from('abcdef');
    const r = new BodyReader(100, true);
    r.add(read.subarray(1, 3));
    read.fill(0);
    expect(r.take().toString()).toBe('bc');
  });
});

describe('status codes', () => {
  it('names and numbers agree both ways, for all 17', () => {
    expect(GRPC_CODE_NAMES).toHaveLength(17);
    GRPC_CODE_NAMES.forEach((name, n) => expect(GrpcCode[name]).toBe(n));
    expect(Object.keys(GrpcCode)).toHaveLength(17);
  });

  it("grpc-go's names, grpc-status values, and the clients' mappings", () => {
    expect(goCodeName(GrpcCode.CANCELLED)).toBe('Canceled');
    expect(goCodeName(GrpcCode.UNAVAILABLE)).toBe('Unavailable');
    expect(goCodeName(42)).toBe('Code(42)');
    expect(parseGrpcStatus(undefined)).toBeUndefined();
    expect(parseGrpcStatus('14')).toBe(14);
    for (const bad of ['', 'x', '-1', '123', '1.0', ' 1']) expect(parseGrpcStatus(bad), bad).toBe(GrpcCode.UNKNOWN);
    expect([400, 401, 403, 404, 429, 502, 503, 504, 500, 0].map(codeFromHttpStatus)).toEqual([13, 16, 7, 12, 14, 14, 14, 14, 2, 2]);
    expect(codeFromRstStream(7)).toBe(GrpcCode.UNAVAILABLE);
    expect(codeFromRstStream(8)).toBe(GrpcCode.CANCELLED);
    expect(codeFromRstStream(0xff)).toBe(GrpcCode.UNKNOWN);
  });
});

describe('grpc-timeout', () => {
  it('reads every unit', () => {
    expect(parseGrpcTimeout('2H')).toBe(7_200_000);
    expect(parseGrpcTimeout('2M')).toBe(120_000);
    expect(parseGrpcTimeout('125S')).toBe(125_000);
    expect(parseGrpcTimeout('1500m')).toBe(1500);
    expect(parseGrpcTimeout('5000u')).toBe(5);
    expect(parseGrpcTimeout('3000000n')).toBeCloseTo(3);
    expect(parseGrpcTimeout('99999999m')).toBe(99_999_999);
  });

  it('refuses bad units, signs, fractions, more than 8 digits, and non-strings', () => {
    for (const bad of ['', '1', 'S', '1s', '1x', '1h', '-1S', '+1S', '1.5S', ' 1S', '1S ', '123456789m', '1e3m', '１S']) {
      expect(parseGrpcTimeout(bad), bad).toBeUndefined();
    }
    expect(parseGrpcTimeout(undefined)).toBeUndefined();
    expect(parseGrpcTimeout(['1S'])).toBeUndefined();
  });

  it('writes ms as ms, at least 1, and past 8 digits in a coarser unit, never shorter', () => {
    expect(formatGrpcTimeout(0)).toBe('1m');
    expect(formatGrpcTimeout(-5)).toBe('1m');
    expect(formatGrpcTimeout(1500)).toBe('1500m');
    expect(formatGrpcTimeout(99_999_999)).toBe('99999999m');
    expect(formatGrpcTimeout(100_000_001)).toBe('100001S');
    expect(formatGrpcTimeout(Number.MAX_SAFE_INTEGER)).toMatch(/^\d{1,8}H$/);
    fc.assert(fc.property(fc.integer({ min: 1, max: 2 ** 45 }), (ms) => {
      const text = formatGrpcTimeout(ms);
      const back = parseGrpcTimeout(text);
      expect(back, text).toBeDefined();
      expect(back!).toBeGreaterThanOrEqual(ms);
      if (ms <= 99_999_999) expect(back).toBe(ms);
    }));
  });
});

describe('grpc-message', () => {
  it("percent-encodes '%', controls and non-ASCII, and nothing else", () => {
    expect(encodeGrpcMessage('100% done')).toBe('100%25 done');
    expect(encodeGrpcMessage('a\nb')).toBe('a%0Ab');
    expect(encodeGrpcMessage('\u2713 ok')).toBe('%E2%9C%93 ok');
    expect(encodeGrpcMessage('plain ASCII ~!')).toBe('plain ASCII ~!');
  });

  it('round-trips any string', () => {
    fc.assert(fc.property(fc.string({ unit: 'grapheme' }), (s) => {
      const enc = encodeGrpcMessage(s);
      expect(enc).toMatch(/^[\x20-\x7e]*$/);
      expect(decodeGrpcMessage(enc)).toBe(s);
    }));
  });

  it('decodes leniently: invalid escapes stay as written, lower-case hex is read', () => {
    expect(decodeGrpcMessage('a%20b%zz%')).toBe('a b%zz%');
    expect(decodeGrpcMessage('%e2%9c%93')).toBe('\u2713');
    expect(decodeGrpcMessage('%4')).toBe('%4');
    expect(decodeGrpcMessage('no escapes')).toBe('no escapes');
    // Octets that are no UTF-8: replacement characters, never a throw.
    expect(decodeGrpcMessage('%FF')).toBe('\ufffd');
  });
});

describe('answer header blocks', () => {
  it('carry :status 200 and the content-type; OK trailers as grpc-go and grpc-js send them', () => {
    expect(decode(responseHeadersBlock('application/grpc'))).toEqual([[':status', '200'], ['content-type', 'application/grpc']]);
    expect(decode(responseHeadersBlock('application/grpc+proto'))).toEqual([[':status', '200'], ['content-type', 'application/grpc+proto']]);
    expect(decode(OK_TRAILERS_BLOCK)).toEqual([['grpc-status', '0']]);
    expect(decode(OK_TRAILERS_WITH_MESSAGE_BLOCK)).toEqual([['grpc-status', '0'], ['grpc-message', 'OK']]);
  });

  it('a trailers-only answer: status, the message cut and encoded, extra fields; no dynamic table used', () => {
    const block = trailersOnlyBlock('application/grpc', GrpcCode.UNAVAILABLE, '50% \u2713'.padEnd(2000, 'x'), 4, [{ name: 'x-why', value: 'drain' }]);
    expect(decode(block)).toEqual([
      [':status', '200'], ['content-type', 'application/grpc'], ['grpc-status', '14'], ['grpc-message', '50%25 '], ['x-why', 'drain'],
    ]);
    const d = new HpackDecoder({ maxTableSize: 4096, maxHeaderListSize: 1 << 20 });
    d.decode(block);
    expect(d.tableSize).toBe(0);
  });
});
