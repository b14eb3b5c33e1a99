/**
 * Gates mode's fail-closed option, on the webhook's side (`probe-agent webhook
 * --gates-lease-controller`): every agent renews the Lease `probe-agent-<node>` (lease.ts); when one
 * stops being renewed for its duration, the agent of that node is gone, and the pods there would
 * keep their last probe-agent.io/ready condition. This sets it False (reason NodeLeaseExpired) on
 * that node's gates pods whose condition is not False yet, so they leave their Services.
 *
 * Expiry is judged on this process's clock, from when it last saw the Lease's renewTime change
 * (as the node lifecycle controller does): a node's clock skew cannot expire it, and a restarted
 * controller waits a whole duration before it acts. Bounded: one request at a time, at most
 * `maxWritesPerPoll` writes per poll (the rest wait for the next), the pods of one node per list
 * (a fieldSelector), every answer size-bounded (api-writer.ts). A node is swept again only after
 * its Lease was renewed and expired anew. A write that fails is retried at the next poll.
 *
 * After its own polls failed for a while (OUTAGE_POLLS in a row: an API server outage, or this
 * replica cut off), every Lease's clock restarts at the first poll that succeeds, as if each had
 * just been renewed: the agents could not renew meanwhile either, and a control-plane outage must
 * not expire every node at once. A single failed poll restarts nothing, so a flaky API server still
 * lets a dead node expire.
 *
 * A Lease counts only under its holder's name (`probe-agent-<holderIdentity>`, lease.ts
 * nodeLeaseName): another is ignored, counted and logged once, so a forged Lease cannot speak for
 * another node. With `leader` (leader.ts) only the replica holding the leader Lease writes; the
 * others keep reading the Leases, so a new leader's clocks are already right.
 */
import { describeError } from '../errors.ts';
import type { Logger } from '../log.ts';
import type { ApiWriter, GateCondition } from './api-writer.ts';
import { LEASE_PREFIX, nodeLeaseName } from './lease.ts';

export interface LeaseControllerOptions {
  api: Pick<ApiWriter, 'getJson' | 'patchCondition'>;
  /** Namespace of the agents' Leases. */
  namespace: string;
  conditionType: string;
  intervalMs: number;
  maxWritesPerPoll: number;
  log: Logger;
  onOp?: (op: 'poll' | 'write' | 'ignored', ok: boolean) => void;
  /** Only the leader writes (leader election); absent: this replica always may. */
  leader?: { isLeader(): boolean };
  onExpired?: (nodes: number) => void;
  now?: () => number;
}

type Obj = Record<string, any>;

interface Seen {
  renewTime: string;
  durationMs: number;
  observedAt: number;
  /** Every pod of the node is False: nothing to do until the Lease is renewed. */
  swept: boolean;
}

/** Failed polls in a row after which every Lease's clock restarts at the next poll that succeeds. */
const OUTAGE_POLLS = 2;
/** Names of ignored Leases remembered (each counted and logged once; beyond this many, ignored silently). */
const MAX_IGNORED_LOGGED = 1024;

const EXPIRED: GateCondition = { status: 'False', reason: 'NodeLeaseExpired', message: "the probe-agent of this pod's node stopped renewing its Lease" };

export class LeaseController {
  readonly #o: LeaseControllerOptions;
  readonly #seen = new Map<string, Seen>();
  #timer: NodeJS.Timeout | undefined;
  #running: Promise<void> | undefined;
  #closed = false;
  #failedPolls = 0;
  readonly #ignoredLogged = new Set<string>();

  constructor(o: LeaseControllerOptions) {
    this.#o = o;
  }

