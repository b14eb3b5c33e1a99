/**
 * Where a rewritten pod may run, beyond the shim node affinity (pod-rewrite.ts):
 *
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
