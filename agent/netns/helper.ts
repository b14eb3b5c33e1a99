/**
 * The resident netns helper client: the request table over one long-lived helper process
 * (helper-process.ts starts it, restarts it with capped backoff and kills it when silent). The
 * helper serves each request in a pool worker (mode 'pool': long-lived, one request at a time,
 * killed and replaced past its deadline) or a tiny child per request (a clone sharing its small
 * memory, see netns-helper/README.md): a socket arrives as a handle on Node's IPC channel, a
 * netns's address list as a plain message. No fork from Node per probe, so the event loop never pays the agent's
 * page-table copy. See netns-helper/resident.c for the other side.
 */
import type { Socket } from 'node:net';
import { performance } from 'node:perf_hooks';
import { HelperError, describeError } from '../errors.ts';
import { type Logger, silentLogger } from '../log.ts';
import type { ConnectExchange, SocketFactory, TcpConnectOutcome, TcpExchangeOutcome, TcpProbeOutcome, TcpTarget } from '../probe/types.ts';
import { FairLimiter, type Tenant } from '../scheduler/limiter.ts';
import { canonicalIp } from './ip.ts';
import { helperRequestMs } from '../probe/time-budget.ts';
import { HelperProcess } from './helper-process.ts';
import {
  abortError, boundedInt, checkHelperBinary, checkRequest, discardHandle, isHelperReply, ownNetnsPath,
  replyToError, resolveHelperPath, connectedSocketFromHandle, socketFromHandle,
} from './helper-protocol.ts';
import { type NetnsIdentity, checkedNetnsIdentity } from './netns-path.ts';
import { DEFAULT_NETNS_DIRS, DEFAULT_PROC_ROOT, allowedNetnsDirs, normaliseProcRoot } from './path-guard.ts';

/** How to start and bound the resident helper. */
export interface ResidentHelperOptions {
  /** Helper binary; default $PROBE_AGENT_HELPER or netns-helper/build/probe-agent-netns-helper. */
  helperPath?: string;
  /** Extra directories whose entries may name a netns (e.g. containerd's state dir). */
  allowDirs?: string[];
  /**
   * Where the host's procfs is mounted (default /proc); the helper accepts <procRoot>/<pid>/ns/net
   * and no other proc path. Must be a procfs mount, not / nor under /proc, apart from the allowDirs.
   */
  procRoot?: string;
  log?: Logger;
  /**
   * Requests in flight (sent or waiting for a restart) before new ones are refused; default 128,
   * at most 65536. The helper forks at most min(4096, this + 64) children at once (beyond: 'busy').
   */
  maxInFlight?: number;
  /**
   * Requests sent to the helper at once (its forked children: what is really scarce); the rest of
   * maxInFlight wait here, pods taking turns, within their request timeout. Connects (which may last
   * a probe's timeout) hold at most half of it, a namespace a quarter, a pod an eighth. Default: maxInFlight.
   */
  maxSent?: number;
  /** Upper bound of one request, whatever the caller's signal says. Default 5000 ms. */
  requestTimeoutMs?: number;
  /** The WarmNetnsHelper gate: the helper makes sockets itself (setns there and back), no fork. */
  warm?: boolean;
  /**
   * Long-lived workers that serve requests one at a time (the NetnsHelperPool gate); a pod (netns)
   * holds at most a quarter of them (at least one). A request finding none idle waits up to 10 ms
   * for one while one may soon be free, else gets a child of its own at once. 0 or absent: a child
   * per request. At most 64.
   */
  pool?: number;
  /** Called each time the helper lost a pool worker ('timeout': killed past its deadline; 'crash'). */
  onWorkerLost?: (why: 'timeout' | 'crash') => void;
  /** Restart delay after the helper dies: doubles from `initial` up to `max` (ms). */
  restartBackoffMs?: { initial: number; max: number };
  /** Called each time a dead helper is restarted (for probe_agent_* metrics). */
  onRestart?: (reason: string) => void;
  /**
   * Called once per settled socket or TCP-probe request: ok = a socket was delivered (for a TCP
   * probe: an answer came; its duration then leaves out the connect). Caller aborts are not reported.
   */
  onRequest?: (durationSeconds: number, ok: boolean) => void;
}

