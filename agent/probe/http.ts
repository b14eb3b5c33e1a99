/**
 * kubelet's HTTP probe (pkg/probe/http/http.go) over sockets we connect ourselves: one new connection
 * per request, "Connection: close", no proxy, no compression, TLS without verification, redirects
 * handled by hand with kubelet's same-hostname rule, a 10 KiB body cap and one deadline for it all.
 */
import { isIP } from 'node:net';
import { performance } from 'node:perf_hooks';
import { connect as tlsConnect, type TLSSocket } from 'node:tls';
import type { Socket } from 'node:net';
import { createRequire } from 'node:module';
import type { Client } from 'undici';
import { describeError } from '../errors.ts';
import { ConnectError, connectTo, type Deadline, type ProberResult } from './connect.ts';
import { MAX_BODY_BYTES, buildHeaderMap, buildProbeRequest, decideRedirect, type HeaderMap, type ProbeRequest, type RedirectDecision } from './http-request.ts';
import { joinHostPort, type TargetPlan } from './target.ts';
import type { FailureReason, HttpGetHandler } from './types.ts';

/** undici, loaded by the first HTTP probe: an agent without HTTP probes never carries it (about 10 MB RSS; issue 14). */
let undiciClient: typeof Client | undefined;
const lazyClient = (): typeof Client => (undiciClient ??= (createRequire(import.meta.url)('undici') as typeof import('undici')).Client);

/** Go's biggest response header block (MaxResponseHeaderBytes default is 1 MiB; undici's default is 16 KiB). */
const MAX_HEADER_BYTES = 64 * 1024;

/**
 * What a finished exchange destroys its client with. undici's close() ends in destroy() with a new
 * ClientDestroyedError; an error's stack trace (captured, then formatted by the stream machinery)
 * was a measurable share of an HTTP probe's CPU. Nobody sees this one: the request is over.
 */
const EXCHANGE_DONE: Error = stackless(() => new Error('probe exchange finished'));

/** Runs `make` with stack capture off: its errors cost nothing to create and format. */
function stackless<T>(make: () => T): T {
  const limit = Error.stackTraceLimit;
  Error.stackTraceLimit = 0;
  try {
    return make();
  } finally {
    Error.stackTraceLimit = limit;
  }
}

/**
 * Event handlers of `socket` run with stack capture off. undici builds an error on every response
 * that ends a "Connection: close" exchange (InformationalError 'reset', or SocketError 'closed')
 * inside the socket's events, and the stream code formats its stack at once: 60-90 us of CPU per
 * HTTP probe, for errors that are only ever read by code and message (mapHttpError).
 */
function withoutStackTraces<T extends Socket>(socket: T): T {
  const emit = socket.emit;
  socket.emit = function emitWithoutStackTraces(this: T, ...args: Parameters<T['emit']>): boolean {
    return stackless(() => emit.apply(this, args));
  } as T['emit'];
  return socket;
}

/** Go's maxBodySlurpSize: a followed redirect's body is drained this far, if small or of unknown length. */
export const REDIRECT_SLURP_BYTES = 2 * 1024;
/** Go's max1xxResponses: more informational responses than this before the final one is an error. */
export const MAX_1XX_RESPONSES = 5;

/** What a hop's response means for the chain (decided from status and Location before the body is read). */
export type Decide = (status: number, location: string | undefined) => RedirectDecision;

/** One hop's outcome: its status, the decision, and (for a response we use) the capped body or the error reading it. */
export interface HopResponse {
  status: number;
  decision: RedirectDecision;
  body: string;
  /** kubelet: ReadAtMost failed (not the cap): a prober error, thrown away. */
  bodyError?: HopError;
}

/** A hop that ended without a response; `kind` 'error' = we could not run it at all. */
export class HopError extends Error {
  readonly kind: 'failure' | 'error';
  readonly reason: FailureReason;
  constructor(kind: 'failure' | 'error', reason: FailureReason, message: string) {
    super(message);
    this.kind = kind;
    this.reason = reason;
  }
}

