/**
 * Fallback resolver without the runtime: scan <procRoot>/[0-9]*\/cgroup for processes in the pod's
 * kubelet cgroup and return <procRoot>/<pid>/ns/net of one of them. All containers of a pod share
 * one netns, so the processes must agree (by netns inode); disagreement is refused as ambiguous.
 * The agent needs the host's /proc (hostPID, or a mount) for this to see pod processes.
 */
import { closeSync, openSync, readSync } from 'node:fs';
import { open, readdir, stat } from 'node:fs/promises';
import { ConfigError, UnsupportedPodError, describeError } from '../errors.ts';
import { cgroupTextHasPod, isRuntimeHelperCgroup, parseCgroupFile, podCgroupOf } from './cgroup.ts';
import { NetnsPathChecker } from './netns-path.ts';
import {
  DEFAULT_SANDBOXED_RUNTIMES,
  checkPodRef,
  refuseSandboxedRuntimeClass,
  podLabel,
  resolveFailure,
  throwIfAborted,
  type NetnsResolution,
  type NetnsResolver,
  type PodRef,
} from './resolver.ts';

/** Options of the procfs resolver. */
export interface ProcfsResolverOptions {
  /** Default /proc; tests and containerised agents point it at the host's procfs. */
  procRoot?: string;
  /** Cap on processes examined per scan; default 65536. */
  maxProcesses?: number;
  /** Parallel cgroup file reads; default 16. (Unused: scans read in synchronous batches; kept for compatibility.) */
  concurrency?: number;
  /** How long a scan answers for pods it found processes of (each pid is re-checked); default 30 s, 0 = always scan. */
  hitReuseMs?: number;
  /** How long a scan answers "no process" for a pod; default 0 = always scan. */
  missReuseMs?: number;
  pathChecker?: NetnsPathChecker;
  /**
   * The node's netns, to set aside the pod's processes that are not in its netns. Default:
   * <procRoot>/1/ns/net, else the agent's own (it runs with hostNetwork); PID 1 may be unreadable
   * (e.g. a non-dumpable init).
   */
  nodeNetnsPath?: string;
  /** Pods with one of these runtimeClassNames are refused (UnsupportedPodError); default DEFAULT_SANDBOXED_RUNTIMES. */
  sandboxedRuntimeClasses?: readonly string[];
}

const MAX_CGROUP_BYTES = 64 * 1024;
/**
 * Processes read per event-loop turn. procfs files are in memory: a synchronous open/read/close
 * is about 10 µs where the fs/promises round trips cost about 60 µs of CPU each; a batch keeps
 * the loop blocked for about a millisecond at a time.
 */
const SCAN_BATCH = 128;
const DEFAULT_HIT_REUSE_MS = 30_000;
/*
 * A miss is not reused by default: a runtime may move a new process into the pod's cgroup after
 * it started, so no cheap check tells a stale miss from a true one, and a new pod must be found
 * at once. Concurrent misses still share one scan.
 */
const DEFAULT_MISS_REUSE_MS = 0;

/** Resolves a pod's netns from its processes' cgroups. */
export class ProcfsResolver implements NetnsResolver {
  readonly name = 'procfs' as const;
  readonly procRoot: string;
  readonly #maxProcesses: number;
  readonly #checker: NetnsPathChecker;
  readonly #nodeNetns: string[];
  #nodeInode: number | undefined;
  readonly #sandboxedClasses: readonly string[];
  #scanning: Promise<Map<string, number[]>> | undefined;
  #lastScan: { at: number; byPod: Map<string, number[]> } | undefined;
  readonly #hitReuseMs: number;
  readonly #missReuseMs: number;

  constructor(opts: ProcfsResolverOptions = {}) {
    this.#sandboxedClasses = opts.sandboxedRuntimeClasses ?? DEFAULT_SANDBOXED_RUNTIMES;
    this.#checker = opts.pathChecker ?? new NetnsPathChecker(opts.procRoot === undefined ? {} : { procRoot: opts.procRoot });
    if (opts.procRoot !== undefined && opts.pathChecker && opts.pathChecker.procRoot !== opts.procRoot.replace(/\/+$/, '')) {
      throw new ConfigError(`procfs resolver: procRoot ${opts.procRoot} differs from the path checker's ${opts.pathChecker.procRoot}`);
    }
    this.procRoot = this.#checker.procRoot;
    this.#maxProcesses = Math.max(1, opts.maxProcesses ?? 65_536);
    this.#hitReuseMs = Math.max(0, opts.hitReuseMs ?? DEFAULT_HIT_REUSE_MS);
    this.#missReuseMs = Math.max(0, opts.missReuseMs ?? DEFAULT_MISS_REUSE_MS);
    this.#nodeNetns = opts.nodeNetnsPath ? [opts.nodeNetnsPath] : [`${this.procRoot}/1/ns/net`, '/proc/self/ns/net'];
  }

