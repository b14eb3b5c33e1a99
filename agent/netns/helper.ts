/**
 * The resident netns helper client: one long-lived helper process (started once, restarted
 * with capped backoff when it dies) that starts a tiny child per socket (a clone sharing the
 * helper's small memory, see netns-helper/README.md); each socket arrives as a handle on Node's
 * IPC channel. No fork from Node per probe, so the event loop never pays the agent's page-table
 * copy. See netns-helper/resident.c for the other side.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import type { Socket } from 'node:net';
import { performance } from 'node:perf_hooks';
import { HelperError, describeError } from '../errors.ts';
import { type Logger, silentLogger } from '../log.ts';
import type { SocketFactory } from '../probe/types.ts';
import {
  StderrTail, abortError, boundedInt, checkHelperBinary, checkRequest, discardHandle, isHelperReply, ownNetnsPath,
  replyToError, resolveHelperPath, socketFromHandle,
} from './helper-protocol.ts';
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
  /** Upper bound of one request, whatever the caller's signal says. Default 5000 ms. */
  requestTimeoutMs?: number;
  /** The WarmNetnsHelper gate: the helper makes sockets itself (setns there and back), no fork. */
  warm?: boolean;
  /** Restart delay after the helper dies: doubles from `initial` up to `max` (ms). */
  restartBackoffMs?: { initial: number; max: number };
  /** Called each time a dead helper is restarted (for probe_agent_* metrics). */
  onRestart?: (reason: string) => void;
  /** Called once per settled request: ok = a socket was delivered. Caller aborts are not reported. */
  onRequest?: (durationSeconds: number, ok: boolean) => void;
}

/** Counters for metrics and tests. */
export interface ResidentHelperStats {
  /** Current helper pid, when one runs. */
  pid?: number;
  /** Requests handed to a helper (each one child process in resident mode). */
  spawned: number;
  /** Times a dead helper was started again. */
  restarts: number;
  /** Requests not settled yet. */
  inFlight: number;
  /** Requests that ended without a socket (errors of any kind, caller aborts excluded). */
  failures: number;
}

interface Pending {
  id: number;
  netns: string;
  family: 4 | 6;
  startedAt: number;
  sent: boolean;
  sentAt: number;
  resolve: (s: Socket) => void;
  reject: (e: Error) => void;
  timer: NodeJS.Timeout;
  signal?: AbortSignal;
  onAbort?: () => void;
}

const SELF_TEST_TIMEOUT_MS = 3000;
const ACCEPTED_PATHS_MAX = 4096;
/** A helper that lived this long is healthy again: the next death restarts it quickly. */
const HEALTHY_AFTER_MS = 30_000;

/** SocketFactory backed by the resident helper (mode 'resident', or 'warm' with the gate on). */
export class ResidentHelper implements SocketFactory {
  readonly mode: 'resident' | 'warm';
  readonly helperPath: string;
  readonly #args: string[];
  readonly #allowDirs: string[];
  readonly procRoot: string;
  /** The agent's own netns as named under procRoot: what the self-test asks for. */
  #ownNetns = '';
  readonly #log: Logger;
  readonly #maxInFlight: number;
  readonly #timeoutMs: number;
  readonly #backoff: { initial: number; max: number };
  readonly #onRestart?: (reason: string) => void;
  readonly #onRequest?: (durationSeconds: number, ok: boolean) => void;
  readonly #pending = new Map<number, Pending>();
  #child?: ChildProcess;
  #childReady = false;
  #childUpAt = 0;
  #nextDelay: number;
  #restartTimer?: NodeJS.Timeout;
  #silenceTimer?: NodeJS.Timeout;
  #downReason = 'not started';
  #nextId = 1;
  #lastMessageAt = 0;
  #closed = false;
  /** Netns paths the path guard accepted: the guard is pure, so a repeat (every probe of a pod) skips it. */
  readonly #acceptedPaths = new Set<string>();
  #stats = { spawned: 0, restarts: 0, failures: 0 };

