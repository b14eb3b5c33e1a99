/**
 * The mutating admission webhook server: HTTPS, AdmissionReview v1 in, JSONPatch out, /healthz.
 * Request bodies are bounded; every request gets an answer and no request can stop the server.
 */
import { createServer, type Server } from 'node:https';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { describeError } from '../errors.ts';
import { silentLogger, type Logger } from '../log.ts';
import { admit, AdmissionRequestError, MUTATE_ANNOTATED_PATH, MUTATE_PATH, type AdmissionContext, type OptInMode } from './admission.ts';
import { WebhookMetrics, type RequestOutcome } from './metrics.ts';
import { loadTlsPair, TlsFileWatcher } from './tls-files.ts';
import { DEFAULT_MAX_REQUEST_BYTES, DEFAULT_TLS_RELOAD_INTERVAL_MS } from './defaults.ts';

export interface WebhookServerOptions {
  host: string;
  port: number;
  certFile: string;
  keyFile: string;
  tlsReloadIntervalMs?: number;
  maxRequestBytes?: number;
  log?: Logger;
  /** The cluster reads and choices the admission uses (admission.ts). */
  admission?: AdmissionContext;
}

export interface WebhookServer {
  readonly port: number;
  readonly host: string;
  /** Re-reads the TLS files now (the poller does it on its own). */
  reloadTls(): boolean;
  close(): Promise<void>;
}

const ROUTES: Record<string, OptInMode> = { [MUTATE_PATH]: 'all', [MUTATE_ANNOTATED_PATH]: 'annotated' };

/** Starts the webhook; rejects with ConfigError when the TLS files do not load or the address cannot be bound. */
export async function startWebhookServer(opts: WebhookServerOptions): Promise<WebhookServer> {
  const log = (opts.log ?? silentLogger).child({ component: 'webhook' });
  const maxBytes = opts.maxRequestBytes ?? DEFAULT_MAX_REQUEST_BYTES;
  const metrics = new WebhookMetrics();
  const server: Server = createServer({ ...loadTlsPair(opts.certFile, opts.keyFile), minVersion: 'TLSv1.2' }, (req, res) => {
    handle(req, res, maxBytes, log, metrics, opts.admission ?? {}).catch((err: unknown) => {
      log.error('webhook request failed', { error: describeError(err) });
      if (!res.headersSent) reply(res, 500, 'text/plain', `internal error: ${describeError(err)}\n`);
      else res.destroy();
    });
  });
  // The API server gives up after the webhook's timeoutSeconds (at most 30 s); slow clients get no more.
  server.requestTimeout = 30_000;
  server.headersTimeout = 10_000;
  server.on('tlsClientError', (err) => log.debug('TLS handshake failed', { error: describeError(err) }));
  const watcher = new TlsFileWatcher(opts.certFile, opts.keyFile, (pair) => server.setSecureContext({ ...pair, minVersion: 'TLSv1.2' }), log);
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port, opts.host || undefined, () => {
      server.off('error', reject);
      resolve();
    });
  });
  server.on('error', (err) => log.error('webhook server error', { error: describeError(err) }));
  watcher.start(opts.tlsReloadIntervalMs ?? DEFAULT_TLS_RELOAD_INTERVAL_MS);
  const address = server.address() as AddressInfo;
  log.info('webhook listening', { address: address.address, port: address.port });
  return {
    port: address.port,
    host: address.address,
    reloadTls: () => watcher.check(),
    close: () => {
      watcher.stop();
      return new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeIdleConnections();
        setTimeout(() => server.closeAllConnections(), 2000).unref();
      });
    },
  };
}

function reply(res: ServerResponse, status: number, type: string, body: string): void {
  res.writeHead(status, { 'content-type': type, 'content-length': Buffer.byteLength(body) });
  res.end(body);
}

async function handle(req: IncomingMessage, res: ServerResponse, maxBytes: number, log: Logger, metrics: WebhookMetrics, admission: AdmissionContext): Promise<void> {
  const path = (req.url ?? '/').split('?')[0]!;
  if (path === '/healthz') {
    reply(res, 200, 'text/plain', 'ok\n');
    return;
  }
  if (path === '/metrics' && req.method === 'GET') {
    reply(res, 200, metrics.registry.contentType, await metrics.registry.metrics());
    return;
  }
  const mode = ROUTES[path];
  if (!mode) {
    reply(res, 404, 'text/plain', `no such path ${path.slice(0, 64)}: want ${MUTATE_PATH}, ${MUTATE_ANNOTATED_PATH}, /healthz or /metrics\n`);
    return;
  }
  if (req.method !== 'POST') {
    res.setHeader('allow', 'POST');
    reply(res, 405, 'text/plain', `${path} takes POST\n`);
    return;
  }
  const started = process.hrtime.bigint();
  const done = (outcome: RequestOutcome): void => metrics.observe(path, outcome, Number(process.hrtime.bigint() - started) / 1e9);
  const tooLarge = (): void => {
    done('too-large');
    // Answer without reading the rest; the connection closes after the answer.
    res.setHeader('connection', 'close');
    reply(res, 413, 'text/plain', `request body larger than ${maxBytes} bytes\n`);
    log.warn('admission request refused: too large', { limit: maxBytes });
  };
  const declared = Number(req.headers['content-length'] ?? 0);
  if (declared > maxBytes) return tooLarge();
  const raw = await readBody(req, maxBytes);
  if (raw === null) return tooLarge();
  let body: unknown;
  try {
    body = JSON.parse(raw.toString('utf8'));
  } catch (err) {
    reply(res, 400, 'text/plain', `request body is not JSON: ${describeError(err)}\n`);
    done('bad-request');
    return;
  }
  try {
    const { review, outcome, detail } = await admit(body, mode, admission);
    const r = review.response;
    log.debug('admission', { uid: r.uid, outcome, ...(detail ? { detail } : {}) });
    if (outcome === 'refused') log.warn('pod not rewritten', { uid: r.uid, reason: detail });
    reply(res, 200, 'application/json', JSON.stringify(review));
    done(outcome);
  } catch (err) {
    if (!(err instanceof AdmissionRequestError)) {
      done('internal-error');
      throw err;
    }
    reply(res, 400, 'text/plain', `not an admission.k8s.io/v1 AdmissionReview: ${err.message}\n`);
    done('bad-request');
  }
}

/** The request body, or null as soon as it grows past `maxBytes` (reading then stops). */
function readBody(req: IncomingMessage, maxBytes: number): Promise<Buffer | null> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const onData = (chunk: Buffer): void => {
      size += chunk.length;
      if (size > maxBytes) {
        req.off('data', onData);
        req.pause();
        resolve(null);
        return;
      }
      chunks.push(chunk);
    };
    req.on('data', onData);
    req.once('end', () => resolve(Buffer.concat(chunks)));
    req.once('error', reject);
    // A client gone mid-body: nothing to answer, but settle so nothing waits forever.
    req.once('close', () => resolve(null));
  });
}
