/**
 * Running a process as a non-root user. The checkout may sit where only root can reach it (a clone
 * under /root, or any 0700 directory), and the test's node binary lives in the checkout
 * (`.tools/bin/node` -> tools/node/...), so such a process gets its own copy of node in a fresh
 * world-readable directory instead: the user's checkout is never chmod-ed.
 */
import { spawn } from 'node:child_process';
import { chmodSync, constants, copyFileSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import { once } from 'node:events';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';

/** A node binary any user can run, in a private 0755 directory; remove() deletes it. */
export interface PortableNode {
  node: string;
  dir: string;
  remove(): void;
}

/**
 * A temp dir other users can reach: os.tmpdir() when every directory on its path is searchable by
 * all, else /tmp (a TMPDIR under a 0700 home would hide what the test puts there).
 */
export function tmpdirOthersReach(): string {
  for (let d = tmpdir(); ; d = dirname(d)) {
    try {
      if ((statSync(d).mode & 0o001) === 0) return '/tmp';
    } catch {
      return '/tmp';
    }
    if (d === dirname(d)) return tmpdir();
  }
}

/** Copies the running node binary into a fresh 0755 directory other users can reach (a reflink where the filesystem can). */
export function portableNode(): PortableNode {
  const dir = mkdtempSync(join(tmpdirOthersReach(), 'pa-node-for-others-'));
  chmodSync(dir, 0o755);
  const node = join(dir, 'node');
  copyFileSync(process.execPath, node, constants.COPYFILE_FICLONE);
  chmodSync(node, 0o755);
  return { node, dir, remove: () => rmSync(dir, { recursive: true, force: true }) };
}

/**
 * Runs `node -e <script>` as `uid` (group `uid` too) with the given node binary, from `/` and with a
 * minimal environment, and returns its trimmed stdout; stderr is appended when the process fails, so
 * an EACCES on the binary itself shows up in the assertion instead of an empty string.
 */
export async function runNodeAs(node: string, uid: number, script: string): Promise<string> {
  const child = spawn(node, ['-e', script], { uid, gid: uid, cwd: '/', env: { PATH: '/usr/bin:/bin' } });
  let out = '';
  let err = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (err += d.toString()));
  const spawnError = once(child, 'error').then(([e]) => { throw e; });
  const [code] = (await Promise.race([once(child, 'exit'), spawnError])) as [number | null];
  return code === 0 ? out.trim() : `${out.trim()} (exit ${code}: ${err.trim()})`;
}

/** A script for runNodeAs: connects to a unix socket and prints "connected" or the error code. */
export function connectScript(socketPath: string): string {
  return `const s=require('net').connect(${JSON.stringify(socketPath)});s.on('connect',()=>{console.log('connected');s.destroy()});s.on('error',e=>console.log(e.code))`;
}
