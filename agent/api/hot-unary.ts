/**
 * The agent's lean server for the shim's hot calls, ExecSync (today's shim) and Probe and
 * RunLifecycleHandler (older shims): our own
 * unary HTTP/2 server (agent/http2/unary-server.ts: frames and HPACK we own, no node:http2 stream
 * objects) with the messages read and written by hand (agent/grpc/protowire.ts), beside grpc-js for everything else.
 * The ProbeService contract is unchanged: the same socket, paths, messages, status codes and
 * trailers. A connection comes here only when its first request is one of those methods from a
 * client that is no gRPC library (the shim's own client, old or new; see routeConnection); every
 * other connection goes to grpc-js. Each call goes through the very handler function grpc-js
 * calls (ProbeApiServer's #unary wrappers: draining, admission, in-flight accounting, metrics),
 * with a call object that carries what those handlers read: the request, the deadline from
 * grpc-timeout, and 'cancelled' when the client resets the stream.
 */
import { EventEmitter } from 'node:events';
import type { Duplex } from 'node:stream';
import * as grpc from '@grpc/grpc-js';
import type { HeaderField } from '../http2/hpack.ts';
import type { ConnectionTarget } from '../http2/handoff.ts';
import { UnaryH2Server, type UnaryH2Stream } from '../http2/unary-server.ts';
import { readFrame } from '../grpc/frame.ts';
import { parseGrpcTimeout } from '../grpc/headers.ts';
import { readFields, WireError, WireWriter, type WireValue } from '../grpc/protowire.ts';
import type {
  WireHttpGetAction, WireHttpHeader, WireIntOrString, WireLifecycleHook, WireLifecycleRequest, WireLifecycleResponse, WireProbeHandler,
  WireProbePhases, WireProbeRequest, WireProbeResponse, WireProbeResult, WireProbeType, WireTcpSocketAction,
} from './proto.ts';

const SERVICE_PATH = '/probe.v1alpha1.ProbeService/';
/** The methods served here. */
export const HOT_PATHS = { probe: `${SERVICE_PATH}Probe`, hook: `${SERVICE_PATH}RunLifecycleHandler`, execSync: `${SERVICE_PATH}ExecSync` } as const;

/** Whether a connection whose first request has these header fields is served here: a hot method, not from a gRPC library. */
export function isHotConnection(first: readonly HeaderField[]): boolean {
  let path = '';
  let agent = '';
  for (const f of first) {
    if (f.name === ':path') path = f.value;
    else if (f.name === 'user-agent') agent = f.value;
  }
  // grpc-js, grpc-go and friends may multiplex any method on the connection: they stay with grpc-js.
  return (path === HOT_PATHS.execSync || path === HOT_PATHS.probe || path === HOT_PATHS.hook) && !agent.startsWith('grpc-');
}

// ---- hand decoding of the two requests (field numbers of proto/probe/v1alpha1/api.proto) ----

const utf8 = (v: WireValue): string => (Buffer.isBuffer(v) ? v.toString('utf8') : '');
const PROBE_TYPE_NAMES: WireProbeType[] = ['PROBE_TYPE_UNSPECIFIED', 'PROBE_TYPE_LIVENESS', 'PROBE_TYPE_READINESS', 'PROBE_TYPE_STARTUP'];
const HOOK_NAMES: WireLifecycleHook[] = ['LIFECYCLE_HOOK_UNSPECIFIED', 'LIFECYCLE_HOOK_POST_START', 'LIFECYCLE_HOOK_PRE_STOP'];
const RESULT_NUMBERS: Record<WireProbeResult, number> = {
  PROBE_RESULT_UNKNOWN: 0, PROBE_RESULT_SUCCESS: 1, PROBE_RESULT_WARNING: 2, PROBE_RESULT_FAILURE: 3, PROBE_RESULT_ERROR: 4,
};

/** An int32 field (readFields gives negatives, sent as 10-byte varints, signed); 32 bits as protobufjs keeps them. */
function int32(v: WireValue): number {
  return typeof v === 'number' ? v | 0 : 0;
}

function intOrString(b: Buffer): WireIntOrString {
  const out: WireIntOrString = {};
  readFields(b, (f, v) => {
    if (f === 1 && typeof v === 'number') {
      out.int_val = int32(v);
      out.value = 'int_val';
    } else if (f === 2) {
      out.str_val = utf8(v);
      out.value = 'str_val';
    }
  });
  return out;
}

function httpGet(b: Buffer): WireHttpGetAction {
  const out: Required<Pick<WireHttpGetAction, 'path' | 'host' | 'scheme' | 'http_headers'>> & WireHttpGetAction = { path: '', port: null, host: '', scheme: '', http_headers: [] };
  readFields(b, (f, v) => {
    if (f === 1) out.path = utf8(v);
    else if (f === 2 && Buffer.isBuffer(v)) out.port = intOrString(v);
    else if (f === 3) out.host = utf8(v);
    else if (f === 4) out.scheme = utf8(v);
    else if (f === 5 && Buffer.isBuffer(v)) {
      const h: WireHttpHeader = { name: '', value: '', value_from: '' };
      readFields(v, (hf, hv) => {
        if (hf === 1) h.name = utf8(hv);
        else if (hf === 2) h.value = utf8(hv);
        else if (hf === 100) h.value_from = utf8(hv);
      });
      out.http_headers.push(h);
    }
  });
  return out;
}

