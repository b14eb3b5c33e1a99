/**
 * Runs a kubelet shim as its own process through a CLI (`node <cli> shim ...`), as the host
 * service runs it, so a test can pair a shim of one release with an agent of another. Waits for
 * the shim's "shim listening" line; stderr is kept for failure messages. The shim writes only its
 * warn/error lines there: once the test file ends, any it wrote fails it unless listed in
 * `expectedLogs` / expectLogs() (log-check.ts).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { LogLines, trackLogs, type ExpectedLog, type LogRecord } from './log-check.ts';

/** A running shim process. */
export interface ShimProcess {
  proc: ChildProcess;
  /** The socket kubelet (the test) connects to. */
  listenPath: string;
  /** Everything the shim wrote to stderr so far. */
  stderr(): string;
  /** Its stderr as log records so far. */
  logs: LogRecord[];
  /** Adds warn/error lines a later step of the test provokes on purpose. */
  expectLogs(...more: ExpectedLog[]): void;
  /** SIGTERM, then SIGKILL after `timeoutMs`; resolves once it exited. */
  stop(timeoutMs?: number): Promise<void>;
}

/**
 * Starts `node <cli> shim` listening on `listenPath`, passing `args` (flags of that release);
 * `expectedLogs`: the warn/error lines the test provokes on purpose, each with why.
 */
export async function startShimProcess(cli: string, listenPath: string, args: string[], startTimeoutMs = 15_000, expectedLogs: ExpectedLog[] = []): Promise<ShimProcess> {
  const proc = spawn(process.execPath, [cli, 'shim', `--listen=unix://${listenPath}`, ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  let exited = false;
  const lines = new LogLines();
  const checked = trackLogs(`shim pid ${proc.pid} (${cli}, ${listenPath})`, lines.records, expectedLogs);
  proc.stderr!.setEncoding('utf8');
  proc.stderr!.on('data', (chunk: string) => void lines.push(chunk));
  const ready = new Promise<void>((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`shim ${cli} did not start in ${startTimeoutMs} ms: ${err.slice(-2000)}`)), startTimeoutMs);
    proc.stderr!.on('data', (chunk: string) => {
      err += chunk;
      if (err.includes('"msg":"shim listening"')) {
        clearTimeout(t);
        resolve();
      }
    });
    proc.once('exit', (code, signal) => {
      exited = true;
      clearTimeout(t);
      reject(new Error(`shim ${cli} exited (${code ?? signal}) during start: ${err.slice(-2000)}`));
    });
  });
  await ready;
  return {
    proc,
    listenPath,
    stderr: () => err,
    logs: lines.records,
    expectLogs: checked.expect,
    stop(timeoutMs = 10_000) {
      if (exited || proc.exitCode !== null) return Promise.resolve();
      return new Promise((resolve) => {
        const t = setTimeout(() => proc.kill('SIGKILL'), timeoutMs);
        proc.once('exit', () => {
          clearTimeout(t);
          resolve();
        });
        proc.kill('SIGTERM');
      });
    },
  };
}
