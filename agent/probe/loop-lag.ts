/**
 * The event loop's lag is the agent's own time. The agent is one event loop: while it is stalled
 * (load, a flood of frames, GC, the process not scheduled), a probe's timer fires late and an
 * answer that came in time sits unread. A timeout seen then says nothing about the target, and a
 * failure would make kubelet restart a healthy container. So:
 *  - the probe's Deadline (connect.ts) gives the stalled time back to the target when its timeout
 *    fires, from the budget it has for the agent's own time (the timeout again): an answer that sat
 *    unread is then read and counts, a target that is really slow still fails;
 *  - what that budget could not give back, when at least STALL_FLOOR_MS and a tenth of the timeout,
 *    makes the timeout an 'error' with reason 'agent-overloaded' (overloadedTimeout, applied by
 *    run.ts), which kubelet discards: never a 'failure'.
 *
 * Stalls are measured by a ticker that runs while any probe runs: a timer every TICK_MS whose
 * lateness beyond TOLERANCE_MS (timer granularity) is added up. A probe reads the sum over its
 * lifetime, plus the stall still in progress when its own timer fires (timers due first may not
 * have run yet). When the last probe ends, the ticker's pending lateness is added and the ticker
 * stops: a probe shorter than a tick (most are) then costs the agent no wake-up of its own.
 */
import { performance } from 'node:perf_hooks';

const TICK_MS = 20;
/** Lateness of a timer that is no stall (timer granularity, a short task). */
const TOLERANCE_MS = 5;
/** Stall not given back that never turns a timeout into an error. */
export const STALL_FLOOR_MS = 100;
/** The share of a probe's timeout that, lost to stalls and not given back, makes its timeout the agent's. */
export const STALL_FRACTION = 0.1;

/** Called for each probe timeout the rule turned into an error (metrics, log); must not throw. */
export type OverloadListener = (stalledMs: number, timeoutMs: number) => void;

let watchers = 0;
let stalledMs = 0;
let nextDueAt = 0;
let timer: NodeJS.Timeout | undefined;
let listener: OverloadListener | undefined;
/** Probe timeouts turned into errors so far (metrics). */
let overloaded = 0;

function arm(): void {
  nextDueAt = performance.now() + TICK_MS;
  timer = setTimeout(tick, TICK_MS);
  timer.unref();
}

function tick(): void {
  const late = performance.now() - nextDueAt;
  if (late > TOLERANCE_MS) stalledMs += late;
  if (watchers > 0) arm();
  else timer = undefined;
}

/** The stall in progress: how late the ticker is right now. */
function pendingMs(): number {
  if (timer === undefined) return 0;
  const late = performance.now() - nextDueAt;
  return late > TOLERANCE_MS ? late : 0;
}

/** One probe's view of the loop's stalls; stop() it when the probe ends. */
export interface LagWatch {
  /** Milliseconds the loop was stalled since the watch began. */
  stalledMs(): number;
  stop(): void;
}

/** Starts measuring the loop's stalls for one probe. */
export function watchLoopLag(): LagWatch {
  if (watchers++ === 0 && timer === undefined) arm();
  const start = stalledMs + pendingMs();
  let stopped = false;
  return {
    stalledMs: () => Math.max(0, stalledMs + pendingMs() - start),
    stop: () => {
      if (stopped) return;
      stopped = true;
      if (--watchers > 0 || timer === undefined) return;
      stalledMs += pendingMs();
      clearTimeout(timer);
      timer = undefined;
    },
  };
}

/** Whether the stall ticker runs (it does only while some probe runs): for tests. */
export function lagTickerRunning(): boolean {
  return timer !== undefined;
}

/**
 * The rule: when a probe of `timeoutMs` timed out with `stalled` ms of the loop's stalls not given
 * back to the target, the message saying why it is the agent's error; undefined when the timeout is the target's.
 */
export function overloadedTimeout(stalled: number, timeoutMs: number): string | undefined {
  if (stalled < Math.max(STALL_FLOOR_MS, STALL_FRACTION * timeoutMs)) return undefined;
  overloaded++;
  try {
    listener?.(stalled, timeoutMs);
  } catch {
    // Metrics and logs never change a verdict.
  }
  return `agent overloaded: its event loop stalled ${Math.round(stalled)} ms more than the probe's ${Math.round(timeoutMs)} ms timeout could make up; not counted against the target`;
}

/** Sets who hears of each timeout the rule turned into an error (the daemon: log and metrics). */
export function onOverloadedTimeout(l: OverloadListener | undefined): void {
  listener = l;
}

/** Probe timeouts turned into errors since start. */
export function overloadedTimeouts(): number {
  return overloaded;
}
