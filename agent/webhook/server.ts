/**
 * The mutating admission webhook server: HTTPS, AdmissionReview v1 in, JSONPatch out, /healthz.
 * Bounded: the time a connection gets for its TLS handshake and headers, then for its body (408
 * beyond); request bodies (refused on their declared length, cut off while streaming); the
 * requests reading their bodies and the bytes they hold (the longest waiting, once past a short
 * grace, is cut for a newcomer: reading-set.ts); the reviews decided at once and their bytes, a slot taken only once a whole
 * body has arrived (429 with Retry-After beyond: load-shedder.ts); the connections, in pools where a
 * newcomer evicts the oldest of the largest holder, and a source holding its share of the handshakes
 * is refused before TLS (connection-gate.ts). So clients
 * that send slowly hold no review slot, and cannot keep the API server's reviews out. With a client CA
 * only a verified caller is answered on the admission paths and /metrics (client-auth.ts), an
 * unverified one is refused before its body is read, and only verified callers hold connections
 * past one answer. Every request gets an answer and no request can stop the server.
 */
import { createServer, type Server } from 'node:https';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import type { TLSSocket } from 'node:tls';
import { ConfigError, describeError } from '../errors.ts';
import { silentLogger, type Logger } from '../log.ts';
import { admit, AdmissionRequestError, MUTATE_ANNOTATED_PATH, MUTATE_GATES_PATH, MUTATE_PATH, type AdmissionContext, type OptInMode } from './admission.ts';
import { WebhookMetrics, type RequestOutcome, type SlowReason } from './metrics.ts';
import { loadTlsPair, TlsFileWatcher } from './tls-files.ts';
import {
  DEFAULT_BODY_TIMEOUT_MS,
  DEFAULT_HEADERS_TIMEOUT_MS,
  DEFAULT_MAX_CONCURRENT_REQUESTS,
  DEFAULT_MAX_CONNECTIONS,
  DEFAULT_MAX_HANDSHAKES,
  DEFAULT_MAX_UNVERIFIED_CONNECTIONS,
  DEFAULT_MAX_INFLIGHT_BYTES,
  DEFAULT_MAX_READING_REQUESTS,
  DEFAULT_READING_GRACE_MS,
  DEFAULT_MAX_REQUEST_BYTES,
  DEFAULT_TLS_RELOAD_INTERVAL_MS,
  SHED_RETRY_AFTER_SECONDS,
} from './defaults.ts';
import { LoadShedder } from './load-shedder.ts';
import { readBoundedBody, type BodyShortfall, type ReadCut } from './request-body.ts';
import { ReadingSet } from './reading-set.ts';
import { patientTimeout } from './patient-timer.ts';
import { callerRefusal, callerVerified, clientAuthTlsOptions, loadClientCa } from './client-auth.ts';
import { startWebhookMetricsListener, type WebhookMetricsListener } from './metrics-listener.ts';
import { ConnectionPool } from './connection-gate.ts';

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
  /**
   * Connections past TLS (default DEFAULT_MAX_CONNECTIONS): with a client CA, those of verified
   * callers; a newcomer evicts the oldest of the source holding the most (connection-gate.ts).
   */
  maxConnections?: number;
  /** Connections in their TLS handshake (default DEFAULT_MAX_HANDSHAKES), evicted the same way. */
  maxHandshakes?: number;
  /** With a client CA: connections past TLS of unverified callers (default DEFAULT_MAX_UNVERIFIED_CONNECTIONS). */
  maxUnverifiedConnections?: number;
  /** Time for the TLS handshake, and again for the request headers (default DEFAULT_HEADERS_TIMEOUT_MS). */
  headersTimeoutMs?: number;
  /** Time for the body once the headers are in (default DEFAULT_BODY_TIMEOUT_MS); 408 beyond. */
  bodyTimeoutMs?: number;
  /** Requests reading their bodies at once (default the larger of DEFAULT_MAX_READING_REQUESTS and 4 per review slot). */
  maxReadingRequests?: number;
  /** How long a request may read its body before it can be cut for a newcomer (default DEFAULT_READING_GRACE_MS). */
  readingGraceMs?: number;
  log?: Logger;
  /** The cluster reads and choices the admission uses (admission.ts). */
  admission?: AdmissionContext;
}

export interface WebhookServer {
  readonly port: number;
  readonly host: string;
  /** The metrics listener's port, when there is one. */
  readonly metricsPort: number | undefined;
  /** Its metrics, for what runs beside it (the gates lease controller). */
  readonly metrics: WebhookMetrics;
  /** Re-reads the TLS files now (the poller does it on its own). */
  reloadTls(): boolean;
  close(): Promise<void>;
}

