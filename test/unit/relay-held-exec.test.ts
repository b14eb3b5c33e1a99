/**
 * Issue 24, "Also in the relay" item 1: an ExecSync that is not probe-agent's must not be held.
 *
 * The relay used to hold every ExecSync request until END_STREAM (or 64 KiB) before deciding
 * whether it was ours. The held octets used up kubelet's connection window, which only the
 * runtime's credit refills, and the runtime cannot give credit for octets it never received: a
 * 30,000-octet call followed by a 40,000-octet ExecSync stalled every later call on the connection.
 *
 * The runtime here is a scripted frame peer (a stand-in for containerd) that returns credit the
 * way nghttp2 does, once half a window is used: a legal choice that makes the stall exact.
 */
import { describe, expect, it, onTestFailed } from 'vitest';
import { answered, type CallResult, autoAnswer, call, EXEC_SYNC, execSyncBody, grpcMessage, LIST_CONTAINERS, RelayRig, requestHeaders, STREAM_TAG, tagOf, VERSION } from '../support/relay-harness.ts';

async function rig(): Promise<RelayRig> {
  const r = await RelayRig.start({ runtime: { credit: 'half' } });
  onTestFailed(() => console.error(`frame trace (last lines):\n${r.trace.tail(120)}`));
  return r;
}

describe('relay: an ExecSync that is not ours is forwarded, not held (issue 24 item 1)', () => {
  it('a 30,000-octet call, then a 40,000-octet ExecSync and a ListContainers: both answered within 5 s', async () => {
    const r = await rig();
    try {
      const k = await r.client();
      const rt = await r.runtime();
      autoAnswer(rt);
      const first = call(k, VERSION, grpcMessage(Buffer.alloc(30_000 - 5, 1)), 'first');
      const a1 = await answered(k, first, 5000, 'the 30,000-octet call');
      expect(a1.grpcStatus).toBe('0');
      expect(a1.body.toString('latin1')).toContain('answer first 30000');

      const exec = call(k, EXEC_SYNC, execSyncBody('/bin/sh', 40_000), 'exec');
      const list = call(k, LIST_CONTAINERS, grpcMessage(Buffer.alloc(0)), 'list');
      const settled = await Promise.allSettled([
        answered(k, exec, 5000, 'the 40,000-octet ExecSync (not ours)'),
        answered(k, list, 5000, 'the ListContainers after it'),
      ]);
      expect(settled.map((x) => (x.status === 'fulfilled' ? 'answered' : (x.reason as Error).message))).toEqual(['answered', 'answered']);
      const [ae, al] = settled.map((x) => (x as PromiseFulfilledResult<CallResult>).value) as [CallResult, CallResult];
      expect(ae.grpcStatus).toBe('0');
      // The runtime got the whole ExecSync body, under its own stream.
      expect(ae.body.toString('latin1')).toContain('answer exec 40000');
      expect(al.grpcStatus).toBe('0');
      expect(al.body.toString('latin1')).toContain('answer list 5');
      expect(r.host.intercepts).toHaveLength(0);
      expect(r.violations()).toEqual([]);
    } finally {
      await r.close();
    }
  });

  it('the runtime sees a not-ours ExecSync before the client has sent END_STREAM', async () => {
    const r = await rig();
    try {
      const k = await r.client();
      const rt = await r.runtime();
      autoAnswer(rt);
      const body = execSyncBody('/bin/sh', 40_000);
      const id = k.nextStreamId;
      k.open(requestHeaders(EXEC_SYNC, [{ name: STREAM_TAG, value: 'early' }]), false);
      // The first DATA holds argv[0] (well within its first 200 octets); the rest is held back by the client.
      k.data(id, body.subarray(0, 200), false);
      await rt.waitFor(() => [...rt.streams.values()].some((s) => tagOf(s) === 'early' && s.dataLength >= 200), 3000,
        "the ExecSync's HEADERS and first 200 octets at the runtime while the client still holds END_STREAM");
      k.data(id, body.subarray(200), true);
      const a = await answered(k, id, 5000, 'the ExecSync');
      expect(a.grpcStatus).toBe('0');
      expect(a.body.toString('latin1')).toContain('answer early 40000');
      expect(r.host.intercepts).toHaveLength(0);
      expect(r.violations()).toEqual([]);
    } finally {
      await r.close();
    }
  });

  it('an ExecSync that is ours is still answered by the host and never reaches the runtime (control)', async () => {
    const r = await rig();
    try {
      const k = await r.client();
      const rt = await r.runtime();
      autoAnswer(rt);
      const id = call(k, EXEC_SYNC, execSyncBody('/.probe-agent/v1', 3000), 'ours');
      const a = await answered(k, id, 5000, 'the intercepted ExecSync');
      expect(a.grpcStatus).toBe('0');
      expect(a.body.toString('latin1')).toContain('ok ours');
      const after = call(k, LIST_CONTAINERS, grpcMessage(Buffer.alloc(0)), 'after');
      expect((await answered(k, after, 5000, 'a ListContainers after it')).grpcStatus).toBe('0');
      expect(r.host.intercepts.map((c) => c.tag)).toEqual(['ours']);
      expect([...rt.streams.values()].map(tagOf)).toEqual(['after']);
      expect(r.violations()).toEqual([]);
    } finally {
      await r.close();
    }
  });
});
