/**
 * One namespace's hanging rewritten probes never hold another namespace's (issue 31, item 3): the
 * fair limiter, not an HTTP/2 stream cap on the shim->agent connection, decides who waits.
 *
 * Real parts end to end: kubelet's side is grpc-go (build/grpc-go-peer, two ClientConns as two
 * kubelet connections), the shim (CriShim over the lab's containerd), the real agent (`probe-agent
 * run`, default limits, CRI resolver), and real containerd pods with a server in their netns.
 * Namespace "noisy" (5 pods) sends NOISY readiness probes with timeoutSeconds 3600 against a port
 * that accepts and never answers: more than the 256 streams an agent connection used to allow,
 * and enough to put the namespace at its own cap (256 in flight). Namespace "victim" then sends
 * its readiness probes (timeoutSeconds 1) on a second grpc-go connection, and a postStart hook:
 * every one is answered within its timeout plus the shim's grace, with the agent's own verdict.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nsenter', 'containerd', 'ctr', 'dpkg-deb']);
import { requireGrpcGoPeer } from '../support/grpc-go-cri.ts';
requireGrpcGoPeer();

import { rmSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { encodeShimCommand } from '../../agent/contract/shim-command.ts';
import { CriShim } from '../../agent/shim/proxy.ts';
import { BUSYBOX_IMAGE_REF, importBusyboxImage } from '../lab/busybox-image.ts';
import { createContainerdLab, type ContainerdLab, type LabContainer, type LabSandbox } from '../lab/containerd.ts';
import { labScratch } from '../lab/slots.ts';
import { SandboxServer } from '../soak/sandbox-server.ts';
import { startAgent, type AgentHandle } from '../support/agent-harness.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { GrpcGoCri } from '../support/grpc-go-cri.ts';
import { shimLogSink } from '../support/log-check.ts';
import { makePod } from '../support/pod-factory.ts';

const HTTP = 8080;
const HANG = 9999;
const NOISY_PODS = 5;
/** Rewritten probes the noisy namespace keeps hanging: above the old 256-stream cap of one connection. */
const NOISY = Number(process.env['FAIR_LANES_NOISY'] ?? 300);
/** The namespace's cap (probe-agent run --max-probes-per-namespace default). */
const NS_CAP = 256;
const VICTIM_PROBES = 12;
const HOOK_WAIT_MS = 20_000;
/** The shim's --agent-grace default: the agent gets a probe's timeout plus this. */
const SHIM_GRACE_MS = 2000;

let ctrd: ContainerdLab;
let kubelet: FakeKubelet;
let agent: AgentHandle;
let scratch: string;
let shim: CriShim;
const servers: SandboxServer[] = [];
const noisy: { sb: LabSandbox; app: LabContainer }[] = [];
let victim: { sb: LabSandbox; app: LabContainer };
let noisyPeer: GrpcGoCri;
let victimPeer: GrpcGoCri;
const hanging: Promise<unknown>[] = [];

const shimLogs = shimLogSink('shim (shim-fair-lanes)', [
  { level: 'warn', msg: 'rewritten handler not run', line: /namespace noisy|noisy-\d|namespace queue full|probe refused/, why: 'the noisy namespace beyond its own cap is refused at once, as it should be' },
]);

async function podWithApp(name: string, namespace: string): Promise<{ sb: LabSandbox; app: LabContainer }> {
  const sb = await ctrd.runSandbox({ name, namespace });
  const app = await ctrd.runContainer(sb, { name: 'app', image: BUSYBOX_IMAGE_REF, command: ['/bin/sleep', 'infinity'] });
  servers.push(await SandboxServer.start(sb, { http: HTTP, hang: HANG }));
  return { sb, app };
}

function specOf(p: { sb: LabSandbox; app: LabContainer }, namespace: string): Record<string, unknown> {
  return makePod({ uid: p.sb.uid, name: p.sb.name, namespace, ips: p.sb.ips, probe: 'none', port: HTTP, containerID: `containerd://${p.app.id}` });
}

async function inFlight(): Promise<number> {
  const m = /^probe_agent_probes_in_flight (\d+)/m.exec((await agent.http('/metrics')).body);
  return m ? Number(m[1]) : -1;
}

beforeAll(async () => {
  ctrd = await createContainerdLab();
  importBusyboxImage(ctrd.socket);
  scratch = labScratch('fair-lanes-');
  for (let i = 0; i < NOISY_PODS; i++) noisy.push(await podWithApp(`noisy-${i}`, 'noisy'));
  victim = await podWithApp('victim', 'victim');
  kubelet = await FakeKubelet.start({ pods: [...noisy.map((p) => specOf(p, 'noisy')), specOf(victim, 'victim')] });
  agent = await startAgent({
    kubeletUrl: kubelet.httpUrl,
    resolvers: 'cri',
    args: [`--cri-endpoint=${ctrd.endpoint}`, `--netns-dir=${ctrd.netnsDir}`],
  });
  shim = new CriShim({ listenPath: path.join(scratch, 'cri.sock'), runtimeSocket: ctrd.socket, probeSocket: agent.socket, log: shimLogs.log });
  await shim.listen();
  noisyPeer = new GrpcGoCri(shim.config.listenPath);
  victimPeer = new GrpcGoCri(shim.config.listenPath);
}, 180_000);

