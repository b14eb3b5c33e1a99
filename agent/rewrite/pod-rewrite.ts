/**
 * The rewrite of one pod (a Pod or a pod template: `{ metadata, spec }`), and its undo. Pure: takes
 * plain JSON values, returns new ones, never mutates its input, does no I/O.
 *
 * Rewrite: every httpGet/tcpSocket/grpc probe and every httpGet/tcpSocket lifecycle hook of every
 * container and init container (sidecars included) becomes `exec: { command: encodeShimCommand(...) }`,
 * in the same place among the probe's keys; the rest of the probe is untouched. A required node
 * affinity on `probe-agent.io/shim In [ready]` keeps the pod off nodes without the shim, and a
 * toleration of the closed-hole taint lets it onto nodes whose node->pod path is closed
 * (placement.ts). The command carries the handler with named ports resolved and header values
 * left out (command-handler.ts). What was replaced and what was added is recorded in the
 * `probe-agent.io/original-handlers` annotation, so the undo gives back the input exactly (same
 * values, same key order), and the agent reads header values from it.
 */
import { decodeShimCommand, encodeShimCommand, isShimCommand, MAX_ENCODED_HANDLER, ShimCommandError, type ShimKind } from '../contract/shim-command.ts';
import { RewriteError } from './errors.ts';
import { commandHandler, needsAnnotationValues } from './command-handler.ts';
import { ensureClosedHoleToleration, ensureShimAffinity, removePointer } from './placement.ts';

/** Annotation holding the originals of the rewritten handlers and what the rewrite added (JSON). */
export const ORIGINAL_HANDLERS_ANNOTATION = 'probe-agent.io/original-handlers';
export { SHIM_AFFINITY_REQUIREMENT, SHIM_NODE_LABEL, SHIM_NODE_LABEL_VALUE } from './placement.ts';

/** Pod annotation: `keep` leaves a pod whose probes or hooks name a loopback `host` to kubelet (see RewriteOptions.loopbackHost). */
export const LOOPBACK_HOST_ANNOTATION = 'probe-agent.io/loopback-host';

/** The API server's limit on the total size of an object's annotations (keys + values, bytes). */
export const ANNOTATIONS_BUDGET_BYTES = 256 * 1024;

/** How the rewrite treats a probe whose `host` is a loopback address. */
export type LoopbackHostPolicy = 'rewrite' | 'keep';

/** Choices of the caller (the CLI's flags, the webhook's flags and cluster reads). */
export interface RewriteOptions {
  /**
   * RuntimeClass name -> its handler (the webhook reads the RuntimeClass, the CLI takes
   * `--runtime-class NAME=HANDLER`). The agent decides by handler; a name not in the map is taken
   * as its own handler (the usual case: RuntimeClass `runsc` with handler `runsc`).
   */
  runtimeHandlers?: ReadonlyMap<string, string>;
  /**
   * `rewrite` (default): a `host` of 127.0.0.1, ::1 or localhost becomes the pod's own loopback,
   * as the agent reads it everywhere. Pod Security baseline allows exactly these values, so the
   * encoded command hides nothing it would refuse, and kubelet's meaning (the node's loopback: a
   * node-local service reachable from any pod spec) is the SSRF the project removes. `keep`:
   * such pods stay with kubelet, whole. The pod annotation `probe-agent.io/loopback-host: keep`
   * (or `rewrite`) overrides this per pod.
   */
  loopbackHost?: LoopbackHostPolicy;
  /**
   * Give the closed-hole toleration also to a pod with nothing to rewrite and nothing left to
   * kubelet (no network probe or hook: nothing of it needs the node->pod path). The webhook does,
   * so such pods can run on closed-hole nodes; the CLI does not (its output is then its input).
   */
  tolerateWhenClean?: boolean;
  /**
   * `shim` (default): handlers become shim commands. `gates`: network probes leave the spec for
   * the agent, which reports through a readiness gate (gates-rewrite.ts).
   */
  mode?: RewriteMode;
  /** RuntimeClass handlers refused in gates mode (default SANDBOXED_RUNTIME_CLASSES). */
  sandboxedRuntimeClasses?: readonly string[];
}

/** How a pod's network probes are taken from kubelet. */
export type RewriteMode = 'shim' | 'gates';

