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
 *    error as a failed hook (see docs/closing-the-hole.md for what that means when the agent is down).
 */
import { AgentCallError, GrpcCode, WireResult, type AgentAnswer } from '../api/shim-client.ts';

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
