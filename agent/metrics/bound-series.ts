/**
 * Counter and histogram families whose series are bound once and then updated with a plain
 * addition: no label object, hash string or validation per update. prom-client's own labels()
 * children only bind the label object, so every inc/observe still hashes it; at one update per
 * probe run (several for the phase histogram) that was most of the metrics cost per probe.
 *
 * The families register in prom-client registries and render exactly as prom-client's Counter
 * and Histogram do (same values, label order, series order, HELP/TYPE), so /metrics is unchanged.
 * A series appears in scrapes from its first update on, as a prom-client series appears on its
 * first inc/observe, and remove() takes it out again.
 */
import type { Registry } from 'prom-client';

type Labels = Record<string, string>;

/** What prom-client's registry reads from a metric (its MetricObjectWithValues shape). */
interface Sample {
  labels: Record<string, string | number>;
  value: number;
  metricName?: string;
  sharedLabels?: Labels;
  exemplar?: null;
}
interface MetricData {
  name: string;
  help: string;
  type: 'counter' | 'histogram';
  values: Sample[];
  aggregator: 'sum';
}

/** Construction options of a family. */
export interface BoundFamilyOptions<L extends string> {
  name: string;
  help: string;
  labelNames: readonly L[];
  registers: Registry[];
}

const NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL = /^[a-zA-Z_][a-zA-Z0-9_]*$/;

/** Shared bookkeeping: series by label key, the shown ones in the order they first updated. */
abstract class BoundFamily<L extends string, S extends { labels: Labels; shown: boolean }> {
  readonly name: string;
  readonly help: string;
  readonly aggregator = 'sum' as const;
  readonly labelNames: readonly L[];
  readonly #series = new Map<string, S>();
  readonly #shown = new Set<S>();

  constructor(opts: BoundFamilyOptions<L>) {
    if (!NAME.test(opts.name)) throw new Error(`invalid metric name "${opts.name}"`);
    for (const l of opts.labelNames) if (!LABEL.test(l) || l === 'le') throw new Error(`invalid label name "${l}"`);
    this.name = opts.name;
    this.help = opts.help;
    this.labelNames = opts.labelNames;
    // prom-client's Registry only reads name/help/type/get()/reset(); it is typed for its own classes.
    for (const r of opts.registers) r.registerMetric(this as unknown as Parameters<Registry['registerMetric']>[0]);
  }

  /** The series for `labels` (every label name, nothing else); the same object for equal labels. */
  series(labels: Record<L, string>): S {
    const key = this.#key(labels);
    let s = this.#series.get(key);
    if (!s) {
      s = this.create({ ...labels });
      this.#series.set(key, s);
    }
    return s;
  }

  /** Takes the series out of scrapes; a holder's later updates go nowhere. */
  remove(labels: Record<L, string>): void {
    const key = this.#key(labels);
    const s = this.#series.get(key);
    if (!s) return;
    this.#series.delete(key);
    this.#shown.delete(s);
    this.detach(s);
  }

  /** Zeroes every series and hides it until its next update (prom-client: all series gone). */
  reset(): void {
    for (const s of this.#shown) this.clear(s);
    this.#shown.clear();
  }

  /** Called by a series on its first update since creation or reset. */
  protected show(s: S): void {
    this.#shown.add(s);
  }

  protected shownSeries(): Iterable<S> {
    return this.#shown;
  }

  protected abstract create(labels: Labels): S;
  protected abstract clear(s: S): void;
  protected abstract detach(s: S): void;

  #key(labels: Record<L, string>): string {
    let key = '';
    for (const n of this.labelNames) {
      const v = labels[n];
      if (typeof v !== 'string') throw new Error(`label "${n}" is missing`);
      key += `${v}\u0000`;
    }
    if (Object.keys(labels).length !== this.labelNames.length) throw new Error(`unknown label in ${JSON.stringify(Object.keys(labels))}`);
    return key;
  }
}

/** One counter series. */
export class CounterSeries {
  readonly labels: Labels;
  value = 0;
  shown = false;
  #onShow: ((s: CounterSeries) => void) | undefined;

  constructor(labels: Labels, onShow: (s: CounterSeries) => void) {
    this.labels = labels;
    this.#onShow = onShow;
  }

  /** Adds 1 (counters only go up). */
  inc(): void {
    this.value++;
    if (!this.shown && this.#onShow) {
      this.shown = true;
      this.#onShow(this);
    }
  }

