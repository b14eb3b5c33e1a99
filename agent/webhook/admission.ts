/**
 * The admission decision for one AdmissionReview (admission.k8s.io/v1): the pod rewritten by the
 * same transform as `probe-agent rewrite`, answered as a base64 JSONPatch. Pure: JSON in, JSON out.
 *
 * Never blocks a pod: anything the rewrite cannot handle is answered `allowed: true` with a
 * warning and no other change, so the pod runs as written (with kubelet's own probes).
 *
 * Every pod it decides at creation (opted in) gets the REVIEWED_ANNOTATION, whatever the decision:
 * the rewrite-webhook component's ValidatingAdmissionPolicy refuses an opted-in pod without it (the
 * review failed open), so the pod's controller creates it again instead of it waiting, un-rewritten,
 * for a node that is closed to it.
 *
 * Reads the cluster (through a ClusterReader) only when a pod needs it: a DaemonSet pod pinned to
 * one node (is that node's kubelet using the shim?) and a pod with a runtimeClassName (which
 * handler does it run with?). A read that fails leaves the pod as written, with a warning.
 */
import { describeError } from '../errors.ts';
import { RewriteError } from '../rewrite/errors.ts';
import { ANNOTATIONS_BUDGET_BYTES, isObj, ORIGINAL_HANDLERS_ANNOTATION, rewritePod, SHIM_NODE_LABEL, SHIM_NODE_LABEL_VALUE, type LoopbackHostPolicy, type PodResult, type RewriteOptions } from '../rewrite/pod-rewrite.ts';
import { pinnedNodeName, SHIM_ROLLBACK_ANNOTATION } from '../rewrite/placement.ts';
import { annotatedMode, rewritePodGates } from '../rewrite/gates-rewrite.ts';
import type { ClusterReader } from './cluster-reader.ts';
import { diffJson } from './json-patch.ts';

/** What the admission may use beyond the review: the cluster (none: decide from the pod alone) and the operator's choices. */
export interface AdmissionContext {
  cluster?: ClusterReader;
  loopbackHost?: LoopbackHostPolicy;
  /** RuntimeClass handlers gates mode refuses (default: the sandboxed list of pod-rewrite.ts). */
  gatesRefusedRuntimeClasses?: readonly string[];
}

/** Pod annotation: `enabled` opts a pod in (through MUTATE_ANNOTATED_PATH), `disabled` opts it out everywhere. */
export const OPT_IN_ANNOTATION = 'probe-agent.io/rewrite';
/** Namespace label the webhook's namespaceSelector opts whole namespaces in with. */
export const OPT_IN_NAMESPACE_LABEL = 'probe-agent.io/rewrite';
export const OPT_IN_VALUE = 'enabled';
export const OPT_OUT_VALUE = 'disabled';
/** Pod annotation the webhook sets on every pod it decides at creation; the value is the outcome. */
export const REVIEWED_ANNOTATION = 'probe-agent.io/reviewed';

/** Rewrites every pod it is sent (the namespace-selected webhook). */
export const MUTATE_PATH = '/mutate';
/** Rewrites only pods annotated `probe-agent.io/rewrite: "enabled"` (the webhook that sees every namespace). */
export const MUTATE_ANNOTATED_PATH = '/mutate-annotated';

/** Rewrites every pod it is sent in gates mode (the webhook selecting namespaces labelled probe-agent.io/mode=gates). */
export const MUTATE_GATES_PATH = '/mutate-gates';

/** `all`/`annotated`: shim mode unless the pod's probe-agent.io/mode annotation says gates; `gates`: the reverse. */
export type OptInMode = 'all' | 'annotated' | 'gates';

/** An AdmissionReview the server cannot answer at all (no uid): the HTTP status says so. */
export class AdmissionRequestError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'AdmissionRequestError';
  }
}

export interface AdmissionResponse {
  uid: string;
  allowed: true;
  patchType?: 'JSONPatch';
  /** base64 of the JSON Patch. */
  patch?: string;
  warnings?: string[];
}

export interface AdmissionReviewResponse {
  apiVersion: 'admission.k8s.io/v1';
  kind: 'AdmissionReview';
  response: AdmissionResponse;
}

/** What happened, for logs and metrics. */
export type AdmissionOutcome = 'rewritten' | 'unchanged' | 'skipped' | 'refused' | 'gates-refused';

