/**
 * The kernel's own accounting of a process, read from /proc: CPU (utime/stime, and cutime/cstime
 * for children that were waited for), resident memory and its peak, and child pids. The bench
 * uses nothing else to charge CPU, so a path cannot hide cost in a helper or a child.
 */
import { execFileSync } from 'node:child_process';
import { readFileSync, readdirSync, writeFileSync } from 'node:fs';

/** Clock ticks per second for /proc/<pid>/stat (USER_HZ); 100 on every Linux we run on. */
export const CLK_TCK: number = (() => {
  try {
    const n = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim());
    return Number.isInteger(n) && n > 0 ? n : 100;
  } catch {
    return 100;
  }
})();

/** CPU of one process in ms: its own, and that of its reaped children (0 once it is gone). */
export interface CpuSample {
  selfMs: number;
  childrenMs: number;
}

/** Reads utime+stime and cutime+cstime of `pid` ('self' for this process); zeros when it has exited. */
export function cpuOf(pid: number | 'self'): CpuSample {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return { selfMs: 0, childrenMs: 0 };
  }
  // comm may contain spaces and parentheses: the fields start after the LAST ") ".
  const f = text.slice(text.lastIndexOf(') ') + 2).split(' ');
  // f[0] is field 3 (state), so utime (field 14) is f[11], stime f[12], cutime f[13], cstime f[14].
  const t = (i: number): number => Number(f[i] ?? 0);
  const tick = 1000 / CLK_TCK;
  return { selfMs: (t(11) + t(12)) * tick, childrenMs: (t(13) + t(14)) * tick };
}

/**
 * CPU of `pid` with every child's, live or reaped, in ms: long-lived children (the helper pool's
 * workers) are reaped only when replaced, so cutime alone would miss them. The parent is read
 * first: a child reaped in between is missed in this sample and counted in the next one's cutime.
 */
export function treeCpuMs(pid: number): number {
  const c = cpuOf(pid);
  let live = 0;
  for (const child of childrenOf(pid)) {
    const k = cpuOf(child);
    live += k.selfMs + k.childrenMs;
  }
  return c.selfMs + c.childrenMs + live;
}

/** utime+stime+cutime+cstime of `pid` in ms. */
export function totalCpuMs(pid: number | 'self'): number {
  const c = cpuOf(pid);
  return c.selfMs + c.childrenMs;
}

/** Current and peak resident set of a process, in MB (0 when it has exited). */
export function rssOf(pid: number | 'self'): { rssMB: number; peakMB: number; anonMB: number; fileMB: number } {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/status`, 'utf8');
  } catch {
    return { rssMB: 0, peakMB: 0, anonMB: 0, fileMB: 0 };
  }
  const kb = (key: string): number => Number(new RegExp(`^${key}:\\s+(\\d+) kB`, 'm').exec(text)?.[1] ?? 0);
  // RssFile is mostly the node binary's clean, shared pages; RssAnon is the agent's own memory.
  return { rssMB: kb('VmRSS') / 1024, peakMB: kb('VmHWM') / 1024, anonMB: kb('RssAnon') / 1024, fileMB: (kb('RssFile') + kb('RssShmem')) / 1024 };
}

/** Restarts the kernel's peak-RSS counter (VmHWM) of `pid`: writes 5 to clear_refs (Linux >= 4.0). */
export function resetPeakRss(pid: number | 'self'): boolean {
  try {
    writeFileSync(`/proc/${pid}/clear_refs`, '5');
    return true;
  } catch {
    return false;
  }
}

/** Direct children of `pid` (all its threads' children), from /proc/<pid>/task/<tid>/children. */
export function childrenOf(pid: number | 'self'): number[] {
  const out: number[] = [];
  let tids: string[];
  try {
    tids = readdirSync(`/proc/${pid}/task`);
  } catch {
    return out;
  }
  for (const tid of tids) {
    try {
      for (const c of readFileSync(`/proc/${pid}/task/${tid}/children`, 'utf8').trim().split(/\s+/)) {
        if (c !== '') out.push(Number(c));
      }
    } catch {
      // the thread ended meanwhile
    }
  }
  return out;
}

/** The NUL-separated command line of `pid` as an array ([] when gone). */
export function cmdlineOf(pid: number): string[] {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter((s) => s !== '');
  } catch {
    return [];
  }
}

/** The first child of `pid` whose command line satisfies `match`, if any. */
export function findChild(pid: number, match: (argv: string[]) => boolean): number | undefined {
  return childrenOf(pid).find((c) => match(cmdlineOf(c)));
}

/** Resolves once `pid` has no children left (spawned helpers reaped) or after `timeoutMs`. */
export async function waitNoChildren(pid: number | 'self', timeoutMs: number, except: number[] = []): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (childrenOf(pid).some((c) => !except.includes(c)) && Date.now() < end) {
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** Per-thread schedstat fields of `pid`, summed: 0 = run time (ns), 2 = times scheduled to run. */
function schedstatSum(pid: number, field: 0 | 2): number {
  let tasks: string[];
  try {
    tasks = readdirSync(`/proc/${pid}/task`);
  } catch {
    return 0;
  }
  let n = 0;
  for (const t of tasks) {
    try {
      n += Number(readFileSync(`/proc/${pid}/task/${t}/schedstat`, 'utf8').split(' ')[field]);
    } catch {
      // the thread ended
    }
  }
  return n;
}

/**
 * Times the threads of `pid` were scheduled to run (/proc/<pid>/task/<tid>/schedstat's third field,
 * summed): each wake-up counts once (a preempted thread put back on a CPU too, rare when idle most of
 * the time). Threads that ended are not counted; 0 for a process that is gone.
 */
export function wakeupsOf(pid: number): number {
  return schedstatSum(pid, 2);
}

/** CPU ms of every live thread of `pid`, from schedstat's run time (ns, not ticks): exact for short windows. */
export function runMsOf(pid: number): number {
  return schedstatSum(pid, 0) / 1e6;
}
