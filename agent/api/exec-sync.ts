/**
 * ProbeService ExecSync: kubelet's CRI ExecSync for probe-agent's rewritten command, as the kubelet
 * shim forwards it (kubelet's message bytes unchanged; CRI runtime.v1's own ExecSyncRequest and
 * ExecSyncResponse, see proto/probe/v1alpha1/api.proto). One handler for both sockets: the shim's
 * (the lean server, hot-unary.ts) and the ProbeService socket (grpc-js with identity
 * (de)serializers, so it sees the same bytes).
 *
 * The hot path converts the handler at most twice: the request is decoded once here
 * (decodeExecSyncRequest: container_id, the command's three strings as raw bytes, timeout), and the
 * command is parsed once per (container ID, command bytes) (ExecSyncHandlerCache: base64url, JSON,
 * parseProbe's validation; kept under the pod's namespace once the container is found); a cached
 * command skips all three. The parsed handler then runs the path
 * the Probe and RunLifecycleHandler RPCs run for a call by container ID (runProbeCall /
 * runLifecycleCall -> PodProber: container lookup, tenant admission, the host policy, header values
 * from the pod's annotation), and the answer is encoded by hand.
 *
 * The answer mapping (what kubelet must see; kubelet's exec prober, hook runner and cri-client
 * remote_runtime.go ExecSync) lives here and only here:
 *  - success / warning            -> exit_code 0, the message in stdout;
 *  - failure (a target timeout too) -> exit_code 1, the message in stdout. Never gRPC
 *    DEADLINE_EXCEEDED: kubelet turns it into an exec TimeoutError whose verdict depends on its
 *    ExecProbeTimeout gate (Success when off) and whose message is the unreadable command;
 *  - could not run (error result, refusals, the call deadline cutting the run) -> a gRPC error, never
 *    DEADLINE_EXCEEDED: kubelet's prober returns Unknown and discards it (no state change); a hook
 *    counts as failed, so a hook the agent did not start (draining: the not-started trailer;
 *    admission: RESOURCE_EXHAUSTED) is sent again by the shim within --hook-agent-wait.
 *  - kind and timeout must agree as kubelet sends them (probes >= 1 s, exec hooks 0), otherwise
 *    INVALID_ARGUMENT: a probe cannot pose as an hour-long hook.
 */
import { createHash } from 'node:crypto';
import * as grpc from '@grpc/grpc-js';
import { InvalidProbeError, PodNotFoundError } from '../errors.ts';
import type { LifecycleHandlerSpec, LifecycleHook } from '../probe/lifecycle.ts';
import { boundMessage } from '../probe/run.ts';
import { parseProbe, SPEC_LIMITS } from '../probe/spec.ts';
import type { ProbeHandler, ProbeType } from '../probe/types.ts';
import { normalizeContainerID } from '../prober/container-lookup.ts';
import { decodeShimCommand, SHIM_COMMAND_PATH, ShimCommandError, type ShimKind } from '../contract/shim-command.ts';
import type { OnDemandProber } from '../scheduler/types.ts';
import { DRAINING_DETAIL, INVALID_COMMAND_PREFIX, NOT_STARTED_DRAINING } from '../contract/hook-refusal.ts';
import { runLifecycleCall } from './lifecycle-call.ts';
import { grpcStatusFor, NotStartedError, RpcError, runProbeCall, type CallLike, type ProbeCallGate } from './probe-call.ts';
import { readFields, WireError, WireWriter } from '../grpc/protowire.ts';
import { EXEC_SYNC_REQUEST as REQ, EXEC_SYNC_RESPONSE as RES } from '../contract/exec-sync-fields.ts';

/** Exit code of a failed probe or hook. */
export const FAILURE_EXIT_CODE = 1;

/** Default bound of the handler cache (see ExecSyncHandlerCache). */
export const DEFAULT_EXEC_SYNC_CACHE_ENTRIES = 4096;