/** Runs kubelet's HTTP probe against `plan`; never throws. */
export async function probeHttp(handler: HttpGetHandler, plan: TargetPlan, deadline: Deadline, kubeVersion: string): Promise<ProberResult> {
  const initial = buildHeaderMap(handler.headers, kubeVersion);
  const first = buildProbeRequest(handler.scheme, plan.host, plan.port, handler.path, initial);
  const phases: ProberResult['phases'] = {};
  const end = await followRedirects(first, initial, plan, deadline, phases);
  const address = end.address;
  if (end.kind === 'hop-error') return { result: end.error.kind, reason: end.error.reason, message: end.error.message, address, phases };
  if (end.kind === 'client-error') return { result: 'failure', reason: end.reason, message: end.message, address, phases };
  const res = end.response;
  // kubelet: `return probe.Failure, "", err` -- a prober error, retried and then thrown away.
  if (res.bodyError) return { result: 'error', reason: res.bodyError.reason, message: res.bodyError.message, address, phases };
  if (res.status >= 200 && res.status < 300) return { result: 'success', message: res.body, address, phases };
  if (res.status >= 300 && res.status < 400) {
    return { result: 'warning', message: `Probe terminated redirects, Response body: ${res.body}`, address, phases };
  }
  // kubernetes#99425: a failure's message must never carry the body (it ends up in events).
  return { result: 'failure', reason: 'status', message: `HTTP probe failed with statuscode: ${res.status}`, address, phases };
}

/** How a redirect chain ended, with the address that answered or was tried last. */
export type RedirectChainEnd =
  | { kind: 'response'; response: HopResponse; address: string | undefined }
  | { kind: 'hop-error'; error: HopError; address: string | undefined }
  /** The redirect checker refused the chain (too many hops): Go's Client.Do error. */
  | { kind: 'client-error'; reason: FailureReason; message: string; address: string | undefined };

/** Go's Client.Do with kubelet's redirect checker: one exchange per hop until a response is used or the chain fails. */
export async function followRedirects(
  first: ProbeRequest,
  initial: HeaderMap,
  plan: TargetPlan,
  deadline: Deadline,
  phases: ProberResult['phases'],
): Promise<RedirectChainEnd> {
  let req = first;
  let address: string | undefined;
  for (let hops = 1; ; hops++) {
    let res: HopResponse;
    const current = req;
    const decide: Decide = (status, location) => decideRedirect(first, current, status, location, hops, initial);
    try {
      res = await exchange(req, plan, deadline, phases, (a) => (address = a), decide);
    } catch (err) {
      const error = err instanceof HopError ? err : new HopError('failure', 'other', `Get ${JSON.stringify(req.url)}: ${describeError(err)}`);
      return { kind: 'hop-error', error, address };
    }
    const decision = res.decision;
    if (decision.action === 'fail') return { kind: 'client-error', reason: decision.reason, message: decision.message, address };
    if (decision.action === 'use') return { kind: 'response', response: res, address };
    req = decision.next;
  }
}

