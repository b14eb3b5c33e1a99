/**
 * Waiting on a condition and reading a process's state, for tests that watch the netns helper's
 * processes come and go.
 */
import { readFileSync } from 'node:fs';

/** Polls `cond` every 20 ms for up to `ms`; whether it held. */
export async function waitFor(cond: () => boolean, ms: number): Promise<boolean> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (cond()) return true;
    await new Promise((r) => setTimeout(r, 20));
  }
  return cond();
}

/** A process's state letter from /proc (R, S, Z, ...); undefined once it is gone. */
export function processState(pid: number): string | undefined {
  try {
    return readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.[0];
  } catch {
    return undefined;
  }
}