/** A decoded ExecSyncRequest: the command's arguments stay raw bytes (a cached command is never decoded). */
export interface ExecSyncRequestView {
  containerId: string;
  cmd: Buffer[];
  /** Seconds; 0 for kubelet's exec hooks. */
  timeout: number;
}

/** Decodes an ExecSyncRequest message; throws WireError when malformed. */
export function decodeExecSyncRequest(msg: Buffer): ExecSyncRequestView {
  const req: ExecSyncRequestView = { containerId: '', cmd: [], timeout: 0 };
  readFields(msg, (field, value) => {
    if (field === REQ.containerId && Buffer.isBuffer(value)) req.containerId = value.toString('utf8');
    else if (field === REQ.cmd && Buffer.isBuffer(value)) req.cmd.push(value);
    else if (field === REQ.timeout && typeof value === 'number') req.timeout = value;
  });
  return req;
}

/** Encodes an ExecSyncResponse message (stderr always empty, so omitted). */
export function encodeExecSyncResponse(exitCode: number, stdout: string): Buffer {
  return new WireWriter().bytes(RES.stdout, stdout).varint(RES.exitCode, exitCode).finish();
}

const PROBE_TYPE_OF: Partial<Record<ShimKind, ProbeType>> = { liveness: 'Liveness', readiness: 'Readiness', startup: 'Startup' };
const HOOK_OF: Partial<Record<ShimKind, LifecycleHook>> = { postStart: 'postStart', preStop: 'preStop' };
const PROBE_ACTIONS = ['httpGet', 'tcpSocket', 'grpc'];
const HOOK_ACTIONS = ['httpGet', 'tcpSocket'];

/** A rewritten command, parsed and validated: what a cache hit hands out. */
export type ParsedCommand =
  | { kind: ShimKind; containerID: string; probeType: ProbeType; hook?: undefined; handler: ProbeHandler }
  | { kind: ShimKind; containerID: string; probeType?: undefined; hook: LifecycleHook; handler: LifecycleHandlerSpec };

/** Parses a rewritten command for a container; throws ShimCommandError or InvalidProbeError. */
export function parseCommand(containerId: string, cmd: readonly Buffer[]): ParsedCommand {
  const args = cmd.map((b) => b.toString('utf8'));
  if (args[0] !== SHIM_COMMAND_PATH) {
    throw new ShimCommandError(`ExecSync serves only probe-agent's rewritten command (argv[0] ${SHIM_COMMAND_PATH}), got ${JSON.stringify((args[0] ?? '').slice(0, 64))}`);
  }
  if (containerId === '') throw new ShimCommandError('ExecSync without a container_id');
  const containerID = normalizeContainerID(containerId);
  const decoded = decodeShimCommand(args);
  if (decoded === null) throw new ShimCommandError('not a probe-agent command');
  const probeType = PROBE_TYPE_OF[decoded.kind];
  const actions = probeType ? PROBE_ACTIONS : HOOK_ACTIONS;
  const present = Object.keys(decoded.handler).filter((k) => decoded.handler[k] !== undefined && decoded.handler[k] !== null);
  if (present.length !== 1 || !actions.includes(present[0] as string)) {
    const what = probeType ? 'probe handler' : 'lifecycle handler';
    throw new ShimCommandError(`${what}: expected exactly one of ${actions.join(', ')}, got ${present.length === 0 ? 'none' : present.slice(0, 3).join(', ')}`);
  }
  const handler = parseProbe(decoded.handler, { allowHandlerOnly: true, fieldPath: 'handler' }).handler;
  if (probeType) return { kind: decoded.kind, containerID, probeType, handler };
  return { kind: decoded.kind, containerID, hook: HOOK_OF[decoded.kind] as LifecycleHook, handler: handler as LifecycleHandlerSpec };
}

/** Stored per entry besides its handler's JSON: the Map slot, the key, the objects (an estimate). */
const ENTRY_OVERHEAD_BYTES = 512;
/** A container has at most five rewritten commands (three probes, two hooks); a few more for a changing spec. */
const MAX_ENTRIES_PER_CONTAINER = 8;

