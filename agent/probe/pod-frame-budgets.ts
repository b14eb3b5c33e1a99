/**
 * The prober's HTTP/2 frame budgets, one per pod, kept across its probes' connections. A gRPC probe
 * opens a new connection every period, and each connection's own budget (1000 frames without
 * progress) would arm a flooding server afresh every period; charged here too, a pod's flood costs
 * at most its bucket's refill rate, whatever its probes, periods or connections. A healthy server
 * spends nothing here: a connection's first SHARED_FREE_FRAMES (its handshake) are free. The
 * bucket is the pod's alone, so a neighbour keeps its rate. A pod whose bucket is dry has each probe
 * cut at its first frames over (reason 'frame-budget', counted in
 * probe_agent_probe_results_total{reason}); one warning per streak, which ends when it has
 * refilled.
 */
import { silentLogger, type Logger } from '../log.ts';
import { TokenBucket, type SharedFrameBudget } from '../http2/frame-budget.ts';

/** Frames without progress a pod may send in a burst, over all its connections. */
export const POD_FRAME_BUDGET = 1000;
/** A pod's budget refills in full over this long (about 17 frames a second). */
export const POD_FRAME_REFILL_MS = 60_000;
/** Pods tracked at once; past it, full buckets (and then the oldest) are dropped. */
const MAX_PODS = 8192;

/** One pod's budget. */
class PodBudget implements SharedFrameBudget {
  readonly #bucket: TokenBucket;
  readonly #owner: PodFrameBudgets;
  readonly label: string;
  /** Set from the first cut until the bucket is full again. */
  streak = false;
  readonly spentWhy: string;

  constructor(owner: PodFrameBudgets, label: string, max: number, refillMs: number) {
    this.#owner = owner;
    this.label = label;
    this.#bucket = new TokenBucket(max, refillMs);
    this.spentWhy = `the pod's frame budget (${max} frames without progress per ${refillMs / 1000} s, over all its probes' connections) is spent`;
  }

  spend(): boolean {
    if (this.#bucket.take()) return true;
    if (!this.streak) {
      this.streak = true;
      this.#owner.streakStarted(this);
    }
    return false;
  }

  get full(): boolean {
    return this.#bucket.level >= this.#bucket.max;
  }
}

/** The per-pod budgets of one prober. */
export class PodFrameBudgets {
  readonly #pods = new Map<string, PodBudget>();
  readonly #log: Logger;
  readonly #max: number;
  readonly #refillMs: number;

  constructor(opts: { log?: Logger; max?: number; refillMs?: number } = {}) {
    this.#log = opts.log ?? silentLogger;
    this.#max = opts.max ?? POD_FRAME_BUDGET;
    this.#refillMs = opts.refillMs ?? POD_FRAME_REFILL_MS;
  }

  /** The budget of `pod`, for one probe (called for every probe: nothing is built for a known pod). */
  of(pod: { readonly uid: string; readonly namespace: string; readonly name: string }): SharedFrameBudget {
    let b = this.#pods.get(pod.uid);
    if (b === undefined) {
      if (this.#pods.size >= MAX_PODS) this.#trim();
      b = new PodBudget(this, `${pod.namespace}/${pod.name}`, this.#max, this.#refillMs);
      this.#pods.set(pod.uid, b);
    } else if (b.streak && b.full) {
      b.streak = false;
      this.#log.info('pod\'s gRPC server no longer floods the prober: its frame budget has refilled', { pod: b.label });
    }
    return b;
  }

  /** Forgets a pod (it is gone). */
  forget(uid: string): void {
    this.#pods.delete(uid);
  }

  /** @internal A pod's first cut of a streak. */
  streakStarted(b: PodBudget): void {
    this.#log.warn('pod\'s gRPC server floods the prober with frames that move nothing: its probes are cut at its frame budget until it stops', {
      pod: b.label, budget: this.#max, refillSeconds: this.#refillMs / 1000,
    });
  }

  #trim(): void {
    for (const [uid, b] of this.#pods) if (!b.streak && b.full) this.#pods.delete(uid);
    for (const uid of this.#pods.keys()) {
      if (this.#pods.size < MAX_PODS) break;
      this.#pods.delete(uid);
    }
  }
}
