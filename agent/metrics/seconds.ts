/** A duration worth observing: a finite, non-negative number of seconds (clock steps and NaN are dropped). */
export function validSeconds(v: number | undefined): v is number {
  return typeof v === 'number' && Number.isFinite(v) && v >= 0;
}
