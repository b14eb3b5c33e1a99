/**
 * Bounded, fair concurrency for probe runs and lifecycle hooks, per tenant. Kubelet holds one
 * goroutine per waiting probe; here a run waiting on its target costs a socket and a timer, so the
 * node-wide cap can be large, and what one tenant may hold is bounded per namespace and per pod.
 *
 * Waiting runs are queued fairly namespace -> pod -> call: a free slot goes to the waiting
 * namespace holding the fewest slots (round-robin among equals), within it to the waiting pod
 * holding the fewest, and within the pod to its oldest run. No namespace and no pod may hold (or
 * queue) more than its cap, so a tenant with many hanging probes delays only itself. A run that
 * gives a deadline is refused at once when its estimated queue wait would outlast it, and leaves
 * the queue (refused) when the deadline passes while it waits.
 */
import type { Clock } from './clock.ts';
import { realClock } from './clock.ts';
import { OverloadedError } from '../errors.ts';
import { boundedInt } from '../config/bounds.ts';

/** Options for FairLimiter. */
export interface FairLimiterOptions {
  /** Runs in flight at once, across all tenants (at least 1). */
  maxInFlight: number;
  /** Runs waiting for a slot, across all tenants; one more is refused with OverloadedError. */
  maxQueued: number;
  /**
   * Slots one owner (pod) may hold at once. Default: half of maxInFlight (at least 1), so hanging
   * probes of one pod can never take every slot.
   */
  maxInFlightPerOwner?: number;
  /** Slots one group (namespace) may hold at once. Default: maxInFlight (no bound of its own). */
  maxInFlightPerGroup?: number;
  /** Runs one owner may have waiting. Default: maxQueued. */
  maxQueuedPerOwner?: number;
  /** Runs one group may have waiting. Default: maxQueued. */
  maxQueuedPerGroup?: number;
  /** Names what is limited, for error messages (default "probe"). */
  what?: string;
  clock?: Clock;
}

/** Who a run belongs to: its namespace (group) and its pod (owner). A bare string is an owner of group "". */
export interface Tenant {
  group: string;
  owner: string;
  /** How messages name the owner (e.g. namespace/name); default the owner key. */
  label?: string;
}

/** Per-run admission details. */
export interface AcquireOptions {
  /**
   * Milliseconds from now after which a slot is no use to the caller (its deadline less its run
   * time): refused at once when the estimated wait is longer, refused when it passes in the queue.
   */
  deadlineMs?: number;
  /** Longest the run holds its slot once granted (ms); used to estimate the wait of runs behind it. */
  holdMs?: number;
  /**
   * Runs of this run's group that may wait, when lower than maxQueuedPerGroup. Calls from outside the
   * agent (the shim's, the Probe RPC's) are held to a namespace's share; the agent's own scheduler,
   * whose runs the pod list already bounds, may queue up to the node's bound.
   */
  maxQueuedInGroup?: number;
}

/** A slot held by one run; release it exactly once (later calls are ignored). */
export interface Permit {
  /** Milliseconds spent waiting in the queue. */
  readonly waitedMs: number;
  release(): void;
}

interface Waiter {
  tenant: Tenant;
  holdMs: number;
  enqueuedAt: number;
  grant: (permit: Permit) => void;
  detach: () => void;
}

interface OwnerState {
  /** Clock ms by which each held slot is released at the latest (Infinity when unknown). */
  held: number[];
  queue: Waiter[];
}

interface GroupState {
  held: number[];
  queued: number;
  owners: Map<string, OwnerState>;
  /** Owners with waiting runs, in round-robin order. */
  turns: string[];
}

const HARD_MAX = 1_000_000;

function tenantOf(who: string | Tenant): Tenant {
  return typeof who === 'string' ? { group: '', owner: who } : who;
}

function whose(t: Tenant): string {
  return t.label ?? (t.group ? `${t.owner} in namespace ${t.group}` : t.owner);
}

function removeOne(list: number[], value: number): void {
  const at = list.indexOf(value);
  if (at >= 0) list.splice(at, 1);
}

