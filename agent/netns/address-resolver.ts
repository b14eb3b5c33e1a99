/**
 * Last-resort resolver: find the named netns whose interfaces hold the pod's IPs. Node cannot
 * enter a netns itself (threads), so each netns is listed with `ip -n <name> -j addr` (or
 * `nsenter --net=<path> ip -j addr` for extra dirs). Costly, hence last in the chain and cached.
 * Exactly one netns must hold the pod's IPs; overlapping addresses (multi-network, stale netns)
 * are refused rather than guessed.
 */
import { execFile } from 'node:child_process';
import { readdir, realpath, stat } from 'node:fs/promises';
import { isIP } from 'node:net';
import path from 'node:path';
import { UnsupportedPodError, describeError } from '../errors.ts';
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

/** Options of the address resolver. */
export interface AddressResolverOptions {
  /** Directories whose netns files are searched; default the checker's dirs. */
  dirs?: readonly string[];
  pathChecker?: NetnsPathChecker;
  /** Cap on netns examined per resolve; default 1024. */
  maxNamespaces?: number;
  /** Per-netns listing timeout; default 2 s. */
  timeoutMs?: number;
  /** Parallel listings; default 4. */
  concurrency?: number;
  /** Also refuse pods whose IP is a node address (hostNetwork); default true. */
  checkNodeAddresses?: boolean;
  /** Only netns files whose name matches are examined (e.g. /^cni-/); default all. */
  nameFilter?: RegExp;
  /** Pods with one of these runtimeClassNames are refused (UnsupportedPodError); default DEFAULT_SANDBOXED_RUNTIMES. */
  sandboxedRuntimeClasses?: readonly string[];
}

/** iproute2's netns dir: `ip -n NAME` finds NAME only there. */
const IP_NETNS_DIR = '/run/netns';
const MAX_OUTPUT = 1024 * 1024;

/** Resolves a pod's netns by matching status.podIPs to interface addresses. */
export class AddressResolver implements NetnsResolver {
  readonly name = 'address' as const;
  readonly #checker: NetnsPathChecker;
  readonly #dirs: readonly string[];
  readonly #max: number;
  readonly #timeoutMs: number;
  readonly #concurrency: number;
  readonly #checkNode: boolean;
  readonly #nameFilter: RegExp | undefined;
  readonly #sandboxedClasses: readonly string[];

  constructor(opts: AddressResolverOptions = {}) {
    this.#sandboxedClasses = opts.sandboxedRuntimeClasses ?? DEFAULT_SANDBOXED_RUNTIMES;
    this.#checker = opts.pathChecker ?? new NetnsPathChecker(opts.dirs ? { extraDirs: opts.dirs } : {});
    this.#dirs = opts.dirs ?? this.#checker.dirs;
    this.#max = Math.max(1, opts.maxNamespaces ?? 1024);
    this.#timeoutMs = Math.max(100, opts.timeoutMs ?? 2000);
    this.#concurrency = Math.min(16, Math.max(1, opts.concurrency ?? 4));
    this.#checkNode = opts.checkNodeAddresses ?? true;
    this.#nameFilter = opts.nameFilter;
  }

  /** Lists every netns's addresses and returns the one netns holding the pod's IPs. */
  async resolve(pod: PodRef, signal?: AbortSignal): Promise<NetnsResolution> {
    checkPodRef(pod);
    refuseSandboxedRuntimeClass(pod, this.#sandboxedClasses);
    const who = podLabel(pod);
    if (pod.podIPs.length === 0) throw resolveFailure('not-found', `pod ${who} has no IPs yet`, { uid: pod.uid });
    const want = pod.podIPs.map((ip) => {
      const c = canonicalIp(ip);
      if (!c) throw resolveFailure('invalid', `pod ${who}: invalid pod IP ${JSON.stringify(ip)}`, { uid: pod.uid });
      return c;
    });

    if (this.#checkNode) {
      const node = await this.#list(undefined).catch((err: unknown) => {
        throw resolveFailure('unavailable', `cannot list the node's addresses: ${describeError(err)}`, {}, err);
      });
      const clash = want.find((ip) => node.has(ip));
      if (clash) throw new UnsupportedPodError(`pod ${who}: IP ${clash} is a node address (hostNetwork): probed by kubelet, not by us`, { uid: pod.uid });
    }

