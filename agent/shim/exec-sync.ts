/**
 * The one CRI message the shim reads: ExecSyncRequest {container_id = 1, cmd = 2, timeout = 3},
 * and the one it writes: ExecSyncResponse {stdout = 1, stderr = 2, exit_code = 3}
 * (k8s.io/cri-api runtime/v1 field numbers).
 */
import { readFields, WireWriter } from '../api/protowire.ts';

/** CRI method path the shim intercepts. */
export const EXEC_SYNC_PATH = '/runtime.v1.RuntimeService/ExecSync';

/** A decoded ExecSyncRequest. */
export interface ExecSyncRequest {
  containerId: string;
  cmd: string[];
  /** Seconds; 0 = no timeout (kubelet's exec hooks). */
  timeoutSeconds: number;
}

/** Decodes an ExecSyncRequest message (throws WireError when malformed). */
export function decodeExecSyncRequest(msg: Buffer): ExecSyncRequest {
  const req: ExecSyncRequest = { containerId: '', cmd: [], timeoutSeconds: 0 };
  readFields(msg, (field, value) => {
    if (field === 1 && Buffer.isBuffer(value)) req.containerId = value.toString('utf8');
    else if (field === 2 && Buffer.isBuffer(value)) req.cmd.push(value.toString('utf8'));
    else if (field === 3 && typeof value === 'number') req.timeoutSeconds = value;
  });
  return req;
}

/** Encodes an ExecSyncResponse message. */
export function encodeExecSyncResponse(exitCode: number, stdout: string, stderr = ''): Buffer {
  return new WireWriter().bytes(1, stdout).bytes(2, stderr).varint(3, exitCode).finish();
}

/** Whether a message looks like argv[0] == "/.probe-agent/v1" without decoding all of it (hot path filter). */
export function mayBeShimCommand(msg: Buffer): boolean {
  return msg.includes('/.probe-agent/');
}
