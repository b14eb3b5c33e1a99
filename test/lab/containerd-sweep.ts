/**
 * Slots and leftovers of the containerd lab. A slot (1..200) is an atomic mkdir under
 * /run/probe-agent-lab/ctrd-slots holding the owner pid; every name, subnet and directory of a lab
 * derives from its slot. The sweep is synchronous (usable from a process 'exit' handler) and
 * removes only what a slot's lab creates: its runtime (containerd or CRI-O), shims, conmons and
 * container processes, mounts under its scratch dir, its CNI bridge, cgroups and libcni cache files,
 * the scratch dir itself.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmdirSync, rmSync, writeFileSync } from 'node:fs';
import { createHash } from 'node:crypto';
import path from 'node:path';
import { removeCgroupTree } from '../support/cgroup-tree.ts';

const LAB_ROOT = '/run/probe-agent-lab';
const SLOTS_DIR = path.join(LAB_ROOT, 'ctrd-slots');
const MAX_SLOT = 200;

/** Names and paths that belong to one slot. */
export interface SlotLayout {
  slot: number;
  dir: string;
  bridge: string;
  network: string;
  cgroupPrefix: string;
  subnet4: string;
  subnet6: string;
}

/** The layout of slot `n`. */
export function slotLayout(n: number): SlotLayout {
  return {
    slot: n,
    dir: path.join(LAB_ROOT, 'ctrd', String(n)),
    bridge: `pactr${n}`,
    network: `probe-agent-ctrd-${n}`,
    cgroupPrefix: `probe-agent-ctrd-${n}`,
    subnet4: `10.251.${n}.0/24`,
    subnet6: `fd00:10:251:${n}::/64`,
  };
}

/** True when `pid` is a live (not zombie) process. */
export function pidAlive(pid: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const state = stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
    return state !== 'Z' && state !== 'X';
  } catch {
    return false;
  }
}

/** Takes a free slot (reclaiming one whose owner died, after sweeping it). */
export function allocateSlot(): number {
  mkdirSync(SLOTS_DIR, { recursive: true });
  for (let attempt = 0; attempt < 3; attempt++) {
    for (let n = 1; n <= MAX_SLOT; n++) {
      const dir = path.join(SLOTS_DIR, String(n));
      try {
        mkdirSync(dir);
        writeFileSync(path.join(dir, 'owner'), String(process.pid));
        return n;
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      }
      if (ownerOf(n) === undefined || pidAlive(ownerOf(n) as number)) continue;
      // Rename first: only one reclaimer wins the stale slot.
      const tomb = `${dir}.reclaim.${process.pid}`;
      try {
        renameSync(dir, tomb);
      } catch {
        continue;
      }
      sweepSlot(n);
      rmSync(tomb, { recursive: true, force: true });
      n--;
    }
  }
  throw new Error(`containerd lab: no free slot in ${SLOTS_DIR} (1..${MAX_SLOT})`);
}

function ownerOf(n: number): number | undefined {
  try {
    return Number(readFileSync(path.join(SLOTS_DIR, String(n), 'owner'), 'utf8').trim());
  } catch {
    // mkdir happened but owner not written yet: treat as alive (it is being taken right now).
    return undefined;
  }
}

/** Gives the slot back. */
export function releaseSlot(n: number): void {
  rmSync(path.join(SLOTS_DIR, String(n)), { recursive: true, force: true });
}

/** Records the running containerd pid of a slot (so a later reclaim can stop it). */
export function recordContainerdPid(n: number, pid: number | undefined): void {
  const f = path.join(SLOTS_DIR, String(n), 'containerd.pid');
  if (pid === undefined) rmSync(f, { force: true });
  else writeFileSync(f, String(pid));
}

/** Removes everything slot `n`'s lab may have left. Synchronous and best effort; never throws. */
export function sweepSlot(n: number): void {
  const lay = slotLayout(n);
  const ids = sandboxIds(lay.dir);
  const pids = new Set<number>();
  const recorded = readNumber(path.join(SLOTS_DIR, String(n), 'containerd.pid'));
  if (recorded && cmdlineOf(recorded).includes(`${lay.dir}/`)) pids.add(recorded);
  for (const p of ownPids(lay.dir)) pids.add(p);
  // CRI-O's containers have no pid file of ours: they are whatever runs in the slot's cgroups.
  for (const p of cgroupPids(lay.cgroupPrefix)) pids.add(p);
  for (const p of pids) kill(p, 'SIGKILL');
  waitGone([...pids], 3000);
  for (const mnt of mountsUnder(lay.dir).reverse()) quiet(() => execFileSync('umount', ['-l', mnt], { stdio: 'ignore' }));
  quiet(() => execFileSync('ip', ['link', 'del', lay.bridge], { stdio: 'ignore' }));
  removeCgroups(lay.cgroupPrefix);
  for (const f of listDir('/var/lib/cni/results')) {
    const mine = f.startsWith(`${lay.network}-`) || ids.some((id) => f === `cni-loopback-${id}-lo`);
    if (mine) quiet(() => rmSync(path.join('/var/lib/cni/results', f), { force: true }));
  }
  // containerd 1.6 names a shim's socket sha256("<grpc address>/<namespace>/<id>") under /run/containerd/s;
  // a killed shim leaves it behind.
  for (const id of ids) {
    const sock = createHash('sha256').update(`${lay.dir}/containerd.sock/k8s.io/${id}`).digest('hex');
    quiet(() => rmSync(path.join('/run/containerd/s', sock), { force: true }));
  }
  quiet(() => rmSync(lay.dir, { recursive: true, force: true }));
}

