/**
 * The reference ProbeService client: what a kubelet-side shim does, in TypeScript. It checks the
 * API version first, speaks in the agent's own types, and can follow the watch across agent
 * restarts with its resume point.
 */
import * as grpc from '@grpc/grpc-js';
import { ProbeAgentError } from '../errors.ts';
import type { HttpGetHandler, ProbeHandler, ProbeOutcome, ProbeType, TcpSocketHandler } from '../probe/types.ts';
import type { ProbeEvent, ProbeStatus, StatusFilter } from '../scheduler/types.ts';
import { API_VERSION } from '../version.ts';
import { eventFromWire, filterToWire, outcomeFromWire, probeTypeToWire, revisionFromWire, statusFromWire } from './convert.ts';
import { handlerToWire, lifecycleHandlerToWire } from './convert-request.ts';
import {
  DEFAULT_SOCKET_PATH,
  loadProbeApi,
  type WireLifecycleRequest,
  type WireLifecycleResponse,
  type WireListResponse,
  type WireProbeRequest,
  type WireProbeResponse,
  type WireVersionResponse,
  type WireWatchRequest,
  type WireWatchResponse,
} from './proto.ts';

/** A failed ProbeService call: the gRPC status, kept for callers that branch on it. */
export class ApiError extends ProbeAgentError {
  readonly grpcCode: grpc.status;
  constructor(method: string, grpcCode: grpc.status, details: string) {
    const name = grpc.status[grpcCode] ?? String(grpcCode);
    // The code is the status name, which the message already shows (describeError appends codes it lacks).
    const clean = details.replace(/\.? *Resolution note: *$/, '');
    super(name, `${method}: ${name}: ${clean}`, { method, details: clean });
    this.grpcCode = grpcCode;
  }
}

/** The agent's identity, from Version. */
export interface AgentVersion {
  agentName: string;
  agentVersion: string;
  apiVersion: string;
  featureGates: { name: string; stage: string; enabled: boolean }[];
  instanceId: string;
}

/** How a probe request names its pod. */
export type PodSelector = { uid: string } | { sandboxId: string } | { namespace: string; name: string } | { containerId: string };

/** One on-demand probe through the agent. */
export interface RemoteProbeRequest {
  pod: PodSelector;
  containerName?: string;
  handler: ProbeHandler;
  /** Probe timeout; 0/absent = kubelet's default (1 s). */
  timeoutSeconds?: number;
  /** Set by the kubelet shim: the agent records the result as this probe's status (on-demand mode). */
  probeType?: ProbeType;
  /** Call deadline; default: the probe timeout plus 10 s for queueing. */
  deadlineMs?: number;
}

/** One lifecycle hook through the agent (RunLifecycleHandler). */
export interface RemoteHookRequest {
  pod: { uid: string } | { sandboxId: string } | { containerId: string };
  containerName?: string;
  handler: HttpGetHandler | TcpSocketHandler;
  hook: 'postStart' | 'preStop';
  /** 0/absent: no limit of its own (the call deadline applies). */
  timeoutSeconds?: number;
  /** Call deadline; default: none when timeoutSeconds is 0, else the timeout plus 10 s. */
  deadlineMs?: number;
}

/** ListProbeStatus's answer. */
export interface StatusList {
  statuses: ProbeStatus[];
  revision: number;
  instanceId: string;
}

/** One item of a watch: part of a snapshot, an event, or (watchWithResume only) a reconnect notice. */
export type WatchMessage =
  | { kind: 'snapshot'; revision: number; instanceId: string; statuses: ProbeStatus[]; resynced: boolean; complete: boolean }
  | { kind: 'event'; event: ProbeEvent }
  | { kind: 'reconnecting'; error: ApiError; fromRevision: number; delayMs: number };

/** Where and how to watch. */
export interface WatchOptions {
  filter?: StatusFilter;
  fromRevision?: number;
  instanceId?: string;
  signal?: AbortSignal;
}

const DEFAULT_DEADLINE_MS = 10_000;

/** A connection to one agent socket. */
export class ProbeApiClient {
  readonly #client: grpc.Client;
  readonly #service = loadProbeApi().service;

