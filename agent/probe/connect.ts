/**
 * One TCP connection for a probe, over sockets made by a SocketFactory (so the connect happens in
 * whatever netns the socket was created in), with RFC 8305 Happy Eyeballs across addresses and one
 * deadline for everything. Errors carry kubelet's dial wording and a bounded FailureReason.
 */
import { isIPv6, type Socket } from 'node:net';
import { performance } from 'node:perf_hooks';
import { HelperError, NetnsError, describeError } from '../errors.ts';
import type { ConnectExchange, FailureReason, ProbePhases, ProbeResult, SocketFactory, TcpConnectOutcome, TcpExchangeOutcome, TcpProbeOutcome, TcpTarget } from './types.ts';
import type { Tenant } from '../scheduler/limiter.ts';
import { watchLoopLag, type LagWatch } from './loop-lag.ts';
import { joinHostPort } from './target.ts';
import { helperTcpTimes, ownTimeBudgetMs } from './time-budget.ts';

/** RFC 8305 "Connection Attempt Delay": start the next address after this long without an answer. */
export const ATTEMPT_DELAY_MS = 250;

/**
 * One probe's time budget: an AbortSignal that fires when the target has had `timeoutMs`, or when the
 * caller aborts. Time the agent spends on itself while no socket exists yet (the netns helper's
 * fork/setns/socket round trip on a loaded node) is held out of that budget (hold/release): kubelet's
 * timeout is for the target. The held time has its own budget (time-budget.ts ownTimeBudgetMs); running out of it
 * aborts with why() 'helper', which callers report as an error (ours), never a failure. The event
 * loop's stalls are the agent's own time too (loop-lag.ts): when the timeout fires, the stall seen
 * since the start is given back to the target from the same budget; what the budget could not give
 * back is uncreditedStallMs().
 */
export class Deadline {
  readonly startedAt: number;
  /** When the target's budget ends; moves later by every held interval. */
  endsAt: number;
  readonly timeoutMs: number;
  /** The agent's own-time budget: held time and the stalls given back share it. */
  readonly #ownBudgetMs: number;
  readonly signal: AbortSignal;
  readonly #controller = new AbortController();
  #timer: NodeJS.Timeout;
  #heldAt: number | undefined;
  #heldMs = 0;
  readonly #parent: AbortSignal | undefined;
  readonly #lag: LagWatch = watchLoopLag();
  /** Stall given back to the target, or seen while held (held time is given back already). */
  #creditedMs = 0;
  #stallAtHold = 0;
  /** Stall given back from the agent's own-time budget (shared with held time). */
  #givenBackMs = 0;
  readonly #onParentAbort = (): void => this.#controller.abort(new DeadlineAbort('aborted'));

