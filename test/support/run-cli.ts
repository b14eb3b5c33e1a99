/** Runs the built CLI (bin/probe-agent) as a user would: argv in, exit code and both streams out. */
import { execFile } from 'node:child_process';
import { builtCli } from './built-cli.ts';

export interface CliRun {
  code: number;
  stdout: string;
  stderr: string;
}

export function runCli(args: string[], opts: { timeoutMs?: number; env?: NodeJS.ProcessEnv } = {}): Promise<CliRun> {
  return new Promise((resolve) => {
    execFile(builtCli(), args, { timeout: opts.timeoutMs ?? 60_000, env: opts.env ?? process.env, maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
      const code = err ? (typeof (err as { code?: unknown }).code === 'number' ? (err as { code: number }).code : -1) : 0;
      resolve({ code, stdout, stderr });
    });
  });
}
