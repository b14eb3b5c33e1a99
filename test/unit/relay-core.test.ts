/**
 * Three defects of the relay on the HTTP/2 connection core (e89c8b3, 3d8e9c3, e4b4af9), found by the
 * randomized schedule test (relay-schedule.test.ts) and pinned here as fixed schedules.
 *
 * 1. A connection the relay has ended (GOAWAY, then end()) must not be written to again: a SETTINGS
 *    ACK or PING ACK for a frame read after end() is a write after end, on which Node destroys the
 *    socket. Kubelet's connection is then cut under it (ECONNRESET, or EPIPE on its next write, after
 *    which it may never read the relay's GOAWAY) instead of ended. Schedule seeds 1, 3, 12345.
 * 2. An intercepted ExecSync must be readable whatever the runtime's SETTINGS_INITIAL_WINDOW_SIZE:
 *    the relay advertises the runtime's initial stream window to kubelet, and on a call it answers
 *    itself it gives stream credit back only after 16 KiB, so with a runtime window smaller than the
 *    request (100 octets, or 0) kubelet can never send the rest of an intercepted request, even after
 *    the runtime is gone. Schedule seeds 1, 2, 3, 5, 6, 8.
 *
 * 3. The same, when the runtime lowers its initial stream window (to 100) after kubelet sent the
 *    first 200 octets of an intercepted ExecSync: kubelet's window for that stream is then -100,
 *    and the 200 octets read are given back only once they reach half the window advertised when
 *    they were read, which nothing re-checks. Schedule seed 2 (path 113:0:0:0) on e4b4af9.
 *
 * The runtime is a scripted frame peer (a stand-in for containerd), the host answers intercepted
 * calls itself (the agent is not under test).
 */
import { describe, expect, it, onTestFailed } from 'vitest';
import { ERR, SET } from '../support/h2-frame-peer.ts';
import { answered, call, EXEC_SYNC, execSyncBody, outcome, RelayRig, requestHeaders, STREAM_TAG } from '../support/relay-harness.ts';

describe('relay on the connection core: defects found by the schedule test', () => {
  it('kubelet leaves with a SETTINGS and a PING right behind its GOAWAY: its connection is never cut', async () => {
    const r = await RelayRig.start();
    onTestFailed(() => console.error(`frame trace (last lines):\n${r.trace.tail(60)}`));
    try {
      const k = await r.client();
      await r.runtime();
      expect(await k.ping(3000)).toBe(true);
      const relayErrors: string[] = [];
      r.relaySockets[0]!.on('error', (err) => relayErrors.push(err.message));
      // One write: GOAWAY, then a SETTINGS and a PING (grpc-go may have a BDP PING in flight).
      k.socket.cork();
      k.goaway(0, ERR.NO_ERROR, 'KUBE-leaving');
      k.settings([[SET.INITIAL_WINDOW_SIZE, 1 << 20]]);
      void k.ping(3000).catch(() => false);
      k.socket.uncork();
      // The relay may end the connection (kubelet is leaving) or keep it and answer the PING.
      await k.waitFor(() => k.closed || k.pingAckedUpTo >= 2, 3000, 'the connection ended or the PING answered');
      expect(relayErrors, "errors on the relay's kubelet socket").toEqual([]);
      if (k.closed) expect(k.closeReason, 'how kubelet saw its connection end').toBe('end');
    } finally {
      await r.close();
    }
  });

  for (const window of [100, 0]) {
    it(`a 3,000-octet intercepted ExecSync is answered when the runtime's initial stream window is ${window}`, async () => {
      const r = await RelayRig.start({ runtime: { settings: [[SET.INITIAL_WINDOW_SIZE, window]] } });
      onTestFailed(() => console.error(`frame trace (last lines):\n${r.trace.tail(60)}`));
      try {
        const k = await r.client();
        const rt = await r.runtime();
        // The runtime's SETTINGS have reached the relay, and whatever the relay sent kubelet after them has arrived.
        expect(await rt.ping(3000)).toBe(true);
        expect(await k.ping(3000)).toBe(true);
        const id = call(k, EXEC_SYNC, execSyncBody('/.probe-agent/v1', 3000), 'probe');
        await answered(k, id, 3000, 'the intercepted ExecSync').catch(() => undefined);
        expect(outcome(k, id), `the intercepted call (kubelet sent ${k.stream(id).sentData} of 3000 octets)`).toBe('grpc-status 0');
        expect(r.host.intercepts.map((c) => c.tag)).toEqual(['probe']);
        expect([...rt.streams.values()].filter((s) => s.blocks.length > 0), 'streams at the runtime').toEqual([]);
        expect(r.violations()).toEqual([]);
      } finally {
        await r.close();
      }
    });
  }

  it("an ExecSync opened before the runtime is lost ends, with the runtime's window 0 advertised to kubelet", async () => {
    const r = await RelayRig.start({ runtime: { settings: [[SET.INITIAL_WINDOW_SIZE, 0]] } });
    onTestFailed(() => console.error(`frame trace (last lines):\n${r.trace.tail(60)}`));
    try {
      const k = await r.client();
      const rt = await r.runtime();
      expect(await rt.ping(3000)).toBe(true);
      expect(await k.ping(3000)).toBe(true);
      const id = call(k, EXEC_SYNC, execSyncBody('/.probe-agent/v1', 3000), 'probe');
      await rt.ping(3000);
      rt.close();
      await answered(k, id, 3000, 'the ExecSync').catch(() => undefined);
      // Answered by the host (it is ours), or failed (UNAVAILABLE, a reset): anything but hanging.
      const o = outcome(k, id);
      expect(o === 'no answer' || o.startsWith('connection closed'), `the ExecSync after the runtime was lost: ${o} (kubelet sent ${k.stream(id).sentData} of 3000 octets)`).toBe(false);
    } finally {
      await r.close();
    }
  });

  it('an intercepted ExecSync is answered when the runtime lowers its initial stream window in the middle of it', async () => {
    const r = await RelayRig.start();
    onTestFailed(() => console.error(`frame trace (last lines):\n${r.trace.tail(60)}`));
    try {
      const k = await r.client();
      const rt = await r.runtime();
      expect(await rt.ping(3000)).toBe(true);
      const body = execSyncBody('/.probe-agent/v1', 3000);
      const id = k.nextStreamId;
      k.open(requestHeaders(EXEC_SYNC, [{ name: STREAM_TAG, value: 'probe' }]), false);
      k.data(id, body.subarray(0, 200), false);
      // The relay has read the first 200 octets (argv[0] is ours) once a later PING is answered.
      expect(await k.ping(3000)).toBe(true);
      rt.settings([[SET.INITIAL_WINDOW_SIZE, 100]]);
      await rt.waitFor(() => rt.settingsAcked >= 2, 3000, "the relay's ACK of the runtime's new SETTINGS");
      expect(await k.ping(3000)).toBe(true);
      k.data(id, body.subarray(200), true);
      await answered(k, id, 3000, 'the intercepted ExecSync').catch(() => undefined);
      expect(outcome(k, id), `the intercepted call (kubelet sent ${k.stream(id).sentData} of 3000 octets)`).toBe('grpc-status 0');
      expect(r.violations()).toEqual([]);
    } finally {
      await r.close();
    }
  });
});
