/**
 * What the resident (helper.ts) and per-probe (spawn-helper.ts) clients share: where the helper
 * binary is, how its replies look, how they become typed errors, and how a passed fd becomes a
 * net.Socket that still lives in the netns it was made in.
 */
import { constants as fsConstants } from 'node:fs';
import { access, readlink, statfs } from 'node:fs/promises';
import net from 'node:net';
import { fileURLToPath } from 'node:url';
import { ConfigError, HelperError, NetnsError } from '../errors.ts';
import { DEFAULT_PROC_ROOT, checkNetnsPath } from './path-guard.ts';

/** Environment variable that overrides the helper binary's location. */
export const HELPER_PATH_ENV = 'PROBE_AGENT_HELPER';

/** The helper binary: the option, else $PROBE_AGENT_HELPER, else the package's own build. */
export function resolveHelperPath(explicit?: string): string {
  if (explicit) return explicit;
  const fromEnv = process.env[HELPER_PATH_ENV];
  if (fromEnv) return fromEnv;
  // agent/netns/ and dist/netns/ are both two levels below the package root.
  return fileURLToPath(new URL('../../netns-helper/build/probe-agent-netns-helper', import.meta.url));
}

/** Rejects with a HelperError that says how to fix it when the binary is missing or not executable. */
export async function checkHelperBinary(path: string): Promise<void> {
  try {
    await access(path, fsConstants.X_OK);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code ?? 'EUNKNOWN';
    throw new HelperError(
      `netns helper binary "${path}" is not usable (${code}): build it with 'make helper' or set ${HELPER_PATH_ENV}`,
      { path, code },
      { cause: err },
    );
  }
}

const PROC_SUPER_MAGIC = 0x9fa0;

/**
 * The agent's own netns as the helper must name it, <procRoot>/<pid>/ns/net, for self-tests.
 * Under a host procfs mounted elsewhere the agent has another pid there; that procfs's "self"
 * link tells which. Rejects with ConfigError when `procRoot` is not a procfs mount.
 */
export async function ownNetnsPath(procRoot: string): Promise<string> {
  let pid: string;
  try {
    const fs = await statfs(procRoot);
    // The helper refuses such a root too; saying so here beats a helper that dies on every restart.
    if (fs.type !== PROC_SUPER_MAGIC) throw new ConfigError(`proc root "${procRoot}" is not a procfs mount`, { procRoot });
    pid = procRoot === DEFAULT_PROC_ROOT ? String(process.pid) : await readlink(`${procRoot}/self`);
  } catch (err) {
    if (err instanceof ConfigError) throw err;
    throw new ConfigError(`proc root "${procRoot}" is not usable: ${(err as Error).message}`, { procRoot });
  }
  if (!/^[1-9][0-9]{0,9}$/.test(pid)) {
    throw new ConfigError(`proc root "${procRoot}": its self link says "${pid.slice(0, 40)}", not a pid`, { procRoot });
  }
  return `${procRoot}/${pid}/ns/net`;
}

/** The helper's answer to one request (the `msg` part of a NODE_HANDLE, or a plain line). */
export type HelperReply =
  | { id: number; ok: true }
  | { id: number; ok: false; stage: string; errno: number; code?: string; error: string };

/** Type guard for a message from the helper. */
export function isHelperReply(msg: unknown): msg is HelperReply {
  if (typeof msg !== 'object' || msg === null) return false;
  const m = msg as Record<string, unknown>;
  if (typeof m.id !== 'number' || !Number.isSafeInteger(m.id)) return false;
  if (m.ok === true) return true;
  return m.ok === false && typeof m.stage === 'string' && typeof m.errno === 'number' && typeof m.error === 'string';
}

