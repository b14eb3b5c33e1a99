/**
 * A small CRI runtime.v1 client over a unix socket (grpc-js + proto-loader on proto/cri/runtime_v1.proto).
 * One channel per endpoint, reused; every call has a deadline; failures become NetnsUnavailableError
 * with a message naming the endpoint, so an operator sees "CRI endpoint unix:///... unavailable: ...".
 */
import { fileURLToPath } from 'node:url';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { ConfigError, NetnsUnavailableError } from '../errors.ts';

/** proto/cri/runtime_v1.proto, found relative to this module (agent/netns or dist/netns). */
export const CRI_PROTO_PATH = fileURLToPath(new URL('../../proto/cri/runtime_v1.proto', import.meta.url));

/** Per-call deadline unless configured. */
export const DEFAULT_CRI_DEADLINE_MS = 2000;

/** proto-loader turns snake_case into camelCase (keepCase false), int64 into decimal strings, enums into names. */
export interface CriPodSandboxMetadata { name: string; uid: string; namespace: string; attempt: number }
export type CriSandboxState = 'SANDBOX_READY' | 'SANDBOX_NOTREADY';
export type CriNamespaceMode = 'POD' | 'CONTAINER' | 'NODE' | 'TARGET';

/** One ListPodSandbox item. */
export interface CriPodSandbox {
  id: string;
  metadata: CriPodSandboxMetadata | null;
  state: CriSandboxState;
  /** Nanoseconds since the epoch, as a decimal string. */
  createdAt: string;
  labels: Record<string, string>;
  annotations: Record<string, string>;
  runtimeHandler: string;
}

/** PodSandboxStatus response. */
export interface CriPodSandboxStatusResponse {
  status: {
    id: string;
    metadata: CriPodSandboxMetadata | null;
    state: CriSandboxState;
    createdAt: string;
    network: { ip: string; additionalIps: { ip: string }[] } | null;
    linux: { namespaces: { options: { network: CriNamespaceMode; pid: CriNamespaceMode; ipc: CriNamespaceMode } | null } | null } | null;
    labels: Record<string, string>;
    annotations: Record<string, string>;
    runtimeHandler: string;
  } | null;
  info: Record<string, string>;
}

/** Version response. */
export interface CriVersion { version: string; runtimeName: string; runtimeVersion: string; runtimeApiVersion: string }

/** PodSandboxFilter. */
export interface CriPodSandboxFilter {
  id?: string;
  state?: { state: CriSandboxState };
  labelSelector?: Record<string, string>;
}

/** RunPodSandbox config (the subset in our proto), camelCase. */
export interface CriPodSandboxConfig {
  metadata: CriPodSandboxMetadata;
  hostname?: string;
  logDirectory?: string;
  dnsConfig?: { servers?: string[]; searches?: string[]; options?: string[] };
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  linux?: {
    cgroupParent?: string;
    securityContext?: { namespaceOptions?: { network?: CriNamespaceMode; pid?: CriNamespaceMode; ipc?: CriNamespaceMode } };
    sysctls?: Record<string, string>;
  };
}

export type CriContainerState = 'CONTAINER_CREATED' | 'CONTAINER_RUNNING' | 'CONTAINER_EXITED' | 'CONTAINER_UNKNOWN';

/** One ListContainers item. */
export interface CriContainer {
  id: string;
  podSandboxId: string;
  metadata: { name: string; attempt: number } | null;
  state: CriContainerState;
  createdAt: string;
  labels: Record<string, string>;
  annotations: Record<string, string>;
}

/** ContainerFilter. */
export interface CriContainerFilter {
  id?: string;
  state?: { state: CriContainerState };
  podSandboxId?: string;
  labelSelector?: Record<string, string>;
}

/** One ContainerStatus (the subset in our proto), camelCase. */
export interface CriContainerStatus {
  id: string;
  metadata: { name: string; attempt: number } | null;
  state: CriContainerState;
  createdAt: string;
  startedAt: string;
  finishedAt: string;
  exitCode: number;
  labels: Record<string, string>;
  annotations: Record<string, string>;
}

export type CriContainerEventType = 'CONTAINER_CREATED_EVENT' | 'CONTAINER_STARTED_EVENT' | 'CONTAINER_STOPPED_EVENT' | 'CONTAINER_DELETED_EVENT';

