/**
 * Frame floods on the shim's sockets (issue 31 items 1, 4 and 8), against the built shim started as
 * its systemd unit starts it (MemoryMax=256M in deploy/components/kubelet-shim/probe-agent-shim.service):
 *  - kubelet's side: empty CONTINUATIONs (they once grew the shim past 1.5 GB in 3 s), 60,000 empty
 *    DATA frames on an undecided ExecSync (they froze every connection for 20 s) and on an
 *    intercepted one (68 -> 296 MiB). (Padded frames: test/unit/relay-hostile-frames.test.ts.) A neighbour connection's calls meanwhile
 *    all go through to the runtime and back;
 *  - the runtime's side and the agent's side: a "runtime" that floods PINGs and an "agent" that
 *    floods SETTINGS; the shim cuts them, answers kubelet, and logs why.
 * Each time the shim's RSS stays well under its unit's 256M.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import * as http2 from 'node:http2';
import * as net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { encodeLiteralBlock } from '../../agent/http2/hpack.ts';
import { encodeShimCommand } from '../../agent/contract/shim-command.ts';
import { rssOf } from '../bench/procstat.ts';
import { shimUnitEnv, shimUnitNodeFlags } from '../soak/shim-soak.ts';
import { builtEntry } from '../support/built-cli.ts';
import { encodeFrame, FL, PREFACE, T } from '../support/h2-frame-peer.ts';
import { grpcRequestHeaders, rawUnary } from '../support/raw-h2.ts';
import { EXEC_SYNC, execSyncBody, execSyncRequest, grpcMessage, MARKER, VERSION } from '../support/relay-harness.ts';

/** The shim unit's MemoryMax. */
const UNIT_MEMORY_MB = 256;

let scratch: string;

interface Shim {
  child: ChildProcess;
  sock: string;
  log: () => string;
}

async function startShim(name: string, runtimeSock: string, agentSock: string): Promise<Shim> {
  const sock = path.join(scratch, `${name}.sock`);
  const child = spawn(process.execPath, [...shimUnitNodeFlags(), builtEntry('shim/main.js'), '--listen', `unix://${sock}`,
    '--runtime-endpoint', `unix://${runtimeSock}`, '--probe-socket', agentSock], { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, ...shimUnitEnv() } });
  let err = '';
  child.stderr!.on('data', (d: Buffer) => (err += d.toString()));
  await new Promise<void>((resolve, reject) => {
    const check = setInterval(() => {
      if (!err.includes('shim listening')) return;
      clearInterval(check);
      resolve();
    }, 20);
    child.once('exit', (c) => {
      clearInterval(check);
      reject(new Error(`shim exited (${c}): ${err}`));
    });
  });
  return { child, sock, log: () => err };
}

let healthyRuntime: http2.Http2Server;
let floodRuntime: net.Server;
let floodAgent: net.Server;
let shimA: Shim;
let shimB: Shim;

/** Whether whole frames in `b` include a HEADERS frame. */
function hasHeaders(b: Buffer): boolean {
  for (let at = 0; at + 9 <= b.length; at += 9 + b.readUIntBE(at, 3)) if (b[at + 3] === T.HEADERS) return true;
  return false;
}

/** A server that answers its peer's preface with SETTINGS, then floods `frame` as fast as it is read. */
function flooder(sockPath: string, frame: Buffer, afterRequest: boolean): Promise<net.Server> {
  const srv = net.createServer((s) => {
    s.on('error', () => {});
    let seen = Buffer.alloc(0);
    let started = false;
    s.on('data', (d: Buffer) => {
      if (started) return;
      seen = Buffer.concat([seen, d]);
      // The runtime flood waits for a request (a HEADERS frame) so the shim has a call in flight.
      if (afterRequest && !hasHeaders(seen.subarray(PREFACE.length))) return;
      started = true;
      s.write(encodeFrame(T.SETTINGS, 0, 0));
      const batch = Buffer.concat(Array.from({ length: 1000 }, () => frame));
      const pump = (): void => {
        while (!s.destroyed && s.write(batch));
        if (!s.destroyed) s.once('drain', pump);
      };
      pump();
    });
  });
  return new Promise((resolve) => srv.listen(sockPath, () => resolve(srv)));
}

