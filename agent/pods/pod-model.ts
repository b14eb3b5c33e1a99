/**
 * Maps the kubelet's v1.PodList onto PodInfo: tolerant per pod (one bad pod never hides the
 * others), strict about every field we act on, and ignorant of everything else.
 */
import { isIP } from 'node:net';
import { describeError } from '../errors.ts';
import { clampSeconds, parseProbe } from '../probe/spec.ts';
import { PROBE_TYPES, type ProbeType } from '../probe/types.ts';
import { KubeletError } from './kubelet-client.ts';
import { DroppedPodItem, type DroppedPodReason } from './pod-list-stream.ts';
import { ShimCommandError } from '../contract/shim-command.ts';
import { unwrapShimProbe } from './shim-probe.ts';
import { ORIGINAL_HANDLERS_ANNOTATION } from '../rewrite/pod-rewrite.ts';

/** The pod condition of gates mode (agent/rewrite/gates-rewrite.ts GATES_CONDITION). */
export const GATES_CONDITION_TYPE = 'probe-agent.io/ready';
import type { ContainerInfo, ContainerPort, ContainerProbe, ContainerState, NotOursReason, PodInfo } from './types.ts';

/** A pod of the list that could not be used; identity fields are whatever could be read. */
export interface PodParseError {
  uid?: string;
  namespace?: string;
  name?: string;
  error: string;
  /** Why it was dropped (metric label). */
  reason: DroppedPodReason;
}

/** Bounds on what one pod list may hold; kubelet's max-pods is 110 by default, a few hundred at most in practice. */
export interface PodListLimits {
  maxPods?: number;
  /** Containers plus init containers per pod. */
  maxContainersPerPod?: number;
  maxPortsPerContainer?: number;
}

export const DEFAULT_POD_LIST_LIMITS: Required<PodListLimits> = {
  maxPods: 5000,
  maxContainersPerPod: 256,
  maxPortsPerContainer: 512,
};

/** Runtime classes whose pods run behind their own network stack (probing from the netns would miss the app). */
export const DEFAULT_SANDBOXED_RUNTIME_CLASSES: readonly string[] = ['gvisor', 'runsc', 'kata', 'kata-qemu', 'kata-clh', 'kata-fc'];

const PROBE_FIELDS: Record<ProbeType, string> = { Liveness: 'livenessProbe', Readiness: 'readinessProbe', Startup: 'startupProbe' };
const MAX_NAME_LENGTH = 253;

/** Thrown inside the per-pod parse; turned into a PodParseError entry. */
class FieldError extends Error {}

/**
 * Parses a v1.PodList. Throws KubeletError('malformed' | 'too-large') only when the list itself is
 * unusable; a bad pod becomes an entry in `errors`.
 */
export function parsePodList(json: unknown, limits: PodListLimits = {}): { pods: PodInfo[]; errors: PodParseError[] } {
  const lim = { ...DEFAULT_POD_LIST_LIMITS, ...limits };
  if (!isObject(json)) throw new KubeletError('malformed', `kubelet /pods answer is not a JSON object (got ${kindOf(json)})`);
  if (json['kind'] !== 'PodList') throw new KubeletError('malformed', `kubelet /pods answer has kind ${JSON.stringify(json['kind'])}, want "PodList"`);
  if (json['apiVersion'] !== undefined && json['apiVersion'] !== 'v1') {
    throw new KubeletError('malformed', `kubelet /pods answer has apiVersion ${JSON.stringify(json['apiVersion'])}, want "v1"`);
  }
  const items = json['items'] ?? [];
  if (!Array.isArray(items)) throw new KubeletError('malformed', 'kubelet /pods answer: items is not a list');

  const pods: PodInfo[] = [];
  const errors: PodParseError[] = [];
  const seen = new Set<string>();
  items.forEach((item, i) => {
    // Dropped while the list was read (too large, not JSON, a bad field), or beyond the cap:
    // reported, never a reason to refuse the other pods.
    if (item instanceof DroppedPodItem) {
      errors.push({ ...item.identity, error: `items[${i}]: ${item.message}`, reason: item.reason });
      return;
    }
    if (i >= lim.maxPods) {
      errors.push({ ...identityOf(item), error: `items[${i}]: pod beyond the cap of ${lim.maxPods} pods per list`, reason: 'too-many' });
      return;
    }
    try {
      const pod = item instanceof ParsedPod ? item.info : parsePod(item, lim);
      if (seen.has(pod.uid)) throw new FieldError(`metadata.uid: duplicate uid ${pod.uid} in the pod list`);
      seen.add(pod.uid);
      pods.push(pod);
    } catch (err) {
      errors.push({ ...identityOf(item), error: `items[${i}]: ${describeError(err)}`, reason: 'invalid' });
    }
  });
  return { pods, errors };
}

