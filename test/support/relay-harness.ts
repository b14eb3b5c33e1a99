/**
 * The frame relay (agent/shim/relay.ts) between two scripted peers over real unix sockets:
 *  - a kubelet stand-in (FramePeer, client role) connecting to a listener whose connections are
 *    each given to `new FrameRelay(socket, host)`, the relay's public shape;
 *  - a containerd stand-in (FramePeer, server role) listening on host.runtimeSocket. It is a
 *    scripted raw frame peer, not containerd, because these tests need exact frame schedules
 *    (when credit comes back, when a PING or a GOAWAY is sent, when the connection is lost);
 *  - a RelayHost whose intercept() answers ExecSyncs whose argv[0] is probe-agent's marker from a
 *    small in-test function. The agent is not under test here: only what the relay does with the
 *    host's answers is.
 */
import * as net from 'node:net';
import { mkdtempSync, readdirSync, readlinkSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { FrameRelay, type RelayHost } from '../../agent/shim/relay.ts';
import type { ExecSyncAnswer } from '../../agent/shim/answer.ts';
import { encodeExecSyncResponse } from '../../agent/api/exec-sync.ts';
import { encodeFrame } from '../../agent/grpc/frame.ts';
import type { HeaderField } from '../../agent/http2/hpack.ts';
import { describeFrame, FramePeer, Trace, type CreditPolicy, type PeerStream } from './h2-frame-peer.ts';

/** argv[0] of every command probe-agent's rewrite writes (agent/contract/shim-command.ts). */
export const MARKER = '/.probe-agent/v1';
export const EXEC_SYNC = '/runtime.v1.RuntimeService/ExecSync';
export const LIST_CONTAINERS = '/runtime.v1.RuntimeService/ListContainers';
export const VERSION = '/runtime.v1.RuntimeService/Version';
/** The header every test request carries, naming its kubelet-side stream (for mapping runtime ids back). */
export const STREAM_TAG = 'x-test-stream';

/** The agent's answer with this exit code and stdout, as the shim relays it (an ExecSyncResponse, gRPC-framed). */
export function exitAnswer(exitCode: number, stdout: string): ExecSyncAnswer {
  return { kind: 'message', body: encodeFrame(encodeExecSyncResponse(exitCode, stdout)), exitCode };
}

/** gRPC request headers for `path`, plus extra fields. */
export function requestHeaders(p: string, extra: HeaderField[] = []): HeaderField[] {
  return [
    { name: ':method', value: 'POST' }, { name: ':scheme', value: 'http' }, { name: ':path', value: p },
    { name: ':authority', value: 'localhost' }, { name: 'content-type', value: 'application/grpc' }, { name: 'te', value: 'trailers' },
    ...extra,
  ];
}

/** A gRPC length-prefixed message. */
export function grpcMessage(msg: Buffer): Buffer {
  const h = Buffer.alloc(5);
  h.writeUInt32BE(msg.length, 1);
  return Buffer.concat([h, msg]);
}

function varint(n: number): number[] {
  const out: number[] = [];
  while (n >= 0x80) {
    out.push((n & 0x7f) | 0x80);
    n = Math.floor(n / 128);
  }
  out.push(n);
  return out;
}

function lengthDelimited(fieldNo: number, value: Buffer): Buffer {
  return Buffer.concat([Buffer.from([(fieldNo << 3) | 2, ...varint(value.length)]), value]);
}

/** ExecSyncRequest {container_id = 1, cmd = 2, timeout = 3} (k8s.io/cri-api runtime/v1). */
export function execSyncRequest(containerId: string, cmd: string[], timeout = 1): Buffer {
  return Buffer.concat([
    lengthDelimited(1, Buffer.from(containerId)),
    ...cmd.map((c) => lengthDelimited(2, Buffer.from(c))),
    Buffer.from([3 << 3, ...varint(timeout)]),
  ]);
}

/** An ExecSyncRequest's gRPC body of exactly `total` octets (the last argument pads it), with argv[0] = `argv0`. */
export function execSyncBody(argv0: string, total: number, containerId = 'c'.repeat(64)): Buffer {
  const base = grpcMessage(execSyncRequest(containerId, [argv0, 'x'], 1)).length;
  let pad = Math.max(1, total - base);
  // The length prefix of the pad argument grows with it: shrink until the total is exact.
  for (let i = 0; i < 4; i++) {
    const b = grpcMessage(execSyncRequest(containerId, [argv0, 'x'.repeat(pad)], 1));
    if (b.length === total) return b;
    pad -= b.length - total;
  }
  throw new Error(`cannot build an ExecSync body of ${total} octets`);
}

/** argv of an ExecSyncRequest gRPC body (5-octet prefix included), or [] when it does not parse. */
export function execArgv(body: Buffer): string[] {
  const argv: string[] = [];
  let p = 5;
  try {
    while (p < body.length) {
      const key = body[p++]!;
      const wire = key & 7;
      const fieldNo = key >> 3;
      if (wire === 0) {
        while (body[p++]! & 0x80);
      } else if (wire === 2) {
        let len = 0;
        let shift = 1;
        for (;;) {
          const b = body[p++]!;
          len += (b & 0x7f) * shift;
          shift *= 128;
          if (!(b & 0x80)) break;
        }
        if (fieldNo === 2) argv.push(body.subarray(p, p + len).toString());
        p += len;
      } else {
        return argv;
      }
    }
  } catch {
    return argv;
  }
  return argv;
}

/** One intercepted call as the host saw it. */
export interface InterceptCall {
  body: Buffer;
  fields: readonly HeaderField[];
  signal: AbortSignal;
  /** The STREAM_TAG header's value. */
  tag: string | undefined;
  resolve: (a: ExecSyncAnswer) => void;
  reject: (err: Error) => void;
  settled: boolean;
}

/**
 * The relay's host: intercept() takes ExecSyncs whose argv[0] is MARKER (and only those) and
 * answers them through `answer` ('defer': the test settles the call later through `intercepts`).
 */
export class TestHost implements RelayHost {
  readonly runtimeSocket: string;
  readonly intercepts: InterceptCall[] = [];
  readonly forwardedPaths: Array<string | undefined> = [];
  readonly runtimeErrors: Error[] = [];
  readonly refusals: Error[] = [];
  readonly authorities: Array<string | undefined> = [];
  answer: (call: InterceptCall) => ExecSyncAnswer | 'defer';
  onIntercept: ((call: InterceptCall) => void) | undefined;

  constructor(runtimeSocket: string, answer?: (call: InterceptCall) => ExecSyncAnswer | 'defer') {
    this.runtimeSocket = runtimeSocket;
    this.answer = answer ?? ((c) => exitAnswer(0, `ok ${c.tag ?? ''}`));
  }

  intercept(body: Buffer, fields: readonly HeaderField[], signal: AbortSignal): Promise<ExecSyncAnswer> | null {
    if (execArgv(body)[0] !== MARKER) return null;
    let resolve!: (a: ExecSyncAnswer) => void;
    let reject!: (err: Error) => void;
    const p = new Promise<ExecSyncAnswer>((res, rej) => {
      resolve = res;
      reject = rej;
    });
    const call: InterceptCall = {
      body, fields, signal, tag: fields.find((f) => f.name === STREAM_TAG)?.value, settled: false,
      resolve: (a) => {
        if (call.settled) return;
        call.settled = true;
        resolve(a);
      },
      reject: (e) => {
        if (call.settled) return;
        call.settled = true;
        reject(e);
      },
    };
    this.intercepts.push(call);
    this.onIntercept?.(call);
    const a = this.answer(call);
    if (a !== 'defer') queueMicrotask(() => call.resolve(a));
    return p;
  }

  forwarded(p: string | undefined): void {
    this.forwardedPaths.push(p);
  }

  runtimeError(err: Error): void {
    this.runtimeErrors.push(err);
  }

  refused(err: Error): void {
    this.refusals.push(err);
  }

  rewritingAuthority(authority: string | undefined): void {
    this.authorities.push(authority);
  }
}

export interface RuntimeOptions {
  settings?: ReadonlyArray<readonly [number, number]>;
  credit?: CreditPolicy;
}

/** A relay between a kubelet stand-in and a runtime stand-in, each test's own. */
export class RelayRig {
  readonly trace: Trace;
  readonly dir: string;
  readonly relayPath: string;
  readonly runtimePath: string;
  readonly host: TestHost;
  readonly relays: FrameRelay[] = [];
  /** The relay's side of each kubelet connection (the sockets given to FrameRelay). */
  readonly relaySockets: net.Socket[] = [];
  /** The runtime stand-in's connections (one per relay connection). */
  readonly runtimes: FramePeer[] = [];
  readonly clients: FramePeer[] = [];
  readonly #relayServer: net.Server;
  readonly #runtimeServer: net.Server;
  readonly #runtimeWaiters = new Set<() => boolean>();
  runtimeOptions: RuntimeOptions;
  /** Called for each new runtime connection (to script it). */
  onRuntime: ((p: FramePeer) => void) | undefined;

  private constructor(trace: Trace, runtime: RuntimeOptions, host?: (runtimePath: string) => TestHost) {
    this.trace = trace;
    this.dir = mkdtempSync(path.join(tmpdir(), 'relay-rig-'));
    this.relayPath = path.join(this.dir, 'relay.sock');
    this.runtimePath = path.join(this.dir, 'runtime.sock');
    this.host = host ? host(this.runtimePath) : new TestHost(this.runtimePath);
    this.runtimeOptions = runtime;
    this.#runtimeServer = net.createServer((sock) => {
      const p = new FramePeer(sock, {
        role: 'server', tag: 'RUNT', trace: this.trace,
        ...(this.runtimeOptions.settings ? { settings: this.runtimeOptions.settings } : {}),
        ...(this.runtimeOptions.credit ? { credit: this.runtimeOptions.credit } : {}),
      });
      this.runtimes.push(p);
      this.trace.log('RUNT connection accepted');
      this.onRuntime?.(p);
      for (const w of [...this.#runtimeWaiters]) w();
    });
    this.#relayServer = net.createServer((sock) => {
      this.relaySockets.push(sock);
      // The relay's side of the connection, as seen from outside (for the trace only).
      sock.on('end', () => this.trace.log('relay: kubelet socket got EOF'));
      sock.on('close', (hadError) => this.trace.log(`relay: kubelet socket closed${hadError ? ' (error)' : ''}`));
      sock.on('error', (err) => this.trace.log(`relay: kubelet socket error: ${err.message}`));
      const end = sock.end.bind(sock);
      let ended = false;
      sock.end = ((...args: Parameters<typeof sock.end>) => {
        this.trace.log('relay: kubelet socket end() called');
        ended = true;
        return end(...args);
      }) as typeof sock.end;
      const write = sock.write.bind(sock);
      sock.write = ((...args: Parameters<typeof sock.write>) => {
        const b = args[0];
        if (ended && Buffer.isBuffer(b)) this.trace.log(`relay: kubelet socket write() after end(): ${b.length} octets, first frame ${b.length >= 9 ? describeFrame(b[3]!, b[4]!, b.readUInt32BE(5) & 0x7fffffff, b.subarray(9, 9 + b.readUIntBE(0, 3))) : '?'}`);
        return write(...args);
      }) as typeof sock.write;
      this.relays.push(new FrameRelay(sock, this.host));
    });
  }

  static async start(opts: { trace?: Trace; runtime?: RuntimeOptions; host?: (runtimePath: string) => TestHost; noRuntime?: boolean } = {}): Promise<RelayRig> {
    const rig = new RelayRig(opts.trace ?? new Trace(), opts.runtime ?? {}, opts.host);
    if (!opts.noRuntime) await new Promise<void>((r) => rig.#runtimeServer.listen(rig.runtimePath, r));
    await new Promise<void>((r) => rig.#relayServer.listen(rig.relayPath, r));
    return rig;
  }

  /** A kubelet stand-in connected to the relay. */
  async client(settings: ReadonlyArray<readonly [number, number]> = [], credit: CreditPolicy = 'eager'): Promise<FramePeer> {
    const sock = net.connect(this.relayPath);
    await new Promise<void>((resolve, reject) => {
      sock.once('connect', resolve);
      sock.once('error', reject);
    });
    const p = new FramePeer(sock, { role: 'client', tag: 'KUBE', trace: this.trace, settings, credit });
    this.clients.push(p);
    return p;
  }

  /** Waits for the n-th runtime connection (1-based). */
  runtime(n = 1, ms = 5000): Promise<FramePeer> {
    return new Promise((resolve, reject) => {
      const check = (): boolean => {
        const p = this.runtimes[n - 1];
        if (!p) return false;
        clearTimeout(timer);
        this.#runtimeWaiters.delete(check);
        resolve(p);
        return true;
      };
      const timer = setTimeout(() => {
        this.#runtimeWaiters.delete(check);
        reject(new Error(`no runtime connection #${n} in ${ms} ms`));
      }, ms);
      if (!check()) this.#runtimeWaiters.add(check);
    });
  }

  /** Every violation either peer recorded. */
  violations(): string[] {
    return [...this.clients, ...this.runtimes].flatMap((p) => p.violations);
  }

  async close(): Promise<void> {
    for (const r of this.relays) r.destroy();
    for (const p of [...this.clients, ...this.runtimes]) p.close();
    await Promise.all([
      new Promise<void>((r) => this.#relayServer.close(() => r())),
      new Promise<void>((r) => (this.#runtimeServer.listening ? this.#runtimeServer.close(() => r()) : r())),
    ]);
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** The runtime stand-in's gRPC answer: headers, one message, trailers with grpc-status `status`. */
export function respond(rt: FramePeer, id: number, message: Buffer, status = 0, extra: HeaderField[] = []): void {
  rt.headers(id, [{ name: ':status', value: '200' }, { name: 'content-type', value: 'application/grpc' }, ...extra], false);
  rt.data(id, grpcMessage(message), false);
  rt.trailers(id, [{ name: 'grpc-status', value: String(status) }]);
}

/** The runtime stand-in's answer to every complete request: a message naming the request's STREAM_TAG and body length. */
export function autoAnswer(rt: FramePeer, size = 0): void {
  rt.onEnd = (s) => {
    if (s.sentEnd || s.sentRst !== undefined) return;
    const tag = tagOf(s) ?? '?';
    const msg = Buffer.alloc(Math.max(size, 64), 0x2e);
    msg.write(`answer ${tag} ${requestBodyLength(s)}`);
    respond(rt, s.id, msg);
  };
}

/** The STREAM_TAG of a stream's request (runtime side) or undefined. */
export function tagOf(s: PeerStream): string | undefined {
  return s.blocks[0]?.find((f) => f.name === STREAM_TAG)?.value;
}

export function requestBodyLength(s: PeerStream): number {
  return s.dataLength;
}

/** What a kubelet-side stream got: gRPC status, message, reset code; undefined fields when absent. */
export interface CallResult {
  status: string | undefined;
  grpcStatus: string | undefined;
  grpcMessage: string | undefined;
  body: Buffer;
  rst: number | undefined;
}

export function resultOf(s: PeerStream): CallResult {
  const fields = s.blocks.flat();
  return {
    status: fields.find((f) => f.name === ':status')?.value,
    grpcStatus: fields.find((f) => f.name === 'grpc-status')?.value,
    grpcMessage: fields.find((f) => f.name === 'grpc-message')?.value,
    body: Buffer.concat(s.data),
    rst: s.recvRst,
  };
}

/** Waits until a kubelet-side stream is answered (END_STREAM) or reset; its result. */
export async function answered(c: FramePeer, id: number, ms: number, what: string): Promise<CallResult> {
  const s = c.stream(id);
  await c.waitFor(() => s.recvEnd || s.recvRst !== undefined || c.closed, ms, what);
  return resultOf(s);
}

/** A call: HEADERS then the body (queued within windows) with END_STREAM; returns the stream id. */
export function call(c: FramePeer, p: string, body: Buffer, tag?: string): number {
  const id = c.nextStreamId;
  c.open(requestHeaders(p, [{ name: STREAM_TAG, value: tag ?? String(id) }]), false);
  c.data(id, body, true);
  return id;
}

/** Open socket file descriptors of this process (/proc/self/fd), for leak checks. */
export function socketFds(): number {
  let n = 0;
  for (const fd of readdirSync('/proc/self/fd')) {
    try {
      if (readlinkSync(`/proc/self/fd/${fd}`).startsWith('socket:')) n++;
    } catch {
      // closed meanwhile (readdir's own fd)
    }
  }
  return n;
}

/** Resolves when `check()` holds, polling every 10 ms (for state no event announces); rejects after `ms`. */
export async function until(check: () => boolean, ms: number, what: string): Promise<void> {
  const t0 = Date.now();
  while (!check()) {
    if (Date.now() - t0 > ms) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** Resolves when the signal is aborted; rejects after `ms`. */
export function aborted(signal: AbortSignal, ms: number, what: string): Promise<void> {
  if (signal.aborted) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
    signal.addEventListener('abort', () => {
      clearTimeout(timer);
      resolve();
    }, { once: true });
  });
}

/** A kubelet-side stream's outcome in words: "grpc-status 0", "reset 8", "refused by GOAWAY …", "connection closed …", "no answer". */
export function outcome(c: FramePeer, id: number): string {
  const s = c.stream(id);
  const r = resultOf(s);
  const goaway = c.goawayRecv ? ` after GOAWAY last=${c.goawayRecv.last} code=${c.goawayRecv.code}` : '';
  if (r.rst !== undefined) return `reset ${r.rst}`;
  if (s.recvEnd) return `grpc-status ${r.grpcStatus}${r.grpcStatus !== '0' ? ` (${r.grpcMessage})` : ''}`;
  if (c.goawayRecv && id > c.goawayRecv.last) return `refused by GOAWAY last=${c.goawayRecv.last} code=${c.goawayRecv.code}`;
  if (c.closed) return `connection closed (${c.closeReason})${goaway}`;
  return 'no answer';
}
