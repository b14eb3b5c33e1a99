/**
 * The kubelet shim: a CRI proxy between kubelet and the container runtime. Every call is passed
 * through at the HTTP/2 frame level, one runtime connection per kubelet connection (relay.ts).
 * Only ExecSync is looked at, and an ExecSync whose command is probe-agent's
 * (agent/contract/shim-command.ts) goes, as kubelet's message bytes unchanged, to the agent's
 * ExecSync on the agent's socket for the shim, over a separate connection with its own deadlines; the agent's answer goes
 * back to kubelet unchanged. So a slow or dead agent costs kubelet nothing but that one call, and
 * kubelet's ordinary calls never wait on the agent.
 */
import * as net from 'node:net';
import { chmodSync, existsSync, lstatSync, mkdirSync, unlinkSync } from 'node:fs';
import path from 'node:path';
import { AgentCallError, ShimProbeClient } from './agent-client.ts';
import { shimSocketBeside } from '../contract/shim-socket.ts';
import { readSingleFrame } from '../grpc/frame.ts';
import { parseGrpcTimeout } from '../grpc/headers.ts';
import { GrpcCode } from '../grpc/status.ts';
import { answerFromCallError, causeOfCallError, type ExecSyncAnswer } from './answer.ts';
import { runHookOnce } from './hook-runner.ts';
import { ShimMetrics, type AgentErrorCause, type InterceptKind } from './metrics.ts';
import { execSyncFacts, type ExecSyncFacts } from './exec-sync.ts';
import type { HeaderField } from '../http2/hpack.ts';
import { FrameRelay } from './relay.ts';
import { leanServer, type LeanSocket } from '../io/lean-socket.ts';
import { AGENT_GRACE_MS, HOOK_LAST_RESORT_MS, agentCallMs } from '../probe/time-budget.ts';


/** How the shim is configured. */
export interface ShimConfig {
  /** Socket kubelet connects to (containerRuntimeEndpoint). */
  listenPath: string;
  /** The real runtime's socket. */
  runtimeSocket: string;
  /** The agent's ProbeService socket: where an agent without a socket for the shim is reached. */
  probeSocket: string;
  /** The agent's socket for the shim (default: shimSocketBeside(probeSocket)). */
  agentSocket?: string;
  /** Time the agent gets beyond a probe's own timeout before the shim gives up on it (queueing, helper). */
  agentGraceMs?: number;
  /**
   * How long a hook waits for an agent that has not started it (down, starting, draining, or
   * refusing admission) before it fails; the hook then runs exactly once.
   */
  hookAgentWaitMs?: number;
  /** Local bound on one hook call to a hung agent (default: the agent's 1 h cap + 30 s). */
  hookLastResortMs?: number;
  /** Counters (default: a new set; main.ts serves them on --metrics-socket). */
  metrics?: ShimMetrics;
  /** Structured log sink; default: JSON lines on stderr for warnings and errors. */
  log?: ShimLog;
}

/** A log line: level, message, fields. */
export type ShimLog = (level: 'info' | 'warn' | 'error', msg: string, fields?: Record<string, unknown>) => void;

/** Counters, for tests and the bench. */
export interface ShimStats {
  forwarded: number;
  intercepted: number;
  agentErrors: number;
  runtimeErrors: number;
}

const DEFAULTS = { agentGraceMs: AGENT_GRACE_MS, hookAgentWaitMs: 60_000, hookLastResortMs: HOOK_LAST_RESORT_MS };

const HOOK_KINDS: ReadonlySet<InterceptKind> = new Set(['postStart', 'preStop']);

/** Strips "unix://" from an endpoint; a bare path passes unchanged. */
export function socketPathOf(endpoint: string): string {
  if (endpoint.startsWith('unix://')) return endpoint.slice('unix://'.length);
  if (endpoint.startsWith('unix:')) return endpoint.slice('unix:'.length);
  if (endpoint.includes('://')) throw new Error(`unsupported endpoint ${JSON.stringify(endpoint)}: only unix sockets`);
  return endpoint;
}

const stderrLog: ShimLog = (level, msg, fields) => {
  if (level === 'info') return;
  process.stderr.write(`${JSON.stringify({ time: new Date().toISOString(), level, msg, ...fields })}\n`);
};

/** A running shim. */
export class CriShim {
  readonly config: Required<Omit<ShimConfig, 'log' | 'metrics'>>;
  readonly stats: ShimStats = { forwarded: 0, intercepted: 0, agentErrors: 0, runtimeErrors: 0 };
  /** The Prometheus counters (agent/shim/metrics.ts). */
  readonly metrics: ShimMetrics;
  readonly #agent: ShimProbeClient;
  readonly #log: ShimLog;
  /** Accepts kubelet's connections on the shim socket. */
  readonly #listener: net.Server;
  /** Frame relays of kubelet connections. */
  readonly #relays = new Set<FrameRelay>();
  readonly #warned = new Map<string, { at: number; suppressed: number }>();

