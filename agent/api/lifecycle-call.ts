/**
 * The RunLifecycleHandler RPC: validation, the call deadline as the hook's bound, cancellation, and
 * the answer. Hook semantics (what fails a hook) live in agent/probe/lifecycle.ts.
 */
import * as grpc from '@grpc/grpc-js';
import type { HookOutcome } from '../probe/lifecycle.ts';
import type { OnDemandHookRequest, OnDemandProber } from '../scheduler/types.ts';
import { boundMessage } from '../probe/run.ts';
import { lifecycleRequestFromWire } from './convert-request.ts';
import { RpcError, deadlineMs, type CallLike, type ProbeCallGate } from './probe-call.ts';
import { callBudget } from '../probe/time-budget.ts';
import type { WireLifecycleRequest, WireLifecycleResponse, WireProbeResult } from './proto.ts';

const RESULT: Record<HookOutcome['result'], WireProbeResult> = {
  success: 'PROBE_RESULT_SUCCESS',
  failure: 'PROBE_RESULT_FAILURE',
  error: 'PROBE_RESULT_ERROR',
};

/** A hook outcome on the wire. */
export function hookOutcomeToWire(o: HookOutcome): WireLifecycleResponse {
  return { result: RESULT[o.result], message: boundMessage(o.message), duration_seconds: o.durationSeconds };
}

/**
 * Runs one RunLifecycleHandler call. The hook's bound is timeout_seconds, capped by the call
 * deadline; a hook cut short by the deadline ends the call with DEADLINE_EXCEEDED, as a probe does.
 */
export async function handleLifecycleCall(
  call: grpc.ServerUnaryCall<WireLifecycleRequest, WireLifecycleResponse>,
  prober: OnDemandProber,
  gate: ProbeCallGate,
): Promise<WireLifecycleResponse> {
  if (!prober.runHook) throw new RpcError(grpc.status.UNIMPLEMENTED, 'this agent does not run lifecycle hooks');
  return hookOutcomeToWire(await runLifecycleCall(lifecycleRequestFromWire(call.request), call, prober, gate));
}

/**
 * Runs a validated hook request for a call (RunLifecycleHandler, and ExecSync for a rewritten hook):
 * the gate, the call deadline as the hook's bound (DEADLINE_EXCEEDED when it cuts the hook), cancellation.
 */
export async function runLifecycleCall(req: OnDemandHookRequest, call: CallLike, prober: OnDemandProber, gate: ProbeCallGate): Promise<HookOutcome> {
  if (!prober.runHook) throw new RpcError(grpc.status.UNIMPLEMENTED, 'this agent does not run lifecycle hooks');
  if (gate.inFlight >= gate.max) throw new RpcError(grpc.status.RESOURCE_EXHAUSTED, `too many RunLifecycleHandler calls in flight (limit ${gate.max})`);
  const own = req.timeoutSeconds;
  const budget = callBudget(deadlineMs(call.getDeadline()), own, Date.now());
  if (!budget) throw new RpcError(grpc.status.DEADLINE_EXCEEDED, 'call deadline already passed');
  const { answerInMs: remainingMs, capped } = budget;
  // For admission: a hook that cannot start in time is refused rather than queued.
  if (budget.answerBy !== undefined) req.deadlineAt = budget.answerBy;
  req.timeoutSeconds = budget.timeoutSeconds;
  const ac = new AbortController();
  const onCancel = (): void => ac.abort(new Error('call cancelled'));
  call.on('cancelled', onCancel);
  const timer = budget.answerBy !== undefined ? setTimeout(() => ac.abort(new Error('call deadline exceeded')), remainingMs) : undefined;
  const cutShort = (): RpcError =>
    new RpcError(grpc.status.DEADLINE_EXCEEDED, `hook did not complete within the call deadline (${Math.round(remainingMs)} ms${own ? `; hook timeout ${own}s` : ''})`);
  gate.inFlight++;
  try {
    const outcome = await prober.runHook(req, ac.signal);
    if (ac.signal.aborted || (capped && outcome.reason === 'timeout')) throw cutShort();
    return outcome;
  } catch (err) {
    if (ac.signal.aborted && !(err instanceof RpcError)) throw cutShort();
    throw err;
  } finally {
    clearTimeout(timer);
    call.off('cancelled', onCancel);
    gate.inFlight--;
  }
}
