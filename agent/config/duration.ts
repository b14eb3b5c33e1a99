import { ConfigError } from '../errors.ts';

const UNITS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 };

/** Parses a Go-style duration ("500ms", "5s", "1m30s"; a bare number is seconds) into milliseconds. */
export function parseDuration(text: string, flag = 'duration'): number {
  const trimmed = text.trim();
  if (/^\d+(\.\d+)?$/.test(trimmed)) return Math.round(Number(trimmed) * 1000);
  const re = /(\d+(?:\.\d+)?)(ms|s|m|h)/gy;
  let total = 0;
  let consumed = 0;
  for (let m = re.exec(trimmed); m; m = re.exec(trimmed)) {
    total += Number(m[1]) * (UNITS[m[2] as string] as number);
    consumed = re.lastIndex;
  }
  if (trimmed === '' || consumed !== trimmed.length) {
    throw new ConfigError(`${flag}: invalid duration "${text}" (want e.g. 500ms, 5s, 1m)`, { flag });
  }
  return Math.round(total);
}
