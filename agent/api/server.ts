/**
 * The ProbeService gRPC server on a unix socket (grpc-js, every client and method), plus
 * grpc.health.v1 and (optionally) server reflection on the same socket; and the kubelet shim's own
 * root-only socket, where the lean server (hot-unary.ts) serves ExecSync alone. Each socket says
 * who it serves: nothing is guessed from a connection's first request. The daemon constructs it
 * with the results store, the on-demand prober, its version and its feature gates; everything else
 * has a bounded default.
 */
import { randomUUID } from 'node:crypto';
import * as net from 'node:net';
import { performance } from 'node:perf_hooks';
import * as grpc from '@grpc/grpc-js';
import { createRequire } from 'node:module';
import * as protoLoader from '@grpc/proto-loader';
import { HealthImplementation, protoPath as healthProtoPath } from 'grpc-health-check';
import { ConfigError, InvalidProbeError, describeError } from '../errors.ts';
import { silentLogger, type Logger } from '../log.ts';
import { PROBE_TYPES } from '../probe/types.ts';
import type { OnDemandProber, ProbeStatus, ResultsReader } from '../scheduler/types.ts';
import { AGENT_NAME, AGENT_VERSION, API_VERSION } from '../version.ts';
import { filterFromWire, revisionFromWire, statusToWire } from './convert.ts';
import { NotStartedError, RpcError, grpcStatusFor, handleProbeCall, type CallLike, type ProbeCallGate } from './probe-call.ts';
import { ExecSyncHandlerCache, handleExecSync, type ExecSyncCacheStats } from './exec-sync.ts';
import { handleLifecycleCall } from './lifecycle-call.ts';
import { leanServer } from '../io/lean-socket.ts';
import { DRAINING_DETAIL, NOT_STARTED_DRAINING } from '../contract/hook-refusal.ts';
import {
  DEFAULT_SOCKET_PATH,
  LOADER_OPTIONS,
  SERVICE_NAME,
  loadProbeApi,
  type WireLifecycleRequest,
  type WireLifecycleResponse,
  type WireListRequest,
  type WireListResponse,
  type WireProbeRequest,
  type WireProbeResponse,
  type WireVersionRequest,
  type WireVersionResponse,
  type WireWatchRequest,
  type WireWatchResponse,
} from './proto.ts';
import { prepareSocketPath, removeSocket, resolveGroup, secureSocket, withPrivateUmask } from './socket.ts';
import { WatchSession } from './watch.ts';
import { HotUnaryServer } from './hot-unary.ts';
import { shimSocketBeside } from '../contract/shim-socket.ts';

/** Who the agent is, as Version reports it. */
export interface ApiVersionInfo {
  agentName: string;
  agentVersion: string;
  apiVersion: string;
}

/** One feature gate as Version reports it (FeatureGates.list() has this shape). */
export interface ApiFeatureGate {
  name: string;
  stage: string;
  enabled: boolean;
}

