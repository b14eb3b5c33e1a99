/**
 * kubelet's gRPC probe (pkg/probe/grpc/grpc.go): grpc.health.v1.Health/Check in plaintext, one
 * deadline for dial and RPC, SERVING is success and everything else a failure, in kubelet's words.
 * Spoken over node:http2 on a socket we connected ourselves, since grpc-js cannot use a given socket.
 *
 * Differences from kubelet (grpc-go with WithBlock): a refused or non-HTTP/2 target fails at once
 * with "error: failed to connect service ..." where grpc-go keeps redialling until the deadline and
 * then says "timeout: failed to connect service ..."; the User-Agent has no " grpc-go/x.y" suffix.
 */
import { connect as http2Connect, constants as h2, type ClientHttp2Session, type ClientHttp2Stream } from 'node:http2';
import { performance } from 'node:perf_hooks';
import { ConnectError, connectTo, type Deadline, type ProberResult } from './connect.ts';
import { decodeHealthStatus, encodeHealthCheckRequest, goDuration, grpcFrame, percentDecode } from './grpc-wire.ts';
import { joinHostPort, type TargetPlan } from './target.ts';
import type { FailureReason, GrpcHandler } from './types.ts';

/** A health response is a few bytes; anything near this is not a health server. */
const MAX_RESPONSE_BYTES = 16 * 1024;
const CHECK_PATH = '/grpc.health.v1.Health/Check';
const SERVING_STATUS: Record<number, string> = { 0: 'UNKNOWN', 1: 'SERVING', 2: 'NOT_SERVING', 3: 'SERVICE_UNKNOWN' };
/** grpc-go's codes.Code String() names. */
const CODE_NAMES = [
  'OK', 'Canceled', 'Unknown', 'InvalidArgument', 'DeadlineExceeded', 'NotFound', 'AlreadyExists', 'PermissionDenied',
  'ResourceExhausted', 'FailedPrecondition', 'Aborted', 'OutOfRange', 'Unimplemented', 'Internal', 'Unavailable',
  'DataLoss', 'Unauthenticated',
];
const UNIMPLEMENTED = 12;
const DEADLINE_EXCEEDED = 4;
/** HTTP/2 error codes as Go's http2.ErrCode prints them, by value. */
const H2_ERROR_NAMES = [
  'NO_ERROR', 'PROTOCOL_ERROR', 'INTERNAL_ERROR', 'FLOW_CONTROL_ERROR', 'SETTINGS_TIMEOUT', 'STREAM_CLOSED', 'FRAME_SIZE_ERROR',
  'REFUSED_STREAM', 'CANCEL', 'COMPRESSION_ERROR', 'CONNECT_ERROR', 'ENHANCE_YOUR_CALM', 'INADEQUATE_SECURITY', 'HTTP_1_1_REQUIRED',
];
/** grpc-go's http2ErrConvTab: the status code of a stream the server reset, by HTTP/2 error code. */
const RST_STREAM_CODES = [13, 13, 13, 8, 13, 13, 13, 14, 1, 13, 13, 8, 7, 13];

/** A finished RPC: a status code, its message, and the response message bytes when OK. */
interface RpcResult {
  code: number;
  message: string;
  response?: Buffer;
}

