/**
 * The metrics/health HTTP listener: /metrics, /metrics/probes, /healthz, /livez, /readyz (plus
 * /<endpoint>/<check>). GET and HEAD only; request bodies are never read; headers, request time,
 * connections and concurrent requests are all bounded. Binds to loopback by default: nothing is
 * reachable from pods unless the operator picks another address.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { promisify } from 'node:util';
import { gzip as gzipCb } from 'node:zlib';
import type { Registry } from 'prom-client';
import { ConfigError, describeError } from '../errors.ts';
import { DEFAULT_METRICS_ADDRESS, parseListenAddress } from '../config/listen-address.ts';
import { silentLogger, type Logger } from '../log.ts';
import type { HealthKind, HealthRegistry, HealthReport } from './health.ts';
import { readShimMetrics } from './shim-relay.ts';

const gzip = promisify(gzipCb);

// Default listen address: loopback, so pods cannot reach it; 9809 sits next to the CSI
// livenessprobe's 9808 and is not a kubelet/kube-proxy port. Prometheus scrapes it through
// hostNetwork (or the operator sets --metrics-address to the node IP).
export { DEFAULT_METRICS_ADDRESS, parseListenAddress } from '../config/listen-address.ts';

/** What startMetricsServer needs. */
export interface MetricsServerOptions {
  /**
   * host:port, [v6]:port, or :port (all interfaces: an explicit operator choice), or the already
   * parsed {host, port} (host '' = all interfaces). Default 127.0.0.1:9809.
   */
  address?: string | { host: string; port: number };
  registry: Registry;
  /** Served on /metrics/probes; absent = 404 there. */
  probesRegistry?: Registry;
  health: HealthRegistry;
  log?: Logger;
  /** Concurrent requests being answered; more get 503 (default 16). */
  maxConcurrent?: number;
  /** Open connections (default 64). */
  maxConnections?: number;
  /** The kubelet shim's metrics socket, relayed at /metrics/shim; absent = 404 there. */
  shimMetricsSocket?: string;
  /**
   * Serve only /healthz, /livez and /readyz (the health listener that kubelet and the close-hole
   * sidecar use, on an address no pod can reach): its connections are its own, so a flood of the
   * metrics listener cannot fail the agent's health.
   */
  healthOnly?: boolean;
}

/** A running listener. */
export interface MetricsServer {
  /** The bound host (as given, or the wildcard). */
  readonly host: string;
  /** The bound port (useful with port 0). */
  readonly port: number;
  /** http://host:port base URL. */
  readonly url: string;
  /** Stops accepting, lets in-flight requests finish (max 2 s), then drops connections. */
  close(): Promise<void>;
}

/** Starts the listener; rejects with ConfigError when the address cannot be bound. */
export async function startMetricsServer(opts: MetricsServerOptions): Promise<MetricsServer> {
  const given = opts.address ?? DEFAULT_METRICS_ADDRESS;
  const { host, port } = typeof given === 'string' ? parseListenAddress(given, 'metrics address') : given;
  const shown = typeof given === 'string' ? given : `${host.includes(':') ? `[${host}]` : host}:${port}`;
  const log = (opts.log ?? silentLogger).child({ component: opts.healthOnly ? 'health-http' : 'metrics-http' });
  const maxConcurrent = opts.maxConcurrent ?? 16;
  let active = 0;

  const server: Server = createServer(
    { maxHeaderSize: 8192, requestTimeout: 10_000, headersTimeout: 5_000, keepAliveTimeout: 5_000 },
    (req, res) => {
      if (active >= maxConcurrent) {
        send(req, res, 503, 'too many concurrent requests\n', { 'Retry-After': '1' });
        return;
      }
      active++;
      res.once('close', () => active--);
      handle(req, res, opts, log).catch((err: unknown) => {
        log.warn('metrics request failed', { path: pathOf(req), err });
        if (!res.headersSent) send(req, res, 500, 'internal error\n');
        else res.destroy();
      });
    },
  );
  server.maxConnections = opts.maxConnections ?? 64;
  server.maxRequestsPerSocket = 1000;
  server.on('clientError', (err: NodeJS.ErrnoException, socket) => {
    const status = err.code === 'HPE_HEADER_OVERFLOW' ? '431 Request Header Fields Too Large'
      : err.code === 'ERR_HTTP_REQUEST_TIMEOUT' ? '408 Request Timeout'
      : '400 Bad Request';
    if (socket.writable) socket.end(`HTTP/1.1 ${status}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n`);
    else socket.destroy();
  });

  await new Promise<void>((resolve, reject) => {
    const onError = (err: NodeJS.ErrnoException) => {
      reject(new ConfigError(`metrics listener on ${shown}: ${describeError(err)}`, { code: err.code }));
    };
    server.once('error', onError);
    server.listen({ host: host === '' ? undefined : host, port }, () => {
      server.off('error', onError);
      resolve();
    });
  });
  server.on('error', (err) => log.error('metrics listener error', { err }));
  const bound = server.address() as AddressInfo;
  const urlHost = bound.family === 'IPv6' ? `[${bound.address}]` : bound.address;
  log.info(opts.healthOnly ? 'health listener started' : 'metrics listener started', { address: `${urlHost}:${bound.port}` });

  return {
    host: bound.address,
    port: bound.port,
    url: `http://${urlHost}:${bound.port}`,
    close: () =>
      new Promise<void>((resolve) => {
        const force = setTimeout(() => server.closeAllConnections(), 2000);
        force.unref();
        server.close(() => {
          clearTimeout(force);
          resolve();
        });
        server.closeIdleConnections();
      }),
  };
}

