/**
 * The shim's HPACK decoder and literal encoder (agent/http2/hpack.ts, huffman.ts) against the
 * examples of RFC 7541 Appendix C, the Huffman code of Appendix B, and malformed input, which must
 * only ever be an HpackError.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { encodeInteger, encodeLiteralBlock, HpackDecoder, HpackError, type HeaderField } from '../../agent/http2/hpack.ts';
import { HUFFMAN_CODES, HUFFMAN_LENGTHS, huffmanDecode, huffmanEncode } from '../../agent/http2/huffman.ts';

const hex = (s: string): Buffer => Buffer.from(s.replace(/\s+/g, ''), 'hex');
const pairs = (fields: HeaderField[]): string[][] => fields.map((f) => [f.name, f.value]);
const decoder = (maxTableSize = 4096): HpackDecoder => new HpackDecoder({ maxTableSize, maxHeaderListSize: 64 * 1024 });

describe('the Huffman code (RFC 7541 Appendix B)', () => {
  it('derives the RFC\'s codes from the code lengths', () => {
    // [symbol, code as hex aligned to LSB, length] rows of Appendix B.
    const rows: Array<[number, number, number]> = [
      [0, 0x1ff8, 13], [1, 0x7fffd8, 23], [9, 0xffffea, 24], [10, 0x3ffffffc, 30], [22, 0x3ffffffe, 30], [32, 0x14, 6],
      [33, 0x3f8, 10], [47, 0x18, 6], [48, 0x0, 5], [58, 0x5c, 7], [60, 0x7ffc, 15], [88, 0xfc, 8], [92, 0x7fff0, 19],
      [97, 0x3, 5], [123, 0x7ffe, 15], [126, 0x1ffd, 13], [127, 0xffffffc, 28], [128, 0xfffe6, 20], [153, 0x1fffdc, 21],
      [174, 0x7fffeb, 23], [195, 0x7fff1, 19], [199, 0x1ffffec, 25], [203, 0x7ffffde, 27], [220, 0xffffffd, 28],
      [254, 0x7fffff0, 27], [255, 0x3ffffee, 26], [256, 0x3fffffff, 30],
    ];
    for (const [sym, code, len] of rows) expect([sym, HUFFMAN_CODES[sym], HUFFMAN_LENGTHS[sym]]).toEqual([sym, code, len]);
    // A complete prefix code: the Kraft sum is exactly 1.
    expect(HUFFMAN_LENGTHS.reduce((s, l) => s + 2 ** -l, 0)).toBe(1);
  });

  it('round-trips any octets', () => {
    fc.assert(fc.property(fc.uint8Array({ maxLength: 300 }), (a) => {
      const b = Buffer.from(a);
      expect(huffmanDecode(huffmanEncode(b))).toEqual(b);
    }));
  });

  it('refuses EOS inside a string, padding longer than 7 bits, padding not all ones', () => {
    expect(huffmanDecode(hex('ff ff ff ff'))).toMatch(/EOS/);
    // 'a' (00011) then 11 one-bits of padding.
    expect(huffmanDecode(hex('1f ff'))).toMatch(/longer than 7/);
    // 'a' (00011) then 000 as padding.
    expect(huffmanDecode(hex('18'))).toMatch(/not all ones/);
  });
});

describe('integers (RFC 7541 C.1)', () => {
  it('encodes 10 and 1337 on a 5-bit prefix, 42 on 8 bits', () => {
    expect(encodeInteger(10, 5)).toEqual(hex('0a'));
    expect(encodeInteger(1337, 5)).toEqual(hex('1f 9a 0a'));
    expect(encodeInteger(42, 8)).toEqual(hex('2a'));
  });
});

describe('header field representations (RFC 7541 C.2)', () => {
  it('C.2.1 literal with indexing, C.2.2 without, C.2.3 never indexed, C.2.4 indexed', () => {
    const d = decoder();
    expect(d.decode(hex('400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572'))).toEqual([{ name: 'custom-key', value: 'custom-header' }]);
    expect(d.tableSize).toBe(55);
    const d2 = decoder();
    expect(d2.decode(hex('040c 2f73 616d 706c 652f 7061 7468'))).toEqual([{ name: ':path', value: '/sample/path' }]);
    expect(d2.tableSize).toBe(0);
    expect(decoder().decode(hex('1008 7061 7373 776f 7264 0673 6563 7265 74'))).toEqual([{ name: 'password', value: 'secret', neverIndexed: true }]);
    expect(decoder().decode(hex('82'))).toEqual([{ name: ':method', value: 'GET' }]);
  });
});

/** The three requests of C.3 and C.4 (the same lists, without and with Huffman). */
const REQUESTS = [
  [[':method', 'GET'], [':scheme', 'http'], [':path', '/'], [':authority', 'www.example.com']],
  [[':method', 'GET'], [':scheme', 'http'], [':path', '/'], [':authority', 'www.example.com'], ['cache-control', 'no-cache']],
  [[':method', 'GET'], [':scheme', 'https'], [':path', '/index.html'], [':authority', 'www.example.com'], ['custom-key', 'custom-value']],
];
const REQUEST_TABLES = [
  [[':authority', 'www.example.com']],
  [['cache-control', 'no-cache'], [':authority', 'www.example.com']],
  [['custom-key', 'custom-value'], ['cache-control', 'no-cache'], [':authority', 'www.example.com']],
];
const REQUEST_SIZES = [57, 110, 164];