  /** Scans processes for the pod's cgroup; returns <procRoot>/<pid>/ns/net of one of them. */
  async resolve(pod: PodRef, signal?: AbortSignal): Promise<NetnsResolution> {
    checkPodRef(pod);
    refuseSandboxedRuntimeClass(pod, this.#sandboxedClasses);
    const reused = this.#reusable(pod.uid);
    if (reused?.length === 0) return this.#resolveFrom(pod, reused, signal);
    if (reused) {
      // The pods of one refresh share a recent scan; anything it says is checked again below, and
      // a pod whose processes all went since is looked up in a new scan rather than reported missing.
      try {
        return await this.#resolveFrom(pod, reused, signal);
      } catch (err) {
        if (err instanceof UnsupportedPodError) throw err;
      }
    }
    return this.#resolveFrom(pod, await this.#podPids(pod.uid, signal), signal);
  }

  /** The pids a recent scan lists for `uid` (empty: a recent scan found none), or undefined when a new scan is due. */
  #reusable(uid: string): number[] | undefined {
    const last = this.#lastScan;
    if (!last) return undefined;
    const age = Date.now() - last.at;
    const pids = last.byPod.get(uid.toLowerCase());
    if (pids) return age < this.#hitReuseMs ? pids : undefined;
    return age < this.#missReuseMs ? [] : undefined;
  }

  async #resolveFrom(pod: PodRef, pids: number[], signal?: AbortSignal): Promise<NetnsResolution> {
    const who = podLabel(pod);
    if (pids.length === 0) throw resolveFailure('not-found', `pod ${who}: no process in the pod's cgroup under ${this.procRoot}`, { uid: pod.uid });