/** One GetContainerEvents message: the event, and the statuses of its sandbox's containers at that time. */
export interface CriContainerEvent {
  containerId: string;
  containerEventType: CriContainerEventType;
  /** Nanoseconds since the epoch. */
  createdAt: string;
  podSandboxStatus: CriPodSandboxStatusResponse['status'];
  containersStatuses: CriContainerStatus[];
}

/** A running GetContainerEvents stream. */
export interface CriEventStream {
  /** Ends the stream; no callback runs after it. */
  cancel(): void;
}

/** CreateContainer config (the subset in our proto), camelCase. */
export interface CriContainerConfig {
  metadata: { name: string; attempt?: number };
  image: { image: string; userSpecifiedImage?: string };
  command?: string[];
  args?: string[];
  envs?: { key: string; value: string }[];
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  logPath?: string;
  linux?: { securityContext?: { namespaceOptions?: { network?: CriNamespaceMode; pid?: CriNamespaceMode; ipc?: CriNamespaceMode } } };
}

type Callback = (err: grpc.ServiceError | null, res?: unknown) => void;
type UnaryMethod = (req: unknown, md: grpc.Metadata, opts: grpc.CallOptions, cb: Callback) => grpc.ClientUnaryCall;
type StreamMethod = (req: unknown, md: grpc.Metadata, opts: grpc.CallOptions) => grpc.ClientReadableStream<unknown>;
type RuntimeServiceClient = grpc.Client & Record<string, UnaryMethod>;

let serviceCtor: grpc.ServiceClientConstructor | undefined;

function runtimeServiceCtor(): grpc.ServiceClientConstructor {
  if (!serviceCtor) {
    const def = protoLoader.loadSync(CRI_PROTO_PATH, { keepCase: false, longs: String, enums: String, defaults: true, oneofs: true });
    const pkg = grpc.loadPackageDefinition(def) as unknown as { runtime: { v1: { RuntimeService: grpc.ServiceClientConstructor } } };
    serviceCtor = pkg.runtime.v1.RuntimeService;
  }
  return serviceCtor;
}

/** Accepts "unix:///path", "unix:/path" or "/path"; returns the normalised endpoint and socket path. */
export function parseCriEndpoint(endpoint: string): { endpoint: string; socketPath: string } {
  if (typeof endpoint !== 'string' || endpoint.length === 0 || endpoint.length > 512 || endpoint.includes('\0')) {
    throw new ConfigError(`invalid CRI endpoint ${JSON.stringify(endpoint)}`);
  }
  let socketPath: string;
  if (endpoint.startsWith('unix://')) socketPath = endpoint.slice('unix://'.length);
  else if (endpoint.startsWith('unix:')) socketPath = endpoint.slice('unix:'.length);
  else if (endpoint.startsWith('/')) socketPath = endpoint;
  else throw new ConfigError(`invalid CRI endpoint "${endpoint}": only unix sockets are supported (unix:///path)`);
  if (!socketPath.startsWith('/')) throw new ConfigError(`invalid CRI endpoint "${endpoint}": socket path must be absolute`);
  return { endpoint: `unix://${socketPath}`, socketPath };
}

/** Options of the client. */
export interface CriClientOptions {
  /** Per-call deadline; default 2 s. */
  deadlineMs?: number;
  /** Largest reply accepted; default 16 MiB (a big node's ListContainers). */
  maxReplyBytes?: number;
}

/** A CRI RuntimeService client bound to one endpoint. */
export class CriClient {
  readonly endpoint: string;
  readonly socketPath: string;
  readonly #deadlineMs: number;
  readonly #maxReplyBytes: number;
  #client: RuntimeServiceClient | undefined;
  #closed = false;

  constructor(endpoint: string, opts: CriClientOptions = {}) {
    ({ endpoint: this.endpoint, socketPath: this.socketPath } = parseCriEndpoint(endpoint));
    const d = opts.deadlineMs ?? DEFAULT_CRI_DEADLINE_MS;
    if (!Number.isFinite(d) || d <= 0 || d > 60_000) throw new ConfigError(`CRI deadline must be in (0, 60000] ms, got ${d}`);
    this.#deadlineMs = d;
    this.#maxReplyBytes = opts.maxReplyBytes ?? 16 * 1024 * 1024;
  }

  /** Version: runtime name and API version. */
  version(signal?: AbortSignal): Promise<CriVersion> {
    return this.#call<CriVersion>('Version', { version: 'v1' }, signal);
  }

