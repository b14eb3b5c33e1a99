/**
 * The one CRI message the shim reads: ExecSyncRequest {container_id = 1, cmd = 2, timeout = 3},
 * and the one it writes: ExecSyncResponse {stdout = 1, stderr = 2, exit_code = 3}
 * (k8s.io/cri-api runtime/v1 field numbers).
 */
import { readFields, WireWriter } from '../api/protowire.ts';
import { SHIM_COMMAND_PATH } from '../rewrite/shim-command.ts';

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

const ARGV0 = Buffer.from(SHIM_COMMAND_PATH, 'utf8');

/**
 * Whether a gRPC-framed ExecSyncRequest whose first octets are `framed` has probe-agent's argv[0]:
 * 'ours', 'not-ours', or 'more' when those octets end before cmd[0] does. Reads only the fields
 * before cmd[0] (container_id, in any order with timeout), so the relay can forward every other
 * ExecSync as soon as its first DATA frame arrives.
 */
export function classifyExecSyncPrefix(framed: Buffer): 'ours' | 'not-ours' | 'more' {
  if (framed.length < 5) return 'more';
  if (framed[0] !== 0) return 'not-ours'; // compressed: kubelet never compresses
  const msgEnd = 5 + framed.readUInt32BE(1);
  const end = Math.min(msgEnd, framed.length);
  let pos = 5;
  const varint = (): number | undefined => {
    let v = 0;
    for (let shift = 0; shift < 35; shift += 7) {
      if (pos >= end) return undefined;
      const b = framed[pos++]!;
      v += (b & 0x7f) * 2 ** shift;
      if (b < 0x80) return v;
    }
    return -1;
  };
  for (;;) {
    if (pos >= end) return end < msgEnd ? 'more' : 'not-ours';
    const tag = varint();
    if (tag === undefined) return 'more';
    if (tag < 0) return 'not-ours';
    const field = Math.floor(tag / 8);
    const wire = tag % 8;
    if (wire === 0) {
      const v = varint();
      if (v === undefined) return 'more';
      if (v < 0) return 'not-ours';
      continue;
    }
    if (wire !== 2) return 'not-ours';
    const len = varint();
    if (len === undefined) return 'more';
    if (len < 0) return 'not-ours';
    if (field === 2) {
      // cmd[0]: the whole of it is needed only to say 'ours'; a differing prefix says 'not-ours' at once.
      const have = Math.min(len, end - pos);
      const cmp = Math.min(have, ARGV0.length);
      if (!framed.subarray(pos, pos + cmp).equals(ARGV0.subarray(0, cmp))) return 'not-ours';
      if (len !== ARGV0.length) return 'not-ours';
      return have === len ? 'ours' : 'more';
    }
    pos += len;
  }
}
