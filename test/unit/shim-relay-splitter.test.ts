/**
 * The frame relay's reader (agent/http2/connection.ts FrameSplitter): frames come back whole and in
 * order however the octets are cut into reads (a frame header or body split across reads, many
 * frames in one read), the client preface is checked and consumed, and an oversized frame is refused.
 */
import { describe, expect, it } from 'vitest';
import { FrameSplitter } from '../../agent/http2/connection.ts';
import { CLIENT_PREFACE, frameBytes, H2InputError } from '../../agent/http2/wire.ts';

function stream(): Buffer[] {
  const frames: Buffer[] = [];
  for (let i = 0; i < 40; i++) {
    const len = [0, 1, 8, 9, 100, 16_384, 5000][i % 7]!;
    frames.push(frameBytes(i % 10, i & 0xff, 2 * i + 1, Buffer.alloc(len, i)));
  }
  return frames;
}

function readAll(splitter: FrameSplitter, octets: Buffer, cuts: number[]): Buffer[] {
  const got: Buffer[] = [];
  let pos = 0;
  for (const end of [...cuts, octets.length]) {
    // A copy per read, as a socket gives: nothing may alias the previous read.
    splitter.push(Buffer.from(octets.subarray(pos, end)));
    pos = end;
    for (let f = splitter.next(); f !== null; f = splitter.next()) got.push(Buffer.from(f.raw));
  }
  return got;
}

describe('the relay frame splitter', () => {
  it('returns every frame whole and in order for any cut of the octets into reads', () => {
    const frames = stream();
    const octets = Buffer.concat([CLIENT_PREFACE, ...frames]);
    let seed = 7;
    const rnd = (n: number): number => {
      seed = (seed * 1103515245 + 12345) % 2 ** 31;
      return seed % n;
    };
    for (let round = 0; round < 40; round++) {
      const cuts: number[] = [];
      for (let p = rnd(30); p < octets.length; p += 1 + rnd(round % 2 ? 20 : 20_000)) cuts.push(p);
      const got = readAll(new FrameSplitter(true), octets, cuts);
      expect(got.length).toBe(frames.length);
      for (let i = 0; i < frames.length; i++) expect(got[i]!.equals(frames[i]!), `round ${round} frame ${i}`).toBe(true);
    }
  });

  it('cuts inside a frame header and one octet at a time', () => {
    const frames = stream().slice(0, 8);
    const octets = Buffer.concat(frames);
    const cuts = Array.from({ length: octets.length - 1 }, (_, i) => i + 1);
    const got = readAll(new FrameSplitter(false), octets, cuts);
    expect(got.map((b) => b.toString('hex'))).toEqual(frames.map((b) => b.toString('hex')));
  });

  it('refuses a bad preface and a frame over its bound, split or not', () => {
    const bad = new FrameSplitter(true);
    bad.push(Buffer.from('GET / HTTP/1.1\r\n'));
    expect(() => bad.next()).toThrow(H2InputError);
    const big = frameBytes(0, 0, 1, Buffer.alloc(20_000));
    for (const cut of [5, 9, 100]) {
      const s = new FrameSplitter(false);
      s.push(Buffer.concat([frameBytes(0, 0, 1, Buffer.alloc(10)), big.subarray(0, cut)]));
      expect(s.next()).not.toBeNull();
      expect(() => {
        s.next();
        s.push(big.subarray(cut));
        s.next();
      }).toThrow(/exceeds SETTINGS_MAX_FRAME_SIZE 16384/);
    }
  });
});
