/**
 * HTTP lifecycle hooks with kubelet's semantics (agent/probe/lifecycle.ts) inside a lab pod's netns,
 * against a real server that records every request, behind the lab's node->pod drop rule: every
 * outcome kubelet distinguishes, then RunLifecycleHandler over the daemon's real socket, then the
 * `probe-agent hook` command's exit codes.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'openssl']);

import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync, symlinkSync, unlinkSync } from 'node:fs';
import * as http2 from 'node:http2';
import * as net from 'node:net';
import { encodeFrame } from '../../agent/grpc/frame.ts';
import { execSyncRequest } from '../support/relay-harness.ts';
import { DRAINING_DETAIL, NOT_STARTED_DRAINING, NOT_STARTED_TRAILER } from '../../agent/contract/hook-refusal.ts';
import path from 'node:path';
import { promisify } from 'node:util';
import * as grpc from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApiError } from '../../agent/api/client.ts';
import { ResidentHelper } from '../../agent/netns/helper.ts';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { runLifecycleHandler, type HookContext, type HookOutcome, type LifecycleHandlerSpec } from '../../agent/probe/lifecycle.ts';
import type { HttpGetHandler } from '../../agent/probe/types.ts';
import { ensureLabCert } from '../lab/certs.ts';
import { createLab, type Lab, type LabPod } from '../lab/lab.ts';
import { startRecordingServer, type RecordingServer } from '../lab/recording-server.ts';
import { startAgent, type AgentHandle } from '../support/agent-harness.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { makePod } from '../support/pod-factory.ts';
import { encodeShimCommand } from '../../agent/contract/shim-command.ts';
import { CriShim } from '../../agent/shim/proxy.ts';
import { startShimMetricsServer, type ShimMetricsServer } from '../../agent/shim/metrics-server.ts';
import { KubeletCri, RUNTIME_SERVICE } from '../support/kubelet-cri.ts';
import { getUnix } from '../support/http-unix.ts';
import { shimLogSink } from '../support/log-check.ts';

const run = promisify(execFile);
const ROOT = new URL('../..', import.meta.url).pathname;
const KUBE = '1.34';

let lab: Lab;
let pod: LabPod;
let helper: ResidentHelper;
let srv: RecordingServer;
let kubelet: FakeKubelet;
let agent: AgentHandle;
let httpPort: number;
let httpsPort: number;
/** The app container's ID in the fake kubelet's /pods: what kubelet's ExecSync names. */
const CONTAINER_ID = createHash('sha256').update('lifecycle-hooks/app').digest('hex');

function ctx(timeoutSeconds = 2): HookContext {
  return {
    netns: pod.netns, podIPs: pod.ips, containerPorts: [{ name: 'web', containerPort: httpPort }], timeoutSeconds,
    sockets: helper, nodeSockets: new NodeSocketFactory(), kubeVersion: KUBE, hostFieldPolicy: 'refuse', happyEyeballs: false, hook: 'postStart',
  };
}

function http(path: string, extra: Partial<HttpGetHandler> = {}): HttpGetHandler {
  return { kind: 'http', port: httpPort, path, scheme: 'HTTP', headers: [], ...extra };
}

async function hook(h: LifecycleHandlerSpec, timeoutSeconds = 2): Promise<HookOutcome> {
  return runLifecycleHandler(h, ctx(timeoutSeconds));
}

beforeAll(async () => {
  lab = await createLab({ pods: 1, policy: 'drop', tag: 'lifecycle-hooks.test' });
  pod = lab.pods[0] as LabPod;
  helper = await ResidentHelper.start();
  const cert = ensureLabCert();
  srv = await startRecordingServer(pod.name, { http: 0, https: 0, cert: cert.certPath, key: cert.keyPath });
  httpPort = srv.ports.http as number;
  httpsPort = srv.ports.https as number;
  kubelet = await FakeKubelet.start({ pods: [makePod({ uid: 'a3b1c2d4-0000-4000-8000-00000000beef', name: 'hooked', namespace: 'hooks', ips: pod.ips, port: httpPort, probe: 'none', containerID: `containerd://${CONTAINER_ID}` })] });
  agent = await startAgent({ kubeletUrl: kubelet.httpUrl });
}, 60_000);