/** API servers show at most this much of a warning; ours stay well under. */
const MAX_WARNING = 240;

type Obj = Record<string, unknown>;

/** One admission decision. */
export interface AdmissionDecision {
  review: AdmissionReviewResponse;
  outcome: AdmissionOutcome;
  detail?: string;
}

/** Decides one AdmissionReview. Throws AdmissionRequestError when the review itself is unusable. */
export async function admit(review: unknown, mode: OptInMode, context: AdmissionContext = {}): Promise<AdmissionDecision> {
  if (!isObj(review)) throw new AdmissionRequestError('body is not an AdmissionReview object');
  if (review.apiVersion !== 'admission.k8s.io/v1' || review.kind !== 'AdmissionReview') {
    throw new AdmissionRequestError(`want apiVersion admission.k8s.io/v1, kind AdmissionReview; got ${String(review.apiVersion).slice(0, 64)}, ${String(review.kind).slice(0, 64)}`);
  }
  const request = review.request;
  if (!isObj(request)) throw new AdmissionRequestError('AdmissionReview has no request');
  const uid = request.uid;
  if (typeof uid !== 'string' || uid === '' || uid.length > 128) throw new AdmissionRequestError('AdmissionReview request has no uid');
  const answer = (outcome: AdmissionOutcome, extra: Partial<AdmissionResponse> = {}, detail?: string) => ({
    review: { apiVersion: 'admission.k8s.io/v1' as const, kind: 'AdmissionReview' as const, response: { uid, allowed: true as const, ...extra } },
    outcome,
    ...(detail ? { detail } : {}),
  });
  const warn = (outcome: AdmissionOutcome, message: string) => answer(outcome, { warnings: [`probe-agent: ${message}`.slice(0, MAX_WARNING)] }, message);

  const kind = isObj(request.kind) ? request.kind : {};
  const resource = isObj(request.resource) ? request.resource : {};
  if (kind.kind !== 'Pod' || resource.resource !== 'pods' || (request.subResource ?? '') !== '') {
    return warn('skipped', `not a pod (${String(kind.kind ?? '?').slice(0, 40)}${request.subResource ? `/${String(request.subResource).slice(0, 40)}` : ''}): left unchanged`);
  }
  const update = request.operation === 'UPDATE';
  if (request.operation !== 'CREATE' && !update) return answer('skipped', {}, `operation ${String(request.operation).slice(0, 16)}`);
  const pod = request.object;
  if (!isObj(pod)) return warn('refused', 'the request has no pod object: left unchanged');
  if (update) {
    // Probes change on UPDATE only with MutableContainerProbes (KEP-6318). A pod rewritten at
    // creation may run where the node->pod path is closed, so a new probe is rewritten too; any
    // other pod was judged at creation and stays as it is.
    if (!hasRewriteRecord(request.oldObject)) return answer('skipped', {}, 'UPDATE of a pod not rewritten at creation');
    if (isGatesRecord(request.oldObject)) return answer('skipped', {}, 'UPDATE of a gates-mode pod');
  } else {
    const annotations = isObj(pod.metadata) && isObj(pod.metadata.annotations) ? pod.metadata.annotations : {};
    const optIn = annotations[OPT_IN_ANNOTATION];
    if (optIn === OPT_OUT_VALUE) return answer('skipped', {}, 'opted out by annotation');
    if (mode === 'annotated' && optIn !== OPT_IN_VALUE) return answer('skipped', {}, 'not opted in');
    return markReviewed(pod, await decide());
  }
  return decide();

  /** The decision on the pod, past the opt-in checks of a CREATE. */
  async function decide(): Promise<AdmissionDecision> {
    if (!isObj(pod)) return warn('refused', 'the request has no pod object: left unchanged');
    if (!update && (annotatedMode(pod) ?? (mode === 'gates' ? 'gates' : 'shim')) === 'gates') return admitGates(pod);
    if (!update && isObj(pod.spec) && typeof pod.spec.nodeName === 'string' && pod.spec.nodeName !== '') {
      // The scheduler never sees a pod bound at creation, so the shim affinity could not keep it off shim-less nodes.
      return warn('skipped', `pod is bound to node ${pod.spec.nodeName.slice(0, 64)} at creation: probes left unchanged (the shim node affinity needs the scheduler)`);
    }
    const spec = isObj(pod.spec) ? pod.spec : {};
    const options: RewriteOptions = { tolerateWhenClean: true, ...(context.loopbackHost ? { loopbackHost: context.loopbackHost } : {}) };
    // A pod naming a RuntimeClass is judged by the class's handler: one cached GET per class.
    const rc = spec.runtimeClassName;
    if (typeof rc === 'string' && rc !== '' && spec.hostNetwork !== true && context.cluster) {
      let handler;
      try {
        handler = await context.cluster.runtimeHandler(rc);
      } catch (err) {
        return warn('skipped', `probes left unchanged: cannot read RuntimeClass ${rc.slice(0, 64)}: ${describeError(err)}`);
      }
      if (handler === null) return warn('skipped', `probes left unchanged: RuntimeClass ${rc.slice(0, 64)} not found`);
      options.runtimeHandlers = new Map([[rc, handler]]);
    }
    const result = rewriteOrWarn(pod, options);
    if ('review' in result) return result;
    // Only a pod the rewrite really changes (not for a toleration alone) needs its node read; an
    // UPDATE's node was judged at creation.
    if (!update && rewritesHandlers(pod, result)) {
      // A DaemonSet pod is made for one node: rewrite it only when that node's kubelet uses the shim.
      const pinned = pinnedNodeName(spec);
      if (pinned !== undefined) {
        const why = await nodeRefusal(pinned, context.cluster);
        if (why) return warn('skipped', `probes left unchanged: ${why}`);
      }
    }
    if (!result.changed) return result.skipped ? warn('skipped', `probes left unchanged: ${result.skipped}`) : answer('unchanged');
    const ops = diffJson(pod, result.pod);
    const patch = Buffer.from(JSON.stringify(ops)).toString('base64');
    // A pod with nothing to rewrite (or a hostNetwork pod) only gets the closed-hole toleration.
    const rewritten = rewritesHandlers(pod, result);
    const extra: Partial<AdmissionResponse> = { patchType: 'JSONPatch', patch };
    if (result.skipped) extra.warnings = [`probe-agent: probes left unchanged: ${result.skipped}`.slice(0, MAX_WARNING)];
    return answer(rewritten ? 'rewritten' : 'unchanged', extra, rewritten ? undefined : 'closed-hole toleration only');
  }

  /** Gates mode: no node to check (no affinity, kubelet untouched), a refusal is said and counted. */
  async function admitGates(p: Obj): Promise<AdmissionDecision> {
    const s = isObj(p.spec) ? p.spec : {};
    const o: RewriteOptions = { mode: 'gates', ...(context.loopbackHost ? { loopbackHost: context.loopbackHost } : {}), ...(context.gatesRefusedRuntimeClasses ? { sandboxedRuntimeClasses: context.gatesRefusedRuntimeClasses } : {}) };
    const runtimeClass = s.runtimeClassName;
    if (typeof runtimeClass === 'string' && runtimeClass !== '' && s.hostNetwork !== true && context.cluster) {
      try {
        const handler = await context.cluster.runtimeHandler(runtimeClass);
        if (handler === null) return warn('gates-refused', `probes left unchanged: RuntimeClass ${runtimeClass.slice(0, 64)} not found`);
        o.runtimeHandlers = new Map([[runtimeClass, handler]]);
      } catch (err) {
        return warn('gates-refused', `probes left unchanged: cannot read RuntimeClass ${runtimeClass.slice(0, 64)}: ${describeError(err)}`);
      }
    }
    let r: PodResult;
    try {
      r = rewritePodGates(p, '', o);
    } catch (err) {
      return warn('refused', `probes left unchanged: ${err instanceof RewriteError ? err.message : `internal error: ${describeError(err)}`}`);
    }
    if (!r.changed) return r.skipped ? warn('gates-refused', `gates mode: probes left unchanged: ${r.skipped}`) : answer('unchanged');
    const ops = diffJson(p, r.pod);
    return answer('rewritten', { patchType: 'JSONPatch', patch: Buffer.from(JSON.stringify(ops)).toString('base64') }, 'gates mode');
  }

  /** The rewrite, or the answer for a pod it cannot handle. */
  function rewriteOrWarn(p: Obj, o: RewriteOptions): PodResult | AdmissionDecision {
    try {
      return rewritePod(p, '', o);
    } catch (err) {
      if (err instanceof RewriteError) return warn('refused', `probes left unchanged: ${err.message}`);
      return warn('refused', `probes left unchanged: internal error: ${describeError(err)}`);
    }
  }
}

