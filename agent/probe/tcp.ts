/**
 * kubelet's TCP probe (pkg/probe/tcp/tcp.go): the handshake completing is success; the socket is
 * closed at once and no byte is sent.
 *
 * Difference from kubelet: its dialer sets SO_LINGER{on, 1s} to keep TIME-WAIT short (#89898); Node
 * cannot set SO_LINGER, so we close normally (FIN). The TIME-WAIT sockets this leaves live in the
 * pod's netns, whose ephemeral port space is the pod's own, so they do not add up on the node.
 */
import { ConnectError, connectTo, type Deadline, type ProberResult } from './connect.ts';
import { joinHostPort, type TargetPlan } from './target.ts';

/** Runs kubelet's TCP probe against `plan`; never throws. */
export async function probeTcp(plan: TargetPlan, deadline: Deadline): Promise<ProberResult> {
  const addresses = plan.ips.map((ip) => ({ ip, port: plan.port }));
  try {
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
