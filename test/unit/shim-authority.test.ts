/**
 * The shim's :authority rewrite (agent/http2/authority.ts) on crafted client byte streams: every
 * request header block comes out with an authority nghttp2 accepts and otherwise the same fields,
 * frames other than HEADERS/CONTINUATION come out byte-identical, trailers keep their fields, large
 * blocks are split to the frame size, and malformed input is an H2InputError, never anything else.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { acceptableAuthority, AuthorityRewriter, H2_LIMITS, withAcceptableAuthority } from '../../agent/http2/authority.ts';
import { FrameSplitter, HeaderBlockJoiner } from '../../agent/http2/connection.ts';
import { CLIENT_PREFACE, Flag, frameBytes, FrameType, H2InputError, type Frame } from '../../agent/http2/wire.ts';
import { encodeInteger, encodeLiteralBlock, HpackDecoder, type HeaderField } from '../../agent/http2/hpack.ts';
import { huffmanEncode } from '../../agent/http2/huffman.ts';

const SETTINGS = frameBytes(FrameType.SETTINGS, 0, 0, Buffer.from([0, 4, 0, 0x10, 0, 0]));
const REQUEST: HeaderField[] = [
  { name: ':method', value: 'POST' }, { name: ':scheme', value: 'http' }, { name: ':path', value: '/runtime.v1.RuntimeService/Version' },
  { name: ':authority', value: '/run/containerd/containerd.sock' }, { name: 'content-type', value: 'application/grpc' },
  { name: 'user-agent', value: 'grpc-go/1.51.0' }, { name: 'te', value: 'trailers' }, { name: 'grpc-timeout', value: '119999m' },
];

/** A header block as grpc-go writes one: literals with incremental indexing, Huffman strings. */
function indexedHuffmanBlock(fields: HeaderField[]): Buffer {
  const out: Buffer[] = [];
  for (const f of fields) {
    const name = huffmanEncode(Buffer.from(f.name, 'latin1'));
    const value = huffmanEncode(Buffer.from(f.value, 'latin1'));
    out.push(Buffer.from([0x40]), encodeInteger(name.length, 7, 0x80), name, encodeInteger(value.length, 7, 0x80), value);
  }
  return Buffer.concat(out);
}

/** Every frame of a server-bound byte stream (after the preface), and the request header lists decoded. */
function readOutput(bytes: Buffer): { frames: Frame[]; blocks: Array<{ streamId: number; endStream: boolean; priority: Buffer | null; fields: HeaderField[] }> } {
  expect(bytes.subarray(0, CLIENT_PREFACE.length)).toEqual(CLIENT_PREFACE);
  const r = new FrameSplitter(true);
  r.push(bytes);
  const frames: Frame[] = [];
  const collect = new HeaderBlockJoiner(H2_LIMITS.maxHeaderBlock);
  const d = new HpackDecoder({ maxTableSize: 4096, maxHeaderListSize: 1 << 20 });
  const blocks = [];
  for (let f = r.next(); f !== null; f = r.next()) {
    frames.push(f);
    expect(f.payload.length).toBeLessThanOrEqual(H2_LIMITS.maxFrameSize);
    if (f.type === FrameType.HEADERS || f.type === FrameType.CONTINUATION) {
      const h = collect.take(f);
      if (h) blocks.push({ streamId: h.streamId, endStream: h.endStream, priority: h.priority, fields: d.decode(h.block) });
    }
  }
  expect(r.pending.length).toBe(0);
  // The server's decoder never holds anything: the rewrite only writes literals without indexing.
  expect(d.tableSize).toBe(0);
  return { frames, blocks };
}

describe('which authorities Node\'s HTTP/2 server accepts', () => {
  it('host names, ports, IP literals and percent-escapes; not paths, spaces, "@", empty or non-ASCII', () => {
    for (const ok of ['localhost', 'localhost:80', '[::1]:10010', '127.0.0.1', 'x%2Fy', "a!$&'()*+,;=_~-.b"]) expect(acceptableAuthority(ok), ok).toBe(true);
    for (const bad of ['/run/containerd/containerd.sock', 'unix:///run/x.sock', '', 'a b', 'a@b', 'tést', 'a?b', 'a#b', 'a{b}', 'a\\b', 'a"b']) expect(acceptableAuthority(bad), bad).toBe(false);
  });

  it('replaces an unacceptable :authority or host by localhost, adds one after the pseudo-headers where there is none', () => {
    expect(withAcceptableAuthority(REQUEST).find((f) => f.name === ':authority')?.value).toBe('localhost');
    const none = REQUEST.filter((f) => f.name !== ':authority');
    expect(withAcceptableAuthority(none).map((f) => f.name)).toEqual([':method', ':scheme', ':path', ':authority', 'content-type', 'user-agent', 'te', 'grpc-timeout']);
    expect(withAcceptableAuthority([...none, { name: 'host', value: '/x.sock' }]).filter((f) => f.name === 'host' || f.name === ':authority').map((f) => f.value)).toEqual(['localhost', 'localhost']);
    const fine = REQUEST.map((f) => (f.name === ':authority' ? { ...f, value: 'localhost:10010' } : f));
    expect(withAcceptableAuthority(fine)).toEqual(fine);
  });
});

