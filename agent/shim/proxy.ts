/**
 * The kubelet shim: a CRI proxy between kubelet and the container runtime. Every call is passed
 * through, never decoded: by default at the HTTP/2 frame level, one runtime connection per kubelet
 * connection (relay.ts, `relay: 'frames'`), or as node:http2 streams over one shared runtime
 * connection (`relay: 'streams'`, the previous design, kept as the fallback for one release). Only
 * ExecSync is buffered and read, and an ExecSync whose command is
 * probe-agent's (agent/rewrite/shim-command.ts) is answered from the agent's ProbeService over a
 * separate connection with its own deadlines, so a slow or dead agent costs kubelet nothing but
 * that one call. Kubelet's ordinary calls never wait on the agent.
 */
import * as http2 from 'node:http2';
import * as net from 'node:net';
import { chmodSync, existsSync, lstatSync, mkdirSync, unlinkSync } from 'node:fs';
import path from 'node:path';
import { decodeShimCommand, isShimCommand, ShimCommandError, type ShimKind } from '../rewrite/shim-command.ts';
import { encodeGrpcMessage, grpcFrame, readSingleGrpcFrame, WireError } from '../api/protowire.ts';
import { encodeLifecycleHandler, encodeProbeHandler, HandlerShapeError } from '../api/handler-wire.ts';
import { AgentCallError, GrpcCode, ShimProbeClient, WireHook, WireProbeType } from '../api/shim-client.ts';
import { answerFromBadCommand, answerFromCallError, answerFromResult, causeOfAnswer, causeOfCallError, kindTimeoutMismatch, type ExecSyncAnswer } from './answer.ts';
import { runHookOnce } from './hook-runner.ts';
import { ShimMetrics, type AgentErrorCause, type InterceptKind } from './metrics.ts';
import { parseGrpcTimeout } from './deadline.ts';
import { decodeExecSyncRequest, encodeExecSyncResponse, EXEC_SYNC_PATH, mayBeShimCommand, type ExecSyncRequest } from './exec-sync.ts';
import { H2_SETTINGS, UpstreamSession } from './upstream.ts';
import { handOff, type Handoff } from '../http2/handoff.ts';
import type { HeaderField } from '../http2/hpack.ts';
import { FrameRelay, MAX_BUFFERED_EXEC } from './relay.ts';

/** How kubelet's connections are carried: frame relay (default) or node:http2 streams (fallback). */
export type RelayMode = 'frames' | 'streams';
export const RELAY_MODES: readonly RelayMode[] = ['frames', 'streams'];

/** How the shim is configured. */
export interface ShimConfig {
  /** Socket kubelet connects to (containerRuntimeEndpoint). */
  listenPath: string;
  /** The real runtime's socket. */
  runtimeSocket: string;
  /** The agent's ProbeService socket. */
  probeSocket: string;
  /** Time the agent gets beyond a probe's own timeout before the shim gives up on it (queueing, helper). */
  agentGraceMs?: number;
  /**
   * Deprecated, no effect (kept so that old unit files still start): hooks are no longer cut by
   * the shim. Kubelet runs exec hooks with timeout 0 and ends them by cancelling the ExecSync
   * stream; the agent's own cap (1 h) is the last resort.
   */
  hookDeadlineMs?: number;
  /**
   * How long a hook waits for an agent that has not started it (down, starting, draining, or
   * refusing admission) before it fails; the hook then runs exactly once.
   */
  hookAgentWaitMs?: number;
  /** Local bound on one hook call to a hung agent (default: the agent's 1 h cap + 30 s). */
  hookLastResortMs?: number;
  /**
   * How kubelet's connections reach the runtime: 'frames' (default; HTTP/2 frames relayed, one
   * runtime connection per kubelet connection) or 'streams' (node:http2 server and client streams
   * over one shared runtime connection; the fallback, to be removed after one release).
   */
  relay?: RelayMode;
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

const DEFAULTS = { relay: 'frames' as RelayMode, agentGraceMs: 2000, hookDeadlineMs: 0, hookAgentWaitMs: 60_000, hookLastResortMs: 3_630_000 };

const PROBE_KINDS: Partial<Record<ShimKind, number>> = WireProbeType;
const HOOK_KINDS: Partial<Record<ShimKind, number>> = WireHook;

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
  readonly #runtime: UpstreamSession;
  readonly #agent: ShimProbeClient;
  readonly #log: ShimLog;
  /** Serves the HTTP/2 connections handOff gives it; never listens itself. */
  readonly #server: http2.Http2Server;
  /** Accepts kubelet's connections on the shim socket. */
  readonly #listener: net.Server;
  /** Connections not yet handed to #server (waiting for their first request). */
  readonly #handoffs = new Set<Handoff>();
  readonly #sessions = new Set<http2.ServerHttp2Session>();
  /** Frame relays of kubelet connections (relay 'frames'). */
  readonly #relays = new Set<FrameRelay>();
  readonly #warned = new Map<string, { at: number; suppressed: number }>();

