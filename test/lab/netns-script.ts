/**
 * Runs one of the lab's server scripts inside a netns (`ip netns exec <ns> node <script> ...`), waits
 * for its `ready <json>` line and stops it by closing its stdin (the scripts exit when stdin closes).
 */
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { createInterface } from 'node:readline';

/** A started script: the child, the JSON of its ready line, and how to stop it. */
export interface NetnsScript<Ready> {
  child: ChildProcessWithoutNullStreams;
  ready: Ready;
  /** Closes its stdin (it exits), then SIGKILL after 2 s; resolves once it is gone. Idempotent. */
  stop(): Promise<void>;
}

/**
 * Starts `script` with `args` in `netnsName` and resolves once it prints `ready <json>`; rejects,
 * naming it `what` and with its stderr's tail, if it exits first or is not ready in `readyTimeoutMs`.
 * Every other stdout line goes to `onLine`.
 */
export async function startNetnsScript<Ready>(
  what: string,
  netnsName: string,
  script: string,
  args: string[],
  readyTimeoutMs: number,
  onLine: (line: string) => void = () => {},
): Promise<NetnsScript<Ready>> {
  const child = spawn('ip', ['netns', 'exec', netnsName, process.execPath, script, ...args]);
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr = (stderr + d.toString()).slice(-4096)));
  child.stdin.on('error', () => {});
  const exited = new Promise<void>((resolve) => child.once('close', () => resolve()));
  const ready = await new Promise<Ready>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${what} not ready in ${readyTimeoutMs / 1000} s: ${stderr}`)), readyTimeoutMs);
    createInterface({ input: child.stdout }).on('line', (line) => {
      if (!line.startsWith('ready ')) return onLine(line);
      clearTimeout(timer);
      resolve(JSON.parse(line.slice(6)) as Ready);
    });
    void exited.then(() => {
      clearTimeout(timer);
      reject(new Error(`${what} exited before ready: ${stderr}`));
    });
  });
  return {
    child,
    ready,
    stop: async () => {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.stdin.end();
      const kill = setTimeout(() => child.kill('SIGKILL'), 2000);
      await exited;
      clearTimeout(kill);
    },
  };
}