const ROUTES: Record<string, OptInMode> = { [MUTATE_PATH]: 'all', [MUTATE_ANNOTATED_PATH]: 'annotated', [MUTATE_GATES_PATH]: 'gates' };

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
  const headersTimeoutMs = opts.headersTimeoutMs ?? DEFAULT_HEADERS_TIMEOUT_MS;
  const bodyTimeoutMs = opts.bodyTimeoutMs ?? DEFAULT_BODY_TIMEOUT_MS;
  const reading = new ReadingSet({
    maxRequests: opts.maxReadingRequests ?? Math.max(DEFAULT_MAX_READING_REQUESTS, 4 * shedder.limits.maxConcurrent),
    // One budget for every body the server holds, read or being read.
    maxBytes: shedder.limits.maxInflightBytes,
    heldElsewhere: () => shedder.inFlightBytes,
    graceMs: opts.readingGraceMs ?? DEFAULT_READING_GRACE_MS,
  });
  const ctx: Ctx = {
    maxBytes, log, metrics, shedder, reading, bodyTimeoutMs, slowLog: new SlowClientLog(log),
    verifyCaller: clientCa !== undefined, admission: opts.admission ?? {},
  };
  const tlsOptions = { minVersion: 'TLSv1.2' as const, ...clientAuthTlsOptions(clientCa) };
  const server: Server = createServer({
    ...loadTlsPair(opts.certFile, opts.keyFile), ...tlsOptions,
    // Node's own handshake timer (default 120 s) is off: gateConnections() below does not count the
    // time the server itself was stalled.
    handshakeTimeout: 0,
    // Node enforces headersTimeout and requestTimeout on this tick (default 30 s, so a 2 s limit could take 32 s).
    connectionsCheckingInterval: Math.min(250, headersTimeoutMs),
    headersTimeout: headersTimeoutMs,
    // The body has its own timer (readBody); this is the backstop for the whole request.
    requestTimeout: headersTimeoutMs + bodyTimeoutMs + 1000,
  }, (req, res) => {
    handle(req, res, ctx).catch((err: unknown) => {
      log.error('webhook request failed', { error: describeError(err) });
      if (!res.headersSent) reply(res, 500, 'text/plain', `internal error: ${describeError(err)}\n`);
      else res.destroy();
    });
  });
  // One source may hold a quarter of a shared pool; the verified pool is the API servers' alone.
  const shared = (max: number): ConnectionPool => new ConnectionPool({ max, perSource: Math.max(1, Math.floor(max / 4)) });
  const maxConnections = opts.maxConnections ?? DEFAULT_MAX_CONNECTIONS;
  gateConnections(server, {
    handshakes: shared(opts.maxHandshakes ?? DEFAULT_MAX_HANDSHAKES),
    verified: clientCa ? new ConnectionPool({ max: maxConnections, perSource: maxConnections }) : undefined,
    other: shared(clientCa ? opts.maxUnverifiedConnections ?? DEFAULT_MAX_UNVERIFIED_CONNECTIONS : maxConnections),
  }, headersTimeoutMs, (remote) => ctx.slowLog.cut('handshake-timeout', remote, metrics), (pool) => metrics.connectionEvicted(pool), () => metrics.connectionRefused());
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
  if (!ctx.verifyCaller) {
    log.warn('admission callers are not verified (no --client-ca-file): anything that reaches this port can send reviews; give the API server an admission client certificate (docs/deploy.md, "The API server\'s client certificate")');
  }
  const address = server.address() as AddressInfo;
  log.info('webhook listening', {
    address: address.address, port: address.port, verifyCaller: ctx.verifyCaller,
    maxConcurrentRequests: shedder.limits.maxConcurrent, maxInflightBytes: shedder.limits.maxInflightBytes,
    maxReadingRequests: reading.limits.maxRequests, headersTimeoutMs, bodyTimeoutMs,
  });
  return {
    port: address.port,
    host: address.address,
    metricsPort: metricsListener?.port,
    metrics,
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

/**
 * A handshake this old is stalled: the API server's take milliseconds. A source at its share evicts
 * its own oldest only past it (ConnectionPool.admit), which bounds the TLS sockets a reconnect loop
 * makes the server build and tear down.
 */
const STALLED_HANDSHAKE_MS = 1000;

/** The connection pools (connection-gate.ts); `verified` only with a client CA. */
interface Pools {
  handshakes: ConnectionPool;
  verified: ConnectionPool | undefined;
  other: ConnectionPool;
}
export type PoolName = 'handshake' | 'verified' | 'other';

/** The address a peer is counted by (an IPv4 peer on a dual-stack socket is one source either way). */
function sourceOf(socket: { remoteAddress?: string | undefined }): string {
  const a = socket.remoteAddress ?? '?';
  return a.startsWith('::ffff:') ? a.slice(7) : a;
}

/**
 * Puts every connection in its pool: the handshaking one from TCP accept until its TLS handshake is
 * done, or it is closed after `handshakeMs` of this process's unstalled time (patient-timer.ts);
 * then the verified or the other one. The raw socket and its TLS socket are one TCP connection:
 * the peer's address and port name both.
 */
function gateConnections(
  server: Server, pools: Pools, handshakeMs: number,
  onTimeout: (remote: string | undefined) => void, onEvict: (pool: PoolName) => void, onRefuse: () => void,
): void {
  const pending = new Map<string, () => void>();
  const key = (s: { remoteAddress?: string | undefined; remotePort?: number | undefined }): string => `${s.remoteAddress}|${s.remotePort}`;
  // The TLS layer wraps each accepted socket in its own 'connection' listener; running it only for an
  // admitted connection is what makes a refusal cost no TLS state.
  const wrapTls = server.listeners('connection') as Array<(socket: Socket) => void>;
  if (wrapTls.length === 0) throw new Error('the HTTPS server has no TLS connection listener to gate');
  server.removeAllListeners('connection');
  server.on('connection', (socket: Socket) => {
    const k = key(socket);
    const leave = pools.handshakes.admit(sourceOf(socket), () => {
      onEvict('handshake');
      socket.destroy();
    }, STALLED_HANDSHAKE_MS);
    if (!leave) {
      onRefuse();
      socket.destroy();
      return;
    }
    for (const listener of wrapTls) listener.call(server, socket);
    const cancel = patientTimeout(handshakeMs, () => {
      done();
      if (socket.destroyed) return;
      onTimeout(socket.remoteAddress);
      socket.destroy();
    });
    const done = (): void => {
      if (pending.get(k) === done) pending.delete(k);
      cancel();
      leave();
    };
    pending.set(k, done);
    socket.once('close', done);
  });
  server.on('secureConnection', (tls: TLSSocket) => {
    pending.get(key(tls))?.();
    const verified = pools.verified !== undefined && tls.authorized;
    const pool = verified ? pools.verified! : pools.other;
    const leave = pool.add(sourceOf(tls), () => {
      onEvict(verified ? 'verified' : 'other');
      tls.destroy();
    });
    tls.once('close', leave);
  });
}

/** What every request handler shares. */
interface Ctx {
  maxBytes: number;
  log: Logger;
  metrics: WebhookMetrics;
  shedder: LoadShedder;
  /** The requests reading their bodies, before they take a slot of `shedder`. */
  reading: ReadingSet;
  bodyTimeoutMs: number;
  slowLog: SlowClientLog;
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

/** How long a refused request's remaining body is read and dropped before the answer (then it is cut). */
const DISCARD_MS = 500;

/** Reads and drops the rest of a request's body (no buffer), until it ends or DISCARD_MS passed. */
function discardRest(req: IncomingMessage): Promise<void> {
  if (req.complete || req.destroyed) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(finish, DISCARD_MS);
    function finish(): void {
      clearTimeout(timer);
      req.off('end', finish).off('close', finish);
      resolve();
    }
    req.once('end', finish).once('close', finish);
    req.resume();
  });
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
  // Only verified callers keep a connection: another one is not held open beyond its answer.
  if (ctx.verifyCaller && !callerVerified(req)) res.setHeader('connection', 'close');
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
  const read = await readBody(req, ctx, declared);
  if ('shortfall' in read) {
    if (read.shortfall === 'too-large') return tooLarge();
    const retry = { 'retry-after': String(SHED_RETRY_AFTER_SECONDS) };
    // 429 with Retry-After, which the API server retries within its timeoutSeconds: a review of its
    // own caught here (in a burst of large reviews, or the longest arriving when a flood came) gets
    // another try. Answered once the rest of the body is discarded (or after a moment): closing a
    // connection with unread bytes resets it, and the client could lose the answer.
    if (read.shortfall === 'over-budget' || read.shortfall === 'arriving') {
      const reason = read.shortfall === 'over-budget' ? 'bytes' : 'arriving';
      done('overloaded');
      metrics.shed(reason);
      await discardRest(req);
      replyAndClose(res, 429, `too many admission requests in flight (${reason}); retry\n`, retry);
      return;
    }
    done(read.shortfall === 'timeout' || read.shortfall === 'evicted' ? 'slow' : 'bad-request');
    if (read.shortfall === 'length-mismatch') replyAndClose(res, 400, 'request body does not match its content-length\n');
    else if (read.shortfall === 'timeout') replyAndClose(res, 408, `request body not received within ${ctx.bodyTimeoutMs} ms\n`);
    else if (read.shortfall === 'evicted') {
      await discardRest(req);
      replyAndClose(res, 429, 'request body not whole yet: cut to make room for newer requests; retry\n', retry);
    } else res.destroy();
    return;
  }
  // Only now, with the whole body in hand, does the review take a slot.
  const admitted = shedder.tryAdmit(read.body.length);
  if ('shed' in admitted) {
    done('overloaded');
    metrics.shed(admitted.shed);
    replyAndClose(res, 429, `too many admission requests in flight (${admitted.shed}); retry\n`, { 'retry-after': String(SHED_RETRY_AFTER_SECONDS) });
    return;
  }
  metrics.setInFlight(shedder.inFlight, shedder.inFlightBytes);
  try {
    await answerReview(read.body, res, ctx, path, mode, done);
  } finally {
    admitted.release();
    metrics.setInFlight(shedder.inFlight, shedder.inFlightBytes);
  }
}

