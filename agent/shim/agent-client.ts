/**
 * The kubelet shim's client of the agent: our own unary HTTP/2 client (agent/http2/unary-client.ts,
 * no node:http2) straight to the agent's socket for the shim (agent/contract/shim-socket.ts). It
 * speaks only ExecSync, whose request is kubelet's own ExecSyncRequest: the shim sends kubelet's
 * gRPC message bytes as they came and gets back the agent's ExecSyncResponse bytes (or a gRPC
 * status), encoding and decoding nothing but the answer's exit_code (one varint, for the shim's
 * metrics). It loads no proto files and no gRPC
 * library, so the shim starts in tens of milliseconds and a call costs microseconds of its CPU.
 * One HTTP/2 connection (more only while every one is at the agent's stream cap), rebuilt on demand
 * after the agent restarts; every probe call has a deadline, so a slow agent costs the caller only
 * its own call.
 */
import { encodeLiteralBlock, type HeaderField } from '../http2/hpack.ts';
import { UnaryH2Client, type UnaryH2Call, type UnaryH2Error, type UnaryH2Response } from '../http2/unary-client.ts';
import { readFrame } from '../grpc/frame.ts';
import { decodeGrpcMessage, formatGrpcTimeout } from '../grpc/headers.ts';
import { readFields } from '../grpc/protowire.ts';
import { GrpcCode, parseGrpcStatus } from '../grpc/status.ts';
import { EXEC_SYNC_RESPONSE as RES } from '../contract/exec-sync-fields.ts';
import { NOT_STARTED_TRAILER } from '../contract/hook-refusal.ts';
import { SHIM_EXEC_SYNC_PATH } from '../contract/shim-socket.ts';

/**
 * Why a call to the agent did not give an answer: 'unreachable' (no connection, nothing was
 * sent), 'broken' (the connection broke during the call), 'deadline', 'cancelled' (the caller
 * gave up), or 'status' (a gRPC error).
 */
export type AgentCallFailure = 'unreachable' | 'broken' | 'deadline' | 'cancelled' | 'status';

