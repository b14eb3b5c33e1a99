/**
 * Resolver-side validation of a netns path before it is handed out or reused from the cache:
 * canonical, inside an allowed place, not a symlink, really a namespace (nsfs), and its inode.
 * The helper repeats its own checks when it opens the path; this side exists so that a bad path
 * from a runtime is refused (and another resolver tried) before any probe is scheduled on it.
 */
import { lstat, realpath, stat, statfs } from 'node:fs/promises';
import { lstatSync, statSync, statfsSync } from 'node:fs';
import path from 'node:path';
import { NetnsError } from '../errors.ts';

/** Where named netns files live (iproute2, containerd's default, CRI-O pinns). /var/run is usually a link to /run. */
export const DEFAULT_NETNS_DIRS: readonly string[] = ['/run/netns', '/var/run/netns'];

const NSFS_MAGIC = 0x6e736673;
const MAX_PATH = 4096;
const MAX_PID = 4_194_304;

/** Options of the checker. */
export interface NetnsPathCheckerOptions {
  /** Directories whose direct children may be netns files; default DEFAULT_NETNS_DIRS. */
  dirs?: readonly string[];
  /** More such directories, e.g. containerd's `<state>/io.containerd.grpc.v1.cri/netns`. */
  extraDirs?: readonly string[];
  /** The host's procfs as mounted for the agent; default /proc. */
  procRoot?: string;
}

/** A path that passed the checks. */
export interface CheckedNetns {
  /** The canonical form: what callers must use from now on. */
  path: string;
  inode: number;
  dev: number;
}

/** Validates netns paths against a fixed set of allowed places. */
export class NetnsPathChecker {
  readonly dirs: readonly string[];
  readonly procRoot: string;
  #canonicalDirs: Set<string> | undefined;

  constructor(opts: NetnsPathCheckerOptions = {}) {
    const dirs = [...(opts.dirs ?? DEFAULT_NETNS_DIRS), ...(opts.extraDirs ?? [])];
    for (const d of dirs) assertAbsolute(d, 'netns directory');
    this.dirs = [...new Set(dirs.map((d) => path.posix.normalize(d).replace(/\/+$/, '') || '/'))];
    const procRoot = opts.procRoot ?? '/proc';
    assertAbsolute(procRoot, 'proc root');
    this.procRoot = path.posix.normalize(procRoot).replace(/\/+$/, '');
  }

  /** The `<procRoot>/<pid>/ns/net` path of a process. */
  procNetPath(pid: number): string {
    return `${this.procRoot}/${pid}/ns/net`;
  }

  /**
   * Checks `p` and returns its canonical form and namespace inode. Rejects with NetnsError:
   * 'invalid' (refused: outside the allowed places, a symlink, not a namespace), 'gone' (ENOENT).
   */
  async check(p: string): Promise<CheckedNetns> {
    if (typeof p !== 'string' || p.length === 0 || p.length > MAX_PATH || p.includes('\0') || !p.startsWith('/')) {
      throw invalid(p, 'not an absolute path');
    }
    if (p.split('/').includes('..')) throw invalid(p, 'contains ".."');
    const normal = path.posix.normalize(p);
    const m = /^(.*)\/(\d{1,7})\/ns\/net$/.exec(normal);
    if (m && m[1] === this.procRoot) {
      const pid = Number(m[2]);
      if (pid < 1 || pid > MAX_PID) throw invalid(p, 'pid out of range');
      // The /proc form is a magic link by design: lstat sees a symlink, stat follows it to the ns.
      const l = await fsCall(p, () => lstat(normal));
      if (!l.isSymbolicLink()) throw invalid(p, 'not a /proc namespace link');
      return this.#finish(p, normal);
    }
    const dir = path.posix.dirname(normal);
    const base = path.posix.basename(normal);
    if (base === '' || base === '.' || base.length > 255) throw invalid(p, 'bad file name');
    // Textual check first: an arbitrary path is refused without touching its filesystem.
    if (!this.dirs.includes(dir)) {
      throw invalid(p, `not inside an allowed netns directory (${this.dirs.join(', ')}) or ${this.procRoot}/<pid>/ns/net`);
    }
    const realDir = await fsCall(p, () => realpath(dir));
    if (!(await this.#isAllowedDir(realDir))) {
      throw invalid(p, `directory resolves to ${realDir}, outside the allowed netns directories`);
    }
    const canonical = path.posix.join(realDir, base);
    const l = await fsCall(p, () => lstat(canonical));
    if (l.isSymbolicLink()) throw invalid(p, 'is a symlink');
    if (!l.isFile()) throw invalid(p, 'not a namespace file');
    return this.#finish(p, canonical);
  }

  async #finish(given: string, canonical: string): Promise<CheckedNetns> {
    const [st, fs] = await Promise.all([fsCall(given, () => stat(canonical)), fsCall(given, () => statfs(canonical))]);
    // A netns file that is no longer bind-mounted is an empty file on the parent filesystem.
    if (fs.type !== NSFS_MAGIC) throw new NetnsError('gone', `netns "${given}" is not a mounted namespace`, { netns: given });
    rememberChecked(canonical, st.dev, st.ino);
    return { path: canonical, inode: st.ino, dev: st.dev };
  }