/** One pod of the list already mapped while the list was read (KubeletClient), so that the raw JSON is never held. */
export class ParsedPod {
  readonly info: PodInfo;
  constructor(info: PodInfo) {
    this.info = info;
  }
}

/**
 * Maps one raw item of a PodList as it is read: a ParsedPod, or a DroppedPodItem ('invalid') naming
 * the offending field. parsePodList takes either in place of the raw item.
 */
export function convertPodItem(raw: unknown, limits: PodListLimits = {}): ParsedPod | DroppedPodItem {
  try {
    return new ParsedPod(parsePod(raw, { ...DEFAULT_POD_LIST_LIMITS, ...limits }));
  } catch (err) {
    return new DroppedPodItem('invalid', describeError(err), 0, identity(raw));
  }
}

function identityOf(item: unknown): Omit<PodParseError, 'error' | 'reason'> {
  if (!(item instanceof ParsedPod)) return identity(item);
  return { uid: item.info.uid, namespace: item.info.namespace, name: item.info.name };
}

/** Maps one v1.Pod; throws FieldError naming the offending field. */
function parsePod(raw: unknown, lim: Required<PodListLimits>): PodInfo {
  const pod = obj(raw, 'pod');
  const meta = obj(pod['metadata'], 'metadata');
  const spec = obj(pod['spec'], 'spec');
  const status = optObj(pod['status'], 'status') ?? {};
  const annotations = optObj(meta['annotations'], 'metadata.annotations') ?? {};

  const containersRaw = list(spec['containers'], 'spec.containers');
  const initRaw = optList(spec['initContainers'], 'spec.initContainers');
  if (containersRaw.length + initRaw.length > lim.maxContainersPerPod) {
    throw new FieldError(`spec: ${containersRaw.length + initRaw.length} containers, more than the cap of ${lim.maxContainersPerPod}`);
  }
  const statuses = statusIndex(status['containerStatuses'], 'status.containerStatuses');
  const initStatuses = statusIndex(status['initContainerStatuses'], 'status.initContainerStatuses');

  const gatesRecord = gatesProbes(annotations[ORIGINAL_HANDLERS_ANNOTATION]);
  const containers: ContainerInfo[] = [];
  containersRaw.forEach((c, i) => containers.push(parseContainer(c, `spec.containers[${i}]`, 'regular', statuses, initStatuses, lim, gatesRecord)));
  initRaw.forEach((c, i) => {
    const path = `spec.initContainers[${i}]`;
    // Only restartable init containers (sidecars) get probe workers in kubelet; the others run to completion.
    if (optString(obj(c, path)['restartPolicy'], `${path}.restartPolicy`) !== 'Always') return;
    containers.push(parseContainer(c, path, 'sidecar', initStatuses, statuses, lim, gatesRecord));
  });
  const names = new Set<string>();
  for (const c of containers) {
    if (names.has(c.name)) throw new FieldError(`spec: duplicate container name ${JSON.stringify(c.name)}`);
    names.add(c.name);
  }

  const source = optString(annotations['kubernetes.io/config.source'], 'metadata.annotations[kubernetes.io/config.source]');
  const isStatic = (source !== undefined && source !== 'api') || annotations['kubernetes.io/config.mirror'] !== undefined;
  const info: PodInfo = {
    uid: name(meta['uid'], 'metadata.uid'),
    namespace: name(meta['namespace'], 'metadata.namespace'),
    name: name(meta['name'], 'metadata.name'),
    hostNetwork: optBool(spec['hostNetwork'], 'spec.hostNetwork') ?? false,
    podIPs: podIPs(status),
    // A pod the apiserver has not written a status for yet is Pending by definition.
    phase: optString(status['phase'], 'status.phase') || 'Pending',
    restartPolicy: optString(spec['restartPolicy'], 'spec.restartPolicy') || 'Always',
    isStatic,
    podReady: podReady(status['conditions']),
    containers,
  };
  const deletion = optTime(meta['deletionTimestamp'], 'metadata.deletionTimestamp');
  if (deletion !== undefined) info.deletionTimestamp = deletion;
  const runtimeClassName = optString(spec['runtimeClassName'], 'spec.runtimeClassName');
  if (runtimeClassName) info.runtimeClassName = runtimeClassName;
  if (gatesRecord) {
    const taken: Record<string, ProbeType[]> = {};
    for (const c of containers) {
      const types = PROBE_TYPES.filter((t) => gatesRecord.has(`${c.name}/${PROBE_FIELDS[t]}`));
      if (types.length) taken[c.name] = types;
    }
    const grace = spec['terminationGracePeriodSeconds'];
    const ours = gatesCondition(status['conditions']);
    info.gates = {
      taken,
      condition: ours.status,
      ...(ours.since !== undefined ? { conditionSince: ours.since } : {}),
      // int64 in the API (up to 2^63-1 admitted): clamped to what kubelet's Duration holds, so that
      // no stop deadline or timer derived from it overflows (docs/closing-the-hole.md, gates).
      terminationGracePeriodSeconds: typeof grace === 'number' && Number.isInteger(grace) && grace >= 0 ? clampSeconds(grace) : 30,
    };
  }
  return info;
}

