/**
 * The `gates` rewrite of one pod (or pod template), for nodes whose kubelet cannot be pointed at
 * the shim: every httpGet/tcpSocket/grpc readiness, liveness and startup probe of every container
 * and sidecar leaves the spec, is recorded whole in the same `probe-agent.io/original-handlers`
 * annotation the shim rewrite uses (with `mode: "gates"`), and the pod gets the readiness gate
 * `probe-agent.io/ready`. The agent on the pod's node runs those probes from the pod netns with
 * kubelet's state machine and writes that condition (agent/gates/). Exec probes and every hook
 * stay with kubelet. undoPod gives the probes back. Pure, like pod-rewrite.ts.
 *
 * A pod the agent cannot serve this way is left as written, with the reason:
 * - a static (mirror) pod: kubelet owns it from a file, its spec is not the API object's;
 * - restartPolicy OnFailure/Never with a network liveness or startup probe: kubelet restarts a
 *   container its probe killed under any policy but Never; a StopContainer from the agent is an
 *   exit, which OnFailure may not restart (exit 0) and Never never does;
 * - hostNetwork: probed on the node's own address, nothing to gain;
 * - a sandboxed runtime (the configurable list): its network is not in a netns the agent enters.
 */
import { RewriteError } from './errors.ts';
import { GATES_READINESS_GATE } from './placement.ts';
import {
  foreignHost, handlerKey, isObj, LOOPBACK_HOST_ANNOTATION, loopbackPolicy, readRecord, recordRewrite, SANDBOXED_RUNTIME_CLASSES, slots,
  unknownField, type PodResult, type RewriteOptions,
} from './pod-rewrite.ts';

type Obj = Record<string, unknown>;

/** The pod condition the agent owns, and the readiness gate naming it. */
export const GATES_CONDITION = GATES_READINESS_GATE.conditionType;
/** Pod annotation choosing the mode for one pod (`gates` or `shim`); wins over the namespace's choice. */
export const MODE_ANNOTATION = 'probe-agent.io/mode';
/** Annotation kubelet puts on the API object of a static pod. */
export const MIRROR_ANNOTATION = 'kubernetes.io/config.mirror';

const PROBE_FIELDS = new Set(['livenessProbe', 'readinessProbe', 'startupProbe']);
const NETWORK = ['httpGet', 'tcpSocket', 'grpc'];

/** Why the pod cannot be served in gates mode, or undefined. */
function gatesRefusal(pod: Obj, spec: Obj, options: RewriteOptions, hasKillingProbe: boolean): string | undefined {
  const annotations = isObj(pod.metadata) && isObj(pod.metadata.annotations) ? pod.metadata.annotations : {};
  if (annotations[MIRROR_ANNOTATION] !== undefined) return 'a static (mirror) pod: kubelet runs it from its manifest file, its probes stay as written';
  if (spec.hostNetwork === true) return 'hostNetwork pod: kubelet reaches it without crossing into a pod netns, its probes stay as written';
  const rc = spec.runtimeClassName;
  if (typeof rc === 'string' && rc !== '') {
    const handler = options.runtimeHandlers?.get(rc) ?? rc;
    const refused = options.sandboxedRuntimeClasses ?? SANDBOXED_RUNTIME_CLASSES;
    if (refused.some((s) => s.toLowerCase() === handler.toLowerCase() || s.toLowerCase() === rc.toLowerCase())) {
      return `runtimeClassName "${rc}" is sandboxed: the agent cannot probe inside it, its probes stay as written`;
    }
  }
  const policy = spec.restartPolicy ?? 'Always';
  if (policy !== 'Always' && hasKillingProbe) {
    return `restartPolicy ${String(policy).slice(0, 16)} with a network liveness or startup probe: a container the agent stops is not restarted as kubelet restarts a container its probe killed, its probes stay as written`;
  }
  return undefined;
}

/** The gates rewrite. `base` prefixes field paths in errors and notes. */
export function rewritePodGates(input: Obj, base = '', options: RewriteOptions = {}): PodResult {
  if (!isObj(input.spec)) {
    if (input.spec === undefined || input.spec === null) return { pod: input, changed: false };
    throw new RewriteError(`${base}spec`, 'must be an object');
  }
  const existing = readRecord(isObj(input.metadata) ? input.metadata : undefined, base);
  if (existing && existing.mode !== 'gates') return { pod: input, changed: false, skipped: 'the pod was rewritten for the kubelet shim already' };
  const pod = structuredClone(input);
  const spec = pod.spec as Obj;
  const loopback = loopbackPolicy(pod, options.loopbackHost);
  const taken: Array<{ key: string; container: Obj; field: string; probe: Obj }> = [];
  let killing = false;
  for (const slot of slots(spec, `${base}spec`)) {
    const field = slot.key.split('/')[1]!;
    if (!PROBE_FIELDS.has(field) || slot.key.split('/').length !== 2) continue;
    const key = handlerKey(slot);
    if (key === null || !NETWORK.includes(key)) continue;
    const value = slot.holder[key];
    if (!isObj(value)) throw new RewriteError(`${slot.path}.${key}`, 'a handler must be an object');
    const unknown = unknownField(key, value);
    if (unknown !== undefined) return { pod: input, changed: false, skipped: `${slot.path}.${key}.${unknown} is a field this release does not know: kubelet keeps the probe` };
    const foreign = foreignHost(value);
    if (foreign !== undefined) return { pod: input, changed: false, skipped: `${slot.path}.${key}.host is ${JSON.stringify(foreign.slice(0, 64))}: the agent only probes the pod's own addresses` };
    if (loopback === 'keep' && typeof value.host === 'string' && value.host !== '') {
      return { pod: input, changed: false, skipped: `${slot.path}.${key}.host is ${JSON.stringify(value.host)} and loopback hosts are kept (${LOOPBACK_HOST_ANNOTATION}: keep)` };
    }
    // A sidecar (restartable init container) is restarted by kubelet whatever the pod's policy.
    if (field !== 'readinessProbe' && slot.container.restartPolicy !== 'Always') killing = true;
    taken.push({ key: slot.key, container: slot.container, field, probe: slot.holder });
  }
  if (taken.length === 0) return { pod: input, changed: false };
  const refusal = gatesRefusal(pod, spec, options, killing);
  if (refusal) return { pod: input, changed: false, skipped: refusal };

  const handlers: Record<string, Obj> = {};
  for (const t of taken) {
    handlers[t.key] = t.probe;
    delete t.container[t.field];
  }
  const added: string[] = [];
  if (spec.readinessGates === undefined || spec.readinessGates === null) {
    spec.readinessGates = [{ ...GATES_READINESS_GATE }];
    added.push('/spec/readinessGates');
  } else {
    if (!Array.isArray(spec.readinessGates)) throw new RewriteError(`${base}spec.readinessGates`, 'must be a list');
    if (!spec.readinessGates.some((g) => isObj(g) && g.conditionType === GATES_CONDITION)) {
      spec.readinessGates.push({ ...GATES_READINESS_GATE });
      added.push(`/spec/readinessGates/${spec.readinessGates.length - 1}`);
    }
  }
  return recordRewrite(input, pod, base, existing, { mode: 'gates', handlers, added }, '');
}

/** The mode a pod asks for by annotation, or undefined. */
export function annotatedMode(pod: unknown): 'gates' | 'shim' | undefined {
  const a = isObj(pod) && isObj(pod.metadata) && isObj(pod.metadata.annotations) ? pod.metadata.annotations[MODE_ANNOTATION] : undefined;
  return a === 'gates' || a === 'shim' ? a : undefined;
}
