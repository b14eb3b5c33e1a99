/**
 * What the shim reads of kubelet's ExecSyncRequest (agent/contract/exec-sync-fields.ts): whether
 * argv[0] is probe-agent's (from the first octets), and for a rewritten command three cheap facts:
 * the kind (cmd[1]), the timeout and the container ID. It never decodes the handler (cmd[2]): the agent does, once (agent/api/exec-sync.ts).
 */
import { declaredLength, FRAME_PREFIX } from '../grpc/frame.ts';
import { readFields, WireError, WireReader, WireTruncated } from '../grpc/protowire.ts';
import { EXEC_SYNC_REQUEST as REQ } from '../contract/exec-sync-fields.ts';
import { SHIM_COMMAND_PATH, SHIM_KINDS, type ShimKind } from '../contract/shim-command.ts';

/** CRI method path the shim intercepts. */
export const EXEC_SYNC_PATH = '/runtime.v1.RuntimeService/ExecSync';

/** The facts the shim needs of a rewritten ExecSync: no handler in them. */
export interface ExecSyncFacts {
  /** cmd[1] when it is one of the rewrite's kinds, else 'unknown' (the agent refuses it). */
  kind: ShimKind | 'unknown';
  /** ExecSync timeout in seconds (0 for kubelet's exec hooks). */
  timeoutSeconds: number;
  /** The container_id field's octets (decoded only for a log line). */
  containerId: Buffer;
}

const KINDS = new Map<string, ShimKind>(SHIM_KINDS.map((k) => [k, k]));

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
      if (field === REQ.cmd && Buffer.isBuffer(value)) {
        if (argv === 0) ours = value.equals(ARGV0);
        else if (argv === 1 && value.length <= 16) kind = KINDS.get(value.toString('latin1')) ?? 'unknown';
        argv++;
      } else if (field === REQ.containerId && Buffer.isBuffer(value)) containerId = value;
      else if (field === REQ.timeout && typeof value === 'number') timeoutSeconds = value;
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
  const declared = declaredLength(framed);
  if (declared === undefined) return 'more';
  if (framed[0] !== 0) return 'not-ours'; // compressed: kubelet never compresses
  const msgEnd = FRAME_PREFIX + declared;
  const r = new WireReader(framed, FRAME_PREFIX, Math.min(msgEnd, framed.length));
  try {
    for (;;) {
      if (r.pos >= r.end) return r.end < msgEnd ? 'more' : 'not-ours';
      // Kubelet's tags and lengths take a few octets: a varint past 5 is no ExecSyncRequest of ours.
      const tag = r.varint(5);
      const field = Math.floor(tag / 8);
      const wire = tag % 8;
      if (wire === 0) {
        r.varint(5);
        continue;
      }
      if (wire !== 2) return 'not-ours';
      const len = r.varint(5);
      if (field === REQ.cmd) {
        // cmd[0]: the whole of it is needed only to say 'ours'; a differing prefix says 'not-ours' at once.
        const have = Math.min(len, r.end - r.pos);
        const cmp = Math.min(have, ARGV0.length);
        if (!framed.subarray(r.pos, r.pos + cmp).equals(ARGV0.subarray(0, cmp))) return 'not-ours';
        if (len !== ARGV0.length) return 'not-ours';
        return have === len ? 'ours' : 'more';
      }
      r.pos += len;
    }
  } catch (err) {
    // Octets still to come may complete a varint; one too long never becomes ours.
    if (err instanceof WireTruncated) return 'more';
    if (err instanceof WireError) return 'not-ours';
    throw err;
  }
}
