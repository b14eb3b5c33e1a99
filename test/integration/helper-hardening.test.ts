/**
 * The root helper's hardening, each against the real kernel: a child holds no descriptor but its
 * channel (not the sockets queued for another pod, not the warm resident's home netns, not a
 * launcher's pipe); a netns path that names another namespace than the one checked (a pid reused
 * in a pid namespace, a file re-mounted) is refused before setns; and the smaller defects each get
 * an answer: an overlong line, a full reply queue, a ppoll that keeps failing, a proc root that
 * stopped being a procfs, a cmd carrying a newline into the log. Whatever its launcher left (SIGCHLD
 * ignored, signals blocked, no close_range, a channel nobody reads), it starts clean, reaps its own,
 * signals no pid it does not own and drops no reply.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'unshare', 'nsenter', 'mount', 'gcc']);

import { type ChildProcessWithoutNullStreams, execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmdirSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { NetnsError } from '../../agent/errors.ts';
import { ResidentHelper } from '../../agent/netns/helper.ts';
import { NetnsPathChecker } from '../../agent/netns/netns-path.ts';
import { SpawnHelper } from '../../agent/netns/spawn-helper.ts';
import { createLab, type Lab, type LabPod, type RunningServer } from '../lab/lab.ts';
import { RawHelper } from '../support/raw-helper.ts';
import { processState, waitFor } from '../support/proc-wait.ts';

const SELF_NETNS = `/proc/${process.pid}/ns/net`;
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

function fds(pid: number): string[] {
  try {
    return readdirSync(`/proc/${pid}/fd`).sort((x, y) => Number(x) - Number(y));
  } catch {
    return [];
  }
}

function childrenOf(pid: number): number[] {
  return readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean).map(Number);
}

function netnsOf(pid: number): string | undefined {
  try {
    return readlinkSync(`/proc/${pid}/ns/net`);
  } catch {
    return undefined;
  }
}

const line = (o: Record<string, unknown>): string => `${JSON.stringify(o)}\n`;

let launcherPath = '';
/** test/lab/fail-syscall, built once: failing system calls, ignored and blocked signals, a full channel. */
function launcher(): string {
  if (!launcherPath) {
    launcherPath = join(scratch, 'fail-syscall');
    execFileSync('gcc', ['-O2', '-o', launcherPath, new URL('../lab/fail-syscall.c', import.meta.url).pathname]);
  }
  return launcherPath;
}

/** A signal mask line of /proc/PID/status (SigBlk, SigIgn) as a number. */
function sigmask(pid: number, field: 'SigBlk' | 'SigIgn'): bigint {
  const m = new RegExp(`^${field}:\\s*([0-9a-f]+)$`, 'm').exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return BigInt(`0x${m?.[1] ?? 'x'}`);
}

