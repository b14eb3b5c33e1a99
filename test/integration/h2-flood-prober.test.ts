/**
 * A pod's gRPC server floods the agent's gRPC prober (issue 31 items 1 and 4): the probers through
 * the real in-netns path (sockets made in lab pods by the resident netns helper, the node cut off
 * by the lab's drop rule). Pod 0 runs test/lab/hostile-server.ts, one port per flood (empty
 * CONTINUATIONs, empty DATA, PING, SETTINGS, RST_STREAM on idle streams, server-opened HEADERS,
 * WINDOW_UPDATE 0, padding-only DATA); pod 1 a healthy gRPC server. For each flood, at the same
 * time: 16 probes of the attacker at once (one pod's worth), three times; each fails with a reason naming the flood; a neighbour's probes every
 * 100 ms all succeed; the heap of this process (the prober's) grows by far less than the agent's
 * 96 MiB heap cap (deploy/base/daemonset.yaml). The HTTP prober speaks HTTP/1.1 only (as
 * kubelet's), so these floods do not apply to it.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft']);

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ResidentHelper } from '../../agent/netns/helper.ts';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { runProbe } from '../../agent/probe/run.ts';
import type { ProbeContext, ProbeOutcome } from '../../agent/probe/types.ts';
import { createLab, type Lab, type LabPod, type RunningServer } from '../lab/lab.ts';
import { H2_FLOODS, startHostileServer, type H2Flood, type HostileServer } from '../lab/hostile-server.ts';

/** The agent's V8 heap cap in the DaemonSet (--max-old-space-size=96). */
const DEPLOYED_HEAP_MIB = 96;

let lab: Lab;
let helper: ResidentHelper;
let attacker: LabPod;
let neighbour: LabPod;
let hostile: HostileServer;
let healthy: RunningServer;
const nodeSockets = new NodeSocketFactory();

beforeAll(async () => {
  lab = await createLab({ pods: 2, policy: 'drop', tag: 'h2-flood-prober.test' });
  [attacker, neighbour] = lab.pods as [LabPod, LabPod];
  helper = await ResidentHelper.start();
  hostile = await startHostileServer(attacker.name, Object.fromEntries(H2_FLOODS.map((k) => [k, 0])));
  healthy = await lab.startServer(neighbour, { grpc: 0, grpcServices: { '': 'SERVING' } });
}, 60_000);

afterAll(async () => {
  await hostile?.stop();
  await helper?.close();
  await lab?.destroy();
});

function ctx(pod: LabPod, timeoutSeconds: number): ProbeContext {
  return {
    netns: pod.netns, podIPs: pod.ips, timeoutSeconds, sockets: helper, nodeSockets,
    kubeVersion: '1.34', hostFieldPolicy: 'refuse', happyEyeballs: false,
  };
}

const REASON: Record<H2Flood, RegExp> = {
  h2Continuation: /header block on stream 1 in more than 8 CONTINUATION frames/,
  h2EmptyData: /peer flooded frames without progress \(DATA \d+/,
  h2Ping: /peer flooded frames without progress \(PING \d+/,
  h2Settings: /peer flooded frames without progress \(SETTINGS \d+/,
  h2RstIdle: /peer flooded frames without progress \(RST_STREAM \d+/,
  h2ServerHeaders: /peer flooded frames without progress \(HEADERS \d+/,
  h2WindowUpdate0: /peer flooded frames without progress \(WINDOW_UPDATE \d+/,
  h2Padded: /peer flooded frames without progress \(DATA \d+/,
};

describe("a pod's gRPC server flooding the prober ends only its own probe", () => {
  for (const kind of H2_FLOODS) {
    it(`${kind}: the attacker's probe fails with a clear reason; the neighbour keeps every answer; the heap stays small`, async () => {
      const heap0 = process.memoryUsage().heapUsed;
      let peak = heap0;
      const sampler = setInterval(() => {
        peak = Math.max(peak, process.memoryUsage().heapUsed);
      }, 10);
      let done = false;
      const neighbourOutcomes: ProbeOutcome[] = [];
      const neighbourLoop = (async () => {
        while (!done) {
          neighbourOutcomes.push(await runProbe({ kind: 'grpc', port: healthy.ports.grpc as number }, ctx(neighbour, 10)));
          await new Promise((r) => setTimeout(r, 100));
        }
      })();
      try {
        // One pod's worth of gRPC probes (16) at once, three periods in a row.
        const outcomes: ProbeOutcome[] = [];
        for (let i = 0; i < 3; i++) {
          outcomes.push(...await Promise.all(Array.from({ length: 16 }, () => runProbe({ kind: 'grpc', port: hostile.ports[kind] as number }, ctx(attacker, 10)))));
        }
        // The neighbour's probes kept going through the attack, and after it.
        const before = neighbourOutcomes.length;
        while (neighbourOutcomes.length < before + 3) await new Promise((r) => setTimeout(r, 50));
        done = true;
        await neighbourLoop;
        clearInterval(sampler);
        const stats = await hostile.stats();
        const slowest = Math.max(...outcomes.map((o) => o.durationSeconds));
        console.log(`${kind}: attacker ${outcomes.filter((o) => o.result === 'failure').length}/${outcomes.length} failed, slowest in ${slowest.toFixed(3)} s; ` +
          `${stats.bytesWritten[kind]} octets of flood written; neighbour ${neighbourOutcomes.filter((o) => o.result === 'success').length}/${neighbourOutcomes.length} ok; ` +
          `heap +${((peak - heap0) / 2 ** 20).toFixed(1)} MiB`);
        for (const o of outcomes) {
          expect(o.result, o.message).toBe('failure');
          expect(o.message).toMatch(REASON[kind]);
          // Ended by the budget, not by the probe's 10 s timeout.
          expect(o.durationSeconds).toBeLessThan(8);
        }
        expect(neighbourOutcomes.filter((o) => o.result !== 'success').map((o) => o.message)).toEqual([]);
        expect(peak - heap0, 'heap growth under attack').toBeLessThan((DEPLOYED_HEAP_MIB / 3) * 2 ** 20);
      } finally {
        done = true;
        clearInterval(sampler);
        await neighbourLoop;
      }
    }, 90_000);
  }
});
