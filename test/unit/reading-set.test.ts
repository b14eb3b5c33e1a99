/** ReadingSet with an injected clock: who is cut, who is refused, and the byte budget. */
import { describe, expect, it } from 'vitest';
import { ReadingSet, type ReadingTicket } from '../../agent/webhook/reading-set.ts';

function setup(limits: { maxRequests: number; maxBytes: number; graceMs: number; heldElsewhere?: () => number }) {
  let t = 0;
  const set = new ReadingSet(limits, () => t);
  const cuts: string[] = [];
  const enter = (name: string): ReadingTicket | undefined => set.enter(() => cuts.push(name));
  return { set, cuts, enter, advance: (ms: number) => (t += ms) };
}

describe('ReadingSet', () => {
  it('a full set of requests within their grace refuses the newcomer and cuts no one', () => {
    const { set, cuts, enter, advance } = setup({ maxRequests: 2, maxBytes: 100, graceMs: 500 });
    enter('a');
    advance(100);
    enter('b');
    advance(399);
    expect(enter('c')).toBeUndefined();
    expect(cuts).toEqual([]);
    expect(set.size).toBe(2);
  });

  it('past its grace, the longest-reading request is cut to admit the newcomer', () => {
    const { set, cuts, enter, advance } = setup({ maxRequests: 2, maxBytes: 100, graceMs: 500 });
    const a = enter('a')!;
    a.grow(30);
    advance(100);
    enter('b');
    advance(400);
    expect(enter('c')).toBeDefined();
    expect(cuts).toEqual(['a']);
    expect(set.size).toBe(2);
    expect(set.bytes).toBe(0);
    // The cut request's ticket is dead: it accounts nothing more, and leaving again is harmless.
    expect(a.grow(1)).toBe(false);
    a.leave();
    expect(set.size).toBe(2);
  });

  it('growth past the byte budget cuts the oldest past grace, or is refused with nothing accounted', () => {
    const { set, cuts, enter, advance } = setup({ maxRequests: 10, maxBytes: 100, graceMs: 500 });
    const a = enter('a')!;
    expect(a.grow(60)).toBe(true);
    const b = enter('b')!;
    expect(b.grow(50)).toBe(false);
    expect(set.bytes).toBe(60);
    expect(cuts).toEqual([]);
    advance(500);
    expect(b.grow(50)).toBe(true);
    expect(cuts).toEqual(['a']);
    expect(set.bytes).toBe(50);
  });

  it('never cuts the growing request itself, even when it is the oldest', () => {
    const { cuts, enter, advance } = setup({ maxRequests: 10, maxBytes: 100, graceMs: 0 });
    const a = enter('a')!;
    advance(10_000);
    expect(a.grow(101)).toBe(false);
    expect(cuts).toEqual([]);
  });

  it('counts bytes held elsewhere (reviews being decided) in the same budget', () => {
    let elsewhere = 90;
    const { enter } = setup({ maxRequests: 10, maxBytes: 100, graceMs: 500, heldElsewhere: () => elsewhere });
    const a = enter('a')!;
    expect(a.grow(11)).toBe(false);
    expect(a.grow(10)).toBe(true);
    elsewhere = 0;
    expect(a.grow(80)).toBe(true);
  });

  it('leave frees the slot and its bytes, once', () => {
    const { set, enter } = setup({ maxRequests: 1, maxBytes: 100, graceMs: 500 });
    const a = enter('a')!;
    a.grow(40);
    a.leave();
    a.leave();
    expect(set.size).toBe(0);
    expect(set.bytes).toBe(0);
    expect(enter('b')).toBeDefined();
  });

  it('cuts in arrival order, several at once when one newcomer needs the room', () => {
    const { cuts, enter, advance } = setup({ maxRequests: 10, maxBytes: 100, graceMs: 100 });
    enter('a')!.grow(30);
    enter('b')!.grow(30);
    enter('c')!.grow(30);
    advance(100);
    expect(enter('d')!.grow(70)).toBe(true);
    expect(cuts).toEqual(['a', 'b']);
  });

  it.each([{ maxRequests: 0, maxBytes: 1, graceMs: 0 }, { maxRequests: 1, maxBytes: 0, graceMs: 0 }, { maxRequests: 1, maxBytes: 1, graceMs: -1 }])('refuses limits %j', (limits) => {
    expect(() => new ReadingSet(limits)).toThrow(RangeError);
  });
});
