/**
 * The preferred resolver: ask the container runtime over CRI. ListPodSandbox by the kubelet's
 * pod-UID label (READY only), pick the newest attempt, then read the netns path from the verbose
 * PodSandboxStatus info (runtimeSpec.linux.namespaces[type=network].path): CRI has no typed field for it.
 */
import { NetnsError, UnsupportedPodError } from '../errors.ts';
import { CriClient, type CriPodSandbox, type CriPodSandboxStatusResponse } from './cri-client.ts';
import { NetnsPathChecker, type CheckedNetns } from './netns-path.ts';
import {
  DEFAULT_SANDBOXED_RUNTIMES,
  checkPodRef,
  podLabel,
  resolveFailure,
  throwIfAborted,
  type NetnsResolution,
  type NetnsResolver,
  type PodRef,
} from './resolver.ts';

/** Runtime handlers whose pods run behind their own network stack or VM (see DEFAULT_SANDBOXED_RUNTIMES). */
export const DEFAULT_SANDBOXED_RUNTIME_HANDLERS: readonly string[] = DEFAULT_SANDBOXED_RUNTIMES;

/** The label kubelet puts on every sandbox. */
export const POD_UID_LABEL = 'io.kubernetes.pod.uid';

/** The verbose info is JSON text; containerd's is a few KiB. */
const MAX_INFO_BYTES = 1024 * 1024;

/** Options of the CRI resolver. */
export interface CriResolverOptions {
  /** A CRI client (shared channel) or an endpoint to make one for. */
  client: CriClient | string;
  /** Default DEFAULT_SANDBOXED_RUNTIME_HANDLERS. */
  sandboxedRuntimeHandlers?: readonly string[];
  pathChecker?: NetnsPathChecker;
  /** Per-call deadline when `client` is an endpoint. */
  deadlineMs?: number;
}

/** Resolves a pod's netns through the CRI runtime. */
export class CriResolver implements NetnsResolver {
  readonly name = 'cri' as const;
  readonly client: CriClient;
  readonly #sandboxed: Set<string>;
  readonly #checker: NetnsPathChecker;

  constructor(opts: CriResolverOptions) {
    this.client = typeof opts.client === 'string'
      ? new CriClient(opts.client, opts.deadlineMs === undefined ? {} : { deadlineMs: opts.deadlineMs })
      : opts.client;
    this.#sandboxed = new Set((opts.sandboxedRuntimeHandlers ?? DEFAULT_SANDBOXED_RUNTIME_HANDLERS).map((h) => h.toLowerCase()));
    this.#checker = opts.pathChecker ?? new NetnsPathChecker();
  }

  /** Finds the newest READY sandbox of the pod and returns its validated netns path. */
  async resolve(pod: PodRef, signal?: AbortSignal): Promise<NetnsResolution> {
    checkPodRef(pod);
    const who = podLabel(pod);
    // Every state, so that a stopped sandbox tells a pod going from one the runtime never ran.
    const items = await this.client.listPodSandbox({ labelSelector: { [POD_UID_LABEL]: pod.uid } }, signal);
    // Some runtimes have ignored parts of the filter in the past; do not trust it blindly.
    const mine = items.filter((s) => s.labels?.[POD_UID_LABEL] === pod.uid);
    const ready = mine.filter((s) => s.state === 'SANDBOX_READY');
    if (ready.length === 0 && mine.length > 0) {
      throw resolveFailure('not-found', `pod ${who}: no READY sandbox (${mine.slice(0, 3).map((s) => `${short(s.id)} is ${s.state}`).join(', ')})`, { uid: pod.uid, sandboxGone: true });
    }
    const sandbox = pickNewest(ready, who);
    this.#refuseSandboxedHandler(sandbox.runtimeHandler, sandbox.id, who);
    throwIfAborted(signal, `resolving the netns of pod ${who}`);

    const res = await this.client.podSandboxStatus(sandbox.id, true, signal);
    const checked = await this.netnsOfStatus(res, sandbox.id, who, pod.uid);
    const resolution: NetnsResolution = { path: checked.path, resolver: 'cri', sandboxID: sandbox.id, inode: checked.inode };
    if (sandbox.runtimeHandler) resolution.runtimeHandler = sandbox.runtimeHandler;
    return resolution;
  }

  /**
   * The validated netns of a sandbox from its verbose PodSandboxStatus: the runtime spec's network
   * namespace path, or the sandbox process's /proc/<pid>/ns/net when the runtime gives no spec.
   * Rejects like resolve(): UnsupportedPodError (host network, sandboxed runtime) or a
   * NetnsUnavailableError whose outcome says why (not ready, gone, invalid).
   */
  async netnsOfStatus(res: CriPodSandboxStatusResponse, sandboxID: string, who: string, uid?: string): Promise<CheckedNetns> {
    const netnsPath = this.#netnsPathFrom(res, sandboxID, who);
    const ctx = { ...(uid === undefined ? {} : { uid }), sandboxID };
    try {
      return await this.#checker.check(netnsPath);
    } catch (err) {
      if (err instanceof NetnsError && err.kind === 'gone') {
        throw resolveFailure('unavailable', `pod ${who}: sandbox ${short(sandboxID)} netns ${netnsPath} is gone`, ctx, err);
      }
      throw resolveFailure('invalid', `pod ${who}: sandbox ${short(sandboxID)}: ${(err as Error).message}`, ctx, err);
    }
  }

