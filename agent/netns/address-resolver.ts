/**
 * Last-resort resolver: find the named netns whose interfaces hold the pod's IPs. Node cannot
 * enter a netns itself (threads), so the netns helper reads each netns's addresses (one netlink
 * dump inside it, no process run); the node's own come from getifaddrs. One listing per refresh
 * serves every pod: O(netns), not O(pods × netns). Exactly one netns must hold the pod's IPs;
 * overlapping addresses (multi-network, stale netns) are refused rather than guessed.
 */
import { statSync } from 'node:fs';
import { readdir, realpath, stat } from 'node:fs/promises';
import { networkInterfaces } from 'node:os';
import path from 'node:path';
import { NetnsError, UnsupportedPodError, describeError } from '../errors.ts';
import { canonicalIp } from './ip.ts';
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

export { canonicalIp };

/** Reads a netns's own global and site-scope addresses (the resident helper does, through netlink). */
export interface NetnsAddressReader {
  readAddresses(netns: string, signal?: AbortSignal): Promise<string[]>;
}

/** Options of the address resolver. */
export interface AddressResolverOptions {
  /** Who reads a netns's addresses: the resident netns helper. */
  addresses: NetnsAddressReader;
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
  /** How long a listing may answer "not found" for pods whose IPs it does not hold; default 2000 ms, 0 = always list. */
  missReuseMs?: number;
  /**
   * How long a listing answers for pods whose IPs it holds: the pods of one refresh share one
   * listing (the netns found is re-checked by path and inode anyway); default 30 s, 0 = always list.
   */
  hitReuseMs?: number;
  /** Pods with one of these runtimeClassNames are refused (UnsupportedPodError); default DEFAULT_SANDBOXED_RUNTIMES. */
  sandboxedRuntimeClasses?: readonly string[];
  /** Called once per listing of the node's and every netns's addresses (metrics). Must not throw. */
  onListing?: () => void;
}

/** One pass over the node's and the netns' addresses. */
interface AddressScan {
  /** The node's own addresses (undefined when not checked). */
  node: Set<string> | undefined;
  namespaces: { index: number; file: string; ino: number; addrs: Set<string> }[];
  errors: string[];
  files: number;
  /** The netns files listed, in order. */
  paths: string[];
}

const DEFAULT_MISS_REUSE_MS = 2000;
const DEFAULT_HIT_REUSE_MS = 30_000;

