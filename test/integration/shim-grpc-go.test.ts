/**
 * The shim under kubelet's own gRPC library (issue 24): a grpc-go CRI client dialed as kubelet dials
 * its runtime (test/grpc-go-peer, built by `make grpc-go-peer` from Debian's grpc-go 1.33) drives
 * the lab's real containerd with a kubelet's traffic under pod churn (test/support/cri-churn.ts):
 * sandboxes and containers created, started, stopped and removed, rewritten (marker) probes and
 * plain ExecSyncs, PLEG lists: 16 pods with 2 probes a second each, 4 replaced every 5 s.
 *
 * Why grpc-go: it sends a BDP PING whenever DATA arrives after its last PING was answered;
 * containerd's grpc-go server counts a PING as a strike when it sent no HEADERS or DATA since the
 * previous one and, past two strikes, sends GOAWAY ENHANCE_YOUR_CALM "too_many_pings". Through a
 * shim that answers marker ExecSyncs itself and forwards kubelet's PINGs, containerd sees PINGs it
 * did not earn. grpc-js and node:http2 send no such PINGs, so no other test here can see it.
 *
 * Twice on the same containerd, each time a new grpc-go connection (a kubelet starting): first
 * straight to it with kubelet probing the pods itself (the baseline: a node without the shim), then
 * through the shim with the probes rewritten and the real agent answering them. Both must end the
 * same way: one connection for the whole run, no GOAWAY on it, no call UNAVAILABLE, every answer
 * right. A frame tap between the shim and containerd (support/h2-tap.ts) shows what containerd
 * did to the shim's side: it must never have sent it away either.
 *
 * Run alone: `make test-grpc-go`, or `npx vitest run test/integration/shim-grpc-go.test.ts` after
 * `make build grpc-go-peer` (with .tools/bin first on PATH, for Node 24). Knobs: GRPC_GO_CHURN_SECONDS
 * (the shim phase's churn, default 30), GRPC_GO_BASELINE_SECONDS (the baseline's, default 15),
 * GRPC_GO_AUTHORITY (`path`, kubelet < 1.31, default; or `localhost`), GRPC_GO_LOG=1 (the peer's
 * transport events and the churn's wrong answers on stderr).
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'nsenter', 'containerd', 'ctr', 'dpkg-deb']);
import { requireGrpcGoPeer } from '../support/grpc-go-cri.ts';
requireGrpcGoPeer();

import { rmSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CriShim } from '../../agent/shim/proxy.ts';
import { importBusyboxImage } from '../lab/busybox-image.ts';
import { createContainerdLab, type ContainerdLab } from '../lab/containerd.ts';
import { labScratch } from '../lab/slots.ts';
import { startAgent, type AgentHandle } from '../support/agent-harness.ts';
import { formatChurn, runCriChurn, type ChurnResult } from '../support/cri-churn.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { GrpcGoCri, type GrpcGoPeerStats } from '../support/grpc-go-cri.ts';
import { H2Tap } from '../support/h2-tap.ts';

const SECONDS = Number(process.env['GRPC_GO_CHURN_SECONDS'] ?? 30);
const BASELINE_SECONDS = Number(process.env['GRPC_GO_BASELINE_SECONDS'] ?? 15);
const AUTHORITY = (process.env['GRPC_GO_AUTHORITY'] ?? 'path') as 'path' | 'localhost';
const VERBOSE = process.env['GRPC_GO_LOG'] === '1';
if (!(SECONDS >= 10) || !(BASELINE_SECONDS >= 10) || (AUTHORITY !== 'path' && AUTHORITY !== 'localhost')) {
  throw new Error(`GRPC_GO_CHURN_SECONDS=${SECONDS}, GRPC_GO_BASELINE_SECONDS=${BASELINE_SECONDS} (want >= 10), GRPC_GO_AUTHORITY=${AUTHORITY} (want path or localhost)`);
}
const PODS = 16;
const REPLACE = 4;
const REPLACE_EVERY_S = 5;

let ctrd: ContainerdLab;
let kubelet: FakeKubelet;
let agent: AgentHandle;
let scratch: string;
let shim: CriShim;
/** Between the shim and containerd: what containerd did to the shim's connections. */
let tap: H2Tap;
const shimLog: string[] = [];

