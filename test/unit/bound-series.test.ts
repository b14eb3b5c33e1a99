/**
 * The bound counter and histogram families (agent/metrics/bound-series.ts) must be drop-in for
 * prom-client's Counter and Histogram as far as a scrape can tell: for any sequence of updates,
 * removals and resets, both render byte-identical text and JSON.
 */
import fc from 'fast-check';
import { Counter, Histogram, Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { BoundCounter, BoundHistogram } from '../../agent/metrics/bound-series.ts';

const BUCKETS = [0.005, 0.01, 0.1, 1, 10];
type Op = { op: 'inc' | 'observe' | 'remove' | 'reset'; a: string; b: string; v: number };

const opArb = fc.record({
  op: fc.constantFrom('inc', 'observe', 'observe', 'inc', 'remove', 'reset') as fc.Arbitrary<Op['op']>,
  a: fc.constantFrom('x', 'y', 'z'),
  b: fc.constantFrom('1', '2', 'with "quotes"\nand newline'),
  v: fc.oneof(fc.double({ min: 0, max: 20, noNaN: true }), fc.constantFrom(0, 0.005, 10, 1e9)),
});

/** Runs `ops` against both implementations and returns what each registry renders. */
async function renderBoth(ops: Op[]): Promise<{ theirs: string[]; ours: string[] }> {
  const theirsReg = new Registry();
  const oursReg = new Registry();
  const labelNames = ['a', 'b'] as const;
  const counter = new Counter({ name: 'c_total', help: 'a counter', labelNames, registers: [theirsReg] });
  const histogram = new Histogram({ name: 'h_seconds', help: 'a histogram', labelNames, buckets: BUCKETS, registers: [theirsReg] });
  const boundCounter = new BoundCounter({ name: 'c_total', help: 'a counter', labelNames, registers: [oursReg] });
  const boundHistogram = new BoundHistogram({ name: 'h_seconds', help: 'a histogram', labelNames, buckets: BUCKETS, registers: [oursReg] });
  for (const { op, a, b, v } of ops) {
    const labels = { a, b };
    if (op === 'inc') {
      counter.inc(labels);
      boundCounter.series(labels).inc();
    } else if (op === 'observe') {
      histogram.observe(labels, v);
      boundHistogram.series(labels).observe(v);
    } else if (op === 'remove') {
      counter.remove(labels);
      histogram.remove(labels);
      boundCounter.remove(labels);
      boundHistogram.remove(labels);
    } else {
      theirsReg.resetMetrics();
      oursReg.resetMetrics();
    }
  }
  return {
    theirs: [await theirsReg.metrics(), JSON.stringify(await theirsReg.getMetricsAsJSON())],
    ours: [await oursReg.metrics(), JSON.stringify(await oursReg.getMetricsAsJSON())],
  };
}

describe('bound series families', () => {
  it('render exactly what prom-client renders, for any sequence of updates, removals and resets', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(opArb, { maxLength: 60 }), async (ops) => {
        const { theirs, ours } = await renderBoth(ops);
        expect(ours).toEqual(theirs);
      }),
      { numRuns: 200 },
    );
  });

  it('keep a held series usable across a reset, and show nothing for a removed one', async () => {
    const reg = new Registry();
    const c = new BoundCounter({ name: 'held_total', help: 'h', labelNames: ['k'], registers: [reg] });
    const held = c.series({ k: 'v' });
    held.inc();
    reg.resetMetrics();
    expect(await reg.metrics()).not.toContain('held_total{');
    held.inc();
    expect(await reg.metrics()).toContain('held_total{k="v"} 1');
    c.remove({ k: 'v' });
    held.inc();
    expect(await reg.metrics()).not.toContain('held_total{');
    expect(c.series({ k: 'v' })).not.toBe(held);
  });

  it('refuse bad names, the reserved le label and label sets that do not match', () => {
    const registers = [new Registry()];
    expect(() => new BoundCounter({ name: 'bad-name', help: 'h', labelNames: [], registers })).toThrow(/invalid metric name/);
    expect(() => new BoundHistogram({ name: 'h', help: 'h', labelNames: ['le'], buckets: [1], registers })).toThrow(/invalid label name/);
    const c = new BoundCounter({ name: 'ok_total', help: 'h', labelNames: ['a'], registers });
    expect(() => c.series({} as { a: string })).toThrow(/label "a" is missing/);
    expect(() => c.series({ a: 'x', extra: 'y' } as { a: string })).toThrow(/unknown label/);
  });
});