/**
 * The decision with REVIEWED_ANNOTATION added to its patch (after the decision's own operations,
 * so it is added to the pod they make). Left off a pod whose annotations would pass the API
 * server's limit: the pod is then refused by the policy, with the webhook's warning.
 */
function markReviewed(pod: Obj, decision: AdmissionDecision): AdmissionDecision {
  const response = decision.review.response;
  const ops: Array<{ op: string; path: string; value?: unknown }> = response.patch ? JSON.parse(Buffer.from(response.patch, 'base64').toString('utf8')) : [];
  const metadata = isObj(pod.metadata) ? pod.metadata : undefined;
  const annotations = metadata && isObj(metadata.annotations) ? metadata.annotations : undefined;
  const value = decision.outcome;
  // The decision's own operations only ever add annotations (the record) to a pod that had none or an object.
  const madeAnnotations = ops.some((o) => o.path === '/metadata/annotations' || o.path === '/metadata');
  if (!metadata && !madeAnnotations) ops.push({ op: 'add', path: '/metadata', value: { annotations: { [REVIEWED_ANNOTATION]: value } } });
  else if (!annotations && !madeAnnotations) ops.push({ op: 'add', path: '/metadata/annotations', value: { [REVIEWED_ANNOTATION]: value } });
  else {
    if (annotations && annotationBytes(annotations) + REVIEWED_ANNOTATION.length + value.length > ANNOTATIONS_BUDGET_BYTES) return decision;
    ops.push({ op: 'add', path: `/metadata/annotations/${REVIEWED_ANNOTATION.replace(/~/g, '~0').replace(/\//g, '~1')}`, value });
  }
  return { ...decision, review: { ...decision.review, response: { ...response, patchType: 'JSONPatch', patch: Buffer.from(JSON.stringify(ops)).toString('base64') } } };
}

