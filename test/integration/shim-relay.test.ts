/**
 * The shim's frame relay (agent/shim/relay.ts) against what a naive frame relay
 * gets wrong, on the lab's real containerd with the real agent: stream ids renumbered for a held
 * ExecSync forwarded after later streams opened, kubelet's HPACK dynamic table in use across
 * intercepted calls, connection flow control with the shim's own answers mixed into large runtime
 * answers, a long-lived server stream across intercepted calls, and containerd stopping while a
 * hook runs.
 *
 * The client is Node's HTTP/2 client (nghttp2's encoder, as grpc-js uses it): it indexes request
 * headers into its dynamic table, as kubelet's grpc-go does; the first test checks that it does.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'nsenter', 'containerd', 'ctr', 'dpkg-deb']);

import * as http2 from 'node:http2';
import * as net from 'node:net';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { encodeShimCommand } from '../../agent/contract/shim-command.ts';
import { CriShim } from '../../agent/shim/proxy.ts';
import { FrameSplitter, HeaderBlockJoiner, headerBlockFrames } from '../../agent/http2/connection.ts';
import { CLIENT_PREFACE, Flag, frameBytes, FrameType } from '../../agent/http2/wire.ts';
import { encodeLiteralBlock, HpackDecoder } from '../../agent/http2/hpack.ts';
import type { ContainerdLab, LabContainer, LabSandbox } from '../lab/containerd.ts';
import type { AgentHandle } from '../support/agent-harness.ts';
import { KubeletCri, RUNTIME_SERVICE } from '../support/kubelet-cri.ts';
import { shimLogSink } from '../support/log-check.ts';
import { ShimLab } from '../support/shim-lab.ts';

const NS = 'shim-relay';
const HTTP = 8080;
/** Containers with a large annotation each, so that one ListContainers answer is well over 64 KiB. */
const BIG_CONTAINERS = 8;
const ANNOTATION_BYTES = 14 * 1024;

let lab: ShimLab;
let ctrd: ContainerdLab;
let agent: AgentHandle;
let scratch: string;
let shim: CriShim;
let direct: KubeletCri;
let pod: LabSandbox;
let app: LabContainer;
const shimLog = shimLogSink('shim, frame relay (shim-relay)');

beforeAll(async () => {
  lab = await ShimLab.start('shim-relay-');
  ({ ctrd, scratch } = lab);
  const bigContainers = async (sb: LabSandbox): Promise<void> => {
    for (let i = 0; i < BIG_CONTAINERS; i++) {
      await ctrd.runContainer(sb, { name: `big${i}`, annotations: { 'example.com/padding': String(i).repeat(ANNOTATION_BYTES) } });
    }
  };
  let spec: Record<string, unknown>;
  ({ pod, app, spec } = await lab.appPod({ namespace: NS, server: { http: HTTP }, port: HTTP, beforeServer: bigContainers }));
  await lab.startKubelet([spec]);
  agent = await lab.startAgent();
  shim = await lab.startShim({ log: shimLog.log });
  direct = lab.client(new KubeletCri(ctrd.socket));
}, 120_000);

afterAll(() => lab?.stop());

/** One gRPC call's outcome on a raw HTTP/2 client stream. */
interface Outcome {
  grpcStatus: string | undefined;
  grpcMessage: string | undefined;
  body: Buffer;
}

function connect(socketPath: string): http2.ClientHttp2Session {
  const s = http2.connect('http://localhost', { createConnection: () => net.connect(socketPath) });
  s.on('error', () => {});
  return s;
}

function grpcBody(msg: Buffer): Buffer {
  const h = Buffer.alloc(5);
  h.writeUInt32BE(msg.length, 1);
  return Buffer.concat([h, msg]);
}