/** Runs kubelet's gRPC probe against `plan`; never throws. */
export async function probeGrpc(handler: GrpcHandler, plan: TargetPlan, deadline: Deadline, kubeVersion: string): Promise<ProberResult> {
  const addr = joinHostPort(plan.host, plan.port);
  const within = goDuration(deadline.timeoutMs);
  const addresses = plan.ips.map((ip) => ({ ip, port: plan.port }));
  const phases: ProberResult['phases'] = {};
  let connected;
  try {
    connected = await connectTo(addresses, plan, deadline);
  } catch (err) {
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
  const t0 = performance.now();
  let rpc: RpcResult | ConnFailure;
  try {
    rpc = await checkRpc(connected.socket, addr, handler.service ?? '', kubeVersion, deadline);
  } finally {
    connected.socket.destroy();
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
  if (rpc.code === UNIMPLEMENTED) {
    return { result: 'failure', reason: 'grpc-unimplemented', message: `error: this server does not implement the grpc health protocol (grpc.health.v1.Health): ${rpc.message}`, address, phases };
  }
  if (rpc.code === DEADLINE_EXCEEDED) {
    return { result: 'failure', reason: 'timeout', message: `timeout: health rpc did not complete within ${within}`, address, phases };
  }
  if (rpc.code !== 0) {
    const name = CODE_NAMES[rpc.code] ?? `Code(${rpc.code})`;
    return { result: 'failure', reason: 'grpc-status', message: `error: health rpc probe failed: rpc error: code = ${name} desc = ${rpc.message}`, address, phases };
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

/** One unary Health/Check over a fresh HTTP/2 session on `socket`. Resolves; never rejects. */
function checkRpc(socket: import('node:net').Socket, authority: string, service: string, kubeVersion: string, deadline: Deadline): Promise<RpcResult | ConnFailure> {
  return new Promise((resolve) => {
    let settled = false;
    let session: ClientHttp2Session | undefined;
    let stream: ClientHttp2Stream | undefined;
    let gotResponseHeaders = false;
    let transportReady = false;
    const chunks: Buffer[] = [];
    let size = 0;
    let headerStatus: { code?: string; message?: string; http?: number; contentType?: string } = {};

    const done = (r: RpcResult | ConnFailure): void => {
      if (settled) return;
      settled = true;
      deadline.signal.removeEventListener('abort', onAbort);
      stream?.close(h2.NGHTTP2_CANCEL);
      session?.destroy();
      resolve(r);
    };
    const onAbort = (): void => {
      const timedOut = deadline.why() === 'timeout';
      // grpc-go: a deadline before the transport is ready is a dial timeout; after, the RPC's DeadlineExceeded.
      if (!gotResponseHeaders && !transportReady) done({ connFailure: 'context deadline exceeded', reason: 'timeout', timedOut });
      else done({ code: DEADLINE_EXCEEDED, message: 'context deadline exceeded' });
    };
    const connFail = (err: unknown): void => {
      done({ connFailure: `connection error: desc = "transport: ${(err as Error)?.message ?? String(err)}"`, reason: 'protocol', timedOut: false });
    };

    try {
      session = http2Connect(`http://${authority}`, {
        createConnection: () => socket,
        settings: { enablePush: false, maxHeaderListSize: 16 * 1024 },
        maxSessionMemory: 1,
      });
    } catch (err) {
      connFail(err);
      return;
    }
    // grpc-go calls a transport ready once the server's SETTINGS arrived; WithBlock waits for exactly that.
    session.once('remoteSettings', () => (transportReady = true));
    session.on('error', (err) => (gotResponseHeaders ? done({ code: 14, message: `connection error: ${err.message}` }) : connFail(err)));
    session.on('close', () => {
      if (!settled) (gotResponseHeaders ? done({ code: 14, message: 'error reading from server: EOF' }) : connFail(new Error('error reading server preface: EOF')));
    });
    if (deadline.signal.aborted) return onAbort();
    deadline.signal.addEventListener('abort', onAbort, { once: true });

    stream = session.request(
      {
        [h2.HTTP2_HEADER_METHOD]: 'POST',
        [h2.HTTP2_HEADER_PATH]: CHECK_PATH,
        [h2.HTTP2_HEADER_SCHEME]: 'http',
        // grpc-go uses the dial target as :authority, port included (Node would drop a default port).
        [h2.HTTP2_HEADER_AUTHORITY]: authority,
        'content-type': 'application/grpc',
        te: 'trailers',
        'user-agent': `kube-probe/${kubeVersion}`,
        'grpc-timeout': `${Math.max(1, Math.floor(deadline.remainingMs()))}m`,
      },
      { endStream: false },
    );
    stream.on('error', (err) => {
      if (settled) return;
      // A server that resets the stream answered the RPC: grpc-go reports a status, not a dial error.
      const reset = transportReady ? resetStatus(stream?.rstCode, err) : undefined;
      if (reset) done(reset);
      else if (gotResponseHeaders) done({ code: 13, message: err.message });
      else connFail(err);
    });
    stream.on('response', (headers) => {
      gotResponseHeaders = true;
      headerStatus = {
        http: Number(headers[h2.HTTP2_HEADER_STATUS]),
        contentType: String(headers['content-type'] ?? ''),
        code: headers['grpc-status'] as string | undefined,
        message: headers['grpc-message'] as string | undefined,
      };
    });
    stream.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size > MAX_RESPONSE_BYTES) {
        done({ code: 8, message: `grpc: received message larger than max (${size} vs. ${MAX_RESPONSE_BYTES})` });
        return;
      }
      chunks.push(chunk);
    });
    stream.on('trailers', (trailers) => {
      if (trailers['grpc-status'] !== undefined) headerStatus.code = trailers['grpc-status'] as string;
      if (trailers['grpc-message'] !== undefined) headerStatus.message = trailers['grpc-message'] as string;
    });
    stream.on('close', () => {
      if (settled) return;
      if (!gotResponseHeaders) return connFail(new Error(`stream closed with code ${stream?.rstCode ?? 'unknown'}`));
      done(finishRpc(headerStatus, Buffer.concat(chunks)));
    });
    stream.end(grpcFrame(encodeHealthCheckRequest(service)));
  });
}

/** grpc-go's status for a stream the server reset (http2Client.handleRSTStream), when `err` reports one. */
function resetStatus(rstCode: number | undefined, err: unknown): RpcResult | undefined {
  if ((err as NodeJS.ErrnoException | undefined)?.code !== 'ERR_HTTP2_STREAM_ERROR' || rstCode === undefined) return undefined;
  const name = H2_ERROR_NAMES[rstCode] ?? `unknown error code 0x${rstCode.toString(16)}`;
  return { code: RST_STREAM_CODES[rstCode] ?? 2, message: `stream terminated by RST_STREAM with error code: ${name}` };
}

/** Turns response headers/trailers/body into a status, with grpc-go's HTTP-status fallback. */
function finishRpc(h: { code?: string; message?: string; http?: number; contentType?: string }, body: Buffer): RpcResult {
  if (h.code === undefined) {
    if (h.http !== 200) return { code: httpStatusToCode(h.http ?? 0), message: `unexpected HTTP status code received from server: ${h.http}` };
    if (!h.contentType?.startsWith('application/grpc')) return { code: 13, message: `transport: received unexpected content-type ${JSON.stringify(h.contentType)}` };
    return { code: 13, message: 'server closed the stream without sending trailers' };
  }
  const code = /^\d{1,2}$/.test(h.code) ? Number(h.code) : 2;
  const message = percentDecode(h.message ?? '');
  if (code !== 0) return { code, message };
  if (body.length < 5) return { code: 13, message: 'cardinality violation: expected <Response> but got <EOF>' };
  if (body[0] !== 0) return { code: 13, message: 'grpc: compressed message received but no compression was negotiated' };
  const len = body.readUInt32BE(1);
  if (body.length < 5 + len) return { code: 13, message: 'grpc: truncated response message' };
  return { code: 0, message: '', response: body.subarray(5, 5 + len) };
}

/** grpc-go's mapping of a non-200 HTTP status when no grpc-status came (HTTP to gRPC status, gRPC doc). */
function httpStatusToCode(status: number): number {
  if (status === 400) return 13;
  if (status === 401) return 16;
  if (status === 403) return 7;
  if (status === 404) return UNIMPLEMENTED;
  if (status === 429 || status === 502 || status === 503 || status === 504) return 14;
  return 2;
}
