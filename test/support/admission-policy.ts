/**
 * The API server's ValidatingAdmissionPolicy steps, for tests of the policies the components ship
 * (there is no API server in unit tests): resource rules, the namespaceSelector's matchExpressions,
 * lazy variables, matchConditions (no variables, namespaceObject null), validations, and the policy's failurePolicy applied to evaluation
 * errors. The CEL is the policy's own, read from its YAML and run by the CEL subset (cel-subset.ts).
 * Not covered: the API server's CEL compiler, type checker and cost limits, nor how it builds
 * `request` from the AdmissionRequest (a real v1.33 control plane is test/e2e-cluster).
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseAllDocuments } from 'yaml';
import { CelError, cel, type CelEnv } from './cel-subset.ts';

type Obj = Record<string, any>;

const ROOT = fileURLToPath(new URL('../..', import.meta.url));

export type Decision = { decision: 'not-matched' } | { decision: 'allowed' } | { decision: 'denied'; message: string };

/** The ValidatingAdmissionPolicy and its binding in `file` (relative to deploy/components). */
export function loadPolicy(file: string): { policy: Obj; binding: Obj } {
  const docs = parseAllDocuments(readFileSync(path.join(ROOT, 'deploy/components', file), 'utf8')).map((d) => d.toJS() as Obj);
  const policy = docs.find((d) => d.kind === 'ValidatingAdmissionPolicy');
  const binding = docs.find((d) => d.kind === 'ValidatingAdmissionPolicyBinding');
  if (!policy || !binding) throw new Error(`${file}: expected a ValidatingAdmissionPolicy and its binding`);
  return { policy, binding };
}

function ruleMatches(policy: Obj, request: Obj): boolean {
  const resource = request.subResource ? `${request.resource.resource}/${request.subResource}` : request.resource.resource;
  const has = (list: string[], v: string): boolean => list.includes('*') || list.includes(v);
  return (policy.spec.matchConstraints.resourceRules as Obj[]).some((r) =>
    has(r.apiGroups, request.resource.group) && has(r.apiVersions, request.resource.version) && has(r.operations, request.operation) &&
    (has(r.resources, resource) || (request.subResource && (r.resources as string[]).includes(`${request.resource.resource}/*`))));
}

/** The namespaceSelector's matchExpressions (In / NotIn / Exists / DoesNotExist) on a namespace's labels. */
function namespaceMatches(policy: Obj, ns: Obj | null): boolean {
  const expressions = policy.spec.matchConstraints.namespaceSelector?.matchExpressions as Obj[] | undefined;
  if (!expressions) return true;
  if (ns === null) throw new Error(`${policy.metadata.name} selects namespaces: pass the request's namespace`);
  const labels: Record<string, string> = ns.metadata.labels ?? {};
  return expressions.every((e) => {
    const has = e.key in labels;
    if (e.operator === 'In') return has && e.values.includes(labels[e.key]);
    if (e.operator === 'NotIn') return !has || !e.values.includes(labels[e.key]);
    if (e.operator === 'Exists') return has;
    if (e.operator === 'DoesNotExist') return !has;
    throw new Error(`operator ${e.operator}`);
  });
}

/** What the API server decides with `policy` for one AdmissionRequest (in namespace `ns`, if namespaced). */
export function admitByPolicy(policy: Obj, request: Obj, ns: Obj | null = null): Decision {
  const run = evaluate(policy, request, ns);
  if (run.matched !== true) return run.matched;
  const failed = run.validations.find((v) => v.failed !== undefined);
  return failed ? { decision: 'denied', message: failed.failed! } : { decision: 'allowed' };
}

/**
 * Every validation's verdict for a request the policy matches (the API server stops at the first
 * failure; tests use this to show a request is refused by exactly the rule meant to refuse it).
 * `failed` is the validation's message, or the error's under failurePolicy Fail; undefined: it passed.
 */
export function validationVerdicts(policy: Obj, request: Obj, ns: Obj | null = null): Array<{ message: string; failed?: string }> {
  const run = evaluate(policy, request, ns);
  if (run.matched !== true) throw new Error(`${policy.metadata.name}: the request is not matched (${JSON.stringify(run.matched)})`);
  return run.validations;
}

function evaluate(policy: Obj, request: Obj, ns: Obj | null): { matched: true | Decision; validations: Array<{ message: string; failed?: string }> } {
  if (!ruleMatches(policy, request) || !namespaceMatches(policy, ns)) return { matched: { decision: 'not-matched' }, validations: [] };
  const failClosed = policy.spec.failurePolicy === 'Fail';
  const env: CelEnv = { request, object: request.object ?? null, oldObject: request.oldObject ?? null, params: null, namespaceObject: ns };
  const variables: Obj = {};
  for (const v of (policy.spec.variables ?? []) as Obj[]) {
    // Lazy, as the API server's: a variable fails only the expressions that use it.
    Object.defineProperty(variables, v.name, { enumerable: true, get: () => cel(v.expression, env) });
  }
  // As a real v1.33 API server does: matchConditions run before variables exist and without the
  // namespace (namespaceObject is null there); a condition that needs either errors, or never matches.
  const matchEnv: CelEnv = { ...env, namespaceObject: null };
  env['variables'] = variables;
  for (const c of (policy.spec.matchConditions ?? []) as Obj[]) {
    try {
      if (cel(c.expression, matchEnv) !== true) return { matched: { decision: 'not-matched' }, validations: [] };
    } catch (err) {
      if (!(err instanceof CelError)) throw err;
      return { matched: failClosed ? { decision: 'denied', message: `matchCondition ${c.name}: ${err.message}` } : { decision: 'not-matched' }, validations: [] };
    }
  }
  const validations = (policy.spec.validations as Obj[]).map((v) => {
    try {
      return cel(v.expression, env) === true ? { message: v.message as string } : { message: v.message as string, failed: v.message as string };
    } catch (err) {
      if (!(err instanceof CelError)) throw err;
      return failClosed ? { message: v.message as string, failed: `expression error: ${err.message}` } : { message: v.message as string };
    }
  });
  return { matched: true, validations };
}
