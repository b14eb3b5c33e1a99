/**
 * The kubelet shim's lean ProbeService client: node:http2 straight to the agent's unix socket,
 * messages encoded by hand (protowire.ts). It speaks only Probe and RunLifecycleHandler, loads no
 * proto files and no gRPC library, so the shim starts in tens of milliseconds and a call costs
 * microseconds of its CPU. One HTTP/2 connection, rebuilt on demand after the agent restarts;
 * every call has a deadline, so a slow agent costs the caller only its own call.
 */
import * as http2 from 'node:http2';
import * as net from 'node:net';
import { NOT_STARTED_TRAILER } from './hook-refusal.ts';
import { decodeGrpcMessage, grpcFrame, readFields, WireWriter } from './protowire.ts';

/** gRPC status codes the shim uses (numbers from the gRPC spec). */
export const GrpcCode = {
  OK: 0, CANCELLED: 1, UNKNOWN: 2, INVALID_ARGUMENT: 3, DEADLINE_EXCEEDED: 4, NOT_FOUND: 5,
  PERMISSION_DENIED: 7, FAILED_PRECONDITION: 9, UNIMPLEMENTED: 12, INTERNAL: 13, UNAVAILABLE: 14, RESOURCE_EXHAUSTED: 8,
} as const;

/** ProbeResult numbers of api.proto. */
export const WireResult = { UNKNOWN: 0, SUCCESS: 1, WARNING: 2, FAILURE: 3, ERROR: 4 } as const;

/** ProbeType numbers of api.proto. */
export const WireProbeType = { liveness: 1, readiness: 2, startup: 3 } as const;

/** LifecycleHook numbers of api.proto. */
export const WireHook = { postStart: 1, preStop: 2 } as const;

/**
 * Why a call to the agent did not give an answer: 'unreachable' (no connection, nothing was
 * sent), 'broken' (the connection broke during the call), 'deadline', 'cancelled' (the caller
 * gave up), or 'status' (a gRPC error).
 */
export type AgentCallFailure = 'unreachable' | 'broken' | 'deadline' | 'cancelled' | 'status';

const NOT_LISTENING = new Set(['ECONNREFUSED', 'ENOENT', 'EACCES', 'ENOTSOCK']);

/** A ProbeService call that returned no answer: the agent was unreachable, too slow, or answered a gRPC error. */
export class AgentCallError extends Error {
  readonly failure: AgentCallFailure;
  /** The agent's gRPC status when failure is 'status'; UNAVAILABLE / DEADLINE_EXCEEDED / CANCELLED otherwise. */
  readonly grpcCode: number;
  /**
   * True only when the agent certainly did not start the call: no connection was ever made, the
   * stream was refused (HTTP/2 REFUSED_STREAM), the agent refused admission (RESOURCE_EXHAUSTED),
   * or it refused a hook while draining (NOT_STARTED_TRAILER). Only such a hook may be sent again.
   */
  readonly notStarted: boolean;
  constructor(failure: AgentCallFailure, grpcCode: number, message: string, notStarted = failure === 'unreachable') {
    super(message);
    this.name = 'AgentCallError';
    this.failure = failure;
    this.grpcCode = grpcCode;
    this.notStarted = notStarted;
  }
}

/** Per-call options: deadlineMs undefined = no grpc-timeout sent (kubelet's exec hooks carry none). */
export interface AgentCallOptions {
  /** The call's deadline, sent to the agent as grpc-timeout; undefined sends none. */
  deadlineMs?: number;
  /** Local bound when no deadline is sent (a hung agent must not hold a call forever). */
  lastResortMs?: number;
  /** Aborting it cancels the call (RST_STREAM CANCEL: the agent aborts what it runs). */
  signal?: AbortSignal;
}

/** The answer of Probe or RunLifecycleHandler. */
export interface AgentAnswer {
  result: number;
  message: string;
  reason: string;
  durationSeconds: number;
}

/** Probe request, with the handler already encoded (handler-wire.ts). */
export interface ShimProbeRequest {
  containerId: string;
  handler: Buffer;
  timeoutSeconds: number;
  probeType: number;
}

