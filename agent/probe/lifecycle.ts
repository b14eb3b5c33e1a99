/**
 * kubelet's HTTP lifecycle hooks (pkg/kubelet/lifecycle/handlers.go, kubelet 1.31+ with
 * ConsistentHTTPGetHandlers locked on), run from inside the pod's netns with the probes' HTTP
 * machinery (http.ts followRedirects, http-request.ts request and redirect rules):
 *
 * - the request is kubelet's probe request with User-Agent `kube-lifecycle/<major.minor>` unless the
 *   handler sets one (NewRequestForHTTPGetAction(..., "lifecycle"));
 * - any HTTP response is a success, whatever its status: handlers.go only looks at Do's error;
 * - redirects: kubelet's hook client uses RedirectChecker(false), as probes do: same-host redirects are
 *   followed (at most 10, then an error), another host's redirect is the response (a success);
 * - TLS is not verified; an HTTPS request that got an HTTP answer is retried once over plain HTTP
 *   without the Authorization header (and kubelet records a LifecycleHTTPFallback event);
 * - the body is discarded (at most 10 KiB is read) and never reported;
 * - the deprecated tcpSocket hook: kubelet's Run has no case for it and fails the hook ("invalid
 *   handler"); we do the same and never connect;
 * - time: kubelet's hook client has no timeout; kubelet bounds a preStop hook by the grace period and
 *   leaves postStart unbounded. The caller gives the bound (RunLifecycleHandler timeout_seconds or the
 *   call deadline; the agent caps it at SPEC_LIMITS.maxTimeoutSeconds).
 */
import { performance } from 'node:perf_hooks';
import { InvalidProbeError, describeError } from '../errors.ts';
import { Deadline } from './connect.ts';
import { followRedirects } from './http.ts';
import { buildHeaderMap, buildProbeRequest, type HeaderMap } from './http-request.ts';
import { boundMessage } from './run.ts';
import { SPEC_LIMITS } from './spec.ts';
import { TargetError, planTargets, type TargetPlan } from './target.ts';
import { hookLimitSeconds } from './time-budget.ts';
import type { FailureReason, HttpGetHandler, ProbeContext, ProbePhases, TcpSocketHandler } from './types.ts';

/** The two container lifecycle hooks. */
export type LifecycleHook = 'postStart' | 'preStop';

/** A lifecycle handler probe-agent can be asked to run (exec and sleep stay with kubelet). */
export type LifecycleHandlerSpec = HttpGetHandler | TcpSocketHandler;

/** What one hook run produced. */
export interface HookOutcome {
  /** success: kubelet would count the hook as done; failure: as failed; error: it could not be run. */
  result: 'success' | 'failure' | 'error';
  /** Empty on a plain success; kubelet's wording otherwise. Never a response body. */
  message: string;
  reason?: FailureReason;
  durationSeconds: number;
  phases: ProbePhases;
  /** The HTTP status that ended the hook (any status is a success). */
  status?: number;
  /** The HTTPS request got an HTTP answer and the hook succeeded over plain HTTP. */
  fellBackToHttp?: boolean;
  /** The address:port that answered or was tried last. */
  address?: string;
}

/** Everything a hook needs besides the handler: a probe context whose timeout 0 means "no own limit". */
export interface HookContext extends ProbeContext {
  hook: LifecycleHook;
}

/** kubelet's lifecycle User-Agent for a version ("1.34" -> "kube-lifecycle/1.34"). */
export function lifecycleUserAgent(kubeVersion: string): string {
  return `kube-lifecycle/${kubeVersion}`;
}

/** Go's text when a TLS handshake is answered with "HTTP/..." (and our TLS code's wording for it). */
const HTTP_ANSWER_TO_TLS = /server gave HTTP response to HTTPS client|first record does not look like a TLS handshake/;