afterAll(async () => {
  await agent?.stop('SIGKILL').catch(() => {});
  await kubelet?.stop();
  await srv?.stop();
  await helper?.close();
  await lab?.destroy();
});

describe('runLifecycleHandler (kubelet lifecycle semantics) in a pod netns', () => {
  it('sends kubelet\'s request with User-Agent kube-lifecycle/<v>, succeeds on 2xx and never reports the body', async () => {
    const before = srv.hits.length;
    const out = await hook(http('/hello?x=1', { port: 'web' }));
    expect(out).toMatchObject({ result: 'success', status: 200, message: '' });
    const hit = (await srv.waitFor(before + 1))[before];
    expect(hit).toMatchObject({ method: 'GET', url: '/hello?x=1', tls: false });
    expect(hit?.headers['user-agent']).toBe(`kube-lifecycle/${KUBE}`);
    expect(hit?.headers['accept']).toBe('*/*');
    expect(hit?.headers['host']).toBe(`${pod.ipv4}:${httpPort}`);
    // The handler's own User-Agent wins, as in kubelet.
    await hook(http('/ua', { headers: [{ name: 'User-Agent', value: 'mine/1' }] }));
    expect((await srv.waitFor(before + 2))[before + 1]?.headers['user-agent']).toBe('mine/1');
    expect(JSON.stringify(out)).not.toContain('SECRET');
  });

  it('counts any HTTP status as a success: 3xx, 4xx and 5xx do not fail a hook', async () => {
    const before = srv.hits.length;
    for (const code of [301, 404, 500, 503]) {
      const out = await hook(http(code === 301 ? `/redirect?code=301&to=${encodeURIComponent('http://elsewhere.invalid/x')}` : `/status/${code}`));
      expect(out, `status ${code}`).toMatchObject({ result: 'success', status: code });
    }
    // The server records a hit after answering it: wait for all four, so the next test counts from here.
    expect((await srv.waitFor(before + 4)).slice(before).map((h) => h.url).at(-1)).toBe('/status/503');
  });

  it('follows a same-host redirect and fails after 10 of them, like kubelet\'s redirect checker', async () => {
    const n = srv.hits.length;
    const out = await hook(http('/redirect?code=302&to=/status/204'));
    expect(out).toMatchObject({ result: 'success', status: 204 });
    expect((await srv.waitFor(n + 2)).slice(n).map((h) => h.url)).toEqual(['/redirect?code=302&to=/status/204', '/status/204']);
    const loop = await hook(http('/loop'));
    expect(loop).toMatchObject({ result: 'failure', reason: 'redirects' });
    expect(loop.message).toMatch(/stopped after 10 redirects/);
    expect((await srv.waitFor(n + 12)).slice(n + 2).map((h) => h.url)).toEqual(Array(10).fill('/loop'));
  });

  it('fails on a refused connection and on its own timeout', async () => {
    const refused = await hook(http('/', { port: 1 }));
    expect(refused).toMatchObject({ result: 'failure', reason: 'refused' });
    expect(refused.message).toMatch(/^HTTP lifecycle hook \(\/\) failed - error: Get "http:\/\/.*:1\/": dial tcp .*connection refused/);
    const slow = await hook(http('/hang'), 1);
    expect(slow).toMatchObject({ result: 'failure', reason: 'timeout' });
    expect(slow.durationSeconds).toBeGreaterThanOrEqual(0.9);
  });

  it('speaks HTTPS without verifying, and retries over HTTP when an HTTPS request gets an HTTP answer (no Authorization)', async () => {
    const n = srv.hits.length;
    const tls = await hook(http('/secure', { port: httpsPort, scheme: 'HTTPS' }));
    expect(tls).toMatchObject({ result: 'success', status: 200 });
    expect((await srv.waitFor(n + 1))[n]).toMatchObject({ url: '/secure', tls: true });

    const before = n + 1;
    const fallback = await hook(http('/fallback', { scheme: 'HTTPS', headers: [{ name: 'Authorization', value: 'Bearer t0ken' }] }));
    expect(fallback).toMatchObject({ result: 'success', status: 200, fellBackToHttp: true });
    expect(fallback.message).toMatch(/got HTTP response, retry with HTTP succeeded/);
    const hits = (await srv.waitFor(before + 1)).slice(before);
    await new Promise((r) => setTimeout(r, 100));
    expect(srv.hits.slice(before)).toHaveLength(1);
    expect(hits[0]).toMatchObject({ url: '/fallback', tls: false });
    expect(hits[0]?.headers['authorization']).toBeUndefined();
  });

  it('fails the deprecated tcpSocket hook, as kubelet does, without sending a request', async () => {
    const before = srv.hits.length;
    const out = await hook({ kind: 'tcp', port: httpPort });
    expect(out).toMatchObject({ result: 'failure', reason: 'invalid-spec' });
    expect(out.message).toMatch(/invalid handler: tcpSocket/);
    expect(srv.hits.length).toBe(before);
  });

  it('applies the probes\' host-field policy: the pod\'s loopback is fine, another host is refused', async () => {
    const n = srv.hits.length;
    const lo = await hook(http('/via-lo', { host: '127.0.0.1' }));
    expect(lo).toMatchObject({ result: 'success', status: 200 });
    expect((await srv.waitFor(n + 1))[n]?.headers['host']).toBe(`127.0.0.1:${httpPort}`);
    const other = await hook(http('/elsewhere', { host: lab.gatewayV4 }));
    expect(other).toMatchObject({ result: 'error', reason: 'host-refused' });
  });

  it('never sent a packet across the node->pod rule', async () => {
    expect(await lab.nodeToPodDrops()).toBe(0);
  });
});