/** Opens a gRPC call; the request body is sent by the returned `send` (so a test can hold it back). */
function open(s: http2.ClientHttp2Session, method: string, extra: Record<string, string> = {}): { send: (req: object) => void; done: Promise<Outcome> } {
  const def = RUNTIME_SERVICE[method]!;
  const stream = s.request({ ':method': 'POST', ':path': def.path, 'content-type': 'application/grpc', te: 'trailers', ...extra }, { endStream: false });
  const chunks: Buffer[] = [];
  const done = new Promise<Outcome>((resolve, reject) => {
    let trailers: http2.IncomingHttpHeaders = {};
    let headers: http2.IncomingHttpHeaders = {};
    stream.on('response', (h) => {
      headers = h;
    });
    stream.on('trailers', (t) => {
      trailers = t;
    });
    stream.on('data', (c: Buffer) => chunks.push(c));
    stream.on('end', () => {
      const st = trailers['grpc-status'] ?? headers['grpc-status'];
      const m = trailers['grpc-message'] ?? headers['grpc-message'];
      resolve({ grpcStatus: st as string | undefined, grpcMessage: m as string | undefined, body: Buffer.concat(chunks) });
    });
    stream.on('error', reject);
    stream.on('close', () => {
      if (stream.rstCode && stream.rstCode !== http2.constants.NGHTTP2_NO_ERROR) reject(new Error(`${method}: stream reset with code ${stream.rstCode}`));
    });
  });
  return { send: (req) => stream.end(grpcBody(def.requestSerialize(req))), done };
}

function call(s: http2.ClientHttp2Session, method: string, req: object, extra: Record<string, string> = {}): Promise<Outcome> {
  const c = open(s, method, extra);
  c.send(req);
  return c.done;
}

function decode<T>(method: string, o: Outcome): T {
  expect(o.grpcStatus, `${method}: ${o.grpcMessage}`).toBe('0');
  return RUNTIME_SERVICE[method]!.responseDeserialize(o.body.subarray(5)) as T;
}

function probeCmd(): string[] {
  return encodeShimCommand('readiness', { httpGet: { path: '/healthz', port: HTTP } });
}

type Listed = { containers: { id: string; annotations: Record<string, string> }[] };

/** Intercepted ExecSyncs the shim has answered (its probe_agent_shim_intercepted_total, all labels). */
function interceptedAnswers(s: CriShim): number {
  let n = 0;
  for (const m of s.metrics.render().matchAll(/^probe_agent_shim_intercepted_total\{[^}]*\} (\d+)$/gm)) n += Number(m[1]);
  return n;
}