  constructor(config: ShimConfig) {
    const { log, metrics, ...rest } = config;
    this.config = { ...DEFAULTS, ...rest } as Required<Omit<ShimConfig, 'log' | 'metrics'>>;
    this.#log = log ?? stderrLog;
    this.metrics = metrics ?? new ShimMetrics();
    this.#runtime = new UpstreamSession(this.config.runtimeSocket);
    this.#agent = new ShimProbeClient(this.config.probeSocket);
    this.#server = http2.createServer({ settings: H2_SETTINGS, maxSessionMemory: 64 });
    this.#server.on('session', (s) => {
      this.#sessions.add(s);
      s.on('close', () => this.#sessions.delete(s));
      s.on('error', () => {});
    });
    this.#server.on('stream', (stream, headers) => this.#onStream(stream, headers));
    if (!RELAY_MODES.includes(this.config.relay)) throw new Error(`relay ${JSON.stringify(this.config.relay)}: want one of ${RELAY_MODES.join(', ')}`);
    this.#listener = net.createServer((socket) => (this.config.relay === 'frames' ? this.#relay(socket) : this.#accept(socket)));
  }

  /** Carries a kubelet connection frame by frame to its own runtime connection (relay.ts). */
  #relay(socket: net.Socket): void {
    let authorityLogged = false;
    const relay = new FrameRelay(socket, {
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
      refused: (err) => this.#warn('closing a connection that is not HTTP/2 the shim can carry', { error: err.message }),
      rewritingAuthority: (authority) => {
        if (authorityLogged) return;
        authorityLogged = true;
        this.#log('info', 'client :authority refused by HTTP/2, rewriting it on this connection', { authority: authority ?? null, substitute: 'localhost' });
      },
    });
    this.#relays.add(relay);
    relay.onClose(() => this.#relays.delete(relay));
  }

  /** A complete ExecSync body from the frame relay: the shim's answer, or null to forward it. */
  #intercept(body: Buffer, fields: readonly HeaderField[], signal: AbortSignal): Promise<ExecSyncAnswer> | null {
    const req = readExecSync(body);
    if (req === null || !isShimCommand(req.cmd)) return null;
    this.stats.intercepted++;
    const timeout = fields.find((f) => f.name === 'grpc-timeout')?.value;
    return this.#answerFor(req, timeout, signal);
  }

  /**
   * Hands a new connection to the HTTP/2 server: natively when its requests' :authority passes
   * nghttp2's check, else through the authority rewrite (kubelet before 1.31 sends the socket path).
   */
  #accept(socket: net.Socket): void {
    const h = handOff(socket, this.#server, {
      carried: (how, authority) => {
        this.#handoffs.delete(h);
        if (how === 'rewritten') this.#log('info', 'client :authority refused by HTTP/2, rewriting it on this connection', { authority: authority ?? null, substitute: 'localhost' });
      },
      refused: (err) => {
        this.#handoffs.delete(h);
        this.#warn('closing a connection that is not HTTP/2 the shim can carry', { error: err.message });
      },
    });
    this.#handoffs.add(h);
    socket.once('close', () => this.#handoffs.delete(h));
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
    for (const h of this.#handoffs) h.cancel();
    for (const s of this.#sessions) s.close();
    for (const r of this.#relays) r.drain();
    const timer = setTimeout(() => {
      for (const s of this.#sessions) s.destroy();
      for (const r of this.#relays) r.destroy();
    }, graceMs);
    await closed;
    clearTimeout(timer);
    this.#runtime.close();
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

  #onStream(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders): void {
    stream.on('error', () => {});
    if (headers[':path'] === EXEC_SYNC_PATH) this.#bufferExecSync(stream, headers);
    else this.#forward(stream, headers, null);
  }

  /**
   * Passes one call through to the runtime. `body` is what was already read from kubelet (a
   * buffered ExecSync), or null to pipe kubelet's stream as it comes.
   */
  #forward(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders, body: Buffer | null): void {
    this.stats.forwarded++;
    this.metrics.forwarded(headers[':path'] as string | undefined);
    let up: http2.ClientHttp2Stream;
    try {
      up = this.#runtime.get().request(headers, { endStream: false });
    } catch (err) {
      this.#runtimeUnavailable(stream, err as Error);
      return;
    }
    let trailers: http2.OutgoingHttpHeaders | undefined;
    up.on('response', (h) => {
      if (stream.destroyed || stream.closed || stream.headersSent) return;
      // A trailers-only answer (a gRPC error) ends the stream in its headers.
      guarded(() => stream.respond(h, h['grpc-status'] !== undefined ? { endStream: true } : { waitForTrailers: true }));
    });
    up.on('trailers', (t) => {
      trailers = t;
    });
    stream.on('wantTrailers', () => {
      guarded(() => stream.sendTrailers(trailers ?? { 'grpc-status': String(GrpcCode.UNAVAILABLE), 'grpc-message': 'probe-agent shim: runtime closed the stream without a status' }));
    });
    up.on('data', (chunk: Buffer) => {
      if (!stream.destroyed && !stream.closed && !stream.write(chunk)) {
        up.pause();
        stream.once('drain', () => up.resume());
      }
    });
    up.on('end', () => {
      if (!stream.destroyed && stream.headersSent && !stream.writableEnded) stream.end();
    });
    up.on('error', (err) => {
      this.#runtimeUnavailable(stream, err);
    });
    up.on('close', () => {
      // The runtime reset the stream: reset kubelet's with the same code.
      if (!stream.destroyed && !stream.closed && !stream.writableEnded && up.rstCode !== undefined && up.rstCode !== http2.constants.NGHTTP2_NO_ERROR) {
        if (stream.headersSent) guarded(() => stream.close(up.rstCode));
        else this.#runtimeUnavailable(stream, new Error(`runtime reset the stream (code ${up.rstCode})`));
      }
    });
    stream.on('close', () => {
      // Kubelet cancelled (e.g. a GetContainerEvents watch ends): tell the runtime.
      if (!up.closed) guarded(() => up.close(http2.constants.NGHTTP2_CANCEL));
    });
    if (body !== null) {
      up.end(body);
    } else {
      stream.on('data', (chunk: Buffer) => {
        if (!up.write(chunk)) {
          stream.pause();
          up.once('drain', () => stream.resume());
        }
      });
      stream.on('end', () => up.end());
    }
  }

  #runtimeUnavailable(stream: http2.ServerHttp2Stream, err: Error): void {
    this.stats.runtimeErrors++;
    this.metrics.runtimeError();
    if (stream.destroyed || stream.closed) return;
    if (stream.headersSent) {
      guarded(() => stream.close(http2.constants.NGHTTP2_INTERNAL_ERROR));
      return;
    }
    this.#warn('runtime unavailable', { runtime: this.config.runtimeSocket, error: err.message });
    respondError(stream, GrpcCode.UNAVAILABLE, `probe-agent shim: runtime ${this.config.runtimeSocket} unavailable: ${err.message}`);
  }

  /** Reads a whole ExecSync request, then answers it or forwards it unchanged. */
  #bufferExecSync(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders): void {
    const chunks: Buffer[] = [];
    let size = 0;
    let streaming = false;
    const onData = (chunk: Buffer): void => {
      size += chunk.length;
      chunks.push(chunk);
      if (size > MAX_BUFFERED_EXEC) {
        // Too big to be ours: hand what we have and the rest to the runtime.
        streaming = true;
        stream.off('data', onData);
        stream.off('end', onEnd);
        stream.pause();
        const first = Buffer.concat(chunks);
        this.#forwardPrefixed(stream, headers, first);
      }
    };
    const onEnd = (): void => {
      if (streaming) return;
      const body = Buffer.concat(chunks, size);
      const req = readExecSync(body);
      if (req === null || !isShimCommand(req.cmd)) {
        this.#forward(stream, headers, body);
        return;
      }
      this.stats.intercepted++;
      void this.#answerShimCommand(stream, headers, req);
    };
    stream.on('data', onData);
    stream.on('end', onEnd);
  }

  #forwardPrefixed(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders, first: Buffer): void {
    // Re-inject the buffered prefix, then pipe the rest as usual.
    stream.unshift(first);
    this.#forward(stream, headers, null);
    stream.resume();
  }

  async #answerShimCommand(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders, req: ExecSyncRequest): Promise<void> {
    // Kubelet cancelling the ExecSync (RST_STREAM; a preStop at the end of the grace period) or
    // going away cancels the agent call, and the agent aborts the hook or probe it runs.
    const cancel = new AbortController();
    let answered = false;
    const onClose = (): void => {
      if (!answered) cancel.abort();
    };
    stream.once('close', onClose);
    const answer = await this.#answerFor(req, headers['grpc-timeout'], cancel.signal);
    answered = true;
    stream.off('close', onClose);
    if (stream.destroyed || stream.closed || stream.headersSent) return;
    if (answer.kind === 'error') respondError(stream, answer.grpcCode, answer.message);
    else respondExecSync(stream, answer.exitCode, answer.stdout);
  }

  /** Runs an intercepted ExecSync through the agent and counts it; never throws. */
  async #answerFor(req: ExecSyncRequest, grpcTimeout: string | string[] | undefined, signal: AbortSignal): Promise<ExecSyncAnswer> {
    const started = performance.now();
    let run: ShimRun;
    try {
      run = await this.#runThroughAgent(req, parseGrpcTimeout(grpcTimeout), signal);
    } catch (err) {
      run = { kind: 'unknown', cause: 'other', answer: { kind: 'error', grpcCode: GrpcCode.INTERNAL, message: `probe-agent shim: ${(err as Error).message}` } };
    }
    const { answer } = run;
    if (answer.kind === 'error' && run.cause !== undefined) {
      this.stats.agentErrors++;
      this.metrics.agentError(run.cause);
      this.#warn('rewritten handler not run', { containerId: req.containerId, code: answer.grpcCode, error: answer.message });
    }
    this.metrics.intercepted(run.kind, answer.kind === 'error' ? 'error' : answer.exitCode === 0 ? 'success' : 'failure', (performance.now() - started) / 1000);
    return answer;
  }

  async #runThroughAgent(req: ExecSyncRequest, callerMs: number | undefined, signal: AbortSignal): Promise<ShimRun> {
    let cmd;
    let handler: Buffer;
    try {
      cmd = decodeShimCommand(req.cmd);
      if (cmd === null) throw new ShimCommandError('not a probe-agent command');
      if (req.containerId === '') throw new ShimCommandError('ExecSync without a container_id');
      handler = cmd.kind in PROBE_KINDS ? encodeProbeHandler(cmd.handler) : encodeLifecycleHandler(cmd.handler);
    } catch (err) {
      if (err instanceof ShimCommandError || err instanceof HandlerShapeError) return { kind: 'unknown', cause: 'bad_command', answer: answerFromBadCommand(err) };
      throw err;
    }
    const kind: InterceptKind = cmd.kind;
    // Kubelet sends probes with timeout >= 1 and exec hooks with timeout 0: anything else is not
    // kubelet's own call for this kind (a probe posing as an hour-long hook, for one).
    const mismatch = kindTimeoutMismatch(cmd.kind, PROBE_KINDS[cmd.kind] !== undefined, req.timeoutSeconds);
    if (mismatch) return { kind, cause: 'bad_command', answer: mismatch };
    const probeType = PROBE_KINDS[cmd.kind];
    if (probeType !== undefined) {
      const cap = (ms: number): number => (callerMs === undefined ? ms : Math.max(1, Math.min(ms, callerMs - 50)));
      const timeoutSeconds = req.timeoutSeconds;
      const what = `${cmd.kind} probe`;
      try {
        const a = await this.#agent.probe({ containerId: req.containerId, handler, timeoutSeconds, probeType }, cap(timeoutSeconds * 1000 + this.config.agentGraceMs), signal);
        const answer = answerFromResult(a, what);
        return { kind, answer, cause: causeOfAnswer(answer) };
      } catch (err) {
        if (err instanceof AgentCallError) return { kind, answer: answerFromCallError(err, what), cause: causeOfCallError(err) };
        throw err;
      }
    }
    const what = `${cmd.kind} hook`;
    const outcome = await runHookOnce(
      this.#agent,
      { containerId: req.containerId, handler, hook: HOOK_KINDS[cmd.kind] as number, timeoutSeconds: 0 },
      { agentWaitMs: this.config.hookAgentWaitMs, lastResortMs: this.config.hookLastResortMs },
      signal,
    );
    if (outcome.wait) this.metrics.hookWait(outcome.wait);
    if (outcome.error) return { kind, answer: answerFromCallError(outcome.error, what), cause: causeOfCallError(outcome.error) };
    const answer = answerFromResult(outcome.answer, what);
    return { kind, answer, cause: causeOfAnswer(answer) };
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

