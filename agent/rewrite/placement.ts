/**
 * Where a rewritten pod may run, and what the rewrite adds for it (and the undo takes away):
 *
 * - the shim node affinity: a required `probe-agent.io/shim In [ready]` ANDed into every required
 *   node selector term, so the scheduler places the pod only where kubelet uses the shim;
 * - the closed-hole taint. Nodes whose node->pod path is closed carry
 *   `probe-agent.io/hole-closed:NoSchedule`; only pods that are safe there tolerate it (the
 *   rewrite adds the toleration, the webhook also gives it to pods with no network probe or hook).
 *   So a pod created while the webhook is down, which keeps kubelet's network probes, is never
 *   scheduled onto such a node. NoSchedule, never NoExecute: the taint manager evicts running pods
 *   that do not tolerate a NoExecute taint, and kubelet re-checks NoExecute taints when it admits
 *   pods again after a restart; NoSchedule is read by the scheduler only, so adding the taint, a
 *   kubelet restart or a webhook outage can never kill or evict a running pod;
 * - the node a DaemonSet pod is made for: the DaemonSet controller binds each pod to its node
 *   through a required `matchFields` term on `metadata.name`, so the webhook can tell which node
 *   the pod will run on and leave it unrewritten when that node has no shim.
 *
 * Pure.
 */

import { RewriteError } from './errors.ts';

type Obj = Record<string, unknown>;

/** Taint key of nodes whose node->pod path is closed. */
export const CLOSED_HOLE_TAINT_KEY = 'probe-agent.io/hole-closed';
/** Its effect: scheduling only (see above for why never NoExecute). */
export const CLOSED_HOLE_TAINT_EFFECT = 'NoSchedule';
/** The toleration rewritten pods carry. */
export const CLOSED_HOLE_TOLERATION = Object.freeze({ key: CLOSED_HOLE_TAINT_KEY, operator: 'Exists', effect: CLOSED_HOLE_TAINT_EFFECT });

const isObj = (v: unknown): v is Obj => v !== null && typeof v === 'object' && !Array.isArray(v);
const OUR_TOLERATION = JSON.stringify(CLOSED_HOLE_TOLERATION);

/**
 * Node label meaning "this node's kubelet is configured with the shim": the shim installer sets it
 * once it has read kubelet's configured runtime endpoint and seen the shim answer there, and never
 * removes it because a check failed (kubelet re-checks required node affinity when it restarts and
 * kills the pods that no longer match); only `install-shim.sh unlabel`/`uninstall` removes it,
 * after proving that no rewritten pod is left on the node.
 */
export const SHIM_NODE_LABEL = 'probe-agent.io/shim';
export const SHIM_NODE_LABEL_VALUE = 'ready';
/** The node selector requirement ANDed into every required node selector term of a rewritten pod. */
export const SHIM_AFFINITY_REQUIREMENT = Object.freeze({ key: SHIM_NODE_LABEL, operator: 'In', values: Object.freeze([SHIM_NODE_LABEL_VALUE]) });


/** Whether a value is exactly the toleration the rewrite adds. */
export const isClosedHoleToleration = (v: unknown): boolean => JSON.stringify(v) === OUR_TOLERATION;

/** Whether the pod's tolerations already let it onto closed-hole nodes (ours, or a broader one the user wrote). */
export function toleratesClosedHole(spec: Obj): boolean {
  const list = spec.tolerations;
  if (!Array.isArray(list)) return false;
  // Only `Exists` tolerations count: the taint's value is the operator's choice.
  return list.some((t) => isObj(t) && t.operator === 'Exists'
    && (t.key === CLOSED_HOLE_TAINT_KEY || t.key === undefined || t.key === '')
    && (t.effect === undefined || t.effect === '' || t.effect === CLOSED_HOLE_TAINT_EFFECT));
}

/**
 * Adds the closed-hole toleration to `spec` (which the caller owns) unless it already tolerates
 * the taint; returns the JSON pointers (relative to the pod) of what it created. Throws
 * RewriteError when `tolerations` is not a list (`base` prefixes the field path).
 */
