/**
 * Gates mode's fail-closed option: the agent renews the Lease `probe-agent-<node>` every third of
 * its duration. A controller beside the webhook (lease-controller.ts) sets the condition
 * False on the pods of a node whose Lease expired, so an agent that is gone turns its pods not
 * Ready instead of leaving their last condition.
 */
import { describeError } from '../errors.ts';
import type { Logger } from '../log.ts';

export interface LeaseRenewer {
  renewLease(namespace: string, name: string, durationSeconds: number): Promise<void>;
}

/** The prefix of every node's Lease name. */
export const LEASE_PREFIX = 'probe-agent-';
/** The Lease of a node. */
export const nodeLeaseName = (node: string): string => `${LEASE_PREFIX}${node}`.slice(0, 253);

/** Starts renewing; the returned function stops it. */
export function startLeaseRenewal(o: { writer: LeaseRenewer; namespace: string; node: string; durationMs: number; log: Logger; onRenew?: (ok: boolean) => void }): () => void {
  const seconds = Math.max(1, Math.round(o.durationMs / 1000));
  const name = nodeLeaseName(o.node);
  let busy = false;
  let failing = false;
  const renew = (): void => {
    if (busy) return;
    busy = true;
    o.writer.renewLease(o.namespace, name, seconds).then(
      () => {
        o.onRenew?.(true);
        if (failing) o.log.info('node lease renewed again', { lease: `${o.namespace}/${name}` });
        failing = false;
      },
      (err: unknown) => {
        o.onRenew?.(false);
        // Once per streak: a renewal every few seconds would flood the log during an outage.
        if (!failing) o.log.warn('node lease not renewed', { lease: `${o.namespace}/${name}`, err: describeError(err) });
        failing = true;
      },
    ).finally(() => (busy = false));
  };
  renew();
  const timer = setInterval(renew, Math.max(1000, Math.floor(o.durationMs / 3)));
  timer.unref();
  return () => clearInterval(timer);
}