beforeAll(async () => {
  ctrd = await createContainerdLab();
  importBusyboxImage(ctrd.socket);
  scratch = labScratch('shim-grpc-go-');
  kubelet = await FakeKubelet.start({ pods: [] });
  agent = await startAgent({ kubeletUrl: kubelet.httpUrl, resolvers: 'cri', args: [`--cri-endpoint=${ctrd.endpoint}`, `--netns-dir=${ctrd.netnsDir}`] });
  tap = await H2Tap.start(path.join(scratch, 'runtime-tap.sock'), ctrd.socket);
  // The shim as `probe-agent shim` runs it by default (the frame relay, unless the default changes).
  shim = new CriShim({
    listenPath: path.join(scratch, 'cri.sock'), runtimeSocket: tap.listenPath, probeSocket: agent.socket,
    log: (level, msg, fields) => {
      if (level === 'warn' || level === 'error') shimLog.push(`${level} ${msg} ${JSON.stringify(fields ?? {})}`);
    },
  });
  await shim.listen();
}, 90_000);

afterAll(async () => {
  await shim?.close(100);
  await tap?.close();
  await agent?.stop('SIGKILL').catch(() => {});
  await kubelet?.stop();
  await ctrd?.destroy();
  if (scratch) rmSync(scratch, { recursive: true, force: true });
});

/** One phase: a fresh grpc-go connection (a kubelet starting) to `socket`, the churn on it, its transport counts. */
async function phase(label: string, socket: string, probes: 'shim' | 'kubelet', seconds: number): Promise<{ r: ChurnResult; stats: GrpcGoPeerStats; report: string }> {
  const client = new GrpcGoCri(socket, { authority: AUTHORITY, logTransport: true });
  const log = (l: string): void => {
    if (VERBOSE) process.stderr.write(`${label}: ${l}\n`);
  };
  let r: ChurnResult;
  let stats: GrpcGoPeerStats | undefined;
  try {
    r = await runCriChurn({
      client, probes, namespace: label, cgroupPrefix: ctrd.cgroupPrefix,
      pods: PODS, seconds, replacePods: REPLACE, replaceEverySeconds: REPLACE_EVERY_S,
      onPods: (specs) => kubelet.setPods(specs), log,
    });
  } finally {
    stats = await client.close();
    if (VERBOSE) process.stderr.write(client.stderr().split('\n').filter((l) => l.startsWith('grpc-go-peer ')).join('\n') + '\n');
  }
  if (!stats) throw new Error(`${label}: grpc-go-peer gave no final counts: ${client.stderr().slice(-2000)}`);
  const goaways = stats.goaways.map((g) => `conn ${g.conn} code ${g.code} "${g.debug}"`);
  const report = [
    formatChurn(`${label} (grpc-go ${AUTHORITY === 'path' ? ':authority = socket path' : ':authority localhost'})`, r),
    `  transport: ${stats.dials} connection(s), ${stats.goaways.length} GOAWAY(s) received${goaways.length ? ` [${[...new Set(goaways)].slice(0, 5).join('; ')}${goaways.length > 5 ? '; …' : ''}]` : ''}, ` +
      `${stats.pingsSent} PINGs sent (${stats.bdpPingsSent} BDP), ${stats.pingAcksReceived} PING ACKs received, ${stats.dataFramesReceived} DATA frames received`,
  ].join('\n');
  process.stderr.write(`${report}\n`);
  return { r, stats, report };
}