/** RunLifecycleHandler request, with the handler already encoded. */
export interface ShimHookRequest {
  containerId: string;
  handler: Buffer;
  hook: number;
  timeoutSeconds: number;
}

const SERVICE = '/probe.v1alpha1.ProbeService/';
const MAX_RESPONSE = 64 * 1024;

/** A connection to one agent socket. */
export class ShimProbeClient {
  readonly #socketPath: string;
  #session: http2.ClientHttp2Session | undefined;
  /** Sessions whose socket connected: a stream that failed on any other session sent nothing. */
  readonly #connected = new WeakSet<http2.ClientHttp2Session>();

  constructor(socketPath: string) {
    this.#socketPath = socketPath;
  }

  /** Probe RPC; aborting `signal` cancels it. */
  probe(req: ShimProbeRequest, deadlineMs: number, signal?: AbortSignal): Promise<AgentAnswer> {
    const msg = new WireWriter()
      .bytes(4, req.handler, true)
      .varint(5, req.timeoutSeconds)
      .bytes(8, req.containerId)
      .varint(9, req.probeType)
      .finish();
    return this.#unary('Probe', msg, signal ? { deadlineMs, signal } : { deadlineMs });
  }

  /** RunLifecycleHandler RPC (a number is a deadline, sent to the agent as grpc-timeout). */
  runLifecycleHandler(req: ShimHookRequest, opts: number | AgentCallOptions): Promise<AgentAnswer> {
    const msg = new WireWriter()
      .bytes(4, req.handler, true)
      .varint(5, req.hook)
      .varint(6, req.timeoutSeconds)
      .bytes(7, req.containerId)
      .finish();
    return this.#unary('RunLifecycleHandler', msg, typeof opts === 'number' ? { deadlineMs: opts } : opts);
  }

  /** Closes the connection; a later call opens a new one. */
  close(): void {
    const s = this.#session;
    this.#session = undefined;
    s?.destroy();
  }