    const byInode = new Map<number, number[]>();
    for (const pid of pids) {
      const ino = await this.#netInode(pid);
      if (ino === undefined) continue;
      const group = byInode.get(ino);
      if (group) group.push(pid);
      else byInode.set(ino, [pid]);
    }
    if (byInode.size === 0) throw resolveFailure('not-found', `pod ${who}: its processes exited during the scan`, { uid: pod.uid });
    const hostIno = await this.#nodeNetnsInode();
    if (hostIno !== undefined && byInode.has(hostIno)) {
      // hostNetwork pods never get here (the pod model leaves them to kubelet): a process of a pod
      // that is starting sits in its cgroup before it enters the pod's netns. Try again later.
      if (byInode.size === 1) {
        throw resolveFailure('not-found', `pod ${who}: its processes are all still in the node's network namespace (a container starting)`, { uid: pod.uid });
      }
      // Runtime helpers (e.g. conmon) can sit in the pod cgroup while living in the node netns.
      byInode.delete(hostIno);
    }
    if (byInode.size > 1) {
      const groups = [...byInode.entries()].map(([ino, ps]) => `net:[${ino}] pids ${ps.slice(0, 5).join(',')}`).join('; ');
      throw resolveFailure('ambiguous', `pod ${who}: its processes are in ${byInode.size} different network namespaces (${groups})`, { uid: pod.uid });
    }
    const [inode, group] = [...byInode.entries()][0] as [number, number[]];
    // The lowest pid is most likely the long-lived sandbox (pause) process.
    for (const pid of group.sort((a, b) => a - b)) {
      throwIfAborted(signal, `resolving the netns of pod ${who}`);
      let checked;
      try {
        checked = await this.#checker.check(this.#checker.procNetPath(pid));
      } catch {
        continue;
      }
      // The pid could have been reused between the scan and now: it must still be the pod's, in the same netns.
      if (checked.inode !== inode || !(await this.#inPod(pid, pod.uid))) continue;
      return { path: checked.path, resolver: 'procfs', inode: checked.inode };
    }
    throw resolveFailure('not-found', `pod ${who}: its processes exited during the scan`, { uid: pod.uid });
  }

  async #podPids(uid: string, signal?: AbortSignal): Promise<number[]> {
    throwIfAborted(signal, `scanning ${this.procRoot}`);
    const scan = this.#scanning ??= this.#scan().then((byPod) => {
      this.#lastScan = { at: Date.now(), byPod };
      return byPod;
    }).finally(() => {
      this.#scanning = undefined;
    });
    if (!signal) return (await scan).get(uid.toLowerCase()) ?? [];
    return new Promise<number[]>((resolve, reject) => {
      const onAbort = (): void => reject(resolveFailure('unavailable', `scanning ${this.procRoot}: aborted`, {}, signal.reason));
      signal.addEventListener('abort', onAbort, { once: true });
      scan.then((byPod) => resolve(byPod.get(uid.toLowerCase()) ?? []), reject).finally(() => signal.removeEventListener('abort', onAbort));
    });
  }

  /**
   * One pass over <procRoot>/*\/cgroup: pod UID -> pids in that pod's cgroup (runtime helpers
   * left out). Shared by every resolution that starts while it runs: pods no process belongs to
   * are re-resolved every probe period, and a scan per pod would grow as pods x processes.
   */
  async #scan(): Promise<Map<string, number[]>> {
    let entries: string[];
    try {
      entries = await readdir(this.procRoot);
    } catch (err) {
      throw resolveFailure('unavailable', `cannot list ${this.procRoot}: ${describeError(err)}`, {}, err);
    }
    const all = entries.filter((e) => /^\d+$/.test(e)).slice(0, this.#maxProcesses).map(Number);
    const byPod = new Map<string, number[]>();
    const buf = Buffer.allocUnsafe(MAX_CGROUP_BYTES);
    for (let next = 0; next < all.length; next += SCAN_BATCH) {
      if (next > 0) await new Promise<void>((resolve) => setImmediate(resolve));
      for (const pid of all.slice(next, next + SCAN_BATCH)) {
        const text = readSmallSync(`${this.procRoot}/${pid}/cgroup`, buf);
        if (!text || isRuntimeHelperCgroup(text)) continue;
        for (const uid of podUidsOf(text)) {
          const pids = byPod.get(uid);
          if (pids) pids.push(pid);
          else byPod.set(uid, [pid]);
        }
      }
    }
    return byPod;
  }

  async #nodeNetnsInode(): Promise<number | undefined> {
    if (this.#nodeInode !== undefined) return this.#nodeInode;
    for (const p of this.#nodeNetns) {
      try {
        this.#nodeInode = (await stat(p)).ino;
        return this.#nodeInode;
      } catch {
        // try the next one
      }
    }
    return undefined;
  }

  async #inPod(pid: number, uid: string): Promise<boolean> {
    const text = await readSmall(`${this.procRoot}/${pid}/cgroup`, Buffer.allocUnsafe(MAX_CGROUP_BYTES));
    return text !== undefined && cgroupTextHasPod(text, uid);
  }

  async #netInode(pid: number): Promise<number | undefined> {
    try {
      return (await stat(`${this.procRoot}/${pid}/ns/net`)).ino;
    } catch {
      // Exited, a zombie (no namespaces left), or a kernel thread we may not inspect.
      return undefined;
    }
  }
}

/** The pod UIDs (lower-case) whose kubelet cgroup a /proc/<pid>/cgroup text names (cgroupTextHasPod, for every UID at once). */
function podUidsOf(text: string): Set<string> {
  const out = new Set<string>();
  for (const line of parseCgroupFile(text)) {
    const uid = podCgroupOf(line.path)?.uid;
    if (uid) out.add(uid);
  }
  return out;
}

/** readSmall, synchronously: for procfs files, which never wait for a disk. */
function readSmallSync(file: string, buf: Buffer): string | undefined {
  let fd: number | undefined;
  try {
    fd = openSync(file, 'r');
    let len = 0;
    for (;;) {
      const n = readSync(fd, buf, len, buf.length - len, null);
      len += n;
      if (n === 0 || len >= buf.length) break;
    }
    return buf.toString('utf8', 0, len);
  } catch {
    return undefined;
  } finally {
    if (fd !== undefined) {
      try {
        closeSync(fd);
      } catch {
        // already gone
      }
    }
  }
}

/** Reads at most buf.length bytes into `buf`; undefined when the process is gone. */
async function readSmall(file: string, buf: Buffer): Promise<string | undefined> {
  let fh;
  try {
    fh = await open(file, 'r');
    let len = 0;
    for (;;) {
      const { bytesRead } = await fh.read(buf, len, buf.length - len, null);
      if (bytesRead === 0 || len + bytesRead >= buf.length) {
        len += bytesRead;
        break;
      }
      len += bytesRead;
    }
    return buf.subarray(0, len).toString('utf8');
  } catch {
    return undefined;
  } finally {
    await fh?.close().catch(() => {});
  }
}
