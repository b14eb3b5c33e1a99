/**
 * The agent's lean server on the kubelet shim's own socket (agent/contract/shim-socket.ts):
 * ExecSync and nothing else, on our own unary HTTP/2 server (agent/http2/unary-server.ts: frames and HPACK we own, no
 * node:http2 or grpc-js objects). The request's message bytes go to the ExecSync handler as they
 * came (exec-sync.ts reads them) and its answer's bytes go back as they are; the status codes,
 * messages and the not-started trailer are those grpc-js gives the same call on the ProbeService
 * socket. Any other method is answered UNIMPLEMENTED.
 */
import { EventEmitter } from 'node:events';
import type { Duplex } from 'node:stream';
import type { ByteChannel } from '../io/lean-socket.ts';
import type { HeaderField } from '../http2/hpack.ts';
import { UnaryH2Server, type UnaryH2Stream } from '../http2/unary-server.ts';
import { readFrame } from '../grpc/frame.ts';
import { parseGrpcTimeout } from '../grpc/headers.ts';
import { GrpcCode } from '../grpc/status.ts';
import { NOT_STARTED_TRAILER } from '../contract/hook-refusal.ts';
import { grpcStatusFor, NotStartedError, type CallLike } from './probe-call.ts';
import { SHIM_EXEC_SYNC_PATH } from '../contract/shim-socket.ts';

/**
 * Serves one ExecSync: the request's message bytes and the call (deadline, cancellation) in, the
 * response's message bytes out; rejects with the error to answer (grpcStatusFor maps it).
 */
export type ExecSyncServe = (request: Buffer, call: CallLike) => Promise<Buffer>;

/** Limits of the lean server, the same the grpc-js server has. */
export interface HotUnaryLimits {
  maxRequestBytes: number;
  maxConcurrentStreams: number;
}

/** What the call runners read of one call: its deadline (from grpc-timeout) and 'cancelled' when the client resets the stream. */
class LeanCall extends EventEmitter implements CallLike {
  readonly #deadline: number;

  constructor(headers: readonly HeaderField[]) {
    super();
    let ms: number | undefined;
    for (const f of headers) if (f.name === 'grpc-timeout') ms = parseGrpcTimeout(f.value);
    this.#deadline = ms === undefined ? Infinity : Date.now() + ms;
  }

  getDeadline(): number {
    return this.#deadline;
  }
}

/** The shim socket's server; the agent hands it every connection accepted there. */
export class HotUnaryServer {
  readonly #h2: UnaryH2Server;
  readonly #execSync: ExecSyncServe;

  constructor(execSync: ExecSyncServe, limits: HotUnaryLimits) {
    this.#execSync = execSync;
    this.#h2 = new UnaryH2Server(limits, (stream) => this.#onCall(stream));
  }

  /** Takes a connection. */
  emit(event: 'connection', connection: Duplex | ByteChannel): boolean {
    return this.#h2.emit(event, connection);
  }

  /** Connections open now (for the drain and tests). */
  get sessions(): number {
    return this.#h2.connections;
  }

  /** GOAWAY to every connection: calls in flight finish, new streams are not started (as grpc-js tryShutdown does). Resolves when all are closed. */
  close(): Promise<void> {
    return this.#h2.close();
  }

  /** Cuts every connection (forceShutdown). */
  destroy(): void {
    this.#h2.destroy();
  }

  #onCall(stream: UnaryH2Stream): void {
    let path = '';
    let verb = '';
    let ct = '';
    for (const f of stream.headers) {
      if (f.name === ':path') path = f.value;
      else if (f.name === ':method') verb = f.value;
      else if (f.name === 'content-type') ct = f.value;
    }
    if (path !== SHIM_EXEC_SYNC_PATH) {
      stream.status(GrpcCode.UNIMPLEMENTED, `${path}: the kubelet shim's socket serves only ExecSync; other clients use the ProbeService socket`);
      return;
    }
    if (verb !== 'POST' || !ct.startsWith('application/grpc')) {
      stream.status(GrpcCode.INTERNAL, 'not a gRPC request');
      return;
    }
    const msg = readFrame(stream.body, true);
    if (typeof msg === 'string') {
      stream.status(GrpcCode.INTERNAL, msg === 'compressed' ? 'compressed messages are not supported' : 'malformed gRPC message framing');
      return;
    }
    const call = new LeanCall(stream.headers);
    stream.oncancel = () => call.emit('cancelled', 'cancelled');
    this.#execSync(msg, call).then(
      (answer) => {
        stream.oncancel = undefined;
        if (stream.open) stream.message(answer);
      },
      (err: unknown) => {
        stream.oncancel = undefined;
        if (!stream.open) return;
        const st = grpcStatusFor(err);
        stream.status(st.code, st.details, err instanceof NotStartedError ? [{ name: NOT_STARTED_TRAILER, value: err.why }] : undefined);
      },
    );
  }
}
