/**
 * A kubelet-shaped CRI client on kubelet's own gRPC library: `build/grpc-go-peer` (Go, grpc-go 1.33
 * from Debian, source in test/grpc-go-peer/) dialed as kubelet dials its runtime, one connection for
 * every call. Same shape as KubeletCri (grpc-js), so a test can run either: requests and answers
 * are encoded here with proto/cri/runtime_v1.proto and cross to the Go process as bytes.
 *
 * Why a second client: grpc-go sends BDP PINGs as DATA arrives (grpc-js and node:http2 do not),
 * and a grpc-go server such as containerd answers PINGs it did not earn with GOAWAY
 * ENHANCE_YOUR_CALM "too_many_pings". The peer counts every frame of that kind on its socket
 * (stats()), so a test can assert what happened to kubelet's connection, not only to its calls.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, statSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { createInterface } from 'node:readline';
import type * as grpc from '@grpc/grpc-js';
import { REPO } from './built-cli.ts';
import { KUBELET_RUNTIME_REQUEST_TIMEOUT_MS, RUNTIME_SERVICE, type CriAnswer } from './kubelet-cri.ts';

export const GRPC_GO_PEER = path.join(REPO, 'build/grpc-go-peer');
const PEER_SRC = path.join(REPO, 'test/grpc-go-peer');

/** What both kubelet-shaped clients (KubeletCri, GrpcGoCri) offer. */
export interface CriCaller {
  call<T = Record<string, any>>(method: string, req: object, deadlineMs?: number): Promise<CriAnswer<T>>;
  execSync(containerId: string, cmd: string[], timeoutSeconds: number): Promise<CriAnswer<{ stdout: Buffer; stderr: Buffer; exitCode: number }>>;
  close(): void | Promise<unknown>;
}

/** One GOAWAY frame the peer received. */
export interface PeerGoAway { conn: number; code: number; lastStreamId: number; debug: string }

/** Transport counts over the peer's life, read off its socket (test/grpc-go-peer/tap.go). */
export interface GrpcGoPeerStats {
  /** Connections grpc-go opened: more than 1 means it reconnected. */
  dials: number;
  dialErrors: number;
  connsClosed: number;
  goaways: PeerGoAway[];
  pingsSent: number;
  /** PINGs of grpc-go's BDP estimator (its fixed payload): the ones the runtime may punish. */
  bdpPingsSent: number;
  pingAcksReceived: number;
  pingsReceived: number;
  dataFramesReceived: number;
  dataOctetsReceived: number;
  settingsReceived: number;
  callsStarted: number;
  callsFinished: number;
}

/** Options of the peer. */
export interface GrpcGoCriOptions {
  /**
   * `path` (default): the socket path is the target and so the `:authority`, as kubelet < 1.31 dials;
   * `localhost`: WithAuthority("localhost") and cri-client's connect backoff, as kubelet 1.31+ dials.
   */
  authority?: 'path' | 'localhost';
  /** Log dials, GOAWAYs, closes, channel states and grpc-go's own log to the peer's stderr (see stderr()). */
  logTransport?: boolean;
}

type Pending = { resolve: (v: Line) => void; reject: (e: Error) => void };
interface Line { id?: number; ok?: boolean; responseBase64?: string; code?: number; message?: string; stats?: GrpcGoPeerStats; final?: GrpcGoPeerStats }

/** Throws unless the peer binary exists and is at least as new as every source file. */
export function requireGrpcGoPeer(): void {
  const hint = 'run `make grpc-go-peer` (or `make test-grpc-go`)';
  if (!existsSync(GRPC_GO_PEER)) throw new Error(`${path.relative(REPO, GRPC_GO_PEER)} is missing: ${hint}`);
  const built = statSync(GRPC_GO_PEER).mtimeMs;
  for (const f of readdirSync(PEER_SRC).filter((n) => n.endsWith('.go'))) {
    if (statSync(path.join(PEER_SRC, f)).mtimeMs > built) throw new Error(`${path.relative(REPO, GRPC_GO_PEER)} is older than test/grpc-go-peer/${f}: ${hint}`);
  }
}

/** One grpc-go ClientConn to a CRI endpoint, in its own process. */
export class GrpcGoCri implements CriCaller {
  readonly socketPath: string;
  readonly #proc: ChildProcess;
  readonly #pending = new Map<number, Pending>();
  readonly #ready: Promise<void>;
  #next = 1;
  #stderr = '';
  #final: Promise<GrpcGoPeerStats>;
  #exited: Error | undefined;