function annotationBytes(annotations: Obj): number {
  let n = 0;
  for (const [k, v] of Object.entries(annotations)) n += Buffer.byteLength(k) + (typeof v === 'string' ? Buffer.byteLength(v) : 0);
  return n;
}

/** Whether a pod carries the record the rewrite leaves on every pod whose handlers it rewrote. */
function hasRewriteRecord(pod: unknown): boolean {
  return isObj(pod) && isObj(pod.metadata) && isObj(pod.metadata.annotations) && typeof pod.metadata.annotations[ORIGINAL_HANDLERS_ANNOTATION] === 'string';
}

/** Whether a pod carries a gates-mode record. */
function isGatesRecord(pod: unknown): boolean {
  if (!hasRewriteRecord(pod)) return false;
  try {
    const raw = ((pod as Obj).metadata as Obj).annotations as Obj;
    const parsed = JSON.parse(raw[ORIGINAL_HANDLERS_ANNOTATION] as string) as unknown;
    return isObj(parsed) && parsed.mode === 'gates';
  } catch {
    return false;
  }
}

/** Whether the rewrite changes more than the pod's tolerations (its handlers, affinity, record). */
function rewritesHandlers(before: Obj, result: PodResult): boolean {
  return result.changed && diffJson(before, result.pod).some((op) => !op.path.startsWith('/spec/tolerations'));
}

/** Why a pod pinned to `node` must keep its probes (undefined: the node's kubelet uses the shim). */
async function nodeRefusal(node: string, cluster: ClusterReader | undefined): Promise<string | undefined> {
  const name = node.slice(0, 64);
  if (!cluster) return `pod is made for node ${name} and the webhook cannot read nodes (no API server access)`;
  let facts;
  try {
    facts = await cluster.node(node);
  } catch (err) {
    return `pod is made for node ${name}, which cannot be read: ${describeError(err)}`;
  }
  if (facts === null) return `pod is made for node ${name}, which does not exist`;
  if (facts.labels[SHIM_NODE_LABEL] !== SHIM_NODE_LABEL_VALUE) return `pod is made for node ${name}, whose kubelet does not use the shim (no ${SHIM_NODE_LABEL}=${SHIM_NODE_LABEL_VALUE} label)`;
  if (facts.annotations[SHIM_ROLLBACK_ANNOTATION] !== undefined) return `pod is made for node ${name}, which is being rolled back (${SHIM_ROLLBACK_ANNOTATION})`;
  return undefined;
}