describe('RunLifecycleHandler over the agent socket', () => {
  const uid = 'a3b1c2d4-0000-4000-8000-00000000beef';

  it('runs the hook in the pod netns: a 500 is a success, a refused port a failure', async () => {
    const n = srv.hits.length;
    const ok = await agent.client.runLifecycleHandler({ pod: { uid }, containerName: 'app', hook: 'preStop', handler: http('/status/500', { port: 'http' }), timeoutSeconds: 5 });
    expect(ok.result).toBe('success');
    const hit = (await srv.waitFor(n + 1))[n];
    expect(hit?.url).toBe('/status/500');
    expect(hit?.headers['user-agent']).toMatch(/^kube-lifecycle\/\d+\.\d+$/);
    const refused = await agent.client.runLifecycleHandler({ pod: { uid }, hook: 'postStart', handler: http('/', { port: 1 }), timeoutSeconds: 2 });
    expect(refused.result).toBe('failure');
    expect(refused.message).toMatch(/connection refused/);
    const tcp = await agent.client.runLifecycleHandler({ pod: { uid }, hook: 'postStart', handler: { kind: 'tcp', port: httpPort } });
    expect(tcp.result).toBe('failure');
  });

  it('answers NOT_FOUND for an unknown pod and DEADLINE_EXCEEDED when the call deadline cuts a hook short', async () => {
    const err = await agent.client.runLifecycleHandler({ pod: { uid: 'no-such-pod' }, hook: 'preStop', handler: http('/') }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ApiError);
    expect((err as ApiError).grpcCode).toBe(grpc.status.NOT_FOUND);
    const cut = await agent.client.runLifecycleHandler({ pod: { uid }, hook: 'preStop', handler: http('/hang'), deadlineMs: 500 }).catch((e: unknown) => e);
    expect((cut as ApiError).grpcCode).toBe(grpc.status.DEADLINE_EXCEEDED);
    // The agent still answers.
    expect((await agent.client.runLifecycleHandler({ pod: { uid }, hook: 'preStop', handler: http('/') })).result).toBe('success');
  });
});

describe('probe-agent hook', () => {
  async function cli(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
    try {
      const { stdout, stderr } = await run(process.execPath, [`${ROOT}agent/cli.ts`, 'hook', '--netns', pod.netns, ...args], { timeout: 30_000 });
      return { code: 0, stdout, stderr };
    } catch (err) {
      const e = err as { code: number; stdout: string; stderr: string };
      return { code: e.code, stdout: e.stdout, stderr: e.stderr };
    }
  }

  it('exits 0 on success, 1 on a failed hook, 2 when it cannot run', async () => {
    const ok = await cli(['--spec', JSON.stringify({ httpGet: { path: '/status/503', port: httpPort } }), '--hook', 'preStop', '--output', 'json']);
    expect(ok.code, ok.stderr).toBe(0);
    expect(JSON.parse(ok.stdout)).toMatchObject({ hook: 'preStop', result: 'success', status: 503 });
    const failed = await cli(['--spec', `{httpGet: {path: /, port: 1}}`]);
    expect(failed.code).toBe(1);
    expect(failed.stdout).toMatch(/^postStart failure: HTTP lifecycle hook/);
    const bad = await cli(['--spec', '{grpc: {port: 1}}']);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/httpGet or tcpSocket/);
  });
});