async function handle(req: IncomingMessage, res: ServerResponse, opts: MetricsServerOptions, log: Logger): Promise<void> {
  if (req.method !== 'GET' && req.method !== 'HEAD') {
    send(req, res, 405, 'method not allowed\n', { Allow: 'GET, HEAD' });
    return;
  }
  const [path = '/', query = ''] = (req.url ?? '/').split('?', 2);
  const params = new URLSearchParams(query);

  if (opts.healthOnly && !/^\/(healthz|livez|readyz)(\/|$)/.test(path)) {
    send(req, res, 404, path === '/' ? 'probe-agent health\n/healthz\n/livez\n/readyz\n' : 'not found\n');
    return;
  }

  if (path === '/metrics' || (path === '/metrics/probes' && opts.probesRegistry)) {
    const registry = path === '/metrics' ? opts.registry : (opts.probesRegistry as Registry);
    let body: string;
    try {
      body = await registry.metrics();
    } catch (err) {
      log.warn('collecting metrics failed', { err });
      send(req, res, 500, `error collecting metrics: ${describeError(err)}\n`);
      return;
    }
    await sendMaybeGzip(req, res, 200, body, registry.contentType);
    return;
  }

  if (path === '/metrics/shim' && opts.shimMetricsSocket) {
    try {
      const shim = await readShimMetrics(opts.shimMetricsSocket);
      await sendMaybeGzip(req, res, 200, shim.body, shim.contentType);
    } catch (err) {
      // 503, said plainly: Prometheus marks the target down (up == 0) and the alert on the shim fires.
      send(req, res, 503, `${describeError(err)}\n`);
    }
    return;
  }

  const hm = /^\/(healthz|livez|readyz)(?:\/([a-z0-9-]{1,63}))?$/.exec(path);
  if (hm) {
    const endpoint = hm[1] as 'healthz' | 'livez' | 'readyz';
    const kind: HealthKind = endpoint === 'readyz' ? 'readyz' : 'livez';
    if (hm[2] !== undefined) {
      const result = await opts.health.runOne(kind, hm[2]);
      if (!result) send(req, res, 404, `no ${endpoint} check named "${hm[2]}"\n`);
      else if (result.ok) send(req, res, 200, 'ok');
      else send(req, res, 500, `internal server error: ${result.reason}\n`);
      return;
    }
    const report = await opts.health.run(kind, params.getAll('exclude').slice(0, 32));
    const { status, body } = renderHealth(endpoint, report, params.has('verbose'));
    send(req, res, status, body);
    return;
  }

  if (path === '/') {
    send(req, res, 200, `probe-agent\n/metrics\n/metrics/probes\n${opts.shimMetricsSocket ? '/metrics/shim\n' : ''}/healthz\n/livez\n/readyz\n`);
    return;
  }
  send(req, res, 404, 'not found\n');
}

/**
 * Formats a health report as Kubernetes components do: "ok" when healthy and not verbose, else one
 * "[+]name ok" / "[-]name failed: reason" line per check. Non-verbose failures withhold the reason
 * (kube-apiserver does the same; the reasons are logged and shown with ?verbose).
 */
export function renderHealth(endpoint: string, report: HealthReport, verbose: boolean): { status: number; body: string } {
  if (report.ok && !verbose) return { status: 200, body: 'ok' };
  let body = '';
  for (const c of report.checks) {
    if (c.ok) body += `[+]${c.name} ok\n`;
    else body += `[-]${c.name} failed: ${verbose ? c.reason : 'reason withheld'}\n`;
  }
  for (const name of report.unknownExcludes) body += `warn: some health checks cannot be excluded: no matches for "${name}"\n`;
  body += report.ok ? `${endpoint} check passed\n` : `${endpoint} check failed\n`;
  return { status: report.ok ? 200 : 500, body };
}

function send(req: IncomingMessage, res: ServerResponse, status: number, body: string, headers: Record<string, string> = {}): void {
  const buf = Buffer.from(body, 'utf8');
  res.writeHead(status, {
    'Content-Type': 'text/plain; charset=utf-8',
    'X-Content-Type-Options': 'nosniff',
    'Content-Length': String(buf.length),
    ...closeIfBody(req),
    ...headers,
  });
  res.end(buf);
}

async function sendMaybeGzip(req: IncomingMessage, res: ServerResponse, status: number, body: string, contentType: string): Promise<void> {
  let buf = Buffer.from(body, 'utf8');
  const headers: Record<string, string> = { 'Content-Type': contentType, Vary: 'Accept-Encoding', ...closeIfBody(req) };
  if (buf.length > 4096 && /\bgzip\b/.test(String(req.headers['accept-encoding'] ?? ''))) {
    buf = await gzip(buf);
    headers['Content-Encoding'] = 'gzip';
  }
  headers['Content-Length'] = String(buf.length);
  res.writeHead(status, headers);
  res.end(buf);
}

/** A request with a body is answered without reading it; closing the connection discards the rest. */
function closeIfBody(req: IncomingMessage): Record<string, string> {
  const hasBody = req.headers['transfer-encoding'] !== undefined || Number(req.headers['content-length'] ?? 0) > 0;
  return hasBody ? { Connection: 'close' } : {};
}

function pathOf(req: IncomingMessage): string {
  return (req.url ?? '/').split('?', 1)[0]?.slice(0, 100) ?? '/';
}
