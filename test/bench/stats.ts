/** Small statistics helpers for the bench (no dependencies, no surprises). */

/** The q-quantile (0..1) of an ascending-sorted array by the nearest-rank method; NaN when empty. */
export function quantile(sorted: readonly number[], q: number): number {
  if (sorted.length === 0) return Number.NaN;
  const rank = Math.ceil(q * sorted.length);
  return sorted[Math.min(sorted.length - 1, Math.max(0, rank - 1))] as number;
}

/** The median of any array (the lower middle for an even count: a value that was measured). */
export function median(xs: readonly number[]): number {
  const finite = xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (finite.length === 0) return Number.NaN;
  return finite[Math.floor((finite.length - 1) / 2)] as number;
}

/** Rounds to `digits` decimals for JSON output (keeps reports readable, loses nothing measurable). */
export function round(x: number, digits = 3): number {
  if (!Number.isFinite(x)) return x;
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

/**
 * Whether a probe that took `ms` ran to its own timeout: its verdict then says how loaded the
 * machine was, not whether the path works (timers may fire a little early, hence the margin).
 */
export function ranToTimeout(ms: number, timeoutSeconds: number): boolean {
  return ms >= timeoutSeconds * 1000 * 0.95;
}
