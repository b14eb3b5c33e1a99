/**
 * The unix socket's file-system side: its directory, a stale socket left by a crashed agent, its
 * mode and group. The socket grants root-equivalent probing power on the node, so it is 0600 (0660
 * with a configured group) and its directory is not searchable by others.
 */
import { createConnection } from 'node:net';
import { chmod, chown, lstat, mkdir, readFile, stat, unlink } from 'node:fs/promises';
import { basename, dirname, isAbsolute } from 'node:path';
import { ConfigError, ProbeAgentError, describeError } from '../errors.ts';

/** sun_path holds 108 bytes including the terminating NUL. */
const MAX_SOCKET_PATH_BYTES = 107;
/** How long to wait for an answer on an existing socket before calling it stale. */
const LIVENESS_TIMEOUT_MS = 1000;

/** Another process is serving on the socket path: starting would steal its clients. */
export class SocketInUseError extends ProbeAgentError {
  constructor(path: string) {
    super('socket-in-use', `another process is serving ${path}; refusing to replace its socket`, { path });
  }
}

/** Resolves a group given as a number or a name (looked up in /etc/group) to a gid. */
export async function resolveGroup(group: string | number, groupFile = '/etc/group'): Promise<number> {
  if (typeof group === 'number' || /^\d+$/.test(group)) {
    const gid = Number(group);
    if (!Number.isSafeInteger(gid) || gid < 0 || gid > 0xfffffffe) throw new ConfigError(`socket group: invalid gid ${group}`);
    return gid;
  }
  let text: string;
  try {
    text = await readFile(groupFile, 'utf8');
  } catch (err) {
    throw new ConfigError(`socket group "${group}": cannot read ${groupFile}: ${describeError(err)}`);
  }
  for (const line of text.split('\n')) {
    const [name, , gid] = line.split(':');
    if (name === group && gid !== undefined && /^\d+$/.test(gid)) return Number(gid);
  }
  throw new ConfigError(`socket group "${group}": no such group in ${groupFile}`);
}

/** Validates the socket path: absolute and short enough for sun_path. */
export function checkSocketPath(path: string): void {
  if (!isAbsolute(path)) throw new ConfigError(`socket path must be absolute, got "${path}"`);
  if (Buffer.byteLength(path) > MAX_SOCKET_PATH_BYTES) {
    throw new ConfigError(`socket path is longer than ${MAX_SOCKET_PATH_BYTES} bytes: "${path}"`);
  }
}

/**
 * Makes the socket's directory (0700, or 0750 owned by `gid`, when it has to be created; an
 * existing directory of its own is tightened to the same, see tightenOwnDirectory) and removes a
 * stale socket: only a socket, and only when nothing answers on it.
 */
export async function prepareSocketPath(path: string, gid?: number): Promise<void> {
  checkSocketPath(path);
  const dir = dirname(path);
  const created = await mkdir(dir, { recursive: true, mode: gid === undefined ? 0o700 : 0o750 });
  if (created !== undefined) {
    // mkdir's mode is filtered by the umask; set it exactly on the directory we own.
    await chmod(dir, gid === undefined ? 0o700 : 0o750);
    if (gid !== undefined) await chown(dir, process.getuid?.() ?? 0, gid);
  } else {
    await tightenOwnDirectory(dir, gid);
  }
  let st;
  try {
    st = await lstat(path);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
    throw err;
  }
  if (!st.isSocket()) throw new ConfigError(`${path} exists and is not a socket; refusing to remove it`, { path });
  if (await answers(path)) throw new SocketInUseError(path);
  await unlink(path).catch((err: NodeJS.ErrnoException) => {
    if (err.code !== 'ENOENT') throw err;
  });
}

/**
 * An existing directory that is the agent's own (its name starts with "probe-agent", as the default
 * /run/probe-agent does, and it is owned by the agent's uid) loses any access beyond 0700 (0750 with
 * a socket group). A hostPath DirectoryOrCreate volume or an older systemd unit creates it 0755;
 * others must not even list it. Directories shared with other software (/run, /tmp, ...) are left
 * alone: the socket's own 0600 protects it there.
 */
export async function tightenOwnDirectory(dir: string, gid?: number): Promise<void> {
  if (!basename(dir).startsWith('probe-agent')) return;
  const st = await lstat(dir);
  if (!st.isDirectory() || st.uid !== (process.getuid?.() ?? 0)) return;
  const want = gid === undefined ? 0o700 : 0o750;
  if ((st.mode & 0o777 & ~want) !== 0) await chmod(dir, st.mode & 0o777 & want);
}

/** True when something accepts connections on the unix socket at `path`. */
function answers(path: string): Promise<boolean> {
  return new Promise((resolve, reject) => {
    const sock = createConnection({ path });
    const timer = setTimeout(() => {
      // A listener that never accepts is still a listener (its backlog is full): not stale.
      sock.destroy();
      resolve(true);
    }, LIVENESS_TIMEOUT_MS);
    sock.once('connect', () => {
      clearTimeout(timer);
      sock.destroy();
      resolve(true);
    });
    sock.once('error', (err: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      if (err.code === 'ECONNREFUSED' || err.code === 'ENOENT') resolve(false);
      // EAGAIN: the listener's backlog is full, so there is a listener.
      else if (err.code === 'EAGAIN') resolve(true);
      else reject(new ConfigError(`cannot tell whether ${path} is in use: ${describeError(err)}`, { path }));
    });
  });
}

/** Sets the socket's mode (0600, or 0660 with `gid`) and group; returns its inode for removal at exit. */
export async function secureSocket(path: string, gid?: number): Promise<number> {
  if (gid !== undefined) await chown(path, process.getuid?.() ?? 0, gid);
  await chmod(path, gid === undefined ? 0o600 : 0o660);
  return (await stat(path)).ino;
}

/** Removes the socket if it is still the one we bound (a successor may already own the path). */
export async function removeSocket(path: string, ino: number | undefined): Promise<void> {
  try {
    const st = await lstat(path);
    if (!st.isSocket() || (ino !== undefined && st.ino !== ino)) return;
    await unlink(path);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
  }
}

/** Binds in progress under the private umask, and the umask to restore when the last one ends. */
let umaskHolders = 0;
let savedUmask: number | undefined;

/**
 * Runs `bind` with a umask that makes the new socket 0600 from its first instant, so that no
 * client can connect in the window before chmod. The umask is process-wide: concurrent binds share
 * one change, restored when the last of them ends.
 */
export async function withPrivateUmask<T>(bind: () => Promise<T>): Promise<T> {
  if (umaskHolders++ === 0) {
    try {
      savedUmask = process.umask(0o177);
    } catch {
      // Worker threads cannot change the umask; the 0700/0750 directory still guards the window.
      savedUmask = undefined;
    }
  }
  try {
    return await bind();
  } finally {
    if (--umaskHolders === 0 && savedUmask !== undefined) {
      process.umask(savedUmask);
      savedUmask = undefined;
    }
  }
}
