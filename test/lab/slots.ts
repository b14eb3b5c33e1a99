/**
 * Lab slots: a number 1..200 that a test process owns exclusively, from which every kernel object
 * name (netns, links, nft table) and subnet of its lab is derived, so parallel test files never
 * collide. Ownership is an atomic mkdir plus an owner file; a slot whose owner died is reclaimed
 * (its leftovers deleted first) under a second atomic mkdir, so two reclaimers never race.
 * Everything here is synchronous because it also runs from process 'exit' handlers.
 */
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, readlinkSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ProbeAgentError } from '../../agent/errors.ts';

/** Root of all lab state on the node (slots, cached certs). */
export const LAB_ROOT = '/run/probe-agent-lab';
/**
 * A fresh private directory `LAB_ROOT/<prefix>XXXXXX` for one test's scratch files (bind mounts, fake
 * host dirs, sockets). LAB_ROOT is created first: on a machine that never ran a lab it does not exist.
 */
export function labScratch(prefix: string): string {
  mkdirSync(LAB_ROOT, { recursive: true, mode: 0o755 });
  return mkdtempSync(join(LAB_ROOT, prefix));
}

/** One directory per claimed slot. */
export const SLOTS_DIR = join(LAB_ROOT, 'slots');
/** Highest slot number; it is also the third IPv4 octet, so it must stay below 255. */
export const MAX_SLOT = 200;
/** An owner file this old that is still missing means its creator died between mkdir and write. */
const ORPHAN_DIR_GRACE_MS = 10_000;

/** A lab failure: bad options, a command that failed, a server that did not come up. */
export class LabError extends ProbeAgentError {
  constructor(message: string, context: Record<string, unknown> = {}, options?: { cause?: unknown }) {
    super('lab', message, context, options);
  }
}

/** Who owns a slot: the pid plus its kernel start time, so a recycled pid is never mistaken for the owner. */
export interface SlotOwner {
  pid: number;
  start: string;
  tag: string;
  createdAt: string;
}

/** The kernel object names and subnets belonging to one slot. */
export interface SlotNames {
  slot: number;
  bridge: string;
  nftTable: string;
  netns(i: number): string;
  hostVeth(i: number): string;
  podV4(i: number): string;
  podV6(i: number): string;
  gatewayV4: string;
  gatewayV6: string;
  subnetV4: string;
  subnetV6: string;
  /** Link group (`ip link ... group N`) of the bridge and host veths, for a one-shot delete. */
  linkGroup: number;
}

/** Base of the lab link groups: "PA" in the top bytes keeps them clear of groups others use. */
const LINK_GROUP_BASE = 0x50410000;

/** Derives every name and address of slot `n`; pod indexes start at 1. */
export function slotNames(n: number): SlotNames {
  assertSlot(n);
  return {
    slot: n,
    bridge: `pa${n}br`,
    nftTable: `probe_agent_lab_${n}`,
    netns: (i) => `pa${n}p${i}`,
    hostVeth: (i) => `pa${n}v${i}`,
    podV4: (i) => `10.250.${n}.${i + 1}`,
    podV6: (i) => `fd00:10:250:${n}::${(i + 1).toString(16)}`,
    gatewayV4: `10.250.${n}.1`,
    gatewayV6: `fd00:10:250:${n}::1`,
    subnetV4: `10.250.${n}.0/24`,
    subnetV6: `fd00:10:250:${n}::/64`,
    linkGroup: LINK_GROUP_BASE + n,
  };
}

function assertSlot(n: number): void {
  if (!Number.isInteger(n) || n < 1 || n > MAX_SLOT) throw new LabError(`slot must be an integer 1..${MAX_SLOT}`, { slot: n });
}

/** The kernel start time of `pid` (field 22 of /proc/<pid>/stat), or undefined when it is gone or a zombie. */
export function processStart(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // The command name (field 2) may contain spaces and parentheses: parse after the last ')'.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    // PID 1 here reaps orphans lazily, so a dead owner can linger as a zombie: count it as dead.
    if (fields[0] === 'Z' || fields[0] === 'X') return undefined;
    return fields[19];
  } catch {
    return undefined;
  }
}

