/**
 * `probe-agent probe --pod ...`: one probe through the running agent's socket, so the agent
 * resolves the pod's netns, IPs and named ports exactly as its workers do.
 */
import { ProbeApiClient, type PodSelector } from '../api/client.ts';
import { InvalidProbeError } from '../errors.ts';
import type { ProbeOutcome, ProbeSpec } from '../probe/types.ts';

/** What probeThroughAgent needs. */
export interface RemoteProbeOptions {
  /** Agent socket path. */
  socket: string;
  /** "namespace/name" or a pod UID. */
  pod: string;
  spec: ProbeSpec;
  /** Container whose ports resolve named ports. */
  container?: string;
}

const UID = /^[0-9a-fA-F-]{1,64}$/;

/** Parses "namespace/name" or a UID into a pod selector; InvalidProbeError otherwise. */
export function parsePodRef(text: string): PodSelector {
  const trimmed = text.trim();
  if (trimmed.includes('/')) {
    const parts = trimmed.split('/');
    if (parts.length !== 2 || !parts[0] || !parts[1]) {
      throw new InvalidProbeError(`--pod: want namespace/name or a pod UID, got "${text}"`);
    }
    return { namespace: parts[0], name: parts[1] };
  }
  if (!UID.test(trimmed)) throw new InvalidProbeError(`--pod: "${text}" is neither namespace/name nor a pod UID`);
  return { uid: trimmed };
}

/**
 * Runs `spec` against the pod through the agent. Resolves with the outcome (a failing probe
 * included); rejects with ApiError when the agent could not run it (unknown pod, bad spec, ...).
 */
export async function probeThroughAgent(opts: RemoteProbeOptions): Promise<ProbeOutcome> {
  const pod = parsePodRef(opts.pod);
  const { client } = await ProbeApiClient.connect(opts.socket);
  try {
    return await client.probe({
      pod,
      containerName: opts.container,
      handler: opts.spec.handler,
      timeoutSeconds: opts.spec.timeoutSeconds,
    });
  } finally {
    client.close();
  }
}
