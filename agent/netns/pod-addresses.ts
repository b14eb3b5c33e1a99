/**
 * Reads a netns's own global addresses, for the one-shot CLI when --pod-ip is not given: through
 * the resident netns helper (one netlink dump inside the netns), never an `ip`/`nsenter` process.
 * The daemon takes pod IPs from kubelet's pod status instead.
 */
import { isIPv6 } from 'node:net';
import { NetnsError, describeError } from '../errors.ts';
import { ResidentHelper } from './helper.ts';

/** Global-scope IPv4 then IPv6 addresses of the interfaces inside `netns`; starts a helper when none is given. */
export async function readNetnsAddresses(netns: string, opts: { helper?: ResidentHelper; helperPath?: string } = {}): Promise<string[]> {
  const helper = opts.helper ?? await ResidentHelper.start(opts.helperPath ? { helperPath: opts.helperPath } : {});
  try {
    const addrs = await helper.readAddresses(netns, AbortSignal.timeout(5000));
    return [...addrs.filter((a) => !isIPv6(a)), ...addrs.filter((a) => isIPv6(a))];
  } catch (err) {
    if (err instanceof NetnsError) throw err;
    throw new NetnsError('enter', `cannot read addresses inside netns "${netns}": ${describeError(err)}`, { netns });
  } finally {
    if (!opts.helper) await helper.close();
  }
}