/** Polls `cond` every 20 ms; past `timeoutMs` fails naming what it waited for and where things stood. */
async function waitUntil(what: string, cond: () => boolean, timeoutMs: number, state: () => string): Promise<void> {
  const until = performance.now() + timeoutMs;
  while (!cond()) {
    if (performance.now() > until) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}: ${state()}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe('the frame relay on one kubelet connection', () => {
  it("the client's HPACK encoder indexes request headers (precondition: kubelet's grpc-go does too)", async () => {
    // A plain socket server that records the client's header blocks: the second identical request
    // must reference dynamic-table entries (indexed field, index > 61) that the first inserted.
    const blocks: Buffer[] = [];
    const sock = path.join(scratch, 'hpack-probe.sock');
    const srv = net.createServer((c) => {
      const reader = new FrameSplitter(true);
      const coll = new HeaderBlockJoiner(1 << 20);
      c.write(frameBytes(FrameType.SETTINGS, 0, 0, Buffer.alloc(0)));
      c.on('data', (d: Buffer) => {
        reader.push(d);
        for (let f = reader.next(); f; f = reader.next()) {
          if (f.type === FrameType.SETTINGS && !(f.flags & Flag.ACK)) c.write(frameBytes(FrameType.SETTINGS, Flag.ACK, 0, Buffer.alloc(0)));
          if (f.type === FrameType.HEADERS || f.type === FrameType.CONTINUATION) {
            const h = coll.take(f);
            if (h) blocks.push(h.block);
          }
        }
      });
      c.on('error', () => {});
    });
    await new Promise<void>((r) => srv.listen(sock, r));
    const s = connect(sock);
    for (let i = 0; i < 2; i++) s.request({ ':method': 'POST', ':path': '/runtime.v1.RuntimeService/Version', 'x-trace': 'same-value' }, { endStream: true }).on('error', () => {});
    for (let i = 0; i < 100 && blocks.length < 2; i++) await new Promise((r) => setTimeout(r, 20));
    s.destroy();
    srv.close();
    expect(blocks.length).toBe(2);
    expect(blocks[0]!.some((b) => (b & 0xc0) === 0x40)).toBe(true); // literal with incremental indexing
    expect([...blocks[1]!].some((b) => (b & 0x80) !== 0 && (b & 0x7f) > 61)).toBe(true); // indexed, dynamic table
  });

  it('a held ordinary ExecSync forwarded after later calls (renumbered), large ListContainers answers and intercepted probes interleaved', async () => {
    const s = connect(shim.config.listenPath);
    try {
      const before = { ...shim.stats };
      // Stream 1: an ordinary ExecSync whose request body is held back by the client.
      const held = open(s, 'ExecSync');
      await new Promise((r) => setTimeout(r, 50));
      // Later streams, concurrently: large answers (several DATA frames each, more than the
      // connection window together) mixed with the shim's own answers to intercepted probes.
      const lists = Array.from({ length: 4 }, () => call(s, 'ListContainers', {}));
      const probes = Array.from({ length: 8 }, () => call(s, 'ExecSync', { containerId: app.id, cmd: probeCmd(), timeout: 1 }));
      const version = call(s, 'Version', { version: 'v1' });
      const [listed, probed, v] = await Promise.all([Promise.all(lists), Promise.all(probes), version]);
      // Only now is stream 1's request complete: the runtime gets it on a higher stream id.
      held.send({ containerId: app.id, cmd: ['/bin/echo', 'renumbered'], timeout: 5 });
      const echo = decode<{ stdout: Buffer; exitCode: number }>('ExecSync', await held.done);
      expect(echo.stdout.toString()).toBe('renumbered\n');
      expect(echo.exitCode).toBe(0);

      const want = (await direct.call<Listed>('ListContainers', {}));
      expect(want.ok).toBe(true);
      if (!want.ok) return;
      expect(want.raw.length).toBeGreaterThan(100 * 1024);
      for (const o of listed) {
        expect(o.body.length).toBeGreaterThan(100 * 1024);
        const got = decode<Listed>('ListContainers', o);
        expect(got.containers.map((c) => c.id).sort()).toEqual(want.msg.containers.map((c) => c.id).sort());
        expect(got.containers.filter((c) => c.annotations['example.com/padding']?.length === ANNOTATION_BYTES).length).toBe(BIG_CONTAINERS);
      }
      for (const p of probed) expect(decode<{ exitCode: number }>('ExecSync', p).exitCode).toBe(0);
      expect(decode<{ runtimeName: string }>('Version', v).runtimeName).toBe('containerd');
      expect(shim.stats.intercepted - before.intercepted).toBe(8);
      expect(shim.stats.forwarded - before.forwarded).toBe(6);
    } finally {
      s.destroy();
    }
  });

  it("the shim's own answers stay within kubelet's connection window while large runtime answers fill it", async () => {
    // A hand-written client that grants streams 1 MiB each but the connection only 65,536 octets:
    // the runtime's ListContainers DATA fills that window to the octet, and answers the shim then
    // writes on its own must wait for the client's WINDOW_UPDATE (a relay that passes the client's
    // connection credit to the runtime, or writes its own DATA besides, overruns it). The window
    // is the initial 65,535 plus 1, four whole 16 KiB frames: with 65,535 the runtime's whole
    // frames stop at 49,152 and leave room for every answer, so an overrun could not show.
    // Each step waits (bounded) for what the case needs; the case is checked to have happened.
    const WINDOW = 4 * 16_384;
    const c = new RawClient(shim.config.listenPath, 1 << 20);
    try {
      await c.ready;
      c.grant(WINDOW - 65_535);
      const listIds = [0, 1, 2].map(() => c.request(RUNTIME_SERVICE['ListContainers']!.path, RUNTIME_SERVICE['ListContainers']!.requestSerialize({})));
      // The runtime fills the window: less is left than the 5-octet gRPC header any answer starts with.
      await waitUntil('the runtime to fill the connection window', () => c.connectionData > WINDOW - 5, 20_000, () => `${c.connectionData} of ${WINDOW} octets of DATA`);
      const answeredBefore = interceptedAnswers(shim);
      const probeIds = Array.from({ length: 6 }, () => c.request(RUNTIME_SERVICE['ExecSync']!.path, RUNTIME_SERVICE['ExecSync']!.requestSerialize({ containerId: app.id, cmd: probeCmd(), timeout: 1 })));
      // The shim has all six answers in hand (the agent ran the probes; the relay was given them)...
      await waitUntil('the shim to have its six answers', () => interceptedAnswers(shim) - answeredBefore === 6, 20_000, () => `${interceptedAnswers(shim) - answeredBefore} answered`);
      // ...and whatever it was going to write without new credit has reached the client.
      await c.quiet(250, 10_000);
      expect(c.connectionData, 'DATA octets before any further credit').toBeLessThanOrEqual(WINDOW);
      // The case happened: every ListContainers answer (over 100 KiB each) still waits for credit,
      // and so do the shim's answers (each has DATA, and no octet of window is left for it).
      expect(listIds.filter((id) => c.ended(id)), 'ListContainers answers ended before any credit').toEqual([]);
      expect(probeIds.filter((id) => c.ended(id)), 'answers ended with no window left for their DATA').toEqual([]);
      c.grant(64 << 20);
      await c.allEnded([...listIds, ...probeIds], 20_000);
      for (const id of listIds) expect((RUNTIME_SERVICE['ListContainers']!.responseDeserialize(c.body(id)) as Listed).containers.length).toBeGreaterThan(BIG_CONTAINERS);
      for (const id of probeIds) expect((RUNTIME_SERVICE['ExecSync']!.responseDeserialize(c.body(id)) as { exitCode: number }).exitCode).toBe(0);
      expect(c.goaway).toBeUndefined();
    } finally {
      c.close();
    }
  });

  it("kubelet's dynamic table stays in step: intercepted calls insert headers that later forwarded calls reference", async () => {
    const s = connect(shim.config.listenPath);
    try {
      for (let i = 0; i < 40; i++) {
        // A header first sent on an intercepted call (inserted into the client's table there), then
        // referenced by index from an ordinary call the runtime decodes.
        const extra = { 'x-call': `call-${i}`, 'x-round': `r${i % 5}` };
        const p = await call(s, 'ExecSync', { containerId: app.id, cmd: probeCmd(), timeout: 1 }, extra);
        expect(decode<{ exitCode: number }>('ExecSync', p).exitCode).toBe(0);
        const st = await call(s, 'ContainerStatus', { containerId: app.id }, extra);
        expect(decode<{ status: { id: string } }>('ContainerStatus', st).status.id).toBe(app.id);
      }
    } finally {
      s.destroy();
    }
  });

  it('a containerd event stream stays open across intercepted calls and carries the events of a container started meanwhile', async () => {
    const s = connect(shim.config.listenPath);
    try {
      const sub = s.request({ ':method': 'POST', ':path': '/containerd.services.events.v1.Events/Subscribe', 'content-type': 'application/grpc', te: 'trailers' }, { endStream: false });
      sub.on('error', () => {});
      sub.end(grpcBody(Buffer.alloc(0)));
      let seen = Buffer.alloc(0);
      sub.on('data', (c: Buffer) => {
        seen = Buffer.concat([seen, c]);
      });
      await new Promise((r) => setTimeout(r, 200));
      for (let i = 0; i < 5; i++) {
        const p = await call(s, 'ExecSync', { containerId: app.id, cmd: probeCmd(), timeout: 1 });
        expect(decode<{ exitCode: number }>('ExecSync', p).exitCode).toBe(0);
      }
      const late = await ctrd.runContainer(pod, { name: 'late' });
      // The container's id shows first (its /containers/create event); containerd publishes
      // /tasks/start a little later, after StartContainer has already returned: wait for both.
      // Lab containerd is shared with other suites: the start event must be this container's
      // (its envelope's topic, then the TaskStart message holding the container id).
      const startedLate = (): boolean => {
        for (let at = seen.indexOf('/tasks/start'); at >= 0; at = seen.indexOf('/tasks/start', at + 1)) {
          if (seen.subarray(at, at + 512).includes(late.id)) return true;
        }
        return false;
      };
      for (let i = 0; i < 100 && !startedLate(); i++) await new Promise((r) => setTimeout(r, 50));
      expect(startedLate(), "the late container's /tasks/start event through the open stream").toBe(true);
      const p = await call(s, 'ExecSync', { containerId: app.id, cmd: probeCmd(), timeout: 1 });
      expect(decode<{ exitCode: number }>('ExecSync', p).exitCode).toBe(0);
      sub.close(http2.constants.NGHTTP2_CANCEL);
      expect(decode<{ runtimeName: string }>('Version', await call(s, 'Version', { version: 'v1' })).runtimeName).toBe('containerd');
    } finally {
      s.destroy();
    }
  });
});

describe('close(graceMs) with the frame relay', () => {
  it('lets a hook in flight finish within the grace, then closes; a hook past the grace is cut', async () => {
    for (const [graceMs, slowMs, finishes] of [[20_000, 1500, true], [300, 5000, false]] as const) {
      const s2 = new CriShim({ listenPath: path.join(scratch, `cri-close-${graceMs}.sock`), runtimeSocket: ctrd.socket, probeSocket: agent.socket, log: shimLogSink(`shim closing with grace ${graceMs} ms (shim-relay)`).log });
      await s2.listen();
      const k = new KubeletCri(s2.config.listenPath);
      try {
        expect((await k.call('Version', { version: 'v1' })).ok).toBe(true);
        const hook = k.execSync(app.id, encodeShimCommand('preStop', { httpGet: { path: `/slow?ms=${slowMs}`, port: HTTP } }), 0);
        await new Promise((r) => setTimeout(r, 300));
        const t = performance.now();
        await s2.close(graceMs);
        const closedAfter = performance.now() - t;
        const done = await hook;
        if (finishes) {
          expect(done.ok && done.msg.exitCode, JSON.stringify(done)).toBe(0);
          expect(closedAfter).toBeGreaterThan(slowMs - 300 - 200);
        } else {
          expect(done.ok, JSON.stringify(done)).toBe(false);
        }
        // Closed: no new connection is accepted.
        const refused = await new Promise<boolean>((resolve) => {
          const c = net.connect(s2.config.listenPath);
          c.on('error', () => resolve(true));
          c.on('connect', () => {
            c.destroy();
            resolve(false);
          });
        });
        expect(refused).toBe(true);
      } finally {
        k.close();
      }
    }
  });
});

describe('containerd stopping while a hook runs', () => {
  it('the hook finishes with its own answer, the connection is sent GOAWAY, and calls work again once containerd is back', async () => {
    const k = new KubeletCri(shim.config.listenPath);
    try {
      expect((await k.call('Version', { version: 'v1' })).ok).toBe(true);
      const errorsBefore = shim.stats.runtimeErrors;
      shimLog.expect({ level: 'warn', msg: 'runtime unavailable', line: /"error":"connection (refused|closed)\b/, why: 'containerd is stopped on purpose while a hook runs' });
      const hook = k.execSync(app.id, encodeShimCommand('preStop', { httpGet: { path: '/slow?ms=3000', port: HTTP } }), 0);
      await new Promise((r) => setTimeout(r, 500));
      await ctrd.stopContainerd();
      const down = await k.call('Version', { version: 'v1' }, 5000);
      expect(down.ok).toBe(false);
      const done = await hook;
      expect(done.ok, JSON.stringify(done)).toBe(true);
      expect(done.ok && done.msg.exitCode).toBe(0);
      expect(shim.stats.runtimeErrors).toBeGreaterThan(errorsBefore);
      await ctrd.startContainerd();
      const up = await k.call('ContainerStatus', { containerId: app.id });
      expect(up.ok, JSON.stringify(up)).toBe(true);
    } finally {
      k.close();
    }
  });
});

/**
 * A minimal HTTP/2 gRPC client on a plain socket that controls its own connection window: it
 * advertises `streamWindow` per stream and never credits the connection until grant() is called.
 */
class RawClient {
  readonly ready: Promise<void>;
  connectionData = 0;
  goaway: number | undefined;
  /** When the last frame arrived (performance.now()). */
  lastFrameAt = performance.now();
  readonly #sock: net.Socket;
  readonly #reader = new FrameSplitter(false);
  readonly #blocks = new HeaderBlockJoiner(1 << 20);
  readonly #decoder = new HpackDecoder({ maxTableSize: 4096, maxHeaderListSize: 1 << 20 });
  readonly #data = new Map<number, Buffer[]>();
  readonly #ended = new Set<number>();
  readonly #status = new Map<number, string>();
  #next = 1;

  constructor(socketPath: string, streamWindow: number) {
    this.#sock = net.connect(socketPath);
    this.#sock.on('error', () => {});
    const settings = Buffer.alloc(6);
    settings.writeUInt16BE(4, 0);
    settings.writeUInt32BE(streamWindow, 2);
    this.ready = new Promise((resolve) => this.#sock.once('connect', () => {
      this.#sock.write(Buffer.concat([CLIENT_PREFACE, frameBytes(FrameType.SETTINGS, 0, 0, settings)]));
      resolve();
    }));
    this.#sock.on('data', (d: Buffer) => {
      this.#reader.push(d);
      for (let f = this.#reader.next(); f; f = this.#reader.next()) {
        this.lastFrameAt = performance.now();
        if (f.type === FrameType.SETTINGS && !(f.flags & Flag.ACK)) this.#sock.write(frameBytes(FrameType.SETTINGS, Flag.ACK, 0, Buffer.alloc(0)));
        else if (f.type === FrameType.PING && !(f.flags & Flag.ACK)) this.#sock.write(frameBytes(FrameType.PING, Flag.ACK, 0, f.payload));
        else if (f.type === FrameType.GOAWAY) this.goaway = f.payload.readUInt32BE(4);
        else if (f.type === FrameType.DATA) {
          this.connectionData += f.payload.length;
          const list = this.#data.get(f.streamId) ?? [];
          list.push(Buffer.from(f.payload));
          this.#data.set(f.streamId, list);
          if (f.flags & Flag.END_STREAM) this.#ended.add(f.streamId);
        } else if (f.type === FrameType.HEADERS || f.type === FrameType.CONTINUATION) {
          const h = this.#blocks.take(f);
          if (!h) continue;
          const st = this.#decoder.decode(h.block).find((x) => x.name === 'grpc-status');
          if (st) this.#status.set(h.streamId, st.value);
          if (h.endStream) this.#ended.add(h.streamId);
        } else if (f.type === FrameType.RST_STREAM) {
          this.#ended.add(f.streamId);
          this.#status.set(f.streamId, `reset ${f.payload.readUInt32BE(0)}`);
        }
      }
    });
  }

  /** Sends one unary gRPC request; returns its stream id. */
  request(path: string, msg: Buffer): number {
    const id = this.#next;
    this.#next += 2;
    const block = encodeLiteralBlock([
      { name: ':method', value: 'POST' }, { name: ':scheme', value: 'http' }, { name: ':path', value: path },
      { name: ':authority', value: 'localhost' }, { name: 'content-type', value: 'application/grpc' }, { name: 'te', value: 'trailers' },
    ]);
    const body = Buffer.alloc(5 + msg.length);
    body.writeUInt32BE(msg.length, 1);
    msg.copy(body, 5);
    this.#sock.write(Buffer.concat([headerBlockFrames(id, block, false, 16_384), frameBytes(FrameType.DATA, Flag.END_STREAM, id, body)]));
    return id;
  }

  /** Credits the connection window. */
  grant(n: number): void {
    const p = Buffer.alloc(4);
    p.writeUInt32BE(n, 0);
    this.#sock.write(frameBytes(FrameType.WINDOW_UPDATE, 0, 0, p));
  }

  /** Whether a stream has ended (END_STREAM or RST_STREAM). */
  ended(id: number): boolean {
    return this.#ended.has(id);
  }

  /** Resolves once no frame has arrived for `quietMs`; fails past `timeoutMs`. */
  async quiet(quietMs: number, timeoutMs: number): Promise<void> {
    await waitUntil(`${quietMs} ms without a frame`, () => performance.now() - this.lastFrameAt >= quietMs, timeoutMs, () => `last frame ${Math.round(performance.now() - this.lastFrameAt)} ms ago`);
  }

  async allEnded(ids: number[], timeoutMs: number): Promise<void> {
    for (let waited = 0; ids.some((id) => !this.#ended.has(id)); waited += 20) {
      if (waited > timeoutMs) throw new Error(`streams not ended: ${ids.filter((id) => !this.#ended.has(id)).join(', ')}`);
      await new Promise((r) => setTimeout(r, 20));
    }
    for (const id of ids) expect(this.#status.get(id), `stream ${id}`).toBe('0');
  }

  /** The one gRPC message a stream carried. */
  body(id: number): Buffer {
    return Buffer.concat(this.#data.get(id) ?? []).subarray(5);
  }

  close(): void {
    this.#sock.destroy();
  }
}