describe('the client→server rewrite', () => {
  function clientStream(): { bytes: Buffer; data: Buffer; windowUpdate: Buffer; ping: Buffer } {
    const first = indexedHuffmanBlock(REQUEST);
    // Split the first block over HEADERS (padded, with priority) and two CONTINUATIONs.
    const a = first.subarray(0, 20);
    const b = first.subarray(20, 50);
    const c = first.subarray(50);
    const priority = Buffer.from([0x80, 0, 0, 0, 15]);
    const padded = Buffer.concat([Buffer.from([7]), priority, a, Buffer.alloc(7)]);
    const data = frameBytes(FrameType.DATA, Flag.END_STREAM, 1, Buffer.from('\0\0\0\0\x03abc', 'latin1'));
    const windowUpdate = frameBytes(FrameType.WINDOW_UPDATE, 0, 0, Buffer.from([0, 0, 0x10, 0]));
    const ping = frameBytes(FrameType.PING, 0, 0, Buffer.alloc(8, 7));
    // The second request refers to the first's dynamic table entries only (indexed fields 62..69).
    const second = Buffer.from([0xc5, 0xc4, 0xc3, 0xc2, 0xc1, 0xc0, 0xbf, 0xbe]);
    // Trailers on stream 3, after its data: no pseudo-headers, no authority to add.
    const trailers = encodeLiteralBlock([{ name: 'x-trailer', value: '1' }]);
    const bytes = Buffer.concat([
      CLIENT_PREFACE, SETTINGS,
      frameBytes(FrameType.HEADERS, Flag.PADDED | Flag.PRIORITY, 1, padded),
      frameBytes(FrameType.CONTINUATION, 0, 1, b),
      frameBytes(FrameType.CONTINUATION, Flag.END_HEADERS, 1, c),
      data, windowUpdate, ping,
      frameBytes(FrameType.HEADERS, Flag.END_HEADERS, 3, second),
      frameBytes(FrameType.DATA, 0, 3, Buffer.from('\0\0\0\0\0', 'latin1')),
      frameBytes(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 3, trailers),
    ]);
    return { bytes, data, windowUpdate, ping };
  }

  it('gives every request localhost in place of the socket path and keeps everything else', () => {
    const { bytes, data, windowUpdate, ping } = clientStream();
    const out = new AuthorityRewriter().transform(bytes);
    const { frames, blocks } = readOutput(out);
    const expected = REQUEST.map((f) => (f.name === ':authority' ? { ...f, value: 'localhost' } : f));
    expect(blocks.map((b) => b.fields)).toEqual([expected, expected, [{ name: 'x-trailer', value: '1' }]]);
    expect(blocks.map((b) => [b.streamId, b.endStream])).toEqual([[1, false], [3, false], [3, true]]);
    expect(blocks[0]!.priority).toEqual(Buffer.from([0x80, 0, 0, 0, 15]));
    // Frames other than header blocks are byte-identical and in order.
    expect(frames.map((f) => f.type)).toEqual([FrameType.SETTINGS, FrameType.HEADERS, FrameType.DATA, FrameType.WINDOW_UPDATE, FrameType.PING, FrameType.HEADERS, FrameType.DATA, FrameType.HEADERS]);
    expect(frames[0]!.raw).toEqual(SETTINGS);
    expect(frames[2]!.raw).toEqual(data);
    expect(frames[3]!.raw).toEqual(windowUpdate);
    expect(frames[4]!.raw).toEqual(ping);
  });

  it('gives the same octets whether the client\'s arrive at once or one by one', () => {
    const { bytes } = clientStream();
    const whole = new AuthorityRewriter().transform(bytes);
    const r = new AuthorityRewriter();
    const pieces: Buffer[] = [];
    for (let i = 0; i < bytes.length; i++) pieces.push(r.transform(bytes.subarray(i, i + 1)));
    expect(Buffer.concat(pieces)).toEqual(whole);
  });

  it('adds an authority to a request that has none', () => {
    const none = REQUEST.filter((f) => f.name !== ':authority');
    const out = new AuthorityRewriter().transform(Buffer.concat([CLIENT_PREFACE, SETTINGS, frameBytes(FrameType.HEADERS, Flag.END_HEADERS, 1, encodeLiteralBlock(none))]));
    expect(readOutput(out).blocks[0]!.fields.find((f) => f.name === ':authority')?.value).toBe('localhost');
  });

  it('splits a rewritten block larger than the frame size into HEADERS and CONTINUATION frames', () => {
    // Huffman-coded 'a's shrink to 5/8: 30 KiB decoded fits in two input frames and needs two output frames.
    const big = [...REQUEST, { name: 'x-big', value: 'a'.repeat(30_000) }];
    const block = indexedHuffmanBlock(big);
    const input = Buffer.concat([
      CLIENT_PREFACE,
      frameBytes(FrameType.HEADERS, Flag.END_STREAM, 1, block.subarray(0, 16_000)),
      frameBytes(FrameType.CONTINUATION, Flag.END_HEADERS, 1, block.subarray(16_000)),
    ]);
    const { frames, blocks } = readOutput(new AuthorityRewriter().transform(input));
    expect(frames.map((f) => f.type)).toEqual([FrameType.HEADERS, FrameType.CONTINUATION]);
    expect(frames[0]!.flags & Flag.END_HEADERS).toBe(0);
    expect(frames[1]!.flags & Flag.END_HEADERS).toBe(Flag.END_HEADERS);
    expect(blocks[0]!.endStream).toBe(true);
    expect(blocks[0]!.fields.find((f) => f.name === 'x-big')?.value.length).toBe(30_000);
  });
});