  start(): void {
    const tick = (): void => {
      if (this.#closed || this.#running) return;
      this.#running = this.poll().finally(() => (this.#running = undefined));
    };
    tick();
    this.#timer = setInterval(tick, this.#o.intervalMs);
    this.#timer.unref();
  }

  async close(): Promise<void> {
    this.#closed = true;
    clearInterval(this.#timer);
    await this.#running;
  }

  /** One pass: read the Leases, sweep the nodes whose Lease expired. */
  async poll(): Promise<void> {
    const now = this.#o.now ?? Date.now;
    let list: Obj;
    try {
      list = (await this.#o.api.getJson('node leases', `/apis/coordination.k8s.io/v1/namespaces/${encodeURIComponent(this.#o.namespace)}/leases`)) as Obj;
      this.#o.onOp?.('poll', true);
    } catch (err) {
      this.#o.onOp?.('poll', false);
      // Once per streak: during an outage every poll fails.
      if (this.#failedPolls++ === 0) this.#o.log.warn('node leases not read', { err: describeError(err) });
      return;
    }
    const restart = this.#failedPolls >= OUTAGE_POLLS;
    if (restart) this.#o.log.info('node leases read again after failed polls: every Lease\'s clock restarts now', { failedPolls: this.#failedPolls, leases: this.#seen.size });
    else if (this.#failedPolls > 0) this.#o.log.info('node leases read again', { failedPolls: this.#failedPolls });
    this.#failedPolls = 0;
    const present = new Set<string>();
    const expired: string[] = [];
    for (const lease of Array.isArray(list?.items) ? (list.items as Obj[]) : []) {
      const name = lease?.metadata?.name;
      const node = lease?.spec?.holderIdentity;
      const seconds = lease?.spec?.leaseDurationSeconds;
      if (typeof name !== 'string' || !name.startsWith(LEASE_PREFIX) || typeof node !== 'string' || node === '') continue;
      if (typeof seconds !== 'number' || !Number.isInteger(seconds) || seconds < 1) continue;
      if (name !== nodeLeaseName(node)) {
        if (this.#ignoredLogged.size < MAX_IGNORED_LOGGED && !this.#ignoredLogged.has(name)) {
          this.#ignoredLogged.add(name);
          this.#o.onOp?.('ignored', true);
          this.#o.log.warn('node lease ignored: its name is not its holder\'s (said once per name)', { lease: `${this.#o.namespace}/${name.slice(0, 253)}`, holder: node.slice(0, 253), want: nodeLeaseName(node) });
        }
        continue;
      }
      present.add(node);
      const renewTime = String(lease.spec.renewTime ?? '');
      const s = this.#seen.get(node);
      if (restart && s) s.observedAt = now();
      if (!s || s.renewTime !== renewTime) {
        if (s?.swept) this.#o.log.info('node lease renewed again', { node });
        this.#seen.set(node, { renewTime, durationMs: seconds * 1000, observedAt: now(), swept: false });
        continue;
      }
      s.durationMs = seconds * 1000;
      if (now() - s.observedAt > s.durationMs) expired.push(node);
    }
    for (const node of this.#seen.keys()) if (!present.has(node)) this.#seen.delete(node);
    this.#o.onExpired?.(expired.length);
    let budget = this.#o.maxWritesPerPoll;
    for (const node of expired) {
      const s = this.#seen.get(node)!;
      if (s.swept) continue;
      if (budget <= 0 || this.#closed || !this.#leading()) break;
      budget = await this.#sweep(node, s, budget);
    }
  }

  #leading(): boolean {
    return this.#o.leader?.isLeader() ?? true;
  }

  /** Sets the condition False on the node's gates pods; returns the write budget left. */
  async #sweep(node: string, s: Seen, budget: number): Promise<number> {
    let pods: Obj[];
    try {
      const list = (await this.#o.api.getJson(`pods of node ${node}`, `/api/v1/pods?fieldSelector=${encodeURIComponent(`spec.nodeName=${node}`)}`)) as Obj;
      pods = Array.isArray(list?.items) ? list.items : [];
    } catch (err) {
      this.#o.log.warn('pods of an expired node not read', { node, err: describeError(err) });
      return budget;
    }
    let left = 0;
    let written = 0;
    for (const pod of pods) {
      const gated = Array.isArray(pod?.spec?.readinessGates) && pod.spec.readinessGates.some((g: Obj) => g?.conditionType === this.#o.conditionType);
      if (!gated) continue;
      const conditions: Obj[] = Array.isArray(pod?.status?.conditions) ? pod.status.conditions : [];
      const ours = conditions.find((c) => c?.type === this.#o.conditionType);
      // Absent is False to kubelet already; only a True (or Unknown) gate keeps a pod Ready.
      if (!ours || ours.status === 'False') continue;
      // Checked before each write: a replica that lost the lead stops before another could take it.
      if (budget <= 0 || this.#closed || !this.#leading()) {
        left++;
        continue;
      }
      budget--;
      const { namespace, name, uid } = pod.metadata ?? {};
      try {
        await this.#o.api.patchCondition(String(namespace), String(name), String(uid), EXPIRED);
        written++;
        this.#o.onOp?.('write', true);
      } catch (err) {
        left++;
        this.#o.onOp?.('write', false);
        this.#o.log.warn('pod condition not written for an expired node lease', { node, pod: `${String(namespace)}/${String(name)}`, err: describeError(err) });
      }
    }
    if (left === 0) s.swept = true;
    this.#o.log.info('node lease expired: its gates pods set not ready', { node, written, left });
    return budget;
  }
}