/** A ProbeService call that returned no answer: the agent was unreachable, too slow, or answered a gRPC error. */
export class AgentCallError extends Error {
  readonly failure: AgentCallFailure;
  /** The agent's gRPC status when failure is 'status'; UNAVAILABLE / DEADLINE_EXCEEDED / CANCELLED otherwise. */
  readonly grpcCode: number;
  /**
   * True only when the agent certainly did not start the call: no connection was ever made, the
   * stream was refused (HTTP/2 REFUSED_STREAM) or lay above a GOAWAY's last-stream-id, the agent
   * refused admission (RESOURCE_EXHAUSTED), it refused a hook while draining (NOT_STARTED_TRAILER),
   * or it does not serve the method (UNIMPLEMENTED: an agent older than ExecSync). Only such a hook
   * may be sent again.
   */
  readonly notStarted: boolean;
  /**
   * True when no agent is there to answer: unreachable, the connection broke or was sent away
   * (GOAWAY), or the agent refused the call because it is draining. A restarted agent may answer it.
   */
  readonly agentAway: boolean;
  constructor(failure: AgentCallFailure, grpcCode: number, message: string, notStarted = failure === 'unreachable', draining = false) {
    super(message);
    this.name = 'AgentCallError';
    this.failure = failure;
    this.grpcCode = grpcCode;
    this.notStarted = notStarted;
    this.agentAway = failure === 'unreachable' || failure === 'broken' || draining;
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

/** The agent's ExecSyncResponse: its gRPC-framed body as received (relayed to kubelet unchanged) and its exit_code. */
export interface AgentExecAnswer {
  body: Buffer;
  exitCode: number;
}

const MAX_RESPONSE = 64 * 1024;

/** The request header block of each method (literal HPACK, static-table names); grpc-timeout is appended per call. */
const REQUEST_BLOCKS = new Map<string, Buffer>([['ExecSync', encodeLiteralBlock([
  { name: ':method', value: 'POST' },
  { name: ':scheme', value: 'http' },
  { name: ':path', value: SHIM_EXEC_SYNC_PATH },
  { name: ':authority', value: 'probe-agent' },
  { name: 'content-type', value: 'application/grpc' },
  { name: 'te', value: 'trailers' },
])]]);

/** The value of header `name` in a decoded header list, if present. */
function field(fields: readonly HeaderField[] | undefined, name: string): string | undefined {
  if (!fields) return undefined;
  for (const f of fields) if (f.name === name) return f.value;
  return undefined;
}

/**
 * Connections to the agent's socket for the shim: our own unary HTTP/2 client
 * (agent/http2/unary-client.ts), connections multiplexing every call, reopened after the agent
 * restarts. With a fallback socket (the ProbeService socket), a call that finds nothing listening
 * on the shim's socket goes there instead: an agent of the release before the shim's socket serves
 * ExecSync only there (docs/deploy.md, "Upgrades and version skew").
 */
export class ShimProbeClient {
  readonly #socketPath: string;
  readonly #h2: UnaryH2Client;
  readonly #fallback: { socketPath: string; h2: UnaryH2Client } | undefined;
  readonly #onSocketChange: ((socketPath: string, fallback: boolean) => void) | undefined;
  /** Whether the last answered call came through the fallback socket. */
  #onFallback = false;

  /** `onSocketChange` hears when answers start coming through the other socket (for the log). */
  constructor(socketPath: string, fallbackSocketPath?: string, onSocketChange?: (socketPath: string, fallback: boolean) => void) {
    this.#socketPath = socketPath;
    this.#onSocketChange = onSocketChange;
    this.#h2 = new UnaryH2Client(socketPath, { maxResponseBytes: MAX_RESPONSE });
    if (fallbackSocketPath !== undefined && fallbackSocketPath !== socketPath) {
      this.#fallback = { socketPath: fallbackSocketPath, h2: new UnaryH2Client(fallbackSocketPath, { maxResponseBytes: MAX_RESPONSE }) };
    }
  }

  /**
   * ExecSync with kubelet's request body (one uncompressed gRPC frame, sent as it is). Resolves with
   * the agent's ExecSyncResponse; rejects with AgentCallError (a gRPC status, or no answer).
   */
  async execSync(framedRequest: Buffer, opts: AgentCallOptions): Promise<AgentExecAnswer> {
    const fallback = this.#fallback;
    if (fallback === undefined) return this.#unary(this.#h2, this.#socketPath, 'ExecSync', framedRequest, opts);
    const started = performance.now();
    try {
      const answer = await this.#unary(this.#h2, this.#socketPath, 'ExecSync', framedRequest, opts);
      this.#answeredOn(false);
      return answer;
    } catch (err) {
      // 'unreachable': nothing was sent, so the call may go to the other socket.
      if (!(err instanceof AgentCallError) || err.failure !== 'unreachable' || opts.signal?.aborted) throw err;
      const spent = performance.now() - started;
      const rest = { ...opts };
      if (opts.deadlineMs !== undefined) rest.deadlineMs = Math.max(1, opts.deadlineMs - spent);
      try {
        const answer = await this.#unary(fallback.h2, fallback.socketPath, 'ExecSync', framedRequest, rest);
        this.#answeredOn(true);
        return answer;
      } catch (second) {
        // Neither socket listens: the agent is away; say so for the shim's own socket.
        throw second instanceof AgentCallError && second.failure === 'unreachable' ? err : second;
      }
    }
  }

  #answeredOn(fallback: boolean): void {
    if (fallback === this.#onFallback) return;
    this.#onFallback = fallback;
    this.#onSocketChange?.(fallback ? this.#fallback!.socketPath : this.#socketPath, fallback);
  }

  /** Closes the connections; a later call opens new ones. */
  close(): void {
    this.#h2.close();
    this.#fallback?.h2.close();
  }

  #unary(h2: UnaryH2Client, socketPath: string, method: string, framed: Buffer, opts: AgentCallOptions): Promise<AgentExecAnswer> {
    const { deadlineMs, signal } = opts;
    const boundMs = deadlineMs ?? opts.lastResortMs;
    return new Promise<AgentExecAnswer>((resolve, reject) => {
      let settled = false;
      let call: UnaryH2Call | undefined;
      const finish = (err: AgentCallError | null, answer?: AgentExecAnswer): void => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
        if (err) reject(err);
        else resolve(answer as AgentExecAnswer);
      };
      // Deadline and abort reset the stream (RST_STREAM CANCEL): the agent aborts what it runs.
      const timer = boundMs === undefined ? undefined : setTimeout(() => {
        call?.cancel();
        finish(new AgentCallError('deadline', GrpcCode.DEADLINE_EXCEEDED, `probe-agent did not answer ${method} within ${boundMs} ms`));
      }, boundMs);
      const onAbort = (): void => {
        call?.cancel();
        finish(new AgentCallError('cancelled', GrpcCode.CANCELLED, `${method} cancelled by the caller`));
      };
      if (signal?.aborted) {
        onAbort();
        return;
      }
      signal?.addEventListener('abort', onAbort, { once: true });
      let block = REQUEST_BLOCKS.get(method) as Buffer;
      if (deadlineMs !== undefined) block = Buffer.concat([block, encodeLiteralBlock([{ name: 'grpc-timeout', value: formatGrpcTimeout(Math.ceil(deadlineMs)) }])]);
      call = h2.call(block, framed, {
        done: (res) => finish(...answerOf(method, res)),
        fail: (err) => finish(callError(method, socketPath, err)),
      });
    });
  }
}

