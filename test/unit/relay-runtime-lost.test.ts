/**
 * Issue 24, "Also in the relay" item 2: the runtime lost while kubelet's side is held back.
 *
 * The relay stops taking kubelet's octets while the runtime does not take them (it paused kubelet's
 * socket until the runtime's drained). The runtime's connection then died: its socket never drained,
 * and kubelet's socket was never read again. PINGs went unanswered, a reset of a running hook never
 * reached the hook, and when kubelet closed, neither socket was closed (file descriptors leaked).
 *
 * Here the runtime (a scripted frame peer standing in for containerd) grants large windows and
 * then stops reading; the kubelet stand-in uploads on a forwarded stream until the relay stops
 * taking its octets (its socket paused, or no flow-control credit left with data still to send);
 * then the runtime's connection is destroyed. An intercepted hook is running on another stream
 * (answered by an in-test host, which never settles it: the agent is not under test).
 */
import { describe, expect, it, onTestFailed } from 'vitest';
import { aborted, answered, EXEC_SYNC, execSyncBody, RelayRig, requestHeaders, socketFds, STREAM_TAG, until } from '../support/relay-harness.ts';
import { ERR, SET } from '../support/h2-frame-peer.ts';

const UPLOAD_LIMIT = 64 << 20;

describe('relay: the runtime lost while kubelet is held back (issue 24 item 2)', () => {
  it('kubelet is still read: PING answered, the hook cancelled, the upload ended; both sockets closed once kubelet closes', async () => {
    const fdsBefore = socketFds();
    const r = await RelayRig.start({ runtime: { settings: [[SET.INITIAL_WINDOW_SIZE, 2 ** 31 - 1]] } });
    r.host.answer = () => 'defer';
    onTestFailed(() => console.error(`frame trace (last lines):\n${r.trace.tail(80)}`));
    try {
      const k = await r.client();
      const rt = await r.runtime();
      rt.windowUpdate(0, 2 ** 31 - 1 - 65_535);
      const relayKubeletSocket = r.relaySockets[0]!;
      const kubeletClosed = new Promise<void>((resolve) => relayKubeletSocket.once('close', () => resolve()));

      // A hook, intercepted and left running.
      const hookId = k.nextStreamId;
      k.open(requestHeaders(EXEC_SYNC, [{ name: STREAM_TAG, value: 'hook' }]), false);
      k.data(hookId, execSyncBody('/.probe-agent/v1', 500), true);
      await until(() => r.host.intercepts.length === 1, 3000, 'the hook at the host');
      const hook = r.host.intercepts[0]!;

      // The runtime's grants are through the relay (a PING each way after them), then it stops
      // reading; kubelet uploads until the relay stops taking its octets.
      expect(await rt.ping(3000)).toBe(true);
      expect(await k.ping(3000)).toBe(true);
      rt.socket.pause();
      const upId = k.nextStreamId;
      k.open(requestHeaders('/runtime.v1.ImageService/PullImage', [{ name: STREAM_TAG, value: 'upload' }]), false);
      const chunk = Buffer.alloc(1 << 20, 7);
      let offered = 0;
      const heldBack = (): boolean => relayKubeletSocket.isPaused() || (k.queued > 0 && (k.sendWindow <= 0 || k.sendWindowOf(upId) <= 0));
      await until(() => {
        while (offered < UPLOAD_LIMIT && k.socket.writableLength < 1 << 20 && k.queued < 1 << 20) {
          k.data(upId, chunk, false);
          offered += chunk.length;
        }
        return heldBack() || (offered >= UPLOAD_LIMIT && k.queued === 0 && k.socket.writableLength === 0);
      }, 15_000, 'the relay to stop taking kubelet\'s upload');
      expect(heldBack(), `the relay took all of a ${UPLOAD_LIMIT}-octet upload while the runtime read nothing`).toBe(true);
      r.trace.log(`TEST kubelet held back after ${offered} octets offered (relay socket paused: ${relayKubeletSocket.isPaused()}, queued ${k.queued}, window ${k.sendWindow})`);

      // The runtime is lost.
      rt.close();

      // Kubelet's side is still read and answered.
      const pong = await k.ping(3000).catch((err: Error) => err.message);
      expect.soft(pong, 'a PING from kubelet after the runtime was lost').toBe(true);
      const up = await answered(k, upId, 3000, 'the upload stream answered or reset').catch((err: Error) => err.message);
      expect.soft(typeof up === 'string' ? up : up.rst !== undefined || up.grpcStatus === '14', 'the forwarded upload ends (UNAVAILABLE or reset)').toBe(true);

      // Kubelet resets the hook: the hook's AbortSignal fires.
      k.rst(hookId, ERR.CANCEL);
      const cancelled = await aborted(hook.signal, 3000, "the hook's AbortSignal").then(() => true, (err: Error) => err.message);
      expect.soft(cancelled, 'a reset of the intercepted hook reaches the host').toBe(true);

      // Kubelet goes away: the relay closes its side, and no socket of the relay is left open.
      k.close();
      const closed = await Promise.race([
        kubeletClosed.then(() => true),
        new Promise<string>((res) => setTimeout(() => res('relay did not close its kubelet socket within 3 s'), 3000).unref()),
      ]);
      expect.soft(closed, "the relay's kubelet socket closes after kubelet closed").toBe(true);
      // The rig's two listeners stay open; every connection's socket must be gone.
      const fdsAfter = await until(() => socketFds() <= fdsBefore + 2, 3000, 'socket fds back to the two listeners').then(() => socketFds(), () => socketFds());
      expect.soft(fdsAfter - fdsBefore, 'socket fds left open beyond the two listeners').toBeLessThanOrEqual(2);
      expect(r.violations()).toEqual([]);
    } finally {
      await r.close();
    }
  }, 40_000);
});
