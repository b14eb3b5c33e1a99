/**
 * Runs the real daemon (`node agent/cli.ts run`) as a child process for end-to-end tests: a
 * private socket and a loopback metrics port, JSON logs captured, and helpers to wait for
 * results through the real API and to read /metrics. Once the test file ends, any warn/error
 * (or non-JSON) line the agent wrote fails it unless listed in `expectedLogs` / expectLogs()
 * (log-check.ts): a healthy run logs none.
 */
import { shimSocketBeside } from '../../agent/contract/shim-socket.ts';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ProbeApiClient } from '../../agent/api/client.ts';
import type { ProbeStatus } from '../../agent/scheduler/types.ts';
import { LogLines, trackLogs, type ExpectedLog, type LogRecord } from './log-check.ts';

const ROOT = new URL('../..', import.meta.url).pathname;

/** Options for startAgent; `args` are extra `run` flags. */
export interface AgentOptions {
  kubeletUrl: string;
  resolvers?: string;
  pollInterval?: string;
  args?: string[];
  env?: NodeJS.ProcessEnv;
  /** Milliseconds to wait for the socket and metrics listener (default 15 s). */
  startTimeoutMs?: number;
  /** Run the agent in its own process group (pid = pgid), so a test can signal the whole group. */
  detached?: boolean;
  /** The CLI entry to run (default this checkout's agent/cli.ts), e.g. a previous release's dist/cli.js. */
  cli?: string;
  /** Warn/error lines the test provokes on purpose (each with why); any other fails the test file. */
  expectedLogs?: ExpectedLog[];
}

/** A running agent process. */
export interface AgentHandle {
  proc: ChildProcess;
  pid: number;
  socket: string;
  /** The kubelet shim's socket, beside `socket`. */
  shimSocket: string;
  metricsUrl: string;
  /** Parsed JSON log lines so far (stderr); a line that is not JSON is `{ level: 'non-json', line }`. */
  logs: LogRecord[];
  /** Adds warn/error lines a later step of the test provokes on purpose (see AgentOptions.expectedLogs). */
  expectLogs(...more: ExpectedLog[]): void;
  client: ProbeApiClient;
  /** Polls ListProbeStatus until `pred` holds; returns the statuses. */
  waitForStatuses(pred: (s: ProbeStatus[]) => boolean, timeoutMs?: number): Promise<ProbeStatus[]>;
  /** GET a path on the metrics listener. */
  http(path: string): Promise<{ status: number; body: string }>;
  /** Sends `signal` (default SIGTERM) and resolves with the exit code (or the signal name). */
  stop(signal?: NodeJS.Signals, timeoutMs?: number): Promise<number | string | null>;
}

/** Starts the agent and waits until its socket and metrics listener are up. */
/**
 * Lists the agent's statuses every `intervalMs` until `pred` holds; past `timeoutMs` throws with
 * `detail` of the last list. A failed list (agent busy or restarting) is retried.
 */
export async function pollStatuses(client: ProbeApiClient, pred: (s: ProbeStatus[]) => boolean, timeoutMs: number, intervalMs: number, detail: (last: ProbeStatus[]) => string): Promise<ProbeStatus[]> {
  const end = Date.now() + timeoutMs;
  let last: ProbeStatus[] = [];
  for (;;) {
    try {
      last = (await client.listStatus({}, 2000)).statuses;
      if (pred(last)) return last;
    } catch {
      // agent busy or restarting
    }
    if (Date.now() > end) throw new Error(`condition not met in ${timeoutMs} ms; ${detail(last)}`);
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

export async function startAgent(opts: AgentOptions): Promise<AgentHandle> {
  const dir = mkdtempSync(join(tmpdir(), 'probe-agent-e2e-'));
  const socket = join(dir, 'probe.sock');
  const args = [
    opts.cli ?? join(ROOT, 'agent/cli.ts'),
    'run',
    `--kubelet-url=${opts.kubeletUrl}`,
    `--kubelet-poll-interval=${opts.pollInterval ?? '500ms'}`,
    `--netns-resolvers=${opts.resolvers ?? 'address'}`,
    `--socket=${socket}`,
    '--metrics-address=127.0.0.1:0',
    '--log-format=json',
    ...(opts.args ?? []),
  ];
  const proc = spawn(process.execPath, args, { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, ...opts.env }, detached: opts.detached === true });
  const lines = new LogLines();
  const logs = lines.records;
  let metricsUrl = '';
  let exited: number | string | null | undefined;
  const exitWaiters: ((code: number | string | null) => void)[] = [];
  proc.stderr!.setEncoding('utf8');
  proc.stderr!.on('data', (chunk: string) => {
    for (const rec of lines.push(chunk)) {
      if (rec['msg'] === 'metrics listener started') metricsUrl = `http://${String(rec['address'])}`;
    }
  });
  const checked = trackLogs(`agent pid ${proc.pid} (${args[0]})`, logs, opts.expectedLogs);
  proc.once('exit', (code, signal) => {
    exited = code ?? signal;
    for (const w of exitWaiters.splice(0)) w(exited);
    rmSync(dir, { recursive: true, force: true });
  });
  const client = new ProbeApiClient(socket);
  const deadline = Date.now() + (opts.startTimeoutMs ?? 15_000);
  for (;;) {
    if (exited !== undefined) {
      throw new Error(`agent exited (${exited}) during start: ${JSON.stringify(logs.slice(-5))}`);
    }
    if (metricsUrl) {
      try {
        await client.version(1000);
        break;
      } catch {
        // socket not up yet
      }
    }
    if (Date.now() > deadline) {
      proc.kill('SIGKILL');
      throw new Error(`agent did not start in time: ${JSON.stringify(logs.slice(-5))}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }

  const handle: AgentHandle = {
    proc,
    pid: proc.pid as number,
    socket,
    shimSocket: shimSocketBeside(socket),
    metricsUrl,
    logs,
    expectLogs: checked.expect,
    client,
    waitForStatuses: (pred, timeoutMs = 15_000) => pollStatuses(client, pred, timeoutMs, 100,
      (last) => `last statuses: ${JSON.stringify(last.map((s) => [s.podName, s.key.probeType, s.result, s.lastMessage]))}`),
    async http(path) {
      const res = await fetch(`${metricsUrl}${path}`);
      return { status: res.status, body: await res.text() };
    },
    stop(signal = 'SIGTERM', timeoutMs = 15_000) {
      client.close();
      if (exited !== undefined) return Promise.resolve(exited);
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => {
          proc.kill('SIGKILL');
          reject(new Error(`agent did not exit within ${timeoutMs} ms of ${signal}`));
        }, timeoutMs);
        exitWaiters.push((code) => {
          clearTimeout(timer);
          resolve(code);
        });
        proc.kill(signal);
      });
    },
  };
  return handle;
}