/** The three responses of C.5 and C.6, with SETTINGS_HEADER_TABLE_SIZE 256. */
const RESPONSES = [
  [[':status', '302'], ['cache-control', 'private'], ['date', 'Mon, 21 Oct 2013 20:13:21 GMT'], ['location', 'https://www.example.com']],
  [[':status', '307'], ['cache-control', 'private'], ['date', 'Mon, 21 Oct 2013 20:13:21 GMT'], ['location', 'https://www.example.com']],
  [[':status', '200'], ['cache-control', 'private'], ['date', 'Mon, 21 Oct 2013 20:13:22 GMT'], ['location', 'https://www.example.com'], ['content-encoding', 'gzip'],
    ['set-cookie', 'foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1']],
];
const RESPONSE_TABLES = [
  [['location', 'https://www.example.com'], ['date', 'Mon, 21 Oct 2013 20:13:21 GMT'], ['cache-control', 'private'], [':status', '302']],
  [[':status', '307'], ['location', 'https://www.example.com'], ['date', 'Mon, 21 Oct 2013 20:13:21 GMT'], ['cache-control', 'private']],
  [['set-cookie', 'foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1'], ['content-encoding', 'gzip'], ['date', 'Mon, 21 Oct 2013 20:13:22 GMT']],
];
const RESPONSE_SIZES = [222, 222, 215];

function sequence(blocks: string[], maxTableSize: number, lists: string[][][], tables: string[][][], sizes: number[]): void {
  const d = decoder(maxTableSize);
  blocks.forEach((b, i) => {
    expect(pairs(d.decode(hex(b)))).toEqual(lists[i]);
    expect(d.dynamicTable.map((e) => [...e])).toEqual(tables[i]);
    expect(d.tableSize).toBe(sizes[i]);
  });
}

