/**
 * Runs one probe: plans the target, dispatches to the TCP/HTTP/gRPC prober under one deadline, and
 * always resolves with a bounded ProbeOutcome (kubelet's prober.runProbe, plus an explicit 'error').
 */
import { performance } from 'node:perf_hooks';
import { InvalidProbeError, describeError } from '../errors.ts';
import { Deadline, type ProberResult } from './connect.ts';
import { probeGrpc } from './grpc.ts';
import { probeHttp } from './http.ts';
import { overloadedTimeout } from './loop-lag.ts';
import { boundMessage } from './message.ts';
import { SPEC_LIMITS } from './spec.ts';
import { TargetError, planTargets } from './target.ts';
import { probeTcp } from './tcp.ts';
import type { FailureReason, ProbeContext, ProbeHandler, ProbeOutcome } from './types.ts';

export { MAX_MESSAGE_BYTES, boundMessage } from './message.ts';

/** Runs `handler` in `ctx` and reports kubelet's result; never throws. */
export async function runProbe(handler: ProbeHandler, ctx: ProbeContext): Promise<ProbeOutcome> {
  const started = performance.now();
  let deadline: Deadline | undefined;
  const finish = (prober: ProberResult): ProbeOutcome => {
    let r = prober;
    // A timeout the agent's own stalled loop caused is its error, not the target's failure (loop-lag.ts).
    // Only when our deadline ended it: a helper child that timed the connect itself was not stalled.
    if (r.result === 'failure' && r.reason === 'timeout' && deadline?.why() === 'timeout') {
      const why = overloadedTimeout(deadline.uncreditedStallMs(), ctx.timeoutSeconds * 1000);
      if (why !== undefined) r = { ...r, result: 'error', reason: 'agent-overloaded', message: `${why}: ${r.message}` };
    }
    const total = (performance.now() - started) / 1000;
    const outcome: ProbeOutcome = {
      result: r.result,
      // kubelet's output is the body as read (ReadAtMost), untrimmed; only our cap applies.
      message: boundMessage(r.message),
      durationSeconds: total,
      phases: { ...r.phases, total },
    };
    if (r.reason !== undefined && r.result !== 'success') outcome.reason = r.reason;
    if (r.address !== undefined) outcome.address = r.address;
    return outcome;
  };
  const fail = (result: 'error' | 'failure', reason: FailureReason, message: string): ProbeOutcome => finish({ result, reason, message, phases: {} });

  if (handler.kind === 'exec') return fail('error', 'other', 'exec probes are run by kubelet');
  const timeout = ctx.timeoutSeconds;
  if (!Number.isFinite(timeout) || timeout <= 0 || timeout > SPEC_LIMITS.maxTimeoutSeconds) {
    return fail('error', 'invalid-spec', `timeoutSeconds: must be 1..${SPEC_LIMITS.maxTimeoutSeconds}, got ${timeout}`);
  }
  deadline = new Deadline(timeout * 1000, ctx.signal);
  try {
    let plan;
    try {
      plan = await planTargets(handler, ctx, deadline.signal);
    } catch (err) {
      if (err instanceof TargetError) {
        // A name that does not resolve (legacy host field) is the target's failure, as kubelet's dial error is.
        const isFailure = err.reason === 'timeout' || err.reason === 'unreachable';
        return fail(isFailure ? 'failure' : 'error', err.reason, err.message);
      }
      if (err instanceof InvalidProbeError) return fail('error', 'invalid-spec', err.message);
      throw err;
    }
    switch (handler.kind) {
      case 'tcp':
        return finish(await probeTcp(plan, deadline));
      case 'http':
        return finish(await probeHttp(handler, plan, deadline, ctx.kubeVersion));
      case 'grpc':
        return finish(await probeGrpc(handler, plan, deadline, ctx.kubeVersion, ctx.frameBudget));
    }
  } catch (err) {
    return fail('error', 'other', `probe crashed: ${describeError(err)}`);
  } finally {
    deadline.dispose();
  }
}