/** Why a pod is left to kubelet, or undefined when we probe it. */
export function classifyPod(pod: PodInfo, opts: { sandboxedRuntimeClasses?: readonly string[] } = {}): NotOursReason | undefined {
  if (pod.hostNetwork) return 'host-network';
  const sandboxed = opts.sandboxedRuntimeClasses ?? DEFAULT_SANDBOXED_RUNTIME_CLASSES;
  if (pod.runtimeClassName !== undefined && sandboxed.includes(pod.runtimeClassName)) return 'sandboxed-runtime';
  let probes = 0;
  let exec = 0;
  for (const c of pod.containers) {
    for (const probe of Object.values(c.probes)) {
      probes++;
      if (probe.ok && probe.spec.handler.kind === 'exec') exec++;
    }
  }
  if (probes === 0) return 'no-network-probes';
  // An invalid probe counts as ours: we report it as an error instead of letting it vanish.
  if (exec === probes) return 'exec-only';
  return undefined;
}

function parseContainer(
  raw: unknown,
  path: string,
  kind: ContainerInfo['kind'],
  own: Map<string, Record<string, unknown>>,
  other: Map<string, Record<string, unknown>>,
  lim: Required<PodListLimits>,
  gates?: Map<string, unknown>,
): ContainerInfo {
  const c = obj(raw, path);
  const cname = name(c['name'], `${path}.name`);
  const portsRaw = optList(c['ports'], `${path}.ports`);
  if (portsRaw.length > lim.maxPortsPerContainer) throw new FieldError(`${path}.ports: ${portsRaw.length} ports, more than the cap of ${lim.maxPortsPerContainer}`);
  const ports = portsRaw.map((p, i) => parsePort(p, `${path}.ports[${i}]`));
  const probes: Partial<Record<ProbeType, ContainerProbe>> = {};
  for (const type of PROBE_TYPES) {
    const field = PROBE_FIELDS[type];
    // Gates mode: the probe lives in the record, the spec no longer has it.
    const rawProbe = c[field] ?? gates?.get(`${cname}/${field}`);
    if (rawProbe === undefined || rawProbe === null) continue;
    try {
      const unwrapped = unwrapShimProbe(rawProbe, type);
      const spec = parseProbe(unwrapped ?? rawProbe, { probeType: type, fieldPath: `${path}.${field}` });
      probes[type] = unwrapped ? { ok: true, spec, shim: true } : { ok: true, spec };
    } catch (err) {
      const where = err instanceof ShimCommandError ? `${path}.${field}.exec.command: ` : '';
      probes[type] = { ok: false, error: `${where}${describeError(err)}` };
    }
  }
  const info: ContainerInfo = { name: cname, kind, ports, probes };
  const lifecycle = gates ? c['lifecycle'] : undefined;
  if (isObject(lifecycle) && isObject(lifecycle['preStop'])) info.preStop = lifecycle['preStop'];
  // kubelet's doProbe searches both status lists, so a status filed under the other list still counts.
  const st = own.get(cname) ?? other.get(cname);
  if (st) info.state = parseState(st, `status of container ${cname}`);
  return info;
}

