/**
 * Debian's docker-registry (distribution 2.8) on a loopback port, its storage in a scratch dir, for
 * `make e2e-critest`'s stand-in images. Plain HTTP, no auth; the packaged service is never used.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { closeSync, mkdirSync, openSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';

/** A running registry. */
export interface LocalRegistry {
  /** host:port */
  address: string;
  stop(): Promise<void>;
}

/** Starts docker-registry on 127.0.0.1:`port` with its data under `dir`; resolves once /v2/ answers. */
export async function startRegistry(dir: string, port: number, timeoutMs = 20_000): Promise<LocalRegistry> {
  mkdirSync(path.join(dir, 'data'), { recursive: true });
  const config = path.join(dir, 'config.yml');
  writeFileSync(config, [
    'version: 0.1',
    'log: {level: warn, accesslog: {disabled: true}}',
    `storage: {filesystem: {rootdirectory: ${path.join(dir, 'data')}}, delete: {enabled: true}}`,
    // A secret of its own, or the registry warns that it made one up.
    `http: {addr: "127.0.0.1:${port}", secret: ${randomBytes(16).toString('hex')}}`,
    '',
  ].join('\n'));
  const logFile = path.join(dir, 'registry.log');
  const fd = openSync(logFile, 'a');
  let child: ChildProcess;
  try {
    child = spawn('docker-registry', ['serve', config], { stdio: ['ignore', fd, fd] });
  } finally {
    closeSync(fd);
  }
  const address = `127.0.0.1:${port}`;
  const stop = async (): Promise<void> => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((r) => child.once('exit', () => r()));
    child.kill('SIGTERM');
    const t = setTimeout(() => child.kill('SIGKILL'), 5000);
    await exited;
    clearTimeout(t);
  };
  const end = Date.now() + timeoutMs;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`docker-registry exited (${child.exitCode}): ${readFileSync(logFile, 'utf8').slice(-1000)}`);
    try {
      const res = await fetch(`http://${address}/v2/`, { signal: AbortSignal.timeout(1000) });
      if (res.status === 200) return { address, stop };
    } catch {
      // not listening yet
    }
    if (Date.now() > end) {
      await stop();
      throw new Error(`docker-registry did not answer on ${address} within ${timeoutMs} ms: ${readFileSync(logFile, 'utf8').slice(-1000)}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}
