/**
 * Serves the shim's counters (GET /metrics, and GET /cri-clients: the calls of each open connection
 * on kubelet's socket, JSON) over HTTP on a root-only unix socket, and optionally on
 * a TCP address, apart from kubelet's CRI socket: scraping never touches kubelet's path. Bounded:
 * GET/HEAD only, no request body read, few connections, short timeouts.
 */
import * as http from 'node:http';
import * as net from 'node:net';
import { chmodSync, existsSync, lstatSync, mkdirSync, unlinkSync } from 'node:fs';
import path from 'node:path';
import { SHIM_RUN_DIR } from './flags.ts';
import type { ShimMetrics } from './metrics.ts';

/** What to serve and where. */
export interface ShimMetricsServerOptions {
  metrics: ShimMetrics;
  /** Unix socket path (directory 0700, socket 0600); '' serves none. */
  socketPath: string;
  /** Optional HOST:PORT ([v6]:PORT) for a TCP listener. */
  listen?: string;
}

/** A running metrics server. */
export interface ShimMetricsServer {
  /** The bound TCP port when `listen` was given. */
  readonly port: number | undefined;
  close(): Promise<void>;
}

/** Parses HOST:PORT or [v6]:PORT; throws with the flag's name when malformed. */
export function parseHostPort(text: string): { host: string; port: number } {
  const m = /^(?:\[([0-9a-fA-F:.]+)\]|([^:[\]]+)):(\d{1,5})$/.exec(text.trim());
  const port = m ? Number(m[3]) : NaN;
  if (!m || port > 65535) throw new Error(`--metrics-listen: invalid address "${text}" (want HOST:PORT, e.g. 127.0.0.1:9810)`);
  return { host: (m[1] ?? m[2])!, port };
}

function handler(metrics: ShimMetrics): http.RequestListener {
  return (req, res) => {
    const send = (status: number, body: string, type = 'text/plain; charset=utf-8'): void => {
      res.writeHead(status, { 'Content-Type': type, 'Content-Length': Buffer.byteLength(body), 'Cache-Control': 'no-store' });
      res.end(req.method === 'HEAD' ? undefined : body);
    };
    if (req.method !== 'GET' && req.method !== 'HEAD') return send(405, 'method not allowed\n');
    const url = (req.url ?? '/').split('?', 1)[0];
    // The installer reads it to prove that kubelet's calls reach the shim (install-shim.sh).
    if (url === '/cri-clients') return send(200, `${JSON.stringify({ clients: metrics.criClients() })}\n`, 'application/json');
    if (url !== '/metrics') return send(404, 'not found: try /metrics or /cri-clients\n');
    send(200, metrics.render(), 'text/plain; version=0.0.4; charset=utf-8');
  };
}

function bounded(h: http.RequestListener): http.Server {
  const s = http.createServer({ maxHeaderSize: 8192, requestTimeout: 5000, headersTimeout: 5000, keepAliveTimeout: 5000 }, h);
  s.maxConnections = 16;
  s.on('clientError', (_err, socket) => socket.destroy());
  return s;
}

function listenOn(server: http.Server, where: string | net.ListenOptions): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    const done = (): void => {
      server.off('error', reject);
      resolve();
    };
    if (typeof where === 'string') server.listen(where, done);
    else server.listen(where, done);
  });
}

/** Starts the listeners; rejects with a message naming the socket or address that failed. */
export async function startShimMetricsServer(opts: ShimMetricsServerOptions): Promise<ShimMetricsServer> {
  const servers: http.Server[] = [];
  let port: number | undefined;
  const socketPath = opts.socketPath;
  try {
    if (socketPath !== '') {
      const dir = path.dirname(socketPath);
      const created = !existsSync(dir);
      if (created) mkdirSync(dir, { recursive: !existsSync(path.dirname(dir)), mode: 0o700 });
      // Only root reads the shim's counters (the agent relays them): the shim's own directory is
      // 0700 even when something (systemd's RuntimeDirectory, the agent's hostPath mount) created it
      // first. A directory the operator named otherwise (say /tmp) is left as it is.
      if (created || path.resolve(dir) === SHIM_RUN_DIR) chmodSync(dir, 0o700);
      // A metrics socket is never kubelet's endpoint: a leftover one is simply replaced.
      try {
        if (lstatSync(socketPath).isSocket()) unlinkSync(socketPath);
      } catch {
        // not there
      }
      const s = bounded(handler(opts.metrics));
      await listenOn(s, socketPath).catch((err: Error) => {
        throw new Error(`metrics socket ${socketPath}: ${err.message}`);
      });
      chmodSync(socketPath, 0o600);
      servers.push(s);
    }
    if (opts.listen) {
      const { host, port: p } = parseHostPort(opts.listen);
      const s = bounded(handler(opts.metrics));
      await listenOn(s, { host, port: p }).catch((err: Error) => {
        throw new Error(`--metrics-listen ${opts.listen}: ${err.message}`);
      });
      port = (s.address() as net.AddressInfo).port;
      servers.push(s);
    }
  } catch (err) {
    for (const s of servers) s.close();
    throw err;
  }
  return {
    port,
    close: async () => {
      await Promise.all(servers.map((s) => new Promise<void>((r) => {
        s.close(() => r());
        s.closeAllConnections();
      })));
      if (socketPath !== '') {
        try {
          unlinkSync(socketPath);
        } catch {
          // already gone
        }
      }
    },
  };
}