  constructor(timeoutMs: number, parent?: AbortSignal) {
    this.startedAt = performance.now();
    this.timeoutMs = timeoutMs;
    this.#ownBudgetMs = ownTimeBudgetMs(timeoutMs);
    this.endsAt = this.startedAt + timeoutMs;
    this.signal = this.#controller.signal;
    this.#timer = this.#arm('timeout', timeoutMs);
    this.#parent = parent;
    if (parent?.aborted) this.#onParentAbort();
    else parent?.addEventListener('abort', this.#onParentAbort, { once: true });
  }

  /** Milliseconds the target has left (never negative); frozen while held. */
  remainingMs(): number {
    return Math.max(0, this.endsAt - (this.#heldAt ?? performance.now()));
  }

  /** Seconds since the deadline started (wall time, held time included). */
  elapsedSeconds(): number {
    return (performance.now() - this.startedAt) / 1000;
  }

  /** Milliseconds held out of the target's budget so far. */
  heldMs(): number {
    return this.#heldMs + (this.#heldAt === undefined ? 0 : performance.now() - this.#heldAt);
  }

  /** Why the signal fired: the target's timeout, our own helper being too slow, or the caller aborting; undefined while running. */
  why(): 'timeout' | 'helper' | 'aborted' | undefined {
    const r = this.signal.reason;
    return this.signal.aborted ? (r instanceof DeadlineAbort ? r.why : 'aborted') : undefined;
  }

  /**
   * Stops the target's clock (we are waiting on ourselves). Idempotent. `budgetMs`: how long the
   * hold may last before it aborts with 'helper' (default: what is left of the own-time budget).
   */
  hold(budgetMs?: number): void {
    if (this.#heldAt !== undefined || this.signal.aborted) return;
    this.#heldAt = performance.now();
    this.#stallAtHold = this.#lag.stalledMs();
    clearTimeout(this.#timer);
    this.#timer = this.#arm('helper', budgetMs ?? Math.max(0, this.#ownBudgetMs - this.#heldMs));
  }

  /**
   * Restarts the target's clock where hold() stopped it. Idempotent. `chargeMs` of the hold are the
   * target's after all (the connect a helper's child waited for inside it: connectTo's helper route).
   */
  release(chargeMs = 0): void {
    if (this.#heldAt === undefined) return;
    const held = performance.now() - this.#heldAt;
    const givenBack = held - Math.min(Math.max(0, chargeMs), held);
    this.#heldAt = undefined;
    this.#heldMs += givenBack;
    this.#creditedMs += Math.max(0, this.#lag.stalledMs() - this.#stallAtHold);
    this.endsAt += givenBack;
    if (this.signal.aborted) return;
    clearTimeout(this.#timer);
    this.#timer = this.#arm('timeout', Math.max(0, this.endsAt - performance.now()));
  }

  /** Milliseconds the event loop stalled that the target was not given back (the budget ran out). */
  uncreditedStallMs(): number {
    return Math.max(0, this.#lag.stalledMs() - this.#creditedMs);
  }

  /** Stops the timer and detaches from the parent signal; call once the probe is over. */
  dispose(): void {
    clearTimeout(this.#timer);
    this.#parent?.removeEventListener('abort', this.#onParentAbort);
    this.#lag.stop();
  }

  #arm(why: 'timeout' | 'helper', ms: number): NodeJS.Timeout {
    return setTimeout(() => (why === 'timeout' ? this.#onTimeout() : this.#controller.abort(new DeadlineAbort(why))), ms);
  }

  /** The target's time is up, unless the loop stalled meanwhile: that time is given back first. */
  #onTimeout(): void {
    const credit = Math.min(this.uncreditedStallMs(), Math.max(0, this.#ownBudgetMs - this.#heldMs - this.#givenBackMs));
    if (credit > 0) {
      this.#creditedMs += credit;
      this.#givenBackMs += credit;
      this.endsAt += credit;
      const left = this.endsAt - performance.now();
      // An answer that arrived meanwhile is read before the re-armed timer fires (poll phase first).
      if (left > 0) {
        this.#timer = this.#arm('timeout', left);
        return;
      }
    }
    this.#controller.abort(new DeadlineAbort('timeout'));
  }
}

/** The abort reason a Deadline uses, so listeners can tell a timeout from a slow helper or a caller abort. */
export class DeadlineAbort extends Error {
  readonly why: 'timeout' | 'helper' | 'aborted';
  constructor(why: 'timeout' | 'helper' | 'aborted') {
    super(why === 'timeout' ? 'probe deadline exceeded' : why === 'helper' ? 'netns helper too slow' : 'probe aborted');
    this.why = why;
  }
}

/** What a prober returns; run.ts adds the total duration. */
export interface ProberResult {
  result: ProbeResult;
  message: string;
  reason?: FailureReason;
  /** host:port that answered or was tried last. */
  address?: string;
  phases: Omit<ProbePhases, 'total'>;
}

/** An address to connect to. */
export interface ConnectAddress {
  ip: string;
  port: number;
}

/** Where sockets come from for this connection. */
export interface ConnectVia {
  sockets: SocketFactory;
  netns: string | undefined;
  /** Whose connect it is, for the factory's per-tenant shares. */
  tenant?: Tenant;
}

/** A connected socket and how long getting it took. */
export interface Connected {
  socket: Socket;
  address: ConnectAddress;
  /** Seconds the winning attempt waited for its socket from the factory (helper round trip). */
  helperSeconds: number;
  /** Seconds from the first attempt's socket being ready until the winner connected (includes staggering). */
  connectSeconds: number;
}

/**
 * connectAndSend's answer: the connection (none when the factory's exchange saw the peer end it),
 * and what the factory's exchange did, when it took the octets.
 */
export type ConnectedWith = Omit<Connected, 'socket'> & ({ socket: Socket; exchange?: ConnectExchange } | { socket: undefined; exchange: ConnectExchange });

/**
 * Why a connection could not be made. `kind` 'failure' is the target's fault (kubelet: Failure);
 * 'error' means we could not even try (netns or helper trouble).
 */
export class ConnectError extends Error {
  readonly kind: 'failure' | 'error';
  readonly reason: FailureReason;
  readonly address: ConnectAddress;
  /** Go's text for the dial error, e.g. "dial tcp 10.0.0.1:80: connect: connection refused". */
  readonly dialText: string;
  /** The underlying error's text without the "dial tcp addr:" prefix. */
  readonly detail: string;
  constructor(kind: 'failure' | 'error', reason: FailureReason, address: ConnectAddress, detail: string) {
    const dialText = kind === 'failure' ? `dial tcp ${joinHostPort(address.ip, address.port)}: ${detail}` : detail;
    super(dialText);
    this.kind = kind;
    this.reason = reason;
    this.address = address;
    this.detail = detail;
    this.dialText = dialText;
  }
}

/** Go's syscall texts for the errnos a connect can end with. */
const ERRNO_TEXT: Record<string, [FailureReason, string]> = {
  ECONNREFUSED: ['refused', 'connect: connection refused'],
  ECONNRESET: ['reset', 'connect: connection reset by peer'],
  ETIMEDOUT: ['timeout', 'connect: connection timed out'],
  EHOSTUNREACH: ['unreachable', 'connect: no route to host'],
  ENETUNREACH: ['unreachable', 'connect: network is unreachable'],
  EHOSTDOWN: ['unreachable', 'connect: host is down'],
  EADDRNOTAVAIL: ['unreachable', 'connect: cannot assign requested address'],
  EPERM: ['unreachable', 'connect: operation not permitted'],
  EACCES: ['unreachable', 'connect: permission denied'],
};

/** Maps anything a socket factory or connect can throw onto a ConnectError. */
export function toConnectError(err: unknown, address: ConnectAddress): ConnectError {
  if (err instanceof ConnectError) return err;
  if (err instanceof NetnsError) return new ConnectError('error', err.kind === 'gone' ? 'netns-gone' : 'netns-denied', address, err.message);
  if (err instanceof HelperError) return new ConnectError('error', 'helper-error', address, err.message);
  const code = (err as NodeJS.ErrnoException | undefined)?.code;
  const known = code ? ERRNO_TEXT[code] : undefined;
  if (known) return new ConnectError('failure', known[0], address, known[1]);
  return new ConnectError('failure', 'other', address, `connect: ${describeError(err)}`);
}

function ignoreError(): void {}

/** Go's text for a dial cut by the deadline. */
function timeoutError(address: ConnectAddress): ConnectError {
  return new ConnectError('failure', 'timeout', address, 'i/o timeout');
}

/** The deadline passed while the socket factory still had not delivered a socket. */
function helperTimeoutError(address: ConnectAddress, deadline: Deadline): ConnectError {
  return new ConnectError('error', 'helper-error', address, `netns helper did not hand over a socket within ${deadline.timeoutMs} ms (not counted against the probe's timeout)`);
}

/**
 * Why a losing or cancelled attempt's own signal fires. One shared reason: abort() without one
 * builds a DOMException (a stack trace) per attempt, and the reason reaches only code that
 * ignores it (a settled connectTo).
 */
const ATTEMPT_CANCELLED = new Error('connection attempt cancelled');

interface Attempt {
  address: ConnectAddress;
  /** Only with several addresses: a lone attempt is cancelled by the deadline's signal. */
  abort: AbortController | undefined;
  socket?: Socket;
  error?: ConnectError;
  helperSeconds: number;
  readyAt?: number;
}

/**
 * Connects to the first address that answers. One address: a plain connect. Several: RFC 8305
 * staggering (next attempt after ATTEMPT_DELAY_MS or as soon as the previous one fails), first to
 * connect wins and every other socket is destroyed. Rejects with ConnectError; never leaks a socket.
 * Where the socket factory connects by itself (the resident helper's connectSocket), it does, and
 * the connection arrives made; otherwise Node connects a socket the factory made.
 */
export async function connectTo(addresses: readonly ConnectAddress[], via: ConnectVia, deadline: Deadline): Promise<Connected> {
  const connect = via.sockets.connectSocket;
  const made = connect && helperRoute(addresses, via, connect) ? await connectInFactory(addresses, via, deadline, connect) : undefined;
  return made ?? connectSocket(addresses, via, deadline);
}

/**
 * The longest budget a request may have for the helper to wait on its answer. A longer wait (a
 * hook's, up to the grace period) keeps the plain route: a helper process would be held all that
 * time.
 */
export const EXCHANGE_MAX_WAIT_MS = 10_000;

/**
 * connectTo, where the factory that connects also writes `send` and reads the answer's first
 * octets in the same trip (the helper's exchange: no wake-up of ours for the write or the first
 * read), when the deadline is within EXCHANGE_MAX_WAIT_MS. The caller writes whatever was not sent
 * (`exchange.sent`; all of it on Node's route) and reads the answer from `exchange.data` on.
 */
export async function connectAndSend(addresses: readonly ConnectAddress[], via: ConnectVia, deadline: Deadline, send: Buffer): Promise<ConnectedWith> {
  const exchange = deadline.remainingMs() <= EXCHANGE_MAX_WAIT_MS ? via.sockets.connectExchange : undefined;
  const made = helperRoute(addresses, via, exchange)
    ? await connectInFactory(addresses, via, deadline, (netns, target, signal, tenant) => exchange!.call(via.sockets, netns, target, send, signal, tenant))
    : undefined;
  return made ?? connectTo(addresses, via, deadline);
}

/**
 * Whether the factory can connect these addresses itself: one or two (a dual-stack pod; more, from
 * a resolved legacy host name, stay in Node), one port, inside a netns, and no scoped IPv6 literal
 * (fe80::1%eth0 needs Node's zone handling).
 */
function helperRoute(addresses: readonly ConnectAddress[], via: ConnectVia, connect: unknown): boolean {
  const [a, b] = addresses;
  return connect !== undefined && via.netns !== undefined && a !== undefined && addresses.length <= 2
    && (b === undefined || b.port === a.port) && addresses.every((x) => !x.ip.includes('%'));
}

/** A target for the helper's connect (or TCP probe) of one or two addresses, with `timeoutMs` from its socket's creation. */
export function helperTarget(addresses: readonly ConnectAddress[], timeoutMs: number): TcpTarget {
  const [a, b] = addresses as [ConnectAddress, ConnectAddress | undefined];
  const second = b === undefined ? undefined : { family: isIPv6(b.ip) ? 6 as const : 4 as const, ip: b.ip, staggerMs: ATTEMPT_DELAY_MS };
  return { family: isIPv6(a.ip) ? 6 : 4, ip: a.ip, port: a.port, timeoutMs, second };
}

/** The ConnectError a connect that did not connect in the helper stands for (the first address's, as connectTo reports). */
export function helperOutcomeError(outcome: Exclude<TcpProbeOutcome, { outcome: 'connected' }>, address: ConnectAddress): ConnectError {
  return outcome.outcome === 'timeout' ? timeoutError(address) : toConnectError(Object.assign(new Error(outcome.code), { code: outcome.code }), address);
}

/**
 * The connect done by the socket factory inside the netns (Happy Eyeballs there too), the winning
 * connection handed over; undefined when the factory will not take it now. The helper's own time
 * is held out of the target's budget as on the socket route, and the connect it waited for is
 * charged back to the target.
 */
async function connectInFactory<O extends TcpExchangeOutcome>(
  addresses: readonly ConnectAddress[],
  via: ConnectVia,
  deadline: Deadline,
  connect: (netns: string, target: TcpTarget, signal: AbortSignal, tenant: Tenant | undefined) => Promise<O | undefined>,
): Promise<(ConnectedOf<O>) | undefined> {
  if (deadline.signal.aborted) return undefined;
  const first = addresses[0] as ConnectAddress;
  const { childTimeoutMs, giveUpMs } = helperTcpTimes(deadline.remainingMs());
  let outcome: O | undefined;
  // The hold lasts while the child makes its socket, connects and exchanges; only our trouble or the caller ends it early.
  deadline.hold(giveUpMs);
  try {
    outcome = await connect.call(via.sockets, via.netns as string, helperTarget(addresses, childTimeoutMs), deadline.signal, via.tenant);
  } catch (err) {
    deadline.release();
    const why = deadline.why();
    if (why === 'helper') throw helperTimeoutError(first, deadline);
    if (why === 'aborted') throw new ConnectError('error', 'other', first, 'probe aborted');
    throw toConnectError(err, first);
  }
  // The connect and the exchange were the target's time.
  const exchange = outcome?.outcome === 'connected' ? outcome.exchange : undefined;
  deadline.release(((outcome?.connectSeconds ?? 0) + (exchange?.seconds ?? 0)) * 1000);
  if (!outcome) return undefined;
  if (outcome.outcome !== 'connected') throw helperOutcomeError(outcome, first);
  // A socket error before the caller attaches its own listener must not crash the agent.
  outcome.socket?.on('error', ignoreError);
  const { socket } = outcome;
  const address = outcome.won === 1 ? (addresses[1] ?? first) : first;
  return { socket, address, helperSeconds: outcome.helperSeconds, connectSeconds: outcome.connectSeconds, ...(exchange ? { exchange } : {}) } as ConnectedOf<O>;
}

/** What connectInFactory makes of a factory's outcome type: Connected, or ConnectedWith for an exchange. */
type ConnectedOf<O> = [O] extends [TcpConnectOutcome] ? Connected : ConnectedWith;

/** connectTo over a socket from the factory, connected by Node. */
function connectSocket(addresses: readonly ConnectAddress[], via: ConnectVia, deadline: Deadline): Promise<Connected> {
  return new Promise<Connected>((resolve, reject) => {
    const first = addresses[0];
    if (!first) {
      reject(new ConnectError('error', 'other', { ip: '', port: 0 }, 'no address to connect to'));
      return;
    }
    const attempts: Attempt[] = [];
    let settled = false;
    let staggerTimer: NodeJS.Timeout | undefined;
    const startedAt = performance.now();

    const finish = (winner: Attempt | undefined, err?: ConnectError): void => {
      if (settled) return;
      settled = true;
      deadline.release();
      clearTimeout(staggerTimer);
      deadline.signal.removeEventListener('abort', onDeadline);
      for (const a of attempts) {
        if (a === winner) continue;
        a.abort?.abort(ATTEMPT_CANCELLED);
        a.socket?.destroy();
      }
      if (winner?.socket) {
        winner.socket.removeAllListeners('error');
        winner.socket.removeAllListeners('connect');
        // A socket error between here and the caller attaching its own listener must not crash the agent.
        winner.socket.on('error', ignoreError);
        const readyAt = attempts[0]?.readyAt ?? startedAt;
        resolve({
          socket: winner.socket,
          address: winner.address,
          helperSeconds: winner.helperSeconds,
          connectSeconds: Math.max(0, performance.now() - readyAt) / 1000,
        });
      } else {
        reject(err ?? timeoutError(first));
      }
    };

    const onDeadline = (): void => {
      // The primary address is the one kubelet would have dialled: report it unless it already failed differently.
      const primary = attempts[0];
      const why = deadline.why();
      if (why === 'aborted') finish(undefined, new ConnectError('error', 'other', first, 'probe aborted'));
      else if (why === 'helper') finish(undefined, helperTimeoutError(first, deadline));
      else if (primary?.error) finish(undefined, primary.error);
      // Not one socket arrived: the time went to our helper, not to the target. A failure here would
      // count toward failureThreshold and could restart a healthy container over our own trouble.
      else if (attempts.length > 0 && attempts.every((a) => a.readyAt === undefined)) finish(undefined, helperTimeoutError(first, deadline));
      else finish(undefined, timeoutError(first));
    };

    const startNext = (): void => {
      if (settled) return;
      clearTimeout(staggerTimer);
      const address = addresses[attempts.length];
      if (!address) {
        if (attempts.every((a) => a.error)) finish(undefined, attempts[0]?.error);
        return;
      }
      const attempt: Attempt = { address, abort: addresses.length === 1 ? undefined : new AbortController(), helperSeconds: 0 };
      attempts.push(attempt);
      if (attempts.length < addresses.length) staggerTimer = setTimeout(startNext, ATTEMPT_DELAY_MS);
      void runAttempt(attempt);
    };

    const failAttempt = (attempt: Attempt, err: unknown): void => {
      if (attempt.error || settled) return;
      attempt.error = toConnectError(err, attempt.address);
      attempt.socket?.destroy();
      // An 'error' result (netns/helper trouble) is about us, not the address: no point trying the others.
      if (attempt.error.kind === 'error') finish(undefined, attempt.error);
      else if (attempts.length < addresses.length) startNext();
      else if (attempts.every((a) => a.error)) finish(undefined, attempts[0]?.error);
    };

    const runAttempt = async (attempt: Attempt): Promise<void> => {
      const t0 = performance.now();
      let socket: Socket;
      try {
        // A lone attempt is only ever cancelled by the deadline. With several, the attempt's own
        // signal is enough: the deadline ends in finish(), which aborts every attempt but the
        // winner. (AbortSignal.any over both cost more than the rest of the attempt's bookkeeping.)
        const signal = attempt.abort?.signal ?? deadline.signal;
        socket = await via.sockets.createSocket(via.netns, isIPv6(attempt.address.ip) ? 6 : 4, signal);
      } catch (err) {
        if (!settled && !deadline.signal.aborted) failAttempt(attempt, err);
        return;
      }
      attempt.helperSeconds = (performance.now() - t0) / 1000;
      attempt.readyAt = performance.now();
      // A socket exists: from here on the time is the target's.
      deadline.release();
      if (settled) {
        socket.destroy();
        return;
      }
      attempt.socket = socket;
      socket.once('error', (err) => failAttempt(attempt, err));
      socket.once('connect', () => {
        if (attempt.error) return;
        finish(attempt);
      });
      try {
        // Go sets TCP_NODELAY on every TCP conn; it keeps a one-segment request from waiting on Nagle.
        socket.setNoDelay(true);
        socket.connect({ host: attempt.address.ip, port: attempt.address.port });
      } catch (err) {
        failAttempt(attempt, err);
      }
    };

    if (deadline.signal.aborted) {
      onDeadline();
      return;
    }
    deadline.signal.addEventListener('abort', onDeadline, { once: true });
    // Until a socket arrives, the time is ours (helper fork/setns), not the target's.
    deadline.hold();
    startNext();
  });
}
