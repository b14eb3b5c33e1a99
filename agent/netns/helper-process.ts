/**
 * Supervision of the resident netns helper process: starting it with Node's IPC channel, restarting
 * it with capped backoff when it dies, and killing it when it stops answering. Knows nothing of
 * requests: helper.ts keeps the request table and talks through send() and the callbacks.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { performance } from 'node:perf_hooks';
import { HelperError, describeError } from '../errors.ts';
import type { Logger } from '../log.ts';
import { dropHandleAcks, writeLines } from './ipc-channel.ts';
import { StderrTail } from './helper-protocol.ts';

/** What the supervisor reports to its owner. */
export interface HelperProcessEvents {
  /** A helper is up: anything waiting may be sent now. */
  onUp: () => void;
  /** The helper is gone (before a restart is scheduled); `reason` says how it ended. */
  onDown: (reason: string, pid: number | undefined) => void;
  /** One message from the helper, with the handle it carried, if any. */
  onMessage: (msg: unknown, handle: unknown) => void;
  /** Called each time a dead helper is started again. */
  onRestart?: (reason: string) => void;
}

/** How to start and restart the helper. */
export interface HelperProcessOptions {
  path: string;
  args: string[];
  log: Logger;
  /** Restart delay after the helper dies: doubles from `initial` up to `max` (ms). */
  backoff: { initial: number; max: number };
  /** A helper silent this long after a request is killed (and restarted). */
  silenceMs: number;
}

/** A helper that lived this long is healthy again: the next death restarts it quickly. */
const HEALTHY_AFTER_MS = 30_000;

/** One resident helper process at a time, restarted when it dies, until close(). */
export class HelperProcess {
  readonly #opts: HelperProcessOptions;
  readonly #events: HelperProcessEvents;
  #child?: ChildProcess;
  #ready = false;
  #upAt = 0;
  #nextDelay: number;
  #restartTimer?: NodeJS.Timeout;
  #silenceTimer?: NodeJS.Timeout;
  /** When the armed silence check runs. */
  #silenceAt = 0;
  #lastMessageAt = 0;
  #closed = false;
  /** Requests of this turn of the event loop, written together when it ends (ipc-channel.ts). */
  #batch: { child: ChildProcess; lines: string[]; onErrors: ((err: Error) => void)[] } | undefined;
  /** Messages handed to Node's own send that it has not written yet: no write of ours may overtake them. */
  #nodeQueued = 0;
  /** Why no helper is up ('' while one is). */
  downReason = 'not started';
  restarts = 0;

  constructor(opts: HelperProcessOptions, events: HelperProcessEvents) {
    this.#opts = opts;
    this.#events = events;
    this.#nextDelay = opts.backoff.initial;
  }

  /** The running helper's pid. */
  get pid(): number | undefined {
    return this.#child?.pid;
  }

  /** True when a message sent now reaches a running helper. */
  get ready(): boolean {
    return !!this.#child && this.#ready && this.#child.connected;
  }