  /** ListPodSandbox with a filter. */
  async listPodSandbox(filter: CriPodSandboxFilter, signal?: AbortSignal): Promise<CriPodSandbox[]> {
    const res = await this.#call<{ items: CriPodSandbox[] }>('ListPodSandbox', { filter }, signal);
    return res.items ?? [];
  }

  /** PodSandboxStatus; verbose adds the runtime's `info` map. */
  podSandboxStatus(podSandboxId: string, verbose: boolean, signal?: AbortSignal): Promise<CriPodSandboxStatusResponse> {
    return this.#call<CriPodSandboxStatusResponse>('PodSandboxStatus', { podSandboxId, verbose }, signal);
  }

  /** ListContainers with a filter (the agent looks a container up by its ID). */
  async listContainers(filter: CriContainerFilter, signal?: AbortSignal): Promise<CriContainer[]> {
    const res = await this.#call<{ containers: CriContainer[] }>('ListContainers', { filter }, signal);
    return res.containers ?? [];
  }

  /**
   * GetContainerEvents (containerd 1.7+): `onEvent` per message, then `onEnd` once, with the
   * error that ended the stream (UNIMPLEMENTED from a runtime without it). No deadline: the stream
   * lives as long as the runtime keeps it; each message is bounded by the client's maxReplyBytes.
   */
  containerEvents(onEvent: (e: CriContainerEvent) => void, onEnd: (err: NetnsUnavailableError) => void): CriEventStream {
    let ended = false;
    const end = (err: NetnsUnavailableError): void => {
      if (ended) return;
      ended = true;
      onEnd(err);
    };
    let client: RuntimeServiceClient;
    try {
      client = this.#channel();
    } catch (err) {
      queueMicrotask(() => end(err as NetnsUnavailableError));
      return { cancel: () => (ended = true) };
    }
    const call = (client['GetContainerEvents'] as unknown as StreamMethod).call(client, {}, new grpc.Metadata(), {});
    call.on('data', (e: CriContainerEvent) => {
      if (!ended) onEvent(e);
    });
    call.on('error', (err: grpc.ServiceError) => {
      if (err.code === grpc.status.UNAVAILABLE && this.#client === client) {
        client.close();
        this.#client = undefined;
      }
      end(this.#fromGrpc('GetContainerEvents', err));
    });
    call.on('end', () => end(this.#error('GetContainerEvents', 'ended the event stream', 'unavailable', grpc.status.OK, undefined)));
    return {
      cancel: () => {
        ended = true;
        call.cancel();
      },
    };
  }

  /** CreateContainer (test lab). */
  async createContainer(podSandboxId: string, config: CriContainerConfig, sandboxConfig: CriPodSandboxConfig, deadlineMs?: number): Promise<string> {
    const res = await this.#call<{ containerId: string }>('CreateContainer', { podSandboxId, config, sandboxConfig }, undefined, deadlineMs);
    return res.containerId;
  }

  /** StartContainer (test lab). */
  async startContainer(containerId: string, deadlineMs?: number): Promise<void> {
    await this.#call('StartContainer', { containerId }, undefined, deadlineMs);
  }

  /** StopContainer (test lab); `timeout` seconds before SIGKILL. */
  async stopContainer(containerId: string, timeout = 0, deadlineMs?: number): Promise<void> {
    await this.#call('StopContainer', { containerId, timeout }, undefined, deadlineMs);
  }

  /**
   * ExecSync: runs `cmd` in the container, `timeout` seconds at most (0: none). Gates mode runs a
   * container's exec preStop hook with it, as kubelet does; the reply is bounded by grpc-js's
   * 4 MiB message limit.
   */
  async execSync(containerId: string, cmd: string[], timeout: number, deadlineMs?: number): Promise<{ exitCode: number; stdout: Buffer; stderr: Buffer }> {
    const res = await this.#call<{ exitCode?: number; stdout?: Buffer; stderr?: Buffer }>('ExecSync', { containerId, cmd, timeout }, undefined, deadlineMs);
    return { exitCode: res.exitCode ?? 0, stdout: res.stdout ?? Buffer.alloc(0), stderr: res.stderr ?? Buffer.alloc(0) };
  }

  /** RemoveContainer (test lab). */
  async removeContainer(containerId: string, deadlineMs?: number): Promise<void> {
    await this.#call('RemoveContainer', { containerId }, undefined, deadlineMs);
  }

  /** RunPodSandbox (test lab; the agent never creates sandboxes). */
  async runPodSandbox(config: CriPodSandboxConfig, runtimeHandler = '', deadlineMs?: number): Promise<string> {
    const res = await this.#call<{ podSandboxId: string }>('RunPodSandbox', { config, runtimeHandler }, undefined, deadlineMs);
    return res.podSandboxId;
  }

  /** StopPodSandbox (test lab). */
  async stopPodSandbox(podSandboxId: string, deadlineMs?: number): Promise<void> {
    await this.#call('StopPodSandbox', { podSandboxId }, undefined, deadlineMs);
  }

  /** RemovePodSandbox (test lab). */
  async removePodSandbox(podSandboxId: string, deadlineMs?: number): Promise<void> {
    await this.#call('RemovePodSandbox', { podSandboxId }, undefined, deadlineMs);
  }

  /** Closes the channel; later calls fail. */
  close(): void {
    this.#closed = true;
    this.#client?.close();
    this.#client = undefined;
  }

  #channel(): RuntimeServiceClient {
    if (this.#closed) throw new NetnsUnavailableError(`CRI client for ${this.endpoint} is closed`, { endpoint: this.endpoint, outcome: 'unavailable' });
    if (!this.#client) {
      const Ctor = runtimeServiceCtor();
      this.#client = new Ctor(this.endpoint, grpc.credentials.createInsecure(), {
        // The runtime restarts in place (upgrades, crashes); come back quickly instead of
        // grpc's default backoff of up to two minutes.
        'grpc.initial_reconnect_backoff_ms': 100,
        'grpc.min_reconnect_backoff_ms': 100,
        'grpc.max_reconnect_backoff_ms': 1000,
        'grpc.max_receive_message_length': this.#maxReplyBytes,
        'grpc.enable_retries': 0,
      }) as RuntimeServiceClient;
    }
    return this.#client;
  }

  #call<T>(method: string, req: unknown, signal?: AbortSignal, deadlineMs = this.#deadlineMs): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      if (signal?.aborted) {
        reject(this.#error(method, 'aborted', 'unavailable', grpc.status.CANCELLED, signal.reason));
        return;
      }
      let client: RuntimeServiceClient;
      try {
        client = this.#channel();
      } catch (err) {
        reject(err);
        return;
      }
      const fn = client[method] as UnaryMethod;
      const onAbort = (): void => call.cancel();
      const call = fn.call(client, req, new grpc.Metadata(), { deadline: Date.now() + deadlineMs }, (err, res) => {
        signal?.removeEventListener('abort', onAbort);
        if (!err) {
          resolve(res as T);
          return;
        }
        if (err.code === grpc.status.UNAVAILABLE && this.#client === client) {
          // A fresh channel on the next call: reconnects at once when the runtime is back.
          client.close();
          this.#client = undefined;
        }
        reject(this.#fromGrpc(method, err, signal));
      });
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  #fromGrpc(method: string, err: grpc.ServiceError, signal?: AbortSignal): NetnsUnavailableError {
    const details = err.details || err.message;
    switch (err.code) {
      case grpc.status.NOT_FOUND:
        return this.#error(method, `not found: ${details}`, 'not-found', err.code, err);
      case grpc.status.UNIMPLEMENTED:
        return this.#error(method, `does not implement runtime.v1.RuntimeService/${method} (${details})`, 'unavailable', err.code, err);
      case grpc.status.DEADLINE_EXCEEDED:
        return this.#error(method, `unavailable: ${method} timed out (${details})`, 'unavailable', err.code, err);
      case grpc.status.CANCELLED:
        if (signal?.aborted) return this.#error(method, 'aborted', 'unavailable', err.code, err);
        return this.#error(method, `unavailable: ${details}`, 'unavailable', err.code, err);
      case grpc.status.UNAVAILABLE:
        return this.#error(method, `unavailable: ${details}`, 'unavailable', err.code, err);
      default:
        return this.#error(method, `${method} failed: ${grpc.status[err.code] ?? err.code}: ${details}`, 'unavailable', err.code, err);
    }
  }

  #error(method: string, what: string, outcome: 'unavailable' | 'not-found', code: number, cause: unknown): NetnsUnavailableError {
    return new NetnsUnavailableError(
      `CRI endpoint ${this.endpoint} ${what}`,
      { endpoint: this.endpoint, method, grpcCode: code, outcome },
      { cause },
    );
  }
}