/** True when the node or any listed netns holds one of `ips`. */
function holdsAny(scan: AddressScan, ips: string[]): boolean {
  return ips.some((ip) => scan.node?.has(ip) || scan.namespaces.some((ns) => ns.addrs.has(ip)));
}


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
  readonly #missReuseMs: number;
  readonly #hitReuseMs: number;
  readonly #reader: NetnsAddressReader;
  readonly #onListing: (() => void) | undefined;
  #scanning: Promise<AddressScan> | undefined;
  #lastScan: { at: number; scan: AddressScan } | undefined;

  constructor(opts: AddressResolverOptions) {
    this.#reader = opts.addresses;
    this.#onListing = opts.onListing;
    this.#sandboxedClasses = opts.sandboxedRuntimeClasses ?? DEFAULT_SANDBOXED_RUNTIMES;
    this.#checker = opts.pathChecker ?? new NetnsPathChecker(opts.dirs ? { extraDirs: opts.dirs } : {});
    this.#dirs = opts.dirs ?? this.#checker.dirs;
    this.#max = Math.max(1, opts.maxNamespaces ?? 1024);
    this.#timeoutMs = Math.max(100, opts.timeoutMs ?? 2000);
    this.#concurrency = Math.min(16, Math.max(1, opts.concurrency ?? 4));
    this.#checkNode = opts.checkNodeAddresses ?? true;
    this.#nameFilter = opts.nameFilter;
    this.#missReuseMs = Math.max(0, opts.missReuseMs ?? DEFAULT_MISS_REUSE_MS);
    this.#hitReuseMs = Math.max(0, opts.hitReuseMs ?? DEFAULT_HIT_REUSE_MS);
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

    const scan = this.#reusableHit(want) ?? (await this.#reusableMiss(want)) ?? await raceSignal(this.#sharedScan(), signal, who);
    if (scan.node) {
      const clash = want.find((ip) => scan.node?.has(ip));
      if (clash) throw new UnsupportedPodError(`pod ${who}: IP ${clash} is a node address (hostNetwork): probed by kubelet, not by us`, { uid: pod.uid });
    }
    // Keyed by netns inode: one netns mounted under two names (bind mounts, /var/run vs /run) is one candidate.
    const full = new Map<number, { index: number; file: string }>();
    const partial = new Map<number, { index: number; file: string }>();
    const note = (m: Map<number, { index: number; file: string }>, ino: number, index: number, file: string): void => {
      const cur = m.get(ino);
      if (!cur || index < cur.index) m.set(ino, { index, file });
    };
    for (const ns of scan.namespaces) {
      const hits = want.filter((ip) => ns.addrs.has(ip)).length;
      if (hits === want.length) note(full, ns.ino, ns.index, ns.file);
      else if (hits > 0) note(partial, ns.ino, ns.index, ns.file);
    }
    const { errors, files } = scan;

    if (full.size === 1 && partial.size === 0) {
      const only = [...full.values()][0] as { file: string };
      const checked = await this.#checker.check(only.file).catch((err: unknown) => {
        throw resolveFailure('invalid', `pod ${who}: ${describeError(err)}`, { uid: pod.uid }, err);
      });
      return { path: checked.path, resolver: 'address', inode: checked.inode };
    }
    if (full.size + partial.size === 0) {
      // With a netns unreadable the answer is only "maybe not": retryable, not a verdict to remember.
      const unreadable = errors.length ? ` (${errors.length} netns unreadable: ${errors.slice(0, 3).join('; ')})` : '';
      throw resolveFailure(errors.length ? 'unavailable' : 'not-found', `pod ${who}: no netns among ${files} holds ${want.join(', ')}${unreadable}`, { uid: pod.uid });
    }
    const holders = [...[...full.values()].map((h) => h.file), ...[...partial.values()].map((h) => `${h.file} (some)`)];
    throw resolveFailure('ambiguous', `pod ${who}: IPs ${want.join(', ')} found in ${holders.length} netns: ${holders.slice(0, 8).join(', ')}`, { uid: pod.uid });
  }

  /**
   * The last listing, when it is recent and holds all of `want` in exactly one netns and nowhere
   * else: what the pods of one refresh (jittered over the cache TTL) share. The netns it names is
   * re-checked (path, inode) before use; a netns replaced since falls through to a new listing.
   */
  #reusableHit(want: string[]): AddressScan | undefined {
    const last = this.#lastScan;
    if (!last || Date.now() - last.at >= this.#hitReuseMs || last.scan.errors.length > 0) return undefined;
    const scan = last.scan;
    if (want.some((ip) => scan.node?.has(ip))) return undefined;
    const holders = new Set(scan.namespaces.filter((ns) => want.some((ip) => ns.addrs.has(ip))).map((ns) => ns.ino));
    if (holders.size !== 1) return undefined;
    const [ino] = holders;
    const held = scan.namespaces.filter((ns) => ns.ino === ino);
    if (!held.every((ns) => want.every((ip) => ns.addrs.has(ip)))) return undefined;
    // A netns replaced since (sandbox recreated) must be found afresh, not reported gone.
    try {
      return held.every((ns) => statSync(ns.file).ino === ino) ? scan : undefined;
    } catch {
      return undefined;
    }
  }

  /**
   * The last listing, when it may answer "not found" again for `want`: it is recent, complete, holds
   * none of the IPs, and no netns file appeared or went since (a readdir, no process). A pod whose
   * IPs no netns holds is asked about every probe period; anything found is confirmed afresh.
   */
  async #reusableMiss(want: string[]): Promise<AddressScan | undefined> {
    const last = this.#lastScan;
    if (!last || Date.now() - last.at >= this.#missReuseMs) return undefined;
    const scan = last.scan;
    if (scan.errors.length > 0 || holdsAny(scan, want)) return undefined;
    const files = await this.#netnsFiles();
    if (files.length !== scan.paths.length || files.some((f, i) => f !== scan.paths[i])) return undefined;
    return scan;
  }

  /**
   * One listing of the node's and every netns's addresses, shared by all resolutions that start
   * while it runs: pods whose IPs no netns holds are re-resolved every probe period, and a listing
   * per pod (one `ip` process per netns) grows as pods x netns; shared, it grows with netns only.
   */
  #sharedScan(): Promise<AddressScan> {
    this.#scanning ??= this.#scan().then(
      (scan) => {
        this.#lastScan = { at: Date.now(), scan };
        return scan;
      },
    ).finally(() => {
      this.#scanning = undefined;
    });
    return this.#scanning;
  }

  async #scan(): Promise<AddressScan> {
    this.#onListing?.();
    const node = this.#checkNode ? nodeAddresses() : undefined;
    const files = await this.#netnsFiles();
    const namespaces: AddressScan['namespaces'] = [];
    const errors: string[] = [];
    let next = 0;
    const worker = async (): Promise<void> => {
      while (next < files.length) {
        const index = next++;
        const file = files[index] as string;
        try {
          const ino = (await stat(file)).ino;
          namespaces.push({ index, file, ino, addrs: await this.#list(file) });
        } catch (err) {
          // A netns deleted or unmounted meanwhile holds nobody's IPs; one that cannot be read (stale
          // mount, the helper timing out) might: it makes a miss uncertain. Neither may block the others.
          if (err instanceof NetnsError && err.kind === 'gone') continue;
          if (!(await stat(file).then(() => true, () => false))) continue;
          errors.push(`${file}: ${describeError(err)}`);
        }
      }
    };
    await Promise.all(Array.from({ length: this.#concurrency }, worker));
    return { node, namespaces, errors, files: files.length, paths: files };
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

  /** Canonical global/site addresses of a netns, read by the helper inside it. */
  async #list(file: string): Promise<Set<string>> {
    return new Set(await this.#reader.readAddresses(file, AbortSignal.timeout(this.#timeoutMs)));
  }
}

/** The node's own global/site addresses (the agent runs in the node's netns): getifaddrs, no process. */
function nodeAddresses(): Set<string> {
  const out = new Set<string>();
  for (const list of Object.values(networkInterfaces())) {
    for (const a of list ?? []) {
      // Loopback and link-local addresses are the same in every netns: never evidence.
      if (a.internal || a.address.startsWith('fe80:') || a.address.startsWith('169.254.')) continue;
      const c = canonicalIp(a.address.split('%')[0] as string);
      if (c) out.add(c);
    }
  }
  return out;
}

/** Waits for a shared scan, or rejects as soon as this caller's `signal` aborts. */
function raceSignal<T>(p: Promise<T>, signal: AbortSignal | undefined, who: string): Promise<T> {
  if (!signal) return p;
  throwIfAborted(signal, `resolving the netns of pod ${who}`);
  return new Promise<T>((resolve, reject) => {
    const onAbort = (): void => {
      try {
        throwIfAborted(signal, `resolving the netns of pod ${who}`);
      } catch (err) {
        reject(err);
      }
    };
    signal.addEventListener('abort', onAbort, { once: true });
    p.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
  });
}