describe('RFC 7541 Appendix C sequences, one decoder per connection', () => {
  it('C.3 requests without Huffman', () => {
    sequence([
      '8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d',
      '8286 84be 5808 6e6f 2d63 6163 6865',
      '8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65',
    ], 4096, REQUESTS, REQUEST_TABLES, REQUEST_SIZES);
  });

  it('C.4 requests with Huffman', () => {
    sequence([
      '8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff',
      '8286 84be 5886 a8eb 1064 9cbf',
      '8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf',
    ], 4096, REQUESTS, REQUEST_TABLES, REQUEST_SIZES);
  });

  it('C.5 responses without Huffman, evicting from a 256-octet table', () => {
    sequence([
      '4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70 6c65 2e63 6f6d',
      '4803 3330 37c1 c0bf',
      '88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 474d 54c0 5a04 677a 6970 7738 666f 6f3d 4153 444a 4b48 514b 425a 584f 5157 454f 5049 5541 5851 5745 4f49 553b 206d 6178 2d61 6765 3d33 3630 303b 2076 6572 7369 6f6e 3d31',
    ], 256, RESPONSES, RESPONSE_TABLES, RESPONSE_SIZES);
  });

  it('C.6 responses with Huffman, evicting from a 256-octet table', () => {
    sequence([
      '4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6 2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3',
      '4883 640e ffc1 c0bf',
      '88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b d9ab 77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f 9587 3160 65c0 03ed 4ee5 b106 3d50 07',
    ], 256, RESPONSES, RESPONSE_TABLES, RESPONSE_SIZES);
  });
});

describe('self-contained blocks (the relay passes these on as they came)', () => {
  it('a block is self-contained unless it reads the dynamic table or changes its size', () => {
    const d = decoder(4096);
    // C.4.1: static indices and a literal with indexing (an insertion reads nothing).
    d.decode(hex('8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff'));
    expect(d.lastBlockSelfContained).toBe(true);
    // C.4.2: 0xbe is dynamic index 62, the entry C.4.1 inserted.
    d.decode(hex('8286 84be 5886 a8eb 1064 9cbf'));
    expect(d.lastBlockSelfContained).toBe(false);
    // A literal whose name is a dynamic entry (0x7e: with indexing, name index 62).
    d.decode(hex('7e 0161'));
    expect(d.lastBlockSelfContained).toBe(false);
    // A size update, even to the same size, then only static fields.
    d.decode(hex('3fe1 1f 82'));
    expect(d.lastBlockSelfContained).toBe(false);
    // Never indexed with a literal name, and an indexed static field: self-contained again.
    d.decode(hex('10 0161 0162 88'));
    expect(d.lastBlockSelfContained).toBe(true);
  });

  it('any self-contained block decodes to the same fields whatever another decoder holds', () => {
    fc.assert(fc.property(fc.uint8Array({ maxLength: 64 }), fc.uint8Array({ maxLength: 64 }), (history, a) => {
      const first = decoder(4096);
      const other = decoder(4096);
      // The other decoder carries a history of its own (whatever parses of random octets).
      try {
        other.decode(hex('4082 94e7 0362 6172 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf'));
        other.decode(Buffer.from(history));
      } catch {
        // A malformed history leaves the decoder's state unspecified, which is the point.
      }
      let fields: HeaderField[];
      try {
        fields = first.decode(Buffer.from(a));
      } catch {
        return;
      }
      if (!first.lastBlockSelfContained) return;
      expect(pairs(other.decode(Buffer.from(a)))).toEqual(pairs(fields));
    }));
  });
});

describe('dynamic table size updates', () => {
  it('a size update to 0 empties the table; one beyond SETTINGS_HEADER_TABLE_SIZE is refused', () => {
    const d = decoder(4096);
    d.decode(hex('8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d'));
    expect(d.tableSize).toBe(57);
    expect(pairs(d.decode(Buffer.concat([encodeInteger(0, 5, 0x20), hex('82')])))).toEqual([[':method', 'GET']]);
    expect(d.tableSize).toBe(0);
    expect(() => d.decode(hex('be'))).toThrow(HpackError);
    expect(() => decoder(4096).decode(encodeInteger(4097, 5, 0x20))).toThrow(/beyond the allowed 4096/);
  });

  it('a size update after a header field is refused', () => {
    expect(() => decoder().decode(Buffer.concat([hex('82'), encodeInteger(0, 5, 0x20)]))).toThrow(/after a header field/);
  });
});

