/**
 * Issue 24, "Also in the relay" item 3: a client's SETTINGS values are range-checked (RFC 9113
 * 6.5.2). The relay took any SETTINGS_MAX_FRAME_SIZE; with 0, splitting an intercepted answer into
 * frames of 0 octets never ended, and the process grew until V8 ran out of memory.
 *
 * A value out of range is a connection error: GOAWAY with PROTOCOL_ERROR (FLOW_CONTROL_ERROR for
 * SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1). The relay runs in a child process (relay-child.ts,
 * a 128 MiB heap) so that a relay that spins is seen as one: it neither answers nor takes a new
 * connection, and the test, bounded in time, kills it. After each bad SETTINGS the client also
 * sends an intercepted ExecSync (what made the old relay spin). The runtime is a scripted frame
 * peer (a stand-in for containerd); the child's host answers intercepted calls itself.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import * as net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it, onTestFailed } from 'vitest';
import { ERR, FramePeer, SET, Trace } from '../support/h2-frame-peer.ts';
import { autoAnswer, EXEC_SYNC, execSyncBody, requestHeaders, STREAM_TAG } from '../support/relay-harness.ts';

const CHILD = fileURLToPath(new URL('../support/relay-child.ts', import.meta.url));

interface Child {
  proc: ChildProcess;
  stderr: string[];
  exit: Promise<string>;
}

async function startChild(listen: string, runtime: string): Promise<Child> {
  const proc = spawn(process.execPath, ['--max-old-space-size=128', CHILD, listen, runtime], { stdio: ['ignore', 'pipe', 'pipe'] });
  const stderr: string[] = [];
  proc.stderr!.on('data', (d: Buffer) => stderr.push(d.toString()));
  const exit = new Promise<string>((resolve) => proc.once('exit', (code, signal) => resolve(`exited (code ${code}, signal ${signal})`)));
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`relay child not ready in 20 s: ${stderr.join('')}`)), 20_000);
    proc.stdout!.on('data', (d: Buffer) => {
      if (d.toString().includes('ready')) {
        clearTimeout(timer);
        resolve();
      }
    });
    proc.once('exit', () => reject(new Error(`relay child exited before ready: ${stderr.join('')}`)));
  });
  return { proc, stderr, exit };
}

/** A kubelet stand-in; with `corked`, what it writes is held until the caller uncorks its socket. */
async function connect(p: string, trace: Trace, settings: ReadonlyArray<readonly [number, number]>, corked = false): Promise<FramePeer> {
  const sock = net.connect(p);
  await new Promise<void>((resolve, reject) => {
    sock.once('connect', resolve);
    sock.once('error', reject);
  });
  if (corked) sock.cork();
  return new FramePeer(sock, { role: 'client', tag: 'KUBE', trace, settings, autoSettingsAck: !corked });
}

const CASES: Array<{ name: string; setting: number; value: number; code: number }> = [
  { name: 'SETTINGS_MAX_FRAME_SIZE=0', setting: SET.MAX_FRAME_SIZE, value: 0, code: ERR.PROTOCOL_ERROR },
  { name: 'SETTINGS_MAX_FRAME_SIZE=16383', setting: SET.MAX_FRAME_SIZE, value: 16_383, code: ERR.PROTOCOL_ERROR },
  { name: 'SETTINGS_MAX_FRAME_SIZE=2^24', setting: SET.MAX_FRAME_SIZE, value: 2 ** 24, code: ERR.PROTOCOL_ERROR },
  { name: 'SETTINGS_ENABLE_PUSH=2', setting: SET.ENABLE_PUSH, value: 2, code: ERR.PROTOCOL_ERROR },
  { name: 'SETTINGS_INITIAL_WINDOW_SIZE=2^31', setting: SET.INITIAL_WINDOW_SIZE, value: 2 ** 31, code: ERR.FLOW_CONTROL_ERROR },
];

describe('relay: SETTINGS out of range end the connection (issue 24 item 3)', () => {
  it.each(CASES)('$name: GOAWAY($code) within 2 s, and the relay process stays responsive', async ({ setting, value, code }) => {
    const trace = new Trace();
    onTestFailed(() => console.error(`frame trace (last lines):\n${trace.tail(60)}`));
    const dir = mkdtempSync(path.join(tmpdir(), 'relay-settings-'));
    const runtimePath = path.join(dir, 'runtime.sock');
    const listen = path.join(dir, 'relay.sock');
    const runtimes: FramePeer[] = [];
    const runtime = net.createServer((s) => {
      const p = new FramePeer(s, { role: 'server', tag: 'RUNT', trace });
      autoAnswer(p);
      runtimes.push(p);
    });
    await new Promise<void>((r) => runtime.listen(runtimePath, r));
    const child = await startChild(listen, runtimePath);
    const peers: FramePeer[] = [];
    try {
      // Preface, SETTINGS and the call in one write, and nothing written after it (not even the
      // ACK of the relay's SETTINGS): a relay may close at once after its GOAWAY, and a later write
      // failing (EPIPE) would make Node drop the GOAWAY unread.
      const k = await connect(listen, trace, [[setting, value]], true);
      peers.push(k);
      const id = k.nextStreamId;
      k.open(requestHeaders(EXEC_SYNC, [{ name: STREAM_TAG, value: 'probe' }]), false);
      k.data(id, execSyncBody('/.probe-agent/v1', 300), true);
      k.socket.uncork();
      const got = await k.waitFor(() => k.goawayRecv !== undefined, 2000, 'GOAWAY').then(
        () => `GOAWAY code ${k.goawayRecv!.code}`,
        (err: Error) => `${err.message} (the stream got ${k.stream(id).recvEnd ? 'an answer' : 'nothing'}; connection ${k.closed ? `closed: ${k.closeReason}` : 'open'})`,
      );
      expect.soft(got, 'the answer to the bad SETTINGS').toBe(`GOAWAY code ${code}`);

      // Not spinning: a new connection's PING is answered, and the process is alive.
      const k2 = await connect(listen, trace, []).catch((err: Error) => err);
      let responsive: string | boolean;
      if (k2 instanceof Error) responsive = `no new connection: ${k2.message}`;
      else {
        peers.push(k2);
        responsive = await Promise.race([
          k2.ping(2000).catch((err: Error) => err.message),
          child.exit.then((how) => `relay process ${how}: ${child.stderr.join('').split('\n').filter((l) => /heap|memory|Error/i.test(l)).slice(0, 3).join(' | ')}`),
        ]);
      }
      expect.soft(responsive, 'a PING on a new connection to the relay process afterwards').toBe(true);
    } finally {
      for (const p of [...peers, ...runtimes]) p.close();
      child.proc.kill('SIGKILL');
      await child.exit;
      await new Promise<void>((r) => runtime.close(() => r()));
      rmSync(dir, { recursive: true, force: true });
    }
  }, 40_000);
});
