/**
 * An agent restart (a DaemonSet rollout: SIGTERM, the old pod gone, the new one starting) fails no
 * rewritten call kubelet made (issue 31, item 9). Real parts: kubelet's side is grpc-go
 * (build/grpc-go-peer), the shim runs as its own process (`probe-agent shim`), the agent is
 * `probe-agent run` with the CRI resolver, the pod a real containerd sandbox with a server in its
 * netns. The shim's --probe-socket is a link to the running agent's socket, as the DaemonSet's
 * hostPath socket is: during the gap it leads nowhere.
 *
 * While a slow postStart hook runs and readiness probes keep coming (as kubelet's workers send
 * them, one at a time each), the agent gets SIGTERM; once it has exited, and a moment later, a new
 * agent starts. No call is answered as a failure: the hook in flight finishes on the old agent (its
 * drain), the hooks sent while it drained or while no agent was there are answered by the new one,
 * and a probe with no agent to run it gets UNAVAILABLE, which kubelet discards (an errored probe
 * is never a failure), never a non-zero exit code.
 *
 * An upgrade between an agent without the shim's own socket (only its ProbeService socket is
 * linked, as an agent from before that socket has) and one with it, either way, answers every
 * call: the shim falls back to the ProbeService socket while its own is absent.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nsenter', 'containerd', 'ctr', 'dpkg-deb']);
import { requireGrpcGoPeer } from '../support/grpc-go-cri.ts';
requireGrpcGoPeer();

import { existsSync, symlinkSync, unlinkSync } from 'node:fs';
import path from 'node:path';
import { shimSocketBeside } from '../../agent/contract/shim-socket.ts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { encodeShimCommand } from '../../agent/contract/shim-command.ts';
import type { ContainerdLab, LabContainer } from '../lab/containerd.ts';
import { startAgent, type AgentHandle } from '../support/agent-harness.ts';
import { REPO } from '../support/built-cli.ts';
import { GrpcGoCri } from '../support/grpc-go-cri.ts';
import { ShimLab } from '../support/shim-lab.ts';
import { startShimProcess, type ShimProcess } from '../support/shim-process.ts';

const HTTP = 8080;
/** How long the in-flight postStart hook's target takes to answer. */
const SLOW_HOOK_MS = 4000;
/** Probe workers (each sends its next probe once the last one is answered, as kubelet's do). */
const PROBE_LOOPS = 3;
/** Between the old agent's exit and the new one's start: the rollout's gap. */
const GAP_MS = 1500;

let lab: ShimLab;
let ctrd: ContainerdLab;
let scratch: string;
let probeLink: string;
let app: LabContainer;
let shim: ShimProcess;
let peer: GrpcGoCri;
const agents: AgentHandle[] = [];

/** Starts an agent and links its sockets where the shim finds them; without the shim's socket it looks like an agent from before that socket. */
async function startTheAgent(withShimSocket = true): Promise<AgentHandle> {
  const a = await startAgent(lab.agentOptions());
  agents.push(a);
  lab.client({ close: () => a.stop('SIGKILL').catch(() => {}) });
  // Its own socket beside --probe-socket, as the shim looks for it.
  for (const [target, link] of [[a.socket, probeLink], [withShimSocket ? a.shimSocket : undefined, shimSocketBeside(probeLink)]] as const) {
    try {
      unlinkSync(link);
    } catch {
      // first start
    }
    if (target !== undefined) symlinkSync(target, link);
  }
  return a;
}

beforeAll(async () => {
  lab = await ShimLab.start('agent-restart-');
  ({ ctrd, scratch } = lab);
  probeLink = path.join(scratch, 'probe.sock');
  let spec: Record<string, unknown>;
  ({ app, spec } = await lab.appPod({ namespace: 'rollout', server: { http: HTTP }, port: HTTP }));
  await lab.startKubelet([spec]);
  await startTheAgent();
  shim = await startShimProcess(path.join(REPO, 'agent/cli.ts'), path.join(scratch, 'cri.sock'), [
    `--runtime-endpoint=unix://${ctrd.socket}`, `--probe-socket=${probeLink}`, `--metrics-socket=${path.join(scratch, 'shim-metrics.sock')}`,
  ]);
  lab.client({ close: () => shim.stop() });
  peer = new GrpcGoCri(shim.listenPath);
  lab.client({ close: () => peer.close(5000) });
}, 120_000);

afterAll(() => lab?.stop(), 60_000);