/** One request on a new connection. Throws HopError with Go's wording. */
export async function exchange(
  req: ProbeRequest,
  plan: TargetPlan,
  deadline: Deadline,
  phases: ProberResult['phases'],
  setAddress: (a: string) => void,
  decide: Decide,
): Promise<HopResponse> {
  const prefix = `Get ${JSON.stringify(req.url)}`;
  const addresses = plan.ips.map((ip) => ({ ip, port: req.port }));
  let socket: Socket | undefined;
  let client: Client | undefined;
  let finished = false;
  try {
    const connected = await connectTo(addresses, plan, deadline).catch((err: unknown) => {
      if (err instanceof ConnectError) {
        setAddress(joinHostPort(err.address.ip, err.address.port));
        if (err.kind === 'error') throw new HopError('error', err.reason, err.detail);
        if (err.reason === 'timeout') throw timeoutError(prefix, deadline, 'headers');
        throw new HopError('failure', err.reason, `${prefix}: ${err.dialText}`);
      }
      throw err;
    });
    socket = connected.socket;
    setAddress(joinHostPort(connected.address.ip, connected.address.port));
    phases.helper = (phases.helper ?? 0) + connected.helperSeconds;
    phases.connect = (phases.connect ?? 0) + connected.connectSeconds;

    if (req.scheme === 'https') {
      const t0 = performance.now();
      socket = await startTls(socket, isIP(req.hostname) ? undefined : req.hostname, deadline, prefix);
      phases.tls = (phases.tls ?? 0) + (performance.now() - t0) / 1000;
    }

    const ready = skipInformational(withoutStackTraces(socket));
    client = new (lazyClient())(`${req.scheme}://${joinHostPort(req.hostname, req.port)}`, {
      // undici hangs when its connect callback runs synchronously: always hand the socket over on a later tick.
      connect: (_opts, cb) => void setImmediate(() => cb(null, ready)),
      pipelining: 1,
      headersTimeout: 0,
      bodyTimeout: 0,
      maxHeaderSize: MAX_HEADER_BYTES,
      allowH2: false,
    });
    const t1 = performance.now();
    const flat: string[] = [];
    for (const [k, v] of req.headers) flat.push(k, utf8OnTheWire(v));
    flat.unshift('Host', req.hostHeader);
    const res = await client.request({ path: req.pathAndQuery, method: 'GET', headers: flat, signal: deadline.signal, reset: true });
    phases.firstByte = (phases.firstByte ?? 0) + (performance.now() - t1) / 1000;
    const locationHeader = res.headers['location'];
    const location = Array.isArray(locationHeader) ? locationHeader[0] : locationHeader;
    const status = res.statusCode;
    const decision = decide(status, location);
    let body = '';
    let bodyError: HopError | undefined;
    if (decision.action === 'use') {
      // kubelet reads every final response's body (ReadAtMost 10 KiB), whatever the status.
      try {
        body = await readCapped(res.body, deadline, MAX_BODY_BYTES);
      } catch (err) {
        bodyError = bodyReadError(err, deadline);
      }
    } else if (decision.action === 'follow' || decision.reason === 'redirects') {
      // Go drains a redirect's body before the next request, only when small or of unknown length,
      // and ignores what goes wrong (a stall still uses up the deadline, as in Go).
      const length = contentLength(res.headers['content-length']);
      if (length === -1 || length <= REDIRECT_SLURP_BYTES) await readCapped(res.body, deadline, REDIRECT_SLURP_BYTES).catch(() => '');
      else discard(res.body);
    } else {
      discard(res.body);
    }
    finished = true;
    return bodyError ? { status, decision, body, bodyError } : { status, decision, body };
  } catch (err) {
    if (err instanceof HopError) throw err;
    throw mapHttpError(err, prefix, deadline);
  } finally {
    // A finished exchange has nothing in flight: destroying it with a ready-made error skips the
    // ClientDestroyedError that close() and destroy() build (and whose stack the streams format).
    if (finished) void client?.destroy(EXCHANGE_DONE).catch(() => {});
    else void client?.destroy().catch(() => {});
    // The socket goes either way, in case the client never took it.
    socket?.destroy();
  }
}

/**
 * Go writes a header value's UTF-8 bytes as they are; undici writes each character as one latin1
 * byte and refuses anything wider ("€" made every such probe fail). Handing undici the UTF-8 bytes
 * as latin1 characters puts exactly Go's bytes on the wire.
 */
function utf8OnTheWire(value: string): string {
  return /[^\u0000-\u007f]/.test(value) ? Buffer.from(value, 'utf8').toString('latin1') : value;
}

/** Reads at most `limit` bytes; more is not an error (kubelet logs it at V(4)). Rejects with the read error. */
async function readCapped(body: AsyncIterable<Buffer> & { destroy(): void }, _deadline: Deadline, limit: number): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  try {
    for await (const chunk of body) {
      const room = limit - size;
      chunks.push(chunk.length > room ? chunk.subarray(0, room) : chunk);
      size += Math.min(chunk.length, room);
      if (size >= limit) break;
    }
  } finally {
    discard(body);
  }
  return Buffer.concat(chunks).toString('utf8');
}