function parsePort(raw: unknown, path: string): ContainerPort {
  const p = obj(raw, path);
  const n = p['containerPort'];
  if (typeof n !== 'number' || !Number.isInteger(n) || n < 1 || n > 65535) {
    throw new FieldError(`${path}.containerPort: must be 1..65535, got ${JSON.stringify(n)}`);
  }
  const port: ContainerPort = { containerPort: n };
  const pname = optString(p['name'], `${path}.name`);
  if (pname) port.name = pname;
  const protocol = optString(p['protocol'], `${path}.protocol`);
  port.protocol = protocol || 'TCP';
  return port;
}

function parseState(s: Record<string, unknown>, path: string): ContainerState {
  const state = optObj(s['state'], `${path}.state`) ?? {};
  const running = optObj(state['running'], `${path}.state.running`);
  const terminated = optObj(state['terminated'], `${path}.state.terminated`);
  const restartCount = s['restartCount'] ?? 0;
  if (typeof restartCount !== 'number' || !Number.isInteger(restartCount) || restartCount < 0) {
    throw new FieldError(`${path}.restartCount: must be a non-negative integer, got ${JSON.stringify(restartCount)}`);
  }
  const out: ContainerState = {
    containerID: optString(s['containerID'], `${path}.containerID`) ?? '',
    running: running !== undefined,
    terminated: terminated !== undefined,
    ready: optBool(s['ready'], `${path}.ready`) ?? false,
    restartCount,
  };
  const startedAt = running ? optTime(running['startedAt'], `${path}.state.running.startedAt`) : undefined;
  if (startedAt !== undefined) out.startedAt = startedAt;
  const started = optBool(s['started'], `${path}.started`);
  if (started !== undefined) out.started = started;
  return out;
}

function statusIndex(raw: unknown, path: string): Map<string, Record<string, unknown>> {
  const out = new Map<string, Record<string, unknown>>();
  optList(raw, path).forEach((s, i) => {
    const st = obj(s, `${path}[${i}]`);
    out.set(name(st['name'], `${path}[${i}].name`), st);
  });
  return out;
}

/** status.podIPs, primary first; status.podIP when an older writer left podIPs empty. */
function podIPs(status: Record<string, unknown>): string[] {
  const ips: string[] = [];
  optList(status['podIPs'], 'status.podIPs').forEach((e, i) => ips.push(ip(obj(e, `status.podIPs[${i}]`)['ip'], `status.podIPs[${i}].ip`)));
  if (ips.length === 0) {
    const single = optString(status['podIP'], 'status.podIP');
    if (single) ips.push(ip(single, 'status.podIP'));
  }
  return [...new Set(ips)];
}

function ip(raw: unknown, path: string): string {
  if (typeof raw !== 'string' || isIP(raw) === 0) throw new FieldError(`${path}: not an IP address: ${JSON.stringify(raw)}`);
  return raw;
}