function tcpSocket(b: Buffer): WireTcpSocketAction {
  const out: WireTcpSocketAction = { port: null, host: '' };
  readFields(b, (f, v) => {
    if (f === 1 && Buffer.isBuffer(v)) out.port = intOrString(v);
    else if (f === 2) out.host = utf8(v);
  });
  return out;
}

function handler(b: Buffer, grpcAllowed: boolean): WireProbeHandler {
  const out: WireProbeHandler = { http_get: null, tcp_socket: null };
  if (grpcAllowed) out.grpc = null;
  readFields(b, (f, v) => {
    if (!Buffer.isBuffer(v)) return;
    if (f === 2) out.http_get = httpGet(v);
    else if (f === 3) out.tcp_socket = tcpSocket(v);
    else if (f === 4 && grpcAllowed) {
      const g = { port: 0, service: '' };
      readFields(v, (gf, gv) => {
        if (gf === 1) g.port = int32(gv);
        else if (gf === 2) g.service = utf8(gv);
      });
      out.grpc = g;
    }
  });
  return out;
}

/** A ProbeRequest as grpc-js (proto-loader, LOADER_OPTIONS) would hand it to the handler. */
export function decodeProbeRequest(msg: Buffer): WireProbeRequest {
  const req: WireProbeRequest = {
    pod_uid: '', pod_sandbox_id: '', container_name: '', handler: null, timeout_seconds: 0, pod_namespace: '', pod_name: '', container_id: '', probe_type: 'PROBE_TYPE_UNSPECIFIED',
  };
  readFields(msg, (f, v) => {
    switch (f) {
      case 1: req.pod_uid = utf8(v); break;
      case 2: req.pod_sandbox_id = utf8(v); break;
      case 3: req.container_name = utf8(v); break;
      case 4: if (Buffer.isBuffer(v)) req.handler = handler(v, true); break;
      case 5: req.timeout_seconds = int32(v); break;
      case 6: req.pod_namespace = utf8(v); break;
      case 7: req.pod_name = utf8(v); break;
      case 8: req.container_id = utf8(v); break;
      case 9: if (typeof v === 'number') req.probe_type = PROBE_TYPE_NAMES[v] ?? v; break;
      default: break;
    }
  });
  return req;
}

/** A RunLifecycleHandlerRequest as grpc-js would hand it to the handler. */
export function decodeLifecycleRequest(msg: Buffer): WireLifecycleRequest {
  const req: WireLifecycleRequest = { pod_uid: '', pod_sandbox_id: '', container_name: '', handler: null, hook: 'LIFECYCLE_HOOK_UNSPECIFIED', timeout_seconds: 0, container_id: '' };
  readFields(msg, (f, v) => {
    switch (f) {
      case 1: req.pod_uid = utf8(v); break;
      case 2: req.pod_sandbox_id = utf8(v); break;
      case 3: req.container_name = utf8(v); break;
      case 4: if (Buffer.isBuffer(v)) req.handler = handler(v, false); break;
      case 5: if (typeof v === 'number') req.hook = HOOK_NAMES[v] ?? v; break;
      case 6: req.timeout_seconds = int32(v); break;
      case 7: req.container_id = utf8(v); break;
      default: break;
    }
  });
  return req;
}

const PHASE_FIELDS: [keyof WireProbePhases, number][] = [['queue_seconds', 1], ['helper_seconds', 2], ['connect_seconds', 3], ['tls_seconds', 4], ['first_byte_seconds', 5]];

/** A ProbeResponse's bytes. */
export function encodeProbeResponse(r: WireProbeResponse): Buffer {
  const w = new WireWriter().varint(1, RESULT_NUMBERS[r.result] ?? 0).bytes(2, r.message).double(3, r.duration_seconds);
  if (r.phases) {
    const p = new WireWriter();
    // proto3 `optional`: present fields are written even when zero.
    for (const [name, field] of PHASE_FIELDS) {
      const v = r.phases[name];
      if (typeof v === 'number') p.doubleAlways(field, v);
    }
    p.double(6, r.phases.total_seconds);
    w.bytes(4, p.finish(), true);
  }
  return w.bytes(5, r.reason).bytes(6, r.address).finish();
}

/** A RunLifecycleHandlerResponse's bytes. */
export function encodeLifecycleResponse(r: WireLifecycleResponse): Buffer {
  return new WireWriter().varint(1, RESULT_NUMBERS[r.result] ?? 0).bytes(2, r.message).double(3, r.duration_seconds).finish();
}

// ---- the call object the shared handlers see ----

/** The parts of grpc.ServerUnaryCall the ProbeService handlers read, over one HTTP/2 stream. */
class HotCall<Req> extends EventEmitter {
  readonly request: Req;
  readonly metadata: grpc.Metadata;
  cancelled = false;
  readonly #deadline: number;
  readonly #path: string;
  readonly #peer: string;

