/**
 * On-demand mode's marker: a probe that `probe-agent rewrite` (or the webhook) turned into an exec
 * handler carrying probe-agent's command (agent/contract/shim-command.ts). Kubelet runs it through the
 * kubelet shim, which asks this agent; the agent therefore never probes it on its own timers, and
 * shows the results the shim brings (docs/design/shim.md, "On-demand mode").
 */
import { ShimCommandError, decodeShimCommand, type ShimKind } from '../contract/shim-command.ts';
import type { ProbeType } from '../probe/types.ts';

const KIND_OF: Record<ProbeType, ShimKind> = { Liveness: 'liveness', Readiness: 'readiness', Startup: 'startup' };
const HANDLER_FIELDS = ['exec', 'httpGet', 'tcpSocket', 'grpc'] as const;

/**
 * The probe as written before the rewrite (its timing fields, the decoded original handler) when
 * `raw` is a rewritten probe; undefined when it is anything else. Throws ShimCommandError for a
 * command that names probe-agent but is malformed, names another kind, or carries no network handler.
 */
export function unwrapShimProbe(raw: unknown, probeType: ProbeType): Record<string, unknown> | undefined {
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) return undefined;
  const probe = raw as Record<string, unknown>;
  const exec = probe['exec'];
  if (typeof exec !== 'object' || exec === null) return undefined;
  const cmd = (exec as Record<string, unknown>)['command'];
  if (!Array.isArray(cmd) || !cmd.every((a) => typeof a === 'string')) return undefined;
  const decoded = decodeShimCommand(cmd as string[]);
  if (!decoded) return undefined;
  if (decoded.kind !== KIND_OF[probeType]) {
    throw new ShimCommandError(`probe-agent exec command: kind "${decoded.kind}" in a ${KIND_OF[probeType]} probe`);
  }
  const handlers = HANDLER_FIELDS.filter((f) => decoded.handler[f] !== undefined && decoded.handler[f] !== null);
  const extra = Object.keys(decoded.handler).filter((k) => !(HANDLER_FIELDS as readonly string[]).includes(k));
  if (handlers.length !== 1 || handlers[0] === 'exec' || extra.length > 0) {
    throw new ShimCommandError('probe-agent exec command: the handler must be exactly one of httpGet, tcpSocket, grpc');
  }
  const out: Record<string, unknown> = { ...probe, ...decoded.handler };
  delete out['exec'];
  return out;
}
