/**
 * A timeout that does not count the time this process itself was stalled. A timer whose callback
 * runs late ran late because the event loop was busy (deciding a large review, garbage collection,
 * a starved CPU), and the bytes a client sent meanwhile are still unread: Node runs due timers
 * before it reads sockets. So a late firing is not trusted: the lateness is given back, and the
 * verdict waits for one pass over pending I/O (setImmediate). A client that is slow on its own,
 * on a server that is not stalled, gets exactly `ms`; the total wait is capped at 4 × `ms`.
 */

/** Lateness below this is scheduling noise, not a stall. */
const STALL_MS = 50;

/** Calls `fire` once `ms` of this process's unstalled time has passed, unless cancelled. Returns the cancel function. */
export function patientTimeout(ms: number, fire: () => void): () => void {
  const started = performance.now();
  let timer: NodeJS.Timeout | undefined;
  let immediate: NodeJS.Immediate | undefined;
  let cancelled = false;
  const arm = (wait: number, due: number): void => {
    timer = setTimeout(() => {
      timer = undefined;
      const now = performance.now();
      const late = now - due;
      if (late > STALL_MS && now - started + late < 4 * ms) return arm(late, now + late);
      immediate = setImmediate(() => {
        immediate = undefined;
        if (!cancelled) fire();
      });
    }, wait);
  };
  arm(ms, started + ms);
  return () => {
    cancelled = true;
    if (timer) clearTimeout(timer);
    if (immediate) clearImmediate(immediate);
  };
}
