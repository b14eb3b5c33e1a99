/**
 * A pod's gRPC server floods the agent's gRPC prober (issue 31 items 1 and 4): the probers through
 * the real in-netns path (sockets made in lab pods by the resident netns helper, the node cut off
 * by the lab's drop rule). Pod 0 runs test/lab/hostile-server.ts, one port per flood (empty
 * CONTINUATIONs, empty DATA, PING, SETTINGS, RST_STREAM on idle streams, server-opened HEADERS,
 * WINDOW_UPDATE 0, padding-only DATA, 1xx heads); pod 1 a healthy gRPC server. For each flood, at the same
 * time: 16 probes of the attacker at once (one pod's worth), three times; each fails with a reason naming the flood; a neighbour's probes every
 * 100 ms all succeed; the heap of this process (the prober's) grows by far less than the agent's
 * 96 MiB heap cap (deploy/base/daemonset.yaml). The HTTP prober speaks HTTP/1.1 only (as
 * kubelet's), so these floods do not apply to it.
 *
 * Then the frame budget per pod, not per connection (issue 43): eight gRPC probe workers of the
 * attacker (period 1 s, timeout 5 s, one pod's frame budget as the prober keeps it) run beside the
 * neighbour's worker (period 100 ms, timeout 1 s, a budget of its own) for a window of 8 s:
 *  - endless 1xx heads on the gRPC response: each attacker probe fails on the first, as grpc-go
 *    (kubelet's) fails the call; before the fix each was read for its whole timeout;
 *  - a SETTINGS flood, re-armed on each new connection: each attacker probe fails 'frame-budget',
 *    and once the pod's budget is spent every later probe says so (a new connection is not a new
 *    budget); one warning for the streak;
 *  - the neighbour: every probe SERVING, its p99 (helper wait aside) within its own 1 s timeout, and
 *    at least half the probes its period schedules. Bounds of outcome, not of speed: before the
 *    fix eight 1xx floods took the neighbour to about 2 probes/s of the 10 scheduled.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft']);

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { SharedFrameBudget } from '../../agent/http2/frame-budget.ts';
import { createLogger } from '../../agent/log.ts';
import { ResidentHelper } from '../../agent/netns/helper.ts';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { PodFrameBudgets } from '../../agent/probe/pod-frame-budgets.ts';
import { runProbe } from '../../agent/probe/run.ts';
import type { ProbeContext, ProbeOutcome } from '../../agent/probe/types.ts';
import { createLab, type Lab, type LabPod, type RunningServer } from '../lab/lab.ts';
import { H2_FLOODS, startHostileServer, type H2Flood, type HostileServer } from '../lab/hostile-server.ts';
import { quantile } from '../bench/stats.ts';

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

function ctx(pod: LabPod, timeoutSeconds: number, frameBudget?: SharedFrameBudget): ProbeContext {
  return {
    netns: pod.netns, podIPs: pod.ips, timeoutSeconds, sockets: helper, nodeSockets,
    kubeVersion: '1.34', hostFieldPolicy: 'refuse', happyEyeballs: false, ...(frameBudget ? { frameBudget } : {}),
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
  // grpc-go (kubelet's through v1.34) fails the call on the first 1xx head.
  h2Informational: /code = Unknown desc = unexpected HTTP status code received from server: 100 \(Continue\); malformed header: missing HTTP content-type/,
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

const WINDOW_MS = 8_000;
const ATTACKERS = 8;
const ATTACKER_PERIOD_MS = 1_000;
const ATTACKER_TIMEOUT_S = 5;
const NEIGHBOUR_PERIOD_MS = 100;
const NEIGHBOUR_TIMEOUT_S = 1;

/** A worker as kubelet runs one: a probe per tick of its period; a tick that finds the last probe still running is skipped. */
async function worker(run: () => Promise<ProbeOutcome>, periodMs: number, until: number, out: ProbeOutcome[]): Promise<void> {
  const start = performance.now();
  while (performance.now() < until) {
    out.push(await run());
    const now = performance.now();
    const next = start + Math.ceil((now - start) / periodMs) * periodMs;
    if (next < until) await new Promise((r) => setTimeout(r, Math.max(0, next - now)));
    else break;
  }
}

/** The p99 of `values`. */
const p99 = (values: number[]): number => quantile([...values].sort((a, b) => a - b), 0.99);

function countBy(keys: string[]): Record<string, number> {
  const n: Record<string, number> = {};
  for (const k of keys) n[k] = (n[k] ?? 0) + 1;
  return n;
}

interface Run {
  attackerOutcomes: ProbeOutcome[][];
  neighbourOutcomes: ProbeOutcome[];
  warnings: string[];
}

