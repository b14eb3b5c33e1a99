/**
 * Rewritten probes through the kubelet shim, end to end on real parts: a kubelet-shaped ExecSync
 * (grpc-js, kubelet's deadline) to the shim, the shim to the real agent (`probe-agent run` with
 * the CRI resolver), the agent into the sandbox netns of a real containerd pod, against a real
 * server there. A guard table in the pod counts every new TCP connection: from the pod's own
 * netns (lo) it is let through, from anywhere else (the node) it is dropped. Every mapping of
 * the answer (agent/api/exec-sync.ts, relayed by the shim) is checked against what kubelet's exec prober makes of it; the
 * agent slow, killed and restarted never disturbs ordinary CRI calls.
 */
import { connectFromNode } from '../lab/net.ts';
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'nsenter', 'containerd', 'ctr', 'dpkg-deb']);

import { symlinkSync, unlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import { shimSocketBeside } from '../../agent/contract/shim-socket.ts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { encodeShimCommand, SHIM_COMMAND_PATH, type ShimKind } from '../../agent/contract/shim-command.ts';
import type { CriShim } from '../../agent/shim/proxy.ts';
import type { ContainerdLab, LabContainer, LabSandbox } from '../lab/containerd.ts';
import { startAgent, type AgentHandle } from '../support/agent-harness.ts';
import { KubeletCri, type CriAnswer } from '../support/kubelet-cri.ts';
import { shimLogSink } from '../support/log-check.ts';
import { ShimLab } from '../support/shim-lab.ts';

const NS = 'shim-e2e';
const HTTP = 8080;
const GRPC = 9090;
const GUARD = 'pa_shim_guard';

let lab: ShimLab;
let ctrd: ContainerdLab;
let agent: AgentHandle | undefined;
let scratch: string;
let shim: CriShim;
let k: KubeletCri;
let pod: LabSandbox;
let app: LabContainer;
/** The shim's --probe-socket: a link to the running agent's socket, so a restarted agent appears at the same path. */
let probeLink: string;

async function guard(sb: LabSandbox): Promise<void> {
  const file = path.join(scratch, 'guard.nft');
  writeFileSync(file, `table inet ${GUARD} {
  counter inside {}
  counter outside {}
  chain input {
    type filter hook input priority 0; policy accept;
    meta l4proto tcp ct state new iifname "lo" counter name "inside" accept
    meta l4proto tcp ct state new counter name "outside" drop
  }
}
`);
  const r = await ctrd.exec(sb, 'nft', ['-f', file]);
  if (r.code !== 0) throw new Error(`nft in sandbox: ${r.stderr}`);
}

async function counted(name: 'inside' | 'outside'): Promise<number> {
  const r = await ctrd.exec(pod, 'nft', ['-j', 'list', 'counter', 'inet', GUARD, name]);
  const items = (JSON.parse(r.stdout) as { nftables: { counter?: { packets: number } }[] }).nftables;
  return items.find((i) => i.counter)?.counter?.packets ?? -1;
}

/**
 * The counter once nothing more is arriving: a SYN the node sent in an earlier test can still be
 * retransmitted after that test gave up, and must not count against the next one.
 */
async function settled(name: 'inside' | 'outside'): Promise<number> {
  let last = await counted(name);
  for (;;) {
    await new Promise((r) => setTimeout(r, 1100));
    const now = await counted(name);
    if (now === last) return now;
    last = now;
  }
}


/** The shim's log lines, checked when the file ends; each test lists the warnings it provokes. */
const shimLogs = shimLogSink('shim (shim-probes)');

async function startTheAgent(): Promise<AgentHandle> {
  const a = await startAgent(lab.agentOptions());
  lab.agent = a;
  // Both of the agent's sockets, where the shim finds them (its own beside --probe-socket).
  for (const [target, link] of [[a.socket, probeLink], [a.shimSocket, shimSocketBeside(probeLink)]] as const) {
    try {
      unlinkSync(link);
    } catch {
      // first start
    }
    symlinkSync(target, link);
  }
  return a;
}

/** kubelet's exec probe, as kubelet makes it: the rewritten command, timeout = timeoutSeconds. */
function probe(kind: ShimKind, handler: Record<string, unknown>, timeoutSeconds = 1, containerId = app.id): Promise<CriAnswer<{ stdout: Buffer; stderr: Buffer; exitCode: number }>> {
  return k.execSync(containerId, encodeShimCommand(kind, handler), timeoutSeconds);
}

function exit(a: CriAnswer<{ stdout: Buffer; exitCode: number }>): { exitCode: number; stdout: string } {
  if (!a.ok) throw new Error(`expected an exit code, got gRPC ${grpc.status[a.code]}: ${a.details}`);
  return { exitCode: a.msg.exitCode, stdout: a.msg.stdout.toString() };
}

function grpcError(a: CriAnswer): { code: grpc.status; details: string } {
  if (a.ok) throw new Error(`expected a gRPC error, got an answer: ${JSON.stringify(a.msg)}`);
  return { code: a.code, details: a.details };
}

beforeAll(async () => {
  lab = await ShimLab.start('shim-e2e-');
  ({ ctrd, scratch } = lab);
  probeLink = path.join(scratch, 'probe.sock');
  let spec: Record<string, unknown>;
  ({ pod, app, spec } = await lab.appPod({ namespace: NS, server: { http: HTTP, grpc: GRPC }, port: HTTP, beforeServer: guard }));
  // The pod as the rewrite leaves it: its readiness probe is probe-agent's exec command (on-demand mode).
  const container = (spec.spec as { containers: Record<string, unknown>[] }).containers[0]!;
  container.readinessProbe = { exec: { command: encodeShimCommand('readiness', { httpGet: { path: '/healthz', port: HTTP } }) }, periodSeconds: 1, timeoutSeconds: 1 };
  await lab.startKubelet([spec]);
  agent = await startTheAgent();
  shim = await lab.startShim({ probeSocket: probeLink, agentGraceMs: 1000, hookAgentWaitMs: 1500, log: shimLogs.log });
  k = lab.client(new KubeletCri(shim.config.listenPath));
}, 90_000);

afterAll(() => lab?.stop());

describe('rewritten probes answered inside the pod netns, the node->pod path dropped', () => {
  it('the node cannot reach the pod (the hole is closed)', async () => {
    const before = await counted('outside');
    // A socket destroyed after 1.5 s: fetch would leave its connect running in the pool,
    // retransmitting SYNs into the next test's packet counts.
    expect((await connectFromNode(pod.ipv4, HTTP, 1500)).result).not.toBe('connected');
    expect(await counted('outside')).toBeGreaterThan(before);
  });

  it('success, failure, warning, tcp and grpc probes map to the exit codes kubelet reads, with zero packets from the node', async () => {
    const outside = await settled('outside');
    const inside = await counted('inside');

    const ok = exit(await probe('readiness', { httpGet: { path: '/healthz', port: HTTP } }));
    expect(ok.exitCode).toBe(0);

    const named = exit(await probe('liveness', { httpGet: { path: '/healthz', port: 'http' } }));
    expect(named.exitCode).toBe(0);

    const failed = exit(await probe('liveness', { httpGet: { path: '/status/500', port: HTTP } }));
    expect(failed.exitCode).not.toBe(0);
    expect(failed.stdout).toMatch(/HTTP probe failed with statuscode: 500/);

    const warned = exit(await probe('readiness', { httpGet: { path: '/redirect', port: HTTP, httpHeaders: [{ name: 'X-Probe', value: '$(NOT_EXPANDED)' }] } }));
    // /redirect without ?to= answers 400: the header with "$(" travelled intact, the probe failed on the status.
    expect(warned.exitCode).not.toBe(0);
    const redirect = exit(await probe('startup', { httpGet: { path: '/redirect?to=http://elsewhere.invalid/&code=302', port: HTTP } }));
    expect(redirect.exitCode).toBe(0);
    expect(redirect.stdout).toMatch(/redirect/i);

    expect(exit(await probe('liveness', { tcpSocket: { port: HTTP } })).exitCode).toBe(0);
    const refused = exit(await probe('liveness', { tcpSocket: { port: 1 } }));
    expect(refused.exitCode).not.toBe(0);
    expect(refused.stdout).toMatch(/refused/);
    expect(exit(await probe('readiness', { grpc: { port: GRPC } })).exitCode).toBe(0);

    expect(await counted('outside')).toBe(outside);
    expect(await counted('inside')).toBeGreaterThan(inside);
  });

  it('the agent records what kubelet ran through the shim as the rewritten probe\'s status (on-demand mode), without probing it on its own', async () => {
    const before = await counted('inside');
    // No timer traffic for the rewritten probe (period 1 s): nothing reaches the pod while nobody calls the shim.
    await new Promise((r) => setTimeout(r, 1500));
    expect(await counted('inside')).toBe(before);
    expect(exit(await probe('readiness', { httpGet: { path: '/healthz', port: HTTP } })).exitCode).toBe(0);
    const statuses = await agent!.waitForStatuses((all) => all.some((x) => x.podName === 'web' && x.key.probeType === 'Readiness' && x.result === 'success' && x.lastProbeTime > 0));
    const st = statuses.find((x) => x.podName === 'web' && x.key.probeType === 'Readiness')!;
    expect(st.ready).toBe(true);
  });

  it('a target that times out is a Failure by exit code, never gRPC DEADLINE_EXCEEDED', async () => {
    const a = await probe('liveness', { httpGet: { path: '/slow?ms=3000', port: HTTP } }, 1);
    const r = exit(a);
    expect(r.exitCode).not.toBe(0);
    expect(r.stdout).toMatch(/timeout|deadline|Timeout/);
  });
});

describe('rewritten HTTP/TCP hooks (kubelet sends exec hooks with timeout 0)', () => {
  it('a postStart httpGet hook runs inside the netns: exit 0; a refused one: a non-zero exit kubelet counts as a failed hook', async () => {
    const outside = await settled('outside');
    const ok = exit(await k.execSync(app.id, encodeShimCommand('postStart', { httpGet: { path: '/echo', port: HTTP } }), 0));
    expect(ok.exitCode).toBe(0);
    const stop = exit(await k.execSync(app.id, encodeShimCommand('preStop', { httpGet: { path: '/healthz', port: 'http' } }), 0));
    expect(stop.exitCode).toBe(0);
    const refused = exit(await k.execSync(app.id, encodeShimCommand('postStart', { httpGet: { path: '/', port: 1 } }), 0));
    expect(refused.exitCode).not.toBe(0);
    expect(refused.stdout).toMatch(/refused/);
    expect(await counted('outside')).toBe(outside);
  });

  it('a hook for an unknown container: NOT_FOUND (a failed hook for kubelet, nothing crashes)', async () => {
    shimLogs.expect({ level: 'warn', msg: 'rewritten handler not run', line: /"code":5,.*is not known on this node/, why: 'a hook for a container the node does not have, on purpose' });
    const e = grpcError(await k.execSync('e'.repeat(64), encodeShimCommand('preStop', { httpGet: { path: '/', port: HTTP } }), 0));
    expect(e.code).toBe(grpc.status.NOT_FOUND);
  });
});

describe('answers kubelet discards (gRPC errors, never DEADLINE_EXCEEDED)', () => {
  it('an unknown container: NOT_FOUND', async () => {
    shimLogs.expect({ level: 'warn', msg: 'rewritten handler not run', line: /"code":5,.*is not known on this node/, why: 'a probe of a container the node does not have, on purpose' });
    const e = grpcError(await probe('readiness', { httpGet: { path: '/healthz', port: HTTP } }, 1, 'f'.repeat(64)));
    expect(e.code).toBe(grpc.status.NOT_FOUND);
    expect(e.details).toMatch(/not known on this node/);
  });

  it('a port name the container does not have: a gRPC error', async () => {
    shimLogs.expect({ level: 'warn', msg: 'rewritten handler not run', line: /no-such-port/, why: 'a probe of a port name the container does not have, on purpose' });
    agent!.expectLogs({ level: 'warn', msg: 'probe errored; result kept', line: /"reason":"port-unresolved".*no-such-port/, why: 'the same probe, recorded by the agent as the rewritten probe\'s status' });
    const e = grpcError(await probe('readiness', { httpGet: { path: '/healthz', port: 'no-such-port' } }));
    expect(e.code).not.toBe(grpc.status.DEADLINE_EXCEEDED);
    expect(e.details).toMatch(/no-such-port/);
  });

  it.each([
    ['wrong arity', [SHIM_COMMAND_PATH, 'readiness']],
    ['unknown kind', [SHIM_COMMAND_PATH, 'sideways', 'e30']],
    ['not base64url', [SHIM_COMMAND_PATH, 'readiness', '***']],
    ['not JSON', [SHIM_COMMAND_PATH, 'readiness', Buffer.from('{nope').toString('base64url')]],
    ['no network action', [SHIM_COMMAND_PATH, 'readiness', Buffer.from(JSON.stringify({ exec: { command: ['true'] } })).toString('base64url')]],
    ['a port of the wrong type', [SHIM_COMMAND_PATH, 'liveness', Buffer.from(JSON.stringify({ tcpSocket: { port: { x: 1 } } })).toString('base64url')]],
    ['a grpc hook', [SHIM_COMMAND_PATH, 'postStart', Buffer.from(JSON.stringify({ grpc: { port: 1 } })).toString('base64url')]],
  ])('a malformed command (%s): INVALID_ARGUMENT with the reason', async (_name, cmd) => {
    shimLogs.expect({ level: 'warn', msg: 'rewritten handler not run', line: /"code":3,"error":"probe-agent: invalid rewritten command: /, why: 'malformed commands, on purpose' });
    const e = grpcError(await k.execSync(app.id, cmd as string[], 1));
    expect(e.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(e.details).toMatch(/^probe-agent: invalid rewritten command: /);
  });

  it("a handler the agent's validation refuses (a port out of range): INVALID_ARGUMENT naming the field", async () => {
    shimLogs.expect({ level: 'warn', msg: 'rewritten handler not run', line: /"code":3,"error":"probe-agent: invalid rewritten command: handler\.tcpSocket\.port: .*70000/, why: 'a port out of range, refused by the agent, on purpose' });
    const e = grpcError(await probe('liveness', { tcpSocket: { port: 70000 } }));
    expect(e.code).toBe(grpc.status.INVALID_ARGUMENT);
  });
});

describe('the agent slow, down and restarted', () => {
  async function ordinaryCallsWork(): Promise<void> {
    const list = await k.call<{ containers: { id: string }[] }>('ListContainers', {});
    expect(list.ok && list.msg.containers.some((c) => c.id === app.id)).toBe(true);
    const exec = await k.execSync(app.id, ['/bin/echo', 'still here'], 2);
    expect(exec.ok && exec.msg.stdout.toString()).toBe('still here\n');
  }

  it('a stopped (hung) agent: the probe gets UNAVAILABLE after timeout + grace, ordinary calls meanwhile are unaffected', async () => {
    shimLogs.expect({ level: 'warn', msg: 'rewritten handler not run', line: /"code":14,"error":"probe-agent did not run the readiness probe: .*did not answer/, why: 'the agent is stopped (SIGSTOP) on purpose' });
    process.kill(agent!.pid, 'SIGSTOP');
    try {
      const pending = probe('readiness', { httpGet: { path: '/healthz', port: HTTP } }, 1);
      // Ordinary calls while the probe waits on the hung agent.
      for (let i = 0; i < 5; i++) await ordinaryCallsWork();
      const e = grpcError(await pending);
      expect(e.code).toBe(grpc.status.UNAVAILABLE);
      expect(e.details).toMatch(/did not answer/);
    } finally {
      process.kill(agent!.pid, 'SIGCONT');
    }
    expect(exit(await probe('readiness', { httpGet: { path: '/healthz', port: HTTP } })).exitCode).toBe(0);
  });

  it('a dead agent: UNAVAILABLE at once for probes, a failed hook after the wait, ordinary calls unaffected; a restarted agent is used again', async () => {
    shimLogs.expect({ level: 'warn', msg: 'rewritten handler not run', line: /"code":14,"error":"probe-agent did not run the (liveness probe|preStop hook): /, why: 'the agent is killed on purpose' });
    await agent!.stop('SIGKILL');
    agent = undefined;
    const e = grpcError(await probe('liveness', { tcpSocket: { port: HTTP } }));
    expect(e.code).toBe(grpc.status.UNAVAILABLE);
    expect(e.details).toMatch(/probe-agent/);
    await ordinaryCallsWork();
    const hook = grpcError(await k.execSync(app.id, encodeShimCommand('preStop', { httpGet: { path: '/healthz', port: HTTP } }), 0));
    expect(hook.code).toBe(grpc.status.UNAVAILABLE);
    agent = await startTheAgent();
    expect(exit(await probe('liveness', { tcpSocket: { port: HTTP } })).exitCode).toBe(0);
    expect(shim.stats.intercepted).toBeGreaterThan(10);
  });
});
