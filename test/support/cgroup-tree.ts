/** Small helpers for the cgroup trees and processes that test labs, the bench and the soak create. */
import { readdirSync, rmdirSync } from 'node:fs';
import { join } from 'node:path';

/**
 * Removes a cgroup directory tree, deepest first: cgroup dirs go only with rmdir once empty (their
 * files cannot be unlinked). A dir whose last process is still exiting stays for the next sweep.
 */
export function removeCgroupTree(dir: string): void {
  let entries: import('node:fs').Dirent[];
  try {
    entries = readdirSync(dir, { withFileTypes: true });
  } catch {
    return;
  }
  for (const e of entries) if (e.isDirectory()) removeCgroupTree(join(dir, e.name));
  try {
    rmdirSync(dir);
  } catch {
    // a process is still inside (killed, not yet reaped)
  }
}

/** Whether a process with this pid exists (zombies included: check /proc/PID/stat where that matters). */
export function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}