/** Fair concurrency limiter keyed by tenant (namespace, pod UID). */
export class FairLimiter {
  readonly maxInFlight: number;
  readonly maxQueued: number;
  readonly maxInFlightPerOwner: number;
  readonly maxInFlightPerGroup: number;
  readonly maxQueuedPerOwner: number;
  readonly maxQueuedPerGroup: number;
  readonly #what: string;
  readonly #clock: Clock;
  readonly #groups = new Map<string, GroupState>();
  /** Groups with waiting runs, in round-robin order. */
  #turns: string[] = [];
  readonly #held: number[] = [];
  #queued = 0;

  constructor(opts: FairLimiterOptions) {
    this.maxInFlight = boundedInt(opts.maxInFlight, 1, HARD_MAX, 'maxInFlight');
    this.maxQueued = boundedInt(opts.maxQueued, 0, HARD_MAX, 'maxQueued');
    this.maxInFlightPerOwner = boundedInt(
      opts.maxInFlightPerOwner ?? Math.max(1, Math.floor(this.maxInFlight / 2)),
      1,
      HARD_MAX,
      'maxInFlightPerOwner',
    );
    this.maxInFlightPerGroup = boundedInt(opts.maxInFlightPerGroup ?? this.maxInFlight, 1, HARD_MAX, 'maxInFlightPerGroup');
    this.maxQueuedPerOwner = boundedInt(opts.maxQueuedPerOwner ?? this.maxQueued, 0, HARD_MAX, 'maxQueuedPerOwner');
    this.maxQueuedPerGroup = boundedInt(opts.maxQueuedPerGroup ?? this.maxQueued, 0, HARD_MAX, 'maxQueuedPerGroup');
    this.#what = opts.what ?? 'probe';
    this.#clock = opts.clock ?? realClock;
  }

  /** Runs holding a slot now. */
  get inFlight(): number {
    return this.#held.length;
  }

  /** Runs waiting for a slot now. */
  get queued(): number {
    return this.#queued;
  }

  /** Slots held and runs waiting for one group (namespace), for metrics and tests. */
  groupStats(group: string): { inFlight: number; queued: number } {
    const g = this.#groups.get(group);
    return { inFlight: g?.held.length ?? 0, queued: g?.queued ?? 0 };
  }

