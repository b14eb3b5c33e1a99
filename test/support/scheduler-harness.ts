/**
 * Test support for the scheduler: real TCP/HTTP servers on 127.0.0.1 that a test turns up and down,
 * the real prober (agent/probe/run.ts) on node sockets, PodInfo builders, and a harness that wires
 * the real ProbeManager, ResultsStore and FairLimiter to a ManualClock.
 */
import { once } from 'node:events';
import http from 'node:http';
import net from 'node:net';
import type { Logger } from '../../agent/log.ts';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { runProbe } from '../../agent/probe/run.ts';
import type { ContainerInfo, ContainerProbe, ContainerState, NotOursReason, PodInfo } from '../../agent/pods/types.ts';
import type { ProbeOutcome, ProbeSpec, ProbeType } from '../../agent/probe/types.ts';
import { ManualClock, settle } from '../../agent/scheduler/clock.ts';
import type { Clock } from '../../agent/scheduler/clock.ts';
import type { FairLimiter } from '../../agent/scheduler/limiter.ts';
import { ProbeManager } from '../../agent/scheduler/manager.ts';
import { ResultsStore } from '../../agent/scheduler/results-store.ts';
import type { ProbeEvent, ProbeKey, ProbeObserver, ProbeRunMeta, ProbeStatus } from '../../agent/scheduler/types.ts';
import type { RunProbe } from '../../agent/scheduler/worker.ts';

/**
 * A listener on 127.0.0.1 that can be closed (connections refused) and reopened on the same port.
 * Plain: accepts TCP and closes. With `httpDelayMs`: an HTTP server answering 200 after that delay
 * (Infinity: never), for slow and hanging probes.
 */
export class ToggleServer {
  port = 0;
  accepted = 0;
  #server: net.Server | undefined;
  readonly #sockets = new Set<net.Socket>();
  #httpDelayMs: number | undefined;

  static async start(opts: { httpDelayMs?: number } = {}): Promise<ToggleServer> {
    const s = new ToggleServer();
    s.#httpDelayMs = opts.httpDelayMs;
    await s.up();
    return s;
  }

  get isUp(): boolean {
    return this.#server !== undefined;
  }

