import { describe, expect, it } from 'vitest';
import { LoadShedder } from '../../agent/webhook/load-shedder.ts';

const admitted = (r: ReturnType<LoadShedder['tryAdmit']>): () => void => {
  if (!('release' in r)) throw new Error(`shed: ${r.shed}`);
  return r.release;
};

describe('LoadShedder', () => {
  it('sheds on concurrency past maxConcurrent, and admits again after a release', () => {
    const s = new LoadShedder({ maxConcurrent: 2, maxInflightBytes: 1000 });
    const a = admitted(s.tryAdmit(1));
    admitted(s.tryAdmit(1));
    expect(s.tryAdmit(1)).toEqual({ shed: 'concurrency' });
    a();
    expect(s.inFlight).toBe(1);
    expect('release' in s.tryAdmit(1)).toBe(true);
  });

  it('sheds on bytes when the sum would pass the budget, but one request alone is always admitted', () => {
    const s = new LoadShedder({ maxConcurrent: 10, maxInflightBytes: 100 });
    const big = admitted(s.tryAdmit(500));
    expect(s.inFlightBytes).toBe(500);
    expect(s.tryAdmit(1)).toEqual({ shed: 'bytes' });
    big();
    const a = admitted(s.tryAdmit(60));
    expect(s.tryAdmit(41)).toEqual({ shed: 'bytes' });
    admitted(s.tryAdmit(40));
    expect(s.inFlightBytes).toBe(100);
    a();
    expect(s.inFlightBytes).toBe(40);
  });

  it('concurrency is checked before bytes', () => {
    const s = new LoadShedder({ maxConcurrent: 1, maxInflightBytes: 10 });
    admitted(s.tryAdmit(10));
    expect(s.tryAdmit(100)).toEqual({ shed: 'concurrency' });
  });

  it('release is idempotent: a double release never frees another request\'s share', () => {
    const s = new LoadShedder({ maxConcurrent: 2, maxInflightBytes: 100 });
    const a = admitted(s.tryAdmit(30));
    admitted(s.tryAdmit(50));
    a();
    a();
    expect(s.inFlight).toBe(1);
    expect(s.inFlightBytes).toBe(50);
  });

  it.each([{ maxConcurrent: 0, maxInflightBytes: 1 }, { maxConcurrent: 1, maxInflightBytes: 0 }, { maxConcurrent: Number.NaN, maxInflightBytes: 1 }])('refuses limits %j', (limits) => {
    expect(() => new LoadShedder(limits)).toThrow(RangeError);
  });
});