/** Version of the annotation's format. */
export const RECORD_VERSION = 1;

type Obj = Record<string, unknown>;

/** The content of the annotation. */
export interface RewriteRecord {
  v: number;
  /** Absent: shim mode. `gates`: `handlers` holds whole probes, taken out of the spec. */
  mode?: 'gates';
  /** `<container>/<field>` (e.g. `web/livenessProbe`, `web/lifecycle/preStop`) -> the original handler. */
  handlers: Record<string, Obj>;
  /** JSON pointers, relative to the pod, of what the rewrite created; the undo removes them in reverse order. */
  added: string[];
}

/** A pod (or pod template) with whether the transform changed anything. */
export interface PodResult {
  pod: Obj;
  changed: boolean;
  /** Why a pod with network probes or hooks was left as written (the agent cannot probe it). */
  skipped?: string;
}

/**
 * RuntimeClass names whose pods the agent leaves to kubelet (same list as the agent's
 * DEFAULT_SANDBOXED_RUNTIMES in agent/netns/resolver.ts; a unit test keeps them equal): their
 * network stack is not in a netns the agent can enter, so a rewritten probe could never pass.
 */
export const SANDBOXED_RUNTIME_CLASSES: readonly string[] = ['runsc', 'gvisor', 'kata', 'kata-qemu', 'kata-clh', 'kata-fc'];

const PROBES: ReadonlyArray<readonly [field: string, kind: ShimKind]> = [
  ['livenessProbe', 'liveness'],
  ['readinessProbe', 'readiness'],
  ['startupProbe', 'startup'],
];
const HOOKS: ReadonlyArray<readonly [field: string, kind: ShimKind]> = [
  ['postStart', 'postStart'],
  ['preStop', 'preStop'],
];
/** Handlers the rewrite replaces, and every handler a probe or hook may hold (to refuse two at once). */
const PROBE_NETWORK = ['httpGet', 'tcpSocket', 'grpc'];
const PROBE_ALL = ['exec', ...PROBE_NETWORK];
const HOOK_NETWORK = ['httpGet', 'tcpSocket'];
const HOOK_ALL = ['exec', 'sleep', ...HOOK_NETWORK];
/** Ephemeral containers may not have probes or hooks (API validation), so only these two lists. */
export const CONTAINER_LISTS = ['initContainers', 'containers'] as const;

/** One probe or hook slot of a container: where it is and which kind of shim command it gets. */
export interface Slot {
  /** The container the slot belongs to (its `ports` name the probe's named ports). */
  container: Obj;
  /** Object holding the handler keys (the probe, or the lifecycle hook). */
  holder: Obj;
  /** Replaces `holder` in its parent (keeps the parent's key order). */
  set: (next: Obj) => void;
  kind: ShimKind;
  network: readonly string[];
  all: readonly string[];
  /** Key in the record. */
  key: string;
  /** Field path for messages. */
  path: string;
}

export const isObj = (v: unknown): v is Obj => v !== null && typeof v === 'object' && !Array.isArray(v);

/** A copy of `obj` with `oldKey` replaced by `entries`, at the same position. */
function replaceKey(obj: Obj, oldKey: string, entries: Array<[string, unknown]>): Obj {
  const out: Obj = {};
  for (const [k, v] of Object.entries(obj)) {
    if (k === oldKey) for (const [nk, nv] of entries) out[nk] = nv;
    else out[k] = v;
  }
  return out;
}

