/**
 * The time budget of one probe or hook, from the caller's deadline down to the netns helper. Every
 * stage takes its numbers from here:
 *
 *   kubelet ExecSync (probe: timeout + its runtime request timeout; hook: none)
 *     -> shim: the agent call's deadline     agentCallMs      timeout + grace, within kubelet's less REPLY_MARGIN_MS
 *     -> agent: the call's budget            callBudget       answer by the caller's deadline less REPLY_MARGIN_MS;
 *                                                             the run's timeout cut to that (capped)
 *     -> admission in the fair limiter       admission        give up when the full timeout no longer fits
 *     -> the run (connect.ts Deadline)       ownTimeBudgetMs  the target's timeout, plus as long for the agent's own time
 *     -> the netns helper                    helperTcpTimes, helperRequestMs
 *
 * A run cut by the caller's deadline (not by its own timeout) is the agent's error, which kubelet
 * discards, never a failure; the reply margin lets that answer reach the caller before it stops
 * waiting. Scheduled probes have no caller deadline: a watchdog (scheduledLimitMs) bounds them.
 *
 * A leaf module (no imports): the shim uses it too.
 */

/** What each hop keeps between its own deadline and its caller's, to send the answer back. */
export const REPLY_MARGIN_MS = 50;

/** Default time the shim gives the agent beyond a probe's timeout (queueing, the helper): --agent-grace. */
export const AGENT_GRACE_MS = 2000;

/** The agent's cap on a hook without a limit of its own (SPEC_LIMITS.maxTimeoutSeconds). */
export const HOOK_CAP_MS = 3_600_000;

/** The shim's local bound on a hook call to a hung agent: the agent's cap plus a margin. */
export const HOOK_LAST_RESORT_MS = HOOK_CAP_MS + 30_000;

/** A scheduled probe that overruns its longest run by this much is abandoned by its watchdog. */
export const WATCHDOG_GRACE_MS = 5_000;

/** What the helper's child may take to make its socket before a TCP probe done there is our error. */
export const HELPER_SOCKET_SLACK_MS = 500;

/**
 * The shim's deadline (ms from now) for its ExecSync call to the agent for a probe: the probe's
 * timeout plus `graceMs`, capped at `capMs`, and within kubelet's own deadline (`callerMs`) less
 * the reply margin. Always at least 1 ms.
 */
export function agentCallMs(timeoutSeconds: number, graceMs: number, callerMs?: number, capMs = HOOK_LAST_RESORT_MS): number {
  const ownMs = Math.min(Math.max(0, timeoutSeconds) * 1000 + graceMs, capMs);
  return callerMs === undefined ? ownMs : Math.max(1, Math.min(ownMs, callerMs - REPLY_MARGIN_MS));
}

/** One call's budget in the agent. */
export interface CallBudget {
  /** Ms from now until the answer is due (the caller's deadline less the reply margin); Infinity: no deadline. */
  answerInMs: number;
  /** Epoch ms when the answer is due; undefined: no deadline. */
  answerBy: number | undefined;
  /** The run's timeout in seconds: its own, or cut to answerInMs (fractional); 0 = no limit of its own. */
  timeoutSeconds: number;
  /** True when the caller's deadline, not the run's own timeout, bounds the run. */
  capped: boolean;
}

/**
 * The budget of a call whose caller stops waiting at `deadline` (epoch ms; Infinity: never), for a
 * run with its own timeout of `ownSeconds` (0 = none: a hook). Undefined when no time is left.
 */
export function callBudget(deadline: number, ownSeconds: number, now: number): CallBudget | undefined {
  const answerInMs = deadline - REPLY_MARGIN_MS - now;
  if (!(answerInMs > 0)) return undefined;
  if (!Number.isFinite(answerInMs)) return { answerInMs: Infinity, answerBy: undefined, timeoutSeconds: ownSeconds, capped: false };
  const capped = ownSeconds === 0 || answerInMs < ownSeconds * 1000;
  return { answerInMs, answerBy: now + answerInMs, timeoutSeconds: capped ? answerInMs / 1000 : ownSeconds, capped };
}

/** What the fair limiter is told of a run (AcquireOptions). */
export interface Admission {
  /** Ms from now after which a slot is no use: the run could no longer have its whole timeout. */
  deadlineMs: number | undefined;
  /** The run's expected hold of its slot, to estimate the wait of runs behind it; undefined: unknown. */
  holdMs: number | undefined;
}

/** Admission of an on-demand run of `timeoutSeconds` (0 = no limit) that must be over by `answerBy` (epoch ms). */
export function admission(answerBy: number | undefined, timeoutSeconds: number, now: number): Admission {
  const runMs = timeoutSeconds > 0 ? timeoutSeconds * 1000 : undefined;
  return { deadlineMs: answerBy === undefined ? undefined : answerBy - now - (runMs ?? 0), holdMs: runMs };
}

/**
 * The budget for the agent's own time within a run of `timeoutMs` (the helper's socket round
 * trip, the event loop's stalls): as long again as the target's. Past it the run is our error.
 */
export function ownTimeBudgetMs(timeoutMs: number): number {
  return timeoutMs;
}

/** The longest a scheduled probe of `timeoutSeconds` runs before its watchdog abandons it (also its slot's hold). */
export function scheduledLimitMs(timeoutSeconds: number, graceMs = WATCHDOG_GRACE_MS): number {
  const timeoutMs = timeoutSeconds * 1000;
  return timeoutMs + ownTimeBudgetMs(timeoutMs) + graceMs;
}

/** A hook's limit in seconds: its own, or the agent's cap when it has none (0). */
export function hookLimitSeconds(timeoutSeconds: number): number {
  return timeoutSeconds === 0 ? HOOK_CAP_MS / 1000 : timeoutSeconds;
}

/**
 * A TCP probe done whole in the helper's child, with `remainingMs` of the target's time left: the
 * child's connect timeout (counted from its socket's creation), and when the agent gives up on a
 * child that never made its socket (the timeout plus HELPER_SOCKET_SLACK_MS, at most as long again).
 */
export function helperTcpTimes(remainingMs: number): { childTimeoutMs: number; slackMs: number; giveUpMs: number } {
  const slackMs = Math.min(remainingMs, HELPER_SOCKET_SLACK_MS);
  return { childTimeoutMs: remainingMs, slackMs, giveUpMs: remainingMs + slackMs };
}

/** The helper client's bound on one request: its own time, plus a TCP probe's connect timeout spent in the child. */
export function helperRequestMs(ownMs: number, tcpTimeoutMs?: number): number {
  return ownMs + (tcpTimeoutMs === undefined ? 0 : Math.ceil(tcpTimeoutMs));
}

/** The grpc-timeout a gRPC probe sends its target: the target's time left, in whole ms. */
export function targetGrpcTimeoutMs(remainingMs: number): number {
  return Math.floor(remainingMs);
}