  #connect(): http2.ClientHttp2Session {
    const cur = this.#session;
    if (cur && !cur.closed && !cur.destroyed) return cur;
    const path = this.#socketPath;
    const session = http2.connect('http://probe-agent', { createConnection: () => net.connect(path) });
    const drop = (): void => {
      if (this.#session === session) this.#session = undefined;
    };
    session.on('error', drop);
    session.on('close', drop);
    session.on('goaway', drop);
    session.once('connect', () => this.#connected.add(session));
    // An idle connection must not keep the shim's event loop alive on shutdown.
    session.unref();
    this.#session = session;
    return session;
  }

  #unary(method: string, message: Buffer, opts: AgentCallOptions): Promise<AgentAnswer> {
    const { deadlineMs, signal } = opts;
    const boundMs = deadlineMs ?? opts.lastResortMs;
    return new Promise<AgentAnswer>((resolve, reject) => {
      let settled = false;
      const chunks: Buffer[] = [];
      let size = 0;
      let headers: http2.IncomingHttpHeaders | undefined;
      let trailers: http2.IncomingHttpHeaders | undefined;
      let stream: http2.ClientHttp2Stream | undefined;
      const finish = (err: AgentCallError | null, answer?: AgentAnswer): void => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
        if (stream && !stream.closed) stream.close(http2.constants.NGHTTP2_CANCEL);
        if (err) reject(err);
        else resolve(answer as AgentAnswer);
      };
      const timer = boundMs === undefined ? undefined : setTimeout(() => {
        finish(new AgentCallError('deadline', GrpcCode.DEADLINE_EXCEEDED, `probe-agent did not answer ${method} within ${boundMs} ms`));
      }, boundMs);
      const onAbort = (): void => {
        finish(new AgentCallError('cancelled', GrpcCode.CANCELLED, `${method} cancelled by the caller`));
      };
      if (signal?.aborted) {
        onAbort();
        return;
      }
      signal?.addEventListener('abort', onAbort, { once: true });
      let session: http2.ClientHttp2Session;
      try {
        session = this.#connect();
        const headers: http2.OutgoingHttpHeaders = {
          ':method': 'POST',
          ':path': SERVICE + method,
          'content-type': 'application/grpc',
          te: 'trailers',
        };
        if (deadlineMs !== undefined) headers['grpc-timeout'] = `${Math.max(1, Math.ceil(deadlineMs))}m`;
        stream = session.request(headers);
      } catch (err) {
        finish(new AgentCallError('unreachable', GrpcCode.UNAVAILABLE, `cannot reach probe-agent on ${this.#socketPath}: ${(err as Error).message}`));
        return;
      }
      stream.on('response', (h) => {
        headers = h;
      });
      stream.on('trailers', (t) => {
        trailers = t;
      });
      stream.on('data', (c: Buffer) => {
        size += c.length;
        if (size > MAX_RESPONSE) {
          // The agent ran the call: this is no admission refusal, so notStarted stays false.
          finish(new AgentCallError('status', GrpcCode.RESOURCE_EXHAUSTED, `probe-agent ${method} answer larger than ${MAX_RESPONSE} bytes`, false));
          return;
        }
        chunks.push(c);
      });
      stream.on('error', (err: NodeJS.ErrnoException) => {
        // A socket that never connected surfaces as ERR_HTTP2_STREAM_CANCEL with the ENOENT or
        // ECONNREFUSED only as its cause: what matters is that nothing reached the agent.
        const cause = (err.cause as NodeJS.ErrnoException | undefined)?.code ?? '';
        const unreachable = NOT_LISTENING.has(err.code ?? '') || NOT_LISTENING.has(cause) || !this.#connected.has(session);
        const refused = stream?.rstCode === http2.constants.NGHTTP2_REFUSED_STREAM;
        const why = cause && !err.message.includes(cause) ? `${err.message} (${cause})` : err.message;
        finish(new AgentCallError(unreachable ? 'unreachable' : 'broken', GrpcCode.UNAVAILABLE, `probe-agent ${method} on ${this.#socketPath}: ${why}`, unreachable || refused));
      });
      stream.on('close', () => {
        if (settled) return;
        const meta = trailers ?? headers;
        if (!meta) {
          const unsent = !this.#connected.has(session) || stream?.rstCode === http2.constants.NGHTTP2_REFUSED_STREAM;
          finish(new AgentCallError(unsent ? 'unreachable' : 'broken', GrpcCode.UNAVAILABLE, `probe-agent ${method} on ${this.#socketPath}: connection closed without an answer`, unsent));
          return;
        }
        const code = Number(meta['grpc-status'] ?? GrpcCode.UNKNOWN);
        if (code !== GrpcCode.OK) {
          const msg = decodeGrpcMessage(String(meta['grpc-message'] ?? ''));
          // Admission refusals and a draining agent's refusals come before the call starts.
          const notStarted = code === GrpcCode.RESOURCE_EXHAUSTED || meta[NOT_STARTED_TRAILER] !== undefined;
          finish(new AgentCallError('status', code, msg || `probe-agent ${method} failed with gRPC status ${code}`, notStarted));
          return;
        }
        try {
          finish(null, decodeAnswer(Buffer.concat(chunks, size)));
        } catch (err) {
          finish(new AgentCallError('status', GrpcCode.INTERNAL, `probe-agent ${method}: malformed answer: ${(err as Error).message}`));
        }
      });
      stream.end(grpcFrame(message));
    });
  }
}

/** Decodes a ProbeResponse or RunLifecycleHandlerResponse (same leading fields) from a gRPC body. */
function decodeAnswer(body: Buffer): AgentAnswer {
  if (body.length < 5) throw new Error('empty body');
  if (body[0] !== 0) throw new Error('compressed answer');
  const len = body.readUInt32BE(1);
  const msg = body.subarray(5, 5 + len);
  const answer: AgentAnswer = { result: 0, message: '', reason: '', durationSeconds: 0 };
  readFields(msg, (field, value) => {
    if (field === 1 && typeof value === 'number') answer.result = value;
    else if (field === 2 && Buffer.isBuffer(value)) answer.message = value.toString('utf8');
    else if (field === 3 && Buffer.isBuffer(value) && value.length === 8) answer.durationSeconds = value.readDoubleLE(0);
    else if (field === 5 && Buffer.isBuffer(value)) answer.reason = value.toString('utf8');
  });
  return answer;
}