/** Visits every probe and hook slot of the (already cloned) pod spec, validating the containers on the way. */
export function* slots(spec: Obj, base: string): Generator<Slot> {
  const names = new Set<string>();
  for (const list of CONTAINER_LISTS) {
    const containers = spec[list];
    if (containers === undefined || containers === null) continue;
    if (!Array.isArray(containers)) throw new RewriteError(`${base}.${list}`, 'not a list');
    for (const [i, c] of containers.entries()) {
      const cpath = `${base}.${list}[${i}]`;
      if (!isObj(c)) throw new RewriteError(cpath, 'a container must be an object');
      const name = c.name;
      if (typeof name !== 'string' || name === '') throw new RewriteError(`${cpath}.name`, 'a container needs a name');
      if (names.has(name)) throw new RewriteError(`${cpath}.name`, `container name "${name}" is used twice`);
      names.add(name);
      for (const [field, kind] of PROBES) {
        const probe = c[field];
        if (probe === undefined || probe === null) continue;
        if (!isObj(probe)) throw new RewriteError(`${cpath}.${field}`, 'a probe must be an object');
        yield { container: c, holder: probe, set: (next) => (c[field] = next), kind, network: PROBE_NETWORK, all: PROBE_ALL, key: `${name}/${field}`, path: `${cpath}.${field}` };
      }
      const lifecycle = c.lifecycle;
      if (lifecycle === undefined || lifecycle === null) continue;
      if (!isObj(lifecycle)) throw new RewriteError(`${cpath}.lifecycle`, 'must be an object');
      for (const [field, kind] of HOOKS) {
        const hook = lifecycle[field];
        if (hook === undefined || hook === null) continue;
        if (!isObj(hook)) throw new RewriteError(`${cpath}.lifecycle.${field}`, 'a lifecycle hook must be an object');
        yield { container: c, holder: hook, set: (next) => (lifecycle[field] = next), kind, network: HOOK_NETWORK, all: HOOK_ALL, key: `${name}/lifecycle/${field}`, path: `${cpath}.lifecycle.${field}` };
      }
    }
  }
}

/** The single handler key a slot holds (null when it holds none), refusing two at once as the API does. */
export function handlerKey(slot: Slot): string | null {
  const present = slot.all.filter((k) => slot.holder[k] !== undefined && slot.holder[k] !== null);
  if (present.length > 1) throw new RewriteError(slot.path, `more than one handler (${present.join(', ')}); the API allows exactly one`);
  return present[0] ?? null;
}

/** The shim command a slot's exec handler holds, decoded and checked against the slot; null when it is not ours. */
function shimHandlerOf(slot: Slot): Obj | null {
  const exec = slot.holder.exec;
  if (!isObj(exec) || !Array.isArray(exec.command) || !isShimCommand(exec.command as string[])) return null;
  const path = `${slot.path}.exec.command`;
  if (!exec.command.every((a) => typeof a === 'string')) throw new RewriteError(path, 'probe-agent command arguments must be strings');
  let decoded;
  try {
    decoded = decodeShimCommand(exec.command as string[]);
  } catch (err) {
    if (err instanceof ShimCommandError) throw new RewriteError(path, err.message);
    throw err;
  }
  if (decoded!.kind !== slot.kind) throw new RewriteError(path, `probe-agent command is for "${decoded!.kind}" but sits in a ${slot.kind} slot`);
  return decoded!.handler;
}

/** Reads the annotation; a malformed one is an error (the undo would not be exact). */
export function readRecord(metadata: Obj | undefined, base: string): RewriteRecord | null {
  const annotations = metadata?.annotations;
  if (!isObj(annotations)) return null;
  const raw = annotations[ORIGINAL_HANDLERS_ANNOTATION];
  if (raw === undefined) return null;
  const path = `${base}metadata.annotations["${ORIGINAL_HANDLERS_ANNOTATION}"]`;
  if (typeof raw !== 'string') throw new RewriteError(path, 'must be a string');
  let parsed: unknown;
  try {
    parsed = JSON.parse(raw);
  } catch (err) {
    throw new RewriteError(path, `not JSON: ${(err as Error).message}`);
  }
  if (!isObj(parsed) || parsed.v !== RECORD_VERSION || !isObj(parsed.handlers) || !Array.isArray(parsed.added)) {
    throw new RewriteError(path, `not a version ${RECORD_VERSION} record ({"v":1,"handlers":{...},"added":[...]})`);
  }
  for (const [k, h] of Object.entries(parsed.handlers)) if (!isObj(h)) throw new RewriteError(path, `handler ${JSON.stringify(k)} is not an object`);
  for (const p of parsed.added) if (typeof p !== 'string' || !p.startsWith('/')) throw new RewriteError(path, `added entry ${JSON.stringify(p)} is not a JSON pointer`);
  return parsed as unknown as RewriteRecord;
}

/** The fields of each network handler the agent runs as kubelet does (core/v1 up to 1.36). */
const HANDLER_FIELDS: Record<string, ReadonlySet<string>> = {
  httpGet: new Set(['path', 'port', 'host', 'scheme', 'httpHeaders']),
  tcpSocket: new Set(['port', 'host']),
  grpc: new Set(['port', 'service']),
};
const HEADER_FIELDS: ReadonlySet<string> = new Set(['name', 'value']);

