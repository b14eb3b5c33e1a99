/**
 * kubelet's gRPC probe (pkg/probe/grpc/grpc.go): grpc.health.v1.Health/Check in plaintext, one
 * deadline for dial and RPC, SERVING is success and everything else a failure, in kubelet's words.
 * Spoken on a socket we connected ourselves (grpc-js cannot use a given socket) with our own one-shot
 * HTTP/2 exchange (http2/unary-oneshot.ts): a node:http2 session per probe cost more CPU than the probe.
 *
 * A response head whose :status is not 200 fails the call as grpc-go before 1.76 does (kubelet's
 * through v1.34), 1xx included ("unexpected HTTP status code received from server: 100 (Continue)");
 * grpc-go 1.76 and later skip a 1xx head, which would let a server send them until the deadline.
 * Frames without progress spend the pod's frame budget across its probes' connections
 * (ProbeContext.frameBudget): a flood ends the probe with reason 'frame-budget'.
 *
 * Differences from kubelet (grpc-go with WithBlock): a refused or non-HTTP/2 target fails at once
 * with "error: failed to connect service ..." where grpc-go keeps redialling until the deadline and
 * then says "timeout: failed to connect service ..."; the User-Agent has no " grpc-go/x.y" suffix.
 */
import { performance } from 'node:perf_hooks';
import { encodeLiteralBlock, type HeaderField } from '../http2/hpack.ts';
import { exchangeOnce, type OneShotExchange } from '../http2/unary-oneshot.ts';
import { ConnectError, connectAndSend, type ConnectedWith, type Deadline, type ProberResult } from './connect.ts';
import { decodeHealthStatus, encodeHealthCheckRequest, goDuration } from './grpc-wire.ts';
import { encodeFrame, readFrame } from '../grpc/frame.ts';
import { decodeGrpcMessage, formatGrpcTimeout } from '../grpc/headers.ts';
import { codeFromHttpStatus, codeFromRstStream, goCodeName, goStatusText, GrpcCode, parseGrpcStatus } from '../grpc/status.ts';
import type { SharedFrameBudget } from '../http2/frame-budget.ts';
import { answerStartedAt, connectionChannel, PendingChannel } from '../io/exchanged-channel.ts';
import type { ByteChannel } from '../io/lean-socket.ts';
import { joinHostPort, type TargetPlan } from './target.ts';
import { targetGrpcTimeoutMs } from './time-budget.ts';
import type { FailureReason, GrpcHandler } from './types.ts';

/** A health response is a few bytes; anything near this is not a health server. */
const MAX_RESPONSE_BYTES = 16 * 1024;
/** Our SETTINGS_MAX_HEADER_LIST_SIZE: a health answer's headers are a few hundred octets. */
const MAX_HEADER_LIST = 16 * 1024;
const CHECK_PATH = '/grpc.health.v1.Health/Check';
const SERVING_STATUS: Record<number, string> = { 0: 'UNKNOWN', 1: 'SERVING', 2: 'NOT_SERVING', 3: 'SERVICE_UNKNOWN' };
/** HTTP/2 REFUSED_STREAM. */
const REFUSED_STREAM = 7;
/** HTTP/2 error codes as Go's http2.ErrCode prints them, by value. */
const H2_ERROR_NAMES = [
  'NO_ERROR', 'PROTOCOL_ERROR', 'INTERNAL_ERROR', 'FLOW_CONTROL_ERROR', 'SETTINGS_TIMEOUT', 'STREAM_CLOSED', 'FRAME_SIZE_ERROR',
  'REFUSED_STREAM', 'CANCEL', 'COMPRESSION_ERROR', 'CONNECT_ERROR', 'ENHANCE_YOUR_CALM', 'INADEQUATE_SECURITY', 'HTTP_1_1_REQUIRED',
];

/** A finished RPC: a status code, its message, and the response message bytes when OK; `reason` when not 'grpc-status'. */
interface RpcResult {
  code: number;
  message: string;
  response?: Buffer;
  reason?: FailureReason;
}

