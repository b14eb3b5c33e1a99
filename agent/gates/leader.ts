/**
 * Leader election for the webhook's lease controller (lease-controller.ts): every replica runs it,
 * one acts. Through a Lease of its own (`gates-lease-controller` in the agents' namespace), as
 * client-go's leaderelection does: created if absent (POST: 409 when another replica was first),
 * renewed or taken by an update that carries the resourceVersion it read (PUT: 409 when it changed
 * since), so two replicas never both hold it.
 *
 * Time is this process's clock only (as for the node Leases): another replica's record is valid
 * for its leaseDurationSeconds from when this replica saw it change, whatever its renewTime says. A
 * leader acts only until `renewDeadline` after it SENT its last successful renewal, which leaves
 * the longest request (`requestTimeoutMs`) and a margin before any other replica could take the
 * Lease: it stops writing before its Lease could be taken. On close it gives the Lease up (holder
 * cleared) so that another replica takes over at once.
 *
 * Refused by RBAC (403: manifests older than the election), every replica acts, as before it, with
 * a warning: a fail-closed controller that silently never acts would be worse than duplicate writes.
 */
import { describeError } from '../errors.ts';
import type { Logger } from '../log.ts';
import { ApiWriteError, type ApiWriter } from './api-writer.ts';

/** The leader-election Lease of the gates lease controller. */
export const LEADER_LEASE_NAME = 'gates-lease-controller';

export interface LeaderElectorOptions {
  api: Pick<ApiWriter, 'getJson' | 'writeJson'>;
  namespace: string;
  /** This replica: its pod name. */
  identity: string;
  durationMs: number;
  /** The longest one API request may take (the ApiWriter's timeout). */
  requestTimeoutMs: number;
  log: Logger;
  onOp?: (ok: boolean) => void;
  onLeading?: (leading: boolean) => void;
  now?: () => number;
}

type Obj = Record<string, any>;

/** What is left of the duration after the longest request and this margin bounds the lead. */
const MARGIN_MS = 1000;

/** The smallest duration that leaves a leader any time to act: the request timeout, the margin, and as long again. */
export function minLeaderDurationMs(requestTimeoutMs: number): number {
  return 2 * (requestTimeoutMs + MARGIN_MS);
}

export class LeaderElector {
  readonly #o: LeaderElectorOptions;
  readonly #renewDeadlineMs: number;
  #leadingUntil = -Infinity;
  #leading = false;
  /** Another replica's record as last seen, and when this replica saw it change. */
  #observed: { key: string; at: number } | undefined;
  #failing = false;
  /** The API server refuses this replica the leader Lease (403): it acts without an election. */
  #forbidden = false;

  constructor(o: LeaderElectorOptions) {
    if (o.durationMs < minLeaderDurationMs(o.requestTimeoutMs)) throw new Error(`leader lease duration ${o.durationMs} ms is shorter than ${minLeaderDurationMs(o.requestTimeoutMs)} ms`);
    this.#o = o;
    this.#renewDeadlineMs = o.durationMs - o.requestTimeoutMs - MARGIN_MS;
  }