/** Bounds of ExecSyncHandlerCache. */
export interface ExecSyncCacheBounds {
  /** Estimated bytes of all entries (default DEFAULT_EXEC_SYNC_CACHE_BYTES). */
  maxBytes?: number;
  /** Entries (default DEFAULT_EXEC_SYNC_CACHE_ENTRIES). */
  maxEntries?: number;
}

/** Default byte bound of the handler cache: a node's 250 pods x 5 commands take about 1 MiB. */
export const DEFAULT_EXEC_SYNC_CACHE_BYTES = 4 * 1024 * 1024;

/** The cache's counters and bounds (metrics and tests). */
export interface ExecSyncCacheStats {
  entries: number;
  /** Estimated bytes held, and their bound. */
  bytes: number;
  maxBytes: number;
  hits: number;
  parses: number;
  /** Entries dropped to stay within the bounds. */
  evictions: number;
  /** Namespaces with entries, and each one's share of maxBytes (maxBytes / namespaces). */
  namespaces: number;
  namespaceShareBytes: number;
  /** Namespaces holding at least their share: once the cache is full, their new commands evict their own. */
  namespacesAtShare: number;
}

interface Tenant {
  name: string;
  /** Its entries, least recently used first. */
  entries: Map<string, CacheEntry>;
  bytes: number;
}

interface CacheEntry {
  parsed: ParsedCommand;
  bytes: number;
  tenant: Tenant;
}

/** A lookup's answer: on a miss, `keep` stores the parsed command once its pod's namespace is known. */
export interface ExecSyncLookup {
  parsed: ParsedCommand;
  keep?: (namespace: string) => void;
}

/**
 * Parsed commands by a digest of (container ID, command bytes), least recently used first. Kubelet
 * sends the same command for a container every period, so after the first call a probe costs a
 * hash and a Map lookup instead of base64url + JSON.parse + parseProbe.
 *
 * Bounded in bytes, not only entries: the key is a sha256 (the command itself, up to 16 KiB of
 * base64url that JSON whitespace can pad, is never kept), the value is the parsed handler, sized by
 * its canonical JSON. At most 8 entries per container ID, so one container cannot churn the rest.
 * A container's entries go when the agent learns it is gone or replaced (forgetContainer: a new
 * container ID for the same pod and name, an exited container, its pod left kubelet's list). A
 * command evicted by a flood only costs its next call one parse (bounded by the command's 16 KiB).
 * A malformed command is not cached (it is answered INVALID_ARGUMENT each time), nor is one whose
 * container was not found (no namespace to charge it to).
 *
 * Entries are charged to their pod's namespace, and each namespace present has an equal share of
 * both bounds. When the cache is full, a namespace over its share evicts its own least recently
 * used entries; one within it evicts from the namespace holding the most. So a namespace
 * sending many distinct commands churns only itself: a neighbour under its share keeps its parsed
 * probes (re-parsing them is CPU one tenant would otherwise impose on another). A namespace alone
 * on the node may use the whole bound.
 */
export class ExecSyncHandlerCache {
  readonly maxBytes: number;
  readonly maxEntries: number;
  readonly #entries = new Map<string, CacheEntry>();
  /** Normalized container ID -> its entries' keys. */
  readonly #byContainer = new Map<string, Set<string>>();
  /** Namespace -> its entries; only namespaces with entries. */
  readonly #tenants = new Map<string, Tenant>();
  #bytes = 0;
  /** Cache hits: calls that skipped base64url, JSON and parseProbe (metrics and tests). */
  hits = 0;
  /** Commands parsed (cache misses, malformed ones included). */
  parses = 0;
  /** Entries dropped to stay within the bounds (metrics). */
  evictions = 0;