  /**
   * Waits for a slot for `who`. Rejects with OverloadedError when a queue is full or the run's
   * deadline would pass before a slot is free, and with the signal's reason when `signal` aborts
   * first (the run then leaves the queue).
   */
  acquire(who: string | Tenant, signal?: AbortSignal, opts: AcquireOptions = {}): Promise<Permit> {
    if (signal?.aborted) return Promise.reject(signal.reason);
    const tenant = tenantOf(who);
    const holdMs = opts.holdMs ?? Infinity;
    const group = this.#group(tenant.group);
    const owner = this.#owner(group, tenant.owner);
    // Anyone still waiting is blocked by a cap of its own (#pump runs on every release), so a run
    // that can start now takes nobody's turn.
    const blocked = this.#blockedAt(group, owner);
    if (blocked === undefined) return Promise.resolve(this.#grant(tenant, holdMs, 0));
    const refuse = (why: string): Promise<never> => {
      this.#dropIfIdle(tenant);
      return Promise.reject(
        new OverloadedError(`${this.#what} refused: ${why} (${this.#what}s of pod ${whose(tenant)})`, {
          namespace: tenant.group,
          owner: tenant.owner,
          inFlight: this.inFlight,
          queued: this.#queued,
        }),
      );
    };
    if (this.#queued >= this.maxQueued) return refuse(`node queue full for ${this.#what}s (${this.#queued} waiting, ${this.inFlight} in flight)`);
    if (group.queued >= Math.min(this.maxQueuedPerGroup, opts.maxQueuedInGroup ?? Infinity)) return refuse(`namespace queue full (${group.queued} waiting, ${group.held.length} in flight)`);
    if (owner.queue.length >= this.maxQueuedPerOwner) return refuse(`pod queue full (${owner.queue.length} waiting, ${owner.held.length} in flight)`);
    const now = this.#clock.now();
    const deadlineAt = opts.deadlineMs === undefined ? undefined : now + opts.deadlineMs;
    if (deadlineAt !== undefined) {
      const freeAt = this.#estimateFreeAt(blocked, group, owner);
      if (freeAt >= deadlineAt) {
        const wait = Number.isFinite(freeAt) ? `about ${Math.ceil((freeAt - now) / 1000)}s` : 'until a hanging call ends';
        return refuse(`the ${blocked} is at its limit and a slot would be free only in ${wait}, later than this call can wait (${Math.max(0, Math.round(deadlineAt - now))} ms: its deadline less its timeout)`);
      }
    }
    return new Promise<Permit>((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      const onAbort = (): void => {
        this.#dequeue(waiter);
        reject(signal?.reason);
      };
      const waiter: Waiter = {
        tenant,
        holdMs,
        enqueuedAt: now,
        grant: resolve,
        detach: () => {
          signal?.removeEventListener('abort', onAbort);
          clearTimeout(timer);
        },
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      if (deadlineAt !== undefined) {
        timer = setTimeout(() => {
          this.#dequeue(waiter);
          signal?.removeEventListener('abort', onAbort);
          reject(new OverloadedError(`${this.#what} refused: no slot free within the time this call can wait (${this.#what}s of pod ${whose(tenant)})`, {
            namespace: tenant.group,
            owner: tenant.owner,
          }));
        }, Math.max(0, deadlineAt - now));
        timer.unref();
      }
      if (owner.queue.length === 0) group.turns.push(tenant.owner);
      if (group.queued === 0) this.#turns.push(tenant.group);
      owner.queue.push(waiter);
      group.queued++;
      this.#queued++;
    });
  }

  /**
   * A slot for `who` now, or undefined when its pod, its namespace or the node is at its cap: for
   * callers that never wait (they have a way around), with the same caps as acquire.
   */
  tryAcquire(who: string | Tenant): Permit | undefined {
    const tenant = tenantOf(who);
    const group = this.#group(tenant.group);
    if (this.#blockedAt(group, this.#owner(group, tenant.owner)) === undefined) return this.#grant(tenant, Infinity, 0);
    this.#dropIfIdle(tenant);
    return undefined;
  }

  /**
   * Runs `fn` once a slot is free and releases the slot when it settles. Resolves with fn's value
   * and the seconds spent queued.
   */
  async run<T>(
    who: string | Tenant,
    fn: () => Promise<T>,
    signal?: AbortSignal,
    opts?: AcquireOptions,
  ): Promise<{ value: T; queueSeconds: number }> {
    const permit = await this.acquire(who, signal, opts);
    try {
      return { value: await fn(), queueSeconds: permit.waitedMs / 1000 };
    } finally {
      permit.release();
    }
  }

  #group(name: string): GroupState {
    let g = this.#groups.get(name);
    if (!g) {
      g = { held: [], queued: 0, owners: new Map(), turns: [] };
      this.#groups.set(name, g);
    }
    return g;
  }

  #owner(group: GroupState, name: string): OwnerState {
    let o = group.owners.get(name);
    if (!o) {
      o = { held: [], queue: [] };
      group.owners.set(name, o);
    }
    return o;
  }

  /** Forgets a tenant that holds and waits for nothing (maps must not grow with every pod ever seen). */
  #dropIfIdle(tenant: Tenant): void {
    const g = this.#groups.get(tenant.group);
    if (!g) return;
    const o = g.owners.get(tenant.owner);
    if (o && o.held.length === 0 && o.queue.length === 0) g.owners.delete(tenant.owner);
    if (g.owners.size === 0) this.#groups.delete(tenant.group);
  }

  /** Which cap keeps a run of this tenant from starting now, if any. */
  #blockedAt(group: GroupState, owner: OwnerState): 'pod' | 'namespace' | 'node' | undefined {
    if (owner.held.length >= this.maxInFlightPerOwner) return 'pod';
    if (group.held.length >= this.maxInFlightPerGroup) return 'namespace';
    if (this.#held.length >= this.maxInFlight) return 'node';
    return undefined;
  }

  /**
   * When a slot at the blocking level is expected to be free for a new run: each slot is released by
   * its holder's bound at the latest, and the runs already waiting at that level go first. An
   * estimate (a holder may end early), used only to refuse calls that could not start in time.
   */
  #estimateFreeAt(level: 'pod' | 'namespace' | 'node', group: GroupState, owner: OwnerState): number {
    const ends = level === 'pod' ? owner.held : level === 'namespace' ? group.held : this.#held;
    const ahead = level === 'pod' ? owner.queue.length : level === 'namespace' ? group.queued : this.#queued;
    if (ends.length === 0) return this.#clock.now();
    const sorted = [...ends].sort((a, b) => a - b);
    return sorted[Math.min(ahead, sorted.length - 1)] as number;
  }

