/**
 * The Probe RPC: validation, the call deadline as a cap on the probe, cancellation, and the
 * mapping of the prober's typed errors onto gRPC status codes.
 */
import * as grpc from '@grpc/grpc-js';
import {
  InvalidProbeError,
  NetnsUnavailableError,
  OverloadedError,
  PodNotFoundError,
  ProbeAgentError,
  UnsupportedPodError,
  describeError,
} from '../errors.ts';
import type { OnDemandProber, OnDemandProbeRequest } from '../scheduler/types.ts';
import type { ProbeOutcome } from '../probe/types.ts';
import { outcomeToWire } from './convert.ts';
import { NOT_STARTED_TRAILER } from '../contract/hook-refusal.ts';
import { callBudget } from '../probe/time-budget.ts';
import { probeRequestFromWire } from './convert-request.ts';
import type { WireProbeRequest, WireProbeResponse } from './proto.ts';

/** A gRPC status raised by the server itself. */
export class RpcError extends Error {
  readonly code: grpc.status;
  constructor(code: grpc.status, message: string) {
    super(message);
    this.code = code;
  }
}

/** Maps an error from the prober or the converters onto a gRPC status. */
export function grpcStatusFor(err: unknown): { code: grpc.status; details: string } {
  // Our own errors carry a complete message; describeError would append their internal code.
  const details = err instanceof RpcError || err instanceof ProbeAgentError ? err.message : describeError(err);
  if (err instanceof RpcError) return { code: err.code, details };
  if (err instanceof InvalidProbeError) return { code: grpc.status.INVALID_ARGUMENT, details };
  if (err instanceof PodNotFoundError) return { code: grpc.status.NOT_FOUND, details };
  if (err instanceof UnsupportedPodError) return { code: grpc.status.FAILED_PRECONDITION, details };
  if (err instanceof NetnsUnavailableError) return { code: grpc.status.UNAVAILABLE, details };
  if (err instanceof OverloadedError) return { code: grpc.status.RESOURCE_EXHAUSTED, details };
  return { code: grpc.status.INTERNAL, details: `internal error: ${details}` };
}

/** A call refused before it started (UNAVAILABLE + the not-started trailer of agent/contract/hook-refusal.ts): a hook refused so is sent again. */
export class NotStartedError extends RpcError {
  /** The not-started trailer's value. */
  readonly why: string;
  constructor(details: string, why: string) {
    super(grpc.status.UNAVAILABLE, details);
    this.why = why;
  }

  trailers(): grpc.Metadata {
    const md = new grpc.Metadata();
    md.set(NOT_STARTED_TRAILER, this.why);
    return md;
  }
}

/** Bounds Probe calls in flight; the server reads `inFlight` for its stats. */
export interface ProbeCallGate {
  inFlight: number;
  readonly max: number;
}

/** A call's deadline in epoch ms (Infinity: none). */
export function deadlineMs(deadline: grpc.Deadline): number {
  return deadline instanceof Date ? deadline.getTime() : deadline;
}

function deadlineError(configuredSeconds: number, remainingMs: number): RpcError {
  return new RpcError(
    grpc.status.DEADLINE_EXCEEDED,
    `probe did not complete within the call deadline (${Math.round(remainingMs)} ms; probe timeout ${configuredSeconds}s)`,
  );
}

/**
 * Runs one Probe call. A probe cut short by the call deadline is DEADLINE_EXCEEDED, not FAILURE:
 * the target did not fail within its own timeout, the caller stopped waiting (docs/api.md).
 */
export async function handleProbeCall(
  call: grpc.ServerUnaryCall<WireProbeRequest, WireProbeResponse>,
  prober: OnDemandProber,
  gate: ProbeCallGate,
): Promise<WireProbeResponse> {
  return outcomeToWire(await runProbeCall(probeRequestFromWire(call.request), call, prober, gate));
}

/** What the call runners read of a call (grpc-js's ServerUnaryCall, or the shim socket's call): its deadline and its cancellation. */
export interface CallLike {
  getDeadline(): grpc.Deadline;
  on(event: 'cancelled', listener: () => void): unknown;
  off(event: 'cancelled', listener: () => void): unknown;
}

/**
 * Runs a validated probe request for a call (Probe, and ExecSync for a rewritten probe): the gate,
 * the call deadline as a cap on the probe (DEADLINE_EXCEEDED when it cuts the probe), cancellation.
 */
export async function runProbeCall(req: OnDemandProbeRequest, call: CallLike, prober: OnDemandProber, gate: ProbeCallGate): Promise<ProbeOutcome> {
  if (gate.inFlight >= gate.max) throw new RpcError(grpc.status.RESOURCE_EXHAUSTED, `too many Probe calls in flight (limit ${gate.max})`);
  const configured = req.timeoutSeconds;
  const budget = callBudget(deadlineMs(call.getDeadline()), configured, Date.now());
  if (!budget) throw new RpcError(grpc.status.DEADLINE_EXCEEDED, 'call deadline already passed');
  const { answerInMs: remainingMs, capped } = budget;
  // For admission: a call that cannot start its probe in time is refused rather than queued.
  if (budget.answerBy !== undefined) req.deadlineAt = budget.answerBy;
  // The call deadline caps the probe, and ends a run that outlives it (a helper's slow socket):
  // a probe outliving its caller would only hold a slot.
  req.timeoutSeconds = budget.timeoutSeconds;
  const ac = new AbortController();
  const onCancel = (): void => ac.abort(new Error('call cancelled'));
  call.on('cancelled', onCancel);
  const timer = budget.answerBy !== undefined ? setTimeout(() => ac.abort(new Error('call deadline exceeded')), remainingMs) : undefined;
  gate.inFlight++;
  try {
    const outcome = await prober.probe(req, ac.signal);
    if (ac.signal.aborted || (capped && outcome.reason === 'timeout')) throw deadlineError(configured, remainingMs);
    return outcome;
  } catch (err) {
    if (ac.signal.aborted && !(err instanceof RpcError)) throw deadlineError(configured, remainingMs);
    throw err;
  } finally {
    clearTimeout(timer);
    call.off('cancelled', onCancel);
    gate.inFlight--;
  }
}
