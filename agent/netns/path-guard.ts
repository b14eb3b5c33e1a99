/**
 * The netns path rules of the C helper (netns-helper/netns.c), mirrored textually so that a bad
 * path is refused before any process is involved. The helper stays the authority: it also
 * refuses symlinks and checks what it opened. test/unit/path-guard.test.ts compares the two.
 */
import { ConfigError } from '../errors.ts';

/** Where runtimes keep named netns files (containerd: cni-<uuid>, CRI-O: <uuid>). */
export const DEFAULT_NETNS_DIRS: readonly string[] = ['/run/netns', '/var/run/netns'];

/** The helper's proc root unless --proc-root says otherwise. */
export const DEFAULT_PROC_ROOT = '/proc';

/** Bounds the helper enforces (bytes, as the kernel counts them). */
export const NETNS_PATH_MAX_BYTES = 4095;
const NAME_MAX_BYTES = 255;
const ALLOW_DIR_MAX_BYTES = 1023;
const MAX_ALLOW_DIRS = 16;
/** The helper's PROC_ROOT_MAX minus its NUL: short enough for its messages to quote it whole. */
const PROC_ROOT_MAX_BYTES = 127;

export type NetnsPathKind = 'proc' | 'dir';

/** The verdict on one netns path; `reason` is the helper's own wording. */
export type PathVerdict = { ok: true; kind: NetnsPathKind } | { ok: false; reason: string };

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;
const PROC_PID_NETNS = /^\/[1-9][0-9]{0,9}\/ns\/net$/;

/** Why `p` is not an absolute canonical path (no //, ., .., trailing /), or undefined. */
function canonicalProblem(p: string, maxBytes: number): string | undefined {
  if (p.length === 0) return 'path is empty';
  if (!p.startsWith('/')) return 'path is not absolute';
  // The helper counts UTF-8 bytes; a lone surrogate could not even reach it intact.
  if (Buffer.byteLength(p, 'utf8') > maxBytes) return 'path is too long';
  if (/[\u0000-\u001f\u007f]/.test(p)) return 'path contains a control character';
  if (LONE_SURROGATE.test(p)) return 'path is not valid Unicode';
  if (p === '/') return undefined;
  if (p.endsWith('/')) return 'path ends with a slash';
  for (const part of p.slice(1).split('/')) {
    if (part === '') return 'path contains an empty component (//)';
    if (part === '.' || part === '..') return 'path contains a . or .. component';
    if (Buffer.byteLength(part, 'utf8') > NAME_MAX_BYTES) return 'path component is too long';
  }
  return undefined;
}

/** `p` is `dir` or below it (both canonical). */
function pathWithin(p: string, dir: string): boolean {
  return p === dir || p.startsWith(`${dir}/`);
}

function isProcPath(p: string): boolean {
  return pathWithin(p, '/proc');
}

/** Normalises one allowed directory as the helper's --allow-dir does; throws ConfigError when refused. */
export function normaliseAllowDir(dir: string): string {
  let d = dir;
  while (d.length > 1 && d.endsWith('/')) d = d.slice(0, -1);
  const problem = canonicalProblem(d, ALLOW_DIR_MAX_BYTES);
  if (problem) throw new ConfigError(`netns directory "${dir}" refused: ${problem}`, { dir });
  if (d === '/' || isProcPath(d)) {
    throw new ConfigError(`netns directory "${dir}" refused: directory may not be / or under /proc`, { dir });
  }
  return d;
}

/** The defaults plus `extra`, normalised and deduplicated, in the order the helper uses. */
export function allowedNetnsDirs(extra: readonly string[] = []): string[] {
  const dirs: string[] = [];
  for (const d of [...DEFAULT_NETNS_DIRS, ...extra].map(normaliseAllowDir)) {
    if (!dirs.includes(d)) dirs.push(d);
  }
  if (dirs.length > MAX_ALLOW_DIRS) throw new ConfigError(`too many netns directories (at most ${MAX_ALLOW_DIRS})`);
  return dirs;
}

/**
 * Normalises the proc root as the helper's --proc-root does (trailing slashes dropped) and checks
 * it against the normalised allowed directories; throws ConfigError when the helper would refuse it.
 */
export function normaliseProcRoot(root: string, allowDirs: readonly string[] = DEFAULT_NETNS_DIRS): string {
  if (Buffer.byteLength(root, 'utf8') > PROC_ROOT_MAX_BYTES) {
    throw new ConfigError(`proc root "${root.slice(0, 200)}" refused: proc root path is too long`, { procRoot: root.slice(0, 200) });
  }
  let d = root;
  while (d.length > 1 && d.endsWith('/')) d = d.slice(0, -1);
  const problem = canonicalProblem(d, PROC_ROOT_MAX_BYTES);
  if (problem) throw new ConfigError(`proc root "${root}" refused: ${problem}`, { procRoot: root });
  // "/" would make <anything>/<pid>/ns/net a followed link; under /proc, a magic link could lead anywhere.
  if (d === '/' || (isProcPath(d) && d !== '/proc')) {
    throw new ConfigError(`proc root "${root}" refused: proc root may not be / or under /proc`, { procRoot: root });
  }
  const overlap = allowDirs.find((dir) => pathWithin(dir, d) || pathWithin(d, dir));
  if (overlap !== undefined) {
    throw new ConfigError(`proc root "${root}" refused: overlaps the allowed directory ${overlap}`, { procRoot: root, dir: overlap });
  }
  return d;
}

/**
 * Checks a netns path against the helper's textual rules; `allowDirs` and `procRoot` must be
 * normalised. Only the configured proc root names processes: with the host's procfs mounted
 * elsewhere, the agent's own /proc shows another pid namespace, so /proc paths are refused.
 */
export function checkNetnsPath(path: string, allowDirs: readonly string[], procRoot: string = DEFAULT_PROC_ROOT): PathVerdict {
  const problem = canonicalProblem(path, NETNS_PATH_MAX_BYTES);
  if (problem) return { ok: false, reason: problem };
  if (pathWithin(path, procRoot)) {
    return PROC_PID_NETNS.test(path.slice(procRoot.length))
      ? { ok: true, kind: 'proc' }
      : { ok: false, reason: `a ${procRoot} path must be ${procRoot}/<pid>/ns/net with a decimal pid` };
  }
  if (isProcPath(path)) return { ok: false, reason: `a /proc path is refused: the proc root is ${procRoot}` };
  const dir = path.slice(0, path.lastIndexOf('/'));
  if (allowDirs.includes(dir)) return { ok: true, kind: 'dir' };
  return { ok: false, reason: `path is not ${procRoot}/<pid>/ns/net nor directly inside an allowed directory` };
}