describe('malformed input is an HpackError, never anything else', () => {
  it.each([
    ['index 0', '80'],
    ['an index beyond both tables', 'be'],
    ['a truncated integer', '7f'],
    ['an integer too long', '7f ff ff ff ff ff ff 01'],
    ['a string overrunning the block', '40 0a 61'],
    ['a truncated string length', '40'],
    ['a Huffman string holding EOS', '40 84 ff ff ff ff 01 61'],
  ])('%s', (_name, block) => {
    expect(() => decoder().decode(hex(block))).toThrow(HpackError);
  });

  it('a header list beyond maxHeaderListSize', () => {
    const d = new HpackDecoder({ maxTableSize: 4096, maxHeaderListSize: 100 });
    const block = encodeLiteralBlock([{ name: 'a', value: 'x'.repeat(40) }, { name: 'b', value: 'y'.repeat(40) }]);
    expect(() => d.decode(block)).toThrow(/header list larger than 100/);
  });

  it('random octets: an HpackError or a header list, and the decoder stays within its table bound', () => {
    fc.assert(fc.property(fc.array(fc.uint8Array({ maxLength: 200 }), { maxLength: 5 }), (blocks) => {
      const d = decoder(256);
      for (const b of blocks) {
        try {
          d.decode(Buffer.from(b));
        } catch (err) {
          expect(err).toBeInstanceOf(HpackError);
          return;
        }
        expect(d.tableSize).toBeLessThanOrEqual(256);
      }
    }), { numRuns: 2000 });
  });

  it('valid blocks with one octet changed, truncated or extended: an HpackError or a header list', () => {
    const valid = hex('88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b d9ab 77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f 9587 3160 65c0 03ed 4ee5 b106 3d50 07');
    fc.assert(fc.property(fc.nat(valid.length - 1), fc.integer({ min: 0, max: 255 }), fc.integer({ min: -8, max: 8 }), (at, value, cut) => {
      const b = Buffer.from(valid);
      b[at] = value;
      const mutated = cut < 0 ? b.subarray(0, b.length + cut) : Buffer.concat([b, Buffer.alloc(cut, value)]);
      try {
        decoder(256).decode(mutated);
      } catch (err) {
        expect(err).toBeInstanceOf(HpackError);
      }
    }), { numRuns: 2000 });
  });
});

describe('the literal encoder', () => {
  const field = fc.record({
    name: fc.oneof(fc.constantFrom(':authority', ':path', 'content-type', 'host', 'te', 'grpc-timeout', 'user-agent'), fc.string({ minLength: 1, maxLength: 40 })),
    value: fc.oneof(fc.string({ maxLength: 200 }), fc.uint8Array({ maxLength: 200 }).map((a) => Buffer.from(a).toString('latin1'))),
    neverIndexed: fc.boolean(),
  }).map(({ name, value, neverIndexed }): HeaderField => {
    // Latin1 strings: each char one octet, as the decoder returns them.
    const f: HeaderField = { name: Buffer.from(name, 'latin1').toString('latin1'), value: Buffer.from(value, 'latin1').toString('latin1') };
    if (neverIndexed) f.neverIndexed = true;
    return f;
  });

  it('round-trips any header list through a decoder, never touching its dynamic table', () => {
    fc.assert(fc.property(fc.array(field, { maxLength: 20 }), (fields) => {
      const d = decoder();
      expect(d.decode(encodeLiteralBlock(fields))).toEqual(fields);
      expect(d.tableSize).toBe(0);
    }));
  });

  it('writes names the static table has by index, the rest literally, never-indexed as such (C.2.2, C.2.3)', () => {
    expect(encodeLiteralBlock([{ name: ':path', value: '/sample/path' }])).toEqual(hex('040c 2f73 616d 706c 652f 7061 7468'));
    expect(encodeLiteralBlock([{ name: 'password', value: 'secret', neverIndexed: true }])).toEqual(hex('1008 7061 7373 776f 7264 0673 6563 7265 74'));
  });
});
