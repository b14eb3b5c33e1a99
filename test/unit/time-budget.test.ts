/**
 * agent/probe/time-budget.ts: the numbers each stage takes, from the caller's deadline down to the
 * netns helper, as tables of cases.
 */
import { describe, expect, it } from 'vitest';
import { SPEC_LIMITS } from '../../agent/probe/spec.ts';
import {
  AGENT_GRACE_MS,
  HELPER_SOCKET_SLACK_MS,
  HOOK_CAP_MS,
  HOOK_LAST_RESORT_MS,
  REPLY_MARGIN_MS,
  WATCHDOG_GRACE_MS,
  admission,
  agentCallMs,
  callBudget,
  helperRequestMs,
  helperTcpTimes,
  hookLimitSeconds,
  ownTimeBudgetMs,
  scheduledLimitMs,
  targetGrpcTimeoutMs,
} from '../../agent/probe/time-budget.ts';

const NOW = 1_000_000;

describe('agentCallMs: the shim\'s deadline for its call to the agent', () => {
  it.each([
    // timeoutSeconds, graceMs, kubelet's grpc-timeout (ms), expected
    { t: 1, grace: AGENT_GRACE_MS, caller: undefined, want: 3000, why: 'timeout + grace without a caller deadline' },
    { t: 1, grace: AGENT_GRACE_MS, caller: 121_000, want: 3000, why: "kubelet's timeout + 2 min is far later" },
    { t: 10, grace: 500, caller: 5000, want: 5000 - REPLY_MARGIN_MS, why: "kubelet's deadline less the reply margin" },
    { t: 1, grace: AGENT_GRACE_MS, caller: 20, want: 1, why: 'at least 1 ms, even past the caller' },
    { t: -3, grace: 250, caller: undefined, want: 250, why: 'a negative timeout counts as 0' },
    { t: 3600, grace: 60_000, caller: undefined, want: HOOK_LAST_RESORT_MS, why: 'never beyond the last resort' },
  ])('$why', ({ t, grace, caller, want }) => {
    expect(agentCallMs(t, grace, caller)).toBe(want);
  });

  it('takes the cap it is given', () => {
    expect(agentCallMs(10, 0, undefined, 4000)).toBe(4000);
  });
});

describe("callBudget: one call's budget in the agent", () => {
  it.each([
    { what: 'no deadline: the own timeout, uncapped', deadline: Infinity, own: 5, want: { answerInMs: Infinity, answerBy: undefined, timeoutSeconds: 5, capped: false } },
    { what: 'no deadline, a hook without a limit', deadline: Infinity, own: 0, want: { answerInMs: Infinity, answerBy: undefined, timeoutSeconds: 0, capped: false } },
    { what: "the shim's deadline (timeout + grace) leaves the probe its timeout", deadline: NOW + 3000, own: 1, want: { answerInMs: 2950, answerBy: NOW + 2950, timeoutSeconds: 1, capped: false } },
    { what: 'a deadline shorter than the timeout caps it', deadline: NOW + 1050, own: 5, want: { answerInMs: 1000, answerBy: NOW + 1000, timeoutSeconds: 1, capped: true } },
    { what: 'a deadline exactly the timeout caps it by the reply margin', deadline: NOW + 2000, own: 2, want: { answerInMs: 1950, answerBy: NOW + 1950, timeoutSeconds: 1.95, capped: true } },
    { what: 'a hook without a limit is bounded by the deadline', deadline: NOW + 10_050, own: 0, want: { answerInMs: 10_000, answerBy: NOW + 10_000, timeoutSeconds: 10, capped: true } },
    { what: 'a hook with a shorter limit keeps it', deadline: NOW + 10_050, own: 3, want: { answerInMs: 10_000, answerBy: NOW + 10_000, timeoutSeconds: 3, capped: false } },
  ])('$what', ({ deadline, own, want }) => {
    expect(callBudget(deadline, own, NOW)).toEqual(want);
  });

  it.each([
    { what: 'a deadline passed', deadline: NOW - 1 },
    { what: 'a deadline now', deadline: NOW },
    { what: 'a deadline inside the reply margin', deadline: NOW + REPLY_MARGIN_MS },
    { what: 'no deadline at all (NaN)', deadline: Number.NaN },
  ])('no time left: $what', ({ deadline }) => {
    expect(callBudget(deadline, 1, NOW)).toBeUndefined();
  });

  it('a capped run ends by the answer, so the caller hears the agent before its own deadline', () => {
    const b = callBudget(NOW + 800, 1, NOW)!;
    expect(b.capped).toBe(true);
    expect(NOW + b.timeoutSeconds * 1000).toBeLessThanOrEqual(NOW + 800 - REPLY_MARGIN_MS);
  });
});