afterAll(async () => {
  // The shim first: kubelet's hanging calls end with it (cancelled), none is left waiting for an agent.
  await shim?.close(100);
  await agent?.stop('SIGKILL').catch(() => {});
  await noisyPeer?.close(5000);
  await victimPeer?.close(5000);
  await Promise.allSettled(hanging);
  await kubelet?.stop();
  for (const s of servers) await s.stop();
  await ctrd?.destroy();
  if (scratch) rmSync(scratch, { recursive: true, force: true });
}, 60_000);

describe('fair lanes between the shim and the agent', () => {
  it(`a namespace holding its whole share (${NOISY} hanging 1 h readiness probes) delays no other namespace's rewritten probe or hook`, async () => {
    // Warm up: the victim's probe answers before the attack (and its container is known to the agent).
    const warm = await victimPeer.execSync(victim.app.id, encodeShimCommand('readiness', { httpGet: { path: '/healthz', port: HTTP } }), 1);
    expect(warm.ok ? warm.msg.exitCode : warm.details).toBe(0);

    const hangCmd = encodeShimCommand('readiness', { httpGet: { path: '/', port: HANG } });
    const noisyAnswers: { ok: boolean; code?: number; details?: string }[] = [];
    for (let i = 0; i < NOISY; i++) {
      const p = noisy[i % NOISY_PODS]!;
      hanging.push(noisyPeer.execSync(p.app.id, hangCmd, 3600).then((a) => void noisyAnswers.push(a.ok ? { ok: true } : { ok: false, code: a.code, details: a.details })));
    }
    // The noisy namespace reaches its cap: the limiter holds NS_CAP of its probes; the rest were refused at once.
    const until = Date.now() + 60_000;
    let held = await inFlight();
    while (held < NS_CAP && Date.now() < until) {
      await new Promise((r) => setTimeout(r, 250));
      held = await inFlight();
    }
    expect(held).toBe(NS_CAP);
    // The victim: its probes and a hook, on a second kubelet connection, answered by the agent in time.
    const victimCmd = encodeShimCommand('readiness', { httpGet: { path: '/healthz', port: HTTP } });
    const results: { ms: number; exit: number | string }[] = [];
    for (let i = 0; i < VICTIM_PROBES; i++) {
      const started = performance.now();
      const a = await victimPeer.execSync(victim.app.id, victimCmd, 1);
      results.push({ ms: Math.round(performance.now() - started), exit: a.ok ? a.msg.exitCode : `gRPC ${a.code}: ${a.details}` });
    }
    const hookStarted = performance.now();
    // Kubelet sends a hook with no deadline; the test stops waiting after HOOK_WAIT_MS to report.
    const hook = await Promise.race([
      victimPeer.execSync(victim.app.id, encodeShimCommand('postStart', { httpGet: { path: '/healthz', port: HTTP } }), 0),
      new Promise<{ ok: false; code: number; details: string }>((r) => setTimeout(() => r({ ok: false, code: -1, details: `no answer in ${HOOK_WAIT_MS} ms` }), HOOK_WAIT_MS)),
    ]);
    const hookMs = Math.round(performance.now() - hookStarted);
    console.log(`fair lanes: noisy held ${held}, refused ${noisyAnswers.length}; victim probes (ms, exit): ${JSON.stringify(results)}; hook ${hookMs} ms: ${hook.ok ? `exit ${hook.msg.exitCode}` : hook.details}`);
    for (const r of results) {
      expect(r.exit).toBe(0);
      // A loose bound (the issue's): within the probe's own timeout plus the shim's grace.
      expect(r.ms).toBeLessThan(1000 + SHIM_GRACE_MS);
    }
    expect(hook.ok ? hook.msg.exitCode : `gRPC ${hook.code}: ${hook.details}`).toBe(0);
    await new Promise((r) => setTimeout(r, 500));
    // Every noisy call beyond the cap got an answer: the limiter's refusal, which names why.
    expect(noisyAnswers.length).toBe(NOISY - NS_CAP);
    for (const a of noisyAnswers) {
      expect(a.ok).toBe(false);
      expect(a.details).toMatch(/refused/);
    }

    // The noisy probes still hang (nothing cut them to make room).
    expect(await inFlight()).toBeGreaterThanOrEqual(NS_CAP);
  }, 240_000);
});