/** What both phases must show: kubelet's connection untouched, every call answered right, the load really ran. */
function expectHealthy(r: ChurnResult, stats: GrpcGoPeerStats, report: string, seconds: number): void {
  // The connection: never told to go away, never lost, never re-dialed.
  expect(stats.goaways, report).toEqual([]);
  expect(stats.dials, report).toBe(1);
  expect(stats.dialErrors, report).toBe(0);
  // No call failed for the connection, and every answer was the right one.
  expect(r.unavailable, report).toBe(0);
  expect(r.wrong, report).toEqual([]);
  expect(r.wrongCount, report).toBe(0);
  expect(r.probes.wrong, report).toBe(0);
  expect(r.plainExecs.wrong, report).toBe(0);
  // The load ran: the first pods came up, pods were replaced, probes and execs were made all along.
  expect(r.podsStarted, report).toBeGreaterThanOrEqual(PODS + REPLACE);
  expect(r.replaced, report).toBeGreaterThanOrEqual(REPLACE);
  expect(r.probes.right, report).toBeGreaterThanOrEqual(PODS * 2 * (seconds / 3));
  expect(r.probes.expectedFailures, report).toBeGreaterThan(0);
  expect(r.plainExecs.right, report).toBeGreaterThanOrEqual(PODS);
  expect(stats.callsFinished, report).toBe(stats.callsStarted);
  expect(stats.callsFinished, report).toBe(r.calls);
}

describe('kubelet\'s grpc-go client under pod churn', () => {
  it('straight to containerd, kubelet probing the pods itself (the baseline): one connection, no GOAWAY, no call UNAVAILABLE, every answer right', async () => {
    const { r, stats, report } = await phase('grpc-go-direct', ctrd.socket, 'kubelet', BASELINE_SECONDS);
    expectHealthy(r, stats, report, BASELINE_SECONDS);
  }, 120_000 + BASELINE_SECONDS * 2000);

  it('through the shim, the probes rewritten and answered by the agent: the same — the shim adds no failure', async () => {
    const interceptedBefore = shim.stats.intercepted;
    const tapBefore = { goaways: tap.counts.goawaysFromTarget.length, pings: tap.counts.pingsToTarget, conns: tap.counts.connections };
    const phased = await phase('grpc-go-shim', shim.config.listenPath, 'shim', SECONDS);
    const { r, stats } = phased;
    const fromContainerd = tap.counts.goawaysFromTarget.slice(tapBefore.goaways);
    const reasons = new Map<string, number>();
    for (const g of fromContainerd) reasons.set(`code ${g.code} "${g.debug}"`, (reasons.get(`code ${g.code} "${g.debug}"`) ?? 0) + 1);
    const report = [
      phased.report,
      `  shim <-> containerd: ${tap.counts.connections - tapBefore.conns} connection(s), ${fromContainerd.length} GOAWAY(s) from containerd` +
        `${reasons.size ? ` [${[...reasons].map(([k, n]) => `${k} ×${n}`).join('; ')}]` : ''}, ${tap.counts.pingsToTarget - tapBefore.pings} PINGs from the shim`,
      ...shimLog.slice(0, 5).map((l) => `  shim log: ${l.slice(0, 300)}`),
    ].join('\n');
    process.stderr.write(`${report}\n`);
    expectHealthy(r, stats, report, SECONDS);
    // containerd never sent the shim away (too_many_pings is what PINGs forwarded from kubelet earn).
    expect(fromContainerd, report).toEqual([]);
    // The case that breaks a relay that forwards PINGs: grpc-go sent BDP PINGs as the shim's own
    // answers arrived, and the shim answered the markers itself (containerd sent nothing for them).
    expect(stats.bdpPingsSent, report).toBeGreaterThan(10);
    expect(shim.stats.intercepted - interceptedBefore, report).toBeGreaterThanOrEqual(r.probes.right);
    // A healthy run leaves nothing for an operator to chase in the shim's log.
    expect(shimLog, report).toEqual([]);
  }, 120_000 + SECONDS * 2000);
});
