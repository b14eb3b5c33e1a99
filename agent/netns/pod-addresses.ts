/**
 * Reads a netns's own global addresses, for the one-shot CLI when --pod-ip is not given.
 * Spawning nsenter from Node is fine here (once per CLI run); the daemon never does this:
 * it takes pod IPs from kubelet's pod status.
 */
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { NetnsError, describeError } from '../errors.ts';

const run = promisify(execFile);

interface IpAddrJson {
  ifname?: string;
  addr_info?: { family?: string; local?: string; scope?: string }[];
}

/** Global-scope IPv4 then IPv6 addresses of the interfaces inside `netns`. */
export async function readNetnsAddresses(netns: string): Promise<string[]> {
  let stdout: string;
  try {
    ({ stdout } = await run('nsenter', [`--net=${netns}`, 'ip', '-j', 'addr', 'show', 'scope', 'global'], { timeout: 5000 }));
  } catch (err) {
    throw new NetnsError('enter', `cannot read addresses inside netns "${netns}": ${describeError(err)}`, { netns });
  }
  const links = JSON.parse(stdout) as IpAddrJson[];
  const v4: string[] = [];
  const v6: string[] = [];
  for (const link of links) {
    for (const a of link.addr_info ?? []) {
      if (!a.local) continue;
      (a.family === 'inet6' ? v6 : v4).push(a.local);
    }
  }
  return [...v4, ...v6];
}