beforeAll(async () => {
  scratch = mkdtempSync(path.join(tmpdir(), 'probe-agent-shim-flood-'));
  // A runtime that answers every call OK with an empty message.
  healthyRuntime = http2.createServer();
  healthyRuntime.on('stream', (stream) => {
    stream.on('error', () => {});
    stream.on('data', () => {});
    stream.on('end', () => {
      stream.respond({ ':status': 200, 'content-type': 'application/grpc' }, { waitForTrailers: true });
      stream.on('wantTrailers', () => stream.sendTrailers({ 'grpc-status': '0' }));
      stream.end(Buffer.from([0, 0, 0, 0, 0]));
    });
  });
  const healthySock = path.join(scratch, 'runtime.sock');
  await new Promise<void>((r) => healthyRuntime.listen(healthySock, r));
  floodRuntime = await flooder(path.join(scratch, 'flood-runtime.sock'), encodeFrame(T.PING, 0, 0, Buffer.alloc(8)), true);
  floodAgent = await flooder(path.join(scratch, 'flood-agent.sock'), encodeFrame(T.SETTINGS, 0, 0), false);
  shimA = await startShim('a', healthySock, path.join(scratch, 'no-agent.sock'));
  shimB = await startShim('b', path.join(scratch, 'flood-runtime.sock'), path.join(scratch, 'flood-agent.sock'));
}, 60_000);

afterAll(() => {
  shimA?.child.kill('SIGKILL');
  shimB?.child.kill('SIGKILL');
  healthyRuntime?.close();
  floodRuntime?.close();
  floodAgent?.close();
  if (scratch) rmSync(scratch, { recursive: true, force: true });
});

const execHeaders = encodeLiteralBlock(grpcRequestHeaders(EXEC_SYNC, 'localhost'));
/** ExecSyncRequest prefix whose argv[0] is the marker: intercepted once it is complete. */
const oursPrefix = execSyncBody(MARKER, 3000).subarray(0, 200);
/** A prefix that never says whose it is (a long container id still coming). */
const undecidedPrefix = grpcMessage(execSyncRequest('c'.repeat(5000), ['/bin/true'])).subarray(0, 40);

/** Kubelet-side attacks: the frames after the preface and SETTINGS. */
const ATTACKS: Record<string, (n: number) => Buffer[]> = {
  'empty CONTINUATIONs': (n) => [encodeFrame(T.HEADERS, 0, 1, execHeaders), ...Array.from({ length: n }, () => encodeFrame(T.CONTINUATION, 0, 1))],
  'empty DATA on an undecided ExecSync': (n) => [encodeFrame(T.HEADERS, FL.END_HEADERS, 1, execHeaders), encodeFrame(T.DATA, 0, 1, undecidedPrefix), ...Array.from({ length: n }, () => encodeFrame(T.DATA, 0, 1))],
  'empty DATA on an intercepted ExecSync': (n) => [encodeFrame(T.HEADERS, FL.END_HEADERS, 1, execHeaders), encodeFrame(T.DATA, 0, 1, oursPrefix), ...Array.from({ length: n }, () => encodeFrame(T.DATA, 0, 1))],
};

/** Sends `frames` to the shim in 1000-frame writes; resolves with what came back once the shim closed the connection (or 20 s). */
async function attack(sockPath: string, frames: Buffer[]): Promise<{ goaway: string; closed: boolean; sent: number }> {
  const s = net.connect(sockPath);
  await new Promise((r) => s.once('connect', r));
  let closed = false;
  let got = Buffer.alloc(0);
  s.on('data', (d: Buffer) => (got = Buffer.concat([got, d]).subarray(-65536)));
  s.on('close', () => (closed = true));
  s.on('error', () => {});
  s.write(Buffer.concat([PREFACE, encodeFrame(T.SETTINGS, 0, 0)]));
  let sent = 0;
  for (let i = 0; i < frames.length && !closed; i += 1000) {
    if (!s.write(Buffer.concat(frames.slice(i, i + 1000)))) await new Promise((r) => { s.once('drain', r); s.once('close', r); });
    sent = Math.min(frames.length, i + 1000);
  }
  const t0 = Date.now();
  while (!closed && Date.now() - t0 < 20_000) await new Promise((r) => setTimeout(r, 20));
  s.destroy();
  let goaway = '';
  const at = got.indexOf(Buffer.from([T.GOAWAY, 0, 0, 0, 0, 0]));
  if (at >= 3 && at + 14 <= got.length) goaway = `${got.readUInt32BE(at + 10)} ${got.subarray(at + 14, at + 6 + got.readUIntBE(at - 3, 3)).toString()}`;
  return { goaway, closed, sent };
}

