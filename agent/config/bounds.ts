/** Numeric option checks shared by every module that takes a count or a size from configuration. */
import { ConfigError } from '../errors.ts';

/** Checks that `v` is an integer in min..max; throws ConfigError naming the option (and `shown`, the value as given). */
export function boundedInt(v: number, min: number, max: number, name: string, shown: string = String(v)): number {
  if (!Number.isInteger(v) || v < min || v > max) throw new ConfigError(`${name}: want an integer ${min}..${max}, got ${shown}`, { option: name });
  return v;
}
