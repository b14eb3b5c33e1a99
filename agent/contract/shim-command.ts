/**
 * The exec command a rewritten probe or HTTP/TCP lifecycle hook carries: the contract between
 * `probe-agent rewrite` / the webhook (which write it), the kubelet shim (which recognises it in
 * ExecSync) and the agent (which knows such a probe is driven by kubelet through the shim).
 *
 *   ["/.probe-agent/v1", "<kind>", "<base64url(JSON of the original handler)>"]
 *
 * Why this form:
 * - base64url has no `$`, `(` or `)`, so kubelet's `$(VAR)` expansion of exec commands cannot
 *   alter the handler, whatever paths or header values it holds;
 * - the first element is an absolute path no image ships: on a node without the shim the runtime
 *   fails to start it (containerd answers a gRPC error), which kubelet discards for probes. Hooks
 *   are protected by the node affinity the rewrite adds (see docs/closing-the-hole.md).
 */

/** argv[0] of every rewritten handler; also the version of the command form. */
export const SHIM_COMMAND_PATH = '/.probe-agent/v1';

/** The probe types and lifecycle hooks a rewritten handler can stand for. */
export const SHIM_KINDS = ['liveness', 'readiness', 'startup', 'postStart', 'preStop'] as const;
export type ShimKind = (typeof SHIM_KINDS)[number];

/** Largest encoded handler accepted, so a hostile pod spec cannot make the shim buffer megabytes. */
export const MAX_ENCODED_HANDLER = 16 * 1024;

/** A rewritten handler, decoded. `handler` is the original Kubernetes handler object, e.g. `{ httpGet: {...} }`. */
export interface ShimCommand {
  kind: ShimKind;
  handler: Record<string, unknown>;
}

/** A command that names the shim but cannot be decoded; the message says why. */
export class ShimCommandError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ShimCommandError';
  }
}

/** Builds the exec command for a handler. */
export function encodeShimCommand(kind: ShimKind, handler: Record<string, unknown>): string[] {
  return [SHIM_COMMAND_PATH, kind, Buffer.from(JSON.stringify(handler), 'utf8').toString('base64url')];
}

/** Whether an exec command is one of ours (cheap: looks at argv[0] only). */
export function isShimCommand(cmd: readonly string[] | undefined): boolean {
  return cmd !== undefined && cmd.length > 0 && cmd[0] === SHIM_COMMAND_PATH;
}

/**
 * Decodes a command. Returns null for a command that is not ours; throws ShimCommandError for one
 * that names the shim but is malformed (wrong arity, unknown kind, bad encoding, not an object).
 */
export function decodeShimCommand(cmd: readonly string[]): ShimCommand | null {
  if (!isShimCommand(cmd)) return null;
  if (cmd.length !== 3) throw new ShimCommandError(`probe-agent exec command: expected 3 arguments, got ${cmd.length}`);
  const [, kindArg = '', encoded = ''] = cmd;
  const kind = kindArg as ShimKind;
  if (!SHIM_KINDS.includes(kind)) throw new ShimCommandError(`probe-agent exec command: unknown kind ${JSON.stringify(kindArg.slice(0, 32))}`);
  if (encoded.length > MAX_ENCODED_HANDLER) throw new ShimCommandError(`probe-agent exec command: handler is ${encoded.length} bytes encoded, limit ${MAX_ENCODED_HANDLER}`);
  if (!/^[A-Za-z0-9_-]*$/.test(encoded)) throw new ShimCommandError('probe-agent exec command: handler is not base64url');
  let handler: unknown;
  try {
    handler = JSON.parse(Buffer.from(encoded, 'base64url').toString('utf8'));
  } catch (err) {
    throw new ShimCommandError(`probe-agent exec command: handler is not JSON: ${(err as Error).message}`);
  }
  if (handler === null || typeof handler !== 'object' || Array.isArray(handler)) {
    throw new ShimCommandError('probe-agent exec command: handler is not a JSON object');
  }
  return { kind, handler: handler as Record<string, unknown> };
}