  constructor(socketPath: string, opts: GrpcGoCriOptions = {}) {
    requireGrpcGoPeer();
    this.socketPath = socketPath;
    const args = [`-socket=${socketPath}`, `-authority=${opts.authority ?? 'path'}`];
    if (opts.logTransport) args.push('-log-transport');
    this.#proc = spawn(GRPC_GO_PEER, args, { stdio: ['pipe', 'pipe', 'pipe'] });
    this.#proc.stdin!.on('error', () => {}); // EPIPE after an early exit: reported through the exit below
    this.#proc.stderr!.setEncoding('utf8');
    let onReady: () => void = () => {};
    this.#ready = new Promise<void>((resolve) => {
      onReady = resolve;
    });
    this.#proc.stderr!.on('data', (d: string) => {
      // Keep the head (startup) and a bounded tail: a long run with -log-transport writes a lot.
      this.#stderr = this.#stderr.length > 4 << 20 ? this.#stderr.slice(0, 1 << 20) + '\n…\n' + this.#stderr.slice(-(2 << 20)) + d : this.#stderr + d;
      if (this.#stderr.includes('grpc-go-peer ready')) onReady();
    });
    let onFinal: (s: GrpcGoPeerStats) => void = () => {};
    let onFinalErr: (e: Error) => void = () => {};
    this.#final = new Promise<GrpcGoPeerStats>((resolve, reject) => {
      onFinal = resolve;
      onFinalErr = reject;
    });
    this.#final.catch(() => {}); // observed by close() only
    createInterface({ input: this.#proc.stdout! }).on('line', (text) => {
      const line = JSON.parse(text) as Line;
      if (line.final) {
        onFinal(line.final);
        return;
      }
      const p = this.#pending.get(line.id!);
      if (!p) throw new Error(`grpc-go-peer answered unknown id ${line.id}: ${text.slice(0, 200)}`);
      this.#pending.delete(line.id!);
      p.resolve(line);
    });
    this.#proc.once('exit', (code, signal) => {
      this.#exited = new Error(`grpc-go-peer exited (${code ?? signal}) with ${this.#pending.size} calls pending: ${this.#stderr.slice(-2000)}`);
      for (const p of this.#pending.values()) p.reject(this.#exited);
      this.#pending.clear();
      onFinalErr(this.#exited);
      onReady();
    });
  }

  /** Resolves once the peer dialed (grpc-go dials lazily: the connection opens on the first call). */
  ready(): Promise<void> {
    return this.#ready;
  }

  #send(msg: Record<string, unknown>): Promise<Line> {
    if (this.#exited) return Promise.reject(this.#exited);
    const id = this.#next++;
    return new Promise<Line>((resolve, reject) => {
      this.#pending.set(id, { resolve, reject });
      this.#proc.stdin!.write(`${JSON.stringify({ id, ...msg })}\n`);
    });
  }

  /** Any unary RuntimeService call by method name; deadline Infinity = none (as kubelet's exec hooks). */
  async call<T = Record<string, any>>(method: string, req: object, deadlineMs = 10_000): Promise<CriAnswer<T>> {
    const def = RUNTIME_SERVICE[method];
    if (!def) throw new Error(`no ${method} in the CRI proto`);
    const body = def.requestSerialize(req);
    const a = await this.#send({ method: def.path, requestBase64: body.toString('base64'), timeoutMs: deadlineMs === Infinity ? 0 : Math.max(1, Math.round(deadlineMs)) });
    if (!a.ok) return { ok: false, code: a.code as grpc.status, details: a.message ?? '' };
    const raw = Buffer.from(a.responseBase64 ?? '', 'base64');
    return { ok: true, raw, msg: def.responseDeserialize(raw) as T };
  }

  /**
   * One unary call by its full path with the request's protobuf octets as they are (unknown
   * fields, methods this repo's CRI proto lacks); the answer's octets as they came.
   */
  async callRaw(methodPath: string, body: Buffer, deadlineMs = 10_000): Promise<{ ok: true; raw: Buffer } | { ok: false; code: number; details: string }> {
    const a = await this.#send({ method: methodPath, requestBase64: body.toString('base64'), timeoutMs: Math.max(1, Math.round(deadlineMs)) });
    if (!a.ok) return { ok: false, code: a.code ?? -1, details: a.message ?? '' };
    return { ok: true, raw: Buffer.from(a.responseBase64 ?? '', 'base64') };
  }

  /** ExecSync as kubelet makes it: timeout in the request; deadline 2 min + timeout, none for timeout 0. */
  execSync(containerId: string, cmd: string[], timeoutSeconds: number): Promise<CriAnswer<{ stdout: Buffer; stderr: Buffer; exitCode: number }>> {
    const deadline = timeoutSeconds === 0 ? Infinity : KUBELET_RUNTIME_REQUEST_TIMEOUT_MS + timeoutSeconds * 1000;
    return this.call('ExecSync', { containerId, cmd, timeout: timeoutSeconds }, deadline);
  }

  /** The transport counts so far. */
  async stats(): Promise<GrpcGoPeerStats> {
    const a = await this.#send({ control: 'stats' });
    return a.stats!;
  }

  /** Everything the peer wrote to stderr (head and tail when long). */
  stderr(): string {
    return this.#stderr;
  }

  /** Ends the peer: it finishes the calls in flight, closes its connection and reports its final counts. */
  async close(timeoutMs = 10_000): Promise<GrpcGoPeerStats | undefined> {
    if (this.#exited) return undefined;
    this.#proc.stdin!.end();
    const t = setTimeout(() => this.#proc.kill('SIGKILL'), timeoutMs);
    try {
      return await this.#final;
    } catch {
      return undefined;
    } finally {
      clearTimeout(t);
    }
  }
}

/** A kubelet-shaped client (grpc-go) relisting as kubelet's PLEG does, every 250 ms, until stopped. */
export interface Relist { stop(): Promise<void>; readonly calls: number; readonly failures: number }
export function relist(socket: string): Relist {
  const peer = new GrpcGoCri(socket);
  let stopped = false;
  const state = { calls: 0, failures: 0 };
  const loop = (async () => {
    while (!stopped) {
      for (const m of ['ListPodSandbox', 'ListContainers']) {
        const r = await peer.call(m, {});
        state.calls++;
        if (!r.ok) state.failures++;
      }
      await new Promise((r) => setTimeout(r, 250));
    }
  })();
  return {
    get calls() { return state.calls; },
    get failures() { return state.failures; },
    stop: async () => {
      stopped = true;
      await loop;
      await peer.close();
    },
  };
}