/** The probes of a gates-mode record (`<container>/<field>` -> probe), or undefined for any other pod. */
function gatesProbes(raw: unknown): Map<string, unknown> | undefined {
  if (typeof raw !== 'string' || !raw.includes('"gates"')) return undefined;
  let parsed: unknown;
  try {
    parsed = JSON.parse(raw);
  } catch {
    throw new FieldError(`metadata.annotations[${ORIGINAL_HANDLERS_ANNOTATION}]: not JSON`);
  }
  if (!isObject(parsed) || parsed['mode'] !== 'gates') return undefined;
  if (!isObject(parsed['handlers'])) throw new FieldError(`metadata.annotations[${ORIGINAL_HANDLERS_ANNOTATION}]: a gates record without handlers`);
  return new Map(Object.entries(parsed['handlers']));
}

/** The status of our condition ('' when absent) and its lastTransitionTime (lenient: another writer's odd time is no reason to drop the pod). */
function gatesCondition(raw: unknown): { status: string; since?: number } {
  for (const [i, c] of optList(raw, 'status.conditions').entries()) {
    const cond = obj(c, `status.conditions[${i}]`);
    if (cond['type'] !== GATES_CONDITION_TYPE) continue;
    const status = typeof cond['status'] === 'string' ? cond['status'] : '';
    const t = cond['lastTransitionTime'];
    const since = typeof t === 'string' && RFC3339.test(t) ? Date.parse(t) : NaN;
    return Number.isNaN(since) ? { status } : { status, since };
  }
  return { status: '' };
}

function podReady(raw: unknown): boolean {
  return optList(raw, 'status.conditions').some((c, i) => {
    const cond = obj(c, `status.conditions[${i}]`);
    return cond['type'] === 'Ready' && cond['status'] === 'True';
  });
}

/** Best-effort identity of a pod that failed to parse, for the error entry. */
function identity(item: unknown): Omit<PodParseError, 'error' | 'reason'> {
  const meta = isObject(item) && isObject(item['metadata']) ? item['metadata'] : {};
  const out: Omit<PodParseError, 'error' | 'reason'> = {};
  for (const key of ['uid', 'namespace', 'name'] as const) {
    const v = meta[key];
    if (typeof v === 'string' && v !== '') out[key] = v.slice(0, MAX_NAME_LENGTH);
  }
  return out;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function kindOf(v: unknown): string {
  return v === null ? 'null' : Array.isArray(v) ? 'array' : typeof v;
}

function obj(v: unknown, path: string): Record<string, unknown> {
  if (!isObject(v)) throw new FieldError(`${path}: must be an object, got ${kindOf(v)}`);
  return v;
}

function optObj(v: unknown, path: string): Record<string, unknown> | undefined {
  return v === undefined || v === null ? undefined : obj(v, path);
}

function list(v: unknown, path: string): unknown[] {
  if (!Array.isArray(v)) throw new FieldError(`${path}: must be a list, got ${kindOf(v)}`);
  return v;
}

function optList(v: unknown, path: string): unknown[] {
  return v === undefined || v === null ? [] : list(v, path);
}

function optString(v: unknown, path: string): string | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'string') throw new FieldError(`${path}: must be a string, got ${kindOf(v)}`);
  if (v.length > MAX_NAME_LENGTH) throw new FieldError(`${path}: longer than ${MAX_NAME_LENGTH} characters`);
  return v;
}

function name(v: unknown, path: string): string {
  const s = optString(v, path);
  if (!s) throw new FieldError(`${path}: required`);
  return s;
}

function optBool(v: unknown, path: string): boolean | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'boolean') throw new FieldError(`${path}: must be a boolean, got ${kindOf(v)}`);
  return v;
}

/** RFC 3339 as Kubernetes writes it (metav1.Time): Date.parse alone would accept "1" or "May 5". */
const RFC3339 = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$/;

function optTime(v: unknown, path: string): number | undefined {
  const s = optString(v, path);
  if (s === undefined || s === '') return undefined;
  const ms = RFC3339.test(s) ? Date.parse(s) : NaN;
  if (Number.isNaN(ms)) throw new FieldError(`${path}: not an RFC 3339 time: ${JSON.stringify(s)}`);
  return ms;
}
