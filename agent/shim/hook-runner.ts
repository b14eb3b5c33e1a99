/**
 * Runs a rewritten hook through the agent exactly once, riding out agent restarts and rollouts.
 *
 * Kubelet does not retry a hook and a failed postStart kills the container, so a hook that the
 * agent certainly did not start (no connection, a refused stream, an admission refusal, a draining
 * agent's documented refusal, an agent too old for ExecSync: AgentCallError.notStarted) is sent again until the agent takes it
 * or `agentWaitMs` has passed since the first try. A hook that may have run (the connection broke
 * during the call, a deadline) is never sent again: a hook must not run twice.
 *
 * No deadline is sent to the agent: kubelet runs exec hooks with timeout 0 and waits for a preStop
 * until the pod's grace period ends, so only kubelet's cancellation (the signal) or the agent's own
 * cap (`lastResortMs`, the agent's 1 h bound plus a margin, for an agent that hangs) ends a hook.
 */
import { AgentCallError, type AgentExecAnswer, type ShimProbeClient } from './agent-client.ts';

/** How long a hook waits and how often it asks again. */
export interface HookWaitPolicy {
  /** Longest a hook waits, from its first try, for an agent that has not started it. */
  agentWaitMs: number;
  /** Pause between tries (default 250 ms). */
  retryMs?: number;
  /** Local bound on one call to a hung agent (the agent's own cap plus a margin). */
  lastResortMs: number;
}

/** What a hook's wait came to: 'ran' (the agent took it after a wait), 'gave_up', or none when it did not wait. */
export type HookWaitResult = 'ran' | 'gave_up' | undefined;

/** The agent's answer, or the last AgentCallError, plus how the wait (if any) ended. */
export type HookRunOutcome =
  | { answer: AgentExecAnswer; error?: undefined; wait: HookWaitResult }
  | { answer?: undefined; error: AgentCallError; wait: HookWaitResult };

/** Sends one hook (kubelet's ExecSync body, as it came) to the agent per the policy above; never throws an AgentCallError (it is returned). */
export async function runHookOnce(
  agent: ShimProbeClient,
  framedRequest: Buffer,
  policy: HookWaitPolicy,
  signal: AbortSignal,
): Promise<HookRunOutcome> {
  const retryMs = policy.retryMs ?? 250;
  const waitUntil = Date.now() + policy.agentWaitMs;
  let waited = false;
  for (;;) {
    try {
      const answer = await agent.execSync(framedRequest, { lastResortMs: policy.lastResortMs, signal });
      return { answer, wait: waited ? 'ran' : undefined };
    } catch (err) {
      if (!(err instanceof AgentCallError)) throw err;
      const mayRetry = err.notStarted && !signal.aborted && Date.now() + retryMs < waitUntil;
      if (!mayRetry) {
        // A hook the agent refused or never saw, given up on: the wait ran out (or kubelet cancelled it).
        const wait: HookWaitResult = waited || err.notStarted ? (err.notStarted ? 'gave_up' : 'ran') : undefined;
        return { error: err, wait };
      }
      waited = true;
      await sleep(retryMs, signal);
      // Cancelled while waiting: the agent never saw the hook, so it is given up, not sent once more.
      if (signal.aborted) return { error: err, wait: 'gave_up' };
    }
  }
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const done = (): void => {
      clearTimeout(t);
      signal.removeEventListener('abort', done);
      resolve();
    };
    const t = setTimeout(done, ms);
    signal.addEventListener('abort', done, { once: true });
  });
}