/** Everything the server needs; only results and prober are required. */
export interface ProbeApiServerOptions {
  results: ResultsReader;
  prober: OnDemandProber;
  version?: Partial<ApiVersionInfo>;
  featureGates?: ApiFeatureGate[];
  /** Default /run/probe-agent/probe.sock. */
  socketPath?: string;
  /** Group (name or gid) allowed to connect: the socket becomes 0660 and its new directory 0750. */
  socketGroup?: string | number;
  /** The kubelet shim's socket: 0600 whatever socketGroup says, ExecSync only. Default: shimSocketBeside(socketPath). */
  shimSocketPath?: string;
  /** Serve grpc.reflection (for grpcurl). Default off. */
  reflection?: boolean;
  /** Largest request accepted (default 1 MiB). */
  maxRequestBytes?: number;
  /** Largest response sent (default 16 MiB: a ListProbeStatus of a very full node). */
  maxResponseBytes?: number;
  /** Concurrent WatchProbeEvents streams (default 64); more get RESOURCE_EXHAUSTED. */
  maxWatchers?: number;
  /**
   * Messages buffered for one watcher (beyond its initial snapshot or replay) before it is cut with
   * ABORTED (default 1024: a burst such as a first pod sync fits; a client that stops reading does not).
   */
  watcherBufferMessages?: number;
  /** Statuses per snapshot message (default 200). */
  snapshotChunk?: number;
  /**
   * Probe RPCs in flight on the node (default 4096); more get RESOURCE_EXHAUSTED before reaching the
   * prober. A backstop for the agent's memory: calls are admitted per namespace and pod by the prober.
   */
  maxInFlightProbes?: number;
  /** RunLifecycleHandler RPCs in flight on the node (default 1024), a backstop like maxInFlightProbes. */
  maxInFlightHooks?: number;
  /** Parsed rewritten commands ExecSync keeps, by container and command (default 4096; exec-sync.ts). */
  execSyncCacheEntries?: number;
  /** Estimated bytes of those (default 4 MiB; exec-sync.ts). */
  execSyncCacheBytes?: number;
  /** HTTP/2 streams per client connection on grpc-js (default 256). */
  maxConcurrentStreams?: number;
  /**
   * HTTP/2 streams per connection on the shim's socket (hot-unary.ts). Default: every call the
   * probe and hook gates admit plus 1024 for refusals on their way out, so the per-tenant limiter,
   * never this cap, decides which call waits; an open stream costs a few hundred octets and its request.
   */
  maxHotStreams?: number;
  /** Time stop() gives in-flight calls before cancelling them (default 10 s). */
  shutdownGraceMs?: number;
  log?: Logger;
  /** Called after every unary RPC (metrics): method name, status code name, seconds. Must not throw. */
  onRpc?: (method: string, code: string, seconds: number) => void;
}

const TYPE_ORDER = new Map(PROBE_TYPES.map((t, i) => [t, i]));
function byIdentity(a: ProbeStatus, b: ProbeStatus): number {
  return (
    a.namespace.localeCompare(b.namespace) ||
    a.podName.localeCompare(b.podName) ||
    a.key.podUID.localeCompare(b.key.podUID) ||
    a.key.containerName.localeCompare(b.key.containerName) ||
    (TYPE_ORDER.get(a.key.probeType) ?? 0) - (TYPE_ORDER.get(b.key.probeType) ?? 0)
  );
}

/** The running ProbeService server. */
export class ProbeApiServer {
  /** Random per process: revisions are only comparable within one instance. */
  readonly instanceId = randomUUID();
  readonly socketPath: string;
  readonly shimSocketPath: string;
  readonly #opts: ProbeApiServerOptions;
  readonly #log: Logger;
  readonly #server: grpc.Server;
  /** ExecSync on the shim's socket (hot-unary.ts), beside #server. */
  readonly #hot: HotUnaryServer;
  /** Accepts on the ProbeService socket and injects each connection into grpc-js. */
  readonly #listener: net.Server;
  /** Accepts on the shim's socket and hands each connection to #hot. */
  readonly #shimListener: net.Server;
  /** Connections carried by grpc-js (injected): a drain waits for them to close, so answers flush. */
  readonly #grpcConns = new Set<net.Socket>();
  #injector: grpc.ConnectionInjector | undefined;
  readonly #health: HealthImplementation;
  readonly #watchers = new Set<WatchSession>();
  readonly #version: ApiVersionInfo;
  #socketIno: number | undefined;
  #shimSocketIno: number | undefined;
  readonly #probeGate: ProbeCallGate;
  /** Hooks in flight: they take no probe slot, so they have their own bound. */
  readonly #hookGate: ProbeCallGate;
  /** ExecSync's parsed commands (exec-sync.ts). */
  readonly #execSyncCache: ExecSyncHandlerCache;
  #unaryInFlight = 0;
  #idleWaiters: (() => void)[] = [];
  #stopping: Promise<void> | undefined;