  async up(): Promise<void> {
    if (this.#server) return;
    const delay = this.#httpDelayMs;
    const server =
      delay === undefined
        ? net.createServer((sock) => sock.end())
        : http.createServer((_req, res) => {
            if (delay === Infinity) return;
            const timer = setTimeout(() => res.end('ok'), delay);
            res.on('close', () => clearTimeout(timer));
          });
    server.on('connection', (sock: net.Socket) => {
      this.accepted++;
      this.#sockets.add(sock);
      sock.on('close', () => this.#sockets.delete(sock));
      sock.on('error', () => {});
    });
    server.listen({ host: '127.0.0.1', port: this.port });
    await once(server, 'listening');
    this.port = (server.address() as net.AddressInfo).port;
    this.#server = server;
  }

  async down(): Promise<void> {
    const server = this.#server;
    if (!server) return;
    this.#server = undefined;
    // Hanging clients would keep close() waiting.
    for (const sock of this.#sockets) sock.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}

/**
 * The real prober (agent/probe/run.ts) with sockets in the test's own netns: real kubelet TCP/HTTP
 * probes against the pod's IPs, which in these tests are 127.0.0.1.
 */
export function realRunProbe(): RunProbe {
  const sockets = new NodeSocketFactory();
  return (p, c, spec, signal) =>
    runProbe(spec.handler, {
      podIPs: p.podIPs,
      containerPorts: c.ports,
      timeoutSeconds: spec.timeoutSeconds,
      sockets,
      nodeSockets: sockets,
      kubeVersion: '1.34',
      hostFieldPolicy: 'refuse',
      happyEyeballs: false,
      signal,
    });
}

/** An HTTP GET / probe spec with kubelet's defaults, overridable. */
export function httpProbe(port: number, over: Partial<Omit<ProbeSpec, 'handler'>> = {}): ContainerProbe {
  const probe = tcpProbe(port, over) as { ok: true; spec: ProbeSpec };
  return { ok: true, spec: { ...probe.spec, handler: { kind: 'http', port, path: '/', scheme: 'HTTP', headers: [] } } };
}

/** A TCP probe spec with kubelet's defaults, overridable. */
export function tcpProbe(port: number | string, over: Partial<Omit<ProbeSpec, 'handler'>> = {}): ContainerProbe {
  return {
    ok: true,
    spec: {
      handler: { kind: 'tcp', port },
      timeoutSeconds: 1,
      periodSeconds: 10,
      successThreshold: 1,
      failureThreshold: 3,
      initialDelaySeconds: 0,
      ...over,
    },
  };
}

/** An exec probe (kubelet's business). */
export function execProbe(): ContainerProbe {
  return { ok: true, spec: { handler: { kind: 'exec', command: ['true'] }, timeoutSeconds: 1, periodSeconds: 10, successThreshold: 1, failureThreshold: 3, initialDelaySeconds: 0 } };
}

/** A running container state started `ageMs` before `now`. */
export function running(id: string, now: number, ageMs = 0, extra: Partial<ContainerState> = {}): ContainerState {
  return { containerID: `containerd://${id}`, running: true, startedAt: now - ageMs, terminated: false, ready: false, restartCount: 0, ...extra };
}

/** A container with the given probes. */
export function container(name: string, probes: Partial<Record<ProbeType, ContainerProbe>>, state: ContainerState | undefined, extra: Partial<ContainerInfo> = {}): ContainerInfo {
  return { name, kind: 'regular', ports: [], probes, state, ...extra };
}

/** A pod on a pod network. */
export function pod(uid: string, containers: ContainerInfo[], extra: Partial<PodInfo> = {}): PodInfo {
  return {
    uid,
    namespace: 'ns',
    name: `pod-${uid}`,
    hostNetwork: false,
    podIPs: ['127.0.0.1'],
    phase: 'Running',
    restartPolicy: 'Always',
    isStatic: false,
    podReady: false,
    containers,
    ...extra,
  };
}

/** A classifier for tests: host-network pods and pods without our probes are kubelet's. */
export function testClassify(p: PodInfo): NotOursReason | undefined {
  if (p.hostNetwork) return 'host-network';
  const probes = p.containers.flatMap((c) => Object.values(c.probes));
  if (probes.length === 0) return 'no-network-probes';
  if (probes.every((x) => x.ok && x.spec.handler.kind === 'exec')) return 'exec-only';
  return undefined;
}

/** An observer that records every call. */
export class RecordingObserver implements ProbeObserver {
  runs: { meta: ProbeRunMeta; outcome: ProbeOutcome }[] = [];
  started: ProbeRunMeta[] = [];
  stopped: ProbeRunMeta[] = [];
  probeRun(meta: ProbeRunMeta, outcome: ProbeOutcome): void {
    this.runs.push({ meta, outcome });
  }
  workerStarted(meta: ProbeRunMeta): void {
    this.started.push(meta);
  }
  workerStopped(meta: ProbeRunMeta): void {
    this.stopped.push(meta);
  }
  runsOf(type: ProbeType): number {
    return this.runs.filter((r) => r.meta.key.probeType === type).length;
  }
}

/** The real manager, store and observer on a ManualClock, with helpers to step time. */
export class Harness {
  readonly clock: ManualClock;
  readonly store: ResultsStore;
  readonly observer = new RecordingObserver();
  readonly manager: ProbeManager;
  readonly events: ProbeEvent[] = [];
  readonly t0: number;

  constructor(opts: { agentStartOffsetMs?: number; random?: () => number; runProbe?: RunProbe; limiter?: FairLimiter; clock?: ManualClock; logger?: Logger } = {}) {
    this.clock = opts.clock ?? new ManualClock({ random: opts.random });
    this.t0 = this.clock.now();
    this.store = new ResultsStore({ clock: this.clock });
    this.store.subscribe((e) => this.events.push(e));
    this.manager = new ProbeManager({
      runProbe: opts.runProbe ?? realRunProbe(),
      store: this.store,
      classify: testClassify,
      observer: this.observer,
      clock: this.clock as Clock,
      // Default: the agent has been up for an hour, so no jitter and no restart grace.
      agentStart: this.t0 + (opts.agentStartOffsetMs ?? -3_600_000),
      limiter: opts.limiter,
      ...(opts.logger ? { logger: opts.logger } : {}),
    });
  }

  /** Now on the manual clock. */
  now(): number {
    return this.clock.now();
  }

  /** Syncs pods and waits for the probes this started. */
  async sync(pods: PodInfo[]): Promise<void> {
    this.manager.sync(pods);
    await this.idle();
  }

  /** Advances the clock (one period at a time is what the tests do) and waits for the probes it started. */
  async step(ms: number): Promise<void> {
    await this.clock.advance(ms);
    await this.idle();
  }

  async idle(): Promise<void> {
    for (let i = 0; i < 3; i++) {
      await this.manager.whenIdle();
      await settle();
    }
  }

  status(uid: string, containerName: string, probeType: ProbeType): ProbeStatus | undefined {
    const key: ProbeKey = { podUID: uid, containerName, probeType };
    return this.store.get(key);
  }

  async close(): Promise<void> {
    await this.manager.stop();
  }
}
