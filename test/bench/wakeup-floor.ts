/**
 * The wake-up floor: what one wake-up costs a process on this machine, by runtime. A receiver
 * (Node's net.Socket with a 'data' listener, as the agent and the shim read before issue 44; Node's
 * lean path, agent/io/lean-socket.ts, as they read now, answering by socket.write, by the same
 * between cork and uncork, and by fs.writeSync on the descriptor; Go's netpoller as kubelet and
 * containerd read; and a plain C poll loop as the netns helper reads) gets one byte on a unix socket at a fixed rate
 * and writes one byte back; its CPU per message, from the kernel's per-thread run time
 * (/proc/<pid>/task/<tid>/schedstat, ns), is the least any process of that runtime pays per
 * message at that rate. A rewritten probe wakes the shim at least three times (kubelet's request,
 * the agent's answer, kubelet's BDP PING) and the agent at least three (the shim's call, the
 * helper's connection, the target's answer): those counts times the floor bound what the shim and
 * the agent can cost per probe without fewer wake-ups or another runtime.
 *
 *   make bench-floor   (BENCH_FLOOR_RATES=20,200 BENCH_FLOOR_SECONDS=15 BENCH_FLOOR_ROUNDS=2)
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { runMsOf } from './procstat.ts';

const HERE = fileURLToPath(new URL('./wakeup/', import.meta.url));
const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const BUILD = join(ROOT, 'build');

type Kind = 'node' | 'lean' | 'lean-cork' | 'lean-fd' | 'go' | 'c';

/** What each row is. */
const LABEL: Record<Kind, string> = {
  node: 'Node net.Socket (\'data\' + write)',
  lean: 'Node lean (onread + write, agent/io)',
  'lean-cork': 'Node lean, cork/uncork write',
  'lean-fd': 'Node lean, fs.writeSync on the fd',
  go: 'Go netpoller',
  c: 'C poll loop',
};

/** The receivers' commands; the Go and C ones are built by `make bench-floor`. */
function receivers(): Record<Kind, string[]> {
  const go = join(BUILD, 'wakeup-floor-go');
  const c = join(BUILD, 'wakeup-floor-c');
  for (const bin of [go, c]) if (!existsSync(bin)) throw new Error(`${bin} is missing: run make bench-floor`);
  const lean = (mode: string): string[] => [process.execPath, join(HERE, 'lean.ts'), mode];
  return { node: [process.execPath, join(HERE, 'receiver.ts')], lean: lean('write'), 'lean-cork': lean('cork'), 'lean-fd': lean('fd'), go: [go], c: [c] };
}

async function start(cmd: string[], path: string): Promise<ChildProcess> {
  const child = spawn(cmd[0] as string, [...cmd.slice(1), path], { stdio: ['ignore', 'pipe', 'inherit'] });
  await new Promise<void>((resolve, reject) => {
    child.once('exit', (code) => reject(new Error(`${cmd[0]} exited with ${code} before it was ready`)));
    child.stdout?.once('data', () => resolve());
  });
  return child;
}

/** Sends `count` one-byte messages at `rate` per second, each after the previous answer; resolves when all are answered. */
function exchange(sock: net.Socket, rate: number, count: number): Promise<void> {
  return new Promise((resolve) => {
    const t0 = performance.now();
    let sent = 0;
    const next = (): void => {
      if (sent === count) {
        sock.off('data', onData);
        resolve();
        return;
      }
      setTimeout(() => {
        sent++;
        sock.write('x');
      }, Math.max(0, t0 + (sent * 1000) / rate - performance.now()));
    };
    const onData = (): void => next();
    sock.on('data', onData);
    next();
  });
}

/** CPU ms per message of one receiver at `rate`, after a warm-up. */
async function measure(cmd: string[], rate: number, seconds: number): Promise<number> {
  const dir = mkdtempSync(join(tmpdir(), 'pa-floor-'));
  const path = join(dir, 's.sock');
  const child = await start(cmd, path);
  try {
    const sock = net.connect(path);
    await new Promise<void>((r) => sock.once('connect', () => r()));
    await exchange(sock, Math.max(rate, 100), 50);
    const count = Math.max(50, Math.round(rate * seconds));
    const before = runMsOf(child.pid as number);
    await exchange(sock, rate, count);
    const ms = (runMsOf(child.pid as number) - before) / count;
    sock.destroy();
    return ms;
  } finally {
    child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
}

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;

const rates = (process.env['BENCH_FLOOR_RATES'] ?? '20,200').split(',').map(Number);
const seconds = Number(process.env['BENCH_FLOOR_SECONDS'] ?? 15);
const rounds = Number(process.env['BENCH_FLOOR_ROUNDS'] ?? 2);
const cmds = receivers();
const kinds: Kind[] = ['node', 'lean', 'lean-cork', 'lean-fd', 'go', 'c'];
const result: Record<string, Record<Kind, number[]>> = {};
const load0 = loadavg()[0]?.toFixed(1);
for (const rate of rates) {
  result[rate] = { node: [], lean: [], 'lean-cork': [], 'lean-fd': [], go: [], c: [] };
  for (let r = 0; r < rounds; r++) {
    for (const k of kinds) result[rate]![k].push(await measure(cmds[k], rate, rate >= 100 ? seconds / 3 : seconds));
  }
}
const lines = [
  `CPU ms per message (one byte in, one byte out, unix socket), medians of ${rounds} interleaved rounds; load ${load0} at the start, ${loadavg()[0]?.toFixed(1)} at the end:`,
  '',
  `| receiver | ${rates.map((r) => `${r}/s`).join(' | ')} | ${rates.map((r) => `× C at ${r}/s`).join(' | ')} | ${rates.map((r) => `× Go at ${r}/s`).join(' | ')} |`,
  `|---|${rates.map(() => '---|').join('')}${rates.map(() => '---|').join('')}${rates.map(() => '---|').join('')}`,
];
for (const k of kinds) {
  const row = rates.map((r) => median(result[r]![k]).toFixed(3));
  const x = rates.map((r) => `${(median(result[r]![k]) / median(result[r]!.c)).toFixed(1)}×`);
  const xg = rates.map((r) => `${(median(result[r]![k]) / median(result[r]!.go)).toFixed(2)}×`);
  lines.push(`| ${LABEL[k]} | ${row.join(' | ')} | ${x.join(' | ')} | ${xg.join(' | ')} |`);
}
process.stdout.write(`${lines.join('\n')}\n`);