/** Destroys a body we are done with; undici's body emits an AbortError when destroyed unread, which must not crash the agent. */
function discard(body: { destroy(): void }): void {
  (body as unknown as NodeJS.EventEmitter).on('error', () => {});
  body.destroy();
}

/** Go's resp.ContentLength: -1 when absent or unparsable. */
function contentLength(header: string | string[] | undefined): number {
  const v = Array.isArray(header) ? header[0] : header;
  return v !== undefined && /^[0-9]+$/.test(v.trim()) ? Number(v.trim()) : -1;
}

/** A body read error in Go's words (the error kubelet's prober logs and throws away). */
function bodyReadError(err: unknown, deadline: Deadline): HopError {
  const why = deadline.why();
  if (why === 'timeout') return new HopError('error', 'timeout', 'context deadline exceeded (Client.Timeout or context cancellation while reading body)');
  if (why === 'aborted') return new HopError('error', 'other', 'probe aborted');
  const code = (err as NodeJS.ErrnoException | undefined)?.code ?? '';
  const message = describeError(err);
  if (code === 'ECONNRESET' || /ECONNRESET/.test(message)) return new HopError('error', 'reset', 'read: connection reset by peer');
  if (code.startsWith('HPE_') || (err instanceof Error && err.name === 'HTTPParserError')) return new HopError('error', 'protocol', 'malformed chunked encoding');
  if (code === 'UND_ERR_SOCKET' || code === 'UND_ERR_RES_CONTENT_LENGTH_MISMATCH' || /other side closed|closed/.test(message)) {
    return new HopError('error', 'protocol', 'unexpected EOF');
  }
  return new HopError('error', 'other', message);
}

/**
 * Go's client reads and skips 1xx informational responses (but 101) before the final one, at most
 * MAX_1XX_RESPONSES of them; undici rejects a `100 Continue` to a request that did not ask for one
 * ("bad response"). The bytes of those responses are dropped here, before undici's parser sees them:
 * the response is the first thing on a one-request connection, so they can only come first.
 */
function skipInformational<T extends Socket>(socket: T): T {
  let head: Buffer | undefined = Buffer.alloc(0);
  let skipped = 0;
  const push = socket.push;
  socket.push = function pushWithout1xx(this: T, chunk: unknown, encoding?: BufferEncoding): boolean {
    if (head === undefined) return push.call(this, chunk, encoding);
    if (!Buffer.isBuffer(chunk)) {
      // End of stream (or a non-buffer chunk): whatever was held goes first, untouched.
      const held = head;
      head = undefined;
      if (held.length > 0) push.call(this, held);
      return push.call(this, chunk, encoding);
    }
    head = Buffer.concat([head, chunk]);
    for (;;) {
      const start = head.subarray(0, STATUS_PREFIX.length).toString('latin1');
      if (start.length < STATUS_PREFIX.length) {
        if (mayBeInformational(start)) return true;
        break;
      }
      if (!mayBeInformational(start) || start.startsWith('101', 9)) break;
      const end = head.indexOf('\r\n\r\n');
      if (end === -1) {
        if (head.length <= MAX_HEADER_BYTES) return true;
        break;
      }
      if (++skipped > MAX_1XX_RESPONSES) {
        head = undefined;
        this.destroy(Object.assign(new Error('net/http: too many 1xx informational responses'), { code: 'TOO_MANY_1XX' }));
        return false;
      }
      head = head.subarray(end + 4);
    }
    const rest = head;
    head = undefined;
    return push.call(this, rest, encoding);
  } as T['push'];
  return socket;
}

/** The start of an informational status line: "HTTP/1.x 1yz " ('#' is any digit; the last is a space or CR). */
const STATUS_PREFIX = 'HTTP/1.# 1## ';