/** Maps a failed reply to NetnsError (gone, denied, invalid, enter) or HelperError, with a readable message. */
export function replyToError(netns: string, family: 4 | 6, reply: Extract<HelperReply, { ok: false }>): Error {
  const code = reply.code ?? `errno ${reply.errno}`;
  const ctx = { netns, family, stage: reply.stage, errno: reply.errno, code };
  const gone = code === 'ENOENT' || code === 'ENOTDIR' || code === 'ESRCH';
  const denied = code === 'EPERM' || code === 'EACCES';
  switch (reply.stage) {
    case 'nstype':
      // A path checked as a namespace earlier that is a plain file now: its sandbox unmounted it.
      if (code === 'ENOTTY') return new NetnsError('gone', `netns "${netns}" is no longer a mounted namespace`, ctx);
      return new NetnsError('invalid', `netns "${netns}" refused: ${reply.error}`, ctx);
    case 'validate':
      return new NetnsError('invalid', `netns "${netns}" refused: ${reply.error}`, ctx);
    case 'identity':
      // Its pid was reused or its file re-mounted since the resolver checked it: resolve again.
      return new NetnsError('gone', `netns "${netns}" was replaced since it was checked: ${reply.error}`, { ...ctx, replaced: true });
    case 'open':
      if (gone) return new NetnsError('gone', `netns "${netns}" is gone (${code})`, ctx);
      if (denied) return new NetnsError('denied', `netns "${netns}" cannot be opened: permission denied (${code})`, ctx);
      if (code === 'ELOOP' || code === 'ENAMETOOLONG') {
        return new NetnsError('invalid', `netns "${netns}" refused: ${reply.error}`, ctx);
      }
      return new HelperError(`netns "${netns}" cannot be opened: ${reply.error}`, ctx);
    case 'setns':
      if (denied) {
        return new NetnsError('denied', `cannot enter netns "${netns}": permission denied (${code}; needs CAP_SYS_ADMIN)`, ctx);
      }
      return new NetnsError('enter', `cannot enter netns "${netns}": ${reply.error}`, ctx);
    case 'socket':
      return new HelperError(`cannot make an IPv${family} TCP socket in netns "${netns}": ${reply.error}`, ctx);
    case 'busy':
      return new HelperError(`netns helper is overloaded: ${reply.error}`, ctx);
    default:
      return new HelperError(`netns helper failed for "${netns}" (${reply.stage}): ${reply.error}`, ctx);
  }
}

/** Checks a request before it costs a process; throws NetnsError('invalid') or HelperError. */
export function checkRequest(netns: string | undefined, family: number, allowDirs: readonly string[], procRoot = DEFAULT_PROC_ROOT): string {
  if (netns === undefined || netns === '') {
    throw new NetnsError('invalid', 'no netns path given: this socket factory only makes sockets inside a netns', {});
  }
  if (family !== 4 && family !== 6) {
    throw new HelperError(`socket family must be 4 or 6, not ${String(family)}`, { netns, family });
  }
  const verdict = checkNetnsPath(netns, allowDirs, procRoot);
  if (!verdict.ok) throw new NetnsError('invalid', `netns "${netns}" refused: ${verdict.reason}`, { netns, family });
  return netns;
}

/** The error an aborted signal stands for: its reason, as fetch() and timers do. */
export function abortError(signal: AbortSignal): Error {
  const reason: unknown = signal.reason;
  return reason instanceof Error ? reason : new Error(`aborted: ${String(reason)}`);
}

/** A raw TCP handle from Node's IPC ('net.Native'), minimally typed. */
interface RawHandle {
  close(cb?: () => void): void;
}

/**
 * Wraps a passed, unconnected TCP handle as a net.Socket. `manualStart` keeps Node from reading
 * an unconnected socket; connect() then reuses the handle, so the socket keeps its netns.
 * (`handle` and `manualStart` are constructor options Node's own child_process uses; not in @types/node.)
 */
export function socketFromHandle(handle: unknown): net.Socket {
  return new net.Socket({ handle, manualStart: true } as net.SocketConstructorOpts);
}

/** Wraps a passed, connected TCP handle (op "connect") as a net.Socket that reads at once. */
export function connectedSocketFromHandle(handle: unknown): net.Socket {
  return new net.Socket({ handle, readable: true, writable: true } as net.SocketConstructorOpts);
}

/** Releases a handle nobody will use (a late answer), so its fd does not leak. */
export function discardHandle(handle: unknown): void {
  if (handle && typeof (handle as RawHandle).close === 'function') (handle as RawHandle).close();
}

// Numeric option checks are shared by every module; re-exported for the helper clients.
export { boundedInt } from '../config/bounds.ts';

/** Keeps the last few stderr lines of a helper, bounded, for error messages and logs. */
export class StderrTail {
  readonly #lines: string[] = [];
  #partial = '';
  readonly #onLine: (line: string) => void;

  constructor(onLine: (line: string) => void = () => {}) {
    this.#onLine = onLine;
  }

  /** Feeds a chunk of stderr output. */
  push(chunk: Buffer | string): void {
    const parts = (this.#partial + chunk.toString()).split('\n');
    this.#partial = (parts.pop() ?? '').slice(0, 1000);
    for (const raw of parts) {
      const line = raw.slice(0, 1000);
      if (!line) continue;
      this.#lines.push(line);
      if (this.#lines.length > 5) this.#lines.shift();
      this.#onLine(line);
    }
  }

  /** The last lines joined for a message, or '' when the helper said nothing. */
  text(): string {
    const all = this.#partial ? [...this.#lines, this.#partial] : this.#lines;
    return all.join(' | ');
  }
}