/** The current process as a slot owner. */
function me(tag: string): SlotOwner {
  return { pid: process.pid, start: processStart(process.pid) ?? '?', tag, createdAt: new Date().toISOString() };
}

/** Reads an owner file; undefined when missing or unreadable. */
export function readOwner(file: string): SlotOwner | undefined {
  try {
    const o = JSON.parse(readFileSync(file, 'utf8')) as SlotOwner;
    return Number.isInteger(o.pid) ? o : undefined;
  } catch {
    return undefined;
  }
}

/** True when the owner process still runs (same pid and same start time). */
export function ownerAlive(o: SlotOwner): boolean {
  return processStart(o.pid) === o.start;
}

/** Writes an owner file atomically (tmp + rename), so readers never see half a file. */
function writeOwner(file: string, owner: SlotOwner): void {
  const tmp = `${file}.tmp.${process.pid}.${Math.random().toString(36).slice(2)}`;
  writeFileSync(tmp, JSON.stringify(owner));
  renameSync(tmp, file);
}

/** Milliseconds since the directory was last modified, or Infinity when it is gone. */
function ageMs(path: string): number {
  try {
    return Date.now() - statSync(path).mtimeMs;
  } catch {
    return Infinity;
  }
}

/** True when a slot (or reclaim) directory's owner is gone: dead, or never written long ago. */
function ownerGone(dir: string): boolean {
  const o = readOwner(join(dir, 'owner'));
  return o ? !ownerAlive(o) : ageMs(dir) > ORPHAN_DIR_GRACE_MS;
}

/** Claims a free slot (or reclaims a dead owner's), returning its number; throws when all are busy. */
export function claimSlot(tag = ''): number {
  mkdirSync(SLOTS_DIR, { recursive: true });
  for (let n = 1; n <= MAX_SLOT; n++) {
    const dir = join(SLOTS_DIR, String(n));
    try {
      mkdirSync(dir);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      if (ownerGone(dir) && reclaim(n, tag)) return n;
      continue;
    }
    writeOwner(join(dir, 'owner'), me(tag));
    // A slot directory that did not exist should have no kernel objects; someone may have wiped
    // /run/probe-agent-lab by hand, though, so check the cheap way (no process spawned).
    if (hasNetnsOrLinks(n)) deleteSlotObjects(n);
    return n;
  }
  throw new LabError(`all ${MAX_SLOT} lab slots are in use; run \`node test/lab/sweep.ts\` to clear dead owners`);
}

/**
 * Takes over slot `n` from a dead owner. The reclaim lock is a second atomic mkdir; after taking it
 * the owner is checked again, because another reclaimer may have finished (and now own the slot)
 * between our first look and our mkdir.
 */
function reclaim(n: number, tag: string): boolean {
  const dir = join(SLOTS_DIR, String(n));
  const lock = join(dir, 'reclaim');
  try {
    mkdirSync(lock);
  } catch {
    // Busy (or a reclaimer died mid-way: sweep.ts clears that); use another slot.
    return false;
  }
  try {
    writeOwner(join(lock, 'owner'), me(tag));
    if (!ownerGone(dir)) return false;
    deleteSlotObjects(n);
    writeOwner(join(dir, 'owner'), me(tag));
    return true;
  } finally {
    rmSync(lock, { recursive: true, force: true });
  }
}

/** Releases a slot this process owns (after its kernel objects are gone). */
export function releaseSlot(n: number): void {
  const dir = join(SLOTS_DIR, String(n));
  const o = readOwner(join(dir, 'owner'));
  if (o && o.pid !== process.pid) return; // reclaimed by someone else after we were thought dead
  rmSync(dir, { recursive: true, force: true });
}

function netnsOf(n: number): string[] {
  const re = new RegExp(`^pa${n}p\\d+$`);
  try {
    return readdirSync('/run/netns').filter((name) => re.test(name));
  } catch {
    return [];
  }
}

function linksOf(n: number): string[] {
  const re = new RegExp(`^pa${n}(br|v\\d+)$`);
  return readdirSync('/sys/class/net').filter((name) => re.test(name));
}

