/**
 * `probe-agent run`: wires the pod source, netns resolution, the helper, the probe workers, the
 * results store, the ProbeService socket and the metrics/health listener, and shuts them down in
 * order on SIGTERM (stop taking work, drain, exit 0 within the grace period).
 */
import { helperModeOptions, kubeletClientOptions, type RunConfig } from './config/run-config.ts';
import { describeError } from './errors.ts';
import { createLogger, type Logger } from './log.ts';
import { ProbeApiServer } from './api/server.ts';
import { ProbeApiClient } from './api/client.ts';
import { SERVICE_NAME } from './api/proto.ts';
import { createMetrics } from './metrics/registry.ts';
import { logProbeTransitions } from './metrics/probe-metrics.ts';
import { freshnessCheck, HealthRegistry } from './metrics/health.ts';
import { startMetricsServer, type MetricsServer } from './metrics/http-server.ts';
import { registerMemoryLimitGauge, registerReadinessGauge } from './metrics/ops-metrics.ts';
import { registerCloseHoleState } from './metrics/close-hole-state.ts';
import { ResidentHelper } from './netns/helper.ts';
import { NodeSocketFactory } from './netns/node-sockets.ts';
import { NetnsResolverChain } from './netns/resolver.ts';
import { buildResolvers } from './netns/build-resolvers.ts';
import { CriClient } from './netns/cri-client.ts';
import { CriResolver } from './netns/cri-resolver.ts';
import { criSandboxGoing, type SandboxGoing } from './prober/sandbox-going.ts';
import { KubeletClient } from './pods/kubelet-client.ts';
import { classifyPod } from './pods/pod-model.ts';
import { PodSource } from './pods/source.ts';
import { ContainerLocator, refreshPodsOf } from './prober/container-lookup.ts';
import type { PodInfo } from './pods/types.ts';
import { PodProber } from './prober/pod-prober.ts';
import { onOverloadedTimeout } from './probe/loop-lag.ts';
import { FairLimiter } from './scheduler/limiter.ts';
import { ProbeManager } from './scheduler/manager.ts';
import { ResultsStore } from './scheduler/results-store.ts';
import { AGENT_VERSION, API_VERSION } from './version.ts';
import { GatesController, runtimeCallMs } from './gates/controller.ts';
import { startLeaseRenewal } from './gates/lease.ts';
import { startRuntimeWatch } from './gates/runtime-watch.ts';
import { GATES_CONDITION_TYPE } from './pods/pod-model.ts';

/** Gates mode: how often the runtime's container list is read for restarts (one local CRI call). */
const RUNTIME_WATCH_INTERVAL_MS = 1000;
/** Gates mode: the largest reply of an exec preStop hook's ExecSync (its output, for the event). */
const EXEC_HOOK_MAX_REPLY_BYTES = 64 * 1024;
/**
 * One container event carries its sandbox's status and its containers' statuses (labels and
 * annotations included): a few KiB, a pod's annotations (at most 256 KiB) at worst. A larger
 * message ends the stream, which is then resubscribed and caught up by a list.
 */
const RUNTIME_EVENT_MAX_BYTES = 4 * 1024 * 1024;

/** A running agent; stop() is what SIGTERM does. */
export interface Daemon {
  stop(reason: string): Promise<void>;
  readonly stopped: Promise<void>;
}

/** Kubelet is considered unreachable for readiness after this many poll intervals without success. */
const STALE_AFTER_POLLS = 6;