  async #isAllowedDir(realDir: string): Promise<boolean> {
    if (!this.#canonicalDirs || !this.#canonicalDirs.has(realDir)) this.#canonicalDirs = await canonicalise(this.dirs);
    return this.#canonicalDirs.has(realDir);
  }
}

/**
 * Re-checks a path that passed check() earlier: still there, still not a plain symlink (the /proc
 * form is a magic link), still a mounted namespace, and still the same one (inode). Needs no
 * directory policy, so a cache can use it whatever checker produced the path.
 */
export async function isSameNetns(p: string, inode: number): Promise<boolean> {
  return isSameNetnsNow(p, inode);
}

/** A <proc root>/<pid>/ns/net path: a magic link, and its pid may later be another process's. */
export function isProcNetnsPath(p: string): boolean {
  return /\/\d+\/ns\/net$/.test(p);
}

/** isSameNetns, synchronously (for callers on a synchronous fast path). */
export function isSameNetnsNow(p: string, inode: number): boolean {
  // Synchronous on purpose: this runs before every probe, and on nsfs/procfs (in-memory) the three
  // sync calls cost ~3 µs where the libuv round trips cost 40–160 µs of CPU (profiled in make bench).
  try {
    const l = lstatSync(p);
    if (l.isSymbolicLink() && !isProcNetnsPath(p)) return false;
    if (statfsSync(p).type !== NSFS_MAGIC) return false;
    const st = statSync(p);
    if (st.ino !== inode) return false;
    rememberChecked(p, st.dev, st.ino);
    return true;
  } catch {
    return false;
  }
}

/** The namespace a check found behind a path (nsfs device and inode). */
export interface NetnsIdentity {
  dev: number;
  ino: number;
}

const CHECKED_MAX = 4096;
/**
 * The last namespace each path was checked to be, by check() or isSameNetns(): what the helper is
 * told to find when it opens the path, so that a pid reused or a file re-mounted between the
 * check and the helper's open leads nowhere (the helper refuses, stage "identity").
 */
const checked = new Map<string, NetnsIdentity>();

function rememberChecked(p: string, dev: number, ino: number): void {
  checked.delete(p);
  // Bounded: a node has far fewer netns paths than this; the oldest goes first.
  if (checked.size >= CHECKED_MAX) checked.delete(checked.keys().next().value as string);
  checked.set(p, { dev, ino });
}

/** The namespace `p` was last checked to be, if it was checked. */
export function checkedNetnsIdentity(p: string): NetnsIdentity | undefined {
  return checked.get(p);
}

async function canonicalise(dirs: readonly string[]): Promise<Set<string>> {
  const out = new Set<string>();
  for (const d of dirs) {
    try {
      out.add(await realpath(d));
    } catch {
      // A netns dir appears with the first named netns; until then nothing can be inside it.
    }
  }
  return out;
}

function assertAbsolute(p: string, what: string): void {
  if (typeof p !== 'string' || !p.startsWith('/') || p.includes('\0') || p.length > MAX_PATH) {
    throw new NetnsError('invalid', `${what} must be an absolute path, got ${JSON.stringify(p)}`);
  }
}

function invalid(p: unknown, why: string): NetnsError {
  const shown = typeof p === 'string' ? p.slice(0, 200) : String(p);
  return new NetnsError('invalid', `netns path "${shown}" refused: ${why}`, { netns: shown });
}

async function fsCall<T>(p: string, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT' || code === 'ENOTDIR' || code === 'ESRCH') {
      throw new NetnsError('gone', `netns "${p}" is gone (${code})`, { netns: p });
    }
    if (code === 'EACCES' || code === 'EPERM') {
      throw new NetnsError('denied', `netns "${p}": permission denied (${code})`, { netns: p });
    }
    throw new NetnsError('invalid', `netns "${p}": ${(err as Error).message}`, { netns: p });
  }
}
