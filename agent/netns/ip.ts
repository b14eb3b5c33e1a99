/** One spelling per IP address, so addresses from kubelet, netlink and getifaddrs compare equal. */
import { isIP } from 'node:net';

/** One spelling per address: IPv6 compressed lower-case, IPv4 dotted quad; undefined if not an IP. */
export function canonicalIp(ip: string): string | undefined {
  if (typeof ip !== 'string' || ip.length > 64) return undefined;
  const v = isIP(ip);
  if (v === 4) return ip.split('.').map(Number).join('.');
  if (v === 6) {
    try {
      return new URL(`http://[${ip}]/`).hostname.slice(1, -1);
    } catch {
      return undefined;
    }
  }
  return undefined;
}