  private constructor(opts: ResidentHelperOptions) {
    this.helperPath = resolveHelperPath(opts.helperPath);
    this.#allowDirs = allowedNetnsDirs(opts.allowDirs ?? []);
    this.mode = opts.warm ? 'warm' : 'resident';
    this.#args = ['--resident', ...(opts.warm ? ['--warm'] : [])];
    for (const d of this.#allowDirs.filter((x) => !DEFAULT_NETNS_DIRS.includes(x))) this.#args.push('--allow-dir', d);
    this.procRoot = normaliseProcRoot(opts.procRoot ?? DEFAULT_PROC_ROOT, this.#allowDirs);
    if (this.procRoot !== DEFAULT_PROC_ROOT) this.#args.push('--proc-root', this.procRoot);
    this.#log = (opts.log ?? silentLogger).child({ component: 'netns-helper', mode: this.mode });
    this.#maxInFlight = boundedInt(opts.maxInFlight ?? 128, 1, 65_536, 'maxInFlight');
    // The helper's own cap is a safety net above ours: a child that answered may still be exiting.
    this.#args.push('--max-children', String(Math.min(4096, this.#maxInFlight + 64)));
    this.#timeoutMs = boundedInt(opts.requestTimeoutMs ?? 5000, 10, 60_000, 'requestTimeoutMs');
    const backoff = opts.restartBackoffMs ?? { initial: 100, max: 10_000 };
    this.#backoff = {
      initial: boundedInt(backoff.initial, 1, 60_000, 'restartBackoffMs.initial'),
      max: boundedInt(backoff.max, backoff.initial, 600_000, 'restartBackoffMs.max'),
    };
    this.#nextDelay = this.#backoff.initial;
    this.#onRestart = opts.onRestart;
    this.#onRequest = opts.onRequest;
  }

  /** Starts the helper and proves it works by making a socket in the agent's own netns. */
  static async start(opts: ResidentHelperOptions = {}): Promise<ResidentHelper> {
    const helper = new ResidentHelper(opts);
    await checkHelperBinary(helper.helperPath);
    helper.#ownNetns = await ownNetnsPath(helper.procRoot);
    try {
      await helper.#spawn();
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
    helper.#log.info('netns helper started', { pid: helper.#child?.pid, path: helper.helperPath });
    return helper;
  }

  /** Makes a socket in the agent's own netns through the helper; rejects when the helper is unusable. */
  async selfTest(): Promise<void> {
    const socket = await this.createSocket(this.#ownNetns, 4, AbortSignal.timeout(SELF_TEST_TIMEOUT_MS));
    socket.destroy();
  }

  /** Counters for metrics and tests. */
  stats(): ResidentHelperStats {
    return { pid: this.#child?.pid, ...this.#stats, inFlight: this.#pending.size };
  }

  /** An unconnected TCP socket made inside `netns`; the caller must connect or destroy it. */
  createSocket(netns: string | undefined, family: 4 | 6, signal?: AbortSignal): Promise<Socket> {
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
      return Promise.reject(err);
    }
    return new Promise<Socket>((resolve, reject) => {
      const id = this.#nextId++;
      const p: Pending = {
        id, netns: netns as string, family, startedAt: performance.now(), sent: false, sentAt: 0, resolve, reject, signal,
        timer: setTimeout(() => this.#onTimeout(p), this.#timeoutMs),
      };
      if (signal) {
        p.onAbort = () => this.#fail(p, abortError(signal), true);
        signal.addEventListener('abort', p.onAbort, { once: true });
      }
      this.#pending.set(id, p);
      this.#send(p);
    });
  }

  /** Stops the helper (it exits when its channel closes) and rejects whatever is in flight. */
  async close(): Promise<void> {
    this.#closed = true;
    clearTimeout(this.#restartTimer);
    clearTimeout(this.#silenceTimer);
    for (const p of [...this.#pending.values()]) this.#fail(p, new HelperError('netns helper closed', { netns: p.netns }));
    const child = this.#child;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    await new Promise<void>((resolve) => {
      const kill = setTimeout(() => child.kill('SIGKILL'), 2000);
      // 'exit', not 'close': after our own disconnect() Node never emits 'close' (it counts
      // the channel as closed only when it reads EOF from the other side).
      child.once('exit', () => {
        clearTimeout(kill);
        resolve();
      });
      if (child.connected) child.disconnect();
      else child.kill('SIGKILL');
    });
  }

  #spawn(): Promise<void> {
    const stderr = new StderrTail((line) => this.#log.warn('netns helper stderr', { line }));
    const child = spawn(this.helperPath, this.#args, {
      stdio: ['ignore', 'ignore', 'pipe', 'ipc'],
      serialization: 'json',
      env: {},
      // Its own process group: a SIGTERM/SIGINT to the agent's group (a terminal's Ctrl-C, a stop of
      // the whole group) is the agent's to handle; the helper exits when the agent closes its channel.
      detached: true,
    });
    this.#child = child;
    this.#childReady = false;
    child.stderr?.on('data', (chunk: Buffer) => stderr.push(chunk));
    child.on('message', (msg: unknown, handle: unknown) => this.#onMessage(msg, handle));
    return new Promise<void>((resolve, reject) => {
      let started = false;
      child.once('spawn', () => {
        started = true;
        this.#childReady = true;
        this.#childUpAt = performance.now();
        this.#downReason = '';
        for (const p of this.#pending.values()) this.#send(p);
        resolve();
      });
      child.on('error', (err) => {
        if (!started) reject(new HelperError(`cannot start the netns helper "${this.helperPath}": ${describeError(err)}`, {}, { cause: err }));
        else this.#log.warn('netns helper channel error', { err });
      });
      // 'close', not 'exit': only then have all of the helper's messages been delivered.
      child.on('close', (code, signal) => {
        const how = signal ? `signal ${signal}` : `code ${code}`;
        const said = stderr.text();
        this.#onClose(child, `netns helper exited (${how})${said ? `: ${said}` : ''}`);
        if (!started) reject(new HelperError(`cannot start the netns helper "${this.helperPath}": exited (${how})${said ? `: ${said}` : ''}`));
      });
    });
  }

  #onClose(child: ChildProcess, reason: string): void {
    if (this.#child !== child) return;
    this.#child = undefined;
    this.#childReady = false;
    this.#downReason = reason;
    for (const p of [...this.#pending.values()]) {
      if (p.sent) this.#fail(p, new HelperError(`${reason} before answering`, { netns: p.netns, pid: child.pid }));
    }
    if (this.#closed) return;
    if (performance.now() - this.#childUpAt > HEALTHY_AFTER_MS) this.#nextDelay = this.#backoff.initial;
    const delay = this.#nextDelay;
    this.#nextDelay = Math.min(this.#nextDelay * 2, this.#backoff.max);
    this.#log.warn('netns helper died; restarting', { reason, delayMs: delay, waiting: this.#pending.size });
    this.#restartTimer = setTimeout(() => this.#restart(reason), delay);
  }

  #restart(reason: string): void {
    if (this.#closed) return;
    this.#stats.restarts++;
    this.#notify(() => this.#onRestart?.(reason));
    this.#spawn().catch((err: unknown) => {
      this.#log.error('netns helper restart failed', { err: describeError(err) });
    });
  }

  #send(p: Pending): void {
    const child = this.#child;
    if (p.sent || !child || !this.#childReady || !child.connected) return;
    p.sent = true;
    p.sentAt = performance.now();
    this.#stats.spawned++;
    child.send({ id: p.id, netns: p.netns, family: p.family }, (err) => {
      if (err) this.#fail(p, new HelperError(`cannot send a request to the netns helper: ${describeError(err)}`, { netns: p.netns }));
    });
  }

  #onMessage(msg: unknown, handle: unknown): void {
    this.#lastMessageAt = performance.now();
    const p = isHelperReply(msg) ? this.#pending.get(msg.id) : undefined;
    if (!p || !isHelperReply(msg)) {
      // A late answer (timed out, aborted) or noise: its socket must not leak.
      discardHandle(handle);
      if (!isHelperReply(msg)) this.#log.warn('netns helper sent an unexpected message');
      return;
    }
    if (!msg.ok) {
      discardHandle(handle);
      return this.#fail(p, replyToError(p.netns, p.family, msg));
    }
    if (!handle) return this.#fail(p, new HelperError('netns helper answered without a socket', { netns: p.netns }));
    this.#finish(p);
    this.#notify(() => this.#onRequest?.((performance.now() - p.startedAt) / 1000, true));
    p.resolve(socketFromHandle(handle));
  }

  #onTimeout(p: Pending): void {
    const child = this.#child;
    const wasSent = p.sent;
    this.#fail(p, this.#timeoutError(p));
    if (wasSent && child) this.#killIfSilent(child, p.sentAt);
  }

  /**
   * Callers mostly give up first (a probe deadline is shorter than the request timeout), which
   * cancels the request's own timer: keep timing the helper for them, or a helper that went silent
   * would never be noticed and every later probe would fail on it.
   */
  #watchSilence(sentAt: number): void {
    const child = this.#child;
    if (!child || this.#silenceTimer || this.#closed) return;
    this.#silenceTimer = setTimeout(() => {
      this.#silenceTimer = undefined;
      this.#killIfSilent(child, sentAt);
    }, Math.max(0, sentAt + this.#timeoutMs - performance.now()));
    this.#silenceTimer.unref();
  }

  #killIfSilent(child: ChildProcess, sentAt: number): void {
    // After the poll phase, answers already queued on the channel have been read: if the
    // helper still said nothing since `sentAt`, it is stuck; replace it.
    setImmediate(() => {
      if (this.#child !== child || this.#closed || this.#lastMessageAt >= sentAt) return;
      this.#log.error('netns helper stopped answering; killing it', { pid: child.pid, timeoutMs: this.#timeoutMs });
      child.kill('SIGKILL');
    });
  }

  #timeoutError(p: Pending): HelperError {
    const why = p.sent ? 'did not answer' : `is unavailable (${this.#downReason || 'starting'})`;
    return new HelperError(`netns helper ${why} within ${this.#timeoutMs} ms`, { netns: p.netns });
  }

  #fail(p: Pending, err: Error, aborted = false): void {
    if (!this.#finish(p)) return;
    if (aborted && p.sent) this.#watchSilence(p.sentAt);
    if (!aborted) {
      this.#stats.failures++;
      this.#notify(() => this.#onRequest?.((performance.now() - p.startedAt) / 1000, false));
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
    return true;
  }
}