/**
 * Reads the body as one of the bounded set of requests reading theirs: within the body timeout,
 * and cut early when newer requests need the room (reading-set.ts).
 */
async function readBody(req: IncomingMessage, ctx: Ctx, declared: number | undefined): Promise<{ body: Buffer } | { shortfall: BodyShortfall | 'arriving' }> {
  const { reading, metrics } = ctx;
  const abort = new AbortController();
  const cut = (reason: ReadCut): void => {
    ctx.slowLog.cut(reason === 'timeout' ? 'body-timeout' : 'evicted', req.socket.remoteAddress, metrics);
    abort.abort(reason);
  };
  const ticket = reading.enter(() => cut('evicted'));
  if (!ticket) return { shortfall: 'arriving' };
  let settled = false;
  // Time the server itself was stalled (deciding a large review) is not held against the client.
  const cancelTimer = patientTimeout(ctx.bodyTimeoutMs, () => {
    if (abort.signal.aborted || settled) return;
    ticket.leave();
    cut('timeout');
  });
  metrics.setReading(reading.size, reading.bytes);
  try {
    return await readBoundedBody(req, ctx.maxBytes, declared, {
      signal: abort.signal,
      grow: (bytes) => {
        const ok = ticket.grow(bytes);
        metrics.setReading(reading.size, reading.bytes);
        return ok;
      },
    });
  } finally {
    settled = true;
    cancelTimer();
    ticket.leave();
    metrics.setReading(reading.size, reading.bytes);
  }
}

