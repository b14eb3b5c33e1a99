/**
 * kubelet's HTTP probe (pkg/probe/http/http.go) over sockets we connect ourselves: one new connection
 * per request, "Connection: close", no proxy, no compression, TLS without verification, redirects
 * handled by hand with kubelet's same-hostname rule, a 10 KiB body cap and one deadline for it all.
 */
import { isIP } from 'node:net';
import { performance } from 'node:perf_hooks';
import { connect as tlsConnect, createSecureContext, type SecureContext, type TLSSocket } from 'node:tls';
import type { Socket } from 'node:net';
import { describeError } from '../errors.ts';
import { answerStartedAt, connectionChannel } from '../io/exchanged-channel.ts';
import { StreamChannel, type ByteChannel } from '../io/lean-socket.ts';
import { ConnectError, connectAndSend, connectTo, type Deadline, type ProberResult } from './connect.ts';
import { Http1Get, type GetOutcome } from './http-client.ts';
import { Http1Error } from './http1-response.ts';
import {
  MAX_BODY_BYTES, buildHeaderMap, buildProbeRequest, decideRedirect, requestBytes, type HeaderMap, type ProbeRequest, type RedirectDecision,
} from './http-request.ts';
import { joinHostPort, type TargetPlan } from './target.ts';
import type { FailureReason, HttpGetHandler } from './types.ts';

export { MAX_1XX_RESPONSES } from './http-client.ts';

/** Go's maxBodySlurpSize: a followed redirect's body is drained this far, if small or of unknown length. */
export const REDIRECT_SLURP_BYTES = 2 * 1024;

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
  const { initial, first } = firstRequest(handler, plan, kubeVersion);
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

/** A handler's first request as last built, with what it was built from. */
interface BuiltRequest {
  host: string;
  port: number;
  kubeVersion: string;
  initial: HeaderMap;
  first: ProbeRequest;
}

/**
 * First requests by handler: a worker probes with the same handler object every period, and
 * building the request (header map, URL parse of the path) each time was a visible share of an
 * HTTP probe's CPU. Both are only read afterwards (a redirect clones the header map).
 */
const builtRequests = new WeakMap<HttpGetHandler, BuiltRequest>();

