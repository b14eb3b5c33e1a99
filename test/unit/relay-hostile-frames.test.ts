/**
 * Frame floods on both of the shim's sockets (issue 31 items 4 and 8), through the relay
 * (agent/shim/relay.ts) between scripted peers, and against the shim's client of the agent
 * (agent/http2/unary-client.ts):
 *  - a hostile kubelet: 60,000 empty DATA frames (527 KiB) on an undecided ExecSync, which once
 *    froze the shim for 20 s, end its connection at once; another kubelet connection's calls
 *    meanwhile are all answered;
 *  - padded one-octet DATA frames count against the ExecSync caps (frames and padding, not
 *    payload octets only): an undecided ExecSync goes to the runtime after 4 KiB of them, an
 *    intercepted one is refused RESOURCE_EXHAUSTED;
 *  - a hostile runtime flooding PINGs loses its connection; kubelet's call gets an answer, and the
 *    next kubelet connection's calls get a runtime connection of their own;
 *  - a hostile "agent" flooding SETTINGS fails the shim's call with the reason named.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import * as net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { describe, expect, it, onTestFailed } from 'vitest';
import { UnaryH2Client, UnaryH2Error } from '../../agent/http2/unary-client.ts';
import { encodeLiteralBlock } from '../../agent/http2/hpack.ts';
import { ERR, FL, T, encodeFrame } from '../support/h2-frame-peer.ts';
import { answered, autoAnswer, call, EXEC_SYNC, execSyncBody, exitAnswer, MARKER, RelayRig, requestHeaders, TestHost, VERSION, grpcMessage } from '../support/relay-harness.ts';

describe('relay: floods from kubelet', () => {
  it('60,000 empty DATA frames on an undecided ExecSync: GOAWAY ENHANCE_YOUR_CALM at once; a neighbour connection keeps every answer', async () => {
    const r = await RelayRig.start();
    onTestFailed(() => console.error(`frame trace (last lines):\n${r.trace.tail(60)}`));
    try {
      const neighbour = await r.client();
      const rt = await r.runtime();
      autoAnswer(rt);
      const k = await r.client();
      await r.runtime(2);
      autoAnswer(r.runtimes[1]!);
      const id = k.open(requestHeaders(EXEC_SYNC), false);
      const heap0 = process.memoryUsage().heapUsed;
      const t0 = performance.now();
      const batch = Buffer.concat(Array.from({ length: 1000 }, () => encodeFrame(T.DATA, 0, id)));
      let neighbourOk = 0;
      for (let i = 0; i < 60 && !k.closed; i++) {
        k.socket.write(batch);
        // The neighbour's calls go on at the same time.
        const n = call(neighbour, VERSION, grpcMessage(Buffer.alloc(3)));
        if ((await answered(neighbour, n, 10_000, 'the neighbour answered')).grpcStatus === '0') neighbourOk++;
      }
      await k.waitFor(() => k.goawayRecv !== undefined, 10_000, "the relay's GOAWAY");
      const ms = performance.now() - t0;
      console.log(`empty DATA flood: GOAWAY ${k.goawayRecv!.code} "${k.goawayRecv!.debug}" after ${ms.toFixed(0)} ms; heap +${((process.memoryUsage().heapUsed - heap0) / 2 ** 20).toFixed(1)} MiB; neighbour ${neighbourOk} ok`);
      expect(k.goawayRecv!.code).toBe(ERR.ENHANCE_YOUR_CALM);
      expect(k.goawayRecv!.debug).toMatch(/peer flooded frames without progress \(DATA \d+/);
      expect(neighbourOk).toBeGreaterThan(0);
      // Said to the host (the shim logs it).
      await k.waitFor(() => r.host.refusals.length > 0, 5000, 'the refusal reported');
      expect(r.host.refusals.map((e) => e.message)).toEqual([expect.stringMatching(/peer flooded frames without progress/)]);
      for (let i = 0; i < 5; i++) {
        const n = call(neighbour, VERSION, grpcMessage(Buffer.alloc(3)));
        expect((await answered(neighbour, n, 10_000, 'the neighbour answered')).grpcStatus).toBe('0');
      }
    } finally {
      await r.close();
    }
  }, 60_000);

  it('padded one-octet DATA frames: an undecided ExecSync goes to the runtime after 4 KiB of them, an intercepted one is refused', async () => {
    const r = await RelayRig.start({ host: (p) => new TestHost(p, () => exitAnswer(0, 'ok')) });
    onTestFailed(() => console.error(`frame trace (last lines):\n${r.trace.tail(60)}`));
    try {
      const k = await r.client();
      const rt = await r.runtime();
      autoAnswer(rt);
      // Undecided: a gRPC prefix of a message that never says whose it is, one octet per padded frame.
      const undecided = k.open(requestHeaders(EXEC_SYNC), false);
      for (let i = 0; i < 40; i++) k.sendRawFrame(T.DATA, FL.PADDED, undecided, Buffer.concat([Buffer.from([100, i < 5 ? [0, 0, 0, 0x40, 0][i]! : 0x08]), Buffer.alloc(100)]));
      await rt.waitFor(() => rt.streams.size === 1, 10_000, 'the undecided ExecSync at the runtime');
      // Intercepted: argv[0] is ours, then padded one-octet frames until the cost cap.
      const body = execSyncBody(MARKER, 2000);
      const ours = k.open(requestHeaders(EXEC_SYNC), false);
      k.sendRawFrame(T.DATA, 0, ours, body.subarray(0, 200));
      for (let i = 200; i < body.length; i++) k.sendRawFrame(T.DATA, FL.PADDED, ours, Buffer.concat([Buffer.from([100]), body.subarray(i, i + 1), Buffer.alloc(100)]));
      const res = await answered(k, ours, 10_000, 'the intercepted ExecSync answered');
      expect(res.grpcStatus).toBe('8');
      expect(decodeURIComponent(res.grpcMessage ?? '')).toMatch(/ExecSync request in frames costing more than \d+ octets/);
      expect(r.host.intercepts.length).toBe(0);
    } finally {
      await r.close();
    }
  }, 60_000);
});

describe('relay: a runtime flooding PINGs', () => {
  it('loses its connection (GOAWAY ENHANCE_YOUR_CALM); the call is answered; the next kubelet connection gets a runtime of its own', async () => {
    const r = await RelayRig.start();
    onTestFailed(() => console.error(`frame trace (last lines):\n${r.trace.tail(60)}`));
    try {
      const k = await r.client();
      const rt = await r.runtime();
      const id = call(k, VERSION, grpcMessage(Buffer.alloc(3)));
      await rt.waitFor(() => rt.streams.size === 1, 10_000, 'the call at the runtime');
      const ping = encodeFrame(T.PING, 0, 0, Buffer.alloc(8));
      const batch = Buffer.concat(Array.from({ length: 1000 }, () => ping));
      for (let i = 0; i < 50 && !rt.closed && rt.goawayRecv === undefined; i++) {
        rt.socket.write(batch);
        await new Promise((res) => setTimeout(res, 5));
      }
      await rt.waitFor(() => rt.goawayRecv !== undefined, 10_000, "the relay's GOAWAY to the runtime");
      expect(rt.goawayRecv!.code).toBe(ERR.ENHANCE_YOUR_CALM);
      expect(rt.goawayRecv!.debug).toMatch(/peer flooded frames without progress \(PING \d+/);
      const res = await answered(k, id, 10_000, "kubelet's call answered");
      expect(res.grpcStatus ?? String(res.rst)).not.toBe('0');
      const k2 = await r.client();
      const rt2 = await r.runtime(2);
      autoAnswer(rt2);
      const id2 = call(k2, VERSION, grpcMessage(Buffer.alloc(3)));
      expect((await answered(k2, id2, 10_000, 'the next connection answered')).grpcStatus).toBe('0');
    } finally {
      await r.close();
    }
  }, 60_000);
});

describe("the shim's client of the agent: an agent flooding SETTINGS", () => {
  it('fails the call with the reason named', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'hostile-agent-'));
    const sock = path.join(dir, 'agent.sock');
    const srv = net.createServer((s) => {
      s.on('error', () => {});
      s.once('data', () => {
        s.write(encodeFrame(T.SETTINGS, 0, 0));
        const batch = Buffer.concat(Array.from({ length: 1000 }, () => encodeFrame(T.SETTINGS, 0, 0)));
        const pump = (): void => {
          while (!s.destroyed && s.write(batch));
          if (!s.destroyed) s.once('drain', pump);
        };
        pump();
      });
    });
    await new Promise<void>((res) => srv.listen(sock, res));
    const client = new UnaryH2Client(sock, { maxResponseBytes: 1024 });
    try {
      const err = await new Promise<unknown>((resolve) => {
        client.call(encodeLiteralBlock(requestHeaders('/probeagent.v1alpha1.ProbeService/ExecSync')), grpcMessage(Buffer.alloc(3)), { done: () => resolve(undefined), fail: resolve });
      });
      expect(err).toBeInstanceOf(UnaryH2Error);
      expect((err as Error).message).toMatch(/protocol error from the server: peer flooded frames without progress \(SETTINGS \d+/);
    } finally {
      client.close();
      srv.close();
      rmSync(dir, { recursive: true, force: true });
    }
  }, 30_000);
});
