/**
 * The admission decision for one AdmissionReview (admission.k8s.io/v1): the pod rewritten by the
 * same transform as `probe-agent rewrite`, answered as a base64 JSONPatch. Pure: JSON in, JSON out.
 *
 * Never blocks a pod: anything the rewrite cannot handle is answered `allowed: true` with a
 * warning and no patch, so the pod runs as written (with kubelet's own probes).
 */
import { describeError } from '../errors.ts';
import { RewriteError } from '../rewrite/errors.ts';
import { isObj, rewritePod } from '../rewrite/pod-rewrite.ts';
import { diffJson } from './json-patch.ts';

/** Pod annotation: `enabled` opts a pod in (through MUTATE_ANNOTATED_PATH), `disabled` opts it out everywhere. */
export const OPT_IN_ANNOTATION = 'probe-agent.io/rewrite';
/** Namespace label the webhook's namespaceSelector opts whole namespaces in with. */
export const OPT_IN_NAMESPACE_LABEL = 'probe-agent.io/rewrite';
export const OPT_IN_VALUE = 'enabled';
export const OPT_OUT_VALUE = 'disabled';

/** Rewrites every pod it is sent (the namespace-selected webhook). */
export const MUTATE_PATH = '/mutate';
/** Rewrites only pods annotated `probe-agent.io/rewrite: "enabled"` (the webhook that sees every namespace). */
export const MUTATE_ANNOTATED_PATH = '/mutate-annotated';

export type OptInMode = 'all' | 'annotated';

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
export type AdmissionOutcome = 'rewritten' | 'unchanged' | 'skipped' | 'refused';

/** API servers show at most this much of a warning; ours stay well under. */
const MAX_WARNING = 240;

type Obj = Record<string, unknown>;

/** Decides one AdmissionReview. Throws AdmissionRequestError when the review itself is unusable. */
export function admit(review: unknown, mode: OptInMode): { review: AdmissionReviewResponse; outcome: AdmissionOutcome; detail?: string } {
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
  if (request.operation !== 'CREATE') return answer('skipped', {}, `operation ${String(request.operation).slice(0, 16)}`);
  const pod = request.object;
  if (!isObj(pod)) return warn('refused', 'the request has no pod object: left unchanged');
  const annotations = isObj(pod.metadata) && isObj(pod.metadata.annotations) ? pod.metadata.annotations : {};
  const optIn = annotations[OPT_IN_ANNOTATION];
  if (optIn === OPT_OUT_VALUE) return answer('skipped', {}, 'opted out by annotation');
  if (mode === 'annotated' && optIn !== OPT_IN_VALUE) return answer('skipped', {}, 'not opted in');
  if (isObj(pod.spec) && typeof pod.spec.nodeName === 'string' && pod.spec.nodeName !== '') {
    // The scheduler never sees a pod bound at creation, so the shim affinity could not keep it off shim-less nodes.
    return warn('skipped', `pod is bound to node ${pod.spec.nodeName.slice(0, 64)} at creation: probes left unchanged (the shim node affinity needs the scheduler)`);
  }
  let result;
  try {
    result = rewritePod(pod);
  } catch (err) {
    if (err instanceof RewriteError) return warn('refused', `probes left unchanged: ${err.message}`);
    return warn('refused', `probes left unchanged: internal error: ${describeError(err)}`);
  }
  if (!result.changed) return result.skipped ? warn('skipped', `probes left unchanged: ${result.skipped}`) : answer('unchanged');
  const patch = Buffer.from(JSON.stringify(diffJson(pod, result.pod))).toString('base64');
  return answer('rewritten', { patchType: 'JSONPatch', patch });
}
