/**
 * Where the kubelet shim reaches the agent: a socket of its own, root-only, serving ExecSync
 * alone (the lean server, agent/api/hot-unary.ts), beside the ProbeService socket every other
 * client uses. Both sides derive its default from the ProbeService socket's path, so an agent and
 * a shim configured with the same `--socket` / `--probe-socket` meet without another flag. Free
 * of imports, like all of agent/contract/: both sides load it.
 */

/** The shim socket beside a ProbeService socket: `/run/probe-agent/probe.sock` -> `/run/probe-agent/probe-shim.sock`. */
export function shimSocketBeside(probeSocket: string): string {
  return `${probeSocket.endsWith('.sock') ? probeSocket.slice(0, -'.sock'.length) : probeSocket}-shim.sock`;
}

/** The only method the shim socket serves. */
export const SHIM_EXEC_SYNC_PATH = '/probe.v1alpha1.ProbeService/ExecSync';