/** The path (below the handler) of the first field the agent does not know, or undefined. */
export function unknownField(key: string, action: Obj): string | undefined {
  const known = HANDLER_FIELDS[key];
  if (!known) return undefined;
  for (const field of Object.keys(action)) if (!known.has(field)) return field;
  if (key === 'httpGet' && Array.isArray(action.httpHeaders)) {
    for (const [i, h] of action.httpHeaders.entries()) {
      if (!isObj(h)) continue;
      for (const field of Object.keys(h)) if (!HEADER_FIELDS.has(field)) return `httpHeaders[${i}].${field}`;
    }
  }
  return undefined;
}

/** Splits a pod-like object into metadata/spec; `base` prefixes field paths in messages (e.g. `spec.template.`). */
function podParts(pod: Obj, base: string): { spec: Obj | null } {
  if (pod.spec === undefined || pod.spec === null) return { spec: null };
  if (!isObj(pod.spec)) throw new RewriteError(`${base}spec`, 'must be an object');
  return { spec: pod.spec };
}

/** Rewrites the network probes and hooks of a pod or pod template. `base` prefixes field paths in errors. */
export function rewritePod(input: Obj, base = '', options: RewriteOptions = {}): PodResult {
  const pod = structuredClone(input);
  const { spec } = podParts(pod, base);
  if (!spec) return { pod: input, changed: false };
  if (readRecord(isObj(pod.metadata) ? pod.metadata : undefined, base)?.mode === 'gates') {
    return { pod: input, changed: false, skipped: 'the pod was rewritten for gates mode: its probes are the agent\'s already' };
  }
  const skipped = notForTheAgent(spec, options.runtimeHandlers);
  const loopback = loopbackPolicy(pod, options.loopbackHost);
  const handlers: Record<string, Obj> = {};
  let hasShimCommands = false;
  /** Commands already there whose header values must come from the record. */
  const needRecord: Slot[] = [];
  for (const slot of slots(spec, `${base}spec`)) {
    const key = handlerKey(slot);
    if (key === 'exec') {
      const existingHandler = shimHandlerOf(slot);
      if (existingHandler) {
        hasShimCommands = true;
        if (needsAnnotationValues(existingHandler)) needRecord.push(slot);
      }
      continue;
    }
    if (key === null || !slot.network.includes(key)) continue;
    if (skipped) {
      // A hostNetwork pod is probed on the node's own address, which the closed hole leaves open.
      if (options.tolerateWhenClean && spec.hostNetwork === true) {
        const tolerated = structuredClone(input);
        const ok = isObj(tolerated.spec) && ensureClosedHoleToleration(tolerated.spec, base).length > 0;
        if (ok) return { pod: tolerated, changed: true, skipped };
      }
      return { pod: input, changed: false, skipped };
    }
    const value = slot.holder[key];
    if (!isObj(value)) throw new RewriteError(`${slot.path}.${key}`, 'a handler must be an object');
    const unknown = unknownField(key, value);
    if (unknown !== undefined) {
      return { pod: input, changed: false, skipped: `${slot.path}.${key}.${unknown} is a field this release does not know (a newer Kubernetes's, such as 1.37's httpGet.protocol or grpc.tls): kubelet keeps the probe rather than the agent running it without that field` };
    }
    const foreign = foreignHost(value);
    if (foreign !== undefined) {
      return { pod: input, changed: false, skipped: `${slot.path}.${key}.host is ${JSON.stringify(foreign.slice(0, 64))}: the agent only probes the pod's own addresses, and Pod Security admission must still see that field` };
    }
    if (loopback === 'keep' && typeof value.host === 'string' && value.host !== '') {
      return { pod: input, changed: false, skipped: `${slot.path}.${key}.host is ${JSON.stringify(value.host)} and loopback hosts are kept (${LOOPBACK_HOST_ANNOTATION}: keep, or --loopback-host keep): kubelet keeps probing the node's loopback` };
    }
    const original = { [key]: value };
    const command = encodeShimCommand(slot.kind, commandHandler(original, slot.container));
    if (command[2]!.length > MAX_ENCODED_HANDLER) {
      throw new RewriteError(`${slot.path}.${key}`, `handler is ${command[2]!.length} bytes encoded, the shim accepts at most ${MAX_ENCODED_HANDLER}`);
    }
    handlers[slot.key] = original;
    slot.set(replaceKey(slot.holder, key, [['exec', { command }]]));
    hasShimCommands = true;
  }
  if (!hasShimCommands) {
    if (!options.tolerateWhenClean || (skipped && spec.hostNetwork !== true)) return { pod: input, changed: false };
    // Nothing of this pod needs the node->pod path (a hostNetwork pod is probed on the node's own address).
    return ensureClosedHoleToleration(spec, base).length ? { pod, changed: true } : { pod: input, changed: false };
  }

  const existing = readRecord(isObj(pod.metadata) ? pod.metadata : undefined, base);
  for (const slot of needRecord) {
    // The agent could never send that header: say so rather than admit a probe that cannot run as written.
    if (!existing?.handlers[slot.key]) throw new RewriteError(`${slot.path}.exec.command`, `its header values live in the ${ORIGINAL_HANDLERS_ANNOTATION} annotation, which has no "${slot.key}" entry (the annotation was stripped or edited)`);
  }
  const added = ensureShimAffinity(spec, base);
  added.push(...ensureClosedHoleToleration(spec, base));
  if (Object.keys(handlers).length === 0 && added.length === 0) return { pod: input, changed: false };

  return recordRewrite(input, pod, base, existing, { handlers, added }, ': the API server would refuse the pod, so its probes stay as written');
}