/** Whether `text` (at most STATUS_PREFIX long) is, or may still become, the start of a 1xx status line. */
function mayBeInformational(text: string): boolean {
  for (let i = 0; i < text.length; i++) {
    const want = STATUS_PREFIX[i] as string;
    const c = text[i] as string;
    const ok = want === '#' ? c >= '0' && c <= '9' : i === STATUS_PREFIX.length - 1 ? c === ' ' || c === '\r' : c === want;
    if (!ok) return false;
  }
  return true;
}

/** Wraps a connected socket in TLS the way kubelet's transport does: no verification, SNI only for names. */
function startTls(socket: Socket, servername: string | undefined, deadline: Deadline, prefix: string): Promise<TLSSocket> {
  return new Promise<TLSSocket>((resolve, reject) => {
    const tls = tlsConnect({
      socket,
      rejectUnauthorized: false,
      // Go sends no SNI for an IP literal; with a bare socket and no servername Node sends none either.
      ...(servername ? { servername } : {}),
      ALPNProtocols: ['http/1.1'],
    });
    const cleanup = (): void => {
      tls.removeListener('secureConnect', onOk);
      tls.removeListener('error', onErr);
      deadline.signal.removeEventListener('abort', onAbort);
    };
    const onOk = (): void => {
      cleanup();
      tls.on('error', () => {});
      resolve(tls);
    };
    const onErr = (err: Error): void => {
      cleanup();
      tls.destroy();
      reject(new HopError('failure', 'tls', `${prefix}: ${tlsText(err)}`));
    };
    const onAbort = (): void => {
      cleanup();
      tls.destroy();
      reject(deadline.why() === 'timeout' ? timeoutError(prefix, deadline, 'headers') : new HopError('error', 'other', 'probe aborted'));
    };
    tls.once('secureConnect', onOk);
    tls.once('error', onErr);
    if (deadline.signal.aborted) onAbort();
    else deadline.signal.addEventListener('abort', onAbort, { once: true });
  });
}

function tlsText(err: Error): string {
  const code = (err as NodeJS.ErrnoException).code ?? '';
  if (code === 'ERR_SSL_WRONG_VERSION_NUMBER' || code === 'ERR_SSL_PACKET_LENGTH_TOO_LONG') {
    return 'tls: first record does not look like a TLS handshake';
  }
  if (code === 'ECONNRESET' || /socket disconnected/.test(err.message)) return 'remote error: tls: handshake failure (connection closed)';
  return `tls: ${err.message}`;
}

function timeoutError(prefix: string, _deadline: Deadline, stage: 'headers'): HopError {
  return new HopError('failure', 'timeout', `${prefix}: context deadline exceeded (Client.Timeout exceeded while awaiting ${stage})`);
}

/** Maps undici/socket errors onto Go's client error texts. */
function mapHttpError(err: unknown, prefix: string, deadline: Deadline): HopError {
  const why = deadline.why();
  if (why === 'timeout') return timeoutError(prefix, deadline, 'headers');
  if (why === 'aborted') return new HopError('error', 'other', 'probe aborted');
  const code = (err as NodeJS.ErrnoException | undefined)?.code ?? '';
  const message = describeError(err);
  if (code === 'UND_ERR_SOCKET' && /other side closed/.test(message)) return new HopError('failure', 'protocol', `${prefix}: EOF`);
  if (code === 'ECONNRESET' || /ECONNRESET/.test(message)) {
    return new HopError('failure', 'reset', `${prefix}: read: connection reset by peer`);
  }
  if (code.startsWith('HPE_') || err instanceof Error && err.name === 'HTTPParserError') {
    return new HopError('failure', 'protocol', `${prefix}: net/http: HTTP/1.x transport connection broken: malformed HTTP response`);
  }
  if (code === 'TOO_MANY_1XX' || /too many 1xx/.test(message)) return new HopError('failure', 'protocol', `${prefix}: net/http: too many 1xx informational responses`);
  if (code === 'UND_ERR_HEADERS_OVERFLOW') {
    return new HopError('failure', 'protocol', `${prefix}: net/http: server response headers exceeded ${MAX_HEADER_BYTES} bytes; aborted`);
  }
  return new HopError('failure', 'other', `${prefix}: ${message}`);
}
