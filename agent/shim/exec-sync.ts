/**
 * What the shim reads of kubelet's ExecSyncRequest {container_id = 1, cmd = 2, timeout = 3}
 * (k8s.io/cri-api runtime/v1 field numbers): whether argv[0] is probe-agent's (from the first
 * octets), and for a rewritten command three cheap facts: the kind (cmd[1]), the timeout and the
 * container ID. It never decodes the handler (cmd[2]): the agent does, once (agent/api/exec-sync.ts).
 */
import { readFields, WireError } from '../api/protowire.ts';
import { SHIM_COMMAND_PATH } from '../rewrite/shim-command.ts';

/** CRI method path the shim intercepts. */
export const EXEC_SYNC_PATH = '/runtime.v1.RuntimeService/ExecSync';

/** The facts the shim needs of a rewritten ExecSync: no handler in them. */
export interface ExecSyncFacts {
  /** cmd[1] when it is one of the rewrite's kinds, else 'unknown' (the agent refuses it). */
  kind: 'liveness' | 'readiness' | 'startup' | 'postStart' | 'preStop' | 'unknown';
  /** ExecSync timeout in seconds (0 for kubelet's exec hooks). */
  timeoutSeconds: number;
  /** The container_id field's octets (decoded only for a log line). */
  containerId: Buffer;
}

const KINDS = new Map<string, ExecSyncFacts['kind']>(
  (['liveness', 'readiness', 'startup', 'postStart', 'preStop'] as const).map((k) => [k, k]),
);

/**
 * The facts of an ExecSyncRequest message whose argv[0] is probe-agent's; null when it is
 * malformed or argv[0] is not ours (the runtime then gets it as kubelet sent it). Walks the
 * top-level fields once, taking sub-slices: nothing is copied or decoded but cmd[1] (a few octets).
 */
export function execSyncFacts(msg: Buffer): ExecSyncFacts | null {
  let argv = 0;
  let ours = false;
  let kind: ExecSyncFacts['kind'] = 'unknown';
  let timeoutSeconds = 0;
  let containerId: Buffer = EMPTY;
  try {
    readFields(msg, (field, value) => {
      if (field === 2 && Buffer.isBuffer(value)) {
        if (argv === 0) ours = value.equals(ARGV0);
        else if (argv === 1 && value.length <= 16) kind = KINDS.get(value.toString('latin1')) ?? 'unknown';
        argv++;
      } else if (field === 1 && Buffer.isBuffer(value)) containerId = value;
      else if (field === 3 && typeof value === 'number') timeoutSeconds = value;
    });
  } catch (err) {
    if (err instanceof WireError) return null;
    throw err;
  }
  return ours ? { kind, timeoutSeconds, containerId } : null;
}

const EMPTY = Buffer.alloc(0);
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