  /** Stops showing it for good (its family removed it). */
  detach(): void {
    this.#onShow = undefined;
    this.shown = false;
  }
}

/** A counter family (prom-client Counter semantics for inc by 1). */
export class BoundCounter<L extends string> extends BoundFamily<L, CounterSeries> {
  readonly type = 'counter' as const;

  protected create(labels: Labels): CounterSeries {
    return new CounterSeries(labels, (s) => this.show(s));
  }

  protected clear(s: CounterSeries): void {
    s.value = 0;
    s.shown = false;
  }

  protected detach(s: CounterSeries): void {
    s.detach();
  }

  /** What prom-client's registry renders. */
  get(): MetricData {
    const values: Sample[] = [];
    for (const s of this.shownSeries()) values.push({ value: s.value, labels: s.labels });
    // Key order as prom-client's Counter has it (help first), for byte-equal JSON.
    return { help: this.help, name: this.name, type: this.type, values, aggregator: this.aggregator };
  }
}

/** One histogram series: counts per bucket (not cumulative), sum and count. */
export class HistogramSeries {
  readonly labels: Labels;
  readonly counts: Float64Array;
  sum = 0;
  count = 0;
  shown = false;
  readonly #bounds: readonly number[];
  #onShow: ((s: HistogramSeries) => void) | undefined;

  constructor(labels: Labels, bounds: readonly number[], onShow: (s: HistogramSeries) => void) {
    this.labels = labels;
    this.#bounds = bounds;
    this.counts = new Float64Array(bounds.length);
    this.#onShow = onShow;
  }

  /** Records one value (prom-client: the first bucket whose bound is >= value; above all: +Inf only). */
  observe(value: number): void {
    const bounds = this.#bounds;
    for (let i = 0; i < bounds.length; i++) {
      if (value <= (bounds[i] as number)) {
        (this.counts[i] as number)++;
        break;
      }
    }
    this.sum += value;
    this.count++;
    if (!this.shown && this.#onShow) {
      this.shown = true;
      this.#onShow(this);
    }
  }

  /** Stops showing it for good (its family removed it). */
  detach(): void {
    this.#onShow = undefined;
    this.shown = false;
  }
}

/** A histogram family (prom-client Histogram semantics, without exemplars). */
export class BoundHistogram<L extends string> extends BoundFamily<L, HistogramSeries> {
  readonly type = 'histogram' as const;
  readonly upperBounds: readonly number[];

  constructor(opts: BoundFamilyOptions<L> & { buckets: readonly number[] }) {
    super(opts);
    this.upperBounds = Object.freeze([...opts.buckets].sort((a, b) => a - b));
  }

  protected create(labels: Labels): HistogramSeries {
    return new HistogramSeries(labels, this.upperBounds, (s) => this.show(s));
  }

  protected clear(s: HistogramSeries): void {
    s.counts.fill(0);
    s.sum = 0;
    s.count = 0;
    s.shown = false;
  }

  protected detach(s: HistogramSeries): void {
    s.detach();
  }

  /** The registry renders this one (prom-client's layout: `le` first, the series' labels shared). */
  getForPromString(): MetricData {
    const bucket = `${this.name}_bucket`;
    const values: Sample[] = [];
    for (const s of this.shownSeries()) {
      let acc = 0;
      for (let i = 0; i < this.upperBounds.length; i++) {
        acc += s.counts[i] as number;
        values.push({ labels: { le: this.upperBounds[i] as number }, sharedLabels: s.labels, value: acc, metricName: bucket, exemplar: null });
      }
      values.push(
        { labels: { le: '+Inf' }, sharedLabels: s.labels, value: s.count, metricName: bucket, exemplar: null },
        { labels: {}, sharedLabels: s.labels, value: s.sum, metricName: `${this.name}_sum` },
        { labels: {}, sharedLabels: s.labels, value: s.count, metricName: `${this.name}_count` },
      );
    }
    return { name: this.name, help: this.help, type: this.type, values, aggregator: this.aggregator };
  }

  /** The JSON form (getMetricsAsJSON): each sample with its series' labels merged in. */
  get(): MetricData {
    const data = this.getForPromString();
    data.values = data.values.map(({ sharedLabels, labels, ...rest }) => ({ ...rest, labels: { ...labels, ...sharedLabels } }));
    return data;
  }
}
