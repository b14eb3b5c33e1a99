/**
 * The slow path, kept for comparison (--direct-spawn, the benchmark): Node spawns the helper
 * once per socket (`--once`). Each spawn is a fork of the whole agent on the event loop's
 * thread, so its cost grows with the agent's memory; the resident helper avoids that.
 */
import { spawn } from 'node:child_process';
import type { Socket } from 'node:net';
import { performance } from 'node:perf_hooks';
import { HelperError, describeError } from '../errors.ts';
import { type Logger, silentLogger } from '../log.ts';
import type { SocketFactory } from '../probe/types.ts';
import {
  StderrTail, abortError, boundedInt, checkHelperBinary, checkRequest, discardHandle, isHelperReply, ownNetnsPath,
  replyToError, resolveHelperPath, socketFromHandle,
} from './helper-protocol.ts';
import { checkedNetnsIdentity } from './netns-path.ts';
import { DEFAULT_NETNS_DIRS, DEFAULT_PROC_ROOT, allowedNetnsDirs, normaliseProcRoot } from './path-guard.ts';

/** How to run the per-socket helper. */
export interface SpawnHelperOptions {
  /** Helper binary; default $PROBE_AGENT_HELPER or netns-helper/build/probe-agent-netns-helper. */
  helperPath?: string;
  /** Extra directories whose entries may name a netns. */
  allowDirs?: string[];
  /** Where the host's procfs is mounted (default /proc): see ResidentHelperOptions.procRoot. */
  procRoot?: string;
  log?: Logger;
  /** Upper bound of one spawn, whatever the caller's signal says. Default 5000 ms. */
  timeoutMs?: number;
  /** Called once per settled request: ok = a socket was delivered. Caller aborts are not reported. */
  onRequest?: (durationSeconds: number, ok: boolean) => void;
}

/** SocketFactory that spawns `probe-agent-netns-helper --once` for every socket (mode 'spawn'). */
export class SpawnHelper implements SocketFactory {
  readonly mode = 'spawn';
  readonly helperPath: string;
  readonly #allowDirs: string[];
  readonly procRoot: string;
  readonly #allowArgs: string[] = [];
  readonly #log: Logger;
  readonly #timeoutMs: number;
  readonly #onRequest?: (durationSeconds: number, ok: boolean) => void;

  constructor(opts: SpawnHelperOptions = {}) {
    this.helperPath = resolveHelperPath(opts.helperPath);
    this.#allowDirs = allowedNetnsDirs(opts.allowDirs ?? []);
    for (const d of this.#allowDirs.filter((x) => !DEFAULT_NETNS_DIRS.includes(x))) this.#allowArgs.push('--allow-dir', d);
    this.procRoot = normaliseProcRoot(opts.procRoot ?? DEFAULT_PROC_ROOT, this.#allowDirs);
    if (this.procRoot !== DEFAULT_PROC_ROOT) this.#allowArgs.push('--proc-root', this.procRoot);
    this.#log = (opts.log ?? silentLogger).child({ component: 'netns-helper', mode: 'spawn' });
    this.#timeoutMs = boundedInt(opts.timeoutMs ?? 5000, 10, 60_000, 'timeoutMs');
    this.#onRequest = opts.onRequest;
  }

  /** A SpawnHelper whose binary and proc root were checked up front (the constructor defers that to the first spawn). */
  static async create(opts: SpawnHelperOptions = {}): Promise<SpawnHelper> {
    const helper = new SpawnHelper(opts);
    await checkHelperBinary(helper.helperPath);
    await ownNetnsPath(helper.procRoot);
    return helper;
  }

  /** An unconnected TCP socket made inside `netns` by a fresh helper process. */
  createSocket(netns: string | undefined, family: 4 | 6, signal?: AbortSignal): Promise<Socket> {
    let path: string;
    try {
      path = checkRequest(netns, family, this.#allowDirs, this.procRoot);
      if (signal?.aborted) throw abortError(signal);
    } catch (err) {
      return Promise.reject(err);
    }
    const startedAt = performance.now();
    return new Promise<Socket>((resolve, reject) => {
      let settled = false;
      const stderr = new StderrTail((line) => this.#log.debug('netns helper stderr', { line }));
      const identity = checkedNetnsIdentity(path);
      const expect = identity ? ['--dev', String(identity.dev), '--ino', String(identity.ino)] : [];
      const child = spawn(this.helperPath, ['--once', '--netns', path, '--family', String(family), ...expect, ...this.#allowArgs], {
        stdio: ['ignore', 'ignore', 'pipe', 'ipc'],
        serialization: 'json',
        env: {},
      });
      const settle = (err: Error | undefined, socket?: Socket, aborted = false): void => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
        if (!aborted) {
          try {
            this.#onRequest?.((performance.now() - startedAt) / 1000, err === undefined);
          } catch (cbErr) {
            this.#log.warn('netns helper metrics callback failed', { err: describeError(cbErr) });
          }
        }
        if (err) {
          if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
          reject(err);
        } else {
          resolve(socket as Socket);
        }
      };
      const onAbort = (): void => settle(abortError(signal as AbortSignal), undefined, true);
      const timer = setTimeout(
        () => settle(new HelperError(`netns helper did not answer within ${this.#timeoutMs} ms`, { netns: path })),
        this.#timeoutMs,
      );
      signal?.addEventListener('abort', onAbort, { once: true });
      child.stderr?.on('data', (chunk: Buffer) => stderr.push(chunk));
      child.on('message', (msg: unknown, handle: unknown) => {
        if (settled || !isHelperReply(msg)) return discardHandle(handle);
        if (!msg.ok) return settle(replyToError(path, family, msg));
        if (!handle) return settle(new HelperError('netns helper answered without a socket', { netns: path }));
        settle(undefined, socketFromHandle(handle));
      });
      child.on('error', (err) => {
        settle(new HelperError(`cannot run the netns helper "${this.helperPath}": ${describeError(err)}`, { netns: path }, { cause: err }));
      });
      // 'close', not 'exit': 'exit' can come before the helper's message has been delivered.
      child.on('close', (code, sig) => {
        const said = stderr.text();
        settle(new HelperError(
          `netns helper exited (${sig ? `signal ${sig}` : `code ${code}`}) without answering${said ? `: ${said}` : ''}`,
          { netns: path },
        ));
      });
    });
  }
}