  /**
   * Sends one request line; `onError` hears when the channel refused it. Lines sent in the same
   * turn of the event loop leave in one write at its end (the check phase: no later than Node's
   * own write would have in practice, and one wake-up of the helper for all of them).
   */
  send(msg: object, onError: (err: Error) => void): void {
    const child = this.#child;
    if (!child) return;
    if (this.#batch === undefined) {
      this.#batch = { child, lines: [], onErrors: [] };
      setImmediate(() => this.#flush());
    }
    this.#batch.lines.push(JSON.stringify(msg));
    this.#batch.onErrors.push(onError);
  }

  #flush(): void {
    const batch = this.#batch;
    this.#batch = undefined;
    if (!batch) return;
    const { child, lines, onErrors } = batch;
    const failAll = (err: Error): void => {
      for (const onError of onErrors) onError(err);
    };
    // Lines meant for a helper that has since gone were failed with it (onDown).
    if (child !== this.#child || !child.connected) return failAll(new HelperError('channel closed'));
    let written: ReturnType<typeof writeLines> = 'not-written';
    if (this.#nodeQueued === 0) {
      try {
        written = writeLines(child, `${lines.join('\n')}\n`);
      } catch (err) {
        // Worded as Node's own send says it ("write EPIPE").
        return failAll(new HelperError(`write ${(err as NodeJS.ErrnoException).code ?? describeError(err)}`));
      }
    }
    if (written === 'written') return;
    if (written === 'torn') {
      // Half a line in the channel: nothing after it would parse. A new helper starts clean.
      this.#opts.log.error('netns helper channel torn by a partial write; killing the helper', { pid: child.pid });
      child.kill('SIGKILL');
      return failAll(new HelperError('the netns helper channel was torn by a partial write'));
    }
    // No room now (or no descriptor): Node's send queues and writes when it can.
    lines.forEach((line, i) => {
      this.#nodeQueued++;
      child.send(JSON.parse(line) as object, (err) => {
        this.#nodeQueued--;
        if (err) onErrors[i]?.(err);
      });
    });
  }

  /** Starts the first helper; rejects when it cannot be started. */
  start(): Promise<void> {
    return this.#spawn();
  }

  /**
   * Callers mostly give up first (a probe deadline is shorter than the request timeout), which
   * cancels a request's own timer: keep timing the helper for them, or a helper that went silent
   * would never be noticed and every later request would fail on it. `waitMs`: how long the
   * request may rightly keep the helper busy before it answers (a connect's or an exchange's
   * timeout), on top of the silence allowed.
   */
  watchSilence(sentAt: number, waitMs = 0): void {
    const child = this.#child;
    const at = sentAt + waitMs + this.#opts.silenceMs;
    // The earliest check wins: a long wait watched first must not hide a short one.
    if (!child || this.#closed || (this.#silenceTimer && this.#silenceAt <= at)) return;
    clearTimeout(this.#silenceTimer);
    this.#silenceAt = at;
    this.#silenceTimer = setTimeout(() => {
      this.#silenceTimer = undefined;
      this.#killIfSilent(child, sentAt);
    }, Math.max(0, at - performance.now()));
    this.#silenceTimer.unref();
  }

  /** A request sent at `sentAt` timed out: replace the helper unless it said anything since. */
  killIfSilent(sentAt: number): void {
    if (this.#child) this.#killIfSilent(this.#child, sentAt);
  }

  /** Stops the helper (it exits when its channel closes). */
  async close(): Promise<void> {
    this.#closed = true;
    clearTimeout(this.#restartTimer);
    clearTimeout(this.#silenceTimer);
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
    const stderr = new StderrTail((line) => this.#opts.log.warn('netns helper stderr', { line }));
    const child = spawn(this.#opts.path, this.#opts.args, {
      stdio: ['ignore', 'ignore', 'pipe', 'ipc'],
      serialization: 'json',
      env: {},
      // Its own process group: a SIGTERM/SIGINT to the agent's group (a terminal's Ctrl-C, a stop of
      // the whole group) is the agent's to handle; the helper exits when the agent closes its channel.
      detached: true,
    });
    // The helper never waits for Node's ACK of a socket it hands over: each would only wake it.
    dropHandleAcks(child);
    this.#child = child;
    this.#nodeQueued = 0;
    this.#ready = false;
    child.stderr?.on('data', (chunk: Buffer) => stderr.push(chunk));
    child.on('message', (msg: unknown, handle: unknown) => {
      this.#lastMessageAt = performance.now();
      this.#events.onMessage(msg, handle);
    });
    return new Promise<void>((resolve, reject) => {
      let started = false;
      child.once('spawn', () => {
        started = true;
        this.#ready = true;
        this.#upAt = performance.now();
        this.downReason = '';
        this.#events.onUp();
        resolve();
      });
      child.on('error', (err) => {
        if (!started) reject(new HelperError(`cannot start the netns helper "${this.#opts.path}": ${describeError(err)}`, {}, { cause: err }));
        else this.#opts.log.warn('netns helper channel error', { err });
      });
      // 'close', not 'exit': only then have all of the helper's messages been delivered.
      child.on('close', (code, signal) => {
        const how = signal ? `signal ${signal}` : `code ${code}`;
        const said = stderr.text();
        this.#onClose(child, `netns helper exited (${how})${said ? `: ${said}` : ''}`);
        if (!started) reject(new HelperError(`cannot start the netns helper "${this.#opts.path}": exited (${how})${said ? `: ${said}` : ''}`));
      });
    });
  }

  #onClose(child: ChildProcess, reason: string): void {
    if (this.#child !== child) return;
    this.#child = undefined;
    this.#ready = false;
    this.downReason = reason;
    this.#events.onDown(reason, child.pid);
    if (this.#closed) return;
    if (performance.now() - this.#upAt > HEALTHY_AFTER_MS) this.#nextDelay = this.#opts.backoff.initial;
    const delay = this.#nextDelay;
    this.#nextDelay = Math.min(this.#nextDelay * 2, this.#opts.backoff.max);
    this.#opts.log.warn('netns helper died; restarting', { reason, delayMs: delay });
    this.#restartTimer = setTimeout(() => this.#restart(reason), delay);
  }

  #restart(reason: string): void {
    if (this.#closed) return;
    this.restarts++;
    try {
      this.#events.onRestart?.(reason);
    } catch (err) {
      this.#opts.log.warn('netns helper restart callback failed', { err: describeError(err) });
    }
    this.#spawn().catch((err: unknown) => {
      this.#opts.log.error('netns helper restart failed', { err: describeError(err) });
    });
  }

  #killIfSilent(child: ChildProcess, sentAt: number): void {
    // After the poll phase, answers already queued on the channel have been read: if the
    // helper still said nothing since `sentAt`, it is stuck; replace it.
    setImmediate(() => {
      if (this.#child !== child || this.#closed || this.#lastMessageAt >= sentAt) return;
      this.#opts.log.error('netns helper stopped answering; killing it', { pid: child.pid, timeoutMs: this.#opts.silenceMs });
      child.kill('SIGKILL');
    });
  }
}