describe('admission: what the fair limiter is told', () => {
  it.each([
    { what: 'no deadline: wait as long as it takes', answerBy: undefined, t: 2, want: { deadlineMs: undefined, holdMs: 2000 } },
    { what: 'the grace is all the queueing a probe may take', answerBy: NOW + 2950, t: 1, want: { deadlineMs: 1950, holdMs: 1000 } },
    { what: 'a capped run may not wait at all', answerBy: NOW + 1000, t: 1, want: { deadlineMs: 0, holdMs: 1000 } },
    { what: 'a hook without a limit: wait until its answer is due', answerBy: NOW + 5000, t: 0, want: { deadlineMs: 5000, holdMs: undefined } },
    { what: 'a hook without a limit and no deadline', answerBy: undefined, t: 0, want: { deadlineMs: undefined, holdMs: undefined } },
  ])('$what', ({ answerBy, t, want }) => {
    expect(admission(answerBy, t, NOW)).toEqual(want);
  });

  it('the answer is due later than admission gives up by exactly the run\'s timeout', () => {
    const b = callBudget(NOW + 7000, 3, NOW)!;
    const a = admission(b.answerBy, b.timeoutSeconds, NOW);
    expect(NOW + a.deadlineMs! + b.timeoutSeconds * 1000).toBe(b.answerBy);
  });
});

describe('the run and the helper', () => {
  it.each([
    { t: 1, want: 1000 + 1000 + WATCHDOG_GRACE_MS },
    { t: 30, want: 60_000 + WATCHDOG_GRACE_MS },
    { t: 0.5, want: 1000 + WATCHDOG_GRACE_MS },
  ])('a scheduled probe of $t s is abandoned after $want ms', ({ t, want }) => {
    expect(scheduledLimitMs(t)).toBe(want);
    expect(scheduledLimitMs(t)).toBe(t * 1000 + ownTimeBudgetMs(t * 1000) + WATCHDOG_GRACE_MS);
  });

  it('the agent\'s own time has as long as the target', () => {
    expect(ownTimeBudgetMs(1500)).toBe(1500);
  });

  it.each([
    { t: 0, want: SPEC_LIMITS.maxTimeoutSeconds },
    { t: 3, want: 3 },
    { t: 0.25, want: 0.25 },
  ])('a hook of timeout $t s runs at most $want s', ({ t, want }) => {
    expect(hookLimitSeconds(t)).toBe(want);
  });

  it('the hook cap is the spec\'s largest timeout, and the shim\'s last resort lies beyond it', () => {
    expect(HOOK_CAP_MS).toBe(SPEC_LIMITS.maxTimeoutSeconds * 1000);
    expect(HOOK_LAST_RESORT_MS).toBeGreaterThan(HOOK_CAP_MS);
  });

  it.each([
    { remaining: 1000, want: { childTimeoutMs: 1000, slackMs: HELPER_SOCKET_SLACK_MS, giveUpMs: 1000 + HELPER_SOCKET_SLACK_MS } },
    { remaining: 200, want: { childTimeoutMs: 200, slackMs: 200, giveUpMs: 400 } },
    { remaining: 0, want: { childTimeoutMs: 0, slackMs: 0, giveUpMs: 0 } },
  ])('a TCP probe in the helper child with $remaining ms left', ({ remaining, want }) => {
    expect(helperTcpTimes(remaining)).toEqual(want);
  });

  it.each([
    { own: 5000, tcp: undefined, want: 5000 },
    { own: 5000, tcp: 999.2, want: 6000 },
    { own: 10, tcp: 1, want: 11 },
  ])('the helper request bound: own $own ms + tcp $tcp ms', ({ own, tcp, want }) => {
    expect(helperRequestMs(own, tcp)).toBe(want);
  });

  it.each([
    { remaining: 999.9, want: 999 },
    { remaining: 1000, want: 1000 },
    { remaining: 0.4, want: 0 },
  ])('a gRPC target is sent grpc-timeout $want ms for $remaining ms left', ({ remaining, want }) => {
    expect(targetGrpcTimeoutMs(remaining)).toBe(want);
  });
});
