/**
 * The HPACK Huffman code (RFC 7541 Appendix B). The code is canonical: symbols sorted by (code
 * length, symbol) take consecutive codes, so the 257 code lengths below are the whole table and
 * the codes are derived from them (test/unit/shim-hpack.test.ts checks them against the RFC's).
 */

/** Code length in bits of each symbol 0..255 and EOS (256), in order, from RFC 7541 Appendix B. */
const CODE_LENGTHS: readonly number[] = [
  // 0..31: control octets
  13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28,
  28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28,
  // 32..63: ' ' ! " # $ % & ' ( ) * + , - . /  0 1 2 3 4 5 6 7 8 9 : ; < = > ?
  6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6,
  5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10,
  // 64..95: @ A..Z [ \ ] ^ _
  13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
  7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6,
  // 96..127: ` a..z { | } ~ DEL
  15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5,
  6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28,
  // 128..255
  20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23,
  24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24,
  22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23,
  21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23,
  26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25,
  19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27,
  20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23,
  26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26,
  // EOS
  30,
];

const EOS = 256;

/** Canonical codes from the lengths: codes[sym] right-aligned in lengths[sym] bits. */
function canonicalCodes(lengths: readonly number[]): number[] {
  const order = lengths.map((len, sym) => [len, sym] as const).sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  const codes = new Array<number>(lengths.length);
  let code = 0;
  let prevLen = order[0]![0];
  for (const [len, sym] of order) {
    code *= 2 ** (len - prevLen);
    prevLen = len;
    codes[sym] = code;
    code++;
  }
  return codes;
}

/** The code of each symbol (0..256), right-aligned. */
export const HUFFMAN_CODES: readonly number[] = canonicalCodes(CODE_LENGTHS);
/** The length in bits of each symbol's code (0..256). */
export const HUFFMAN_LENGTHS: readonly number[] = CODE_LENGTHS;

/**
 * The decoding trie: node n's children are at [2n] (bit 0) and [2n+1] (bit 1); a child value
 * >= 0 is another node, a value < 0 is the leaf of symbol (-value - 1).
 */
const TRIE: Int32Array = (() => {
  const t = new Int32Array(2 * 512).fill(0);
  let nodes = 1;
  for (let sym = 0; sym <= EOS; sym++) {
    const len = CODE_LENGTHS[sym]!;
    const code = HUFFMAN_CODES[sym]!;
    let node = 0;
    for (let i = len - 1; i >= 0; i--) {
      const bit = Math.floor(code / 2 ** i) & 1;
      const slot = 2 * node + bit;
      if (i === 0) {
        t[slot] = -sym - 1;
      } else {
        if (t[slot] === 0) t[slot] = nodes++;
        node = t[slot]!;
      }
    }
  }
  return t;
})();

/**
 * Decodes a Huffman-coded string. Returns the octets, or an error text when the input holds EOS,
 * or ends in padding longer than 7 bits or not made of ones (RFC 7541 5.2).
 */
export function huffmanDecode(input: Buffer): Buffer | string {
  const out = Buffer.allocUnsafe(Math.floor((input.length * 8) / 5) + 1);
  let n = 0;
  let node = 0;
  /** Bits read since the last symbol, and whether all were ones (a valid padding so far). */
  let pending = 0;
  let allOnes = true;
  for (let i = 0; i < input.length; i++) {
    const byte = input[i]!;
    for (let bit = 7; bit >= 0; bit--) {
      const b = (byte >> bit) & 1;
      const next = TRIE[2 * node + b]!;
      pending++;
      if (b === 0) allOnes = false;
      if (next < 0) {
        const sym = -next - 1;
        if (sym === EOS) return 'EOS symbol in a Huffman string';
        out[n++] = sym;
        node = 0;
        pending = 0;
        allOnes = true;
      } else {
        node = next;
      }
    }
  }
  if (pending > 7) return 'Huffman padding longer than 7 bits';
  if (!allOnes) return 'Huffman padding not all ones';
  return out.subarray(0, n);
}

/** Huffman-encodes octets (for tests and tools that craft header blocks). */
export function huffmanEncode(input: Buffer): Buffer {
  const out: number[] = [];
  let acc = 0;
  let bits = 0;
  for (const sym of input) {
    const len = CODE_LENGTHS[sym]!;
    const code = HUFFMAN_CODES[sym]!;
    for (let i = len - 1; i >= 0; i--) {
      acc = (acc << 1) | (Math.floor(code / 2 ** i) & 1);
      if (++bits === 8) {
        out.push(acc);
        acc = 0;
        bits = 0;
      }
    }
  }
  if (bits > 0) out.push(((acc << (8 - bits)) | ((1 << (8 - bits)) - 1)) & 0xff);
  return Buffer.from(out);
}
