/**
 * Bad input and bad peers never stop the shim: bytes that are not HTTP/2, a truncated ExecSync
 * that names probe-agent, an oversized handler, kubelet cancelling an intercepted call while the
 * agent hangs, and a burst of intercepted calls with the agent down. After each, ordinary calls
 * still pass through. The runtime here is a grpc-js RuntimeService (these faults are about the
 * shim's edges; real containerd is in shim-passthrough.test.ts); the hung agent is a socket that
 * accepts and never answers.
 */
import { spawnSync } from 'node:child_process';
import { lstatSync, mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { encodeShimCommand, SHIM_COMMAND_PATH } from '../../agent/rewrite/shim-command.ts';
import { CriShim } from '../../agent/shim/proxy.ts';
import { KubeletCri, RUNTIME_SERVICE } from '../support/kubelet-cri.ts';

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

  it('an oversized handler is INVALID_ARGUMENT, an ordinary exec is forwarded', async () => {
    const huge = [SHIM_COMMAND_PATH, 'readiness', 'A'.repeat(20_000)];
    const a = await k.execSync('c1', huge, 1);
    expect(!a.ok && a.code).toBe(grpc.status.INVALID_ARGUMENT);
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