/**
 * Merges what a rewrite took (`handlers`) and created (`added`) into the record `existing` the pod
 * carries, and writes it into the annotation of `pod` (the rewritten clone of `input`). Leaves
 * `input` as written when the annotations would exceed the API server's limit; `overBudget` ends
 * that reason.
 */
export function recordRewrite(
  input: Obj, pod: Obj, base: string, existing: RewriteRecord | null,
  taken: { mode?: 'gates'; handlers: Record<string, Obj>; added: string[] }, overBudget: string,
): PodResult {
  const added = taken.added;
  if (pod.metadata === undefined || pod.metadata === null) {
    pod.metadata = {};
    added.push('/metadata');
  }
  if (!isObj(pod.metadata)) throw new RewriteError(`${base}metadata`, 'must be an object');
  const metadata = pod.metadata;
  if (metadata.annotations === undefined || metadata.annotations === null) {
    metadata.annotations = {};
    if (!added.includes('/metadata')) added.push('/metadata/annotations');
  }
  if (!isObj(metadata.annotations)) throw new RewriteError(`${base}metadata.annotations`, 'must be an object');
  const record: RewriteRecord = {
    v: RECORD_VERSION,
    ...(taken.mode !== undefined ? { mode: taken.mode } : {}),
    handlers: { ...existing?.handlers, ...taken.handlers },
    added: [...(existing?.added ?? []), ...added],
  };
  metadata.annotations[ORIGINAL_HANDLERS_ANNOTATION] = JSON.stringify(record);
  const size = annotationsSize(metadata.annotations);
  if (size > ANNOTATIONS_BUDGET_BYTES) {
    return { pod: input, changed: false, skipped: `the ${ORIGINAL_HANDLERS_ANNOTATION} annotation would bring the pod's annotations to ${size} bytes, over the API server's limit of ${ANNOTATIONS_BUDGET_BYTES}${overBudget}` };
  }
  return { pod, changed: true };
}

/** Total size of annotations as the API server counts it (keys + values, UTF-8 bytes). */
export function annotationsSize(annotations: Obj): number {
  let total = 0;
  for (const [k, v] of Object.entries(annotations)) total += Buffer.byteLength(k) + (typeof v === 'string' ? Buffer.byteLength(v) : 0);
  return total;
}

/** The loopback-host policy for this pod: its annotation, else the caller's choice, else `rewrite`. */
export function loopbackPolicy(pod: Obj, fallback: LoopbackHostPolicy | undefined): LoopbackHostPolicy {
  const a = isObj(pod.metadata) && isObj(pod.metadata.annotations) ? pod.metadata.annotations[LOOPBACK_HOST_ANNOTATION] : undefined;
  if (a === 'keep' || a === 'rewrite') return a;
  return fallback ?? 'rewrite';
}

