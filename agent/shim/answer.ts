/**
 * How the shim answers kubelet's ExecSync for a rewritten handler, so that kubelet's own exec
 * prober and hook runner reach the verdict they would reach for the original handler
 * (pkg/probe/exec, pkg/kubelet/prober, k8s.io/cri-client remote_runtime.go ExecSync):
 *
 *  - exit_code 0                  → probe Success (a Warning's text rides in stdout); hook done.
 *  - exit_code != 0, message      → probe Failure with the message as its output; hook failed.
 *    A target that timed out is a Failure too, answered as an exit code, never as gRPC
 *    DEADLINE_EXCEEDED: kubelet turns DEADLINE_EXCEEDED into an exec TimeoutError, whose verdict
 *    depends on the ExecProbeTimeout gate (Success when it is off) and whose message is the
 *    unreadable rewritten command.
 *  - any gRPC error but DEADLINE_EXCEEDED → kubelet's prober returns Unknown + error, retries,
 *    then throws the result away: no state change. Used whenever the probe could not be run
 *    (agent unreachable or too slow, pod not known, bad handler, netns trouble), because the
 *    agent's trouble must never count as the target's failure. For a hook, kubelet counts any
 *    error as a failed hook, so a hook the agent did not start is first retried within
 *    --hook-agent-wait (hook-runner.ts; docs/closing-the-hole.md).
 */
import { AgentCallError, GrpcCode, WireResult, type AgentAnswer } from '../api/shim-client.ts';
import type { AgentErrorCause } from './metrics.ts';

/** Exit code of a failed probe or hook. */
export const FAILURE_EXIT_CODE = 1;

/** What the shim sends back for one ExecSync. */
export type ExecSyncAnswer =
  | { kind: 'exit'; exitCode: number; stdout: string }
  | { kind: 'error'; grpcCode: number; message: string };

/** Maps the agent's Probe / RunLifecycleHandler answer. */
export function answerFromResult(answer: AgentAnswer, what: string): ExecSyncAnswer {
  switch (answer.result) {
    case WireResult.SUCCESS:
    case WireResult.WARNING:
      return { kind: 'exit', exitCode: 0, stdout: answer.message };
    case WireResult.FAILURE:
      return { kind: 'exit', exitCode: FAILURE_EXIT_CODE, stdout: answer.message };
    default: {
      const reason = answer.reason ? ` (${answer.reason})` : '';
      return { kind: 'error', grpcCode: GrpcCode.UNAVAILABLE, message: `probe-agent could not run the ${what}${reason}: ${answer.message}` };
    }
  }
}

/** Maps a call that got no answer from the agent: always a gRPC error, never DEADLINE_EXCEEDED. */
export function answerFromCallError(err: AgentCallError, what: string): ExecSyncAnswer {
  if (err.failure === 'status' && err.grpcCode !== GrpcCode.DEADLINE_EXCEEDED && err.grpcCode !== GrpcCode.OK) {
    return { kind: 'error', grpcCode: err.grpcCode, message: `probe-agent refused the ${what}: ${err.message}` };
  }
  return { kind: 'error', grpcCode: GrpcCode.UNAVAILABLE, message: `probe-agent did not run the ${what}: ${err.message}` };
}

/** Maps a rewritten command the shim cannot decode. */
export function answerFromBadCommand(err: Error): ExecSyncAnswer {
  return { kind: 'error', grpcCode: GrpcCode.INVALID_ARGUMENT, message: `probe-agent shim: ${err.message}` };
}

/** Why the agent did not answer a call, as the shim's agent-errors counter names it; undefined when kubelet cancelled it. */
export function causeOfCallError(err: AgentCallError): AgentErrorCause | undefined {
  switch (err.failure) {
    case 'cancelled':
      return undefined;
    case 'unreachable':
      return 'unreachable';
    case 'broken':
      return 'unavailable';
    case 'deadline':
      return 'timeout';
    default:
      break;
  }
  switch (err.grpcCode) {
    case GrpcCode.RESOURCE_EXHAUSTED:
      return 'exhausted';
    case GrpcCode.UNAVAILABLE:
      return 'unavailable';
    case GrpcCode.DEADLINE_EXCEEDED:
      return 'timeout';
    case GrpcCode.INVALID_ARGUMENT:
    case GrpcCode.NOT_FOUND:
    case GrpcCode.FAILED_PRECONDITION:
    case GrpcCode.UNIMPLEMENTED:
    case GrpcCode.PERMISSION_DENIED:
      return 'refused';
    default:
      return 'other';
  }
}

/** The agent-errors cause of an answer the agent did give: only "could not run" (a gRPC error answer) counts. */
export function causeOfAnswer(answer: ExecSyncAnswer): AgentErrorCause | undefined {
  return answer.kind === 'error' ? 'unavailable' : undefined;
}

/**
 * Kubelet runs probes with ExecSync timeout = timeoutSeconds (>= 1 after API defaulting;
 * pkg/kubelet/prober/prober.go) and exec hooks with timeout 0 (pkg/kubelet/lifecycle/handlers.go).
 * A rewritten command whose kind and timeout disagree did not come from kubelet's own prober or
 * hook runner for that kind: refused with INVALID_ARGUMENT (never DEADLINE_EXCEEDED), so kubelet
 * discards it and a probe cannot hold a hook's hour.
 */
export function kindTimeoutMismatch(kind: string, isProbe: boolean, timeoutSeconds: number): ExecSyncAnswer | undefined {
  if (isProbe && timeoutSeconds <= 0) {
    return { kind: 'error', grpcCode: GrpcCode.INVALID_ARGUMENT, message: `probe-agent shim: a ${kind} probe with ExecSync timeout ${timeoutSeconds}: kubelet sends probes with timeout >= 1 s and only hooks with 0` };
  }
  if (!isProbe && timeoutSeconds !== 0) {
    return { kind: 'error', grpcCode: GrpcCode.INVALID_ARGUMENT, message: `probe-agent shim: a ${kind} hook with ExecSync timeout ${timeoutSeconds} s: kubelet runs exec hooks with timeout 0, so this is not kubelet's hook call` };
  }
  return undefined;
}