/** Removes empty shared dirs containerd/libcni create, when no other containerd lab is alive. */
export function removeSharedLeftovers(mySlot: number): void {
  const others = listDir(SLOTS_DIR).filter((e) => /^\d+$/.test(e) && Number(e) !== mySlot);
  if (others.some((e) => pidAlive(ownerOf(Number(e)) ?? 0) || ownerOf(Number(e)) === undefined)) return;
  for (const d of ['/run/containerd/s', '/run/containerd', '/var/lib/cni/results', '/var/lib/cni']) {
    quiet(() => rmdirSync(d));
  }
}

/** Sandbox/task ids containerd knows in this lab's root and state. */
function sandboxIds(dir: string): string[] {
  const ids = new Set<string>();
  for (const d of [
    path.join(dir, 'state', 'io.containerd.runtime.v2.task', 'k8s.io'),
    path.join(dir, 'root', 'io.containerd.grpc.v1.cri', 'sandboxes'),
    path.join(dir, 'state', 'io.containerd.grpc.v1.cri', 'sandboxes'),
  ]) {
    for (const id of listDir(d)) if (/^[0-9a-f]{64}$/.test(id)) ids.add(id);
  }
  return [...ids];
}

/**
 * Every process naming the slot's dir (the runtime, its shims or conmons, whatever the lab started on
 * its socket) and the sandbox processes containerd's shims recorded.
 */
function ownPids(dir: string): number[] {
  const out: number[] = [];
  for (const e of listDir('/proc')) {
    if (!/^\d+$/.test(e) || Number(e) === process.pid) continue;
    if (cmdlineOf(Number(e)).includes(`${dir}/`)) out.push(Number(e));
  }
  const tasks = path.join(dir, 'state', 'io.containerd.runtime.v2.task', 'k8s.io');
  for (const id of listDir(tasks)) {
    for (const f of ['init.pid', 'shim.pid']) {
      const p = readNumber(path.join(tasks, id, f));
      if (p) out.push(p);
    }
  }
  return out;
}

/** Mount points at or below `dir` (from this process's mountinfo, octal escapes decoded), in mount order. */
export function mountsUnder(dir: string): string[] {
  try {
    return readFileSync('/proc/self/mountinfo', 'utf8')
      .split('\n')
      .map((l) => l.split(' ')[4] ?? '')
      .map((m) => m.replace(/\\(\d{3})/g, (_s, o: string) => String.fromCharCode(parseInt(o, 8))))
      .filter((m) => m === dir || m.startsWith(`${dir}/`));
  } catch {
    return [];
  }
}

function cgroupPids(prefix: string): number[] {
  const out: number[] = [];
  const walk = (d: string): void => {
    for (const p of (readText(path.join(d, 'cgroup.procs')) ?? '').split('\n')) if (/^\d+$/.test(p)) out.push(Number(p));
    for (const e of listDir(d)) if (existsSync(path.join(d, e, 'cgroup.procs'))) walk(path.join(d, e));
  };
  for (const ctrl of listDir('/sys/fs/cgroup')) {
    const top = path.join('/sys/fs/cgroup', ctrl, prefix);
    if (existsSync(top)) walk(top);
  }
  return [...new Set(out)];
}

function readText(f: string): string | undefined {
  try {
    return readFileSync(f, 'utf8');
  } catch {
    return undefined;
  }
}

function removeCgroups(prefix: string): void {
  for (const ctrl of listDir('/sys/fs/cgroup')) {
    const top = path.join('/sys/fs/cgroup', ctrl, prefix);
    if (existsSync(top)) removeCgroupTree(top);
  }
}


function cmdlineOf(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ');
  } catch {
    return '';
  }
}

function readNumber(f: string): number | undefined {
  try {
    const n = Number(readFileSync(f, 'utf8').trim());
    return Number.isInteger(n) && n > 0 ? n : undefined;
  } catch {
    return undefined;
  }
}

function listDir(d: string): string[] {
  try {
    return readdirSync(d);
  } catch {
    return [];
  }
}

function kill(pid: number, sig: NodeJS.Signals): void {
  quiet(() => process.kill(pid, sig));
}

/** Busy-waits (synchronously, for exit handlers) until the pids are gone or zombies. */
export function waitGone(pids: number[], timeoutMs: number): boolean {
  const end = Date.now() + timeoutMs;
  while (pids.some(pidAlive)) {
    if (Date.now() > end) return false;
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 20);
  }
  return true;
}

function quiet(fn: () => void): void {
  try {
    fn();
  } catch {
    // best effort: the thing is already gone, or will be retried by the next sweep
  }
}
