/**
 * What the phases of `make e2e-kubelet` share: the result table, polling, kubelet's read-only
 * endpoints (/pods, /metrics/probes), its log, and child processes (e2e-critest uses those too).
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { accessSync, closeSync, constants, openSync, readdirSync, readFileSync, readSync, statSync } from 'node:fs';
import { createServer } from 'node:net';
import path from 'node:path';
import { LogLines, unexpectedLogs, type ExpectedLog } from '../support/log-check.ts';

export const NODE_NAME = 'probe-agent-e2e';

export type Outcome = 'PASS' | 'FAIL' | 'SKIP';

export interface Check {
  name: string;
  outcome: Outcome;
  detail: string;
}

export const checks: Check[] = [];

export function check(name: string, ok: boolean, detail: string): boolean {
  checks.push({ name, outcome: ok ? 'PASS' : 'FAIL', detail });
  console.log(`${ok ? 'PASS' : 'FAIL'}  ${name}: ${detail}`);
  return ok;
}

/** A check this kubelet (or this run's knobs) cannot make: a row in the table, never silent. */
export function skip(name: string, why: string): void {
  checks.push({ name, outcome: 'SKIP', detail: why });
  console.log(`SKIP  ${name}: ${why}`);
}

let sayWho = 'e2e-kubelet';
/** The harness named in progress lines. */
export function sayAs(who: string): void {
  sayWho = who;
}

export function say(msg: string): void {
  console.log(`[${sayWho} ${new Date().toISOString().slice(11, 23)}] ${msg}`);
}

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

/** Polls `fn` until it gives a value; `false` gives up at once. */
export async function waitFor<T>(what: string, timeoutMs: number, fn: () => Promise<T | undefined | false> | T | undefined | false, everyMs = 200): Promise<T | undefined> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    try {
      const v = await fn();
      if (v === false) return undefined;
      if (v !== undefined) return v;
    } catch {
      // not yet
    }
    if (Date.now() > end) {
      say(`gave up waiting for ${what} after ${timeoutMs / 1000} s`);
      return undefined;
    }
    await sleep(everyMs);
  }
}

/**
 * The executable a `make` target was given (`--flag PATH` or the variable `env`), made absolute;
 * exits 2 with the target's usage when it is missing or not executable.
 */
export function binaryFromArgs(flag: string, env: string, usage: (msg: string) => never): string {
  const i = process.argv.indexOf(flag);
  const p = i >= 0 ? process.argv[i + 1] : process.env[env];
  if (!p) usage(`no ${flag.replace(/^--/, '')} binary given`);
  const abs = path.resolve(p);
  try {
    accessSync(abs, constants.X_OK);
  } catch {
    usage(`${abs} is not an executable file`);
  }
  return abs;
}

export async function httpGet(url: string, timeoutMs = 3000): Promise<{ status: number; body: string }> {
  const res = await fetch(url, { signal: AbortSignal.timeout(timeoutMs) });
  return { status: res.status, body: await res.text() };
}

/** A child whose stdout+stderr go to a file; killed (group) by the cleanups. `env` is added to this process's. */
export function startLogged(cmd: string, args: string[], logFile: string, env: NodeJS.ProcessEnv = {}): ChildProcess {
  const fd = openSync(logFile, 'a');
  try {
    return spawn(cmd, args, { stdio: ['ignore', fd, fd], detached: true, env: { ...process.env, ...env } });
  } finally {
    closeSync(fd);
  }
}

