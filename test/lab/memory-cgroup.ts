/**
 * A real memory-limited cgroup for a test process (root only): cgroup v2 (memory.max) when the
 * unified hierarchy has the memory controller, else the v1 memory hierarchy
 * (memory.limit_in_bytes). Named after the test's pid, removed by destroy().
 */
import { existsSync, mkdirSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';

/** A cgroup with a memory limit that processes can be moved into. */
export interface MemoryCgroup {
  /** cgroup v2 or v1. */
  version: 2 | 1;
  /** Moves a process (all its threads) into the cgroup. */
  add(pid: number): void;
  /** Moves the processes left inside back to the parent, then removes the cgroup. */
  destroy(): void;
}

const ROOT = '/sys/fs/cgroup';

/** Creates `probe-agent-<tag>-<pid>` with the given limit; throws (with the reason) where no memory controller is usable. */
export function createMemoryCgroup(tag: string, limitBytes: number): MemoryCgroup {
  const name = `probe-agent-${tag}-${process.pid}`;
  const v2 = existsSync(path.join(ROOT, 'cgroup.controllers')) && readFileSync(path.join(ROOT, 'cgroup.controllers'), 'utf8').split(/\s+/).includes('memory');
  const parent = v2 ? ROOT : path.join(ROOT, 'memory');
  if (!v2 && !existsSync(path.join(parent, 'memory.limit_in_bytes'))) {
    throw new Error(`no memory cgroup controller: neither ${ROOT}/cgroup.controllers lists memory nor ${parent} is the v1 memory hierarchy`);
  }
  const dir = path.join(parent, name);
  mkdirSync(dir);
  try {
    if (v2) {
      const subtree = readFileSync(path.join(ROOT, 'cgroup.subtree_control'), 'utf8');
      if (!subtree.split(/\s+/).includes('memory')) writeFileSync(path.join(ROOT, 'cgroup.subtree_control'), '+memory');
      writeFileSync(path.join(dir, 'memory.max'), String(limitBytes));
    } else {
      writeFileSync(path.join(dir, 'memory.limit_in_bytes'), String(limitBytes));
    }
  } catch (err) {
    rmdirSync(dir);
    throw err;
  }
  return {
    version: v2 ? 2 : 1,
    add(pid) {
      writeFileSync(path.join(dir, 'cgroup.procs'), String(pid));
    },
    destroy() {
      if (!existsSync(dir)) return;
      for (const pid of readFileSync(path.join(dir, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean)) {
        try {
          writeFileSync(path.join(parent, 'cgroup.procs'), pid);
        } catch {
          // exited meanwhile
        }
      }
      rmdirSync(dir);
    },
  };
}