export function ensureClosedHoleToleration(spec: Obj, base = ''): string[] {
  if (toleratesClosedHole(spec)) return [];
  if (spec.tolerations === undefined || spec.tolerations === null) {
    spec.tolerations = [{ ...CLOSED_HOLE_TOLERATION }];
    return ['/spec/tolerations'];
  }
  if (!Array.isArray(spec.tolerations)) throw new RewriteError(`${base}spec.tolerations`, 'must be a list');
  spec.tolerations.push({ ...CLOSED_HOLE_TOLERATION });
  return [`/spec/tolerations/${spec.tolerations.length - 1}`];
}

/**
 * The node a pod is pinned to by its required node affinity, as the DaemonSet controller pins
 * each daemon pod (`matchFields: [{key: metadata.name, operator: In, values: [<node>]}]` in every
 * term), or undefined when the scheduler may choose among several nodes.
 */
export function pinnedNodeName(spec: Obj): string | undefined {
  const affinity = isObj(spec.affinity) ? spec.affinity : undefined;
  const nodeAffinity = affinity && isObj(affinity.nodeAffinity) ? affinity.nodeAffinity : undefined;
  const required = nodeAffinity && isObj(nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution) ? nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution : undefined;
  const terms = required?.nodeSelectorTerms;
  if (!Array.isArray(terms) || terms.length === 0) return undefined;
  let node: string | undefined;
  for (const term of terms) {
    if (!isObj(term) || !Array.isArray(term.matchFields)) return undefined;
    const pin = term.matchFields.find((f) => isObj(f) && f.key === 'metadata.name' && f.operator === 'In' && Array.isArray(f.values) && f.values.length === 1 && typeof f.values[0] === 'string');
    if (!pin) return undefined;
    const name = ((pin as Obj).values as string[])[0]!;
    if (node !== undefined && node !== name) return undefined;
    node = name;
  }
  return node;
}

/**
 * Node annotation set at the start of a rollback (docs/closing-the-hole.md): the webhook stops
 * rewriting the DaemonSet pods made for that node, so the daemon pods deleted during the rollback
 * come back as written and the node can be proven free of rewritten pods. It does not touch
 * scheduling (a label would: kubelet re-checks required node affinity when it restarts).
 */
export const SHIM_ROLLBACK_ANNOTATION = 'probe-agent.io/shim-rollback';