  constructor(bounds: ExecSyncCacheBounds = {}) {
    this.maxEntries = Math.max(1, Math.floor(bounds.maxEntries ?? DEFAULT_EXEC_SYNC_CACHE_ENTRIES));
    this.maxBytes = Math.max(1, Math.floor(bounds.maxBytes ?? DEFAULT_EXEC_SYNC_CACHE_BYTES));
  }

  get size(): number {
    return this.#entries.size;
  }

  /** Estimated bytes held (entries' handler JSON plus a fixed overhead each). */
  get bytes(): number {
    return this.#bytes;
  }

  /** Each namespace's share of the byte bound right now. */
  get namespaceShareBytes(): number {
    return Math.floor(this.maxBytes / Math.max(1, this.#tenants.size));
  }

  /** Estimated bytes a namespace's entries hold (tests). */
  bytesOf(namespace: string): number {
    return this.#tenants.get(namespace)?.bytes ?? 0;
  }

  stats(): ExecSyncCacheStats {
    const n = this.#tenants.size;
    let atShare = 0;
    for (const t of this.#tenants.values()) if (t.bytes * n >= this.maxBytes) atShare++;
    return {
      entries: this.size, bytes: this.#bytes, maxBytes: this.maxBytes, hits: this.hits, parses: this.parses, evictions: this.evictions,
      namespaces: n, namespaceShareBytes: this.namespaceShareBytes, namespacesAtShare: atShare,
    };
  }

  /**
   * The parsed command for a request; throws ShimCommandError or InvalidProbeError for a bad one.
   * A miss is not kept until `keep` names the namespace of the container's pod.
   */
  lookup(containerId: string, cmd: readonly Buffer[]): ExecSyncLookup {
    const key = digestOf(containerId, cmd);
    const hit = this.#entries.get(key);
    if (hit !== undefined) {
      this.hits++;
      // Most recently used moves to the back.
      hit.tenant.entries.delete(key);
      hit.tenant.entries.set(key, hit);
      return { parsed: hit.parsed };
    }
    this.parses++;
    const parsed = parseCommand(containerId, cmd);
    return { parsed, keep: (namespace) => this.#keep(key, parsed, namespace) };
  }

  /** lookup(), kept at once under `namespace` (for callers that know it up front). */
  get(containerId: string, cmd: readonly Buffer[], namespace = ''): ParsedCommand {
    const found = this.lookup(containerId, cmd);
    found.keep?.(namespace);
    return found.parsed;
  }

  /** Drops every command of a container (raw or normalized ID): it is gone or replaced. */
  forgetContainer(id: string): void {
    if (this.#entries.size === 0) return;
    let normalized: string;
    try {
      normalized = normalizeContainerID(id);
    } catch {
      return;
    }
    const keys = this.#byContainer.get(normalized);
    if (keys) for (const key of [...keys]) this.#drop(key);
  }

  #keep(key: string, parsed: ParsedCommand, namespace: string): void {
    // Two calls that missed together: the first one kept it.
    if (this.#entries.has(key)) return;
    const bytes = ENTRY_OVERHEAD_BYTES + 2 * (parsed.containerID.length + namespace.length + JSON.stringify(parsed.handler).length);
    // One entry larger than the whole bound is answered, not kept.
    if (bytes > this.maxBytes) return;
    let keys = this.#byContainer.get(parsed.containerID);
    if (keys === undefined) {
      keys = new Set();
      this.#byContainer.set(parsed.containerID, keys);
    }
    if (keys.size >= MAX_ENTRIES_PER_CONTAINER) this.#evict(keys.values().next().value as string);
    let tenant = this.#tenants.get(namespace);
    if (tenant === undefined) {
      tenant = { name: namespace, entries: new Map(), bytes: 0 };
      this.#tenants.set(namespace, tenant);
    }
    const entry: CacheEntry = { parsed, bytes, tenant };
    this.#entries.set(key, entry);
    tenant.entries.set(key, entry);
    tenant.bytes += bytes;
    keys.add(key);
    this.#bytes += bytes;
    while (this.#entries.size > this.maxEntries || this.#bytes > this.maxBytes) {
      const byBytes = this.#bytes > this.maxBytes;
      const n = this.#tenants.size;
      const over = byBytes ? tenant.bytes * n > this.maxBytes : tenant.entries.size * n > this.maxEntries;
      const victim = over && tenant.entries.size > 0 ? tenant : this.#largest(byBytes);
      this.#evict(victim.entries.keys().next().value as string);
    }
  }

  /**
   * The namespace holding the most: over its share whenever the cache is over its bound (the shares
   * add up to the bound). O(namespaces), and only when a namespace under its share fills the cache.
   */
  #largest(byBytes: boolean): Tenant {
    let best: Tenant | undefined;
    for (const t of this.#tenants.values()) {
      if (best === undefined || (byBytes ? t.bytes > best.bytes : t.entries.size > best.entries.size)) best = t;
    }
    return best as Tenant;
  }

  #evict(key: string): void {
    this.evictions++;
    this.#drop(key);
  }

  #drop(key: string): void {
    const e = this.#entries.get(key);
    if (!e) return;
    this.#entries.delete(key);
    this.#bytes -= e.bytes;
    e.tenant.entries.delete(key);
    e.tenant.bytes -= e.bytes;
    if (e.tenant.entries.size === 0) this.#tenants.delete(e.tenant.name);
    const keys = this.#byContainer.get(e.parsed.containerID);
    keys?.delete(key);
    if (keys?.size === 0) this.#byContainer.delete(e.parsed.containerID);
  }
}

/** sha256 of the container ID and each argument, length-prefixed (so no two requests share a digest by concatenation). */
function digestOf(containerId: string, cmd: readonly Buffer[]): string {
  const h = createHash('sha256');
  const len = Buffer.allocUnsafe(4);
  const id = Buffer.from(containerId, 'utf8');
  len.writeUInt32BE(id.length);
  h.update(len).update(id);
  for (const arg of cmd) {
    len.writeUInt32BE(arg.length);
    h.update(len).update(arg);
  }
  return h.digest('base64');
}

/** What the ExecSync handler needs from the server. */
export interface ExecSyncDeps {
  prober: OnDemandProber;
  probeGate: ProbeCallGate;
  hookGate: ProbeCallGate;
  cache: ExecSyncHandlerCache;
  /** True once the server drains: probes are refused, hooks refused as not started. */
  stopping(): boolean;
}

/**
 * Serves one ExecSync (the request's message bytes; the call's deadline and cancellation): resolves
 * with the ExecSyncResponse's message bytes, or rejects with the RpcError (or NotStartedError)
 * kubelet must see.
 */
export async function handleExecSync(request: Buffer, call: CallLike, deps: ExecSyncDeps): Promise<Buffer> {
  let req: ExecSyncRequestView;
  try {
    req = decodeExecSyncRequest(request);
  } catch (err) {
    if (err instanceof WireError) throw badCommand(`malformed ExecSyncRequest: ${err.message}`);
    throw err;
  }
  let cmd: ParsedCommand;
  let keep: ((namespace: string) => void) | undefined;
  try {
    ({ parsed: cmd, keep } = deps.cache.lookup(req.containerId, req.cmd));
  } catch (err) {
    if (err instanceof ShimCommandError || err instanceof InvalidProbeError) throw badCommand(err.message);
    throw err;
  }
  const mismatch = kindTimeoutMismatch(cmd.kind, cmd.probeType !== undefined, req.timeout);
  if (mismatch) throw badCommand(mismatch);
  if (req.timeout > SPEC_LIMITS.maxTimeoutSeconds) throw badCommand(`a ${cmd.kind} probe with ExecSync timeout ${req.timeout}: at most ${SPEC_LIMITS.maxTimeoutSeconds} s`);
  const what = `${cmd.kind} ${cmd.probeType ? 'probe' : 'hook'}`;
  try {
    if (cmd.probeType) {
      // Not started: the shim sends it to the next agent (a probe may run twice; it only reads).
      if (deps.stopping()) throw new NotStartedError(`probe-agent is shutting down: the ${what} was not started`, NOT_STARTED_DRAINING);
      const outcome = await runProbeCall(
        { containerID: cmd.containerID, probeType: cmd.probeType, handler: cmd.handler, timeoutSeconds: req.timeout, onLocated: keep },
        call, deps.prober, deps.probeGate,
      );
      return answerOf(outcome.result, boundMessage(outcome.message), outcome.reason ?? '', what);
    }
    // A draining agent refuses new hooks in a way the shim can tell from "it may have run": the
    // shim sends such a hook again to the next agent (docs/closing-the-hole.md).
    if (deps.stopping()) throw new NotStartedError(`probe-agent refused the ${what}: ${DRAINING_DETAIL}`, NOT_STARTED_DRAINING);
    const outcome = await runLifecycleCall({ containerID: cmd.containerID, hook: cmd.hook, handler: cmd.handler, timeoutSeconds: 0, onLocated: keep }, call, deps.prober, deps.hookGate);
    // A hook's answer names no reason (RunLifecycleHandlerResponse has none).
    return answerOf(outcome.result, boundMessage(outcome.message), '', what);
  } catch (err) {
    if (err instanceof NotStartedError) throw err;
    if (err instanceof PodNotFoundError) deps.cache.forgetContainer(cmd.containerID);
    throw refusal(err, what);
  }
}

/** The answer for an outcome the agent reached. */
function answerOf(result: string, message: string, reason: string, what: string): Buffer {
  switch (result) {
    case 'success':
    case 'warning':
      return encodeExecSyncResponse(0, message);
    case 'failure':
      return encodeExecSyncResponse(FAILURE_EXIT_CODE, message);
    default:
      throw new RpcError(grpc.status.UNAVAILABLE, `probe-agent could not run the ${what}${reason ? ` (${reason})` : ''}: ${message}`);
  }
}

/** A refusal as kubelet sees it: its own code, but never DEADLINE_EXCEEDED (nor UNIMPLEMENTED, which says "agent too old" to the shim). */
function refusal(err: unknown, what: string): RpcError {
  const st = grpcStatusFor(err);
  if (st.code === grpc.status.DEADLINE_EXCEEDED) return new RpcError(grpc.status.UNAVAILABLE, `probe-agent did not run the ${what}: ${st.details}`);
  const code = st.code === grpc.status.UNIMPLEMENTED || st.code === grpc.status.OK ? grpc.status.FAILED_PRECONDITION : st.code;
  return new RpcError(code, `probe-agent refused the ${what}: ${st.details}`);
}

function badCommand(message: string): RpcError {
  return new RpcError(grpc.status.INVALID_ARGUMENT, `${INVALID_COMMAND_PREFIX}${message}`);
}

/**
 * Kubelet runs probes with ExecSync timeout = timeoutSeconds (>= 1 after API defaulting;
 * pkg/kubelet/prober/prober.go) and exec hooks with timeout 0 (pkg/kubelet/lifecycle/handlers.go).
 * A rewritten command whose kind and timeout disagree did not come from kubelet's own prober or
 * hook runner for that kind: refused (INVALID_ARGUMENT, never DEADLINE_EXCEEDED), so kubelet
 * discards it and a probe cannot hold a hook's hour. Returns the message, or undefined when they agree.
 */
export function kindTimeoutMismatch(kind: string, isProbe: boolean, timeoutSeconds: number): string | undefined {
  if (isProbe && timeoutSeconds <= 0) {
    return `a ${kind} probe with ExecSync timeout ${timeoutSeconds}: kubelet sends probes with timeout >= 1 s and only hooks with 0`;
  }
  if (!isProbe && timeoutSeconds !== 0) {
    return `a ${kind} hook with ExecSync timeout ${timeoutSeconds} s: kubelet runs exec hooks with timeout 0, so this is not kubelet's hook call`;
  }
  return undefined;
}
