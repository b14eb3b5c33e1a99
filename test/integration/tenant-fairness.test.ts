/**
 * One tenant cannot starve another (issue 18, "Fairness and bounds per tenant"): the real agent
 * (`probe-agent run`, default limits) and real containerd-lab pods in their own netns. Namespace
 * "noisy" holds 64 probes and 32 lifecycle hooks against a port that accepts and never answers
 * (timeouts of an hour); namespace "victim" then sends probes and hooks through the ProbeService
 * as the kubelet shim does (call deadline = timeout + the shim's 2 s agent grace), and every one is
 * answered within its own timeout (its latency, not only its outcome). The noisy pod that is at
 * its own cap is refused at once, with a message that says why.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nsenter', 'containerd', 'ctr']);

import * as grpc from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApiError, ProbeApiClient } from '../../agent/api/client.ts';
import type { ProbeHandler } from '../../agent/probe/types.ts';
import { createContainerdLab, type ContainerdLab, type LabSandbox } from '../lab/containerd.ts';
import { startAgent, type AgentHandle } from '../support/agent-harness.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { sample, sleep, until } from '../soak/observe.ts';
import { podFor, SandboxServer } from '../soak/sandbox-server.ts';
import { statusNameOf } from '../support/call-status.ts';

const HANG = 9999;
const HOUR = 3600;
/** The shim's --agent-grace: the call deadline it gives the agent beyond the probe's own timeout. */
const SHIM_GRACE_MS = 2000;
const hangHttp: ProbeHandler = { kind: 'http', port: HANG, path: '/', scheme: 'HTTP', headers: [] };
const answering: ProbeHandler = { kind: 'http', port: 8080, path: '/healthz', scheme: 'HTTP', headers: [] };
const answeringTcp: ProbeHandler = { kind: 'tcp', port: 8080 };
const NO_PROBES = {};

let ctrd: ContainerdLab;
let noisyA: LabSandbox;
let noisyB: LabSandbox;
let victim: LabSandbox;
const servers: SandboxServer[] = [];
let kubelet: FakeKubelet;
let agent: AgentHandle;
let noisyClient: ProbeApiClient;
const hanging: Promise<unknown>[] = [];


function percentile(values: number[], p: number): number {
  const s = [...values].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] as number;
}

beforeAll(async () => {
  ctrd = await createContainerdLab();
  noisyA = await ctrd.runSandbox({ name: 'noisy-a', namespace: 'noisy' });
  noisyB = await ctrd.runSandbox({ name: 'noisy-b', namespace: 'noisy' });
  victim = await ctrd.runSandbox({ name: 'victim', namespace: 'victim' });
  for (const sb of [noisyA, noisyB, victim]) servers.push(await SandboxServer.start(sb, { http: 8080, hang: HANG }));
  kubelet = await FakeKubelet.start({
    pods: [podFor(noisyA, 'noisy', NO_PROBES), podFor(noisyB, 'noisy', NO_PROBES), podFor(victim, 'victim', NO_PROBES)],
  });
  agent = await startAgent({
    kubeletUrl: kubelet.httpUrl,
    resolvers: 'cri',
    args: [`--cri-endpoint=${ctrd.endpoint}`, `--netns-dir=${ctrd.netnsDir}`],
  });
  noisyClient = new ProbeApiClient(agent.socket);
  // The pods are known once the first poll is in: a probe of the victim answers.
  await until(async () => (await agent.client.probe({ pod: { uid: victim.uid }, handler: answeringTcp, timeoutSeconds: 1 })).result === 'success', 15_000, 'the victim pod known to the agent');
}, 90_000);

afterAll(async () => {
  noisyClient?.close();
  await agent?.stop('SIGKILL').catch(() => {});
  await kubelet?.stop();
  for (const s of servers) await s.stop();
  await ctrd?.destroy();
  void Promise.allSettled(hanging);
});

/** One burst of the victim's calls: how long each took and how it ended. */
interface Burst { probeMs: number[]; hookMs: number[]; probeOutcomes: string[]; hookOutcomes: string[] }

/** Victim: kubelet-like probes (1 s timeouts) and hooks (5 s), 56 calls at once, as the shim sends them. */
async function victimBurst(): Promise<Burst> {
  const probeMs: number[] = [];
  const hookMs: number[] = [];
  const timed = async <T>(into: number[], call: () => Promise<T>): Promise<T> => {
    const t = performance.now();
    try {
      return await call();
    } finally {
      into.push(performance.now() - t);
    }
  };
  const probes = Array.from({ length: 40 }, (_, i) =>
    timed(probeMs, () => agent.client.probe({ pod: { uid: victim.uid }, handler: i % 2 ? answering : answeringTcp, timeoutSeconds: 1, deadlineMs: 1000 + SHIM_GRACE_MS })));
  const hooks = Array.from({ length: 16 }, (_, i) =>
    timed(hookMs, () => agent.client.runLifecycleHandler({ pod: { uid: victim.uid }, hook: i % 2 ? 'preStop' : 'postStart', handler: { kind: 'http', port: 8080, path: '/healthz', scheme: 'HTTP', headers: [] }, timeoutSeconds: 5, deadlineMs: 5000 + SHIM_GRACE_MS })));
  const probeOutcomes = await Promise.all(probes.map((p) => p.then((o) => `${o.result}`, (e: unknown) => codeOfError(e))));
  const hookOutcomes = await Promise.all(hooks.map((p) => p.then((o) => `${o.result}`, (e: unknown) => codeOfError(e))));
  return { probeMs, hookMs, probeOutcomes, hookOutcomes };
}