/** Runs kubelet's gRPC probe against `plan`; never throws. */
export async function probeGrpc(handler: GrpcHandler, plan: TargetPlan, deadline: Deadline, kubeVersion: string, frameBudget?: SharedFrameBudget): Promise<ProberResult> {
  const addr = joinHostPort(plan.host, plan.port);
  const within = goDuration(deadline.timeoutMs);
  const addresses = plan.ips.map((ip) => ({ ip, port: plan.port }));
  const phases: ProberResult['phases'] = {};
  const service = handler.service ?? '';
  // The exchange starts on a channel without a connection, so that its first octets (preface,
  // SETTINGS, the request) go with the helper's connect, which reads the server's first answer in
  // the same trip (most often all of it: no wake-up of ours for the write or the first reads). The
  // HTTP/2 rules stay in the exchange; the helper moves bytes.
  const pending = new PendingChannel();
  const rpcDone = checkRpc(pending, addr, service, kubeVersion, deadline, frameBudget);
  // The exchange's writer flushes in a microtask queued by now.
  const first = await Promise.resolve().then(() => pending.written());
  let connected: ConnectedWith;
  try {
    connected = await connectAndSend(addresses, plan, deadline, first);
  } catch (err) {
    pending.destroy();
    const e = err instanceof ConnectError ? err : undefined;
    if (e?.kind === 'error') return { result: 'error', reason: e.reason, message: e.detail, address: addr, phases };
    if (!e || e.reason === 'timeout') {
      return { result: 'failure', reason: 'timeout', message: `timeout: failed to connect service ${JSON.stringify(addr)} within ${within}: context deadline exceeded`, address: addr, phases };
    }
    return { result: 'failure', reason: e.reason, message: `error: failed to connect service at ${JSON.stringify(addr)}: ${e.dialText}`, address: addr, phases };
  }
  phases.helper = connected.helperSeconds;
  phases.connect = connected.connectSeconds;
  const address = joinHostPort(connected.address.ip, connected.address.port);
  const t0 = answerStartedAt(connected.exchange);
  // Read into the reused buffer, without the stream path (agent/io/lean-socket.ts).
  pending.attach(connectionChannel(connected.exchange, connected.socket));
  let rpc: RpcResult | ConnFailure;
  try {
    rpc = await rpcDone;
  } finally {
    pending.destroy();
  }
  phases.firstByte = (performance.now() - t0) / 1000;

  if ('connFailure' in rpc) {
    if (deadline.why() === 'aborted') return { result: 'error', reason: 'other', message: 'probe aborted', address, phases };
    if (rpc.timedOut) {
      return { result: 'failure', reason: 'timeout', message: `timeout: failed to connect service ${JSON.stringify(addr)} within ${within}: context deadline exceeded`, address, phases };
    }
    return { result: 'failure', reason: rpc.reason, message: `error: failed to connect service at ${JSON.stringify(addr)}: ${rpc.connFailure}`, address, phases };
  }
  return judge(rpc, within, address, phases);
}

/** kubelet's mapping of an RPC outcome to a probe result. */
function judge(rpc: RpcResult, within: string, address: string, phases: ProberResult['phases']): ProberResult {
  if (rpc.code === GrpcCode.UNIMPLEMENTED) {
    return { result: 'failure', reason: 'grpc-unimplemented', message: `error: this server does not implement the grpc health protocol (grpc.health.v1.Health): ${rpc.message}`, address, phases };
  }
  if (rpc.code === GrpcCode.DEADLINE_EXCEEDED) {
    return { result: 'failure', reason: 'timeout', message: `timeout: health rpc did not complete within ${within}`, address, phases };
  }
  if (rpc.code !== 0) {
    return { result: 'failure', reason: rpc.reason ?? 'grpc-status', message: `error: health rpc probe failed: rpc error: code = ${goCodeName(rpc.code)} desc = ${rpc.message}`, address, phases };
  }
  let status: number;
  try {
    status = decodeHealthStatus(rpc.response ?? Buffer.alloc(0));
  } catch (err) {
    return { result: 'failure', reason: 'protocol', message: `error: health rpc probe failed: rpc error: code = Internal desc = grpc: failed to unmarshal the received message: ${(err as Error).message}`, address, phases };
  }
  if (status !== 1) {
    return { result: 'failure', reason: 'grpc-not-serving', message: `service unhealthy (responded with ${JSON.stringify(SERVING_STATUS[status] ?? String(status))})`, address, phases };
  }
  return { result: 'success', message: 'service healthy', address, phases };
}

/** The HTTP/2 connection itself failed (not an RPC status). */
interface ConnFailure {
  connFailure: string;
  reason: FailureReason;
  timedOut: boolean;
}

/** HTTP/2 error code names as Node's http2 module printed them in stream errors (what this probe reported before). */
function nghttp2Name(code: number): string {
  const name = H2_ERROR_NAMES[code];
  return name === undefined ? String(code) : `NGHTTP2_${name}`;
}

/** A probe's request header block but its grpc-timeout, and its framed request message. */
interface RequestParts {
  head: Buffer;
  body: Buffer;
}

