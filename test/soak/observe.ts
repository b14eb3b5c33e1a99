/**
 * What the reliability tests and the soak read about a running agent from the outside: the
 * kernel's view of the process (/proc: fds, RSS, children, zombies), Prometheus samples from a
 * scrape, and its JSON log lines. Nothing here asks the agent about itself.
 */
import { readFileSync, readdirSync, writeFileSync } from 'node:fs';

/** One process below the agent, as /proc shows it. */
export interface ProcessInfo {
  pid: number;
  ppid: number;
  /** /proc/<pid>/stat state letter: R, S, D, Z, ... */
  state: string;
  comm: string;
}

/** The kernel's accounting of the agent at one instant. */
export interface ProcessSnapshot {
  /** Open file descriptors (/proc/<pid>/fd entries). */
  fds: number;
  rssMB: number;
  /** Peak RSS since start or the last resetPeak (VmHWM). */
  peakMB: number;
  threads: number;
  /** Direct children. */
  children: ProcessInfo[];
  /** Every descendant (children, grandchildren...). */
  descendants: ProcessInfo[];
  /** Descendants in state Z (exited, never reaped). */
  zombies: number;
}

/** Reads /proc/<pid>/stat; undefined once the process is gone. */
export function processInfo(pid: number): ProcessInfo | undefined {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return undefined;
  }
  // comm may hold spaces and parentheses: the fields start after the last ") ".
  const close = text.lastIndexOf(') ');
  const comm = text.slice(text.indexOf('(') + 1, close);
  const f = text.slice(close + 2).split(' ');
  return { pid, ppid: Number(f[1]), state: f[0] ?? '?', comm };
}

/** Direct children of `pid`, from every thread's children list. */
export function childPids(pid: number): number[] {
  const out = new Set<number>();
  let tids: string[];
  try {
    tids = readdirSync(`/proc/${pid}/task`);
  } catch {
    return [];
  }
  for (const tid of tids) {
    try {
      for (const c of readFileSync(`/proc/${pid}/task/${tid}/children`, 'utf8').trim().split(/\s+/)) if (c) out.add(Number(c));
    } catch {
      // thread exited meanwhile
    }
  }
  return [...out];
}

/** `pid`'s descendants, breadth first (bounded: a runaway fork bomb must not hang the test). */
export function descendants(pid: number, max = 10_000): ProcessInfo[] {
  const out: ProcessInfo[] = [];
  const queue = [pid];
  while (queue.length > 0 && out.length < max) {
    for (const c of childPids(queue.shift() as number)) {
      const info = processInfo(c);
      if (!info) continue;
      out.push(info);
      queue.push(c);
    }
  }
  return out;
}

/** fds, memory, threads, children and zombies of `pid` right now. */
export function snapshot(pid: number): ProcessSnapshot {
  let status = '';
  try {
    status = readFileSync(`/proc/${pid}/status`, 'utf8');
  } catch {
    // gone: zeros
  }
  const kb = (key: string): number => Number(new RegExp(`^${key}:\\s+(\\d+)`, 'm').exec(status)?.[1] ?? 0);
  let fds = 0;
  try {
    fds = readdirSync(`/proc/${pid}/fd`).length;
  } catch {
    // gone
  }
  const children = childPids(pid).map(processInfo).filter((p): p is ProcessInfo => p !== undefined);
  const all = descendants(pid);
  return {
    fds,
    rssMB: kb('VmRSS') / 1024,
    peakMB: kb('VmHWM') / 1024,
    threads: kb('Threads'),
    children,
    descendants: all,
    zombies: all.filter((p) => p.state === 'Z').length,
  };
}

/** CPU seconds used so far by `pid` and its live descendants, plus the children it has reaped. */
export function cpuSeconds(pid: number): number {
  let ticks = 0;
  for (const p of [pid, ...descendants(pid).map((d) => d.pid)]) {
    try {
      const text = readFileSync(`/proc/${p}/stat`, 'utf8');
      const f = text.slice(text.lastIndexOf(') ') + 2).split(' ');
      // f[0] is field 3 (state): utime, stime, cutime, cstime are fields 14-17.
      ticks += Number(f[11]) + Number(f[12]) + (p === pid ? Number(f[13]) + Number(f[14]) : 0);
    } catch {
      // exited meanwhile
    }
  }
  // USER_HZ is 100 on every Linux this runs on.
  return ticks / 100;
}

/** Restarts the kernel's peak-RSS counter of `pid` (Linux >= 4.0: clear_refs "5"); false when not allowed. */
export function resetPeak(pid: number): boolean {
  try {
    // r+: procfs files exist; never create a file when the process is already gone.
    writeFileSync(`/proc/${pid}/clear_refs`, '5', { flag: 'r+' });
    return true;
  } catch {
    return false;
  }
}

/** The value of the series `name` whose labels include `want` in a Prometheus text scrape; undefined when absent. */
export function sample(body: string, name: string, want: Record<string, string> = {}): number | undefined {
  for (const line of body.split('\n')) {
    if (line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)/.exec(line);
    if (!m || m[1] !== name) continue;
    const labels = Object.fromEntries([...(m[2] ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)].map((l) => [l[1], l[2]]));
    if (Object.entries(want).every(([k, v]) => labels[k] === v)) return Number(m[3]);
  }
  return undefined;
}

/** Log lines (JSON records) with message `msg` among `logs` from index `from` on. */
export function logsSince(logs: Record<string, unknown>[], from: number, msg: string | RegExp): Record<string, unknown>[] {
  return logs.slice(from).filter((l) => (typeof msg === 'string' ? l.msg === msg : msg.test(String(l.msg))));
}

type Falsy = false | 0 | '' | null | undefined;

/** Polls `cond` every `everyMs` until it is truthy and returns that value; throws with `what` after `timeoutMs`. */
export async function until<T>(cond: () => T | Promise<T>, timeoutMs: number, what: string, everyMs = 100): Promise<Exclude<T, Falsy>> {
  const end = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await cond();
      if (v) return v as Exclude<T, Falsy>;
    } catch (err) {
      last = err;
    }
    if (Date.now() > end) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${String(last)}` : ''}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

/** Milliseconds to sleep. */
export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
