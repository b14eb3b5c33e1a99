/** The one parser of listen addresses (the metrics/health listener), used by the flags and the server. */
import { isIP } from 'node:net';
import { ConfigError } from '../errors.ts';

/** A parsed listen address; host '' means every interface, both families (as Go's ":port"). */
export interface ListenAddress {
  host: string;
  port: number;
}

/** Default metrics/health listener: loopback only, so nothing is open to pods by default. */
export const DEFAULT_METRICS_ADDRESS = '127.0.0.1:9809';

/**
 * Parses "host:port", "[v6]:port" or ":port" (every interface, an explicit operator choice). The
 * host is an IP literal or "localhost": a name that resolves to several addresses would bind one of
 * them by chance. `what` names the setting in the error (e.g. "--metrics-address").
 */
export function parseListenAddress(text: string, what = 'listen address'): ListenAddress {
  const m = /^(?:\[([0-9a-fA-F:.]+)\]|([^:[\]]*)):(\d{1,5})$/.exec(text.trim());
  const host = m?.[1] ?? m?.[2] ?? '';
  const port = Number(m?.[3]);
  const hostOk = m?.[1] !== undefined ? isIP(host) === 6 : host === '' || host === 'localhost' || isIP(host) === 4;
  if (!m || port > 65535 || !hostOk) {
    throw new ConfigError(`${what}: want host:port with an IP host, [ipv6]:port or :port (e.g. ${DEFAULT_METRICS_ADDRESS}), got "${text}"`, { address: text });
  }
  return { host, port };
}
