import { describe, expect, it } from 'vitest';
import { validSeconds } from '../../agent/metrics/seconds.ts';

describe('validSeconds: what a duration histogram may observe', () => {
  it.each([0, 0.001, 1, 86_400])('keeps %s', (v) => {
    expect(validSeconds(v)).toBe(true);
  });

  it.each([-0.001, -1, Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY, undefined])('drops %s (a clock step, a missing or broken value)', (v) => {
    expect(validSeconds(v)).toBe(false);
  });

  it('drops a non-number that slipped through the types', () => {
    expect(validSeconds('1' as unknown as number)).toBe(false);
  });
});
