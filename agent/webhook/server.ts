/**
 * The mutating admission webhook server: HTTPS, AdmissionReview v1 in, JSONPatch out, /healthz.
 * Bounded: request bodies (refused on their declared length, cut off while streaming), the reviews
 * in flight and their bytes (429 with Retry-After beyond, before the body is read: load-shedder.ts),
 * the connections. With a client CA only a verified caller is answered on the admission paths and
 * /metrics (client-auth.ts). Every request gets an answer and no request can stop the server.
 */
import { createServer, type Server } from 'node:https';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { ConfigError, describeError } from '../errors.ts';
import { silentLogger, type Logger } from '../log.ts';
import { admit, AdmissionRequestError, MUTATE_ANNOTATED_PATH, MUTATE_PATH, type AdmissionContext, type OptInMode } from './admission.ts';
import { WebhookMetrics, type RequestOutcome } from './metrics.ts';
import { loadTlsPair, TlsFileWatcher } from './tls-files.ts';
import {
  DEFAULT_MAX_CONCURRENT_REQUESTS,
  DEFAULT_MAX_INFLIGHT_BYTES,
  DEFAULT_MAX_REQUEST_BYTES,
  DEFAULT_TLS_RELOAD_INTERVAL_MS,
  SHED_RETRY_AFTER_SECONDS,
} from './defaults.ts';
import { LoadShedder } from './load-shedder.ts';
import { readBoundedBody } from './request-body.ts';
import { callerRefusal, callerVerified, clientAuthTlsOptions, loadClientCa } from './client-auth.ts';
import { startWebhookMetricsListener, type WebhookMetricsListener } from './metrics-listener.ts';

export interface WebhookServerOptions {
  host: string;
  port: number;
  certFile: string;
  keyFile: string;
  tlsReloadIntervalMs?: number;
  maxRequestBytes?: number;
  /** AdmissionReviews admitted at once (default DEFAULT_MAX_CONCURRENT_REQUESTS); more get 429. */
  maxConcurrentRequests?: number;
  /** Request bytes the admitted reviews may hold together (default DEFAULT_MAX_INFLIGHT_BYTES); more get 429. */
  maxInflightBytes?: number;
  /** PEM CA that the caller's client certificate must verify against; absent = callers are not verified. */
  clientCaFile?: string;
  /** Plain-HTTP listener for GET /metrics alone; absent = none. */
  metricsListen?: { host: string; port: number };
  /** Open connections on the HTTPS port (default 256). */
  maxConnections?: number;
  log?: Logger;
  /** The cluster reads and choices the admission uses (admission.ts). */
  admission?: AdmissionContext;
}

export interface WebhookServer {
  readonly port: number;
  readonly host: string;
  /** The metrics listener's port, when there is one. */
  readonly metricsPort: number | undefined;
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
  const shedder = new LoadShedder({
    maxConcurrent: opts.maxConcurrentRequests ?? DEFAULT_MAX_CONCURRENT_REQUESTS,
    // One largest review must always fit.
    maxInflightBytes: Math.max(maxBytes, opts.maxInflightBytes ?? DEFAULT_MAX_INFLIGHT_BYTES),
  });
  const clientCa = opts.clientCaFile ? loadClientCa(opts.clientCaFile) : undefined;
  const ctx: Ctx = { maxBytes, log, metrics, shedder, verifyCaller: clientCa !== undefined, admission: opts.admission ?? {} };
  const tlsOptions = { minVersion: 'TLSv1.2' as const, ...clientAuthTlsOptions(clientCa) };
  const server: Server = createServer({ ...loadTlsPair(opts.certFile, opts.keyFile), ...tlsOptions }, (req, res) => {
    handle(req, res, ctx).catch((err: unknown) => {
      log.error('webhook request failed', { error: describeError(err) });
      if (!res.headersSent) reply(res, 500, 'text/plain', `internal error: ${describeError(err)}\n`);
      else res.destroy();
    });
  });
  // The API server gives up after the webhook's timeoutSeconds (at most 30 s); slow clients get no more.
  server.requestTimeout = 30_000;
  server.headersTimeout = 10_000;
  server.maxConnections = opts.maxConnections ?? 256;
  server.on('tlsClientError', (err) => log.debug('TLS handshake failed', { error: describeError(err) }));
  const watcher = new TlsFileWatcher(opts.certFile, opts.keyFile, (pair) => server.setSecureContext({ ...pair, ...tlsOptions }), log);
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port, opts.host || undefined, () => {
      server.off('error', reject);
      resolve();
    });
  });
  server.on('error', (err) => log.error('webhook server error', { error: describeError(err) }));
  let metricsListener: WebhookMetricsListener | undefined;
  if (opts.metricsListen) {
    try {
      metricsListener = await startWebhookMetricsListener(opts.metricsListen, metrics, log);
    } catch (err) {
      server.close();
      throw new ConfigError(`cannot listen for metrics on ${opts.metricsListen.host}:${opts.metricsListen.port}: ${describeError(err)}`);
    }
  }
  watcher.start(opts.tlsReloadIntervalMs ?? DEFAULT_TLS_RELOAD_INTERVAL_MS);
  const address = server.address() as AddressInfo;
  log.info('webhook listening', {
    address: address.address, port: address.port, verifyCaller: ctx.verifyCaller,
    maxConcurrentRequests: shedder.limits.maxConcurrent, maxInflightBytes: shedder.limits.maxInflightBytes,
  });
  return {
    port: address.port,
    host: address.address,
    metricsPort: metricsListener?.port,
    reloadTls: () => watcher.check(),
    close: async () => {
      watcher.stop();
      await metricsListener?.close();
      return new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeIdleConnections();
        setTimeout(() => server.closeAllConnections(), 2000).unref();
      });
    },
  };
}