/** Decides and answers one admitted review. */
async function answerReview(
  raw: Buffer,
  res: ServerResponse,
  ctx: Ctx,
  path: string,
  mode: OptInMode,
  done: (outcome: RequestOutcome) => void,
): Promise<void> {
  const { log, admission } = ctx;
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
    body = undefined;
    const r = review.response;
    log.debug('admission', { uid: r.uid, path, outcome, remote: res.socket?.remoteAddress, ...(detail ? { detail } : {}) });
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

/**
 * Counts slow clients cut and says so in the log: each at debug, and at most one warning a
 * minute with what was cut since the last one (a flood of slow clients is one line a minute).
 */
class SlowClientLog {
  static readonly WARN_EVERY_MS = 60_000;
  readonly #log: Logger;
  #since: Record<SlowReason, number> = { 'handshake-timeout': 0, 'body-timeout': 0, evicted: 0 };
  #lastWarn = -Infinity;

  constructor(log: Logger) {
    this.#log = log;
  }

  cut(reason: SlowReason, remote: string | undefined, metrics: WebhookMetrics): void {
    metrics.slow(reason);
    this.#since[reason]++;
    this.#log.debug('slow admission client cut', { reason, remote });
    const now = performance.now();
    if (now - this.#lastWarn < SlowClientLog.WARN_EVERY_MS) return;
    this.#lastWarn = now;
    this.#log.warn('slow admission clients cut', { ...this.#since, lastRemote: remote });
    this.#since = { 'handshake-timeout': 0, 'body-timeout': 0, evicted: 0 };
  }
}
