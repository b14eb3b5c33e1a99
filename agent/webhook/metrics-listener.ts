/**
 * The webhook's optional plain-HTTP metrics listener (--metrics-listen): GET /metrics only, on a
 * port of its own, so scraping needs neither the admission port nor a client certificate, and a
 * NetworkPolicy can open this port to the monitoring namespace alone. Bodies are never read;
 * connections, concurrent requests and request time are bounded.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { describeError } from '../errors.ts';
import type { Logger } from '../log.ts';
import type { WebhookMetrics } from './metrics.ts';

const MAX_CONNECTIONS = 16;
const MAX_CONCURRENT = 4;

/** A running metrics listener. */
export interface WebhookMetricsListener {
  readonly host: string;
  readonly port: number;
  close(): Promise<void>;
}

/** Starts the listener; rejects when the address cannot be bound. */
export async function startWebhookMetricsListener(address: { host: string; port: number }, metrics: WebhookMetrics, log: Logger): Promise<WebhookMetricsListener> {
  let busy = 0;
  const server: Server = createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    const send = (status: number, type: string, body: string): void => {
      res.writeHead(status, { 'content-type': type, 'content-length': Buffer.byteLength(body) });
      res.end(req.method === 'HEAD' ? undefined : body);
    };
    if (path !== '/metrics') return send(404, 'text/plain', 'this listener serves GET /metrics only\n');
    if (req.method !== 'GET' && req.method !== 'HEAD') return send(405, 'text/plain', '/metrics takes GET\n');
    if (busy >= MAX_CONCURRENT) return send(503, 'text/plain', 'busy\n');
    busy++;
    metrics.registry.metrics().then(
      (text) => send(200, metrics.registry.contentType, text),
      (err: unknown) => send(500, 'text/plain', `metrics failed: ${describeError(err)}\n`),
    ).finally(() => busy--);
  });
  server.maxConnections = MAX_CONNECTIONS;
  server.requestTimeout = 10_000;
  server.headersTimeout = 5_000;
  server.keepAliveTimeout = 5_000;
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(address.port, address.host || undefined, () => {
      server.off('error', reject);
      resolve();
    });
  });
  server.on('error', (err) => log.error('webhook metrics listener error', { error: describeError(err) }));
  const bound = server.address() as AddressInfo;
  log.info('webhook metrics listening', { address: bound.address, port: bound.port });
  return {
    host: bound.address,
    port: bound.port,
    close: () => new Promise<void>((resolve) => {
      server.close(() => resolve());
      server.closeAllConnections();
    }),
  };
}
