/**
 * The shim -> agent hop alone: CPU per ExecSync call of the shim's client (ShimProbeClient) and
 * of the agent's server on the shim's socket (HotUnaryServer), each in its own process, with a handler that answers
 * at once (no probe), so what is measured is the transport. Sequential calls, then 16 at a time.
 * Both sides are loaded from one checkout (HOP_REPO, default this one): run it against two
 * checkouts, alternately, to compare them in the same conditions.
 *
 *   node test/bench/shim-hop.ts [calls]           (HOP_REPO=/path/to/other/checkout to measure that one)
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import * as net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

const HERE = fileURLToPath(import.meta.url);
const REPO = process.env.HOP_REPO ?? path.resolve(path.dirname(HERE), '../..');

/** The first of `paths` (the module's place in this layout, then in older ones) present in REPO. */
function inRepo(...paths: string[]): string {
  const found = paths.map((p) => path.join(REPO, p)).find((p) => existsSync(p));
  if (found === undefined) throw new Error(`${REPO} has none of ${paths.join(', ')}`);
  return found;
}

/** utime + stime of a process, in ms (clock ticks of 10 ms). */
function cpuMs(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(f[11]) + Number(f[12])) * 10;
}

async function server(socket: string): Promise<void> {
  const mod = (await import(path.join(REPO, 'agent/api/hot-unary.ts'))) as typeof import('../../agent/api/hot-unary.ts') & { isHotConnection?: unknown };
  // ExecSync's answer: exit_code 0, stdout "ok" (field 1), as the agent encodes it.
  const answer = Buffer.from([0x0a, 0x02, 0x6f, 0x6b]);
  const limits = { maxRequestBytes: 1024 * 1024, maxConcurrentStreams: 256 };
  // A checkout from before the shim's own socket takes grpc-js-shaped handlers, one per method.
  const hot = mod.isHotConnection === undefined
    ? new mod.HotUnaryServer(async () => answer, limits)
    : new (mod.HotUnaryServer as unknown as new (h: unknown, l: typeof limits) => InstanceType<typeof mod.HotUnaryServer>)({
      execSync: (_call: unknown, cb: (err: null, res: Buffer) => void) => cb(null, answer),
    }, limits);
  net.createServer((s) => hot.emit('connection', s)).listen(socket, () => process.stdout.write('listening\n'));
}

async function client(socket: string, calls: number): Promise<void> {
  const { ShimProbeClient } = (await import(inRepo('agent/shim/agent-client.ts', 'agent/api/shim-client.ts'))) as typeof import('../../agent/shim/agent-client.ts');
  // The request's octets are the same whichever checkout builds them: this one's encoders.
  const { encodeFrame } = await import('../../agent/grpc/frame.ts');
  const { WireWriter } = await import('../../agent/grpc/protowire.ts');
  const { encodeShimCommand } = (await import(inRepo('agent/contract/shim-command.ts', 'agent/rewrite/shim-command.ts'))) as typeof import('../../agent/contract/shim-command.ts');
  const c = new ShimProbeClient(socket);
  // Kubelet's ExecSyncRequest for a rewritten liveness probe, as the shim forwards it.
  const { EXEC_SYNC_REQUEST: REQ } = await import('../../agent/contract/exec-sync-fields.ts');
  const w = new WireWriter().bytes(REQ.containerId, 'c'.repeat(64));
  for (const arg of encodeShimCommand('liveness', { httpGet: { path: '/healthz', port: 8080 } })) w.bytes(REQ.cmd, arg);
  const body = encodeFrame(w.varint(REQ.timeout, 1).finish());
  const one = (): Promise<unknown> => c.execSync(body, { deadlineMs: 5000 });
  const lines = createInterface({ input: process.stdin });
  for await (const line of lines) {
    const started = performance.now();
    if (line === 'sequential') for (let i = 0; i < calls; i++) await one();
    else if (line === 'parallel') {
      for (let i = 0; i < calls; i += 16) await Promise.all(Array.from({ length: 16 }, one));
    } else break;
    process.stdout.write(`${(performance.now() - started) / calls}\n`);
  }
  c.close();
}

function nextLine(p: ChildProcess): Promise<string> {
  return new Promise((resolve, reject) => {
    let buf = '';
    const on = (d: Buffer): void => {
      buf += d.toString();
      const i = buf.indexOf('\n');
      if (i < 0) return;
      p.stdout!.off('data', on);
      resolve(buf.slice(0, i));
    };
    p.stdout!.on('data', on);
    p.once('exit', (code) => reject(new Error(`child exited ${code}`)));
  });
}

async function main(): Promise<void> {
  const calls = Number(process.argv[2] ?? 5000);
  const dir = mkdtempSync(path.join(tmpdir(), 'shim-hop-'));
  const socket = path.join(dir, 'probe.sock');
  const node = process.execPath;
  const srv = spawn(node, [HERE, '--server', socket], { stdio: ['ignore', 'pipe', 'inherit'] });
  await nextLine(srv);
  const cli = spawn(node, [HERE, '--client', socket, String(calls)], { stdio: ['pipe', 'pipe', 'inherit'] });
  try {
    const run = async (mode: string): Promise<string> => {
      cli.stdin!.write(`${mode}\n`);
      await nextLine(cli); // warm-up of the same size
      const c0 = cpuMs(cli.pid!);
      const s0 = cpuMs(srv.pid!);
      cli.stdin!.write(`${mode}\n`);
      const wallMs = Number(await nextLine(cli));
      const c = (cpuMs(cli.pid!) - c0) / calls;
      const s = (cpuMs(srv.pid!) - s0) / calls;
      return `${mode}: client ${c.toFixed(3)} ms CPU/call, server ${s.toFixed(3)} ms CPU/call, wall ${wallMs.toFixed(3)} ms/call`;
    };
    console.log(`[hop] ${REPO}, ${calls} calls`);
    console.log(`[hop] ${await run('sequential')}`);
    console.log(`[hop] ${await run('parallel')}`);
  } finally {
    cli.kill();
    srv.kill();
    rmSync(dir, { recursive: true, force: true });
  }
}

if (process.argv[2] === '--server') void server(process.argv[3]!);
else if (process.argv[2] === '--client') void client(process.argv[3]!, Number(process.argv[4]));
else void main();