describe('an agent rollout under load', () => {
  it('fails no hook and no probe: the hook in flight finishes, hooks in the gap run on the new agent, probes error at worst', async () => {
    const probeCmd = encodeShimCommand('readiness', { httpGet: { path: '/healthz', port: HTTP } });
    const hookCmd = (ms: number): string[] => encodeShimCommand('postStart', { httpGet: { path: `/slow?ms=${ms}`, port: HTTP } });
    const answers: { what: string; at: number; ms: number; outcome: string }[] = [];
    const t0 = Date.now();
    const call = async (what: string, cmd: string[], timeout: number): Promise<void> => {
      const at = Date.now() - t0;
      const a = await peer.execSync(app.id, cmd, timeout);
      answers.push({ what, at, ms: Date.now() - t0 - at, outcome: a.ok ? `exit ${a.msg.exitCode}` : `gRPC ${a.code}: ${a.details}` });
    };
    expect((await peer.execSync(app.id, probeCmd, 1)).ok).toBe(true);

    let rolling = true;
    const loops = Array.from({ length: PROBE_LOOPS }, async () => {
      while (rolling) {
        await call('probe', probeCmd, 1);
        await new Promise((r) => setTimeout(r, 100));
      }
    });
    const hooks: Promise<void>[] = [call('hook in flight', hookCmd(SLOW_HOOK_MS), 0)];
    await new Promise((r) => setTimeout(r, 800));

    // The rollout: SIGTERM; a hook sent while the old agent drains; the old agent gone; the gap; the new agent.
    shim.expectLogs({ level: 'warn', msg: 'rewritten handler not run', line: /readiness probe.*(ENOENT|ECONNREFUSED|shutting down|GOAWAY|broke)/,
      why: 'a probe sent while no agent was there (the rollout\'s gap) is answered UNAVAILABLE, and the shim says so' });
    const old = agents[0]!;
    const exited = old.stop('SIGTERM', 30_000);
    await new Promise((r) => setTimeout(r, 200));
    hooks.push(call('hook while draining', hookCmd(0), 0));
    expect(await exited).toBe(0);
    hooks.push(call('hook in the gap', hookCmd(0), 0));
    await new Promise((r) => setTimeout(r, GAP_MS));
    const gapEnd = Date.now() - t0;
    await startTheAgent();
    const upAt = Date.now() - t0;
    await new Promise((r) => setTimeout(r, 1500));
    rolling = false;
    await Promise.all([...loops, ...hooks]);

    const inGap = answers.filter((a) => a.what === 'probe' && a.at + a.ms > gapEnd - GAP_MS && a.at < upAt);
    // A failure is what kubelet acts on: a non-zero exit, or a probe's deadline (kubelet's timeout).
    // UNAVAILABLE for a probe is an error kubelet throws away; for a hook it would fail the hook.
    const failed = answers.filter((a) => a.outcome !== 'exit 0' && (a.what !== 'probe' || !a.outcome.startsWith('gRPC 14:')));
    console.log(`agent restart: new agent up at ${upAt} ms; ${answers.length} calls, ${inGap.length} probes sent before it was up; ` +
      `hooks ${JSON.stringify(answers.filter((a) => a.what !== 'probe'))}; ${failed.length} failed, first: ${JSON.stringify(failed.slice(0, 3))}`);
    expect({ failed: failed.length, first: failed.slice(0, 3) }).toEqual({ failed: 0, first: [] });
    expect(answers.filter((a) => a.what.startsWith('hook')).length).toBe(3);
    // Probes were made while no agent was there; after it, every probe was answered by the agent again.
    expect(inGap.length).toBeGreaterThan(0);
    expect(answers.filter((a) => a.what === 'probe' && a.at > upAt + 500).every((a) => a.outcome === 'exit 0')).toBe(true);
  }, 180_000);

  it('an upgrade either way between an agent without the shim\'s socket and one with it: every probe and hook answered exit 0', async () => {
    const probeCmd = encodeShimCommand('readiness', { httpGet: { path: '/healthz', port: HTTP } });
    const hookCmd = encodeShimCommand('postStart', { httpGet: { path: '/slow?ms=0', port: HTTP } });
    const outcomes = async (): Promise<string[]> => {
      const out: string[] = [];
      for (const [cmd, timeout] of [[probeCmd, 1], [probeCmd, 1], [hookCmd, 0], [probeCmd, 1]] as const) {
        const a = await peer.execSync(app.id, [...cmd], timeout);
        out.push(a.ok ? `exit ${a.msg.exitCode}` : `gRPC ${a.code}: ${a.details}`);
      }
      return out;
    };
    const replace = async (withShimSocket: boolean): Promise<void> => {
      const running = agents.filter((a) => a.proc.exitCode === null && a.proc.signalCode === null);
      for (const a of running) expect(await a.stop('SIGTERM', 30_000)).toBe(0);
      await startTheAgent(withShimSocket);
      // Its first pod list (the first test's rollout gives it as long).
      await new Promise((r) => setTimeout(r, 1000));
    };
    const phases: Record<string, string[]> = {};
    // Down: the shim finds nothing on its own socket and reaches the agent on the ProbeService socket.
    await replace(false);
    expect(existsSync(shimSocketBeside(probeLink))).toBe(false);
    phases['without'] = await outcomes();
    await replace(true);
    phases['with'] = await outcomes();
    await replace(false);
    phases['without again'] = await outcomes();
    const ok = ['exit 0', 'exit 0', 'exit 0', 'exit 0'];
    expect(phases).toEqual({ without: ok, with: ok, 'without again': ok });
  }, 180_000);
});
