/**
 * kubelet's TCP probe (pkg/probe/tcp/tcp.go): the handshake completing is success; the socket is
 * closed at once and no byte is sent.
 *
 * Difference from kubelet: its dialer sets SO_LINGER{on, 1s} to keep TIME-WAIT short (#89898); Node
 * cannot set SO_LINGER, so we close normally (FIN). The TIME-WAIT sockets this leaves live in the
 * pod's netns, whose ephemeral port space is the pod's own, so they do not add up on the node.
 */
import { ConnectError, connectTo, helperOutcomeError, helperTarget, toConnectError, type Deadline, type ProberResult } from './connect.ts';
import { joinHostPort, type TargetPlan } from './target.ts';
import { helperTcpTimes } from './time-budget.ts';
import type { TcpProbeOutcome } from './types.ts';

/** Runs kubelet's TCP probe against `plan`; never throws. */
export async function probeTcp(plan: TargetPlan, deadline: Deadline): Promise<ProberResult> {
  const addresses = plan.ips.map((ip) => ({ ip, port: plan.port }));
  try {
    const inHelper = await probeInHelper(plan, deadline);
    if (inHelper) return inHelper;
    const c = await connectTo(addresses, plan, deadline);
    c.socket.destroy();
    return {
      result: 'success',
      message: '',
      address: joinHostPort(c.address.ip, c.address.port),
      phases: { helper: c.helperSeconds, connect: c.connectSeconds },
    };
  } catch (err) {
    if (err instanceof ConnectError) {
      return {
        result: err.kind,
        reason: err.reason,
        message: err.dialText,
        address: err.address.ip ? joinHostPort(err.address.ip, err.address.port) : undefined,
        phases: {},
      };
    }
    return { result: 'error', reason: 'other', message: String(err), phases: {} };
  }
}

/**
 * The probe done whole by the socket factory where it makes sockets (the resident helper's child
 * inside the pod's netns: connect, close, report), when it offers that and the probe has one or
 * two addresses (a dual-stack pod with Happy Eyeballs: the child staggers them as connectTo does;
 * more, from a resolved legacy host name, stay in Node). Undefined: take the socket route.
 * The child counts the timeout from the socket's creation in the netns, so the helper's own time
 * is held out of the target's budget exactly as Deadline.hold() does on the socket route.
 */
async function probeInHelper(plan: TargetPlan, deadline: Deadline): Promise<ProberResult | undefined> {
  const [ip, ip2] = plan.ips;
  if (!plan.sockets.connectProbe || plan.netns === undefined || plan.ips.length > 2 || ip === undefined) return undefined;
  // A scoped IPv6 literal (fe80::1%eth0) needs Node's zone handling: the socket route.
  if (plan.ips.some((x) => x.includes('%'))) return undefined;
  if (deadline.signal.aborted) return undefined;
  const address = { ip, port: plan.port };
  // The child has the target's whole budget from the moment its socket exists; its own start gets
  // a slack on top (kubelet's timeout is for the target). No answer by then means the
  // child never got its socket in time (a hung open/setns, a stopped helper): our trouble, an
  // error, never a failure, as on the socket route. Only that or the caller aborting cancels it.
  const { childTimeoutMs: timeoutMs, slackMs, giveUpMs } = helperTcpTimes(deadline.remainingMs());
  const cancel = new AbortController();
  const onAbort = (): void => {
    if (deadline.why() === 'aborted') cancel.abort(new ConnectError('error', 'other', address, 'probe aborted'));
  };
  const slack = setTimeout(() => cancel.abort(new ConnectError('error', 'helper-error', address,
    `netns helper did not make the probe's socket within ${Math.round(slackMs)} ms (not counted against the probe's timeout)`)), giveUpMs);
  deadline.signal.addEventListener('abort', onAbort, { once: true });
  let outcome: TcpProbeOutcome | undefined;
  try {
    outcome = await plan.sockets.connectProbe(plan.netns, helperTarget(plan.ips.map((x) => ({ ip: x, port: plan.port })), timeoutMs), cancel.signal, plan.tenant);
  } catch (err) {
    const e = toConnectError(err, address);
    return { result: e.kind, reason: e.reason, message: e.dialText, address: joinHostPort(ip, plan.port), phases: {} };
  } finally {
    clearTimeout(slack);
    deadline.signal.removeEventListener('abort', onAbort);
  }
  if (!outcome) return undefined;
  const phases = { helper: outcome.helperSeconds, connect: outcome.connectSeconds };
  if (outcome.outcome === 'connected') {
    return { result: 'success', message: '', address: joinHostPort(outcome.won === 1 && ip2 !== undefined ? ip2 : ip, plan.port), phases };
  }
  const e = helperOutcomeError(outcome, address);
  return { result: e.kind, reason: e.reason, message: e.dialText, address: joinHostPort(ip, plan.port), phases };
}