/** Starts the agent; resolves once every listener is up (the first kubelet poll may still be running). */
export async function startDaemon(config: RunConfig, opts: { installSignalHandlers?: boolean } = {}): Promise<Daemon> {
  const log = createLogger({ level: config.logLevel, format: config.logFormat });
  const gates = config.featureGates;
  log.info('starting probe-agent', {
    version: AGENT_VERSION,
    node: process.version,
    nodeName: config.nodeName,
    kubelet: config.kubeletUrl,
    resolvers: config.netnsResolvers.join(','),
    featureGates: Object.fromEntries(gates.list().map((g) => [g.name, g.enabled])),
  });

  const metrics = createMetrics({ gates, version: AGENT_VERSION, apiVersion: API_VERSION, log });
  const cleanups: (() => Promise<void> | void)[] = [];
  // Probe timeouts the agent's own stalled loop caused are errors (probe/loop-lag.ts): said in the log at
  // most every 10 s, a warning once they are many (a stray stall of a loaded node is no alarm).
  let overloadLoggedAt = -Infinity;
  let overloadUnlogged = 0;
  onOverloadedTimeout((stalledMs, timeoutMs) => {
    overloadUnlogged++;
    if (Date.now() - overloadLoggedAt < 10_000) return;
    log[overloadUnlogged >= 10 ? 'warn' : 'info']('probe timeouts not counted: the agent\'s event loop was stalled (overloaded); kubelet keeps their last result', {
      probes: overloadUnlogged, stalledMs: Math.round(stalledMs), timeoutMs,
    });
    overloadLoggedAt = Date.now();
    overloadUnlogged = 0;
  });
  cleanups.push(() => onOverloadedTimeout(undefined));
  try {
    const helperModes = helperModeOptions(config);
    const helperMode = helperModes.warm ? 'warm' : helperModes.pool > 0 ? 'pool' : 'resident';
    const helper = await ResidentHelper.start({
      helperPath: config.helperPath,
      allowDirs: config.netnsDirs,
      procRoot: config.procRoot,
      ...helperModes,
      log,
      // Every probe and hook in flight may wait here for one of the maxSent children, which are what is scarce.
      maxInFlight: config.maxConcurrentProbes + config.maxConcurrentHooks + 64,
      maxSent: config.maxHelperRequests,
      onRestart: () => metrics.agent.helperRestart(),
      onRequest: (seconds, ok) => metrics.agent.helperSpawn(seconds, ok, helperMode),
      onWorkerLost: (why) => metrics.agent.helperWorkerLost(why),
    });
    cleanups.push(() => helper.close());

    const built = await buildResolvers(config, log, helper, () => metrics.agent.addressListing());
    cleanups.push(built.close);
    if (built.resolvers.length === 0) log.warn('no netns resolver available: every probe will report netns-unresolved');
    const resolver = new NetnsResolverChain(built.resolvers, {
      log,
      onResolve: (name, outcome, seconds) => metrics.agent.netnsResolve(name, outcome, seconds),
    });
    const store = new ResultsStore();
    logProbeTransitions(store, log);
    metrics.agent.setResultsSource(store);
    // Fair per namespace, then pod, then call; the node-wide caps protect the agent, the
    // per-namespace and per-pod caps the tenants from each other (docs/deploy.md).
    const limiter = new FairLimiter({
      maxInFlight: config.maxConcurrentProbes,
      maxQueued: config.maxQueuedProbes,
      maxInFlightPerGroup: config.maxProbesPerNamespace,
      // A namespace's own scheduled probes may wait up to the node's queue: a node's probes (at most
      // a few per pod, max-pods pods) never fill it, and the pump still serves namespaces fairly.
      // Calls from outside (the shim's) are held to the namespace's share: PodProber's bound.
      maxInFlightPerOwner: config.maxProbesPerPod,
      maxQueuedPerOwner: config.maxProbesPerPod,
    });
    const hookLimiter = new FairLimiter({
      what: 'hook',
      maxInFlight: config.maxConcurrentHooks,
      maxQueued: config.maxConcurrentHooks,
      maxInFlightPerGroup: config.maxHooksPerNamespace,
      maxQueuedPerGroup: config.maxHooksPerNamespace,
      maxInFlightPerOwner: config.maxHooksPerPod,
      maxQueuedPerOwner: config.maxHooksPerPod,
    });
    metrics.agent.setLimiterSource(() => ({ inFlight: limiter.inFlight, queued: limiter.queued }));
    metrics.agent.setLimiterBounds('probe', limiter);
    metrics.agent.setLimiterBounds('hook', hookLimiter);

    const client = new KubeletClient(kubeletClientOptions(config, log));
    cleanups.push(() => client.close());
    const source = new PodSource({
      client,
      pollIntervalMs: config.kubeletPollIntervalMs,
      log,
      onPoll: (seconds, errorKind) => metrics.agent.kubeletPoll(seconds, errorKind),
    });

    const cri = built.resolvers.find((r): r is CriResolver => r instanceof CriResolver);
    const classify = (pod: PodInfo) => classifyPod(pod, { sandboxedRuntimeClasses: config.sandboxedRuntimeHandlers });
    const containers = new ContainerLocator({
      pods: source,
      // The runtime answers a shim call by container ID alone (netns, IPs, annotations): no wait for /pods.
      ...(cri ? { runtime: cri.client, sandboxNetns: (res, id, who, uid) => cri.netnsOfStatus(res, id, who, uid) } : {}),
      refreshPods: refreshPodsOf(source),
      onLookup: (how) => metrics.agent.containerLookup(how),
      // A dead or replaced container's parsed ExecSync commands go with it.
      onContainerGone: (id) => apiServer?.forgetContainers([id]),
      log,
    });
    const prober = new PodProber({
      pods: source,
      resolver,
      limiter,
      // Beyond its share a namespace's call is refused at once (a clear RESOURCE_EXHAUSTED), so one
      // namespace's hanging calls never fill the node's queue for the others.
      maxQueuedPerNamespace: config.maxProbesPerNamespace,
      hookLimiter,
      sockets: helper,
      nodeSockets: new NodeSocketFactory(),
      gates,
      kubeVersion: config.kubeProbeVersion,
      classify,
      containers,
      // On-demand mode: results of probes kubelet drives through the shim feed those probes' workers.
      onShimResult: (key, containerID, outcome) => manager.deliver(key, containerID, outcome),
      log,
      sandboxGoing: sandboxGoingOf(built.resolvers),
    });
    const manager = new ProbeManager({
      runProbe: prober.runForWorker,
      store,
      classify,
      limiter,
      observer: metrics.probeObserver,
      logger: log,
      tickAlignMs: config.probeTickAlignmentMs,
    });
    cleanups.push(() => manager.stop());

    // Gates mode: the probe workers see the containers the runtime has started since kubelet's list.
    let workerView = (pods: PodInfo[]): PodInfo[] => pods;
    source.on('snapshot', (snap) => {
      manager.sync(workerView(snap.pods));
      // Calls still in flight for departed pods cache them again from the runtime: that goes too.
      containers.retainPods(new Set([...snap.pods.map((p) => p.uid), ...snap.errors.flatMap((e) => (e.uid ? [e.uid] : []))]), snap.askedAt);
      const notOurs: Record<string, number> = {};
      for (const n of manager.notOurs()) notOurs[n.reason] = (notOurs[n.reason] ?? 0) + 1;
      metrics.agent.setPodCounts({ ours: snap.pods.length - manager.notOurs().length, notOurs });
      metrics.agent.setDroppedPods(snap.errors.map((e) => e.reason));
    });
    if (config.gates) {
      // Loaded only in gates mode: the API client brings undici (tens of MB), which no other path of the daemon needs.
      const { ApiWriter } = await import('./gates/api-writer.ts');
      const { inClusterOptions } = await import('./webhook/cluster-reader.ts');
      const api = config.apiServerUrl ? { url: config.apiServerUrl } : inClusterOptions();
      if (!api) throw new Error('--gates needs --api-server, or to run in a pod (KUBERNETES_SERVICE_HOST)');
      if (!config.nodeName) throw new Error('--gates needs the node name (--node-name or $NODE_NAME)');
      const writer = new ApiWriter({
        ...api,
        ...(config.apiTokenFile ? { tokenFile: config.apiTokenFile } : {}),
        ...(config.apiCaFile ? { caFile: config.apiCaFile } : {}),
        nodeName: config.nodeName,
        conditionType: GATES_CONDITION_TYPE,
      });
      cleanups.push(() => writer.close());
      // Exec preStop hooks get a client of their own, whose replies are bounded: a pod's hook that
      // prints megabytes, in many pods at once, must not fill the agent's heap. Beyond the bound the
      // hook has still run; it is reported failed, with the reason.
      const hookRuntime = cri ? new CriClient(cri.client.endpoint, { maxReplyBytes: EXEC_HOOK_MAX_REPLY_BYTES }) : undefined;
      if (hookRuntime) cleanups.push(() => hookRuntime.close());
      const gatesController = new GatesController({
        results: store,
        writer,
        // StopContainer waits out the grace period, then the runtime kills: give the call that long and
        // more, a deadline grpc-js accepts (a pod's grace is clamped: a huge one made grpc-js throw
        // "Deadline is too far in the future" where no caller could catch it, and the agent exit).
        ...(cri ? { stopper: { stopContainer: (id: string, t: number) => cri.client.stopContainer(id, t, runtimeCallMs(t)) } } : {}),
        ...(hookRuntime ? { exec: async (id: string, cmd: string[], t: number) => {
          const r = await hookRuntime.execSync(id, cmd, t, runtimeCallMs(t));
          // kubelet's exec hook failure: the exit code and the command's output (bounded, for the event).
          return r.exitCode === 0 ? '' : `command ${JSON.stringify(cmd).slice(0, 256)} exited with ${r.exitCode}: ${Buffer.concat([r.stdout, r.stderr]).subarray(0, 1024).toString('utf8').trim()}`;
        } } : {}),
        preStop: async (pod, container, handler, timeoutSeconds) => {
          const o = await prober.runHook({ podUID: pod.uid, containerName: container.name, handler, hook: 'preStop', timeoutSeconds });
          return o.result === 'success' ? '' : o.message || o.result;
        },
        log,
        onOp: (op, ok) => metrics.agent.gatesOp(op, ok),
      });
      cleanups.push(() => gatesController.close());
      // A crashed container's restart is seen from the runtime's container events (its list every
      // second where it has none), well before kubelet's /pods; a container /pods does not show yet
      // has /pods read again (at most once a second) until it does.
      if (cri) {
        workerView = (pods) => gatesController.asRuntimeStarted(pods);
        cri.client.version().then((v) => gatesController.setRuntimeName(v.runtimeName), (err: unknown) => {
          log.info('runtime version not read; new containers are probed once kubelet lists them', { err: describeError(err) });
        });
        const events = new CriClient(cri.client.endpoint, { maxReplyBytes: RUNTIME_EVENT_MAX_BYTES });
        cleanups.push(() => events.close());
        cleanups.push(startRuntimeWatch({
          list: () => cri.client.listContainers({}),
          events: (onEvent, onEnd) => events.containerEvents(onEvent, onEnd),
          intervalMs: RUNTIME_WATCH_INTERVAL_MS, log,
          onContainers: (cs) => {
            if (!gatesController.runtime(cs)) return;
            source.refresh();
            // A container started since kubelet's list: probed now, not after kubelet's list shows it.
            if (source.lastSuccess !== undefined) manager.sync(workerView(source.pods()));
          },
          onSource: (s) => metrics.agent.runtimeWatchSource(s),
          onEvent: (t) => metrics.agent.runtimeEvent(t),
        }));
      }
      // After the manager's sync (listeners run in order): the store then holds this list's decisions.
      source.on('snapshot', (snap) => { if (gatesController.sync(snap.pods)) source.refresh(); });
      if (config.nodeLeaseDurationMs > 0) {
        cleanups.push(startLeaseRenewal({ writer, namespace: config.nodeLeaseNamespace, node: config.nodeName, durationMs: config.nodeLeaseDurationMs, log, onRenew: (ok) => metrics.agent.gatesOp('lease', ok) }));
      }
      log.info('gates mode on', { apiServer: api.url, nodeLease: config.nodeLeaseDurationMs > 0 ? `${config.nodeLeaseNamespace}/probe-agent-${config.nodeName}` : 'off' });
    }
    // Set once the API listens; pods leaving before that have nothing cached there.
    let apiServer: ProbeApiServer | undefined;
    source.on('diff', (diff) => {
      for (const pod of diff.removed) {
        prober.forget(pod.uid);
        // ExecSync's parsed commands of its containers (older IDs went when the lookup saw them replaced).
        apiServer?.forgetContainers(pod.containers.flatMap((c) => (c.state?.containerID ? [c.state.containerID] : [])));
      }
    });

    const api = await ProbeApiServer.start({
      results: store,
      prober,
      featureGates: gates.list(),
      socketPath: config.socket,
      socketGroup: config.socketGroup,
      shimSocketPath: config.shimSocket,
      reflection: config.grpcReflection,
      // Backstops for calls not yet admitted (pod lookup, netns): admission itself is per tenant, in the prober.
      maxInFlightProbes: config.maxConcurrentProbes + config.maxQueuedProbes,
      maxInFlightHooks: 2 * config.maxConcurrentHooks,
      shutdownGraceMs: config.shutdownGracePeriodMs,
      log,
      // The server names the method ('Probe'); the metric label is the full gRPC path, as in kubelet's CRI metrics.
      onRpc: (method, code, seconds) => metrics.agent.grpcRequest(`/${SERVICE_NAME}/${method}`, code, seconds),
    });
    apiServer = api;
    metrics.agent.setExecSyncCacheSource(() => api.execSyncCacheStats());
    cleanups.push(() => api.stop());

    const health = new HealthRegistry({ log });
    const staleBound = (config.kubeletPollIntervalMs * STALE_AFTER_POLLS) / 1000 + config.kubeletTimeoutMs / 1000;
    health.addReadiness('kubelet', freshnessCheck('kubelet poll', () => source.lastSuccess, staleBound));
    // A real Version call over the socket: proves the file is there, bound and answering.
    const selfClient = new ProbeApiClient(config.socket);
    cleanups.push(() => selfClient.close());
    health.addReadiness('grpc', async () => {
      await selfClient.version(1500);
    }, { timeoutMs: 2000, cacheMs: 5000 });
    health.addReadiness('helper', () => helper.selfTest(), { timeoutMs: 2000, cacheMs: 5000 });
    cleanups.push(() => health.close());
    registerReadinessGauge(metrics.registry, health);
    registerMemoryLimitGauge(metrics.registry);
    if (config.closeHoleStateFile) registerCloseHoleState(metrics.registry, config.closeHoleStateFile);

    let metricsServer: MetricsServer | undefined;
    if (config.metricsAddress) {
      metricsServer = await startMetricsServer({
        address: config.metricsAddress,
        registry: metrics.registry,
        probesRegistry: metrics.probesRegistry,
        health,
        ...(config.shimMetricsSocket ? { shimMetricsSocket: config.shimMetricsSocket } : {}),
        log,
      });
      const ms = metricsServer;
      cleanups.push(() => ms.close());
    }
    if (config.healthAddress) {
      // Health on its own listener and connections (loopback by default): the metrics listener may
      // be reachable by pods; a flood there must not fail kubelet's probes of the agent nor the
      // close-hole sidecar's check (which would open the hole).
      const hs = await startMetricsServer({
        address: config.healthAddress,
        registry: metrics.registry,
        health,
        log,
        healthOnly: true,
        maxConnections: 16,
        maxConcurrent: 8,
      });
      cleanups.push(() => hs.close());
    }

    source.start();
    log.info('probe-agent running', {
      socket: config.socket,
      shimSocket: config.shimSocket,
      metrics: config.metricsAddress ? `${config.metricsAddress.host}:${config.metricsAddress.port}` : 'off',
      health: config.healthAddress ? `${config.healthAddress.host}:${config.healthAddress.port}` : 'off',
    });

    let resolveStopped!: () => void;
    const stopped = new Promise<void>((r) => (resolveStopped = r));
    let stopping: Promise<void> | undefined;
    const stop = (reason: string): Promise<void> => {
      stopping ??= (async () => {
        log.info('shutting down', { reason, gracePeriodMs: config.shutdownGracePeriodMs });
        health.markShuttingDown();
        source.stop();
        // The API goes NOT_SERVING and drains its in-flight calls; workers stop (their in-flight probes are
        // aborted) while results stay in the store, so watchers see no burst of removals.
        await Promise.allSettled([api.stop(), manager.stop()]);
        await runCleanups(cleanups, log);
        log.info('probe-agent stopped');
        resolveStopped();
      })();
      return stopping;
    };
    if (opts.installSignalHandlers !== false) {
      for (const sig of ['SIGTERM', 'SIGINT'] as const) {
        process.once(sig, () => {
          const timer = setTimeout(() => {
            log.error('shutdown grace period exceeded, exiting', { gracePeriodMs: config.shutdownGracePeriodMs });
            process.exit(1);
          }, config.shutdownGracePeriodMs + 2000);
          timer.unref();
          void stop(sig).then(() => process.exit(0));
        });
      }
    }
    return { stop, stopped };
  } catch (err) {
    log.error('probe-agent failed to start', { err: describeError(err) });
    await runCleanups(cleanups, log);
    throw err;
  }
}

async function runCleanups(cleanups: (() => Promise<void> | void)[], log: Logger): Promise<void> {
  for (const cleanup of cleanups.reverse()) {
    try {
      await cleanup();
    } catch (err) {
      log.warn('cleanup failed', { err: describeError(err) });
    }
  }
  cleanups.length = 0;
}

/** The runtime's view of stopped sandboxes, when a CRI resolver is configured. */
function sandboxGoingOf(resolvers: readonly unknown[]): SandboxGoing | undefined {
  const cri = resolvers.find((r): r is CriResolver => r instanceof CriResolver);
  return cri ? criSandboxGoing(cri.client) : undefined;
}
