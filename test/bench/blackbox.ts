/**
 * Path (e): Debian's prometheus-blackbox-exporter with a private config on a loopback port. It is
 * driven through its /probe endpoint, so each of its probes also pays for one HTTP request and a
 * metrics page: that is how Prometheus uses it, and the bench says so next to its numbers.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DOWN_SERVICE } from './mix.ts';

/** Where Debian installs the exporter. */
export const BLACKBOX_BIN = '/usr/bin/prometheus-blackbox-exporter';

/** Modules named in mix.ts; IPv4 only, no fallback, so it dials exactly what the agent dials. */
const CONFIG = `modules:
  tcp_connect:
    prober: tcp
    timeout: 2s
    tcp: { preferred_ip_protocol: ip4, ip_protocol_fallback: false }
  http_2xx:
    prober: http
    timeout: 2s
    http: { preferred_ip_protocol: ip4, ip_protocol_fallback: false }
  https_insecure:
    prober: http
    timeout: 2s
    http:
      preferred_ip_protocol: ip4
      ip_protocol_fallback: false
      tls_config: { insecure_skip_verify: true }
  grpc_plain:
    prober: grpc
    timeout: 2s
    grpc: { service: "", tls: false, preferred_ip_protocol: ip4, ip_protocol_fallback: false }
  grpc_plain_down:
    prober: grpc
    timeout: 2s
    grpc: { service: "${DOWN_SERVICE}", tls: false, preferred_ip_protocol: ip4, ip_protocol_fallback: false }
`;

/** A running exporter. */
export interface Blackbox {
  pid: number;
  /** http://127.0.0.1:<port> */
  url: string;
  stop(): Promise<void>;
}

/** A free loopback TCP port (bound and released; the caller binds it right after). */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address() as AddressInfo;
      s.close(() => resolve(port));
    });
  });
}

/** Starts the exporter and waits until /-/healthy answers. */
export async function startBlackbox(): Promise<Blackbox> {
  const dir = mkdtempSync(join(tmpdir(), 'probe-agent-bench-blackbox-'));
  const config = join(dir, 'blackbox.yml');
  writeFileSync(config, CONFIG);
  const port = await freePort();
  const child: ChildProcess = spawn(BLACKBOX_BIN, [`--config.file=${config}`, `--web.listen-address=127.0.0.1:${port}`, '--log.level=error'], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  child.stderr?.on('data', (d: Buffer) => { stderr = (stderr + d.toString()).slice(-4096); });
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  const url = `http://127.0.0.1:${port}`;
  const stop = async (): Promise<void> => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
    await exited;
    rmSync(dir, { recursive: true, force: true });
  };
  const deadline = Date.now() + 10_000;
  for (;;) {
    if (child.exitCode !== null) {
      await stop();
      throw new Error(`blackbox exporter exited at start: ${stderr.trim()}`);
    }
    try {
      const res = await fetch(`${url}/-/healthy`, { signal: AbortSignal.timeout(1000) });
      if (res.ok) break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) {
      await stop();
      throw new Error(`blackbox exporter did not become healthy within 10 s: ${stderr.trim()}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  return { pid: child.pid as number, url, stop };
}