  /** How often to try to acquire or renew: several tries within the renew deadline. */
  get retryMs(): number {
    return Math.max(500, Math.floor(this.#renewDeadlineMs / 3));
  }

  /** This replica may act now (and for as long as one request takes). */
  isLeader(): boolean {
    const leading = this.#forbidden || this.#now() < this.#leadingUntil;
    this.#setLeading(leading);
    return leading;
  }

  /** One try: acquire, renew, or watch the other replica's record. Never throws. */
  async tryOnce(): Promise<void> {
    const sentAt = this.#now();
    const path = this.#path();
    let lease: Obj | undefined;
    try {
      lease = (await this.#o.api.getJson('leader lease', path)) as Obj;
    } catch (err) {
      if (err instanceof ApiWriteError && err.status === 403) return this.#refused(err);
      if (!(err instanceof ApiWriteError && err.status === 404)) return this.#failed('leader lease not read', err);
    }
    const me = this.#o.identity;
    try {
      if (!lease) {
        await this.#o.api.writeJson('leader lease', 'POST', this.#path(true), {
          apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: LEADER_LEASE_NAME, namespace: this.#o.namespace }, spec: this.#spec(undefined),
        });
        return this.#won(sentAt);
      }
      const spec: Obj = typeof lease.spec === 'object' && lease.spec !== null ? lease.spec : {};
      const holder = typeof spec.holderIdentity === 'string' ? spec.holderIdentity : '';
      if (holder !== me) {
        this.#lose();
        if (holder !== '') {
          const key = JSON.stringify([holder, spec.renewTime ?? null, spec.leaseDurationSeconds ?? null]);
          const now = this.#now();
          if (this.#observed?.key !== key) this.#observed = { key, at: now };
          const seconds = spec.leaseDurationSeconds;
          const ms = Number.isInteger(seconds) && seconds > 0 ? Math.min(seconds, 3600) * 1000 : this.#o.durationMs;
          if (now - this.#observed.at <= ms) return this.#ok();
          this.#o.log.info('leader lease expired: taking it', { holder, lease: `${this.#o.namespace}/${LEADER_LEASE_NAME}` });
        }
      }
      // Ours to renew, free, or expired: an update guarded by the resourceVersion read.
      await this.#o.api.writeJson('leader lease', 'PUT', path, { ...lease, spec: this.#spec(spec, holder) });
      return this.#won(sentAt);
    } catch (err) {
      if (err instanceof ApiWriteError && err.status === 403) return this.#refused(err);
      this.#lose();
      if (err instanceof ApiWriteError && err.status === 409) return this.#ok(); // another replica was first
      return this.#failed('leader lease not written', err);
    }
  }

  /** Gives the Lease up if held (holder cleared): another replica takes it at its next try. */
  async release(): Promise<void> {
    const held = this.isLeader();
    this.#lose();
    if (!held) return;
    try {
      const lease = (await this.#o.api.getJson('leader lease', this.#path())) as Obj;
      if (lease?.spec?.holderIdentity !== this.#o.identity) return;
      await this.#o.api.writeJson('leader lease', 'PUT', this.#path(), { ...lease, spec: { ...lease.spec, holderIdentity: '', leaseDurationSeconds: 1 } });
      this.#o.log.info('leader lease released', { identity: this.#o.identity });
    } catch (err) {
      this.#o.log.info('leader lease not released; another replica takes it once it expires', { err: describeError(err) });
    }
  }

  #spec(old: Obj | undefined, holder?: string): Obj {
    const now = new Date().toISOString().replace('Z', '000Z');
    const ours = holder === this.#o.identity;
    const transitions = Number.isInteger(old?.leaseTransitions) ? old!.leaseTransitions : 0;
    return {
      holderIdentity: this.#o.identity,
      leaseDurationSeconds: Math.ceil(this.#o.durationMs / 1000),
      acquireTime: ours && old?.acquireTime ? old.acquireTime : now,
      renewTime: now,
      leaseTransitions: ours || !old ? transitions : transitions + 1,
    };
  }

  #path(collection = false): string {
    const base = `/apis/coordination.k8s.io/v1/namespaces/${encodeURIComponent(this.#o.namespace)}/leases`;
    return collection ? base : `${base}/${LEADER_LEASE_NAME}`;
  }

  #won(sentAt: number): void {
    this.#forbidden = false;
    // From when the renewal was sent: the other replicas saw the record change no earlier.
    this.#leadingUntil = sentAt + this.#renewDeadlineMs;
    this.#observed = undefined;
    this.#setLeading(true);
    this.#ok();
  }

  #lose(): void {
    this.#leadingUntil = -Infinity;
    this.#setLeading(false);
  }

  #setLeading(leading: boolean): void {
    if (leading === this.#leading) return;
    this.#leading = leading;
    this.#o.log.info(leading ? 'leading: this replica runs the gates lease controller' : 'not leading: another replica runs the gates lease controller', { identity: this.#o.identity });
    this.#o.onLeading?.(leading);
  }

  #refused(err: unknown): void {
    this.#o.onOp?.(false);
    if (!this.#forbidden) {
      this.#o.log.warn('leader lease refused (RBAC): every replica runs the lease controller, as without an election; grant get, create and update on this Lease', {
        lease: `${this.#o.namespace}/${LEADER_LEASE_NAME}`, err: describeError(err),
      });
    }
    this.#forbidden = true;
    this.#setLeading(true);
  }

  #ok(): void {
    this.#o.onOp?.(true);
    if (this.#failing) this.#o.log.info('leader lease reachable again');
    this.#failing = false;
  }

  #failed(msg: string, err: unknown): void {
    this.#o.onOp?.(false);
    // Once per streak: a try every few seconds would flood the log during an outage.
    if (!this.#failing) this.#o.log.warn(msg, { lease: `${this.#o.namespace}/${LEADER_LEASE_NAME}`, err: describeError(err) });
    this.#failing = true;
  }

  #now(): number {
    return (this.#o.now ?? Date.now)();
  }
}