/**
 * Request parts by authority, service and kube version: a worker sends the same ones every period.
 * Bounded (a node has far fewer gRPC targets); past the bound it starts over. Only read afterwards.
 */
const requestCache = new Map<string, RequestParts>();
const REQUEST_CACHE_MAX = 4096;

function requestParts(authority: string, service: string, kubeVersion: string): RequestParts {
  const key = `${authority}\u0000${service}\u0000${kubeVersion}`;
  const known = requestCache.get(key);
  if (known) return known;
  const parts = {
    head: encodeLiteralBlock([
      { name: ':method', value: 'POST' },
      { name: ':scheme', value: 'http' },
      { name: ':path', value: CHECK_PATH },
      // grpc-go uses the dial target as :authority, port included.
      { name: ':authority', value: authority },
      { name: 'content-type', value: 'application/grpc' },
      { name: 'user-agent', value: `kube-probe/${kubeVersion}` },
      { name: 'te', value: 'trailers' },
    ]),
    body: encodeFrame(encodeHealthCheckRequest(service)),
  };
  if (requestCache.size >= REQUEST_CACHE_MAX) requestCache.clear();
  requestCache.set(key, parts);
  return parts;
}

/** One unary Health/Check over a fresh HTTP/2 connection on `socket`. Resolves; never rejects. */
function checkRpc(
  socket: ByteChannel, authority: string, service: string, kubeVersion: string, deadline: Deadline, frameBudget: SharedFrameBudget | undefined,
): Promise<RpcResult | ConnFailure> {
  return new Promise((resolve) => {
    let settled = false;
    let exchange: OneShotExchange | undefined;
    const done = (r: RpcResult | ConnFailure): void => {
      if (settled) return;
      settled = true;
      deadline.signal.removeEventListener('abort', onAbort);
      exchange?.cancel();
      resolve(r);
    };
    const onAbort = (): void => {
      const timedOut = deadline.why() === 'timeout';
      // grpc-go: a deadline before the transport is ready is a dial timeout; after, the RPC's DeadlineExceeded.
      if (!exchange?.responseStarted && !exchange?.settingsSeen) done({ connFailure: 'context deadline exceeded', reason: 'timeout', timedOut });
      else done({ code: GrpcCode.DEADLINE_EXCEEDED, message: 'context deadline exceeded' });
    };
    const connFail = (message: string, reason: FailureReason = 'protocol'): void => {
      done({ connFailure: `connection error: desc = "transport: ${message}"`, reason, timedOut: false });
    };
    if (deadline.signal.aborted) return onAbort();

    const fixed = requestParts(authority, service, kubeVersion);
    // Literal representations stand alone, so the per-probe grpc-timeout is appended to the fixed fields.
    const block = Buffer.concat([fixed.head, encodeLiteralBlock([{ name: 'grpc-timeout', value: formatGrpcTimeout(targetGrpcTimeoutMs(deadline.remainingMs())) }])]);
    const request = { block, body: fixed.body, maxResponseBytes: MAX_RESPONSE_BYTES, maxHeaderListSize: MAX_HEADER_LIST, ...(frameBudget ? { sharedBudget: frameBudget } : {}) };
    exchange = exchangeOnce(socket, request, (end) => {
      const started = exchange?.responseStarted ?? false;
      const ready = exchange?.settingsSeen ?? false;
      switch (end.kind) {
        case 'response':
          return done(finishRpc(end.headers, end.trailers, end.body));
        case 'too-large':
          return done({ code: GrpcCode.RESOURCE_EXHAUSTED, message: `grpc: received message larger than max (${end.size} vs. ${MAX_RESPONSE_BYTES})` });
        case 'reset': {
          // A server that resets the stream answered the RPC: grpc-go reports a status, not a dial error.
          if (end.code === 0) return end.headers ? done(finishRpc(end.headers, end.trailers, end.body)) : connFail('stream closed with code 0');
          if (ready) return done(resetStatus(end.code));
          return connFail(`Stream closed with error code ${nghttp2Name(end.code)}`);
        }
        case 'goaway': {
          // Node's client (what this probe used before) and grpc-go: a stream the server never processed
          // (graceful GOAWAY below it) is refused; a GOAWAY with an error closes the connection.
          if (end.code === 0 && !end.processed) return ready ? done(resetStatus(REFUSED_STREAM)) : connFail(`Stream closed with error code ${nghttp2Name(REFUSED_STREAM)}`);
          const why = `Session closed with error code ${end.code}`;
          return started ? done({ code: GrpcCode.INTERNAL, message: why }) : connFail(why);
        }
        case 'eof':
          // After the response headers the stream ends with what came: no trailers is grpc-go's Internal.
          return end.headers ? done(finishRpc(end.headers, end.trailers, end.body)) : connFail('error reading server preface: EOF');
        case 'broken': {
          const reason: FailureReason = end.flood ? 'frame-budget' : 'protocol';
          return started ? done({ code: GrpcCode.UNAVAILABLE, message: `connection error: ${end.message}`, ...(end.flood ? { reason } : {}) }) : connFail(end.message, reason);
        }
      }
    });
    deadline.signal.addEventListener('abort', onAbort, { once: true });
  });
}

