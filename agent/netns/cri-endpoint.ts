/**
 * Finds the node's CRI runtime socket when none is configured: the first well-known socket that
 * exists and answers Version (containerd, then CRI-O), as crictl does.
 */
import { stat } from 'node:fs/promises';
import { NetnsUnavailableError, describeError } from '../errors.ts';
import { silentLogger, type Logger } from '../log.ts';
import { CriClient, type CriVersion } from './cri-client.ts';

/** containerd, then CRI-O. */
export const DEFAULT_CRI_ENDPOINTS: readonly string[] = [
  'unix:///run/containerd/containerd.sock',
  'unix:///var/run/crio/crio.sock',
];

/** A runtime that answered. */
export interface DetectedCriEndpoint {
  endpoint: string;
  version: CriVersion;
}

/** Options of detectCriEndpoint. */
export interface DetectCriEndpointOptions {
  candidates?: readonly string[];
  /** Deadline for each Version call; default 2 s. */
  deadlineMs?: number;
  log?: Logger;
}

/**
 * Returns the first candidate that is a socket and answers Version over runtime.v1. Rejects with
 * NetnsUnavailableError listing why each candidate was skipped when none answers.
 */
export async function detectCriEndpoint(opts: DetectCriEndpointOptions = {}): Promise<DetectedCriEndpoint> {
  const log = opts.log ?? silentLogger;
  const candidates = opts.candidates ?? DEFAULT_CRI_ENDPOINTS;
  const skipped: string[] = [];
  for (const candidate of candidates) {
    const client = new CriClient(candidate, opts.deadlineMs === undefined ? {} : { deadlineMs: opts.deadlineMs });
    try {
      const st = await stat(client.socketPath).catch((err: unknown) => {
        throw new Error(`no socket (${(err as NodeJS.ErrnoException).code ?? describeError(err)})`);
      });
      if (!st.isSocket()) throw new Error('not a unix socket');
      const version = await client.version();
      if (version.runtimeApiVersion && version.runtimeApiVersion !== 'v1') {
        throw new Error(`runtime API ${version.runtimeApiVersion}, want v1`);
      }
      log.info('CRI endpoint detected', { endpoint: client.endpoint, runtime: version.runtimeName, runtimeVersion: version.runtimeVersion });
      return { endpoint: client.endpoint, version };
    } catch (err) {
      // The client's own errors already name the endpoint.
      skipped.push(err instanceof NetnsUnavailableError ? describeError(err) : `${client.endpoint}: ${describeError(err)}`);
      log.debug('CRI endpoint candidate skipped', { endpoint: client.endpoint, err: describeError(err) });
    } finally {
      client.close();
    }
  }
  throw new NetnsUnavailableError(`no CRI runtime found (${skipped.join('; ') || 'no candidates'})`, {
    outcome: 'unavailable',
    candidates: [...candidates],
  });
}