function firstRequest(handler: HttpGetHandler, plan: TargetPlan, kubeVersion: string): { initial: HeaderMap; first: ProbeRequest } {
  const built = builtRequests.get(handler);
  if (built && built.host === plan.host && built.port === plan.port && built.kubeVersion === kubeVersion) return built;
  const initial = buildHeaderMap(handler.headers, kubeVersion);
  const first = buildProbeRequest(handler.scheme, plan.host, plan.port, handler.path, initial);
  Object.freeze(first.headers);
  Object.freeze(first);
  builtRequests.set(handler, { host: plan.host, port: plan.port, kubeVersion, initial, first });
  return { initial, first };
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
  let request: Buffer;
  try {
    request = requestBytes(req);
  } catch (err) {
    // Go's transport refuses such a request before it dials.
    throw new HopError('failure', 'other', `${prefix}: ${describeError(err)}`);
  }
  const addresses = plan.ips.map((ip) => ({ ip, port: req.port }));
  let socket: Socket | undefined;
  let channel: ByteChannel | undefined;
  try {
    // Plain HTTP: the helper that connects also writes the request and reads the answer's first
    // octets (most often all of it, and the peer's end), in the same trip.
    const connecting = req.scheme === 'https' ? connectTo(addresses, plan, deadline) : connectAndSend(addresses, plan, deadline, request);
    const connected = await connecting.catch((err: unknown) => {
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

    const exchanged = 'exchange' in connected ? connected.exchange : undefined;
    if (req.scheme === 'https') {
      const t0 = performance.now();
      socket = await startTls(socket as Socket, isIP(req.hostname) ? undefined : req.hostname, deadline, prefix);
      phases.tls = (phases.tls ?? 0) + (performance.now() - t0) / 1000;
      channel = new StreamChannel(socket);
    } else {
      // Plain HTTP reads into the reused buffer, without the stream machinery per read.
      channel = connectionChannel(exchanged, socket);
    }

    const t1 = answerStartedAt(exchanged);
    let decision: RedirectDecision = USE;
    const get = new Http1Get(channel, request, deadline.signal, (head) => {
      decision = decide(head.status, head.location);
      return bodyToRead(decision, head.contentLength);
    });
    let out: GetOutcome;
    try {
      out = await get.outcome;
    } catch (err) {
      throw mapHttpError(err, get, prefix, deadline);
    }
    phases.firstByte = (phases.firstByte ?? 0) + (out.headAt - t1) / 1000;
    const status = out.head.status;
    // What went wrong draining a redirect's body is ignored, as in Go (a stall still uses up the deadline).
    if (decision.action !== 'use') return { status, decision, body: '' };
    // kubelet: `return probe.Failure, "", err` -- a prober error, retried and then thrown away.
    if (out.bodyError !== undefined) return { status, decision, body: '', bodyError: bodyReadError(out.bodyError, get, deadline) };
    return { status, decision, body: (out.body as Buffer).toString('utf8') };
  } catch (err) {
    if (err instanceof HopError) throw err;
    throw new HopError('failure', 'other', `${prefix}: ${describeError(err)}`);
  } finally {
    // One request per connection (Go: DisableKeepAlives): the connection goes either way.
    if (channel) channel.destroy();
    else socket?.destroy();
  }
}

const USE: RedirectDecision = { action: 'use' };

/**
 * How much of a response's body the chain reads: kubelet reads every final response's body
 * (ReadAtMost 10 KiB, whatever the status); Go drains a followed redirect's body (and that of the
 * one that stops the chain) before the next request, only when small or of unknown length; the
 * rest is not read (Go closes the connection under it).
 */
function bodyToRead(decision: RedirectDecision, contentLength: number): number {
  if (decision.action === 'use') return MAX_BODY_BYTES;
  const drained = decision.action === 'follow' || decision.reason === 'redirects';
  return drained && (contentLength === -1 || contentLength <= REDIRECT_SLURP_BYTES) ? REDIRECT_SLURP_BYTES : 0;
}

/** Whether the peer reset the connection. */
function wasReset(get: Http1Get): boolean {
  return (get.socketError as NodeJS.ErrnoException | undefined)?.code === 'ECONNRESET';
}

/** A body read error in Go's words (the error kubelet's prober logs and throws away). */
function bodyReadError(err: unknown, get: Http1Get, deadline: Deadline): HopError {
  const why = deadline.why();
  if (why === 'timeout') return new HopError('error', 'timeout', 'context deadline exceeded (Client.Timeout or context cancellation while reading body)');
  if (why === 'aborted') return new HopError('error', 'other', 'probe aborted');
  if (wasReset(get)) return new HopError('error', 'reset', 'read: connection reset by peer');
  // The body's framing, or the connection ending before the body did: the body reader's own text.
  if (err instanceof Http1Error) return new HopError('error', 'protocol', err.message);
  return new HopError('error', 'other', describeError(get.socketError ?? err));
}

/**
 * One client TLS context for every HTTPS probe. tls.connect() otherwise builds a new one (an
 * OpenSSL SSL_CTX with the default ciphers and root store) per connection: 13 % of the busy
 * time in a profile of HTTP and HTTPS probes. It holds no session: Node resumes a TLS session only
 * when given one, so every probe still makes a full handshake, as kubelet's transport does.
 */
let probeTlsContext: SecureContext | undefined;

/** Wraps a connected socket in TLS the way kubelet's transport does: no verification, SNI only for names. */
function startTls(socket: Socket, servername: string | undefined, deadline: Deadline, prefix: string): Promise<TLSSocket> {
  return new Promise<TLSSocket>((resolve, reject) => {
    const tls = tlsConnect({
      socket,
      secureContext: (probeTlsContext ??= createSecureContext()),
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

/** Maps what ended an exchange before its final response head onto Go's client error texts. */
function mapHttpError(err: unknown, get: Http1Get, prefix: string, deadline: Deadline): HopError {
  const why = deadline.why();
  if (why === 'timeout') return timeoutError(prefix, deadline, 'headers');
  if (why === 'aborted') return new HopError('error', 'other', 'probe aborted');
  if (wasReset(get)) return new HopError('failure', 'reset', `${prefix}: read: connection reset by peer`);
  if (err instanceof Http1Error) {
    // The peer closed the connection before any response: Go's bare io.EOF.
    if (err.kind === 'closed') return new HopError('failure', 'protocol', `${prefix}: EOF`);
    // ReadResponse's error (or the transport's own head bounds), on a connection the transport
    // then finds broken: Go's mapRoundTripError wraps them all.
    return new HopError('failure', 'protocol', `${prefix}: net/http: HTTP/1.x transport connection broken: ${err.message}`);
  }
  return new HopError('failure', 'other', `${prefix}: ${describeError(get.socketError ?? err)}`);
}
