/**
 * Bad input and bad peers never stop the shim: bytes that are not HTTP/2, a truncated ExecSync
 * that names probe-agent, an oversized request, kubelet cancelling an intercepted call while the
 * agent hangs, and a burst of intercepted calls with the agent down. After each, ordinary calls
 * still pass through. The runtime here is a grpc-js RuntimeService (these faults are about the
 * shim's edges; real containerd is in shim-passthrough.test.ts); the hung agent is a socket that
 * accepts and never answers.
 */
import { spawn, spawnSync } from 'node:child_process';
import { lstatSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { encodeShimCommand, SHIM_COMMAND_PATH } from '../../agent/contract/shim-command.ts';
import { CriShim } from '../../agent/shim/proxy.ts';
import { ShimMetrics } from '../../agent/shim/metrics.ts';
import { startShimMetricsServer } from '../../agent/shim/metrics-server.ts';
import { loadProbeApi } from '../../agent/api/proto.ts';
import { NOT_STARTED_DRAINING, NOT_STARTED_TRAILER } from '../../agent/contract/hook-refusal.ts';
import { KubeletCri, RUNTIME_SERVICE } from '../support/kubelet-cri.ts';
import { getUnix } from '../support/http-unix.ts';

let scratch: string;
let runtime: grpc.Server;
let hungAgent: net.Server;
const hungSockets: net.Socket[] = [];
let shim: CriShim;
let k: KubeletCri;

async function stillServes(): Promise<void> {
  const v = await k.call<{ runtimeName: string }>('Version', { version: 'v1' });
  expect(v.ok && v.msg.runtimeName).toBe('stand-in');
}

beforeAll(async () => {
  scratch = mkdtempSync(path.join(tmpdir(), 'shim-hostile-'));
  runtime = new grpc.Server();
  const version = RUNTIME_SERVICE['Version'] as grpc.MethodDefinition<object, object>;
  runtime.register(version.path, (_c: unknown, cb: grpc.sendUnaryData<object>) => cb(null, { version: '0.1.0', runtimeName: 'stand-in', runtimeVersion: '1', runtimeApiVersion: 'v1' }), version.responseSerialize, version.requestDeserialize, 'unary');
  const exec = RUNTIME_SERVICE['ExecSync'] as grpc.MethodDefinition<object, object>;
  runtime.register(exec.path, (c: grpc.ServerUnaryCall<{ cmd: string[] }, object>, cb: grpc.sendUnaryData<object>) => cb(null, { stdout: Buffer.from(c.request.cmd.join(' ')), exitCode: 0 }), exec.responseSerialize, exec.requestDeserialize as grpc.deserialize<{ cmd: string[] }>, 'unary');
  await new Promise<void>((r, j) => runtime.bindAsync(`unix:${path.join(scratch, 'rt.sock')}`, grpc.ServerCredentials.createInsecure(), (e) => (e ? j(e) : r())));
  hungAgent = net.createServer((s) => hungSockets.push(s));
  await new Promise<void>((r) => hungAgent.listen(path.join(scratch, 'hung-agent.sock'), r));
  shim = new CriShim({ listenPath: path.join(scratch, 'cri.sock'), runtimeSocket: path.join(scratch, 'rt.sock'), probeSocket: path.join(scratch, 'hung-agent.sock'), agentGraceMs: 500, log: () => {} });
  await shim.listen();
  k = new KubeletCri(shim.config.listenPath);
});

afterAll(async () => {
  k?.close();
  await shim?.close(100);
  for (const s of hungSockets) s.destroy();
  hungAgent?.close();
  runtime?.forceShutdown();
  if (scratch) rmSync(scratch, { recursive: true, force: true });
});

describe('probe-agent shim refuses to start with a clear message and exit 2', () => {
  const CLI = new URL('../../agent/cli.ts', import.meta.url).pathname;
  it.each([
    [['--agent-grace', 'soon'], /--agent-grace: invalid duration "soon"/],
    [['--runtime-endpoint', 'tcp://10.0.0.1:1234'], /unsupported endpoint "tcp:\/\/10.0.0.1:1234": only unix sockets/],
    [['--listen', 'unix:///proc/no-such-dir/cri.sock'], /ENOENT.*\/proc\/no-such-dir/],
  ])('%j', (args, message) => {
    const r = spawnSync(process.execPath, [CLI, 'shim', ...args], { encoding: 'utf8', timeout: 20_000 });
    expect(r.status).toBe(2);
    expect(r.stderr).toMatch(/^probe-agent shim: /);
    expect(r.stderr).toMatch(message);
  });
});

describe('probe-agent shim refuses a bad metrics flag before taking any socket', () => {
  it('--metrics-listen that is not HOST:PORT: exit 2 with the reason, the CRI socket never created', () => {
    const CLI = new URL('../../agent/cli.ts', import.meta.url).pathname;
    const listen = path.join(scratch, 'never.sock');
    const r = spawnSync(process.execPath, [CLI, 'shim', '--listen', `unix://${listen}`, '--metrics-socket', '', '--metrics-listen', 'nonsense'], { encoding: 'utf8', timeout: 20_000 });
    expect(r.status).toBe(2);
    expect(r.stderr).toMatch(/^probe-agent shim: --metrics-listen: invalid address "nonsense"/);
    expect(() => lstatSync(listen)).toThrow(/ENOENT/);
  });
});

describe('the shim under bad input', () => {
  it('a second shim refuses to take the socket of a running one; a stale socket file is replaced', async () => {
    const second = new CriShim({ listenPath: shim.config.listenPath, runtimeSocket: path.join(scratch, 'rt.sock'), probeSocket: path.join(scratch, 'x.sock'), log: () => {} });
    await expect(second.listen()).rejects.toThrow(/in use by a running process/);
    await stillServes();
    // A socket file nobody listens on (a shim killed with SIGKILL) is taken over.
    const stale = path.join(scratch, 'stale.sock');
    spawnSync(process.execPath, ['-e', `require('net').createServer().listen(${JSON.stringify(stale)}, () => process.kill(process.pid, 'SIGKILL'))`]);
    expect(lstatSync(stale).isSocket()).toBe(true);
    const third = new CriShim({ listenPath: stale, runtimeSocket: path.join(scratch, 'rt.sock'), probeSocket: path.join(scratch, 'x.sock'), log: () => {} });
    await third.listen();
    await third.close(100);
  });

  it('bytes that are not HTTP/2 only cost that connection', async () => {
    for (const junk of [Buffer.from('GET / HTTP/1.1\r\nHost: x\r\n\r\n'), Buffer.alloc(4096, 0xff), Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x04\x08')]) {
      await new Promise<void>((resolve) => {
        const s = net.connect(shim.config.listenPath, () => s.end(junk));
        s.on('close', () => resolve());
        s.on('error', () => resolve());
        s.resume();
      });
    }
    await stillServes();
  });

  it('a truncated ExecSync that mentions probe-agent is forwarded untouched, not decoded by guesswork', async () => {
    const body = Buffer.concat([Buffer.from([0x12, 0x7f]), Buffer.from(SHIM_COMMAND_PATH)]);
    const send = (c: KubeletCri): Promise<{ code: number; bytes?: Buffer }> => new Promise((resolve) => {
      c.client.makeUnaryRequest('/runtime.v1.RuntimeService/ExecSync', (b: Buffer) => b, (b: Buffer) => b, body, { deadline: Date.now() + 5000 },
        (err, res) => resolve(err ? { code: err.code } : { code: 0, bytes: res as Buffer }));
    });
    const direct = new KubeletCri(path.join(scratch, 'rt.sock'));
    try {
      expect(await send(k)).toEqual(await send(direct));
    } finally {
      direct.close();
    }
    expect(shim.stats.intercepted).toBe(0);
    await stillServes();
  });

  it('a rewritten ExecSync larger than the shim reads is RESOURCE_EXHAUSTED without reaching the agent, an ordinary exec is forwarded', async () => {
    const intercepted = shim.stats.intercepted;
    const huge = [SHIM_COMMAND_PATH, 'readiness', 'A'.repeat(70_000)];
    const a = await k.execSync('c1', huge, 1);
    expect(!a.ok && a.code).toBe(grpc.status.RESOURCE_EXHAUSTED);
    expect(shim.stats.intercepted).toBe(intercepted);
    const b = await k.execSync('c1', ['/bin/echo', 'hi'], 1);
    expect(b.ok && b.msg.stdout.toString()).toBe('/bin/echo hi');
  });

  it('kubelet cancelling an intercepted call while the agent hangs leaves the shim serving', async () => {
    const intercepted = shim.stats.intercepted;
    const def = RUNTIME_SERVICE['ExecSync']!;
    const cancels: (() => void)[] = [];
    const calls = Array.from({ length: 20 }, () => new Promise<number>((resolve) => {
      const call = k.client.makeUnaryRequest(def.path, (v: object) => def.requestSerialize(v), (b: Buffer) => b,
        { containerId: 'c1', cmd: encodeShimCommand('liveness', { tcpSocket: { port: 80 } }), timeout: 5 }, { deadline: Date.now() + 60_000 },
        (err) => resolve(err ? err.code : 0));
      cancels.push(() => call.cancel());
    }));
    // Cancelled only once the shim has taken every call as its own and is waiting on the hung agent.
    await expect.poll(() => shim.stats.intercepted - intercepted, { timeout: 10_000 }).toBe(20);
    for (const cancel of cancels) cancel();
    expect(new Set(await Promise.all(calls))).toEqual(new Set([grpc.status.CANCELLED]));
    await stillServes();
  });

  it('a burst of intercepted calls to a hung agent: each gets UNAVAILABLE after timeout + grace, ordinary calls meanwhile answer', async () => {
    const burst = Promise.all(Array.from({ length: 100 }, () => k.execSync('c1', encodeShimCommand('readiness', { httpGet: { path: '/', port: 80 } }), 1)));
    await stillServes();
    const answers = await burst;
    for (const a of answers) expect(!a.ok && a.code).toBe(grpc.status.UNAVAILABLE);
    await stillServes();
  });
});

/**
 * A stand-in ProbeService whose ExecSync answers from a script: the shim must send a
 * hook again only when the agent says it did not start it (RESOURCE_EXHAUSTED: admission refused;
 * UNAVAILABLE with the draining trailer), and never when it may have run.
 */
describe('hook refusals the shim retries within --hook-agent-wait, and those it must not', () => {
  type Step = 'exhausted' | 'draining' | 'unavailable' | 'success';
  let agentServer: grpc.Server;
  let script: Step[] = [];
  let calls = 0;
  let waitingShim: CriShim;
  let impatientShim: CriShim;
  let kw: KubeletCri;
  let ki: KubeletCri;

  const hookCmd = encodeShimCommand('postStart', { httpGet: { path: '/', port: 80 } });

  beforeAll(async () => {
    agentServer = new grpc.Server();
    agentServer.addService(loadProbeApi().service, {
      ExecSync: (_call: unknown, cb: grpc.sendUnaryData<{ stdout: Buffer; exit_code: number }>) => {
        calls++;
        const step = script.shift() ?? 'success';
        if (step === 'exhausted') return cb({ code: grpc.status.RESOURCE_EXHAUSTED, details: 'too many RunLifecycleHandler calls in flight for this pod' });
        if (step === 'draining') {
          const md = new grpc.Metadata();
          md.set(NOT_STARTED_TRAILER, NOT_STARTED_DRAINING);
          return cb({ code: grpc.status.UNAVAILABLE, details: 'probe-agent is draining: the hook was not started', metadata: md });
        }
        if (step === 'unavailable') return cb({ code: grpc.status.UNAVAILABLE, details: 'netns gone while running' });
        cb(null, { stdout: Buffer.alloc(0), exit_code: 0 });
      },
    });
    const sock = path.join(scratch, 'scripted-agent.sock');
    await new Promise<void>((r, j) => agentServer.bindAsync(`unix:${sock}`, grpc.ServerCredentials.createInsecure(), (e) => (e ? j(e) : r())));
    const rt = path.join(scratch, 'rt.sock');
    waitingShim = new CriShim({ listenPath: path.join(scratch, 'cri-wait.sock'), runtimeSocket: rt, probeSocket: sock, hookAgentWaitMs: 20_000, log: () => {} });
    impatientShim = new CriShim({ listenPath: path.join(scratch, 'cri-nowait.sock'), runtimeSocket: rt, probeSocket: sock, hookAgentWaitMs: 600, log: () => {} });
    await waitingShim.listen();
    await impatientShim.listen();
    kw = new KubeletCri(waitingShim.config.listenPath);
    ki = new KubeletCri(impatientShim.config.listenPath);
  });

  afterAll(async () => {
    kw?.close();
    ki?.close();
    await waitingShim?.close(100);
    await impatientShim?.close(100);
    agentServer?.forceShutdown();
  });

  it('RESOURCE_EXHAUSTED (admission refused before the hook started) is retried within the wait, then the hook runs once', async () => {
    script = ['exhausted', 'exhausted', 'exhausted', 'success'];
    calls = 0;
    const a = await kw.execSync('c1', hookCmd, 0);
    expect(a.ok && a.msg.exitCode).toBe(0);
    expect(calls).toBe(4);
    expect(waitingShim.metrics.render()).toMatch(/^probe_agent_shim_hook_waits_total\{outcome="ran"\} 1$/m);
  });

  it("a draining agent's documented refusal is retried; a plain UNAVAILABLE (the hook may have run) is not", async () => {
    script = ['draining', 'success'];
    calls = 0;
    const a = await kw.execSync('c1', hookCmd, 0);
    expect(a.ok && a.msg.exitCode).toBe(0);
    expect(calls).toBe(2);
    script = ['unavailable', 'success'];
    calls = 0;
    const b = await kw.execSync('c1', hookCmd, 0);
    expect(!b.ok && b.code).toBe(grpc.status.UNAVAILABLE);
    expect(calls).toBe(1);
  });

  it('refusals past the wait: the hook fails with the agent\'s RESOURCE_EXHAUSTED, counted as exhausted and gave_up', async () => {
    script = Array.from({ length: 100 }, () => 'exhausted' as const);
    calls = 0;
    const a = await ki.execSync('c1', hookCmd, 0);
    expect(!a.ok && a.code).toBe(grpc.status.RESOURCE_EXHAUSTED);
    expect(calls).toBeGreaterThan(1);
    const text = impatientShim.metrics.render();
    expect(text).toMatch(/^probe_agent_shim_agent_errors_total\{cause="exhausted"\} 1$/m);
    expect(text).toMatch(/^probe_agent_shim_hook_waits_total\{outcome="gave_up"\} 1$/m);
    expect(text).toMatch(/^probe_agent_shim_intercepted_total\{kind="postStart",answer="error"\} 1$/m);
    script = [];
  });
});

describe("the shim's metrics endpoints", () => {

  it('probe-agent shim serves its counters on --metrics-socket (directory 0700, socket 0600) ', async () => {
    const CLI = new URL('../../agent/cli.ts', import.meta.url).pathname;
    const dir = path.join(scratch, 'shim-run');
    const metricsSock = path.join(dir, 'metrics.sock');
    const listen = path.join(scratch, 'cli-cri.sock');
    const child = spawn(process.execPath, [CLI, 'shim', '--listen', `unix://${listen}`, '--runtime-endpoint', `unix://${path.join(scratch, 'rt.sock')}`,
      '--probe-socket', path.join(scratch, 'nobody.sock'), '--metrics-socket', metricsSock], { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    try {
      await new Promise<void>((resolve, reject) => {
        const t = setTimeout(() => reject(new Error(`shim did not start: ${stderr}`)), 20_000);
        child.stderr!.on('data', (d: Buffer) => {
          stderr += d.toString();
          if (stderr.includes('shim listening')) {
            clearTimeout(t);
            resolve();
          }
        });
        child.once('exit', (code) => reject(new Error(`shim exited ${code}: ${stderr}`)));
      });
      expect(statSync(dir).mode & 0o777).toBe(0o700);
      expect(statSync(metricsSock).mode & 0o777).toBe(0o600);
      const kc = new KubeletCri(listen);
      const v = await kc.call<{ runtimeName: string }>('Version', { version: 'v1' });
      kc.close();
      expect(v.ok).toBe(true);
      const m = await getUnix(metricsSock, '/metrics');
      expect(m.status).toBe(200);
      expect(m.body).toMatch(/^probe_agent_shim_forwarded_total\{method="Version"\} 1$/m);
      expect(m.body).toMatch(/^probe_agent_shim_runtime_errors_total 0$/m);
      expect((await getUnix(metricsSock, '/other')).status).toBe(404);
    } finally {
      child.kill('SIGTERM');
    }
  });

  it('--metrics-listen serves the same text over TCP; unknown CRI methods are counted as "other"', async () => {
    const metrics = new ShimMetrics();
    metrics.forwarded('/runtime.v1.RuntimeService/ListContainers');
    metrics.forwarded('/runtime.v1.RuntimeService/NoSuchMethod');
    metrics.forwarded('/something/else');
    const srv = await startShimMetricsServer({ metrics, socketPath: '', listen: '127.0.0.1:0' });
    try {
      const res = await fetch(`http://127.0.0.1:${srv.port}/metrics`);
      const text = await res.text();
      expect(res.headers.get('content-type')).toMatch(/^text\/plain; version=0\.0\.4/);
      expect(text).toMatch(/^probe_agent_shim_forwarded_total\{method="ListContainers"\} 1$/m);
      expect(text).toMatch(/^probe_agent_shim_forwarded_total\{method="other"\} 2$/m);
    } finally {
      await srv.close();
    }
  });
});
