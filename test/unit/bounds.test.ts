import { describe, expect, it } from 'vitest';
import { boundedInt } from '../../agent/config/bounds.ts';
import { ConfigError } from '../../agent/errors.ts';

describe('boundedInt', () => {
  it('returns an integer within the bounds, both ends included', () => {
    expect(boundedInt(1, 1, 10, '--x')).toBe(1);
    expect(boundedInt(10, 1, 10, '--x')).toBe(10);
    expect(boundedInt(0, 0, 0, '--x')).toBe(0);
  });

  it.each([0, 11, 1.5, Number.NaN, Number.POSITIVE_INFINITY, -1])('refuses %s with a ConfigError naming the option and the bounds', (v) => {
    let caught: unknown;
    try {
      boundedInt(v, 1, 10, '--max-things');
    } catch (err) {
      caught = err;
    }
    expect(caught).toBeInstanceOf(ConfigError);
    expect((caught as Error).message).toBe(`--max-things: want an integer 1..10, got ${String(v)}`);
  });

  it('shows the value as the user gave it', () => {
    expect(() => boundedInt(Number('12abc'), 1, 10, '--n', '12abc')).toThrow('--n: want an integer 1..10, got 12abc');
  });
});