  constructor(socketPath: string = DEFAULT_SOCKET_PATH, opts: { maxResponseBytes?: number } = {}) {
    this.#client = new grpc.Client(`unix:${socketPath}`, grpc.credentials.createInsecure(), {
      'grpc.max_receive_message_length': opts.maxResponseBytes ?? 16 * 1024 * 1024,
    });
  }

  /** Connects and checks the agent's API version (the shim's first call); refuses an unknown API version. */
  static async connect(socketPath: string = DEFAULT_SOCKET_PATH, opts: { deadlineMs?: number } = {}): Promise<{ client: ProbeApiClient; version: AgentVersion }> {
    const client = new ProbeApiClient(socketPath);
    try {
      const version = await client.version(opts.deadlineMs);
      if (version.apiVersion !== API_VERSION) {
        throw new ApiError('Version', grpc.status.FAILED_PRECONDITION, `agent serves API ${version.apiVersion}, this client speaks ${API_VERSION}`);
      }
      return { client, version };
    } catch (err) {
      client.close();
      if (err instanceof ApiError && err.grpcCode === grpc.status.UNAVAILABLE) {
        const detail = (err.context['details'] as string | undefined) ?? err.message;
        throw new ApiError('Version', err.grpcCode, `cannot reach probe-agent on ${socketPath} (is it running?): ${detail}`);
      }
      throw err;
    }
  }

  /** Version RPC. */
  async version(deadlineMs = DEFAULT_DEADLINE_MS): Promise<AgentVersion> {
    const res = await this.#unary<object, WireVersionResponse>('Version', { version: API_VERSION }, deadlineMs);
    return {
      agentName: res.agent_name,
      agentVersion: res.agent_version,
      apiVersion: res.api_version,
      featureGates: res.feature_gates.map((g) => ({ name: g.name, stage: g.stage, enabled: g.enabled })),
      instanceId: res.instance_id,
    };
  }

  /** Probe RPC: a failed probe resolves (result 'failure'); a probe that could not be attempted rejects with ApiError. */
  async probe(req: RemoteProbeRequest): Promise<ProbeOutcome> {
    const wire: WireProbeRequest = {
      handler: handlerToWire(req.handler),
      timeout_seconds: req.timeoutSeconds ?? 0,
      container_name: req.containerName ?? '',
    };
    if ('uid' in req.pod) wire.pod_uid = req.pod.uid;
    else if ('sandboxId' in req.pod) wire.pod_sandbox_id = req.pod.sandboxId;
    else if ('containerId' in req.pod) wire.container_id = req.pod.containerId;
    else {
      wire.pod_namespace = req.pod.namespace;
      wire.pod_name = req.pod.name;
    }
    if (req.probeType) wire.probe_type = probeTypeToWire(req.probeType);
    const deadline = req.deadlineMs ?? (req.timeoutSeconds || 1) * 1000 + DEFAULT_DEADLINE_MS;
    return outcomeFromWire(await this.#unary<WireProbeRequest, WireProbeResponse>('Probe', wire, deadline));
  }

  /**
   * RunLifecycleHandler RPC: a hook kubelet counts as failed resolves with result 'failure'; one the
   * agent could not run rejects with ApiError (or resolves 'error' for netns/helper trouble mid-run).
   */
  async runLifecycleHandler(req: RemoteHookRequest): Promise<{ result: 'success' | 'failure' | 'error' | 'unknown'; message: string; durationSeconds: number }> {
    const wire: WireLifecycleRequest = {
      handler: lifecycleHandlerToWire(req.handler),
      hook: req.hook === 'postStart' ? 'LIFECYCLE_HOOK_POST_START' : 'LIFECYCLE_HOOK_PRE_STOP',
      timeout_seconds: req.timeoutSeconds ?? 0,
      container_name: req.containerName ?? '',
    };
    if ('uid' in req.pod) wire.pod_uid = req.pod.uid;
    else if ('sandboxId' in req.pod) wire.pod_sandbox_id = req.pod.sandboxId;
    else wire.container_id = req.pod.containerId;
    const deadline = req.deadlineMs ?? (req.timeoutSeconds ? req.timeoutSeconds * 1000 + DEFAULT_DEADLINE_MS : Infinity);
    const res = await this.#unary<WireLifecycleRequest, WireLifecycleResponse>('RunLifecycleHandler', wire, deadline);
    const result = res.result === 'PROBE_RESULT_SUCCESS' ? 'success' : res.result === 'PROBE_RESULT_FAILURE' ? 'failure' : res.result === 'PROBE_RESULT_ERROR' ? 'error' : 'unknown';
    return { result, message: res.message, durationSeconds: res.duration_seconds };
  }

  /** ListProbeStatus RPC. */
  async listStatus(filter: StatusFilter = {}, deadlineMs = DEFAULT_DEADLINE_MS): Promise<StatusList> {
    const res = await this.#unary<object, WireListResponse>('ListProbeStatus', { filter: filterToWire(filter) }, deadlineMs);
    return { statuses: res.statuses.map(statusFromWire), revision: revisionFromWire(res.revision), instanceId: res.instance_id };
  }

  /** One WatchProbeEvents stream; ends when the server ends it (ApiError) or `signal` aborts (clean end). */
  async *watch(opts: WatchOptions = {}): AsyncGenerator<WatchMessage> {
    const def = this.#service['WatchProbeEvents'] as grpc.MethodDefinition<WireWatchRequest, WireWatchResponse>;
    const req: WireWatchRequest = {
      filter: filterToWire(opts.filter),
      from_revision: opts.fromRevision ?? 0,
      instance_id: opts.instanceId ?? '',
    };
    const stream = this.#client.makeServerStreamRequest(def.path, def.requestSerialize, def.responseDeserialize, req, new grpc.Metadata());
    const onAbort = (): void => stream.cancel();
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    try {
      for await (const msg of stream as AsyncIterable<WireWatchResponse>) {
        if (msg.snapshot) {
          const s = msg.snapshot;
          yield {
            kind: 'snapshot',
            revision: revisionFromWire(s.revision),
            instanceId: s.instance_id,
            statuses: s.statuses.map(statusFromWire),
            resynced: s.resynced,
            complete: s.complete,
          };
        } else if (msg.event) {
          yield { kind: 'event', event: eventFromWire(msg.event) };
        }
      }
    } catch (err) {
      if (opts.signal?.aborted) return;
      throw toApiError('WatchProbeEvents', err);
    } finally {
      opts.signal?.removeEventListener('abort', onAbort);
      stream.cancel();
    }
  }

  /** Closes the channel. */
  close(): void {
    this.#client.close();
  }

  /** `deadlineMs` Infinity: no call deadline. */
  #unary<Req, Res>(method: string, arg: Req, deadlineMs: number): Promise<Res> {
    const def = this.#service[method] as grpc.MethodDefinition<Req, Res>;
    return new Promise((resolve, reject) => {
      this.#client.makeUnaryRequest(
        def.path,
        def.requestSerialize,
        def.responseDeserialize,
        arg,
        new grpc.Metadata(),
        Number.isFinite(deadlineMs) ? { deadline: Date.now() + deadlineMs } : {},
        (err, res) => (err || res === undefined ? reject(toApiError(method, err)) : resolve(res)),
      );
    });
  }
}