/** Counters for metrics and tests. */
export interface ResidentHelperStats {
  /** Current helper pid, when one runs. */
  pid?: number;
  /** Requests handed to a helper (each one child process, except sockets in warm mode). */
  spawned: number;
  /** Times a dead helper was started again. */
  restarts: number;
  /** Requests not settled yet. */
  inFlight: number;
  /** Requests that ended without a socket (errors of any kind, caller aborts excluded). */
  failures: number;
  /** Pool workers lost (killed past a request's deadline, or died), each replaced when next needed. */
  workersLost: number;
}

/** What a request asks the helper for, and what it settles with. */
type Ask =
  | { kind: 'socket'; family: 4 | 6; resolve: (s: Socket) => void }
  | { kind: 'addrs'; resolve: (addrs: string[]) => void }
  | { kind: 'tcp'; target: TcpTarget; resolve: (o: TcpProbeOutcome) => void }
  | { kind: 'connect'; target: TcpTarget; resolve: (o: TcpConnectOutcome) => void }
  | { kind: 'exchange'; target: TcpTarget; send: Buffer; resolve: (o: TcpExchangeOutcome) => void };

interface Pending {
  id: number;
  netns: string;
  /** The namespace the path was checked to be when the request came: the helper must find that one. */
  identity: NetnsIdentity | undefined;
  ask: Ask;
  startedAt: number;
  sent: boolean;
  sentAt: number;
  reject: (e: Error) => void;
  timer: NodeJS.Timeout;
  signal?: AbortSignal;
  onAbort?: () => void;
}

const SELF_TEST_TIMEOUT_MS = 3000;
const ACCEPTED_PATHS_MAX = 4096;
/**
 * Shares of the send window (maxSent) that connects in the helper (TCP probes, op "connect") may
 * hold: half in all, a quarter per namespace, an eighth per pod. Such a request lives as long as its
 * connect (up to the probe's timeout), not only while a socket is made; past its share a connect
 * takes the socket route (a socket made at once, connected by Node), so blackholed targets of one
 * tenant can hold neither the whole window nor every other tenant's connects.
 */
const CONNECT_SHARE = { node: 1 / 2, namespace: 1 / 4, pod: 1 / 8 };
/** Bound on the addresses one netns may report (the helper's answer line holds about 90). */
const MAX_ADDRESSES = 128;

/** SocketFactory backed by the resident helper (mode 'resident', or 'warm' with the gate on). */
export class ResidentHelper implements SocketFactory {
  readonly mode: 'resident' | 'warm' | 'pool';
  readonly helperPath: string;
  readonly #allowDirs: string[];
  readonly procRoot: string;
  /** The agent's own netns as named under procRoot: what the self-test asks for. */
  #ownNetns = '';
  readonly #log: Logger;
  readonly #maxInFlight: number;
  readonly #maxSent: number;
  #sentNow = 0;
  readonly #timeoutMs: number;
  readonly #onRequest?: (durationSeconds: number, ok: boolean) => void;
  readonly #process: HelperProcess;
  readonly #pending = new Map<number, Pending>();
  /** Requests not sent yet, per pod netns path; the map's order is whose turn is next. */
  readonly #waiting = new Map<string, Pending[]>();
  #nextId = 1;
  #closed = false;
  /** Connects in the helper, per namespace and pod, within their shares of the send window. */
  readonly #connects: FairLimiter;
  /** Netns paths the path guard accepted: the guard is pure, so a repeat (every probe of a pod) skips it. */
  readonly #acceptedPaths = new Set<string>();
  readonly #onWorkerLost?: (why: 'timeout' | 'crash') => void;
  #stats = { spawned: 0, failures: 0, workersLost: 0 };