  #grant(tenant: Tenant, holdMs: number, waitedMs: number): Permit {
    const group = this.#group(tenant.group);
    const owner = this.#owner(group, tenant.owner);
    const endBy = this.#clock.now() + holdMs;
    owner.held.push(endBy);
    group.held.push(endBy);
    this.#held.push(endBy);
    let released = false;
    return {
      waitedMs,
      release: () => {
        if (released) return;
        released = true;
        removeOne(owner.held, endBy);
        removeOne(group.held, endBy);
        removeOne(this.#held, endBy);
        this.#dropIfIdle(tenant);
        this.#pump();
      },
    };
  }

  /**
   * Hands free slots to waiting runs: the namespace holding the fewest slots first, within it the
   * pod holding the fewest, ties in round-robin order; namespaces and pods at their cap wait.
   */
  #pump(): void {
    while (this.#held.length < this.maxInFlight && this.#queued > 0) {
      let pickGroup = -1;
      let pickOwner = -1;
      let least = Infinity;
      for (let i = 0; i < this.#turns.length; i++) {
        const g = this.#groups.get(this.#turns[i] as string) as GroupState;
        if (g.held.length >= least || g.held.length >= this.maxInFlightPerGroup) continue;
        const o = this.#pickOwner(g);
        if (o < 0) continue;
        pickGroup = i;
        pickOwner = o;
        least = g.held.length;
        // Nobody holds fewer than none: under load most waiting namespaces hold nothing, so the
        // scan ends at the first one or two.
        if (least === 0) break;
      }
      if (pickGroup < 0) return;
      const groupName = this.#turns[pickGroup] as string;
      const g = this.#groups.get(groupName) as GroupState;
      const ownerName = g.turns[pickOwner] as string;
      const o = g.owners.get(ownerName) as OwnerState;
      const waiter = o.queue.shift() as Waiter;
      g.turns.splice(pickOwner, 1);
      if (o.queue.length > 0) g.turns.push(ownerName);
      g.queued--;
      this.#queued--;
      this.#turns.splice(pickGroup, 1);
      if (g.queued > 0) this.#turns.push(groupName);
      waiter.detach();
      waiter.grant(this.#grant(waiter.tenant, waiter.holdMs, this.#clock.now() - waiter.enqueuedAt));
    }
  }

  /** The index in g.turns of the waiting owner holding the fewest slots under its cap, or -1. */
  #pickOwner(g: GroupState): number {
    let pick = -1;
    let least = Infinity;
    for (let i = 0; i < g.turns.length; i++) {
      const held = (g.owners.get(g.turns[i] as string) as OwnerState).held.length;
      if (held < least && held < this.maxInFlightPerOwner) {
        pick = i;
        least = held;
        if (held === 0) break;
      }
    }
    return pick;
  }

  #dequeue(waiter: Waiter): void {
    const g = this.#groups.get(waiter.tenant.group);
    const o = g?.owners.get(waiter.tenant.owner);
    const at = o?.queue.indexOf(waiter) ?? -1;
    if (!g || !o || at < 0) return;
    waiter.detach();
    o.queue.splice(at, 1);
    g.queued--;
    this.#queued--;
    if (o.queue.length === 0) g.turns = g.turns.filter((n) => n !== waiter.tenant.owner);
    if (g.queued === 0) this.#turns = this.#turns.filter((n) => n !== waiter.tenant.group);
    this.#dropIfIdle(waiter.tenant);
  }
}