/** An AgentCallError for a call that got no complete response. */
function callError(method: string, socketPath: string, err: UnaryH2Error): AgentCallError {
  if (err.failure === 'too-large') {
    // The agent ran the call: this is no admission refusal, so notStarted stays false.
    return new AgentCallError('status', GrpcCode.RESOURCE_EXHAUSTED, `probe-agent ${method} answer larger than ${MAX_RESPONSE} bytes`, false);
  }
  if (err.failure === 'unreachable') return new AgentCallError('unreachable', GrpcCode.UNAVAILABLE, `cannot reach probe-agent for ${method}: ${err.message}`, true);
  return new AgentCallError('broken', GrpcCode.UNAVAILABLE, `probe-agent ${method} on ${socketPath}: ${err.message}`, err.notStarted);
}

/** The answer of a complete response, or the error its status says. */
function answerOf(method: string, res: UnaryH2Response): [AgentCallError | null, AgentExecAnswer?] {
  // Trailers, or the headers of a trailers-only response.
  const meta = res.trailers ?? res.headers;
  const code = parseGrpcStatus(field(meta, 'grpc-status')) ?? GrpcCode.UNKNOWN;
  if (code !== GrpcCode.OK) {
    const msg = decodeGrpcMessage(field(meta, 'grpc-message') ?? '');
    // Admission refusals and a draining agent's refusals come before the call starts; so does an
    // agent too old to know the method.
    const draining = field(meta, NOT_STARTED_TRAILER) !== undefined;
    const notStarted = code === GrpcCode.RESOURCE_EXHAUSTED || code === GrpcCode.UNIMPLEMENTED || draining;
    return [new AgentCallError('status', code, msg || `probe-agent ${method} failed with gRPC status ${code}`, notStarted, draining)];
  }
  try {
    return [null, { body: res.body, exitCode: exitCodeOf(res.body) }];
  } catch (err) {
    return [new AgentCallError('status', GrpcCode.INTERNAL, `probe-agent ${method}: malformed answer: ${(err as Error).message}`)];
  }
}

/** The exit_code of a gRPC-framed ExecSyncResponse; throws when the body is not one uncompressed message. */
function exitCodeOf(body: Buffer): number {
  const msg = readFrame(body, true);
  if (typeof msg === 'string') throw new Error(msg === 'compressed' ? 'compressed answer' : 'not one gRPC message');
  let exitCode = 0;
  readFields(msg, (f, value) => {
    // int32: a negative value arrives as a 10-byte varint, which readFields gives signed.
    if (f === RES.exitCode && typeof value === 'number') exitCode = value | 0;
  });
  return exitCode;
}