/** grpc-go's status for a stream the server reset (http2Client.handleRSTStream). */
function resetStatus(rstCode: number): RpcResult {
  const name = H2_ERROR_NAMES[rstCode] ?? `unknown error code 0x${rstCode.toString(16)}`;
  return { code: codeFromRstStream(rstCode), message: `stream terminated by RST_STREAM with error code: ${name}` };
}

/**
 * grpc-go's (before 1.76) verdict on a response head whose :status is not 200, 1xx included
 * (http2Client.operateHeaders): the call fails with the HTTP status's code, and says what else was
 * wrong with the head. Undefined for 200.
 */
function httpStatusFailure(status: string | undefined, contentType: string | undefined): RpcResult | undefined {
  if (status === '200') return undefined;
  let code: number = GrpcCode.INTERNAL;
  let statusErr = 'malformed header: missing HTTP status';
  if (status !== undefined) {
    // strconv.ParseInt(value, 10, 32)
    const n = /^[+-]?\d+$/.test(status) ? Number(status) : NaN;
    if (Number.isNaN(n) || n > 2 ** 31 - 1 || n < -(2 ** 31)) {
      const why = Number.isNaN(n) ? 'invalid syntax' : 'value out of range';
      return { code: GrpcCode.INTERNAL, message: `transport: malformed http-status: strconv.ParseInt: parsing ${JSON.stringify(status)}: ${why}` };
    }
    code = codeFromHttpStatus(n);
    statusErr = `unexpected HTTP status code received from server: ${n} (${goStatusText(n)})`;
  }
  const errs = [statusErr];
  if (contentType === undefined) errs.push('malformed header: missing HTTP content-type');
  else if (!isGrpcContentType(contentType)) errs.push(`transport: received unexpected content-type ${JSON.stringify(contentType)}`);
  return { code, message: errs.join('; ') };
}

/** grpcutil.ContentSubtype's test: application/grpc, or it followed by '+' or ';'. */
function isGrpcContentType(v: string): boolean {
  return v === 'application/grpc' || (v.startsWith('application/grpc') && (v[16] === '+' || v[16] === ';'));
}

/** Turns response headers/trailers/body into a status, with grpc-go's HTTP-status fallback. */
function finishRpc(headers: readonly HeaderField[], trailers: readonly HeaderField[] | undefined, body: Buffer): RpcResult {
  const h: { code?: string; message?: string; status?: string; contentType?: string } = {};
  for (const f of headers) {
    if (f.name === ':status') h.status = f.value;
    else if (f.name === 'content-type') h.contentType = f.value;
    else if (f.name === 'grpc-status') h.code = f.value;
    else if (f.name === 'grpc-message') h.message = f.value;
  }
  for (const f of trailers ?? []) {
    if (f.name === 'grpc-status') h.code = f.value;
    else if (f.name === 'grpc-message') h.message = f.value;
  }
  const failed = httpStatusFailure(h.status, h.contentType);
  if (failed) return failed;
  h.contentType ??= '';
  const code = parseGrpcStatus(h.code);
  if (code === undefined) {
    if (!h.contentType.startsWith('application/grpc')) return { code: GrpcCode.INTERNAL, message: `transport: received unexpected content-type ${JSON.stringify(h.contentType)}` };
    return { code: GrpcCode.INTERNAL, message: 'server closed the stream without sending trailers' };
  }
  const message = decodeGrpcMessage(h.message ?? '');
  if (code !== GrpcCode.OK) return { code, message };
  const response = readFrame(body, false);
  if (response === 'short') return { code: GrpcCode.INTERNAL, message: 'cardinality violation: expected <Response> but got <EOF>' };
  if (response === 'compressed') return { code: GrpcCode.INTERNAL, message: 'grpc: compressed message received but no compression was negotiated' };
  // 'truncated' (octets after the message are not read: never 'trailing').
  if (typeof response === 'string') return { code: GrpcCode.INTERNAL, message: 'grpc: truncated response message' };
  return { code: GrpcCode.OK, message: '', response };
}