  private constructor(opts: ProbeApiServerOptions) {
    this.#opts = opts;
    this.#log = (opts.log ?? silentLogger).child({ component: 'api' });
    this.socketPath = opts.socketPath ?? DEFAULT_SOCKET_PATH;
    this.shimSocketPath = opts.shimSocketPath ?? shimSocketBeside(this.socketPath);
    this.#probeGate = { inFlight: 0, max: opts.maxInFlightProbes ?? 4096 };
    this.#hookGate = { inFlight: 0, max: opts.maxInFlightHooks ?? 1024 };
    this.#version = {
      agentName: opts.version?.agentName ?? AGENT_NAME,
      agentVersion: opts.version?.agentVersion ?? AGENT_VERSION,
      apiVersion: opts.version?.apiVersion ?? API_VERSION,
    };
    this.#server = new grpc.Server({
      'grpc.max_receive_message_length': opts.maxRequestBytes ?? 1024 * 1024,
      'grpc.max_send_message_length': opts.maxResponseBytes ?? 16 * 1024 * 1024,
      'grpc.max_concurrent_streams': opts.maxConcurrentStreams ?? 256,
    });
    const api = loadProbeApi();
    // In-flight accounting, logging and metrics happen in #serve, whichever socket carried the call.
    const probe = this.#unary('Probe', (call: grpc.ServerUnaryCall<WireProbeRequest, WireProbeResponse>) => this.#probeRpc(call));
    const hook = this.#unary('RunLifecycleHandler', (call: grpc.ServerUnaryCall<WireLifecycleRequest, WireLifecycleResponse>) => {
      // A draining agent refuses new hooks in a way the shim can tell from "it may have run":
      // the shim sends such a hook again to the next agent (docs/closing-the-hole.md).
      if (this.#stopping) throw new NotStartedError(DRAINING_DETAIL, NOT_STARTED_DRAINING);
      return handleLifecycleCall(call, this.#opts.prober, this.#hookGate);
    });
    this.#execSyncCache = new ExecSyncHandlerCache({ maxEntries: opts.execSyncCacheEntries, maxBytes: opts.execSyncCacheBytes });
    const execSyncDeps = {
      prober: this.#opts.prober,
      probeGate: this.#probeGate,
      hookGate: this.#hookGate,
      cache: this.#execSyncCache,
      stopping: () => this.#stopping !== undefined,
    };
    // ExecSync's messages are read and written by hand (exec-sync.ts), on grpc-js as on the lean
    // server: its handler takes the request's message bytes and returns the response's, so both
    // sockets answer the same bytes and the request is decoded once. On the ProbeService socket it
    // serves the shim of the release before the shim's own socket (docs/deploy.md, version skew).
    const service: grpc.ServiceDefinition = {
      ...api.service,
      ExecSync: {
        ...(api.service['ExecSync'] as grpc.MethodDefinition<Buffer, Buffer>),
        requestDeserialize: (b: Buffer) => b,
        responseSerialize: (b: Buffer) => b,
      },
    };
    this.#server.addService(service, {
      Version: this.#unary('Version', (call: grpc.ServerUnaryCall<WireVersionRequest, WireVersionResponse>) => this.#versionRpc(call)),
      Probe: probe,
      ListProbeStatus: this.#unary('ListProbeStatus', (call: grpc.ServerUnaryCall<WireListRequest, WireListResponse>) => this.#listRpc(call)),
      WatchProbeEvents: (call: grpc.ServerWritableStream<WireWatchRequest, WireWatchResponse>) => this.#watchRpc(call),
      RunLifecycleHandler: hook,
      ExecSync: this.#unary('ExecSync', (call: grpc.ServerUnaryCall<Buffer, Buffer>) => handleExecSync(call.request, call, execSyncDeps)),
    });
    this.#hot = new HotUnaryServer((request, call) => this.#serve('ExecSync', () => handleExecSync(request, call, execSyncDeps)), {
      maxRequestBytes: opts.maxRequestBytes ?? 1024 * 1024,
      maxConcurrentStreams: opts.maxHotStreams ?? this.#probeGate.max + this.#hookGate.max + 1024,
    });
    this.#listener = net.createServer((socket) => this.#toGrpcJs(socket));
    // The shim's hot path: its connections read lean (agent/io/lean-socket.ts).
    this.#shimListener = leanServer((socket) => this.#hot.emit('connection', socket));
    this.#health = new HealthImplementation({ '': 'SERVING', [SERVICE_NAME]: 'SERVING' });
    this.#health.addToServer(this.#server);
    if (opts.reflection) {
      // Describe the health service too, so that grpcurl can call it by name.
      const health = protoLoader.loadSync(healthProtoPath, LOADER_OPTIONS);
      // Loaded only when asked for (off by default): the daemon need not carry it (issue 14).
      const { ReflectionService } = createRequire(import.meta.url)('@grpc/reflection') as typeof import('@grpc/reflection');
      new ReflectionService({ ...api.packageDefinition, ...health }).addToServer(this.#server);
    }
  }

  /** Prepares the socket path, binds, secures the socket and starts serving. */
  static async start(opts: ProbeApiServerOptions): Promise<ProbeApiServer> {
    const srv = new ProbeApiServer(opts);
    const gid = opts.socketGroup === undefined ? undefined : await resolveGroup(opts.socketGroup);
    if (srv.shimSocketPath === srv.socketPath) throw new ConfigError(`the shim's socket must differ from the ProbeService socket (${srv.socketPath})`);
    // The shim's socket may share the directory: the same directory rules, never the group.
    await prepareSocketPath(srv.socketPath, gid);
    await prepareSocketPath(srv.shimSocketPath, gid);
    srv.#injector = srv.#server.createConnectionInjector(grpc.ServerCredentials.createInsecure());
    const bind = (listener: net.Server, path: string): Promise<void> =>
      withPrivateUmask(
        () =>
          new Promise<void>((resolve, reject) => {
            listener.once('error', reject);
            listener.listen(path, () => {
              listener.off('error', reject);
              resolve();
            });
          }),
      );
    try {
      await bind(srv.#listener, srv.socketPath);
      srv.#socketIno = await secureSocket(srv.socketPath, gid);
      await bind(srv.#shimListener, srv.shimSocketPath);
      srv.#shimSocketIno = await secureSocket(srv.shimSocketPath, undefined);
    } catch (err) {
      srv.#listener.close();
      srv.#shimListener.close();
      srv.#server.forceShutdown();
      await removeSocket(srv.socketPath, srv.#socketIno);
      await removeSocket(srv.shimSocketPath, srv.#shimSocketIno);
      throw err;
    }
    srv.#log.info('ProbeService listening', {
      socket: srv.socketPath,
      mode: gid === undefined ? '0600' : '0660',
      gid,
      shimSocket: srv.shimSocketPath,
      reflection: opts.reflection === true,
      instance: srv.instanceId,
    });
    return srv;
  }

  /** Gives a connection on the ProbeService socket to grpc-js. */
  #toGrpcJs(socket: net.Socket): void {
    if (!this.#injector) {
      socket.destroy();
      return;
    }
    this.#grpcConns.add(socket);
    socket.once('close', () => this.#grpcConns.delete(socket));
    this.#injector.injectConnection(socket);
  }

  /** The gRPC target clients dial. */
  get address(): string {
    return `unix:${this.socketPath}`;
  }

  /** Live counters, for metrics and tests. */
  stats(): { watchers: number; probesInFlight: number; unaryInFlight: number } {
    return { watchers: this.#watchers.size, probesInFlight: this.#probeGate.inFlight, unaryInFlight: this.#unaryInFlight };
  }

  /** ExecSync's handler cache: bounds, entries, counters, namespace shares (metrics and tests). */
  execSyncCacheStats(): ExecSyncCacheStats {
    return this.#execSyncCache.stats();
  }

  /** Drops ExecSync's parsed commands of containers that are gone (their pod left kubelet's list). */
  forgetContainers(ids: Iterable<string>): void {
    for (const id of ids) this.#execSyncCache.forgetContainer(id);
  }

  /** Sets grpc.health.v1 for the server and the service (the daemon may report NOT_SERVING while it cannot probe). */
  setServing(serving: boolean): void {
    if (this.#stopping) return;
    const status = serving ? 'SERVING' : 'NOT_SERVING';
    this.#health.setStatus('', status);
    this.#health.setStatus(SERVICE_NAME, status);
  }

  /**
   * Graceful stop: health goes NOT_SERVING, watchers end with UNAVAILABLE (and their resume point),
   * new calls are refused, in-flight calls get up to `graceMs`, then the rest is cancelled and the
   * socket removed. Idempotent.
   */
  stop(graceMs = this.#opts.shutdownGraceMs ?? 10_000): Promise<void> {
    this.#stopping ??= this.#drain(graceMs);
    return this.#stopping;
  }

  async #drain(graceMs: number): Promise<void> {
    this.#health.setStatus('', 'NOT_SERVING');
    this.#health.setStatus(SERVICE_NAME, 'NOT_SERVING');
    this.#log.info('ProbeService draining', { inFlight: this.#unaryInFlight, watchers: this.#watchers.size, graceMs });
    for (const w of [...this.#watchers]) {
      w.end(grpc.status.UNAVAILABLE, `probe-agent is shutting down; resume from revision ${w.resumeFrom}`);
    }
    await new Promise<void>((resolve) => {
      let finished = false;
      const finish = (forced: boolean): void => {
        if (finished) return;
        finished = true;
        clearTimeout(graceTimer);
        if (forced) {
          this.#server.forceShutdown();
          this.#hot.destroy();
        }
        resolve();
      };
      const graceTimer = setTimeout(() => {
        if (this.#unaryInFlight > 0) this.#log.warn('grace period over, cancelling calls', { inFlight: this.#unaryInFlight });
        finish(true);
      }, graceMs);
      this.#listener.close();
      this.#shimListener.close();
      const grpcDone = new Promise<void>((done) => this.#server.tryShutdown(() => done()));
      // Both transports closed and no call left (an injected connection's calls are not all
      // tracked by grpc-js's tryShutdown).
      // grpc-js's tryShutdown does not wait for injected connections: wait for them to close too,
      // or the process may exit before the last answers are written.
      void Promise.all([grpcDone, this.#hot.close()]).then(() => this.#whenUnaryIdle()).then(() => this.#whenGrpcConnsClosed()).then(() => finish(false));
      // Open health watches and unread watch streams would hold tryShutdown for the whole grace
      // period. Once no unary call is left, give the last responses a moment to flush, then cut.
      void this.#whenUnaryIdle().then(() => setTimeout(() => finish(true), Math.min(250, graceMs)));
    });
    for (const [path, ino] of [[this.socketPath, this.#socketIno], [this.shimSocketPath, this.#shimSocketIno]] as const) {
      await removeSocket(path, ino).catch((err: unknown) => this.#log.warn('cannot remove socket', { socket: path, err: describeError(err) }));
    }
    this.#log.info('ProbeService stopped', { socket: this.socketPath });
  }

  #whenGrpcConnsClosed(): Promise<void> {
    return Promise.all([...this.#grpcConns].map((c) => (c.destroyed ? undefined : new Promise<void>((r) => c.once('close', () => r()))))).then(() => undefined);
  }

  #whenUnaryIdle(): Promise<void> {
    if (this.#unaryInFlight === 0) return Promise.resolve();
    return new Promise((resolve) => this.#idleWaiters.push(resolve));
  }

  /**
   * Runs one unary call's handler, whichever socket carried it: in-flight accounting (the drain
   * waits for it), the log line of a refusal, the metrics hook. Resolves with the answer or rejects
   * with the error to answer (grpcStatusFor maps it).
   */
  async #serve<Res>(method: string, fn: () => Promise<Res> | Res): Promise<Res> {
    const started = performance.now();
    this.#unaryInFlight++;
    let code: grpc.status = grpc.status.OK;
    try {
      return await fn();
    } catch (err) {
      const st = grpcStatusFor(err);
      code = st.code;
      if (st.code === grpc.status.INTERNAL) this.#log.error('RPC failed', { method, err: st.details });
      else this.#log.debug('RPC refused', { method, code: grpc.status[st.code], details: st.details });
      throw err;
    } finally {
      this.#unaryInFlight--;
      if (this.#unaryInFlight === 0) for (const w of this.#idleWaiters.splice(0)) w();
      try {
        this.#opts.onRpc?.(method, grpc.status[code] ?? String(code), (performance.now() - started) / 1000);
      } catch {
        // A metrics hook must never break an RPC.
      }
    }
  }

  /** A grpc-js unary handler around fn, run by #serve. */
  #unary<Req, Res>(method: string, fn: (call: grpc.ServerUnaryCall<Req, Res>) => Promise<Res> | Res): grpc.handleUnaryCall<Req, Res> {
    return (call, callback) => {
      this.#serve(method, () => fn(call)).then(
        (res) => callback(null, res),
        (err: unknown) => {
          const st = grpcStatusFor(err);
          const refusal = err instanceof NotStartedError ? err.trailers() : undefined;
          callback(refusal ? { code: st.code, details: st.details, metadata: refusal } : { code: st.code, details: st.details });
        },
      );
    };
  }

  #versionRpc(call: grpc.ServerUnaryCall<WireVersionRequest, WireVersionResponse>): WireVersionResponse {
    const client = call.request.version ?? '';
    if (client !== '' && client !== this.#version.apiVersion) {
      this.#log.warn('client speaks another API version', { client, served: this.#version.apiVersion });
    }
    return {
      agent_name: this.#version.agentName,
      agent_version: this.#version.agentVersion,
      api_version: this.#version.apiVersion,
      feature_gates: [...(this.#opts.featureGates ?? [])]
        .sort((a, b) => a.name.localeCompare(b.name))
        .map((g) => ({ name: g.name, stage: g.stage, enabled: g.enabled })),
      instance_id: this.instanceId,
    };
  }

  #listRpc(call: grpc.ServerUnaryCall<WireListRequest, WireListResponse>): WireListResponse {
    const filter = filterFromWire(call.request.filter);
    // revision() before list(): a status can only be newer than the revision, never older.
    const revision = this.#opts.results.revision();
    const statuses = this.#opts.results.list(filter).sort(byIdentity).map(statusToWire);
    return { statuses, revision, instance_id: this.instanceId };
  }

  #probeRpc(call: grpc.ServerUnaryCall<WireProbeRequest, WireProbeResponse>): Promise<WireProbeResponse> {
    if (this.#stopping) throw new NotStartedError('probe-agent is shutting down: the probe was not started', NOT_STARTED_DRAINING);
    return handleProbeCall(call, this.#opts.prober, this.#probeGate);
  }

  #watchRpc(call: grpc.ServerWritableStream<WireWatchRequest, WireWatchResponse>): void {
    const fail = (code: grpc.status, details: string): void => {
      this.#log.debug('watch refused', { code: grpc.status[code], details });
      call.emit('error', { code, details, metadata: new grpc.Metadata() });
    };
    if (this.#stopping) return fail(grpc.status.UNAVAILABLE, 'probe-agent is shutting down');
    const max = this.#opts.maxWatchers ?? 64;
    if (this.#watchers.size >= max) return fail(grpc.status.RESOURCE_EXHAUSTED, `too many watchers (limit ${max})`);
    let filter, fromRevision: number;
    const instanceId = call.request.instance_id ?? '';
    try {
      filter = filterFromWire(call.request.filter);
      fromRevision = revisionFromWire(call.request.from_revision, 'from_revision');
      if (instanceId.length > 128) throw new InvalidProbeError('instance_id: must be at most 128 characters');
    } catch (err) {
      const st = grpcStatusFor(err);
      return fail(st.code, st.details);
    }
    const session = new WatchSession({
      call,
      results: this.#opts.results,
      filter,
      limits: {
        maxBufferedMessages: this.#opts.watcherBufferMessages ?? 1024,
        snapshotChunk: this.#opts.snapshotChunk ?? 200,
      },
      log: this.#log,
      onDone: (s) => this.#watchers.delete(s),
    });
    this.#watchers.add(session);
    try {
      session.start({ fromRevision, instanceId }, this.instanceId);
    } catch (err) {
      session.end(grpc.status.INTERNAL, `watch failed: ${describeError(err)}`);
    }
  }
}
