/**
 * Issue 24, "Also in the relay" item 4: four smaller defects of the frame relay, each with a test
 * that fails on the relay of 2721411.
 *
 * The runtime is a scripted frame peer (a stand-in for containerd: these need exact schedules,
 * such as an answer that crosses kubelet's reset); intercepted ExecSyncs are answered by an
 * in-test host (the agent is not under test).
 */
import { describe, expect, it, onTestFailed } from 'vitest';
import { ERR, FL, SET, T, type FramePeer, type PeerStream, type RecvFrame } from '../support/h2-frame-peer.ts';
import {
  answered, autoAnswer, call, outcome, EXEC_SYNC, execSyncBody, exitAnswer, grpcMessage, LIST_CONTAINERS, RelayRig, requestHeaders, respond, STREAM_TAG, tagOf, until, VERSION,
} from '../support/relay-harness.ts';

async function rig(settings: ReadonlyArray<readonly [number, number]> = [], credit: 'eager' | 'manual' = 'eager'): Promise<{ r: RelayRig; k: FramePeer; rt: FramePeer }> {
  const r = await RelayRig.start();
  onTestFailed(() => console.error(`frame trace (last lines):\n${r.trace.tail(100)}`));
  const k = await r.client(settings, credit);
  const rt = await r.runtime();
  return { r, k, rt };
}

function byTag(rt: FramePeer, tag: string): PeerStream | undefined {
  return [...rt.streams.values()].find((s) => tagOf(s) === tag);
}

function trailersOnly(rt: FramePeer, id: number, status: number): void {
  rt.headers(id, [{ name: ':status', value: '200' }, { name: 'content-type', value: 'application/grpc' }, { name: 'grpc-status', value: String(status) }], true);
}