  #netnsPathFrom(res: CriPodSandboxStatusResponse, sandboxID: string, who: string): string {
    const ctx = { sandboxID };
    const status = res.status;
    if (!status) throw resolveFailure('not-found', `pod ${who}: sandbox ${short(sandboxID)} has no status`, ctx);
    if (status.state !== 'SANDBOX_READY') {
      throw resolveFailure('unavailable', `pod ${who}: sandbox ${short(sandboxID)} is ${status.state}`, ctx);
    }
    if (status.linux?.namespaces?.options?.network === 'NODE') {
      throw new UnsupportedPodError(`pod ${who} uses the node's network namespace (hostNetwork): probed by kubelet, not by us`, ctx);
    }
    this.#refuseSandboxedHandler(status.runtimeHandler, sandboxID, who);
    const raw = res.info?.['info'];
    if (!raw) {
      throw resolveFailure('unavailable', `pod ${who}: runtime returned no verbose info for sandbox ${short(sandboxID)} (not fully created yet?)`, ctx);
    }
    if (raw.length > MAX_INFO_BYTES) throw resolveFailure('invalid', `pod ${who}: sandbox info is larger than ${MAX_INFO_BYTES} bytes`, ctx);
    let info: SandboxInfo;
    try {
      info = JSON.parse(raw) as SandboxInfo;
    } catch (err) {
      throw resolveFailure('invalid', `pod ${who}: sandbox info is not JSON`, ctx, err);
    }
    if (typeof info !== 'object' || info === null) throw resolveFailure('invalid', `pod ${who}: sandbox info is not an object`, ctx);
    this.#refuseSandboxedHandler(typeof info.runtimeHandler === 'string' ? info.runtimeHandler : '', sandboxID, who);
    this.#refuseSandboxedRuntimeType(info.runtimeType, sandboxID, who);
    if (info.netNamespaceClosed === true) {
      throw resolveFailure('unavailable', `pod ${who}: sandbox ${short(sandboxID)} network namespace is closed`, ctx);
    }
    if (typeof info.processStatus === 'string' && info.processStatus !== 'running' && info.processStatus !== '') {
      throw resolveFailure('unavailable', `pod ${who}: sandbox ${short(sandboxID)} process is ${info.processStatus}`, ctx);
    }
    const namespaces = info.runtimeSpec?.linux?.namespaces;
    if (!Array.isArray(namespaces)) {
      // No runtime spec in the info (a runtime that reports only the sandbox process): its own netns.
      // The host-network case was refused above from the typed status.
      if (Number.isInteger(info.pid) && (info.pid as number) > 0) return this.#checker.procNetPath(info.pid as number);
      throw resolveFailure('unavailable', `pod ${who}: sandbox ${short(sandboxID)} has no runtime spec yet`, ctx);
    }
    const net = namespaces.filter((n) => n && typeof n === 'object' && n.type === 'network');
    if (net.length === 0) {
      // An OCI spec without a network namespace entry shares the host's.
      throw new UnsupportedPodError(`pod ${who}: sandbox ${short(sandboxID)} has no own network namespace (hostNetwork)`, ctx);
    }
    const p = net[0]?.path;
    if (net.length > 1 || typeof p !== 'string' || p === '') {
      throw resolveFailure('invalid', `pod ${who}: sandbox ${short(sandboxID)} runtime spec has no usable network namespace path`, ctx);
    }
    return p;
  }

  #refuseSandboxedHandler(handler: string | undefined, sandboxID: string, who: string): void {
    if (handler && this.#sandboxed.has(handler.toLowerCase())) {
      throw new UnsupportedPodError(
        `pod ${who} runs under runtime handler "${handler}" (sandboxed): in-netns probes cannot reach it; left to kubelet`,
        { sandboxID, runtimeHandler: handler },
      );
    }
  }

  /** containerd names shims io.containerd.<name>.v<N>; a runsc/kata shim under a custom handler name is still sandboxed. */
  #refuseSandboxedRuntimeType(runtimeType: unknown, sandboxID: string, who: string): void {
    if (typeof runtimeType !== 'string') return;
    const m = /^io\.containerd\.([a-z0-9-]+)\.v\d+$/i.exec(runtimeType);
    const shim = m?.[1]?.toLowerCase();
    if (shim && shim !== 'runc' && [...this.#sandboxed].some((h) => shim === h || shim.startsWith(`${h}-`))) {
      throw new UnsupportedPodError(
        `pod ${who} runs under the sandboxed runtime ${runtimeType}: in-netns probes cannot reach it; left to kubelet`,
        { sandboxID, runtimeType },
      );
    }
  }
}

/** What we read from containerd's / CRI-O's verbose info JSON. */
interface SandboxInfo {
  pid?: number;
  processStatus?: string;
  netNamespaceClosed?: boolean;
  runtimeHandler?: string;
  runtimeType?: string;
  runtimeSpec?: { linux?: { namespaces?: { type?: string; path?: string }[] } };
}

/**
 * Highest attempt wins (kubelet increments it on every sandbox re-creation); among equal attempts
 * newest created_at, but two READY sandboxes with the same top attempt cannot be told apart
 * reliably, so that is refused as ambiguous.
 */
function pickNewest(ready: CriPodSandbox[], who: string): CriPodSandbox {
  if (ready.length === 0) throw resolveFailure('not-found', `pod ${who}: no READY sandbox`);
  const attempt = (s: CriPodSandbox): number => s.metadata?.attempt ?? 0;
  const top = Math.max(...ready.map(attempt));
  const newest = ready.filter((s) => attempt(s) === top);
  if (newest.length > 1) {
    throw resolveFailure('ambiguous', `pod ${who}: ${newest.length} READY sandboxes with attempt ${top} (${newest.map((s) => short(s.id)).join(', ')})`);
  }
  return newest[0] as CriPodSandbox;
}

function short(id: string): string {
  return id.slice(0, 13);
}
