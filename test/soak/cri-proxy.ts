/**
 * A CRI proxy for fault injection: a grpc-js server on a unix socket that serves every method of
 * runtime.v1.RuntimeService (proto/cri/runtime_v1.proto) by forwarding the raw request bytes to a
 * real runtime (the containerd lab) and the raw answer back, unless a fault says otherwise:
 * - 'slow':     every call waits `delayMs` before it is forwarded (a runtime stuck on a lock);
 * - 'lie':      ListPodSandbox is forwarded, PodSandboxStatus answers NOT_FOUND (the sandbox
 *               "vanished" between the two calls);
 * - 'race':     before PodSandboxStatus is forwarded, the proxy really stops and removes that
 *               sandbox in the runtime, so the runtime's own answer is the one for a sandbox gone
 *               between list and status;
 * - stop()/start(): the socket disappears and comes back on the same path.
 */
import { rmSync } from 'node:fs';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { CRI_PROTO_PATH } from '../../agent/netns/cri-client.ts';

/** How the proxy misbehaves right now. */
export type CriFault = 'none' | 'slow' | 'lie' | 'race';

/** Counters of what went through, by method name. */
export type CriCallCounts = Record<string, number>;

const identity = (b: Buffer): Buffer => b;

/** Forwards CRI calls from `socketPath` to `upstream` (unix://...), with faults on demand. */
export class CriProxy {
  readonly socketPath: string;
  readonly endpoint: string;
  readonly calls: CriCallCounts = {};
  fault: CriFault = 'none';
  delayMs = 2500;
  /** Called by the 'race' fault with the sandbox ID, before the status call is forwarded. */
  removeSandbox: (id: string) => Promise<void> = async () => {};
  readonly #upstream: grpc.Client;
  readonly #methods: grpc.ServiceDefinition;
  #server: grpc.Server | undefined;

  constructor(socketPath: string, upstream: string) {
    this.socketPath = socketPath;
    this.endpoint = `unix://${socketPath}`;
    this.#upstream = new grpc.Client(upstream, grpc.credentials.createInsecure());
    const def = protoLoader.loadSync(CRI_PROTO_PATH, { keepCase: false, longs: String, enums: String, defaults: true, oneofs: true });
    this.#methods = (grpc.loadPackageDefinition(def) as unknown as { runtime: { v1: { RuntimeService: grpc.ServiceClientConstructor } } })
      .runtime.v1.RuntimeService.service;
  }

  /** Binds the socket (again) and serves. */
  async start(): Promise<void> {
    if (this.#server) return;
    rmSync(this.socketPath, { force: true });
    const server = new grpc.Server();
    for (const [name, m] of Object.entries(this.#methods)) {
      if (m.requestStream || m.responseStream) continue;
      server.register(m.path, this.#handler(name, m), identity, identity, 'unary');
    }
    await new Promise<void>((resolve, reject) =>
      server.bindAsync(`unix:${this.socketPath}`, grpc.ServerCredentials.createInsecure(), (err) => (err ? reject(err) : resolve())));
    this.#server = server;
  }

  /** Drops every connection and removes the socket: the runtime is "gone". */
  stop(): void {
    this.#server?.forceShutdown();
    this.#server = undefined;
    rmSync(this.socketPath, { force: true });
  }

  /** Stops serving and closes the upstream channel. */
  close(): void {
    this.stop();
    this.#upstream.close();
  }

  #handler(name: string, m: grpc.MethodDefinition<unknown, unknown>): grpc.handleUnaryCall<Buffer, Buffer> {
    return (call, callback) => {
      this.calls[name] = (this.calls[name] ?? 0) + 1;
      let cancelled = false;
      call.on('cancelled', () => (cancelled = true));
      const forward = (): void => {
        if (cancelled) return;
        this.#upstream.makeUnaryRequest(m.path, identity, identity, call.request, new grpc.Metadata(), { deadline: Date.now() + 10_000 },
          (err, res) => (err ? callback(err) : callback(null, res)));
      };
      const fault = this.fault;
      if (fault === 'slow') {
        setTimeout(forward, this.delayMs);
      } else if (fault === 'lie' && name === 'PodSandboxStatus') {
        callback({ code: grpc.status.NOT_FOUND, details: 'an error occurred when try to find sandbox: not found' });
      } else if (fault === 'race' && name === 'PodSandboxStatus') {
        const id = (m.requestDeserialize(call.request) as { podSandboxId?: string }).podSandboxId ?? '';
        this.removeSandbox(id).then(forward, (err: unknown) => callback({ code: grpc.status.INTERNAL, details: String(err) }));
      } else {
        forward();
      }
    };
  }
}