describe('relay: smaller defects (issue 24 item 4)', () => {
  it('reset streams the runtime then ended leave nothing behind: after 1,100 of them a late answer and a new call still work', async () => {
    const { r, k, rt } = await rig();
    try {
      // The runtime answers each "r…" stream as kubelet's reset reaches it: on the wire its answer
      // crosses the reset (the relay cannot tell it from one sent just before the reset arrived).
      rt.onFrame = (f) => {
        if (f.type !== T.RST_STREAM) return;
        const s = rt.streams.get(f.streamId)!;
        if (tagOf(s)?.startsWith('r') && !s.sentEnd) trailersOnly(rt, s.id, 1);
      };
      rt.onEnd = (s) => {
        if (tagOf(s)?.startsWith('after')) respond(rt, s.id, Buffer.from(`answer ${tagOf(s)}`));
      };
      // One stream reset by kubelet whose answer the runtime sends only much later.
      const late = call(k, VERSION, grpcMessage(Buffer.alloc(0)), 'late');
      await rt.waitFor(() => byTag(rt, 'late')?.recvEnd === true, 3000, "the late call's request at the runtime");
      k.rst(late, ERR.CANCEL);
      await rt.waitFor(() => byTag(rt, 'late')?.recvRst !== undefined, 3000, "kubelet's reset of the late call at the runtime");

      for (let batch = 0; batch < 11; batch++) {
        const ids: number[] = [];
        for (let i = 0; i < 100; i++) ids.push(call(k, VERSION, grpcMessage(Buffer.alloc(0)), `r${batch * 100 + i}`));
        await rt.waitFor(() => ids.every((_, i) => byTag(rt, `r${batch * 100 + i}`)?.recvEnd === true), 5000, `batch ${batch} at the runtime`);
        for (const id of ids) k.rst(id, ERR.CANCEL);
        await rt.waitFor(() => ids.every((_, i) => byTag(rt, `r${batch * 100 + i}`)?.sentEnd === true), 5000, `batch ${batch} reset and ended`);
      }
      // The late answer (a header block kubelet's HPACK state may depend on), then a new call.
      trailersOnly(rt, byTag(rt, 'late')!.id, 1);
      await rt.ping(3000).catch(() => false);
      const after = call(k, LIST_CONTAINERS, grpcMessage(Buffer.alloc(0)), 'after');
      const a = await answered(k, after, 3000, 'a forwarded call after 1,100 reset streams and the late answer');
      expect(outcome(k, after), 'a forwarded call after 1,100 reset streams and the late answer').toBe('grpc-status 0');
      expect(a.body.toString('latin1')).toContain('answer after');
      // The runtime's frames after its own peer's reset are this schedule's doing: only kubelet's side is checked.
      expect(k.violations).toEqual([]);
    } finally {
      await r.close();
    }
  }, 30_000);

  it("PRIORITY's stream dependency never names a kubelet stream id on the runtime side", async () => {
    const { r, k, rt } = await rig();
    try {
      rt.onEnd = (s) => {
        if (tagOf(s) === 'barrier') respond(rt, s.id, Buffer.from('answer barrier'));
      };
      // Stream 1 is intercepted (never at the runtime), so kubelet's and the runtime's ids differ.
      const ours = call(k, EXEC_SYNC, execSyncBody('/.probe-agent/v1', 300), 'ours');
      expect((await answered(k, ours, 3000, 'the intercepted call')).grpcStatus).toBe('0');
      const s3 = call(k, VERSION, grpcMessage(Buffer.alloc(0)), 's3');
      const s5 = call(k, VERSION, grpcMessage(Buffer.alloc(0)), 's5');
      await rt.waitFor(() => byTag(rt, 's3') !== undefined && byTag(rt, 's5') !== undefined, 3000, 's3 and s5 at the runtime');
      const rid3 = byTag(rt, 's3')!.id;
      const rid5 = byTag(rt, 's5')!.id;
      expect(rid3).not.toBe(s3);
      k.priority(s5, s3, 200, false);
      k.priority(s3, ours, 100, true);
      const s7 = k.nextStreamId;
      k.open(requestHeaders(VERSION, [{ name: STREAM_TAG, value: 's7' }]), false, { dep: s5, weight: 50, exclusive: false });
      k.data(s7, grpcMessage(Buffer.alloc(0)), true);
      // Everything kubelet sent before the barrier call has reached the runtime once it is answered.
      const barrier = call(k, LIST_CONTAINERS, grpcMessage(Buffer.alloc(0)), 'barrier');
      expect((await answered(k, barrier, 3000, 'the barrier call')).grpcStatus).toBe('0');
      const rid7 = byTag(rt, 's7')?.id;
      const ridOf = new Map<number, string>([[rid3, 's3'], [rid5, 's5'], ...(rid7 !== undefined ? [[rid7, 's7'] as [number, string]] : [])]);
      // What each kubelet dependency may become on the runtime side: its runtime id, or none (0).
      const allowed = new Map<number, number[]>([[rid5, [0, rid3]], [rid3, [0]], ...(rid7 !== undefined ? [[rid7, [0, rid5]] as [number, number[]]] : [])]);
      const bad: string[] = [];
      const check = (f: RecvFrame, dep: number): void => {
        const ok = allowed.get(f.streamId);
        if (ok === undefined) bad.push(`${f.type === T.PRIORITY ? 'PRIORITY' : 'HEADERS'} on runtime stream ${f.streamId}, which is none of s3/s5/s7`);
        else if (!ok.includes(dep)) bad.push(`${f.type === T.PRIORITY ? 'PRIORITY' : 'HEADERS'} on runtime stream ${f.streamId} (${ridOf.get(f.streamId)}) depends on ${dep}; allowed ${ok.join(' or ')}`);
      };
      for (const f of rt.frames) {
        if (f.type === T.PRIORITY) check(f, f.payload.readUInt32BE(0) & 0x7fffffff);
        if (f.type === T.HEADERS && f.flags & FL.PRIORITY) {
          const off = f.flags & FL.PADDED ? 1 : 0;
          check(f, f.payload.readUInt32BE(off) & 0x7fffffff);
        }
      }
      expect(bad).toEqual([]);
      for (const tag of ['s3', 's5', 's7']) {
        const s = byTag(rt, tag);
        if (s) respond(rt, s.id, Buffer.from(`answer ${tag}`));
      }
      for (const id of [s3, s5, s7]) expect((await answered(k, id, 3000, `stream ${id}`)).grpcStatus).toBe('0');
      expect(r.violations()).toEqual([]);
    } finally {
      await r.close();
    }
  });

  it('no frame is sent on an intercepted stream after kubelet reset it', async () => {
    // Kubelet's stream window of 100 octets holds back a 10,000-octet answer; kubelet resets the stream.
    const { r, k, rt } = await rig([[SET.INITIAL_WINDOW_SIZE, 100]], 'manual');
    r.host.answer = (c) => (c.tag === 'big' ? 'defer' : exitAnswer(0, `ok ${c.tag}`));
    try {
      autoAnswer(rt);
      await k.waitFor(() => k.settingsAcked >= 1, 3000, "the relay's ACK of kubelet's SETTINGS");
      const big = call(k, EXEC_SYNC, execSyncBody('/.probe-agent/v1', 300), 'big');
      await until(() => r.host.intercepts.some((c) => c.tag === 'big'), 3000, 'the big call at the host');
      r.host.intercepts.find((c) => c.tag === 'big')!.resolve(exitAnswer(0, 'x'.repeat(10_000)));
      await k.waitFor(() => k.stream(big).blocks.length >= 1, 3000, "the big answer's HEADERS");
      const before = k.stream(big).frames.length;
      k.rst(big, ERR.CANCEL);
      // Once a PING sent after the reset is answered and a later call is answered, the relay has read the reset.
      expect(await k.ping(3000)).toBe(true);
      const small = call(k, EXEC_SYNC, execSyncBody('/.probe-agent/v1', 300), 'small');
      await answered(k, small, 3000, 'an intercepted call after the reset');
      expect(outcome(k, small)).toBe('grpc-status 0');
      expect(await k.ping(3000)).toBe(true);
      // What may still arrive after the reset: DATA the relay sent before reading it, within the
      // stream's 100 octets. Never the rest of the answer, never its trailers.
      const afterReset = k.stream(big).frames.slice(before);
      const show = (f: RecvFrame): string => `${f.type === T.DATA ? 'DATA' : f.type === T.HEADERS ? 'HEADERS' : `type ${f.type}`} len=${f.payload.length}${f.flags & FL.END_STREAM ? ' END_STREAM' : ''}`;
      expect.soft(afterReset.filter((f) => f.type !== T.DATA).map(show), 'frames other than DATA on the intercepted stream after kubelet reset it').toEqual([]);
      expect.soft(k.stream(big).recvUsed, 'DATA octets on the intercepted stream (its window is 100)').toBeLessThanOrEqual(100);
      expect(k.violations).toEqual([]);
    } finally {
      await r.close();
    }
  });

  it("an intercepted answer waiting for its stream's window does not hold back other streams' frames", async () => {
    const { r, k, rt } = await rig([[SET.INITIAL_WINDOW_SIZE, 100]], 'manual');
    r.host.answer = (c) => (c.tag === 'big' ? 'defer' : exitAnswer(0, `ok ${c.tag}`));
    try {
      rt.onEnd = (s) => respond(rt, s.id, Buffer.alloc(5000, 0x61));
      await k.waitFor(() => k.settingsAcked >= 1, 3000, "the relay's ACK of kubelet's SETTINGS");
      const big = call(k, EXEC_SYNC, execSyncBody('/.probe-agent/v1', 300), 'big');
      await until(() => r.host.intercepts.some((c) => c.tag === 'big'), 3000, 'the big call at the host');
      r.host.intercepts.find((c) => c.tag === 'big')!.resolve(exitAnswer(0, 'x'.repeat(10_000)));
      await k.waitFor(() => k.stream(big).blocks.length >= 1, 3000, "the big answer's HEADERS");
      // A forwarded call with a stream window of its own, and a small intercepted one.
      const list = call(k, LIST_CONTAINERS, grpcMessage(Buffer.alloc(0)), 'list');
      k.windowUpdate(list, 1 << 20);
      const small = call(k, EXEC_SYNC, execSyncBody('/.probe-agent/v1', 300), 'small');
      const settled = await Promise.allSettled([answered(k, list, 3000, 'the forwarded call'), answered(k, small, 3000, 'the small intercepted call')]);
      expect(settled.map((x) => (x.status === 'fulfilled' ? (x.value.grpcStatus ?? `reset ${x.value.rst}`) : (x.reason as Error).message))).toEqual(['0', '0']);
      // The big answer completes once kubelet gives its stream room.
      k.windowUpdate(big, 1 << 20);
      const a = await answered(k, big, 3000, 'the big answer after its window opened');
      expect(a.grpcStatus).toBe('0');
      expect(a.body.toString('latin1')).toContain('x'.repeat(10_000));
      expect(r.violations()).toEqual([]);
    } finally {
      await r.close();
    }
  });
});
