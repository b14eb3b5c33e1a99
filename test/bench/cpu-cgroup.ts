/**
 * Precise CPU of a process tree from the kernel: a cgroup of our own whose CPU counter (cgroup v1
 * cpuacct.usage, or v2 cpu.stat usage_usec) sums the exact runtime of every task in it, children
 * forked later included. /proc/<pid>/stat counts in 10 ms ticks, which at 150 probes is ±0.07 ms
 * per probe: too coarse next to a +0.15 ms target. Trees live below probe-agent-bench-<pid>/.
 */
import { existsSync, mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { pidAlive, removeCgroupTree } from '../support/cgroup-tree.ts';

const PREFIX = 'probe-agent-bench-';

/** Where a CPU counter is read: the file and how to parse it. */
export interface CpuCounter {
  file: string;
  kind: 'cpuacct' | 'cpu.stat';
}

/** Reads a counter in ms; NaN when unreadable (the cgroup is gone). */
export function readCpuCounter(c: CpuCounter): number {
  try {
    const text = readFileSync(c.file, 'utf8');
    if (c.kind === 'cpuacct') return Number(text.trim()) / 1e6;
    return Number(/^usage_usec (\d+)/m.exec(text)?.[1] ?? NaN) / 1000;
  } catch {
    return Number.NaN;
  }
}



/** The hierarchy to use and its counter file name, or undefined when none is writable. */
function hierarchy(): { root: string; kind: CpuCounter['kind'] } | undefined {
  if (existsSync('/sys/fs/cgroup/cpuacct/cpuacct.usage')) return { root: '/sys/fs/cgroup/cpuacct', kind: 'cpuacct' };
  for (const root of ['/sys/fs/cgroup/unified', '/sys/fs/cgroup']) {
    if (existsSync(join(root, 'cgroup.controllers'))) return { root, kind: 'cpu.stat' };
  }
  return undefined;
}

/** A family of CPU cgroups for this bench process; undefined where cgroups cannot be used. */
export class CpuCgroups {
  readonly #base: string;
  readonly #kind: CpuCounter['kind'];

  private constructor(base: string, kind: CpuCounter['kind']) {
    this.#base = base;
    this.#kind = kind;
  }

  /** Sets up probe-agent-bench-<pid>/ (sweeping those of dead runs); undefined if not possible. */
  static open(): CpuCgroups | undefined {
    const h = hierarchy();
    if (!h) return undefined;
    try {
      for (const name of readdirSync(h.root)) {
        const pid = Number(name.slice(PREFIX.length));
        if (name.startsWith(PREFIX) && Number.isInteger(pid) && !pidAlive(pid)) removeCgroupTree(join(h.root, name));
      }
      const base = join(h.root, `${PREFIX}${process.pid}`);
      mkdirSync(base, { recursive: true });
      return new CpuCgroups(base, h.kind);
    } catch {
      return undefined;
    }
  }

  /** Creates cgroup `name` and moves `pid` into it; returns its counter, or undefined on failure. */
  place(name: string, pid: number): CpuCounter | undefined {
    const dir = join(this.#base, name);
    try {
      mkdirSync(dir, { recursive: true });
      writeFileSync(join(dir, 'cgroup.procs'), String(pid));
    } catch {
      return undefined;
    }
    return { file: join(dir, this.#kind === 'cpuacct' ? 'cpuacct.usage' : 'cpu.stat'), kind: this.#kind };
  }

  /** Removes every cgroup of this run (their tasks must have exited). */
  close(): void {
    if (existsSync(this.#base)) removeCgroupTree(this.#base);
  }
}