function hasNetnsOrLinks(n: number): boolean {
  return netnsOf(n).length > 0 || linksOf(n).length > 0;
}

/**
 * Pids whose network namespace is one of `netnsPaths` (what `ip netns pids` does), so servers
 * orphaned by a crashed test can be killed before their netns is deleted.
 */
export function pidsInNetns(netnsPaths: string[]): number[] {
  const inodes = new Set<string>();
  for (const p of netnsPaths) {
    try {
      inodes.add(`net:[${statSync(p).ino}]`);
    } catch {
      // already gone
    }
  }
  if (inodes.size === 0) return [];
  const pids: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
    try {
      if (inodes.has(readlinkSync(`/proc/${entry}/ns/net`))) pids.push(Number(entry));
    } catch {
      // exited meanwhile, or a kernel thread
    }
  }
  return pids;
}

/** Runs a command synchronously, ignoring its failure (teardown is best effort). */
function tryRun(cmd: string, args: string[], input?: string): void {
  try {
    execFileSync(cmd, args, { input, stdio: ['pipe', 'ignore', 'ignore'], timeout: 10_000 });
  } catch {
    // best effort: the object may already be gone
  }
}

/**
 * Deletes every kernel object slot `n` may own: processes inside its netns, its nft table, its
 * links and its netns. Synchronous and idempotent; only ever touches names derived from `n`.
 */
export function deleteSlotObjects(n: number, podNetns: string[] = []): void {
  const names = slotNames(n);
  const netns = [...new Set([...podNetns, ...netnsOf(n)])];
  for (const pid of pidsInNetns(netns.map((ns) => `/run/netns/${ns}`))) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
  tryRun('nft', ['delete', 'table', 'inet', names.nftTable]);
  // One group delete unregisters all links in one go (one RCU sync instead of one per link:
  // ~40 ms instead of ~140 ms for 3 pods); deleting a host veth also deletes its eth0 peer.
  const lines = [
    ...(linksOf(n).length > 0 ? [`link del group ${names.linkGroup}`] : []),
    ...netns.map((ns) => `netns del ${ns}`),
  ];
  if (lines.length > 0) tryRun('ip', ['-force', '-batch', '-'], lines.join('\n') + '\n');
  // Links outside the group (made by hand, or by an older lab version) go by name.
  const rest = linksOf(n).sort((x, y) => Number(x === names.bridge) - Number(y === names.bridge));
  if (rest.length > 0) tryRun('ip', ['-force', '-batch', '-'], rest.map((l) => `link del ${l}`).join('\n') + '\n');
}

/** Slot numbers of the lab nft tables that exist now (one `nft list tables`). */
function labTables(): Set<number> {
  try {
    const out = execFileSync('nft', ['list', 'tables'], { encoding: 'utf8', timeout: 10_000 });
    return new Set([...out.matchAll(/^table inet probe_agent_lab_(\d+)$/gm)].map((m) => Number(m[1])));
  } catch {
    return new Set();
  }
}

/** Clears dead owners' slots (and stale reclaim locks and unowned objects); returns the slots cleaned. */
export function sweepSlots(): number[] {
  const cleaned: number[] = [];
  const tables = labTables();
  for (let n = 1; n <= MAX_SLOT; n++) {
    const dir = join(SLOTS_DIR, String(n));
    if (ageMs(dir) === Infinity) {
      if (!hasNetnsOrLinks(n) && !tables.has(n)) continue;
      // Unowned objects: claim the slot ourselves (atomic) so nobody builds there while we delete.
      try {
        mkdirSync(SLOTS_DIR, { recursive: true });
        mkdirSync(dir);
      } catch {
        continue;
      }
      writeOwner(join(dir, 'owner'), me('sweep'));
      deleteSlotObjects(n);
      rmSync(dir, { recursive: true, force: true });
      cleaned.push(n);
      continue;
    }
    const lock = join(dir, 'reclaim');
    if (ageMs(lock) !== Infinity && ownerGone(lock)) rmSync(lock, { recursive: true, force: true });
    if (ownerGone(dir) && reclaim(n, 'sweep')) {
      rmSync(dir, { recursive: true, force: true });
      cleaned.push(n);
    }
  }
  return cleaned;
}
