/**
 * What the shim sends kubelet for a rewritten ExecSync. The agent decides the answer
 * (agent/api/exec-sync.ts holds the mapping: exit 0 / exit 1 with the message, or a gRPC error,
 * never DEADLINE_EXCEEDED), and the shim relays it unchanged. The shim answers by itself only when
 * the agent gave no answer kubelet may see:
 *
 *  - no answer at all (unreachable, the connection broke, the shim's deadline, kubelet cancelled)
 *    -> UNAVAILABLE: kubelet's prober returns Unknown and discards it; a hook counts as failed,
 *    so a hook the agent certainly did not start is first sent again within --hook-agent-wait
 *    (hook-runner.ts);
 *  - DEADLINE_EXCEEDED from the agent's transport (its server cut the call at the deadline the
 *    shim sent) -> UNAVAILABLE, never DEADLINE_EXCEEDED (kubelet would read an exec timeout);
 *  - UNIMPLEMENTED: an agent older than ExecSync -> UNAVAILABLE saying to upgrade the agent first.
 */
import type { AgentCallError } from './agent-client.ts';
import { GrpcCode } from '../grpc/status.ts';
import type { AgentErrorCause } from './metrics.ts';
import { INVALID_COMMAND_PREFIX } from '../contract/hook-refusal.ts';

/** What the shim sends back for one ExecSync. */
export type ExecSyncAnswer =
  /** The agent's ExecSyncResponse, gRPC-framed, as the agent sent it (relayed unchanged); exitCode read for the metrics. */
  | { kind: 'message'; body: Buffer; exitCode: number }
  | { kind: 'error'; grpcCode: number; message: string };

/** The message kubelet gets when the agent does not know ExecSync. */
export const AGENT_TOO_OLD = 'probe-agent agent too old for this shim: upgrade the agent DaemonSet before the shim';

/** Maps a call that got no answer kubelet may see: the agent's status relayed, or UNAVAILABLE; never DEADLINE_EXCEEDED. */
export function answerFromCallError(err: AgentCallError, what: string): ExecSyncAnswer {
  if (err.failure === 'status') {
    if (err.grpcCode === GrpcCode.UNIMPLEMENTED) return { kind: 'error', grpcCode: GrpcCode.UNAVAILABLE, message: AGENT_TOO_OLD };
    if (err.grpcCode !== GrpcCode.DEADLINE_EXCEEDED && err.grpcCode !== GrpcCode.OK) return { kind: 'error', grpcCode: err.grpcCode, message: err.message };
  }
  return { kind: 'error', grpcCode: GrpcCode.UNAVAILABLE, message: `probe-agent did not run the ${what}: ${err.message}` };
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
    case GrpcCode.UNIMPLEMENTED:
      return 'agent_too_old';
    case GrpcCode.INVALID_ARGUMENT:
      // The agent names a command it cannot read (malformed, kind and timeout disagreeing) so; other
      // invalid arguments (a header value the annotation lacks, a port name) are refusals.
      return err.message.startsWith(INVALID_COMMAND_PREFIX) ? 'bad_command' : 'refused';
    case GrpcCode.NOT_FOUND:
    case GrpcCode.FAILED_PRECONDITION:
    case GrpcCode.PERMISSION_DENIED:
      return 'refused';
    default:
      return 'other';
  }
}
