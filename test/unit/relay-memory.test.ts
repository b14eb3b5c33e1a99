/**
 * What the frame relay holds for one connection is bounded, whatever windows the two ends grant
 * each other (issue 24: "memory bounded"; the randomized schedule test checks the same bound, this
 * test makes sure its worst case is always run).
 *
 * Each side grants the other large stream windows (8 MiB) and then does not take what it is sent:
 * the runtime stops reading its socket while kubelet uploads 6 MiB on each of two calls; kubelet
 * gives no connection credit while the runtime answers 6 MiB on each of two calls. What the relay
 * holds (sent by one side, not yet received by the other, less what sits in the sender's own socket
 * buffer) must stay under 4 MiB. The runtime is a scripted frame peer (a stand-in for containerd).
 */
import { describe, expect, it, onTestFailed } from 'vitest';
import { SET } from '../support/h2-frame-peer.ts';
import { call, grpcMessage, RelayRig, respond, tagOf, until, VERSION } from '../support/relay-harness.ts';

const BOUND = 4 << 20;
const BIG = 6 << 20;

describe('relay: octets held for one connection are bounded', () => {
  it('kubelet uploads 2 x 6 MiB to a runtime that granted 8 MiB windows and stopped reading: the relay holds < 4 MiB', async () => {
    const r = await RelayRig.start({ runtime: { settings: [[SET.INITIAL_WINDOW_SIZE, 8 << 20]] } });
    onTestFailed(() => console.error(`frame trace (last lines):\n${r.trace.tail(60)}`));
    try {
      const k = await r.client();
      const rt = await r.runtime();
      rt.windowUpdate(0, 64 << 20);
      expect(await rt.ping(3000)).toBe(true);
      expect(await k.ping(3000)).toBe(true);
      rt.socket.pause();
      const ids = [call(k, VERSION, grpcMessage(Buffer.alloc(BIG - 5, 1)), 'up1'), call(k, VERSION, grpcMessage(Buffer.alloc(BIG - 5, 2)), 'up2')];
      let held = 0;
      const measure = (): number => {
        const sent = ids.reduce((n, id) => n + k.stream(id).sentData, 0) - k.socket.writableLength;
        const got = [...rt.streams.values()].reduce((n, s) => n + s.dataLength, 0);
        held = Math.max(held, sent - got);
        return sent - got;
      };
      // Until kubelet cannot send more: everything sent, or out of credit with the rest queued.
      await until(() => {
        measure();
        return k.queued === 0 || k.sendWindow <= 0 || ids.every((id) => k.sendWindowOf(id) <= 0);
      }, 10_000, 'kubelet to be held back or done');
      // Whatever the relay still takes from kubelet's socket buffer.
      await until(() => {
        measure();
        return k.socket.writableLength === 0;
      }, 3000, "kubelet's socket buffer to drain").catch(() => undefined);
      measure();
      r.trace.log(`TEST most held kubelet->runtime: ${held}`);
      expect(held, 'octets from kubelet the relay held while the runtime read nothing').toBeLessThan(BOUND);
      // Then everything arrives once the runtime reads again.
      rt.socket.resume();
      await rt.waitFor(() => [...rt.streams.values()].filter((s) => s.recvEnd).length === 2, 10_000, 'both uploads at the runtime');
      expect([...rt.streams.values()].map((s) => s.dataLength)).toEqual([BIG, BIG]);
      expect(r.violations()).toEqual([]);
    } finally {
      await r.close();
    }
  }, 40_000);

  it('the runtime answers 2 x 6 MiB to a kubelet that granted 8 MiB stream windows but no connection credit: the relay holds < 4 MiB', async () => {
    const r = await RelayRig.start();
    onTestFailed(() => console.error(`frame trace (last lines):\n${r.trace.tail(60)}`));
    try {
      const k = await r.client([[SET.INITIAL_WINDOW_SIZE, 8 << 20]], 'manual');
      const rt = await r.runtime();
      rt.windowUpdate(0, 64 << 20);
      rt.onEnd = (s) => respond(rt, s.id, Buffer.alloc(BIG - 5, tagOf(s) === 'down1' ? 1 : 2));
      await k.waitFor(() => k.settingsAcked >= 1, 3000, "the ACK of kubelet's SETTINGS");
      const ids = [call(k, VERSION, grpcMessage(Buffer.alloc(10)), 'down1'), call(k, VERSION, grpcMessage(Buffer.alloc(10)), 'down2')];
      let held = 0;
      const measure = (): number => {
        const sent = [...rt.streams.values()].reduce((n, s) => n + s.sentData, 0) - rt.socket.writableLength;
        const got = ids.reduce((n, id) => n + k.stream(id).dataLength, 0);
        held = Math.max(held, sent - got);
        return sent - got;
      };
      await rt.waitFor(() => [...rt.streams.values()].filter((s) => s.recvEnd).length === 2, 3000, 'both calls at the runtime');
      // Until the runtime cannot send more (out of credit with the rest queued) or has sent all.
      await until(() => {
        measure();
        return rt.queued === 0 || rt.sendWindow <= 0;
      }, 10_000, 'the runtime to be held back or done');
      await until(() => {
        measure();
        return rt.socket.writableLength === 0;
      }, 3000, "the runtime's socket buffer to drain").catch(() => undefined);
      measure();
      r.trace.log(`TEST most held runtime->kubelet: ${held}`);
      expect(held, 'octets from the runtime the relay held while kubelet gave no connection credit').toBeLessThan(BOUND);
      k.credit = 'eager';
      k.returnCredit();
      await k.waitFor(() => ids.every((id) => k.stream(id).recvEnd), 10_000, 'both answers at kubelet');
      expect(ids.map((id) => k.stream(id).dataLength)).toEqual([BIG, BIG]);
      expect(r.violations()).toEqual([]);
    } finally {
      await r.close();
    }
  }, 40_000);
});