export async function stopChild(child: ChildProcess | undefined, graceMs = 10_000): Promise<void> {
  if (!child?.pid || child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  try {
    process.kill(child.pid, 'SIGTERM');
  } catch {
    return;
  }
  const timer = setTimeout(() => {
    try {
      process.kill(-child.pid!, 'SIGKILL');
    } catch {
      // gone
    }
  }, graceMs);
  await exited;
  clearTimeout(timer);
}

/** How a daemon's process ended, and how long after its SIGTERM. */
export interface DaemonExit {
  code: number | null;
  signal: string | null;
  ms: number;
}

/**
 * A daemon the run restarts as a DaemonSet rollout does: SIGTERM, wait for the exit (SIGKILL to its
 * group after the grace period, as kubelet's terminationGracePeriodSeconds), then the new one.
 */
export class Daemon {
  proc: ChildProcess;
  readonly exits: DaemonExit[] = [];

  readonly cmd: string;
  readonly args: string[];
  readonly logFile: string;
  readonly env: NodeJS.ProcessEnv;

  constructor(cmd: string, args: string[], logFile: string, env: NodeJS.ProcessEnv = {}) {
    this.cmd = cmd;
    this.args = args;
    this.logFile = logFile;
    this.env = env;
    this.proc = startLogged(cmd, args, logFile, env);
  }

  get pid(): number | undefined {
    return this.proc.pid;
  }

  async stop(graceMs = 10_000): Promise<DaemonExit | undefined> {
    const child = this.proc;
    if (!child.pid || child.exitCode !== null || child.signalCode !== null) return undefined;
    const t0 = Date.now();
    const exited = new Promise<DaemonExit>((r) => child.once('exit', (code, signal) => r({ code, signal, ms: Date.now() - t0 })));
    try {
      process.kill(child.pid, 'SIGTERM');
    } catch {
      return undefined;
    }
    const timer = setTimeout(() => {
      try {
        process.kill(-child.pid!, 'SIGKILL');
      } catch {
        // gone
      }
    }, graceMs);
    const exit = await exited;
    clearTimeout(timer);
    this.exits.push(exit);
    return exit;
  }

  /** The rollout step: the old process stopped (`graceMs`), the new one started on the same flags and log. */
  async restart(graceMs: number): Promise<DaemonExit | undefined> {
    const exit = await this.stop(graceMs);
    this.proc = startLogged(this.cmd, this.args, this.logFile, this.env);
    return exit;
  }
}

/** Whatever a file gained after `from` (logs are appended to for the whole run). */
export function readFrom(file: string, from: number): string {
  let fd: number;
  try {
    fd = openSync(file, 'r');
  } catch {
    return '';
  }
  try {
    const size = statSync(file).size;
    if (size <= from) return '';
    const buf = Buffer.alloc(size - from);
    readSync(fd, buf, 0, buf.length, from);
    return buf.toString('utf8');
  } finally {
    closeSync(fd);
  }
}

export function sizeOf(file: string): number {
  try {
    return statSync(file).size;
  } catch {
    return 0;
  }
}

/** A process's resident set (VmRSS), when it runs. */
export function vmRssBytes(pid: number | undefined): number | undefined {
  if (pid === undefined) return undefined;
  const m = /VmRSS:\s+(\d+) kB/.exec(safeRead(`/proc/${pid}/status`));
  return m ? Number(m[1]) * 1024 : undefined;
}

/** The warn, error and non-JSON lines of an agent's or shim's log text not in `expected`, counted, the three most frequent shown. */
export function warnLines(text: string, expected: readonly ExpectedLog[] = []): { count: number; top: string } {
  const lines = new LogLines();
  lines.push(text.endsWith('\n') ? text : `${text}\n`);
  const bad = unexpectedLogs(lines.records, expected);
  const n = new Map<string, number>();
  for (const r of bad) {
    const m = `${String(r['level'])} ${String(r['msg'] ?? '')}${r['error'] ?? r['err'] ? `: ${JSON.stringify(r['error'] ?? r['err']).slice(0, 110)}` : ''}`;
    n.set(m, (n.get(m) ?? 0) + 1);
  }
  return { count: bad.length, top: [...n].sort((a, b) => b[1] - a[1]).slice(0, 3).map(([k, v]) => `${v}x ${k}`).join('; ') };
}

/** klog's "I1124 20:04:55.831504" -> epoch ms (kubelet logs local time; this run is on one machine). */
export function klogTime(line: string): number | undefined {
  // OpenShift's kubelet (v1.33 from microshift) puts "??? " before klog's header.
  const m = /^(?:\S+ )?[IWEF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d{6})/.exec(line);
  if (!m) return undefined;
  const now = new Date();
  const d = new Date(now.getFullYear(), Number(m[1]) - 1, Number(m[2]), Number(m[3]), Number(m[4]), Number(m[5]), Number(m[6]) / 1000);
  return d.getTime() + (Number(m[6]) % 1000) / 1000;
}

/** kubelet's "SyncLoop (probe)" line for a probe result of a pod: `probe` readiness/startup/liveness, `status` ready/started/unhealthy... */
export function probeLines(log: string, podName: string, probe: string, status: string): string[] {
  return log.split('\n').filter((l) => l.includes('"SyncLoop (probe)"') && l.includes(`probe="${probe}"`) && l.includes(`status="${status}"`)
    && l.includes(`pod="default/${podName}-${NODE_NAME}"`));
}

export interface PodView {
  name: string;
  uid: string;
  ready: boolean;
  containers: { name: string; id: string; ready: boolean; restartCount: number }[];
  initContainers: { name: string; id: string; ready: boolean; restartCount: number }[];
}

function containerViews(list: any[] | undefined): PodView['containers'] {
  return (list ?? []).map((c: any) => ({ name: String(c.name), id: String(c.containerID ?? ''), ready: c.ready === true, restartCount: Number(c.restartCount ?? 0) }));
}

/** kubelet's /pods, reduced to what the checks read. */
export async function podsOf(roPort: number): Promise<PodView[]> {
  const { body } = await httpGet(`http://127.0.0.1:${roPort}/pods`);
  const list = JSON.parse(body) as { items?: Record<string, any>[] };
  return (list.items ?? []).map((p) => ({
    name: String(p.metadata?.name ?? '').replace(`-${NODE_NAME}`, ''),
    uid: String(p.metadata?.uid ?? ''),
    ready: (p.status?.conditions ?? []).some((c: any) => c.type === 'Ready' && c.status === 'True'),
    containers: containerViews(p.status?.containerStatuses),
    initContainers: containerViews(p.status?.initContainerStatuses),
  }));
}

/** One series of kubelet's /metrics/probes by "pod/container probe_type result" (result empty when the series has none). */
export async function proberSeries(roPort: number, name: string): Promise<Map<string, number>> {
  const { body } = await httpGet(`http://127.0.0.1:${roPort}/metrics/probes`);
  const out = new Map<string, number>();
  for (const line of body.split('\n')) {
    if (!line.startsWith(`${name}{`)) continue;
    const labels = Object.fromEntries([...line.matchAll(/(\w+)="([^"]*)"/g)].map((m) => [m[1], m[2]]));
    const value = Number(line.slice(line.lastIndexOf(' ') + 1));
    const pod = String(labels['pod'] ?? '').replace(`-${NODE_NAME}`, '');
    out.set(`${pod}/${labels['container']} ${labels['probe_type']} ${labels['result'] ?? ''}`.trimEnd(), value);
  }
  return out;
}

/** prober_probe_total from kubelet's /metrics/probes: "pod/container probe_type result" -> count. */
export async function proberTotals(roPort: number): Promise<Map<string, number>> {
  return proberSeries(roPort, 'prober_probe_total');
}

export function total(m: Map<string, number>, key: string): number {
  return m.get(key) ?? 0;
}

/** One sample of a Prometheus text exposition ("name{labels}" as written, or a bare name): summed over matches. */
export function metricValue(text: string, nameAndLabels: string): number {
  let sum = 0;
  for (const line of text.split('\n')) {
    if (line.startsWith(`${nameAndLabels} `) || (line.startsWith(`${nameAndLabels}{`) && !nameAndLabels.includes('{'))) sum += Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return sum;
}

/** A container's log files, one per restart (kubelet's <podLogsRoot>/<ns>_<name>_<uid>/<container>/<n>.log). */
export function podLogFiles(podLogsRoot: string, uid: string, container: string): string[] {
  const dir = readdirSafe(podLogsRoot).find((d) => d.endsWith(`_${uid}`));
  if (!dir) return [];
  const cdir = path.join(podLogsRoot, dir, container);
  return readdirSafe(cdir).filter((x) => x.endsWith('.log')).sort().map((f) => path.join(cdir, f));
}

export function readdirSafe(d: string): string[] {
  try {
    return readdirSync(d);
  } catch {
    return [];
  }
}

export function safeRead(f: string): string {
  try {
    return readFileSync(f, 'utf8');
  } catch {
    return '';
  }
}

/** The last few lines of a log that match `re`, for a failure's detail. */
export function tail(file: string, re: RegExp): string {
  return safeRead(file).split('\n').filter((l) => re.test(l)).slice(-3).join(' | ').slice(0, 600) || '(nothing in the log)';
}

/** CRI's nanosecond timestamps (as the proto loader gives int64: a string) -> epoch ms. */
export function criMs(ns: string | number | undefined): number | undefined {
  if (ns === undefined || ns === null || String(ns) === '0') return undefined;
  return Number(BigInt(String(ns)) / 1000n) / 1000;
}

/**
 * A run's cleanup steps, undone last-in first-out and once: at the end of main, or on SIGINT or
 * SIGTERM (then the process exits 130). A step that fails is reported and the rest still run.
 */
export class Cleanups {
  readonly #who: string;
  readonly #steps: (() => void | Promise<void>)[] = [];
  #running = false;

  constructor(who: string, onSignal?: () => void) {
    this.#who = who;
    for (const sig of ['SIGINT', 'SIGTERM'] as const) {
      process.on(sig, () => {
        onSignal?.();
        if (this.#running) return;
        console.error(`${who}: ${sig}: cleaning up`);
        void this.run().finally(() => process.exit(130));
      });
    }
  }

  push(step: () => void | Promise<void>): void {
    this.#steps.push(step);
  }

  async run(): Promise<void> {
    this.#running = true;
    while (this.#steps.length) {
      const step = this.#steps.pop()!;
      try {
        await step();
      } catch (err) {
        console.error(`${this.#who}: cleanup step failed: ${(err as Error).message}`);
      }
    }
  }
}

/** Kubelet mounts its root dir onto itself and volumes below it: unmount them before removing it. */
export function unmountUnder(dir: string): void {
  const mounts = safeRead('/proc/mounts').split('\n').map((l) => l.split(' ')[1] ?? '').filter((m) => m === dir || m.startsWith(dir + '/'));
  for (const m of mounts.sort((a, b) => b.length - a.length)) spawnSync('umount', ['-l', m]);
}

/**
 * A harness's whole run: main, its cleanups whatever happened, then the result table under
 * `heading()` (read at the end: main sets what it names) and main's exit code.
 */
export async function runHarness(name: string, main: () => Promise<number>, cleanups: Cleanups, heading: () => string, width: number): Promise<never> {
  let code = 1;
  try {
    code = await main();
  } catch (err) {
    console.error(`${name}: ${(err as Error).stack ?? err}`);
  } finally {
    await cleanups.run();
  }
  printChecks(heading(), width);
  process.exit(code);
}

function printChecks(heading: string, width: number): void {
  console.log(`\n${heading}`);
  console.log(`${'check'.padEnd(width)} result  detail`);
  for (const c of checks) console.log(`${c.name.padEnd(width)} ${c.outcome}    ${c.detail}`);
  const count = (o: Outcome): number => checks.filter((c) => c.outcome === o).length;
  console.log(`\n${count('PASS')}/${checks.length} passed, ${count('FAIL')} failed, ${count('SKIP')} skipped`);
}