const inFlight = async (): Promise<number> => sample((await agent.http('/metrics')).body, 'probe_agent_probes_in_flight') ?? 0;

describe('tenant fairness through the running agent', () => {
  it('64 hanging probes and 32 hanging hooks of one namespace leave another namespace\'s probes and hooks answered within their timeouts', async () => {
    // The victim's burst alone first: what it costs on this machine now, the yardstick below.
    const alone = await victimBurst();
    expect(alone.probeOutcomes).toEqual(Array(40).fill('success'));
    expect(alone.hookOutcomes).toEqual(Array(16).fill('success'));

    // Noisy: 32 probes and 16 hooks in each of its two pods.
    for (const sb of [noisyA, noisyB]) {
      for (let i = 0; i < 32; i++) {
        hanging.push(statusNameOf(noisyClient.probe({ pod: { uid: sb.uid }, handler: hangHttp, timeoutSeconds: HOUR, deadlineMs: HOUR * 1000 + SHIM_GRACE_MS })));
      }
      for (let i = 0; i < 16; i++) {
        hanging.push(statusNameOf(noisyClient.runLifecycleHandler({ pod: { uid: sb.uid }, hook: 'postStart', handler: { kind: 'http', port: HANG, path: '/', scheme: 'HTTP', headers: [] }, timeoutSeconds: HOUR })));
      }
    }
    await until(async () => (await inFlight()) >= 64, 20_000, '64 noisy probes in flight');
    // The hooks hold their connections to the hang port too (no metric of their own): give them a moment.
    await sleep(1000);

    // Victim: the same burst, while noisy hangs.
    const noisy = await victimBurst();
    const summary = (b: Burst): string =>
      `40 probes (timeout 1 s): p50 ${percentile(b.probeMs, 50).toFixed(0)} ms, p95 ${percentile(b.probeMs, 95).toFixed(0)} ms, max ${Math.max(...b.probeMs).toFixed(0)} ms; ` +
      `16 hooks (timeout 5 s): p50 ${percentile(b.hookMs, 50).toFixed(0)} ms, max ${Math.max(...b.hookMs).toFixed(0)} ms`;
    console.log(`victim namespace alone: ${summary(alone)}`);
    console.log(`victim namespace under a noisy one (64 hanging probes, 32 hanging hooks): ${summary(noisy)}`);
    expect(noisy.probeOutcomes).toEqual(Array(40).fill('success'));
    expect(noisy.hookOutcomes).toEqual(Array(16).fill('success'));
    // Success alone does not show fairness: a victim call may queue for a slot for up to its
    // deadline less its timeout (2 s, the shim's grace) and still succeed. So each victim call is
    // held to a bound against the noisy tenant's cost, generous rather than tight: 1.5 s for a
    // probe (its 1 s timeout and half again) and 5 s for a hook (its timeout), or 4x the slowest
    // call of the same burst without the noisy tenant just before (the machine's load, other
    // suites included, is in both), whichever is larger. Every noisy call holds its slot for an
    // hour: a victim that waited for one of them would be three orders of magnitude over, and one
    // queued behind them for most of its 2 s allowance is over too. Measured on the 2-core machine
    // at load average 18-33: alone, the slowest probe took 152-270 ms; with the noisy tenant,
    // 341-1098 ms (probes) and 268-977 ms (hooks).
    const bound = (floorMs: number, aloneMs: number[]): number => Math.max(floorMs, 4 * Math.max(...aloneMs));
    expect(Math.max(...noisy.probeMs), `victim probe latencies (ms): ${noisy.probeMs.map((x) => x.toFixed(0)).join(' ')}; alone: ${alone.probeMs.map((x) => x.toFixed(0)).join(' ')}`).toBeLessThan(bound(1500, alone.probeMs));
    expect(Math.max(...noisy.hookMs), `victim hook latencies (ms): ${noisy.hookMs.map((x) => x.toFixed(0)).join(' ')}; alone: ${alone.hookMs.map((x) => x.toFixed(0)).join(' ')}`).toBeLessThan(bound(5000, alone.hookMs));

    // Noisy pod a fills its per-pod share (64 probes); one more call that could not start before
    // its deadline is refused at once, and says why.
    for (let i = 0; i < 32; i++) {
      hanging.push(statusNameOf(noisyClient.probe({ pod: { uid: noisyA.uid }, handler: hangHttp, timeoutSeconds: HOUR, deadlineMs: HOUR * 1000 + SHIM_GRACE_MS })));
    }
    await until(async () => (await inFlight()) >= 96, 20_000, '96 noisy probes in flight');
    const t0 = performance.now();
    let refusal: unknown;
    try {
      await noisyClient.probe({ pod: { uid: noisyA.uid }, handler: hangHttp, timeoutSeconds: 5, deadlineMs: 5000 + SHIM_GRACE_MS });
    } catch (err) {
      refusal = err;
    }
    console.log(`noisy pod at its cap: one more probe refused in ${(performance.now() - t0).toFixed(0)} ms: ${String((refusal as Error)?.message)}`);
    expect(refusal).toBeInstanceOf(ApiError);
    expect(grpc.status[(refusal as ApiError).grpcCode]).toBe('RESOURCE_EXHAUSTED');
    expect((refusal as ApiError).message).toMatch(/pod is at its limit.*later than this call can wait/);
    // The noisy calls are still held (none was cut short by the victim's traffic or the refusal).
    expect(await inFlight()).toBeGreaterThanOrEqual(96);
  }, 120_000);
});

function codeOfError(e: unknown): string {
  return e instanceof ApiError ? `${grpc.status[e.grpcCode]}: ${e.message}` : `thrown: ${String(e)}`;
}