/** Decodes a buffered ExecSync body; null when it is not one uncompressed, well-formed message we can read. */
function readExecSync(body: Buffer): ExecSyncRequest | null {
  const msg = readSingleGrpcFrame(body);
  if (msg === null || !mayBeShimCommand(msg)) return null;
  try {
    return decodeExecSyncRequest(msg);
  } catch (err) {
    if (err instanceof WireError) return null;
    throw err;
  }
}

/** Runs an HTTP/2 stream operation that may race with the peer closing the stream; such a race is not an error. */
function guarded(op: () => void): void {
  try {
    op();
  } catch {
    // the stream closed meanwhile (ERR_HTTP2_INVALID_STREAM and friends): nothing left to tell
  }
}

function respondError(stream: http2.ServerHttp2Stream, code: number, message: string): void {
  if (stream.destroyed || stream.closed || stream.headersSent) return;
  guarded(() => stream.respond({
    ':status': 200,
    'content-type': 'application/grpc',
    'grpc-status': String(code),
    'grpc-message': encodeGrpcMessage(message.slice(0, 1024)),
  }, { endStream: true }));
}

function respondExecSync(stream: http2.ServerHttp2Stream, exitCode: number, stdout: string): void {
  guarded(() => {
    stream.respond({ ':status': 200, 'content-type': 'application/grpc' }, { waitForTrailers: true });
    stream.once('wantTrailers', () => guarded(() => stream.sendTrailers({ 'grpc-status': '0' })));
    stream.end(grpcFrame(encodeExecSyncResponse(exitCode, stdout)));
  });
}