/** Hosts Pod Security admission (KEP-4940) allows in probes and hooks; the agent reads them as the pod's own loopback. */
const LOOPBACK_HOSTS = new Set(['', '127.0.0.1', '::1', 'localhost']);

/**
 * A `host` the rewrite must not hide inside the encoded command (undefined when there is none):
 * Pod Security admission validates after mutating webhooks, so a rewritten pod would slip a
 * node-side target past it; and the agent refuses such a host anyway.
 */
export function foreignHost(handler: Obj): string | undefined {
  const host = handler.host;
  if (host === undefined || host === null) return undefined;
  if (typeof host !== 'string') return String(host);
  return LOOPBACK_HOSTS.has(host.toLowerCase()) ? undefined : host;
}

/** Why the agent cannot run this pod's probes (so they stay with kubelet), or undefined. */
function notForTheAgent(spec: Obj, runtimeHandlers: ReadonlyMap<string, string> | undefined): string | undefined {
  if (spec.hostNetwork === true) return 'hostNetwork pod: kubelet reaches it without crossing into a pod netns, its probes stay as written';
  const rc = spec.runtimeClassName;
  if (typeof rc !== 'string' || rc === '') return undefined;
  // The agent decides by the runtime handler the sandbox runs with, not by the RuntimeClass's name.
  const handler = runtimeHandlers?.get(rc) ?? rc;
  if (SANDBOXED_RUNTIME_CLASSES.some((s) => s.toLowerCase() === handler.toLowerCase())) {
    const via = handler === rc ? '' : ` (runtime handler "${handler}")`;
    return `runtimeClassName "${rc}"${via} is sandboxed: the agent cannot probe inside it, its probes stay as written`;
  }
  return undefined;
}

/** Undoes rewritePod: gives back the handlers and removes what the rewrite added. */
export function undoPod(input: Obj, base = ''): PodResult {
  const pod = structuredClone(input);
  const metadata = isObj(pod.metadata) ? pod.metadata : undefined;
  const record = readRecord(metadata, base);
  const { spec } = podParts(pod, base);
  if (record?.mode === 'gates') return undoGates(pod, spec, record, base);
  let changed = false;
  if (spec) {
    for (const slot of slots(spec, `${base}spec`)) {
      if (handlerKey(slot) !== 'exec') continue;
      const decoded = shimHandlerOf(slot);
      if (!decoded) continue;
      // The annotation is the record of what was written; the command itself is the fallback when it was stripped.
      const original = record?.handlers[slot.key];
      if (!original && needsAnnotationValues(decoded)) {
        throw new RewriteError(`${slot.path}.exec.command`, `its header values live only in the ${ORIGINAL_HANDLERS_ANNOTATION} annotation, which is missing: restore the annotation (or the original manifest) to undo`);
      }
      slot.set(replaceKey(slot.holder, 'exec', Object.entries(original ?? decoded)));
      changed = true;
      continue;
    }
  }
  if (!record) return changed ? { pod, changed } : { pod: input, changed: false };
  delete (metadata!.annotations as Obj)[ORIGINAL_HANDLERS_ANNOTATION];
  for (const pointer of [...record.added].reverse()) removePointer(pod, pointer);
  return { pod, changed: true };
}

/** Undoes a gates-mode rewrite: the probes go back into their containers (after the keys there). */
function undoGates(pod: Obj, spec: Obj | null, record: RewriteRecord, base: string): PodResult {
  for (const [key, probe] of Object.entries(record.handlers)) {
    const [name, field] = key.split('/');
    const container = spec ? CONTAINER_LISTS.flatMap((l) => (Array.isArray(spec[l]) ? (spec[l] as unknown[]) : [])).find((c) => isObj(c) && c.name === name) : undefined;
    if (!isObj(container) || !field) throw new RewriteError(`${base}spec`, `no container "${name}" to give its ${field} back to`);
    container[field] = probe;
  }
  delete ((pod.metadata as Obj).annotations as Obj)[ORIGINAL_HANDLERS_ANNOTATION];
  for (const pointer of [...record.added].reverse()) removePointer(pod, pointer);
  return { pod, changed: true };
}