/** The attacker's workers against `kind` and the neighbour's worker, together for the window. */
async function underAttack(kind: H2Flood): Promise<Run> {
  const warnings: string[] = [];
  const budgets = new PodFrameBudgets({ log: createLogger({ level: 'warn', format: 'json', write: (l) => warnings.push(l) }) });
  const podCtx = (pod: LabPod, timeoutSeconds: number): ProbeContext => ctx(pod, timeoutSeconds, budgets.of({ uid: pod.name, namespace: 'lab', name: pod.name }));
  const until = performance.now() + WINDOW_MS;
  const attackerOutcomes = Array.from({ length: ATTACKERS }, (): ProbeOutcome[] => []);
  const neighbourOutcomes: ProbeOutcome[] = [];
  await Promise.all([
    ...attackerOutcomes.map((out) => worker(() => runProbe({ kind: 'grpc', port: hostile.ports[kind] as number }, podCtx(attacker, ATTACKER_TIMEOUT_S)), ATTACKER_PERIOD_MS, until, out)),
    worker(() => runProbe({ kind: 'grpc', port: healthy.ports.grpc as number }, podCtx(neighbour, NEIGHBOUR_TIMEOUT_S)), NEIGHBOUR_PERIOD_MS, until, neighbourOutcomes),
  ]);
  const targetTimes = neighbourOutcomes.map((o) => o.durationSeconds - (o.phases.helper ?? 0));
  const all = attackerOutcomes.flat();
  console.log(`${kind}: neighbour ${neighbourOutcomes.filter((o) => o.result === 'success').length}/${neighbourOutcomes.length} ok ` +
    `(${(neighbourOutcomes.length / (WINDOW_MS / 1000)).toFixed(1)}/s, scheduled ${1000 / NEIGHBOUR_PERIOD_MS}/s), p99 ${p99(targetTimes).toFixed(3)} s, ` +
    `slowest ${Math.max(...targetTimes).toFixed(3)} s; attacker ${all.length} probes, reasons ${JSON.stringify(countBy(all.map((o) => o.reason ?? o.result)))}`);
  return { attackerOutcomes, neighbourOutcomes, warnings };
}

/** The neighbour kept its rate and its answers: every probe SERVING, p99 within its timeout, at least half its schedule. */
function expectNeighbourKept(run: Run): void {
  const out = run.neighbourOutcomes;
  expect(out.filter((o) => o.result !== 'success').map((o) => `${o.result} ${o.reason}: ${o.message}`)).toEqual([]);
  const targetTimes = out.map((o) => o.durationSeconds - (o.phases.helper ?? 0));
  expect(p99(targetTimes), 'neighbour p99 (helper wait aside) within its own timeout').toBeLessThanOrEqual(NEIGHBOUR_TIMEOUT_S);
  expect(out.length, 'neighbour probes over the window: at least half of what its period schedules').toBeGreaterThanOrEqual((WINDOW_MS / NEIGHBOUR_PERIOD_MS) / 2);
}

describe("a pod's gRPC server flooding the prober across connections costs only its own probes", () => {
  it('endless 1xx heads: every attacker probe fails at the first, in grpc-go\'s words; the neighbour keeps its rate and answers', async () => {
    const run = await underAttack('h2Informational');
    expectNeighbourKept(run);
    const all = run.attackerOutcomes.flat();
    expect(all.length).toBeGreaterThan(0);
    for (const o of all) {
      expect(o.result, o.message).toBe('failure');
      expect(o.reason).toBe('grpc-status');
      expect(o.message).toMatch(/^error: health rpc probe failed: rpc error: code = Unknown desc = unexpected HTTP status code received from server: 100 \(Continue\); malformed header: missing HTTP content-type$/);
    }
  }, 60_000);

  it('a SETTINGS flood re-armed on each new connection: the pod\'s budget is not; its probes fail frame-budget, one warning; the neighbour keeps its rate and answers', async () => {
    const run = await underAttack('h2Settings');
    expectNeighbourKept(run);
    const all = run.attackerOutcomes.flat();
    for (const o of all) {
      expect(o.result, o.message).toBe('failure');
      expect(o.reason, o.message).toBe('frame-budget');
      expect(o.message).toMatch(/peer flooded frames without progress \(SETTINGS \d+/);
    }
    // Past each worker's first probe (the burst the budget allows at once), every probe is cut by the pod's budget.
    const later = run.attackerOutcomes.flatMap((w) => w.slice(1));
    expect(later.length).toBeGreaterThan(0);
    for (const o of later) expect(o.message).toMatch(/the pod's frame budget \(\d+ frames without progress per \d+ s, over all its probes' connections\) is spent/);
    expect(run.warnings.filter((l) => l.includes('lab/' + attacker.name))).toHaveLength(1);
    expect(run.warnings.filter((l) => l.includes('lab/' + neighbour.name))).toEqual([]);
  }, 60_000);
});
