/**
 * The webhook's connection pools (agent/webhook/connection-gate.ts): a full source evicts its own
 * oldest; a full pool evicts the oldest of the source holding the most, so a source with one
 * connection outlives any flood from sources with more. `admit` (the handshake pool) refuses a
 * full source's newcomer while its own connections are young, and never another source's.
 */
import { describe, expect, it } from 'vitest';
import { ConnectionPool } from '../../agent/webhook/connection-gate.ts';

function track(pool: ConnectionPool) {
  const evicted: string[] = [];
  const leave = new Map<string, () => void>();
  return {
    evicted,
    add: (source: string, id: string) => leave.set(id, pool.add(source, () => evicted.push(id))),
    close: (id: string) => leave.get(id)!(),
  };
}

describe('ConnectionPool', () => {
  it('a source at its cap evicts its own oldest, not another source', () => {
    const pool = new ConnectionPool({ max: 10, perSource: 2 });
    const t = track(pool);
    t.add('api', 'api-1');
    t.add('bad', 'bad-1');
    t.add('bad', 'bad-2');
    t.add('bad', 'bad-3');
    expect(t.evicted).toEqual(['bad-1']);
    expect(pool.size).toBe(3);
  });

  it('a full pool evicts the oldest of the largest holder; a one-connection source survives any flood', () => {
    const pool = new ConnectionPool({ max: 8, perSource: 8 });
    const t = track(pool);
    t.add('api', 'api-1');
    for (let i = 0; i < 100; i++) t.add(`bad-${i % 3}`, `b${i}`);
    expect(t.evicted).not.toContain('api-1');
    expect(pool.size).toBe(8);
    expect(pool.evicted).toBe(93);
    // The newcomer from a fresh source gets in too.
    t.add('api', 'api-2');
    expect(t.evicted).not.toContain('api-2');
    expect(pool.size).toBe(8);
  });

  it('closing frees the slot, twice is harmless, and an evicted entry closing later changes nothing', () => {
    const pool = new ConnectionPool({ max: 2, perSource: 2 });
    const t = track(pool);
    t.add('a', 'a1');
    t.add('a', 'a2');
    t.add('a', 'a3');
    expect(t.evicted).toEqual(['a1']);
    t.close('a1');
    expect(pool.size).toBe(2);
    t.close('a2');
    t.close('a2');
    expect(pool.size).toBe(1);
    expect(pool.sources).toBe(1);
    t.close('a3');
    expect(pool.sources).toBe(0);
  });

  it('admit: a full source\'s newcomer is refused while its own are young, and evicts its own oldest once that one is stalled', async () => {
    const pool = new ConnectionPool({ max: 10, perSource: 2 });
    const evicted: string[] = [];
    const admit = (source: string, id: string, youngMs: number) => pool.admit(source, () => evicted.push(id), youngMs);
    expect(admit('bad', 'b1', 50)).toBeTypeOf('function');
    expect(admit('bad', 'b2', 50)).toBeTypeOf('function');
    for (let i = 0; i < 100; i++) expect(admit('bad', `young-${i}`, 50)).toBeUndefined();
    expect(pool.refused).toBe(100);
    expect(evicted).toEqual([]);
    // Another source is admitted whatever the full one does.
    expect(admit('api', 'api-1', 50)).toBeTypeOf('function');
    await new Promise((r) => setTimeout(r, 80));
    expect(admit('bad', 'b3', 50)).toBeTypeOf('function');
    expect(evicted).toEqual(['b1']);
    expect(pool.size).toBe(3);
  });

  it('admit: in a full pool, a newcomer of a largest holder is refused while young; a smaller source evicts from the largest', async () => {
    const pool = new ConnectionPool({ max: 6, perSource: 6 });
    const evicted: string[] = [];
    const admit = (source: string, id: string) => pool.admit(source, () => evicted.push(id), 50);
    for (let i = 0; i < 6; i++) admit(`bad-${i % 3}`, `b${i}`);
    expect(pool.size).toBe(6);
    for (let i = 0; i < 30; i++) expect(admit(`bad-${i % 3}`, `again-${i}`)).toBeUndefined();
    expect(evicted).toEqual([]);
    expect(admit('api', 'api-1')).toBeTypeOf('function');
    expect(evicted).toEqual(['b0']);
    // The API server's source now holds 1, below the largest (2): never refused, however young.
    expect(admit('api', 'api-2')).toBeTypeOf('function');
    expect(evicted).toHaveLength(2);
    expect(pool.refused).toBe(30);
  });

  it('refuses limits below 1', () => {
    expect(() => new ConnectionPool({ max: 0, perSource: 1 })).toThrow(RangeError);
  });
});