  constructor(config: ShimConfig) {
    const { log, metrics, ...rest } = config;
    this.config = { ...DEFAULTS, ...rest, agentSocket: rest.agentSocket ?? shimSocketBeside(rest.probeSocket) } as Required<Omit<ShimConfig, 'log' | 'metrics'>>;
    this.#log = log ?? stderrLog;
    this.metrics = metrics ?? new ShimMetrics();
    this.#agent = new ShimProbeClient(this.config.agentSocket, this.config.probeSocket, (socket, fallback) => this.#log('info', fallback
      ? 'nothing listens on the agent\'s socket for the shim (an agent of the release before it): rewritten calls go to the ProbeService socket'
      : 'the agent\'s socket for the shim answers: rewritten calls go there', { socket }));
    this.#listener = leanServer((socket) => this.#relay(socket));
  }

  /** Carries a kubelet connection frame by frame to its own runtime connection (relay.ts). */
  #relay(socket: LeanSocket): void {
    let authorityLogged = false;
    const client = this.metrics.criClientOpened();
    const relay = new FrameRelay(socket, {
      called: () => this.metrics.criCall(client),
      runtimeSocket: this.config.runtimeSocket,
      intercept: (body, fields, signal) => this.#intercept(body, fields, signal),
      forwarded: (p) => {
        this.stats.forwarded++;
        this.metrics.forwarded(p);
      },
      runtimeError: (err) => {
        this.stats.runtimeErrors++;
        this.metrics.runtimeError();
        this.#warn('runtime unavailable', { runtime: this.config.runtimeSocket, error: err.message });
      },
      refused: (err) => {
        // A connection reset before its first request is a liveness check (the installer's, a
        // health script), not a client speaking something else: nothing to report.
        const code = (err as NodeJS.ErrnoException).code;
        if (code !== 'ECONNRESET' && code !== 'EPIPE') this.#warn('closing a connection that is not HTTP/2 the shim can carry', { error: err.message });
      },
      runtimeGoaway: (code, debug) => this.#warn('runtime closed the connection with an error', { runtime: this.config.runtimeSocket, http2Error: code, debug }),
      rewritingAuthority: (authority) => {
        if (authorityLogged) return;
        authorityLogged = true;
        this.#log('info', 'client :authority refused by HTTP/2, rewriting it on this connection', { authority: authority ?? null, substitute: 'localhost' });
      },
    });
    this.#relays.add(relay);
    relay.onClose(() => {
      this.#relays.delete(relay);
      this.metrics.criClientClosed(client);
    });
  }

  /** A complete ExecSync body from the frame relay: the shim's answer, or null to forward it. */
  #intercept(body: Buffer, fields: readonly HeaderField[], signal: AbortSignal): Promise<ExecSyncAnswer> | null {
    // Not one uncompressed message, or not probe-agent's argv[0] after all: the runtime gets it as sent.
    const msg = readSingleFrame(body);
    const facts = msg === null ? null : execSyncFacts(msg);
    if (facts === null) return null;
    this.stats.intercepted++;
    const timeout = fields.find((f) => f.name === 'grpc-timeout')?.value;
    return this.#answerFor(body, facts, timeout, signal);
  }

  /** Listens on the shim socket (mode 0600; a stale socket file is replaced). */
  async listen(): Promise<void> {
    const p = this.config.listenPath;
    const dir = path.dirname(p);
    // Non-recursive when the parent exists: Node's recursive mkdir spins forever under /proc.
    if (!existsSync(dir)) mkdirSync(dir, { recursive: !existsSync(path.dirname(dir)), mode: 0o700 });
    try {
      if (lstatSync(p).isSocket()) {
        // A live shim owns it: never take kubelet's endpoint from under a running one.
        if (await socketAnswers(p)) throw new Error(`${p} is in use by a running process (another shim?)`);
        unlinkSync(p);
      }
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    }
    await new Promise<void>((resolve, reject) => {
      this.#listener.once('error', reject);
      this.#listener.listen(p, () => {
        this.#listener.off('error', reject);
        resolve();
      });
    });
    chmodSync(p, 0o600);
  }

  /** Stops accepting, lets calls in flight finish for up to `graceMs`, then closes everything. */
  async close(graceMs = 5000): Promise<void> {
    const closed = new Promise<void>((resolve) => this.#listener.close(() => resolve()));
    for (const r of this.#relays) r.drain();
    const timer = setTimeout(() => {
      for (const r of this.#relays) r.destroy();
    }, graceMs);
    await closed;
    clearTimeout(timer);
    this.#agent.close();
    try {
      unlinkSync(this.config.listenPath);
    } catch {
      // already gone
    }
  }

  /**
   * Warnings, at most one per message every 10 s (with the count suppressed meanwhile): a dead
   * agent or runtime would otherwise log once per kubelet call.
   */
  #warn(msg: string, fields: Record<string, unknown>): void {
    const now = Date.now();
    const seen = this.#warned.get(msg);
    if (seen && now - seen.at < 10_000) {
      seen.suppressed++;
      return;
    }
    this.#warned.set(msg, { at: now, suppressed: 0 });
    this.#log('warn', msg, seen?.suppressed ? { ...fields, suppressed: seen.suppressed } : fields);
  }

  /** Runs an intercepted ExecSync through the agent and counts it; never throws. */
  async #answerFor(body: Buffer, facts: ExecSyncFacts, grpcTimeout: string | string[] | undefined, signal: AbortSignal): Promise<ExecSyncAnswer> {
    const started = performance.now();
    let run: ShimRun;
    try {
      run = await this.#runThroughAgent(body, facts, parseGrpcTimeout(grpcTimeout), signal);
    } catch (err) {
      run = { kind: facts.kind, cause: 'other', answer: { kind: 'error', grpcCode: GrpcCode.INTERNAL, message: `probe-agent shim: ${(err as Error).message}` } };
    }
    const { answer } = run;
    if (answer.kind === 'error' && run.cause !== undefined) {
      this.stats.agentErrors++;
      this.metrics.agentError(run.cause);
      this.#warn(run.cause === 'agent_too_old' ? answer.message : 'rewritten handler not run', { containerId: facts.containerId.toString('utf8'), code: answer.grpcCode, error: answer.message });
    }
    this.metrics.intercepted(run.kind, answer.kind === 'error' ? 'error' : answer.exitCode === 0 ? 'success' : 'failure', (performance.now() - started) / 1000);
    return answer;
  }

  /**
   * Sends kubelet's request body to the agent's ExecSync unchanged. A probe gets its timeout plus
   * agentGraceMs, within kubelet's own deadline; a hook (kubelet sends exec hooks with timeout 0)
   * no deadline, and is sent again while the agent certainly has not started it (hook-runner.ts).
   * Which is which comes from cmd[1]: the agent refuses a kind whose timeout disagrees.
   */
  async #runThroughAgent(body: Buffer, facts: ExecSyncFacts, callerMs: number | undefined, signal: AbortSignal): Promise<ShimRun> {
    const kind = facts.kind;
    if (HOOK_KINDS.has(kind)) {
      const outcome = await runHookOnce(this.#agent, body, { agentWaitMs: this.config.hookAgentWaitMs, lastResortMs: this.config.hookLastResortMs }, signal);
      if (outcome.wait) this.metrics.hookWait(outcome.wait);
      if (outcome.error) return { kind, answer: answerFromCallError(outcome.error, `${kind} hook`), cause: causeOfCallError(outcome.error) };
      return { kind, answer: { kind: 'message', ...outcome.answer } };
    }
    const what = kind === 'unknown' ? 'rewritten handler' : `${kind} probe`;
    // No retry here: kubelet discards a probe's gRPC error (it never counts as a failure) and runs
    // the probe again at its next period, so an agent that is away costs a probe nothing; hooks,
    // whose failure kills a container, wait for the agent instead (runHookOnce).
    const deadlineMs = agentCallMs(facts.timeoutSeconds, this.config.agentGraceMs, callerMs, this.config.hookLastResortMs);
    try {
      const a = await this.#agent.execSync(body, { deadlineMs, signal });
      return { kind, answer: { kind: 'message', ...a } };
    } catch (err) {
      if (err instanceof AgentCallError) return { kind, answer: answerFromCallError(err, what), cause: causeOfCallError(err) };
      throw err;
    }
  }
}

/** One intercepted call's answer, its kind, and why the agent did not answer it (undefined: it did, or kubelet cancelled). */
interface ShimRun {
  kind: InterceptKind;
  answer: ExecSyncAnswer;
  cause?: AgentErrorCause | undefined;
}

/** Whether something accepts connections on a unix socket (a stale socket file refuses them). */
function socketAnswers(p: string): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect(p);
    const done = (v: boolean): void => {
      s.destroy();
      resolve(v);
    };
    s.once('connect', () => done(true));
    s.once('error', () => done(false));
    s.setTimeout(1000, () => done(false));
  });
}