const escapePointer = (s: string): string => s.replace(/~/g, '~0').replace(/\//g, '~1');
const unescapePointer = (s: string): string => s.replace(/~1/g, '/').replace(/~0/g, '~');
const sameRequirement = (v: unknown): boolean => JSON.stringify(v) === JSON.stringify(SHIM_AFFINITY_REQUIREMENT);
const requirement = (): Obj => ({ key: SHIM_NODE_LABEL, operator: 'In', values: [SHIM_NODE_LABEL_VALUE] });
const OUR_TERM = JSON.stringify({ matchExpressions: [SHIM_AFFINITY_REQUIREMENT] });
/** An array element the rewrite may have added: the requirement, a term holding only it, or the closed-hole toleration. */
/** The readiness gate of gates mode (gates-rewrite.ts): the agent's own pod condition. */
export const GATES_READINESS_GATE = Object.freeze({ conditionType: 'probe-agent.io/ready' });
const OUR_GATE = JSON.stringify(GATES_READINESS_GATE);
const isOurs = (v: unknown): boolean => sameRequirement(v) || JSON.stringify(v) === OUR_TERM || isClosedHoleToleration(v) || JSON.stringify(v) === OUR_GATE;

/**
 * Makes sure every required node selector term of `spec` demands the shim label; returns the JSON
 * pointers (relative to the pod) of what it created. Mutates `spec`, which the caller owns.
 */
export function ensureShimAffinity(spec: Obj, base: string): string[] {
  const added: string[] = [];
  const at = (...keys: string[]) => '/spec/' + keys.map(escapePointer).join('/');
  const REQ = 'requiredDuringSchedulingIgnoredDuringExecution';
  const term = (): Obj => ({ matchExpressions: [requirement()] });
  if (spec.affinity === undefined || spec.affinity === null) {
    spec.affinity = { nodeAffinity: { [REQ]: { nodeSelectorTerms: [term()] } } };
    return [at('affinity')];
  }
  if (!isObj(spec.affinity)) throw new RewriteError(`${base}spec.affinity`, 'must be an object');
  const affinity = spec.affinity;
  if (affinity.nodeAffinity === undefined || affinity.nodeAffinity === null) {
    affinity.nodeAffinity = { [REQ]: { nodeSelectorTerms: [term()] } };
    return [at('affinity', 'nodeAffinity')];
  }
  if (!isObj(affinity.nodeAffinity)) throw new RewriteError(`${base}spec.affinity.nodeAffinity`, 'must be an object');
  const nodeAffinity = affinity.nodeAffinity;
  if (nodeAffinity[REQ] === undefined || nodeAffinity[REQ] === null) {
    nodeAffinity[REQ] = { nodeSelectorTerms: [term()] };
    return [at('affinity', 'nodeAffinity', REQ)];
  }
  const required = nodeAffinity[REQ];
  const rpath = `${base}spec.affinity.nodeAffinity.${REQ}`;
  if (!isObj(required)) throw new RewriteError(rpath, 'must be an object');
  if (required.nodeSelectorTerms === undefined || required.nodeSelectorTerms === null) {
    required.nodeSelectorTerms = [term()];
    return [at('affinity', 'nodeAffinity', REQ, 'nodeSelectorTerms')];
  }
  const terms = required.nodeSelectorTerms;
  if (!Array.isArray(terms)) throw new RewriteError(`${rpath}.nodeSelectorTerms`, 'must be a list');
  if (terms.length === 0) {
    terms.push(term());
    return [at('affinity', 'nodeAffinity', REQ, 'nodeSelectorTerms', '0')];
  }
  // Terms are ORed: the requirement must be in each of them, or a pod could match a shim-less node through another term.
  for (const [i, t] of terms.entries()) {
    const tpath = `${rpath}.nodeSelectorTerms[${i}]`;
    if (!isObj(t)) throw new RewriteError(tpath, 'must be an object');
    if (t.matchExpressions === undefined || t.matchExpressions === null) {
      t.matchExpressions = [requirement()];
      added.push(at('affinity', 'nodeAffinity', REQ, 'nodeSelectorTerms', String(i), 'matchExpressions'));
      continue;
    }
    if (!Array.isArray(t.matchExpressions)) throw new RewriteError(`${tpath}.matchExpressions`, 'must be a list');
    if (t.matchExpressions.some(sameRequirement)) continue;
    t.matchExpressions.push(requirement());
    added.push(at('affinity', 'nodeAffinity', REQ, 'nodeSelectorTerms', String(i), 'matchExpressions', String(t.matchExpressions.length - 1)));
  }
  return added;
}

/**
 * Removes what the rewrite created at a JSON pointer of `root` (which the caller owns). Only the
 * rewrite's own parts go: an appended requirement or term is removed where it was put (or wherever
 * it went since); a created map loses the shim requirements inside it and then goes only if
 * nothing else is left, so what someone added there after the rewrite (pod anti-affinity, another
 * annotation) stays.
 */
export function removePointer(root: Obj, pointer: string): void {
  const keys = pointer.split('/').slice(1).map(unescapePointer);
  const last = keys.pop();
  if (last === undefined) return;
  let node: unknown = root;
  for (const k of keys) {
    if (Array.isArray(node)) node = node[Number(k)];
    else if (isObj(node)) node = node[k];
    else return;
  }
  if (Array.isArray(node)) {
    const i = isOurs(node[Number(last)]) ? Number(last) : node.findIndex(isOurs);
    if (i >= 0) node.splice(i, 1);
  } else if (isObj(node) && last in node) {
    if (stripOurs(node[last])) delete node[last];
  }
}

/** Removes the shim requirements (and terms holding only them) inside a created value; true when nothing else is left. */
function stripOurs(value: unknown): boolean {
  if (Array.isArray(value)) {
    for (let i = value.length - 1; i >= 0; i--) if (isOurs(value[i]) || stripOurs(value[i])) value.splice(i, 1);
    return value.length === 0;
  }
  if (isObj(value)) {
    for (const [k, v] of Object.entries(value)) if (stripOurs(v)) delete value[k];
    return Object.keys(value).length === 0;
  }
  return false;
}