  constructor(request: Req, headers: readonly HeaderField[], path: string, peer: string) {
    super();
    this.request = request;
    this.#path = path;
    this.#peer = peer;
    let ms: number | undefined;
    this.metadata = new grpc.Metadata();
    for (const { name, value } of headers) {
      if (name === 'grpc-timeout') ms = parseGrpcTimeout(value);
      if (name.startsWith(':') || name === 'content-type' || name === 'te' || name === 'grpc-timeout' || name.endsWith('-bin')) continue;
      this.metadata.add(name, value);
    }
    this.#deadline = ms === undefined ? Infinity : Date.now() + ms;
  }

  getDeadline(): grpc.Deadline {
    return this.#deadline;
  }

  getPath(): string {
    return this.#path;
  }

  getPeer(): string {
    return this.#peer;
  }

  sendMetadata(): void {
    // Headers go out with the answer.
  }

  /** The client reset the stream (or the connection closed) before the answer: what grpc-js reports as 'cancelled'. */
  cancel(): void {
    if (this.cancelled) return;
    this.cancelled = true;
    this.emit('cancelled', 'cancelled');
  }
}

/** A unary handler as grpc-js takes it. */
type Unary = (call: grpc.ServerUnaryCall<never, never>, callback: grpc.sendUnaryData<never>) => void;

/** The handlers, as registered with grpc-js (ExecSync's take and give message bytes: exec-sync.ts). */
export interface HotHandlers {
  probe: grpc.handleUnaryCall<WireProbeRequest, WireProbeResponse>;
  hook: grpc.handleUnaryCall<WireLifecycleRequest, WireLifecycleResponse>;
  execSync: grpc.handleUnaryCall<Buffer, Buffer>;
}

/** Limits of the lean server, the same the grpc-js server has. */
export interface HotUnaryLimits {
  maxRequestBytes: number;
  maxConcurrentStreams: number;
}

/**
 * The lean server for ExecSync, Probe and RunLifecycleHandler; connections come from routeConnection. The
 * HTTP/2 is our own (agent/http2/unary-server.ts): no node:http2 session, stream or header objects.
 */
export class HotUnaryServer implements ConnectionTarget {
  readonly #h2: UnaryH2Server;
  readonly #handlers: HotHandlers;

  constructor(handlers: HotHandlers, limits: HotUnaryLimits) {
    this.#handlers = handlers;
    this.#h2 = new UnaryH2Server(limits, (stream) => this.#onCall(stream));
  }

  /** Takes a connection (ConnectionTarget). */
  emit(event: 'connection', connection: Duplex): boolean {
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
    const method = path === HOT_PATHS.execSync ? 'execSync' : path === HOT_PATHS.probe ? 'probe' : path === HOT_PATHS.hook ? 'hook' : undefined;
    if (method === undefined) {
      respondStatus(stream, grpc.status.UNIMPLEMENTED, `${path}: this connection serves only ExecSync, Probe and RunLifecycleHandler; other methods are served on connections whose first call is another method`);
      return;
    }
    if (verb !== 'POST' || !ct.startsWith('application/grpc')) {
      respondStatus(stream, grpc.status.INTERNAL, 'not a gRPC request');
      return;
    }
    const body = stream.body;
    const msg = readFrame(body, true);
    if (typeof msg === 'string') {
      respondStatus(stream, grpc.status.INTERNAL, msg === 'compressed' ? 'compressed messages are not supported' : 'malformed gRPC message framing');
      return;
    }
    let request: WireProbeRequest | WireLifecycleRequest | Buffer;
    try {
      // ExecSync's handler reads the message bytes itself (exec-sync.ts).
      request = method === 'execSync' ? msg : method === 'probe' ? decodeProbeRequest(msg) : decodeLifecycleRequest(msg);
    } catch (err) {
      respondStatus(stream, grpc.status.INTERNAL, `Error deserializing request: ${err instanceof WireError ? err.message : String(err)}`);
      return;
    }
    const call = new HotCall(request, stream.headers, path, stream.peer);
    stream.oncancel = () => call.cancel();
    const callback = (err: grpc.ServiceError | Partial<grpc.StatusObject> | null, res?: unknown): void => {
      stream.oncancel = undefined;
      if (!stream.open) return;
      if (err) {
        respondStatus(stream, err.code ?? grpc.status.UNKNOWN, err.details ?? '', err.metadata ?? undefined);
        return;
      }
      stream.message(method === 'execSync' ? (res as Buffer) : method === 'probe' ? encodeProbeResponse(res as WireProbeResponse) : encodeLifecycleResponse(res as WireLifecycleResponse));
    };
    (this.#handlers[method] as unknown as Unary)(call as unknown as grpc.ServerUnaryCall<never, never>, callback as grpc.sendUnaryData<never>);
  }
}

function respondStatus(stream: UnaryH2Stream, code: number, details: string, metadata?: grpc.Metadata): void {
  const extra: HeaderField[] = [];
  if (metadata) {
    for (const [k, v] of Object.entries(metadata.getMap())) if (typeof v === 'string') extra.push({ name: k, value: v });
  }
  stream.status(code, details, extra);
}