    const files = await this.#netnsFiles();
    // Keyed by netns inode: one netns mounted under two names (bind mounts, /var/run vs /run) is one candidate.
    const full = new Map<number, { index: number; file: string }>();
    const partial = new Map<number, { index: number; file: string }>();
    const errors: string[] = [];
    const note = (m: Map<number, { index: number; file: string }>, ino: number, index: number, file: string): void => {
      const cur = m.get(ino);
      if (!cur || index < cur.index) m.set(ino, { index, file });
    };
    let next = 0;
    const worker = async (): Promise<void> => {
      while (next < files.length) {
        throwIfAborted(signal, `resolving the netns of pod ${who}`);
        const index = next++;
        const file = files[index] as string;
        let addrs: Set<string>;
        let ino: number;
        try {
          ino = (await stat(file)).ino;
          addrs = await this.#list(file);
        } catch (err) {
          // One unreadable netns (deleted meanwhile, stale mount) must not block the others.
          errors.push(`${file}: ${describeError(err)}`);
          continue;
        }
        const hits = want.filter((ip) => addrs.has(ip)).length;
        if (hits === want.length) note(full, ino, index, file);
        else if (hits > 0) note(partial, ino, index, file);
      }
    };
    await Promise.all(Array.from({ length: this.#concurrency }, worker));

    if (full.size === 1 && partial.size === 0) {
      const only = [...full.values()][0] as { file: string };
      const checked = await this.#checker.check(only.file).catch((err: unknown) => {
        throw resolveFailure('invalid', `pod ${who}: ${describeError(err)}`, { uid: pod.uid }, err);
      });
      return { path: checked.path, resolver: 'address', inode: checked.inode };
    }
    if (full.size + partial.size === 0) {
      const unreadable = errors.length ? ` (${errors.length} netns unreadable: ${errors.slice(0, 3).join('; ')})` : '';
      throw resolveFailure('not-found', `pod ${who}: no netns among ${files.length} holds ${want.join(', ')}${unreadable}`, { uid: pod.uid });
    }
    const holders = [...[...full.values()].map((h) => h.file), ...[...partial.values()].map((h) => `${h.file} (some)`)];
    throw resolveFailure('ambiguous', `pod ${who}: IPs ${want.join(', ')} found in ${holders.length} netns: ${holders.slice(0, 8).join(', ')}`, { uid: pod.uid });
  }

  /** Netns files in the configured dirs, deduplicated by canonical dir (/var/run/netns is /run/netns). */
  async #netnsFiles(): Promise<string[]> {
    const seen = new Set<string>();
    const out: string[] = [];
    for (const dir of this.#dirs) {
      let real: string;
      try {
        real = await realpath(dir);
      } catch {
        continue;
      }
      if (seen.has(real)) continue;
      seen.add(real);
      const names = await readdir(real).catch(() => [] as string[]);
      for (const n of names.sort()) {
        if (out.length >= this.#max) return out;
        if (n.startsWith('.') || (this.#nameFilter && !this.#nameFilter.test(n))) continue;
        out.push(path.posix.join(real, n));
      }
    }
    return out;
  }

  /** Canonical global/site addresses of a netns (undefined: the node's own). */
  async #list(file: string | undefined): Promise<Set<string>> {
    let cmd: string;
    let args: string[];
    if (file === undefined) {
      [cmd, args] = ['ip', ['-j', 'addr', 'show']];
    } else if (path.posix.dirname(file) === IP_NETNS_DIR) {
      [cmd, args] = ['ip', ['-n', path.posix.basename(file), '-j', 'addr', 'show']];
    } else {
      [cmd, args] = ['nsenter', [`--net=${file}`, '--', 'ip', '-j', 'addr', 'show']];
    }
    const stdout = await new Promise<string>((resolve, reject) => {
      execFile(cmd, args, { timeout: this.#timeoutMs, maxBuffer: MAX_OUTPUT, env: { PATH: process.env['PATH'] ?? '/usr/sbin:/usr/bin:/sbin:/bin' } },
        (err, out, errOut) => (err ? reject(new Error(`${cmd} failed: ${String(errOut).trim() || err.message}`)) : resolve(out)));
    });
    const out = new Set<string>();
    let links: { addr_info?: { local?: string; scope?: string }[] }[];
    try {
      links = JSON.parse(stdout || '[]');
    } catch {
      throw new Error(`${cmd}: output is not JSON`);
    }
    for (const link of Array.isArray(links) ? links : []) {
      for (const a of link.addr_info ?? []) {
        // Loopback and link-local addresses are the same in every netns: never evidence.
        if (!a.local || a.scope === 'host' || a.scope === 'link') continue;
        const c = canonicalIp(a.local);
        if (c) out.add(c);
      }
    }
    return out;
  }
}

/** One spelling per address: IPv6 compressed lower-case, IPv4 dotted quad; undefined if not an IP. */
export function canonicalIp(ip: string): string | undefined {
  if (typeof ip !== 'string' || ip.length > 64) return undefined;
  const v = isIP(ip);
  if (v === 4) return ip.split('.').map(Number).join('.');
  if (v === 6) {
    try {
      return new URL(`http://[${ip}]/`).hostname.slice(1, -1);
    } catch {
      return undefined;
    }
  }
  return undefined;
}