function toApiError(method: string, err: unknown): ApiError {
  if (err instanceof ApiError) return err;
  const e = err as Partial<grpc.ServiceError> | null;
  return new ApiError(method, typeof e?.code === 'number' ? e.code : grpc.status.UNKNOWN, e?.details || (err instanceof Error ? err.message : String(err)));
}

/** Status codes after which a watch is worth resuming. */
const RESUMABLE = new Set<grpc.status>([
  grpc.status.UNAVAILABLE,
  grpc.status.ABORTED,
  grpc.status.RESOURCE_EXHAUSTED,
  grpc.status.CANCELLED,
  grpc.status.INTERNAL,
]);

/**
 * Follows the watch for as long as `signal` allows, reconnecting with backoff after resumable
 * errors (agent restart, watcher cut) from the last revision seen. Yields a 'reconnecting' item
 * before each retry, so a caller can tell a gap was bridged.
 */
export async function* watchWithResume(
  client: ProbeApiClient,
  opts: WatchOptions & { maxBackoffMs?: number },
): AsyncGenerator<WatchMessage> {
  let fromRevision = opts.fromRevision ?? 0;
  let instanceId = opts.instanceId ?? '';
  let attempt = 0;
  while (!opts.signal?.aborted) {
    try {
      for await (const m of client.watch({ ...opts, fromRevision, instanceId })) {
        attempt = 0;
        if (m.kind === 'snapshot') {
          fromRevision = m.revision;
          instanceId = m.instanceId;
        } else if (m.kind === 'event') {
          fromRevision = m.event.revision;
        }
        yield m;
      }
      if (opts.signal?.aborted) return;
      throw new ApiError('WatchProbeEvents', grpc.status.UNAVAILABLE, 'stream ended without a status');
    } catch (err) {
      const apiErr = toApiError('WatchProbeEvents', err);
      if (!RESUMABLE.has(apiErr.grpcCode)) throw apiErr;
      const delayMs = Math.min(opts.maxBackoffMs ?? 5000, 100 * 2 ** attempt++);
      yield { kind: 'reconnecting', error: apiErr, fromRevision, delayMs };
      await sleep(delayMs, opts.signal);
    }
  }
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(done, ms);
    function done(): void {
      clearTimeout(timer);
      signal?.removeEventListener('abort', done);
      resolve();
    }
    signal?.addEventListener('abort', done, { once: true });
  });
}
