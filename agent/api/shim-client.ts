/**
 * The kubelet shim's lean ProbeService client: node:http2 straight to the agent's unix socket,
 * messages encoded by hand (protowire.ts). It speaks only Probe and RunLifecycleHandler, loads no
 * proto files and no gRPC library, so the shim starts in tens of milliseconds and a call costs
 * microseconds of its CPU. One HTTP/2 connection, rebuilt on demand after the agent restarts;
 * every call has a deadline, so a slow agent costs the caller only its own call.
 */
import * as http2 from 'node:http2';
import * as net from 'node:net';
import { decodeGrpcMessage, grpcFrame, readFields, WireWriter } from './protowire.ts';

/** gRPC status codes the shim uses (numbers from the gRPC spec). */
export const GrpcCode = {
  OK: 0, CANCELLED: 1, UNKNOWN: 2, INVALID_ARGUMENT: 3, DEADLINE_EXCEEDED: 4, NOT_FOUND: 5,
  FAILED_PRECONDITION: 9, UNIMPLEMENTED: 12, INTERNAL: 13, UNAVAILABLE: 14, RESOURCE_EXHAUSTED: 8,
} as const;

/** ProbeResult numbers of api.proto. */
export const WireResult = { UNKNOWN: 0, SUCCESS: 1, WARNING: 2, FAILURE: 3, ERROR: 4 } as const;

/** ProbeType numbers of api.proto. */
export const WireProbeType = { liveness: 1, readiness: 2, startup: 3 } as const;

/** LifecycleHook numbers of api.proto. */
export const WireHook = { postStart: 1, preStop: 2 } as const;

/**
 * Why a call to the agent did not give an answer: 'unreachable' (no connection, nothing was
 * sent), 'broken' (the connection broke during the call), 'deadline', or 'status' (a gRPC error).
 */
export type AgentCallFailure = 'unreachable' | 'broken' | 'deadline' | 'status';

const NOT_LISTENING = new Set(['ECONNREFUSED', 'ENOENT', 'EACCES', 'ENOTSOCK']);

/** A ProbeService call that returned no answer: the agent was unreachable, too slow, or answered a gRPC error. */
export class AgentCallError extends Error {
  readonly failure: AgentCallFailure;
  /** The agent's gRPC status when failure is 'status'; UNAVAILABLE / DEADLINE_EXCEEDED otherwise. */
  readonly grpcCode: number;
  constructor(failure: AgentCallFailure, grpcCode: number, message: string) {
    super(message);
    this.name = 'AgentCallError';
    this.failure = failure;
    this.grpcCode = grpcCode;
  }
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

  constructor(socketPath: string) {
    this.#socketPath = socketPath;
  }

  /** Probe RPC. */
  probe(req: ShimProbeRequest, deadlineMs: number): Promise<AgentAnswer> {
    const msg = new WireWriter()
      .bytes(4, req.handler, true)
      .varint(5, req.timeoutSeconds)
      .bytes(8, req.containerId)
      .varint(9, req.probeType)
      .finish();
    return this.#unary('Probe', msg, deadlineMs);
  }

  /** RunLifecycleHandler RPC. */
  runLifecycleHandler(req: ShimHookRequest, deadlineMs: number): Promise<AgentAnswer> {
    const msg = new WireWriter()
      .bytes(4, req.handler, true)
      .varint(5, req.hook)
      .varint(6, req.timeoutSeconds)
      .bytes(7, req.containerId)
      .finish();
    return this.#unary('RunLifecycleHandler', msg, deadlineMs);
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
    // An idle connection must not keep the shim's event loop alive on shutdown.
    session.unref();
    this.#session = session;
    return session;
  }

  #unary(method: string, message: Buffer, deadlineMs: number): Promise<AgentAnswer> {
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
        if (stream && !stream.closed) stream.close(http2.constants.NGHTTP2_CANCEL);
        if (err) reject(err);
        else resolve(answer as AgentAnswer);
      };
      const timer = setTimeout(() => {
        finish(new AgentCallError('deadline', GrpcCode.DEADLINE_EXCEEDED, `probe-agent did not answer ${method} within ${deadlineMs} ms`));
      }, deadlineMs);
      let session: http2.ClientHttp2Session;
      try {
        session = this.#connect();
        stream = session.request({
          ':method': 'POST',
          ':path': SERVICE + method,
          'content-type': 'application/grpc',
          te: 'trailers',
          'grpc-timeout': `${Math.max(1, Math.ceil(deadlineMs))}m`,
        });
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
          finish(new AgentCallError('status', GrpcCode.RESOURCE_EXHAUSTED, `probe-agent ${method} answer larger than ${MAX_RESPONSE} bytes`));
          return;
        }
        chunks.push(c);
      });
      stream.on('error', (err: NodeJS.ErrnoException) => {
        const failure = NOT_LISTENING.has(err.code ?? '') ? 'unreachable' : 'broken';
        finish(new AgentCallError(failure, GrpcCode.UNAVAILABLE, `probe-agent ${method} on ${this.#socketPath}: ${err.message}`));
      });
      stream.on('close', () => {
        if (settled) return;
        const meta = trailers ?? headers;
        if (!meta) {
          finish(new AgentCallError('broken', GrpcCode.UNAVAILABLE, `probe-agent ${method} on ${this.#socketPath}: connection closed without an answer`));
          return;
        }
        const code = Number(meta['grpc-status'] ?? GrpcCode.UNKNOWN);
        if (code !== GrpcCode.OK) {
          const msg = decodeGrpcMessage(String(meta['grpc-message'] ?? ''));
          finish(new AgentCallError('status', code, msg || `probe-agent ${method} failed with gRPC status ${code}`));
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
