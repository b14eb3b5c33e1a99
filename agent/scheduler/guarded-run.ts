/**
 * One probe run as a worker makes it: wait for a fair slot, call the injected RunProbe, and never
 * throw or hang. Everything that goes wrong on our side becomes a result 'error' with a reason.
 */
import { describeError, OverloadedError } from '../errors.ts';
import type { ContainerInfo, PodInfo } from '../pods/types.ts';
import type { FailureReason, ProbeOutcome, ProbeSpec } from '../probe/types.ts';
import type { FairLimiter, Permit } from './limiter.ts';
import { WATCHDOG_GRACE_MS, scheduledLimitMs } from '../probe/time-budget.ts';

/** Runs one probe against a container; resolves with the outcome (errors as result 'error'). */
export type RunProbe = (pod: PodInfo, container: ContainerInfo, spec: ProbeSpec, signal: AbortSignal) => Promise<ProbeOutcome>;

/** An outcome for a probe that could not be run. */
export function errorOutcome(reason: FailureReason, message: string): ProbeOutcome {
  return { result: 'error', reason, message, durationSeconds: 0, phases: { total: 0 } };
}

/**
 * Takes a slot from `limiter` (keyed by namespace and pod UID), runs the probe and adds the queue wait to the
 * phases. A full queue is 'queue-full'; aborting `signal` cancels a queued or running probe. The
 * slot is held until the prober really settles, even when the watchdog gave up on it.
 */
export async function runGuarded(
  run: RunProbe,
  limiter: FairLimiter | undefined,
  pod: PodInfo,
  container: ContainerInfo,
  spec: ProbeSpec,
  controller: AbortController,
  watchdogGraceMs = WATCHDOG_GRACE_MS,
): Promise<ProbeOutcome> {
  // Past its longest run (time-budget.ts) a stuck prober is abandoned: it must not stop a worker for good.
  const limitMs = scheduledLimitMs(spec.timeoutSeconds, watchdogGraceMs);
  let permit: Permit | undefined;
  if (limiter) {
    try {
      permit = await limiter.acquire({ group: pod.namespace, owner: pod.uid }, controller.signal, {
        holdMs: limitMs,
      });
    } catch (err) {
      if (err instanceof OverloadedError) return errorOutcome('queue-full', err.message);
      return errorOutcome('other', `probe cancelled while queued: ${describeError(err)}`);
    }
  }
  let running: Promise<ProbeOutcome>;
  try {
    running = run(pod, container, spec, controller.signal);
  } catch (err) {
    permit?.release();
    return errorOutcome('other', `prober threw: ${describeError(err)}`);
  }
  const held = permit;
  if (held) void running.then(() => held.release(), () => held.release());
  const outcome = await watch(running, limitMs, controller);
  return held ? { ...outcome, phases: { ...outcome.phases, queue: held.waitedMs / 1000 } } : outcome;
}

/** Real-time watchdog: it guards against prober bugs, so it is no part of probe semantics or of a test clock. */
function watch(running: Promise<ProbeOutcome>, limitMs: number, controller: AbortController): Promise<ProbeOutcome> {
  return new Promise<ProbeOutcome>((resolve) => {
    const timer = setTimeout(() => {
      controller.abort(new Error('probe watchdog expired'));
      resolve(errorOutcome('other', `prober did not return within ${limitMs / 1000}s`));
    }, limitMs);
    timer.unref();
    running.then(
      (outcome) => {
        clearTimeout(timer);
        resolve(outcome);
      },
      (err: unknown) => {
        clearTimeout(timer);
        resolve(errorOutcome('other', `prober failed: ${describeError(err)}`));
      },
    );
  });
}
