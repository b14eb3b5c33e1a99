/**
 * Finds the pods in a Kubernetes object: a Pod, the pod template of a workload (Deployment,
 * StatefulSet, DaemonSet, ReplicaSet, ReplicationController, Job, PodTemplate), a CronJob's job
 * template, and the items of a List. Other kinds pass through unchanged. Pure, like pod-rewrite.ts.
 */
import { RewriteError } from './errors.ts';
import { isObj, rewritePod, undoPod, type PodResult, type RewriteOptions } from './pod-rewrite.ts';
import { rewritePodGates } from './gates-rewrite.ts';

export type Direction = 'rewrite' | 'undo';

/**
 * What the rewrite does with a DaemonSet's template. The DaemonSet controller places daemon pods
 * by the template's node affinity: the shim affinity in the template makes it delete its pods on
 * every node without the shim label (finding 4). So by default a DaemonSet is left as written
 * (rewrite its pods with the webhook, which reads each pod's node); `shim-nodes-only` rewrites
 * it anyway, for daemons that are meant to run only where the shim is.
 */
export type DaemonSetPolicy = 'leave' | 'shim-nodes-only';

/** Choices of the caller: the pod rewrite's, and the DaemonSet policy. */
export interface TransformOptions extends RewriteOptions {
  daemonSets?: DaemonSetPolicy;
}

/** An object with whether the transform changed anything. */
export interface ObjectResult {
  object: unknown;
  changed: boolean;
  /** Pods left as written on purpose, as `<field path>: <why>`. */
  notes?: string[];
}

type Obj = Record<string, unknown>;

/** Where the pod sits in each kind that has one: the keys from the object to the pod template. */
const TEMPLATE_PATHS: Record<string, readonly string[]> = {
  Pod: [],
  PodTemplate: ['template'],
  Deployment: ['spec', 'template'],
  StatefulSet: ['spec', 'template'],
  DaemonSet: ['spec', 'template'],
  ReplicaSet: ['spec', 'template'],
  ReplicationController: ['spec', 'template'],
  Job: ['spec', 'template'],
  CronJob: ['spec', 'jobTemplate', 'spec', 'template'],
};

/** The kinds whose pods the rewrite reaches (List items included). */
export const REWRITTEN_KINDS = Object.keys(TEMPLATE_PATHS);

/** Whether an object is a list of objects (`kind: List`, or any `...List` with items). */
const isList = (o: Obj): boolean => typeof o.kind === 'string' && o.kind.endsWith('List') && Array.isArray(o.items);

/** Applies the rewrite (or its undo) to every pod in `object`. `path` prefixes field paths in errors. */
export function transformObject(object: unknown, direction: Direction, path = '', options: TransformOptions = {}): ObjectResult {
  if (object === null || object === undefined) return { object, changed: false };
  if (!isObj(object)) throw new RewriteError(path, 'a Kubernetes object must be a map');
  const prefix = path ? `${path}.` : '';
  if (isList(object)) {
    const items = object.items as unknown[];
    let changed = false;
    const notes: string[] = [];
    const out = items.map((item, i) => {
      const r = transformObject(item, direction, `${prefix}items[${i}]`, options);
      changed ||= r.changed;
      if (r.notes) notes.push(...r.notes);
      return r.object;
    });
    const result: ObjectResult = changed ? { object: { ...object, items: out }, changed } : { object, changed: false };
    return notes.length ? { ...result, notes } : result;
  }
  const keys = typeof object.kind === 'string' ? TEMPLATE_PATHS[object.kind] : undefined;
  if (!keys) return { object, changed: false };
  // Walk down to the template, keeping every level's key order on the way back up.
  const chain: Obj[] = [object];
  for (const [i, k] of keys.entries()) {
    const next = chain[i]![k];
    if (next === undefined || next === null) return { object, changed: false };
    if (!isObj(next)) throw new RewriteError(prefix + keys.slice(0, i + 1).join('.'), 'must be an object');
    chain.push(next);
  }
  const base = keys.length ? `${prefix}${keys.join('.')}.` : prefix;
  const pod = chain.at(-1)!;
  // A gates-mode pod has no node affinity: its DaemonSet runs everywhere as before.
  if (direction === 'rewrite' && object.kind === 'DaemonSet' && options.daemonSets !== 'shim-nodes-only' && options.mode !== 'gates') {
    const would = rewritePod(pod, base, options);
    if (!would.changed) return would.skipped ? { object, changed: false, notes: [`${base}spec: left unchanged: ${would.skipped}`] } : { object, changed: false };
    return { object, changed: false, notes: [`${base}spec: left unchanged: a DaemonSet's template with the shim node affinity would make its controller delete its pods on every node without the shim; the webhook rewrites its pods node by node (or pass --daemonsets shim-nodes-only)`] };
  }
  const rewrite = options.mode === 'gates' ? rewritePodGates : rewritePod;
  const r: PodResult = direction === 'rewrite' ? rewrite(pod, base, options) : undoPod(pod, base);
  if (!r.changed) return r.skipped ? { object, changed: false, notes: [`${base}spec: left unchanged: ${r.skipped}`] } : { object, changed: false };
  let rebuilt: Obj = r.pod;
  for (let i = keys.length - 1; i >= 0; i--) rebuilt = { ...chain[i], [keys[i]!]: rebuilt };
  return { object: rebuilt, changed: true };
}
