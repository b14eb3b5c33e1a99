/**
 * The webhook as a process of its own, listening on ports the kernel chose (`127.0.0.1:0`): a port
 * a test picks itself can be taken by another test's outgoing connection (the ephemeral range is
 * 32768-60999), and the webhook then exits before it listens.
 */
import { spawn, type ChildProcess, type SpawnOptions } from 'node:child_process';

export interface WebhookProcess {
  child: ChildProcess;
  port: number;
  /** Set when the webhook was given `--metrics-listen`. */
  metricsPort: number | undefined;
  stderr: () => string;
}

/** The port of the first log line with this message, text or JSON format. */
export function loggedPort(log: string, message: string): number | undefined {
  for (const line of log.split('\n')) {
    if (line.includes(`"${message}"`)) {
      const port = /\bport=(\d+)|"port":(\d+)/.exec(line);
      if (port) return Number(port[1] ?? port[2]);
    }
  }
  return undefined;
}

/**
 * Spawns `command args` (a webhook that logs at info level or below, its listen addresses with port
 * 0) and waits for its "webhook listening" line.
 */
export async function startWebhookProcess(command: string, args: string[], options: SpawnOptions = {}): Promise<WebhookProcess> {
  const child = spawn(command, args, { ...options, stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr!.on('data', (d) => (stderr += d));
  const deadline = Date.now() + 60_000;
  let port: number | undefined;
  while ((port = loggedPort(stderr, 'webhook listening')) === undefined) {
    if (child.exitCode !== null || child.signalCode !== null || Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(`webhook did not start (exit ${child.exitCode ?? child.signalCode ?? 'none, 60 s passed'}): ${stderr}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  return { child, port, metricsPort: loggedPort(stderr, 'webhook metrics listening'), stderr: () => stderr };
}
