/**
 * A kubelet-shaped CRI client for shim tests: grpc-js over a unix socket, as kubelet's Go client
 * is grpc-go over one, speaking proto/cri/runtime_v1.proto. Every call returns the raw response
 * bytes as well as the decoded message, so a test can compare the shim's answers with the
 * runtime's byte for byte. ExecSync is sent as kubelet sends it: deadline = kubelet's runtime
 * request timeout (2 min) + the exec timeout (k8s.io/cri-client remote_runtime.go).
 */
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { CRI_PROTO_PATH } from '../../agent/netns/cri-client.ts';

const SERVICE = 'runtime.v1.RuntimeService';
const defs = protoLoader.loadSync(CRI_PROTO_PATH, { keepCase: false, longs: String, enums: String, defaults: true, oneofs: true });
const service = defs[SERVICE] as protoLoader.ServiceDefinition;

/** kubelet's default --runtime-request-timeout. */
export const KUBELET_RUNTIME_REQUEST_TIMEOUT_MS = 120_000;

/** A unary answer: raw bytes plus decoded, or the gRPC error. */
export type CriAnswer<T = Record<string, unknown>> =
  | { ok: true; raw: Buffer; msg: T }
  | { ok: false; code: grpc.status; details: string };

/** One connection to a CRI endpoint. */
export class KubeletCri {
  readonly client: grpc.Client;
  /** `options`: extra channel options, e.g. `grpc.default_authority` to send the `:authority` an older kubelet sends. */
  constructor(socketPath: string, options: grpc.ChannelOptions = {}) {
    this.client = new grpc.Client(`unix:${socketPath}`, grpc.credentials.createInsecure(), {
      'grpc.max_receive_message_length': 16 * 1024 * 1024,
      ...options,
    });
  }

  /** Any unary RuntimeService call by method name. */
  call<T = Record<string, any>>(method: string, req: object, deadlineMs = 10_000): Promise<CriAnswer<T>> {
    const def = service[method];
    if (!def) throw new Error(`no ${method} in ${CRI_PROTO_PATH}`);
    return new Promise((resolve) => {
      this.client.makeUnaryRequest(
        def.path,
        (v: object) => def.requestSerialize(v),
        (b: Buffer) => b,
        req,
        { deadline: deadlineMs === Infinity ? Infinity : Date.now() + deadlineMs },
        (err, raw) => {
          if (err) resolve({ ok: false, code: err.code, details: err.details });
          else resolve({ ok: true, raw: raw as Buffer, msg: def.responseDeserialize(raw as Buffer) as T });
        },
      );
    });
  }

  /**
   * ExecSync as kubelet makes it: timeout in seconds in the request; deadline 2 min + timeout, or
   * none at all for timeout 0 (exec hooks), as cri-client's ExecSync does.
   */
  execSync(containerId: string, cmd: string[], timeoutSeconds: number): Promise<CriAnswer<{ stdout: Buffer; stderr: Buffer; exitCode: number }>> {
    const deadline = timeoutSeconds === 0 ? Infinity : KUBELET_RUNTIME_REQUEST_TIMEOUT_MS + timeoutSeconds * 1000;
    return this.call('ExecSync', { containerId, cmd, timeout: timeoutSeconds }, deadline);
  }

  /** GetContainerEvents: a server stream; returns the call so a test can read and cancel it. */
  containerEvents(): grpc.ClientReadableStream<Buffer> {
    const def = service['GetContainerEvents'] as protoLoader.MethodDefinition<object, object>;
    return this.client.makeServerStreamRequest(def.path, (v: object) => def.requestSerialize(v), (b: Buffer) => b, {});
  }

  /** Decodes a GetContainerEvents message. */
  static decodeEvent(raw: Buffer): Record<string, any> {
    return (service['GetContainerEvents'] as protoLoader.MethodDefinition<object, object>).responseDeserialize(raw) as Record<string, any>;
  }

  close(): void {
    this.client.close();
  }
}

/** The service definition, for tests that serve a RuntimeService themselves. */
export const RUNTIME_SERVICE = service;

/** A GetContainerEvents stream read for 1.5 s, then cancelled: its status and how many messages came. */
export function readContainerEvents(c: KubeletCri): Promise<{ code: number; details: string; messages: number }> {
  return new Promise((resolve) => {
    const call = c.containerEvents();
    let messages = 0;
    call.on('data', () => {
      messages++;
    });
    call.on('error', (err: grpc.ServiceError) => resolve({ code: err.code, details: err.details, messages }));
    call.on('end', () => resolve({ code: 0, details: '', messages }));
    setTimeout(() => call.cancel(), 1500);
  });
}