describe('input the rewrite cannot carry: an H2InputError', () => {
  const hdr = (flags: number, sid: number, payload: Buffer): Buffer => frameBytes(FrameType.HEADERS, flags, sid, payload);
  const ok = encodeLiteralBlock(REQUEST);
  it.each([
    ['not HTTP/2 at all', Buffer.from('GET / HTTP/1.1\r\nHost: x\r\n\r\n')],
    ['a frame beyond SETTINGS_MAX_FRAME_SIZE', Buffer.concat([CLIENT_PREFACE, Buffer.from([0, 0x40, 1, 0, 0, 0, 0, 0, 1])])],
    ['CONTINUATION without HEADERS', Buffer.concat([CLIENT_PREFACE, frameBytes(FrameType.CONTINUATION, Flag.END_HEADERS, 1, ok)])],
    ['CONTINUATION on another stream', Buffer.concat([CLIENT_PREFACE, hdr(0, 1, ok.subarray(0, 5)), frameBytes(FrameType.CONTINUATION, Flag.END_HEADERS, 3, ok.subarray(5))])],
    ['DATA inside a header block', Buffer.concat([CLIENT_PREFACE, hdr(0, 1, ok.subarray(0, 5)), frameBytes(FrameType.DATA, 0, 1, Buffer.alloc(1))])],
    ['padding longer than the frame', Buffer.concat([CLIENT_PREFACE, hdr(Flag.PADDED | Flag.END_HEADERS, 1, Buffer.from([9, 1, 2]))])],
    ['PRIORITY flag on a too short frame', Buffer.concat([CLIENT_PREFACE, hdr(Flag.PRIORITY | Flag.END_HEADERS, 1, Buffer.from([1, 2]))])],
    ['HEADERS on stream 0', Buffer.concat([CLIENT_PREFACE, hdr(Flag.END_HEADERS, 0, ok)])],
    ['a malformed HPACK block', Buffer.concat([CLIENT_PREFACE, hdr(Flag.END_HEADERS, 1, Buffer.from([0x80]))])],
    ['PUSH_PROMISE from a client', Buffer.concat([CLIENT_PREFACE, frameBytes(FrameType.PUSH_PROMISE, Flag.END_HEADERS, 1, Buffer.concat([Buffer.alloc(4), ok]))])],
  ])('%s', (_name, bytes) => {
    expect(() => new AuthorityRewriter().transform(bytes)).toThrow(H2InputError);
  });

  it('a header block beyond its bound', () => {
    const r = new AuthorityRewriter();
    r.transform(Buffer.concat([CLIENT_PREFACE, hdr(0, 1, Buffer.alloc(16_000))]));
    expect(() => {
      for (let i = 0; i < 5; i++) r.transform(frameBytes(FrameType.CONTINUATION, 0, 1, Buffer.alloc(16_000)));
    }).toThrow(/larger than 65536/);
  });

  it('random frames after the preface: output or an H2InputError, nothing else', () => {
    const anyFrame = fc.record({
      type: fc.integer({ min: 0, max: 12 }), flags: fc.integer({ min: 0, max: 255 }), sid: fc.integer({ min: 0, max: 7 }),
      payload: fc.oneof(fc.uint8Array({ maxLength: 64 }).map((a) => Buffer.from(a)), fc.constant(ok), fc.constant(indexedHuffmanBlock(REQUEST))),
    }).map(({ type, flags, sid, payload }) => frameBytes(type, flags, sid, payload));
    fc.assert(fc.property(fc.array(anyFrame, { maxLength: 8 }), fc.integer({ min: 1, max: 64 }), (frames, chunk) => {
      const bytes = Buffer.concat([CLIENT_PREFACE, ...frames]);
      const r = new AuthorityRewriter();
      try {
        for (let i = 0; i < bytes.length; i += chunk) r.transform(bytes.subarray(i, i + chunk));
      } catch (err) {
        expect(err).toBeInstanceOf(H2InputError);
      }
    }), { numRuns: 3000 });
  });

  it('random octets: output or an H2InputError, nothing else', () => {
    fc.assert(fc.property(fc.uint8Array({ maxLength: 300 }), (a) => {
      try {
        new AuthorityRewriter().transform(Buffer.concat([CLIENT_PREFACE, Buffer.from(a)]));
      } catch (err) {
        expect(err).toBeInstanceOf(H2InputError);
      }
    }), { numRuns: 3000 });
  });
});