/** Runs one lifecycle hook with kubelet's semantics; never throws. */
export async function runLifecycleHandler(handler: LifecycleHandlerSpec, ctx: HookContext): Promise<HookOutcome> {
  const started = performance.now();
  const phases: ProbePhases = { total: 0 };
  const finish = (o: Omit<HookOutcome, 'durationSeconds' | 'phases'>): HookOutcome => {
    const total = (performance.now() - started) / 1000;
    return { ...o, message: boundMessage(o.message), durationSeconds: total, phases: { ...phases, total } };
  };
  if (handler.kind === 'tcp') {
    // handlers.go's default case: the hook fails before anything is sent.
    return finish({ result: 'failure', reason: 'invalid-spec', message: 'Cannot run handler: invalid handler: tcpSocket lifecycle hooks are not supported by kubelet' });
  }
  const limit = hookLimitSeconds(ctx.timeoutSeconds);
  if (!Number.isFinite(limit) || limit <= 0 || limit > SPEC_LIMITS.maxTimeoutSeconds) {
    return finish({ result: 'error', reason: 'invalid-spec', message: `timeout: must be 0 or up to ${SPEC_LIMITS.maxTimeoutSeconds} s, got ${ctx.timeoutSeconds}` });
  }
  const deadline = new Deadline(limit * 1000, ctx.signal);
  try {
    let plan: TargetPlan;
    try {
      plan = await planTargets(handler, ctx, deadline.signal);
    } catch (err) {
      if (err instanceof TargetError) {
        const isFailure = err.reason === 'timeout' || err.reason === 'unreachable';
        return finish({ result: isFailure ? 'failure' : 'error', reason: err.reason, message: err.message });
      }
      if (err instanceof InvalidProbeError) return finish({ result: 'error', reason: 'invalid-spec', message: err.message });
      throw err;
    }
    const headers = lifecycleHeaders(handler, ctx.kubeVersion);
    const first = buildProbeRequest(handler.scheme, plan.host, plan.port, handler.path, headers);
    let end = await followRedirects(first, headers, plan, deadline, phases);
    let fellBack = false;
    if (end.kind === 'hop-error' && handler.scheme === 'HTTPS' && end.error.reason === 'tls' && HTTP_ANSWER_TO_TLS.test(end.error.message)) {
      const plain = headers.clone();
      plain.delete('Authorization');
      end = await followRedirects(buildProbeRequest('HTTP', plan.host, plan.port, handler.path, plain), plain, plan, deadline, phases);
      fellBack = end.kind === 'response';
    }
    if (end.kind === 'response') {
      const out: Omit<HookOutcome, 'durationSeconds' | 'phases'> = { result: 'success', message: '', status: end.response.status, address: end.address };
      if (fellBack) {
        out.fellBackToHttp = true;
        out.message = `request to HTTPS lifecycle hook ${first.hostHeader} got HTTP response, retry with HTTP succeeded`;
      }
      return finish(out);
    }
    const failed = end.kind === 'hop-error' ? end.error : { kind: 'failure' as const, reason: end.reason, message: end.message };
    return finish({
      result: failed.kind === 'error' ? 'error' : 'failure',
      reason: failed.reason,
      message: `HTTP lifecycle hook (${handler.path}) failed - error: ${failed.message}`,
      address: end.address,
    });
  } catch (err) {
    return finish({ result: 'error', reason: 'other', message: `hook crashed: ${describeError(err)}` });
  } finally {
    deadline.dispose();
  }
}

/** kubelet's request headers for a hook: the probe rules, with kube-lifecycle as the default User-Agent. */
function lifecycleHeaders(handler: HttpGetHandler, kubeVersion: string): HeaderMap {
  const h = buildHeaderMap(handler.headers, kubeVersion);
  const ownUA = handler.headers.some((x) => x.name.toLowerCase() === 'user-agent');
  if (!ownUA) h.set('User-Agent', lifecycleUserAgent(kubeVersion));
  return h;
}