/**
 * Rewritten hooks as kubelet sends them (ExecSync, timeout 0, no deadline) through the kubelet
 * shim to the real agent, which is killed, restarted and drained meanwhile. The recording server
 * counts every hook request: a hook must run exactly once.
 */
describe('rewritten hooks through the kubelet shim across agent restarts and drains', () => {
  let scratch: string;
  let link: string;
  let shim: CriShim;
  let k: KubeletCri;
  let shimMetrics: ShimMetricsServer;
  let hookAgent: AgentHandle | undefined;
  let n = 0;

  /** A unique hook path, so that its requests can be counted. */
  const unique = (what: string): string => `/${what}-${++n}-${Date.now()}`;

  async function startHookAgent(): Promise<AgentHandle> {
    const a = await startAgent({ kubeletUrl: kubelet.httpUrl, args: [`--shim-metrics-socket=${path.join(scratch, 'shim', 'metrics.sock')}`] });
    try {
      unlinkSync(link);
    } catch {
      // first start, or the link was removed
    }
    symlinkSync(a.socket, link);
    return a;
  }

  function execHook(kind: 'postStart' | 'preStop', urlPath: string, timeoutSeconds = 0) {
    return k.execSync(CONTAINER_ID, encodeShimCommand(kind, { httpGet: { path: urlPath, port: httpPort } }), timeoutSeconds);
  }

  function exitCode(a: Awaited<ReturnType<typeof execHook>>): number {
    if (!a.ok) throw new Error(`expected an exit code, got gRPC ${grpc.status[a.code]}: ${a.details}`);
    return a.msg.exitCode;
  }

  /** Established TCP connections to the recording server inside the pod's netns. */
  async function connectionsToServer(): Promise<number> {
    const { stdout } = await run('nsenter', [`--net=${pod.netns}`, '--', 'ss', '-Htn', 'state', 'established', `( sport = :${httpPort} )`]);
    return stdout.split('\n').filter((l) => l.trim() !== '').length;
  }


  function sample(text: string, series: string): number {
    const line = text.split('\n').find((l) => l.startsWith(`${series} `));
    return line ? Number(line.slice(series.length + 1)) : 0;
  }

  /** The shim's log lines, checked when the file ends; a test lists the warnings it provokes. */
  const shimLogs = shimLogSink('shim (lifecycle-hooks)');

  beforeAll(async () => {
    scratch = mkdtempSync('/tmp/lifecycle-shim-');
    link = path.join(scratch, 'probe.sock');
    shim = new CriShim({
      listenPath: path.join(scratch, 'cri.sock'), runtimeSocket: path.join(scratch, 'no-runtime.sock'), probeSocket: link,
      hookAgentWaitMs: 40_000, log: shimLogs.log,
    });
    await shim.listen();
    shimMetrics = await startShimMetricsServer({ metrics: shim.metrics, socketPath: path.join(scratch, 'shim', 'metrics.sock') });
    k = new KubeletCri(shim.config.listenPath);
    hookAgent = await startHookAgent();
  }, 60_000);

  afterAll(async () => {
    k?.close();
    await shim?.close(100);
    await shimMetrics?.close();
    await hookAgent?.stop('SIGKILL').catch(() => {});
    if (scratch) rmSync(scratch, { recursive: true, force: true });
  });

  it('a postStart requested while the agent is down waits for it: the agent restarted 3 s later runs it once, and it succeeds', async () => {
    await hookAgent!.stop('SIGKILL');
    hookAgent = undefined;
    const p = unique('poststart-restart');
    const pending = execHook('postStart', p);
    await new Promise((r) => setTimeout(r, 3000));
    expect(srv.count(p)).toBe(0);
    hookAgent = await startHookAgent();
    expect(exitCode(await pending)).toBe(0);
    expect(srv.count(p)).toBe(1);
  }, 60_000);

  it("the agent's graceful shutdown during a hook: the in-flight hook completes, a new one waits and runs once on the next agent", async () => {
    const inflight = unique('slow').slice(1);
    const first = execHook('preStop', `/slow?ms=3000&id=${inflight}`);
    await srv.waitFor(srv.hits.length + 1, 15_000);
    const old = hookAgent!;
    hookAgent = undefined;
    const stopped = old.stop('SIGTERM', 30_000);
    // Let SIGTERM land: the agent is draining now (its socket refuses or is gone).
    await new Promise((r) => setTimeout(r, 300));
    const later = unique('after-drain');
    const second = execHook('postStart', later);
    expect(exitCode(await first)).toBe(0);
    expect(await stopped).toBe(0);
    expect(srv.count(later)).toBe(0);
    hookAgent = await startHookAgent();
    expect(exitCode(await second)).toBe(0);
    expect(srv.count(later)).toBe(1);
    expect(srv.hits.filter((h) => h.url.includes(`id=${inflight}`)).length).toBe(1);
  }, 90_000);

  it('a 3 s preStop runs to completion: the shim sends the agent no deadline for a hook', async () => {
    const id = unique('long-prestop').slice(1);
    const a = await execHook('preStop', `/slow?ms=3000&id=${id}`);
    expect(exitCode(a)).toBe(0);
    expect(srv.hits.filter((h) => h.url.includes(`id=${id}`)).length).toBe(1);
  }, 30_000);

  it('kubelet cancelling the ExecSync stream cancels the hook: the agent drops its request to the target', async () => {
    expect(await connectionsToServer()).toBe(0);
    const def = RUNTIME_SERVICE['ExecSync']!;
    const hits = srv.hits.length;
    let code: grpc.status | undefined;
    const call = k.client.makeUnaryRequest(def.path, (v: object) => def.requestSerialize(v), (b: Buffer) => b,
      { containerId: CONTAINER_ID, cmd: encodeShimCommand('preStop', { httpGet: { path: '/hang', port: httpPort } }), timeout: 0 }, { deadline: Infinity },
      (err) => (code = err ? err.code : grpc.status.OK));
    await srv.waitFor(hits + 1, 15_000);
    expect(await connectionsToServer()).toBe(1);
    call.cancel();
    // Generous bound: before the fix the request stayed open until the shim's 2 min cut.
    const end = Date.now() + 20_000;
    while ((await connectionsToServer()) > 0 && Date.now() < end) await new Promise((r) => setTimeout(r, 200));
    expect(await connectionsToServer()).toBe(0);
    expect(code).toBe(grpc.status.CANCELLED);
  }, 40_000);

  it('a hook kind with a probe timeout, or a probe kind with timeout 0, is refused (INVALID_ARGUMENT) and never run', async () => {
    shimLogs.expect({ level: 'warn', msg: 'rewritten handler not run', line: /"code":3,"error":"probe-agent: invalid rewritten command: a (postStart hook|liveness probe) with ExecSync timeout /, why: 'a hook and a probe with the other kind\'s timeout, on purpose' });
    const p = unique('posing');
    const hookWithTimeout = await execHook('postStart', p, 5);
    expect(!hookWithTimeout.ok && hookWithTimeout.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(!hookWithTimeout.ok && hookWithTimeout.details).toMatch(/timeout 0/);
    const probeWithoutTimeout = await k.execSync(CONTAINER_ID, encodeShimCommand('liveness', { httpGet: { path: p, port: httpPort } }), 0);
    expect(!probeWithoutTimeout.ok && probeWithoutTimeout.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(srv.count(p)).toBe(0);
    // The agreeing forms still run.
    expect(exitCode(await execHook('preStop', p, 0))).toBe(0);
    const probe = await k.execSync(CONTAINER_ID, encodeShimCommand('readiness', { httpGet: { path: p, port: httpPort } }), 1);
    expect(probe.ok && probe.msg.exitCode).toBe(0);
    expect(srv.count(p)).toBe(2);
  }, 30_000);

  it('a hook that reaches a draining agent is refused as not started (UNAVAILABLE + the documented trailer), and not run', async () => {
    const p = unique('reached-draining');
    // The shim's ExecSync stream opened before SIGTERM, its request sent after: the agent sees it
    // only once it is draining.
    const session = http2.connect('http://probe-agent', { createConnection: () => net.connect(hookAgent!.socket) });
    session.on('error', () => {});
    await new Promise<void>((r, j) => {
      session.once('connect', () => r());
      session.once('error', j);
    });
    const stream = session.request({ ':method': 'POST', ':path': '/probe.v1alpha1.ProbeService/ExecSync', 'content-type': 'application/grpc', te: 'trailers' });
    const answer = new Promise<http2.IncomingHttpHeaders>((resolve) => {
      let meta: http2.IncomingHttpHeaders = {};
      stream.on('response', (h) => (meta = { ...meta, ...h }));
      stream.on('trailers', (t) => (meta = { ...meta, ...t }));
      stream.on('close', () => resolve(meta));
      stream.on('error', () => {});
      stream.resume();
    });
    // A hook in flight keeps the agent draining (its grace) while the pending stream arrives.
    const slowId = unique('drain-holder').slice(1);
    const hits = srv.hits.length;
    const holder = hookAgent!.client.runLifecycleHandler({ pod: { uid: 'a3b1c2d4-0000-4000-8000-00000000beef' }, hook: 'preStop', handler: http(`/slow?ms=4000&id=${slowId}`) });
    await srv.waitFor(hits + 1, 15_000);
    const old = hookAgent!;
    hookAgent = undefined;
    const stopped = old.stop('SIGTERM', 30_000);
    const end = Date.now() + 10_000;
    while (!old.logs.some((l) => l.msg === 'ProbeService draining') && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
    // Kubelet's ExecSync for a rewritten preStop hook (timeout 0), as the shim forwards it.
    stream.end(encodeFrame(execSyncRequest(CONTAINER_ID, encodeShimCommand('preStop', { httpGet: { path: p, port: httpPort } }), 0)));
    const meta = await answer;
    session.destroy();
    expect(Number(meta['grpc-status'])).toBe(grpc.status.UNAVAILABLE);
    expect(meta[NOT_STARTED_TRAILER]).toBe(NOT_STARTED_DRAINING);
    expect(decodeURIComponent(String(meta['grpc-message']))).toBe(`probe-agent refused the preStop hook: ${DRAINING_DETAIL}`);
    expect((await holder).result).toBe('success');
    expect(await stopped).toBe(0);
    expect(srv.count(p)).toBe(0);
    hookAgent = await startHookAgent();
  }, 60_000);

  it("the shim's counters, read on its metrics socket and through the agent's /metrics/shim relay", async () => {
    const own = await getUnix(path.join(scratch, 'shim', 'metrics.sock'), '/metrics');
    expect(own.status).toBe(200);
    // The restart and the drain tests each waited, then ran their hook.
    expect(sample(own.body, 'probe_agent_shim_hook_waits_total{outcome="ran"}')).toBeGreaterThanOrEqual(2);
    expect(sample(own.body, 'probe_agent_shim_intercepted_total{kind="postStart",answer="success"}')).toBeGreaterThanOrEqual(2);
    expect(sample(own.body, 'probe_agent_shim_intercepted_total{kind="preStop",answer="success"}')).toBeGreaterThanOrEqual(3);
    expect(sample(own.body, 'probe_agent_shim_agent_errors_total{cause="bad_command"}')).toBe(2);
    expect(sample(own.body, 'probe_agent_shim_intercept_duration_seconds_count{kind="preStop"}')).toBeGreaterThanOrEqual(3);
    const relayed = await hookAgent!.http('/metrics/shim');
    expect(relayed.status).toBe(200);
    expect(sample(relayed.body, 'probe_agent_shim_hook_waits_total{outcome="ran"}')).toBe(sample(own.body, 'probe_agent_shim_hook_waits_total{outcome="ran"}'));
    expect(relayed.body).toMatch(/^# TYPE probe_agent_shim_intercept_duration_seconds histogram$/m);
    // The shim away: a clear 503, not a hang.
    await shimMetrics.close();
    const away = await hookAgent!.http('/metrics/shim');
    expect(away.status).toBe(503);
    expect(away.body).toMatch(/kubelet shim metrics unavailable on .*metrics\.sock/);
    shimMetrics = await startShimMetricsServer({ metrics: shim.metrics, socketPath: path.join(scratch, 'shim', 'metrics.sock') });
  }, 30_000);
});