/** What every request handler shares. */
interface Ctx {
  maxBytes: number;
  log: Logger;
  metrics: WebhookMetrics;
  shedder: LoadShedder;
  verifyCaller: boolean;
  /** What admission reads beyond the review (the API server, the loopback-host policy). */
  admission: AdmissionContext;
}

function reply(res: ServerResponse, status: number, type: string, body: string): void {
  res.writeHead(status, { 'content-type': type, 'content-length': Buffer.byteLength(body) });
  res.end(body);
}

/** Answers without reading the body: the connection closes after the answer, so the unread body costs nothing. */
function replyAndClose(res: ServerResponse, status: number, body: string, headers: Record<string, string> = {}): void {
  for (const [k, v] of Object.entries(headers)) res.setHeader(k, v);
  res.setHeader('connection', 'close');
  reply(res, status, 'text/plain', body);
}

/** The declared Content-Length, undefined when absent (chunked), NaN when malformed. */
function declaredLength(req: IncomingMessage): number | undefined {
  const raw = req.headers['content-length'];
  if (raw === undefined) return undefined;
  return /^\d{1,15}$/.test(raw) ? Number(raw) : NaN;
}

async function handle(req: IncomingMessage, res: ServerResponse, ctx: Ctx): Promise<void> {
  const { maxBytes, log, metrics, shedder } = ctx;
  const path = (req.url ?? '/').split('?')[0]!;
  if (path === '/healthz') {
    reply(res, 200, 'text/plain', 'ok\n');
    return;
  }
  if (path === '/metrics' && req.method === 'GET') {
    if (!ctx.verifyCaller) {
      replyAndClose(res, 403, '/metrics on the admission port needs a verified client certificate (--client-ca-file); or scrape --metrics-listen\n');
      return;
    }
    if (!callerVerified(req)) {
      replyAndClose(res, 403, `/metrics: ${callerRefusal(req)}\n`);
      return;
    }
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
  if (ctx.verifyCaller && !callerVerified(req)) {
    done('unauthorized');
    const why = callerRefusal(req);
    log.warn('admission request refused: caller not verified', { reason: why, remote: req.socket.remoteAddress });
    replyAndClose(res, 403, `caller not verified: ${why}\n`);
    return;
  }
  const declared = declaredLength(req);
  if (declared !== undefined && Number.isNaN(declared)) {
    done('bad-request');
    replyAndClose(res, 400, 'malformed content-length\n');
    return;
  }
  const tooLarge = (): void => {
    done('too-large');
    replyAndClose(res, 413, `request body larger than ${maxBytes} bytes\n`);
    log.warn('admission request refused: too large', { limit: maxBytes });
  };
  if (declared !== undefined && declared > maxBytes) return tooLarge();
  // Chunked bodies reserve the cap: their size is known only once read.
  const admitted = shedder.tryAdmit(declared ?? maxBytes);
  if ('shed' in admitted) {
    done('overloaded');
    metrics.shed(admitted.shed);
    replyAndClose(res, 429, `too many admission requests in flight (${admitted.shed}); retry\n`, { 'retry-after': String(SHED_RETRY_AFTER_SECONDS) });
    return;
  }
  metrics.setInFlight(shedder.inFlight, shedder.inFlightBytes);
  try {
    await answerReview(req, res, ctx, path, mode, declared, done, tooLarge);
  } finally {
    admitted.release();
    metrics.setInFlight(shedder.inFlight, shedder.inFlightBytes);
  }
}

/** Reads, decides and answers one admitted review. */
async function answerReview(
  req: IncomingMessage,
  res: ServerResponse,
  ctx: Ctx,
  path: string,
  mode: OptInMode,
  declared: number | undefined,
  done: (outcome: RequestOutcome) => void,
  tooLarge: () => void,
): Promise<void> {
  const { log, admission } = ctx;
  const read = await readBoundedBody(req, ctx.maxBytes, declared);
  if ('shortfall' in read) {
    if (read.shortfall === 'too-large') return tooLarge();
    done('bad-request');
    if (read.shortfall === 'length-mismatch') replyAndClose(res, 400, 'request body does not match its content-length\n');
    else res.destroy();
    return;
  }
  let body: unknown;
  try {
    body = JSON.parse(read.body.toString('utf8'));
  } catch (err) {
    reply(res, 400, 'text/plain', `request body is not JSON: ${describeError(err)}\n`);
    done('bad-request');
    return;
  }
  try {
    const { review, outcome, detail } = await admit(body, mode, admission);
    body = undefined;
    const r = review.response;
    log.debug('admission', { uid: r.uid, path, outcome, ...(detail ? { detail } : {}) });
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