describe("floods on the shim's kubelet socket end only that connection", () => {
  for (const [name, frames] of Object.entries(ATTACKS)) {
    it(`${name}: the connection is closed, a neighbour's calls all answered, RSS well under ${UNIT_MEMORY_MB} MB`, async () => {
      let done = false;
      let ok = 0;
      const bad: string[] = [];
      const neighbour = (async () => {
        while (!done) {
          try {
            const a = await rawUnary(shimA.sock, grpcRequestHeaders(VERSION, 'localhost'), Buffer.alloc(0), 20_000);
            if (a.trailers.find((f) => f.name === 'grpc-status')?.value === '0') ok++;
            else bad.push(JSON.stringify(a.trailers));
          } catch (err) {
            bad.push((err as Error).message);
          }
        }
      })();
      let peak = 0;
      const sampler = setInterval(() => (peak = Math.max(peak, rssOf(shimA.child.pid!).rssMB)), 50);
      try {
        const r = await attack(shimA.sock, frames(60_000));
        // A few more of the neighbour's calls after the attack, too.
        while (ok + bad.length < 5) await new Promise((res) => setTimeout(res, 20));
        done = true;
        await neighbour;
        peak = Math.max(peak, rssOf(shimA.child.pid!).rssMB);
        console.log(`${name}: ${r.sent} frames written, closed ${r.closed}, GOAWAY ${r.goaway || 'none'}; neighbour ${ok} ok, ${bad.length} bad; shim peak RSS ${peak.toFixed(1)} MB`);
        expect(r.closed, 'the shim closed the attacker\'s connection').toBe(true);
        expect(bad).toEqual([]);
        expect(ok).toBeGreaterThan(0);
        expect(peak).toBeLessThan(UNIT_MEMORY_MB / 2);
      } finally {
        done = true;
        clearInterval(sampler);
        await neighbour;
      }
    }, 90_000);
  }
});

describe("floods from the shim's runtime and agent", () => {
  it('a runtime flooding PINGs and an agent flooding SETTINGS are cut; kubelet gets answers; the log says why', async () => {
    let peak = 0;
    const sampler = setInterval(() => (peak = Math.max(peak, rssOf(shimB.child.pid!).rssMB)), 50);
    try {
      const forwarded = await rawUnary(shimB.sock, grpcRequestHeaders(VERSION, 'localhost'), Buffer.alloc(0), 20_000);
      const cmd = encodeShimCommand('readiness', { httpGet: { path: '/healthz', port: 8080, scheme: 'HTTP' } });
      const ours = await rawUnary(shimB.sock, grpcRequestHeaders(EXEC_SYNC, 'localhost'), execSyncRequest('c'.repeat(64), cmd, 1), 20_000);
      peak = Math.max(peak, rssOf(shimB.child.pid!).rssMB);
      const status = (a: typeof ours): string | undefined => [...a.headers, ...a.trailers].find((f) => f.name === 'grpc-status')?.value;
      console.log(`runtime/agent floods: forwarded call grpc-status ${status(forwarded)}, rewritten probe grpc-status ${status(ours)}; shim peak RSS ${peak.toFixed(1)} MB`);
      // Answered UNAVAILABLE (14), never hung.
      expect(status(forwarded)).toBe('14');
      expect(status(ours)).toBe('14');
      const log = shimB.log();
      expect(log).toMatch(/peer flooded frames without progress \(PING \d+/);
      expect(log).toMatch(/peer flooded frames without progress \(SETTINGS \d+/);
      expect(peak).toBeLessThan(UNIT_MEMORY_MB / 2);
    } finally {
      clearInterval(sampler);
    }
  }, 90_000);
});