/** Unread bytes in the receive queue of the unix socket `pid` holds as `fd` (ss, sock_diag). */
function unixRecvQ(pid: number, fd: number): number {
  const inode = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`))?.[1];
  for (const row of execFileSync('ss', ['-xnH'], { encoding: 'utf8' }).split('\n')) {
    const f = row.trim().split(/\s+/);
    if (f[5] === inode) return Number(f[2]);
  }
  throw new Error(`no unix socket ${inode} in ss`);
}

const SIGCHLD_BIT = 1n << 16n;
const alive = (pid: number): boolean => { const st = processState(pid); return st !== undefined && st !== 'Z'; };

let lab: Lab;
let a: LabPod;
let b: LabPod;
let server: RunningServer;
let scratch: string;

beforeAll(async () => {
  lab = await createLab({ pods: 2, policy: 'drop', tag: 'helper-hardening.test' });
  [a, b] = lab.pods as [LabPod, LabPod];
  server = await lab.startServer(a, { http: 0 });
  scratch = mkdtempSync(join(tmpdir(), 'pa-hardening-'));
});

afterAll(async () => {
  if (scratch) rmSync(scratch, { recursive: true, force: true });
  await lab?.destroy();
});

describe.each([
  ['warm', ['--warm']],
  ['resident', []],
] as const)('%s helper: a child in another pod\'s netns holds nothing but its channel', (mode, flags) => {
  it('with replies queued for pod A and a launcher\'s pipe inherited, the TCP-probe child in pod B holds fds 0-3 only', async () => {
    const h = new RawHelper([...flags, '--max-children', '4000', '--child-timeout-ms', '60000'], { extraPipes: 1 });
    // Fillers: more answers than Node buffers for a paused stream (64 KiB) and the kernel's channel hold.
    const n = mode === 'warm' ? 3000 : 1000;
    try {
      // The launcher's extra stdio socket (fd 4) is gone from the resident once it serves; the warm
      // resident's own fd 4 is its home netns.
      h.chan.write(line({ id: 1, netns: SELF_NETNS, family: 4 }));
      expect(await h.answer(1)).toMatchObject({ ok: true });
      const beyond = fds(h.pid).filter((fd) => Number(fd) > 3).map((fd) => readlinkSync(`/proc/${h.pid}/fd/${fd}`));
      expect(beyond).toEqual(mode === 'warm' ? [expect.stringMatching(/^net:\[\d+\]$/)] : []);
      // The agent stops reading: its channel fills, replies queue in the resident (warm: with
      // pod A's sockets; resident: refusals, which cost no child).
      h.chan.pause();
      const filler = mode === 'warm' ? a.netns : '/run/netns/../x';
      h.chan.write(Array.from({ length: n }, (_, i) => line({ id: 100 + i, netns: filler, family: 4 })).join(''));
      if (mode === 'warm') expect(await waitFor(() => fds(h.pid).length > 100, 20_000), 'pod A sockets queued in the resident').toBe(true);
      else await sleep(1000);
      h.chan.write(line({ id: 9000, op: 'tcp', netns: b.netns, family: 4, ip: '127.0.0.1', port: 1, timeout_ms: 1000 }));
      const podB = `net:[${statSync(b.netns).ino}]`;
      let child = 0;
      // The child enters pod B, connects (refused), then waits for room on the full channel.
      expect(await waitFor(() => {
        child = childrenOf(h.pid).find((c) => netnsOf(c) === podB) ?? 0;
        return child > 0 && fds(child).length === 4;
        // Under load the resident takes long to clone a child for each of the fillers ahead of this one.
      }, 60_000), `a child in pod B with 4 fds (has ${child ? fds(child).join(',') : 'no child'}; resident fds ${fds(h.pid).length}, children ${childrenOf(h.pid).join(',')}, replies ${h.replies.length}; ${h.stderr})`).toBe(true);
      await sleep(200);
      expect(fds(child)).toEqual(['0', '1', '2', '3']);
      for (const fd of ['0', '1', '2', '3']) expect(readlinkSync(`/proc/${child}/fd/${fd}`)).toBe(readlinkSync(`/proc/${h.pid}/fd/${fd}`));
      if (mode === 'warm') expect(fds(h.pid).length, 'the resident still holds pod A\'s queued sockets').toBeGreaterThan(100);
      h.chan.resume();
      await h.waitReplies(n + 2, 60_000);
      for (const id of [1, ...Array.from({ length: n }, (_, i) => 100 + i), 9000]) expect(h.answersFor(id), `answers for ${id}`).toHaveLength(1);
      expect(h.answersFor(9000)[0]).toMatchObject({ ok: true, tcp: 'error', code: 'ECONNREFUSED' });
    } finally {
      await h.stop();
    }
  }, 180_000);
});

describe('the helper enters only the namespace the resolver checked', () => {
  it('refuses <proc root>/<pid>/ns/net once the pid is reused by a process in another netns (pid namespace, ns_last_pid)', async () => {
    const procRoot = join(scratch, 'proc');
    mkdirSync(procRoot);
    // A pid namespace whose procfs is mounted at procRoot; ns_last_pid makes the next pid 100, twice.
    const script = [
      'set -e',
      'mount -t proc proc "$1"',
      'echo 99 > /proc/sys/kernel/ns_last_pid',
      // Announced once it is inside the netns (nsenter enters, then execs sleep).
      'nsenter --net="$2" sleep 600 & until [ "$(stat -L -c %i "$1/$!/ns/net")" = "$(stat -c %i "$2")" ]; do sleep 0.01; done; echo "pid $!"',
      'read -r _',
      'kill $! && wait $! || true',
      'echo 99 > /proc/sys/kernel/ns_last_pid',
      'nsenter --net="$3" sleep 600 & until [ "$(stat -L -c %i "$1/$!/ns/net")" = "$(stat -c %i "$3")" ]; do sleep 0.01; done; echo "pid $!"',
      'read -r _',
      'kill $!',
    ].join('\n');
    const ns: ChildProcessWithoutNullStreams = spawn('unshare', ['--pid', '--fork', '--kill-child', 'bash', '-c', script, 'bash', procRoot, a.netns, b.netns]);
    const said: string[] = [];
    let out = '';
    ns.stdout.on('data', (d: Buffer) => {
      out += d.toString();
      const parts = out.split('\n');
      out = parts.pop() ?? '';
      said.push(...parts);
    });
    let stderr = '';
    ns.stderr.on('data', (d: Buffer) => { stderr += d.toString(); });
    let h: RawHelper | undefined;
    try {
      expect(await waitFor(() => said.length >= 1, 10_000), `pid namespace up (${stderr})`).toBe(true);
      expect(said[0]).toBe('pid 100');
      // Started once that procfs is mounted: the helper refuses a proc root that is not one.
      h = new RawHelper(['--proc-root', procRoot]);
      const path = `${procRoot}/100/ns/net`;
      // The resolver's check: pid 100 is in pod A.
      const checked = await new NetnsPathChecker({ procRoot }).check(path);
      expect(checked.inode).toBe(statSync(a.netns).ino);
      const want = { dev: checked.dev, ino: checked.inode };
      h.chan.write(line({ id: 1, op: 'addrs', netns: path, ...want }));
      expect(await h.answer(1)).toMatchObject({ ok: true, addrs: expect.arrayContaining([a.ipv4]) });
      // The process exits and another one, in pod B, gets its pid.
      ns.stdin.write('\n');
      expect(await waitFor(() => said.length >= 2, 10_000), `second process (${stderr})`).toBe(true);
      expect(said[1]).toBe('pid 100');
      expect(statSync(path).ino).toBe(statSync(b.netns).ino);
      for (const [id, req] of [
        [2, { op: 'addrs' }],
        [3, { family: 4 }],
        [4, { op: 'tcp', family: 4, ip: b.ipv4, port: 1, timeout_ms: 1000 }],
      ] as const) {
        h.chan.write(line({ id, netns: path, ...req, ...want }));
        const ans = await h.answer(id);
        expect(ans, `request ${id}`).toMatchObject({ ok: false, stage: 'identity', code: 'ESTALE' });
        expect(ans?.error).toBe(`not the network namespace that was checked (dev ${want.dev} ino ${want.ino}), now dev ${statSync(path).dev} ino ${statSync(b.netns).ino}`);
      }
      // Without the identity the same path now leads into pod B: what the check prevents.
      h.chan.write(line({ id: 5, op: 'addrs', netns: path }));
      expect(await h.answer(5)).toMatchObject({ ok: true, addrs: expect.arrayContaining([b.ipv4]) });
      ns.stdin.write('\n');
    } finally {
      await h?.stop();
      ns.kill('SIGKILL');
      try { execFileSync('umount', ['-l', procRoot], { stdio: 'ignore' }); } catch { /* not mounted */ }
      rmdirSync(procRoot);
    }
  }, 60_000);

  it('every factory maps a re-mounted netns file to NetnsError gone, and serves it again once checked again', async () => {
    const dir = join(scratch, 'netns');
    mkdirSync(dir);
    const file = join(dir, 'pod');
    writeFileSync(file, '');
    const resident = await ResidentHelper.start({ allowDirs: [dir] });
    const warm = await ResidentHelper.start({ allowDirs: [dir], warm: true });
    const pool = await ResidentHelper.start({ allowDirs: [dir], pool: 2 });
    const spawned = await SpawnHelper.create({ allowDirs: [dir] });
    const checker = new NetnsPathChecker({ extraDirs: [dir] });
    try {
      execFileSync('mount', ['--bind', a.netns, file]);
      expect((await checker.check(file)).inode).toBe(statSync(a.netns).ino);
      execFileSync('umount', [file]);
      execFileSync('mount', ['--bind', b.netns, file]);
      for (const f of [resident, warm, pool, spawned]) {
        const err = await f.createSocket(file, 4).then((s) => { s.destroy(); return undefined; }, (e: unknown) => e);
        expect(err, f.mode).toBeInstanceOf(NetnsError);
        expect((err as NetnsError).kind).toBe('gone');
        expect((err as NetnsError).message).toContain(`netns "${file}" was replaced since it was checked: not the network namespace that was checked`);
      }
      const addrErr = await resident.readAddresses(file).catch((e: unknown) => e);
      expect((addrErr as NetnsError).kind).toBe('gone');
      // The resolver looks again: now the path is checked to be pod B, and served.
      expect((await checker.check(file)).inode).toBe(statSync(b.netns).ino);
      expect(await resident.readAddresses(file)).toContain(b.ipv4);
      for (const f of [resident, warm, pool, spawned]) (await f.createSocket(file, 4)).destroy();
    } finally {
      await Promise.all([resident.close(), warm.close(), pool.close()]);
      try { execFileSync('umount', [file], { stdio: 'ignore' }); } catch { /* not mounted */ }
    }
  }, 60_000);
});

describe('smaller defects get an answer', () => {
  it('answers a request line over 8,191 bytes that names its id, and serves the next one', async () => {
    const h = new RawHelper([]);
    try {
      h.chan.write(`{"id":7,"netns":${JSON.stringify(SELF_NETNS)},"family":4,"pad":"${'x'.repeat(9000)}"}\n`);
      h.chan.write(line({ id: 8, netns: SELF_NETNS, family: 4 }));
      expect(await h.answer(7)).toMatchObject({ ok: false, stage: 'request', code: 'EMSGSIZE', error: 'malformed request: the line is longer than 8191 bytes' });
      expect(await h.answer(8)).toMatchObject({ ok: true });
      expect(h.replies).toHaveLength(2);
    } finally {
      await h.stop();
    }
  });

  it('refuses a send that is not for op connect, not base64, or over 4,096 octets, and serves the next request', async () => {
    const h = new RawHelper([]);
    const target = { netns: SELF_NETNS, family: 4, ip: '127.0.0.1', port: 9, timeout_ms: 1000 };
    try {
      h.chan.write(line({ id: 1, op: 'tcp', ...target, send: 'R0VUIC8=' }));
      h.chan.write(line({ id: 2, op: 'connect', ...target, send: 'R0VUIC8' }));
      h.chan.write(line({ id: 3, op: 'connect', ...target, send: 'R0VU@C8=' }));
      h.chan.write(line({ id: 4, op: 'connect', ...target, send: Buffer.alloc(4097, 'x').toString('base64') }));
      h.chan.write(line({ id: 5, op: 'connect', ...target, send: Buffer.alloc(4096, 'x').toString('base64') }));
      expect(await h.answer(1)).toMatchObject({ ok: false, stage: 'request', code: 'EINVAL', error: 'malformed request: send is for op connect only' });
      for (const id of [2, 3]) expect(await h.answer(id)).toMatchObject({ ok: false, stage: 'request', error: expect.stringContaining('bad base64') });
      expect(await h.answer(4)).toMatchObject({ ok: false, stage: 'request', error: expect.stringContaining('send too long') });
      // The largest send is taken: nothing listens on the discard port, so the connect is refused.
      expect(await h.answer(5)).toMatchObject({ ok: true, tcp: 'error', code: 'ECONNREFUSED' });
    } finally {
      await h.stop();
    }
  });

  it('a full reply queue holds back reading instead of dropping answers: each of 300 requests gets one', async () => {
    const h = new RawHelper(['--warm', '--max-children', '4']);
    try {
      h.chan.pause();
      h.chan.write(Array.from({ length: 300 }, (_, i) => line({ id: i + 1, netns: a.netns, family: 4 })).join(''));
      await sleep(1500);
      // Bounded: the queue (max-children + 16 = 20) and the channel, not 300 sockets.
      expect(fds(h.pid).length).toBeLessThan(300);
      h.chan.resume();
      await h.waitReplies(300, 30_000);
      const missing = Array.from({ length: 300 }, (_, i) => i + 1).filter((id) => h.answersFor(id).length !== 1);
      expect(missing).toEqual([]);
      expect(h.replies.every((r) => r.cmd === 'NODE_HANDLE')).toBe(true);
      expect(h.stderr).not.toContain('dropping a reply');
    } finally {
      await h.stop();
    }
  }, 60_000);

  it('fails a TCP probe whose ppoll keeps failing instead of spinning until its deadline', async () => {
    // x86_64: ppoll is 271, ENOMEM 12. The resident's own poll() is another system call.
    const h = new RawHelper([], { prefix: [launcher(), '271', '12'] });
    try {
      // The node's SYN to pod A is dropped by the lab: the connect stays in progress.
      h.chan.write(line({ id: 1, op: 'tcp', netns: SELF_NETNS, family: 4, ip: a.ipv4, port: server.ports.http as number, timeout_ms: 40_000 }));
      expect(await h.answer(1, 20_000)).toMatchObject({ ok: false, stage: 'poll', code: 'ENOMEM' });
    } finally {
      await h.stop();
    }
  }, 40_000);

  it('checks the proc root is a procfs at each open: a mount over it later is refused, not followed', async () => {
    const root = join(scratch, 'hostproc');
    mkdirSync(root);
    execFileSync('mount', ['--bind', '/proc', root]);
    let over = false;
    const h = new RawHelper(['--proc-root', root]);
    try {
      const pid = process.pid;
      h.chan.write(line({ id: 1, netns: `${root}/${pid}/ns/net`, family: 4 }));
      expect(await h.answer(1)).toMatchObject({ ok: true });
      // Something mounts a plain filesystem over the root, with <pid>/ns/net leading into pod A.
      execFileSync('mount', ['-t', 'tmpfs', 'none', root]);
      over = true;
      mkdirSync(join(root, String(pid), 'ns'), { recursive: true });
      symlinkSync(`/proc/${server.pid}/ns/net`, join(root, String(pid), 'ns', 'net'));
      h.chan.write(line({ id: 2, netns: `${root}/${pid}/ns/net`, family: 4 }));
      expect(await h.answer(2)).toMatchObject({ ok: false, stage: 'open', code: 'EXDEV', error: `the proc root ${root} is no longer a procfs mount` });
    } finally {
      await h.stop();
      if (over) execFileSync('umount', [root]);
      execFileSync('umount', [root]);
      rmdirSync(root);
    }
  });

  it('logs a cmd JSON-escaped: a newline in it cannot forge a log line', async () => {
    const h = new RawHelper([]);
    try {
      h.chan.write('{"cmd":"X\\nprobe-agent-netns-helper: forged"}\n');
      h.chan.write(line({ id: 1, netns: SELF_NETNS, family: 4 }));
      expect(await h.answer(1)).toMatchObject({ ok: true });
      expect(await waitFor(() => h.stderr.includes('agent sent'), 5000)).toBe(true);
      expect(h.stderr.split('\n')).not.toContain('probe-agent-netns-helper: forged');
      expect(h.stderr).toContain('probe-agent-netns-helper: agent sent "X\\u000aprobe-agent-netns-helper: forged"');
    } finally {
      await h.stop();
    }
  });
});

describe('the helper starts clean whatever its launcher left', () => {
  it('resets an ignored SIGCHLD and a blocked mask: its children are reaped and answered for, not reaped by the kernel behind its back', async () => {
    // Ignored, the kernel reaps the children itself: waitpid() never frees their slots, so the third request was "busy".
    const h = new RawHelper(['--max-children', '2'], { prefix: [launcher(), '--ignore', '17', '--block-all'] });
    try {
      h.chan.write(line({ id: 1, netns: SELF_NETNS, family: 4 }));
      expect(await h.answer(1)).toMatchObject({ ok: true });
      for (let id = 2; id <= 8; id++) {
        h.chan.write(line({ id, netns: SELF_NETNS, family: 4 }));
        expect(await h.answer(id), `request ${id}: ${h.stderr}`).toMatchObject({ ok: true });
      }
      expect(sigmask(h.pid, 'SigBlk')).toBe(0n);
      expect(sigmask(h.pid, 'SigIgn') & SIGCHLD_BIT).toBe(0n);
    } finally {
      await h.stop();
    }
  });

  it('pool: never signals a pid it reaped: an unrelated process that reuses a dead idle worker\'s pid lives on', async () => {
    // The helper in a pid namespace of its own, with SIGCHLD ignored as its launcher left it: a
    // worker killed while idle is the kernel's to reap, and ns_last_pid gives its pid to a `sleep`.
    const h = new RawHelper(['--pool', '1'], { prefix: ['unshare', '--pid', '--fork', '--kill-child', launcher(), '--ignore', '17'] });
    let other: ChildProcessWithoutNullStreams | undefined;
    try {
      expect(await waitFor(() => childrenOf(h.pid).length === 1, 10_000)).toBe(true);
      const helper = childrenOf(h.pid)[0] as number;
      h.chan.write(line({ id: 1, netns: SELF_NETNS, family: 4 }));
      expect(await h.answer(1), h.stderr).toMatchObject({ ok: true });
      const [worker] = childrenOf(helper);
      expect(worker).toBeDefined();
      const nsPid = Number(/^NSpid:\s+\d+\s+(\d+)$/m.exec(readFileSync(`/proc/${worker}/status`, 'utf8'))?.[1]);
      expect(nsPid).toBeGreaterThan(1);
      process.kill(worker as number, 'SIGKILL');
      // Dead: gone (reaped by the kernel, its pid free) or a zombie until the helper reaps it.
      expect(await waitFor(() => !alive(worker as number), 10_000), 'the worker is dead').toBe(true);
      other = spawn('nsenter', ['--target', String(helper), '--pid', '--', 'bash', '-c',
        `echo ${nsPid - 1} > /proc/sys/kernel/ns_last_pid; sleep 600 & echo "pid $!"; read -r _; kill -TERM $!; wait $!; echo "ended $?"`]);
      let out = '';
      other.stdout.on('data', (d: Buffer) => { out += d.toString(); });
      // It gets the worker's pid unless a zombie still holds it (then the next one).
      expect(await waitFor(() => out.includes('\n'), 10_000)).toBe(true);
      expect(out.trim()).toMatch(/^pid \d+$/);
      // The next request finds the dead worker's slot: a new worker serves it; nothing is killed.
      h.chan.write(line({ id: 2, netns: SELF_NETNS, family: 4 }));
      expect(await h.answer(2), h.stderr).toMatchObject({ ok: true });
      other.stdin.write('\n');
      expect(await waitFor(() => out.includes('ended'), 10_000)).toBe(true);
      // 143: our own SIGTERM ended it; 137 would be the helper's SIGKILL.
      expect(out).toContain('ended 143');
    } finally {
      other?.kill('SIGKILL');
      await h.stop();
    }
  }, 60_000);

  it.each([['ENOSYS (Linux < 5.9)', '38'], ['EPERM (a seccomp profile without it)', '1']])('starts and closes what it inherits when close_range fails with %s', async (_why, errno) => {
    for (const pool of [false, true]) {
      // x86_64: close_range is 436. A launcher's pipe comes along as fd 4.
      const h = new RawHelper(pool ? ['--pool', '1'] : [], { prefix: [launcher(), '436', errno], extraPipes: 1 });
      try {
        h.chan.write(line({ id: 1, netns: SELF_NETNS, family: 4 }));
        expect(await h.answer(1), h.stderr).toMatchObject({ ok: true });
        // Beyond stdio and the channel: nothing (pool: its worker's control socket and pidfd), never the pipe.
        // A descriptor may close between the listing and its readlink (the child's netns fd, once it has entered).
        const beyond = (pid: number): string[] => fds(pid).filter((fd) => Number(fd) > 3).flatMap((fd) => {
          try {
            return [readlinkSync(`/proc/${pid}/fd/${fd}`)];
          } catch {
            return [];
          }
        });
        expect(beyond(h.pid).filter((l) => l.startsWith('pipe:'))).toEqual([]);
        if (!pool) expect(beyond(h.pid)).toEqual([]);
        // A TCP probe to the dropped pod waits in the child (or worker) in the node's netns.
        h.chan.write(line({ id: 2, op: 'tcp', netns: SELF_NETNS, family: 4, ip: a.ipv4, port: server.ports.http as number, timeout_ms: 30_000 }));
        let child = 0;
        // Its connect's socket open, beyond stdio and the channel (a worker: also its control socket and home netns).
        expect(await waitFor(() => (child = childrenOf(h.pid)[0] ?? 0) > 0 && fds(child).length === (pool ? 7 : 5), 10_000), `${fds(child).join(',')} ${h.stderr}`).toBe(true);
        expect(beyond(child).filter((l) => !/^(socket|net):\[\d+\]$/.test(l))).toEqual([]);
        for (const fd of ['0', '1', '2', '3']) expect(readlinkSync(`/proc/${child}/fd/${fd}`)).toBe(readlinkSync(`/proc/${h.pid}/fd/${fd}`));
      } finally {
        await h.stop();
      }
    }
  }, 60_000);

  it('without close_range and without a procfs at /proc, closes every number below RLIMIT_NOFILE', async () => {
    // Its own mount namespace: the host's procfs at a proc root of its own, a tmpfs over /proc.
    const procRoot = join(scratch, 'proc-elsewhere');
    mkdirSync(procRoot, { recursive: true });
    const script = 'p=$1; shift; mount --make-rprivate / && mount -t proc proc "$p" && mount -t tmpfs none /proc && exec "$@"';
    const h = new RawHelper(['--proc-root', procRoot], { prefix: ['unshare', '--mount', 'sh', '-c', script, 'sh', procRoot, launcher(), '436', '38'], extraPipes: 1 });
    try {
      const netns = `${procRoot}/${process.pid}/ns/net`;
      h.chan.write(line({ id: 1, netns, family: 4 }));
      expect(await h.answer(1, 30_000), h.stderr).toMatchObject({ ok: true });
      expect(fds(h.pid).filter((fd) => Number(fd) > 3)).toEqual([]);
      h.chan.write(line({ id: 2, op: 'tcp', netns, family: 4, ip: a.ipv4, port: server.ports.http as number, timeout_ms: 30_000 }));
      let child = 0;
      expect(await waitFor(() => (child = childrenOf(h.pid)[0] ?? 0) > 0 && fds(child).length === 5, 30_000), `${fds(child).join(',')} ${h.stderr}`).toBe(true);
      expect(readlinkSync(`/proc/${child}/fd/4`)).toMatch(/^socket:\[\d+\]$/);
    } finally {
      await h.stop();
    }
  }, 90_000);

  it('pool: a request that starts a worker while the agent is not reading keeps the room for every answer and lost-worker news', async () => {
    // The agent's end is full from the start: every reply of the helper waits in its queue of
    // max-children + 16 + 2 x pool + 4 x pool = 23. 22 refusals fill it up to one free place; a
    // request starting a worker then needs two (its answer and, if the worker dies, the news).
    const h = new RawHelper(['--pool', '1', '--max-children', '1'], { prefix: [launcher(), '--fill-fd', '3'] });
    h.chan.pause();
    try {
      const refused = Array.from({ length: 22 }, (_, i) => line({ id: i + 1, netns: '/run/netns/../x', family: 4 }));
      const tcp = line({ id: 100, op: 'tcp', netns: SELF_NETNS, family: 4, ip: a.ipv4, port: server.ports.http as number, timeout_ms: 1500 });
      expect(await waitFor(() => existsSync(`/proc/${h.pid}/fd/3`) && readlinkSync(`/proc/${h.pid}/exe`).endsWith('probe-agent-netns-helper'), 10_000)).toBe(true);
      h.chan.write(refused.join('') + tcp);
      // Settled: it read all it will read (all of it, or all but the last request), and no worker
      // is alive (one that started has given up on the full channel and been answered for).
      const settled = (): boolean => childrenOf(h.pid).length === 0 && [0, Buffer.byteLength(tcp)].includes(unixRecvQ(h.pid, 3));
      for (let i = 0; i < 3; i++) {
        expect(await waitFor(settled, 30_000), `settled (${h.stderr})`).toBe(true);
        await sleep(300);
      }
      h.chan.resume();
      expect(await h.answer(100, 20_000), h.stderr).toMatchObject({ ok: true, tcp: 'timeout' });
      for (let id = 1; id <= 22; id++) expect(h.answersFor(id), `answers for ${id}`).toHaveLength(1);
      expect(h.answersFor(100)).toHaveLength(1);
      expect(h.stderr).not.toContain('dropping a reply');
    } finally {
      await h.stop();
    }
  }, 90_000);
});
