/**
 * Test support for the ProbeService tests: a real on-demand prober for lab pods (the daemon's
 * version resolves pods from the kubelet; this one knows the lab's pods by construction) and a
 * ProbeApiServer on a socket in a private temp directory.
 *
 * Everything underneath is real: runProbe, the resident netns helper, the fair limiter, the
 * results store. Only the pod table stands in for the kubelet.
 */
import { access, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { NetnsUnavailableError, PodNotFoundError, UnsupportedPodError } from '../../agent/errors.ts';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { runProbe } from '../../agent/probe/run.ts';
import * as grpc from '@grpc/grpc-js';
import type { ApiError, WatchMessage } from '../../agent/api/client.ts';
import { loadProbeApi } from '../../agent/api/proto.ts';
import type { ProbeOutcome, ProbeType, SocketFactory } from '../../agent/probe/types.ts';
import { FairLimiter } from '../../agent/scheduler/limiter.ts';
import type { OnDemandProbeRequest, OnDemandProber, ProbeStatus, ThresholdResult } from '../../agent/scheduler/types.ts';
import { ProbeApiServer, type ProbeApiServerOptions } from '../../agent/api/server.ts';
import { ResultsStore } from '../../agent/scheduler/results-store.ts';

/** A pod the test prober knows. */
export interface KnownPod {
  uid: string;
  namespace: string;
  name: string;
  sandboxId: string;
  netns: string;
  podIPs: string[];
  hostNetwork?: boolean;
  containers: { name: string; ports: { name?: string; containerPort: number }[] }[];
}

/** OnDemandProber over a fixed pod table, with the agent's real probe path underneath. */
export class LabProber implements OnDemandProber {
  readonly pods: KnownPod[];
  readonly limiter: FairLimiter;
  readonly #sockets: SocketFactory;
  readonly #nodeSockets = new NodeSocketFactory();

  constructor(opts: { pods: KnownPod[]; sockets: SocketFactory; limiter?: FairLimiter }) {
    this.pods = opts.pods;
    this.#sockets = opts.sockets;
    this.limiter = opts.limiter ?? new FairLimiter({ maxInFlight: 32, maxQueued: 64, maxInFlightPerOwner: 32 });
  }

  /** Runs one probe for a known pod; rejects with the typed errors the API maps onto status codes. */
  async probe(req: OnDemandProbeRequest, signal?: AbortSignal): Promise<ProbeOutcome> {
    const pod = this.pods.find(
      (p) =>
        (req.podUID !== undefined && p.uid === req.podUID) ||
        (req.podSandboxID !== undefined && p.sandboxId === req.podSandboxID) ||
        (req.podNamespace !== undefined && p.namespace === req.podNamespace && p.name === req.podName),
    );
    if (!pod) throw new PodNotFoundError(`pod ${req.podUID ?? req.podSandboxID ?? `${req.podNamespace}/${req.podName}`} is not known on this node`);
    if (pod.hostNetwork) throw new UnsupportedPodError(`pod ${pod.namespace}/${pod.name} uses the host network: kubelet probes it`);
    try {
      await access(pod.netns);
    } catch {
      throw new NetnsUnavailableError(`network namespace of pod ${pod.namespace}/${pod.name} is not available (${pod.netns})`);
    }
    const container = pod.containers.find((c) => c.name === req.containerName);
    // A full queue rejects with OverloadedError, which the API maps to RESOURCE_EXHAUSTED.
    const permit = await this.limiter.acquire(pod.uid, signal);
    try {
      const outcome = await runProbe(req.handler, {
        netns: pod.netns,
        podIPs: pod.podIPs,
        containerPorts: container?.ports,
        timeoutSeconds: req.timeoutSeconds,
        sockets: this.#sockets,
        nodeSockets: this.#nodeSockets,
        kubeVersion: '1.34',
        hostFieldPolicy: 'refuse',
        happyEyeballs: true,
        signal,
      });
      if (permit.waitedMs > 0) outcome.phases.queue = permit.waitedMs / 1000;
      return outcome;
    } finally {
      permit.release();
    }
  }
}

/** A running API server in a private temp dir, with its store; close() stops it and removes the dir. */
export interface ApiFixture {
  server: ProbeApiServer;
  store: ResultsStore;
  dir: string;
  socket: string;
  /** The kubelet shim's socket (ExecSync only), beside `socket`. */
  shimSocket: string;
  close(): Promise<void>;
}

/** Starts a ProbeApiServer on `<tmp>/run/probe.sock` (the run/ directory is created by the server). */
export async function startApiFixture(
  opts: Omit<ProbeApiServerOptions, 'results' | 'socketPath'> & { store?: ResultsStore; dir?: string },
): Promise<ApiFixture> {
  const dir = opts.dir ?? (await mkdtemp(join(tmpdir(), 'pa-api-')));
  const socket = join(dir, 'run', 'probe.sock');
  const store = opts.store ?? new ResultsStore();
  const server = await ProbeApiServer.start({ ...opts, results: store, socketPath: socket, shutdownGraceMs: opts.shutdownGraceMs ?? 2000 });
  return {
    server,
    store,
    dir,
    socket,
    shimSocket: server.shimSocketPath,
    async close() {
      await server.stop();
      if (!opts.dir) await rm(dir, { recursive: true, force: true });
    },
  };
}

// ---- Client-side helpers shared by the API test files. ----

/** A raw client on the server's own loaded definition, for requests the reference client cannot express. */
export function rawUnary<T>(socket: string, method: string, req: unknown, deadlineMs = 5000): Promise<T> {
  const def = loadProbeApi().service[method] as grpc.MethodDefinition<unknown, T>;
  const c = new grpc.Client(`unix:${socket}`, grpc.credentials.createInsecure());
  return new Promise<T>((resolve, reject) => {
    c.makeUnaryRequest(def.path, def.requestSerialize, def.responseDeserialize, req, new grpc.Metadata(), { deadline: Date.now() + deadlineMs }, (err, res) => {
      c.close();
      if (err) reject(err);
      else resolve(res as T);
    });
  });
}

/** The gRPC status code and details a call fails with (it must fail). */
export async function codeOf(p: Promise<unknown>): Promise<{ code: number; details: string }> {
  try {
    await p;
  } catch (err) {
    const e = err as { code?: number; grpcCode?: number; details?: string; message: string };
    return { code: e.grpcCode ?? e.code ?? -1, details: e.details ?? e.message };
  }
  throw new Error('expected the call to fail');
}

/** Polls `pred` every 10 ms until it holds, or throws after `timeoutMs`. */
export async function until(pred: () => boolean, timeoutMs: number, what: string): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!pred()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** Collects a watch in the background. */
export function collect(gen: AsyncGenerator<WatchMessage>): { items: WatchMessage[]; error?: ApiError; done: Promise<void> } {
  const out: { items: WatchMessage[]; error?: ApiError; done: Promise<void> } = { items: [], done: Promise.resolve() };
  out.done = (async () => {
    try {
      for await (const m of gen) out.items.push(m);
    } catch (err) {
      out.error = err as ApiError;
    }
  })();
  return out;
}

/** A ProbeStatus as a worker would store it (for feeding a real ResultsStore). */
export function status(uid: string, ns: string, type: ProbeType, result: ThresholdResult, extra: Partial<ProbeStatus> = {}): ProbeStatus {
  return {
    key: { podUID: uid, containerName: 'app', probeType: type },
    namespace: ns,
    podName: `pod-${uid}`,
    containerID: `containerd://${uid}`,
    result,
    consecutive: 1,
    lastProbeTime: Date.now(),
    lastMessage: `${type} ${result}`,
    started: true,
    ready: result === 'success',
    onHold: false,
    ...extra,
  };
}

