/**
 * Issue 24's main bug: connection-level frames end at each hop of the frame relay.
 *
 * Kubelet's grpc-go sends BDP PINGs as it receives DATA; the relay passed them to containerd, whose
 * grpc-go server counts a PING after no DATA of its own as a strike and closes the connection
 * (GOAWAY ENHANCE_YOUR_CALM "too_many_pings") after two: 1,413 CRI calls failed in 4 minutes on a
 * real node. PING, SETTINGS, WINDOW_UPDATE on stream 0 and GOAWAY belong to one connection: the
 * relay answers and sends its own on each side, and never forwards the other side's.
 *
 * Each side's frames carry a tag the other side must never see: PING payloads begin with "KUBE" or
 * "RUNT", SETTINGS carry an unknown identifier (0xf00d, which a receiver ignores) whose value begins
 * with 'K' or 'R', WINDOW_UPDATE(0) increments are odd values no relay computes, GOAWAY debug data
 * names its sender. The runtime is a scripted frame peer (a stand-in for containerd, which cannot be
 * made to send a PING or a GOAWAY on cue).
 */
import { describe, expect, it, onTestFailed } from 'vitest';
import { ERR, T, parseSettings, type FramePeer, type RecvFrame } from '../support/h2-frame-peer.ts';
import { answered, autoAnswer, call, grpcMessage, LIST_CONTAINERS, RelayRig } from '../support/relay-harness.ts';

const TAG_SETTING = 0xf00d;
const K_SETTING = 0x4b000001;
const R_SETTING = 0x52000001;
const K_INCREMENT = 4_949_001;
const R_INCREMENT = 5_395_001;

async function rig(): Promise<{ r: RelayRig; k: FramePeer; rt: FramePeer }> {
  const r = await RelayRig.start();
  onTestFailed(() => console.error(`frame trace (last lines):\n${r.trace.tail(80)}`));
  const k = await r.client();
  const rt = await r.runtime();
  autoAnswer(rt);
  return { r, k, rt };
}

/** A forwarded call answered: everything either side sent before it has been through the relay. */
async function roundTrip(k: FramePeer, tag: string): Promise<void> {
  const id = call(k, LIST_CONTAINERS, grpcMessage(Buffer.alloc(0)), tag);
  expect((await answered(k, id, 3000, `the forwarded call ${tag}`)).grpcStatus).toBe('0');
}

function pings(frames: RecvFrame[], prefix: string): string[] {
  return frames.filter((f) => f.type === T.PING && f.payload.subarray(0, 4).toString('latin1') === prefix).map((f) => `PING${f.flags & 1 ? ' ACK' : ''} ${f.payload.toString('hex')}`);
}

describe('relay: connection-level frames end at each hop (issue 24)', () => {
  it("kubelet's PING is answered by the relay and never reaches the runtime; the runtime's never reaches kubelet", async () => {
    const { r, k, rt } = await rig();
    try {
      expect(await k.ping(2000)).toBe(true);
      expect(await rt.ping(2000)).toBe(true);
      await roundTrip(k, 'after-pings');
      // grpc-go's BDP estimator: a PING with every read of DATA. None of them may reach the runtime.
      for (let i = 0; i < 5; i++) expect(await k.ping(2000)).toBe(true);
      await roundTrip(k, 'after-bdp-pings');
      expect.soft(pings(rt.frames, 'KUBE'), "kubelet's PINGs (or ACKs of them) at the runtime").toEqual([]);
      expect.soft(pings(k.frames, 'RUNT'), "the runtime's PINGs (or ACKs of them) at kubelet").toEqual([]);
      expect(r.violations()).toEqual([]);
    } finally {
      await r.close();
    }
  });

  it("each side's SETTINGS are ACKed by the relay and never reach the other side", async () => {
    const { r, k, rt } = await rig();
    try {
      k.settings([[TAG_SETTING, K_SETTING]]);
      rt.settings([[TAG_SETTING, R_SETTING]]);
      await k.waitFor(() => k.settingsAcked >= 2, 2000, "the ACK of kubelet's second SETTINGS");
      await rt.waitFor(() => rt.settingsAcked >= 2, 2000, "the ACK of the runtime's second SETTINGS");
      await roundTrip(k, 'after-settings');
      expect(await k.ping(2000)).toBe(true);
      expect(await rt.ping(2000)).toBe(true);
      const seen = (p: FramePeer, v: number): boolean => p.frames.some((f) => f.type === T.SETTINGS && parseSettings(f.payload).some(([id, x]) => id === TAG_SETTING && x === v));
      expect.soft(seen(rt, K_SETTING), "kubelet's SETTINGS at the runtime").toBe(false);
      expect.soft(seen(k, R_SETTING), "the runtime's SETTINGS at kubelet").toBe(false);
      // Each side got exactly as many SETTINGS ACKs as it sent SETTINGS (a forwarded ACK would be one too many).
      expect(r.violations()).toEqual([]);
    } finally {
      await r.close();
    }
  });

  it('WINDOW_UPDATE on stream 0 never crosses the relay', async () => {
    const { r, k, rt } = await rig();
    try {
      k.windowUpdate(0, K_INCREMENT);
      rt.windowUpdate(0, R_INCREMENT);
      await roundTrip(k, 'after-window-updates');
      expect(await k.ping(2000)).toBe(true);
      expect(await rt.ping(2000)).toBe(true);
      const seen = (p: FramePeer, v: number): boolean => p.frames.some((f) => f.type === T.WINDOW_UPDATE && f.streamId === 0 && (f.payload.readUInt32BE(0) & 0x7fffffff) === v);
      expect.soft(seen(rt, K_INCREMENT), "kubelet's WINDOW_UPDATE(0) at the runtime").toBe(false);
      expect.soft(seen(k, R_INCREMENT), "the runtime's WINDOW_UPDATE(0) at kubelet").toBe(false);
      expect(r.violations()).toEqual([]);
    } finally {
      await r.close();
    }
  });

  it("GOAWAY ends at the hop: neither side sees the other's GOAWAY frame", async () => {
    const { r, k, rt } = await rig();
    try {
      await roundTrip(k, 'before-goaway');
      k.goaway(0, ERR.NO_ERROR, 'KUBE-GOAWAY');
      // The relay has read kubelet's GOAWAY once it answers a later PING; whatever it sent the
      // runtime before answering the runtime's PING has arrived once that is ACKed.
      await k.ping(2000);
      await rt.ping(2000);
      rt.goaway(rt.lastPeerStream, ERR.NO_ERROR, 'RUNT-GOAWAY');
      await rt.ping(2000).catch(() => false);
      await k.ping(2000).catch(() => false);
      const debug = (p: FramePeer): string[] => p.frames.filter((f) => f.type === T.GOAWAY).map((f) => f.payload.subarray(8).toString('latin1'));
      expect.soft(debug(rt), 'GOAWAY debug data the runtime saw').not.toContain('KUBE-GOAWAY');
      expect.soft(debug(k), 'GOAWAY debug data kubelet saw').not.toContain('RUNT-GOAWAY');
      expect(r.violations()).toEqual([]);
    } finally {
      await r.close();
    }
  });
});