  private constructor(opts: ResidentHelperOptions) {
    this.helperPath = resolveHelperPath(opts.helperPath);
    this.#allowDirs = allowedNetnsDirs(opts.allowDirs ?? []);
    const pool = boundedInt(opts.pool ?? 0, 0, 64, 'pool');
    if (opts.warm && pool > 0) throw new HelperError('the warm helper and the helper pool exclude each other');
    this.mode = opts.warm ? 'warm' : pool > 0 ? 'pool' : 'resident';
    const args = ['--resident', ...(opts.warm ? ['--warm'] : []), ...(pool > 0 ? ['--pool', String(pool)] : [])];
    for (const d of this.#allowDirs.filter((x) => !DEFAULT_NETNS_DIRS.includes(x))) args.push('--allow-dir', d);
    this.procRoot = normaliseProcRoot(opts.procRoot ?? DEFAULT_PROC_ROOT, this.#allowDirs);
    if (this.procRoot !== DEFAULT_PROC_ROOT) args.push('--proc-root', this.procRoot);
    this.#log = (opts.log ?? silentLogger).child({ component: 'netns-helper', mode: this.mode });
    this.#maxInFlight = boundedInt(opts.maxInFlight ?? 128, 1, 65_536, 'maxInFlight');
    this.#maxSent = boundedInt(opts.maxSent ?? this.#maxInFlight, 1, this.#maxInFlight, 'maxSent');
    // The helper's own cap is a safety net above ours: a child that answered may still be exiting.
    args.push('--max-children', String(Math.min(4096, this.#maxSent + 64)));
    this.#timeoutMs = boundedInt(opts.requestTimeoutMs ?? 5000, 10, 60_000, 'requestTimeoutMs');
    const share = (f: number): number => Math.max(1, Math.floor(this.#maxSent * f));
    this.#connects = new FairLimiter({
      what: 'helper connect',
      maxInFlight: share(CONNECT_SHARE.node),
      maxInFlightPerGroup: share(CONNECT_SHARE.namespace),
      maxInFlightPerOwner: share(CONNECT_SHARE.pod),
      // Nothing waits (tryAcquire): past its share a connect takes the socket route at once.
      maxQueued: 0,
    });
    const backoff = opts.restartBackoffMs ?? { initial: 100, max: 10_000 };
    this.#onRequest = opts.onRequest;
    this.#onWorkerLost = opts.onWorkerLost;
    this.#process = new HelperProcess({
      path: this.helperPath,
      args,
      log: this.#log,
      backoff: {
        initial: boundedInt(backoff.initial, 1, 60_000, 'restartBackoffMs.initial'),
        max: boundedInt(backoff.max, backoff.initial, 600_000, 'restartBackoffMs.max'),
      },
      silenceMs: this.#timeoutMs,
    }, {
      onUp: () => {
        this.#pump();
      },
      onDown: (reason, pid) => {
        for (const p of [...this.#pending.values()]) {
          if (p.sent) this.#fail(p, new HelperError(`${reason} before answering`, { netns: p.netns, pid }));
        }
      },
      onMessage: (msg, handle) => this.#onMessage(msg, handle),
      onRestart: opts.onRestart,
    });
  }

  /** Starts the helper and proves it works by making a socket in the agent's own netns. */
  static async start(opts: ResidentHelperOptions = {}): Promise<ResidentHelper> {
    const helper = new ResidentHelper(opts);
    await checkHelperBinary(helper.helperPath);
    helper.#ownNetns = await ownNetnsPath(helper.procRoot);
    try {
      await helper.#process.start();
    } catch (err) {
      await helper.close();
      throw err;
    }
    try {
      await helper.selfTest();
    } catch (err) {
      await helper.close();
      throw new HelperError(`netns helper self-test failed: ${err instanceof Error ? err.message : String(err)}`, { path: helper.helperPath }, { cause: err });
    }
    helper.#log.info('netns helper started', { pid: helper.#process.pid, path: helper.helperPath });
    return helper;
  }

  /** Makes a socket in the agent's own netns through the helper; rejects when the helper is unusable. */
  async selfTest(): Promise<void> {
    const socket = await this.createSocket(this.#ownNetns, 4, AbortSignal.timeout(SELF_TEST_TIMEOUT_MS));
    socket.destroy();
  }

  /** Counters for metrics and tests. */
  stats(): ResidentHelperStats {
    return { pid: this.#process.pid, ...this.#stats, restarts: this.#process.restarts, inFlight: this.#pending.size };
  }

  /** An unconnected TCP socket made inside `netns`; the caller must connect or destroy it. */
  createSocket(netns: string | undefined, family: 4 | 6, signal?: AbortSignal): Promise<Socket> {
    return new Promise<Socket>((resolve, reject) => this.#request(netns, { kind: 'socket', family, resolve }, signal, reject));
  }

  /**
   * The global and site-scope addresses of the interfaces inside `netns` (canonical spelling),
   * read by the helper with one netlink dump inside the netns: no process run per netns.
   */
  readAddresses(netns: string, signal?: AbortSignal): Promise<string[]> {
    return new Promise<string[]>((resolve, reject) => this.#request(netns, { kind: 'addrs', resolve }, signal, reject));
  }

  /**
   * kubelet's TCP probe done in the helper's child inside `netns`: connect within the target's
   * timeout (counted from the socket's creation there), close, report. No fd is passed and Node
   * makes no socket. Undefined when `tenant` (its namespace and pod; default: the netns alone)
   * holds its share of the helper's connects already, or the timeout is beyond the helper's bound:
   * the caller then takes the socket route.
   */
  connectProbe(netns: string, target: TcpTarget, signal?: AbortSignal, tenant?: Tenant): Promise<TcpProbeOutcome | undefined> {
    return this.#connectOp<TcpProbeOutcome>(netns, target, tenant, (resolve, reject) => this.#request(netns, { kind: 'tcp', target, resolve }, signal, reject));
  }

  /**
   * The same connect in the helper's child, the winning connection handed over (TCP_NODELAY set)
   * instead of closed: an HTTP or gRPC probe's socket arrives connected, so Node makes no connect
   * of its own. Undefined under the same conditions as connectProbe.
   */
  connectSocket(netns: string, target: TcpTarget, signal?: AbortSignal, tenant?: Tenant): Promise<TcpConnectOutcome | undefined> {
    return this.#connectOp<TcpConnectOutcome>(netns, target, tenant, (resolve, reject) => this.#request(netns, { kind: 'connect', target, resolve }, signal, reject));
  }

  /**
   * connectSocket, and the child also writes `send` on the connection it made and reads the answer
   * until the peer's end, a short quiet, its buffer or the timeout (a byte pipe: the caller's reader
   * keeps every rule). A `send` beyond the helper's bounds is not sent (no exchange in the answer).
   */
  connectExchange(netns: string, target: TcpTarget, send: Buffer, signal?: AbortSignal, tenant?: Tenant): Promise<TcpExchangeOutcome | undefined> {
    return this.#connectOp<TcpExchangeOutcome>(netns, target, tenant, (resolve, reject) => this.#request(netns, { kind: 'exchange', target, send, resolve }, signal, reject));
  }

  /** A request that waits on a connect in the helper: within its tenant's connect shares and the helper's timeout bound. */
  #connectOp<T>(netns: string, target: TcpTarget, tenant: Tenant | undefined, start: (resolve: (o: T) => void, reject: (e: Error) => void) => void): Promise<T | undefined> {
    if (!(target.timeoutMs >= 1 && target.timeoutMs <= TCP_TIMEOUT_MS_MAX)) return Promise.resolve(undefined);
    // Taken at once (the request goes out in this call, before a caller can abort it), or not at all.
    const permit = this.#connects.tryAcquire(tenant ?? { group: '', owner: netns });
    if (!permit) return Promise.resolve(undefined);
    const p = new Promise<T>(start);
    p.then(permit.release, permit.release);
    return p;
  }

  /** Stops the helper (it exits when its channel closes) and rejects whatever is in flight. */
  async close(): Promise<void> {
    this.#closed = true;
    for (const p of [...this.#pending.values()]) this.#fail(p, new HelperError('netns helper closed', { netns: p.netns }));
    await this.#process.close();
  }

  #request(netns: string | undefined, ask: Ask, signal: AbortSignal | undefined, reject: (e: Error) => void): void {
    const family = familyOf(ask);
    try {
      if (this.#closed) throw new HelperError('netns helper is closed');
      if (netns === undefined || (family !== 4 && family !== 6) || !this.#acceptedPaths.has(netns)) {
        checkRequest(netns, family, this.#allowDirs, this.procRoot);
        // Bounded: a node has far fewer pods than this; past it, start over rather than grow.
        if (this.#acceptedPaths.size >= ACCEPTED_PATHS_MAX) this.#acceptedPaths.clear();
        this.#acceptedPaths.add(netns as string);
      }
      if (signal?.aborted) throw abortError(signal);
      if (this.#pending.size >= this.#maxInFlight) {
        throw new HelperError(`netns helper is overloaded: ${this.#maxInFlight} requests in flight`, { netns });
      }
    } catch (err) {
      reject(err as Error);
      return;
    }
    const id = this.#nextId++;
    const p: Pending = {
      id, netns: netns as string, identity: checkedNetnsIdentity(netns as string), ask, startedAt: performance.now(), sent: false, sentAt: 0, reject, signal,
      // A TCP probe may wait its whole connect timeout in the helper on top of the helper's own time.
      timer: setTimeout(() => this.#onTimeout(p), helperRequestMs(this.#timeoutMs, 'target' in ask ? ask.target.timeoutMs : undefined)),
    };
    if (signal) {
      p.onAbort = () => this.#fail(p, abortError(signal), true);
      signal.addEventListener('abort', p.onAbort, { once: true });
    }
    this.#pending.set(id, p);
    const queue = this.#waiting.get(p.netns);
    if (queue) queue.push(p);
    else this.#waiting.set(p.netns, [p]);
    this.#pump();
  }

  /**
   * Sends waiting requests while the helper has room, taking pod netns in turn (round robin, each
   * pod's own in order): one pod's backlog, however long, delays another pod's request by one
   * request per waiting pod, not by the whole backlog.
   */
  #pump(): void {
    while (this.#process.ready && this.#sentNow < this.#maxSent) {
      const next = this.#waiting.entries().next();
      if (next.done) return;
      const [netns, queue] = next.value;
      const p = queue.shift() as Pending;
      this.#waiting.delete(netns);
      // To the back of the turn order.
      if (queue.length > 0) this.#waiting.set(netns, queue);
      this.#send(p);
    }
  }

  #send(p: Pending): void {
    if (p.sent || !this.#process.ready || this.#sentNow >= this.#maxSent) return;
    p.sent = true;
    this.#sentNow++;
    p.sentAt = performance.now();
    this.#stats.spawned++;
    const msg: Record<string, unknown> = p.ask.kind === 'socket'
      ? { id: p.id, netns: p.netns, family: p.ask.family }
      : 'target' in p.ask
        ? tcpRequest(p.ask.kind === 'tcp' ? 'tcp' : 'connect', p.id, p.netns, p.ask.target, p.ask.kind === 'exchange' ? p.ask.send : undefined)
        : { id: p.id, op: 'addrs', netns: p.netns };
    if (p.identity) Object.assign(msg, { dev: p.identity.dev, ino: p.identity.ino });
    this.#process.send(msg, (err) => this.#fail(p, new HelperError(`cannot send a request to the netns helper: ${describeError(err)}`, { netns: p.netns })));
  }

  #onMessage(msg: unknown, handle: unknown): void {
    const lost = workerLostOf(msg);
    if (lost) {
      discardHandle(handle);
      this.#stats.workersLost++;
      this.#log.warn('netns helper replaced a pool worker', lost);
      this.#notify(() => this.#onWorkerLost?.(lost.why));
      return;
    }
    const p = isHelperReply(msg) ? this.#pending.get(msg.id) : undefined;
    if (!p || !isHelperReply(msg)) {
      // A late answer (timed out, aborted) or noise: its socket must not leak.
      discardHandle(handle);
      if (!isHelperReply(msg)) this.#log.warn('netns helper sent an unexpected message');
      return;
    }
    if (!msg.ok) {
      discardHandle(handle);
      return this.#fail(p, replyToError(p.netns, familyOf(p.ask), msg));
    }
    if ('target' in p.ask) {
      const exchange = p.ask.kind === 'exchange' ? exchangeOf(msg, p.ask.send) : undefined;
      const outcome = exchange === null ? undefined : tcpOutcomeOf(msg, (performance.now() - p.sentAt) / 1000, exchange?.seconds ?? 0);
      // Only a connection that won travels, only when it was asked for, and not once its peer ended it.
      const wanted = p.ask.kind !== 'tcp' && outcome?.outcome === 'connected' && !exchange?.ended;
      if (!wanted) discardHandle(handle);
      if (!outcome) return this.#fail(p, new HelperError('netns helper answered a TCP connect without a valid outcome', { netns: p.netns }));
      if (wanted && !handle) return this.#fail(p, new HelperError('netns helper connected without handing over the connection', { netns: p.netns }));
      this.#finish(p);
      // The helper's share only (its start and the answer), so the spawn histogram stays comparable with sockets.
      this.#notify(() => this.#onRequest?.(outcome.helperSeconds, true));
      if (p.ask.kind === 'tcp') return p.ask.resolve(outcome);
      if (outcome.outcome !== 'connected') return p.ask.resolve(outcome);
      if (p.ask.kind === 'connect') return p.ask.resolve({ ...outcome, socket: connectedSocketFromHandle(handle) });
      if (exchange?.ended) return p.ask.resolve({ ...outcome, socket: undefined, exchange });
      return p.ask.resolve({ ...outcome, socket: connectedSocketFromHandle(handle), ...(exchange ? { exchange } : {}) });
    }
    if (p.ask.kind === 'addrs') {
      discardHandle(handle);
      const addrs = addressesOf(msg);
      if (!addrs) return this.#fail(p, new HelperError('netns helper answered without a valid address list', { netns: p.netns }));
      this.#finish(p);
      return p.ask.resolve(addrs);
    }
    if (!handle) return this.#fail(p, new HelperError('netns helper answered without a socket', { netns: p.netns }));
    this.#finish(p);
    this.#notify(() => this.#onRequest?.((performance.now() - p.startedAt) / 1000, true));
    p.ask.resolve(socketFromHandle(handle));
  }

  #onTimeout(p: Pending): void {
    const wasSent = p.sent;
    this.#fail(p, this.#timeoutError(p));
    if (wasSent) this.#process.killIfSilent(p.sentAt);
  }

  #timeoutError(p: Pending): HelperError {
    const why = p.sent ? 'did not answer'
      : this.#process.ready ? `is busy (${this.#sentNow} requests in flight, limit ${this.#maxSent})`
      : `is unavailable (${this.#process.downReason || 'starting'})`;
    return new HelperError(`netns helper ${why} within ${this.#timeoutMs} ms`, { netns: p.netns });
  }

  #fail(p: Pending, err: Error, aborted = false): void {
    if (!this.#finish(p)) return;
    if (aborted && p.sent) this.#process.watchSilence(p.sentAt, 'target' in p.ask ? p.ask.target.timeoutMs : 0);
    if (!aborted) {
      this.#stats.failures++;
      if (p.ask.kind !== 'addrs') this.#notify(() => this.#onRequest?.((performance.now() - p.startedAt) / 1000, false));
    }
    p.reject(err);
  }

  /** Runs a metrics callback; a throwing callback must not break the request it reports on. */
  #notify(callback: () => void): void {
    try {
      callback();
    } catch (err) {
      this.#log.warn('netns helper metrics callback failed', { err: describeError(err) });
    }
  }

  /** Removes a request from the books; false when it was settled already. */
  #finish(p: Pending): boolean {
    if (this.#pending.get(p.id) !== p) return false;
    this.#pending.delete(p.id);
    clearTimeout(p.timer);
    if (p.onAbort) p.signal?.removeEventListener('abort', p.onAbort);
    if (p.sent) {
      this.#sentNow--;
      this.#pump();
    } else {
      const queue = this.#waiting.get(p.netns);
      const i = queue ? queue.indexOf(p) : -1;
      if (i >= 0) queue!.splice(i, 1);
      if (queue?.length === 0) this.#waiting.delete(p.netns);
    }
    return true;
  }
}

/** The helper's news that it lost a pool worker (its request, if any, is answered on its own). */
function workerLostOf(msg: unknown): { pid: number; why: 'timeout' | 'crash' } | undefined {
  const m = msg as { event?: unknown; pid?: unknown; why?: unknown } | null;
  if (typeof m !== 'object' || m === null || m.event !== 'worker-lost' || typeof m.pid !== 'number') return undefined;
  return m.why === 'timeout' || m.why === 'crash' ? { pid: m.pid, why: m.why } : undefined;
}

/** Upper bound of op "tcp"'s timeout_ms in the helper (TCP_TIMEOUT_MS_MAX in netns-helper/helper.h). */
const TCP_TIMEOUT_MS_MAX = 3_600_000;

/** The socket family a request is for (an address list: 4, which the helper ignores). */
function familyOf(ask: Ask): 4 | 6 {
  return ask.kind === 'socket' ? ask.family : ask.kind === 'addrs' ? 4 : ask.target.family;
}

/** The op "tcp" or "connect" request line's object (second address and stagger only for Happy Eyeballs). */
function tcpRequest(op: 'tcp' | 'connect', id: number, netns: string, t: TcpTarget, send: Buffer | undefined): Record<string, unknown> {
  const msg: Record<string, unknown> = { id, op, netns, family: t.family, ip: t.ip, port: t.port, timeout_ms: Math.ceil(t.timeoutMs) };
  if (t.second) Object.assign(msg, { ip2: t.second.ip, family2: t.second.family, stagger_ms: Math.round(t.second.staggerMs) });
  if (sendable(netns, send)) msg.send = send.toString('base64');
  return msg;
}

/** SEND_MAX, MAX_LINE and EXCHANGE_DATA_MAX in netns-helper/helper.h. */
const SEND_MAX = 4096;
const REQUEST_LINE_MAX = 8192;
const EXCHANGE_DATA_MAX = 8192;

/**
 * Whether `send` goes with the request: within the helper's bound, and its line (the netns path as
 * JSON, the base64, and 512 octets for the other fields) within the helper's. Else the connection
 * comes back with nothing written.
 */
function sendable(netns: string, send: Buffer | undefined): send is Buffer {
  return send !== undefined && send.length > 0 && send.length <= SEND_MAX
    && Buffer.byteLength(JSON.stringify(netns)) + Math.ceil(send.length / 3) * 4 + 512 <= REQUEST_LINE_MAX;
}

/**
 * The exchange of an op "connect" answer that carried "send"; undefined when the answer has none
 * (no send went, or nothing connected), null when it is malformed.
 */
function exchangeOf(msg: unknown, send: Buffer | undefined): ConnectExchange | undefined | null {
  const m = msg as { sent?: unknown; data?: unknown; eof?: unknown; rerr?: unknown; fbus?: unknown; xus?: unknown };
  if (m.sent === undefined) return undefined;
  if (typeof m.sent !== 'number' || !Number.isSafeInteger(m.sent) || m.sent < 0 || m.sent > (send?.length ?? 0)) return null;
  if (typeof m.data !== 'string' || m.data.length > Math.ceil(EXCHANGE_DATA_MAX / 3) * 4) return null;
  if (typeof m.xus !== 'number' || !(m.xus >= 0) || typeof m.fbus !== 'number') return null;
  if (m.rerr !== undefined && !(typeof m.rerr === 'string' && /^E[A-Z0-9]{1,20}$/.test(m.rerr))) return null;
  const ended = m.eof === true ? { eof: true as const } : typeof m.rerr === 'string' ? { code: m.rerr } : undefined;
  return {
    sent: m.sent,
    data: Buffer.from(m.data, 'base64'),
    ...(ended ? { ended } : {}),
    ...(m.fbus >= 0 ? { firstByteSeconds: m.fbus / 1e6 } : {}),
    seconds: m.xus / 1e6,
  };
}

/**
 * The outcome of a `tcp` answer (`roundTrip`: seconds since the request was sent, `exchanged`: the
 * seconds of it the target had after the connect); undefined when malformed.
 */
function tcpOutcomeOf(msg: unknown, roundTrip: number, exchanged: number): TcpProbeOutcome | undefined {
  const m = msg as { tcp?: unknown; code?: unknown; us?: unknown; won?: unknown };
  if (typeof m.us !== 'number' || !(m.us >= 0)) return undefined;
  const connectSeconds = m.us / 1e6;
  const helperSeconds = Math.max(0, roundTrip - connectSeconds - exchanged);
  if (m.tcp === 'connected' && (m.won === 0 || m.won === 1)) return { outcome: 'connected', won: m.won, connectSeconds, helperSeconds };
  if (m.tcp === 'timeout') return { outcome: 'timeout', connectSeconds, helperSeconds };
  if (m.tcp === 'error' && typeof m.code === 'string' && /^E[A-Z0-9]{1,20}$/.test(m.code)) {
    return { outcome: 'error', code: m.code, connectSeconds, helperSeconds };
  }
  return undefined;
}

/** The canonical addresses of an `addrs` answer; undefined when it is not a bounded list of IPs. */
function addressesOf(msg: unknown): string[] | undefined {
  const list = (msg as { addrs?: unknown }).addrs;
  if (!Array.isArray(list) || list.length > MAX_ADDRESSES) return undefined;
  const out: string[] = [];
  for (const a of list) {
    const c = typeof a === 'string' ? canonicalIp(a) : undefined;
    if (!c) return undefined;
    if (!out.includes(c)) out.push(c);
  }
  return out;
}
