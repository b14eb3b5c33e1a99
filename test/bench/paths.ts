/**
 * The five paths of the side-by-side bench and how each one runs a probe of the mix: the agent's
 * own runProbe() with the path's SocketFactory for (a)-(d), a /probe request for (e).
 */
import http from 'node:http';
import { ResidentHelper } from '../../agent/netns/helper.ts';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { SpawnHelper } from '../../agent/netns/spawn-helper.ts';
import { runProbe } from '../../agent/probe/run.ts';
import type { ProbeContext, SocketFactory } from '../../agent/probe/types.ts';
import type { Variant } from './mix.ts';

/** The five paths, by the letters the issue uses. */
export type PathName = 'resident' | 'warm' | 'spawn' | 'node' | 'blackbox';
/** In the order a, b, c, d, e: the order of every round. */
export const PATHS: readonly PathName[] = ['resident', 'warm', 'spawn', 'node', 'blackbox'];
/** The letter for each path. */
export const PATH_LETTER: Record<PathName, string> = { resident: 'a', warm: 'b', spawn: 'c', node: 'd', blackbox: 'e' };

/** A pod the mix targets. */
export interface BenchPod {
  netns: string;
  ipv4: string;
  ipv6: string;
}

/** One path's way of running a probe of the mix. */
export interface Prober {
  probe(v: Variant, pod: BenchPod): Promise<'success' | 'failure' | 'error'>;
  helperPid(): number | undefined;
  close(): Promise<void>;
}

/** Paths (a)-(d): the agent's runProbe() with the path's SocketFactory. */
export async function agentProber(path: Exclude<PathName, 'blackbox'>, timeoutSeconds: number): Promise<Prober & { helper?: ResidentHelper }> {
  let sockets: SocketFactory;
  let helper: ResidentHelper | undefined;
  if (path === 'resident' || path === 'warm') {
    helper = await ResidentHelper.start({ warm: path === 'warm', maxInFlight: 512 });
    sockets = helper;
  } else if (path === 'spawn') {
    sockets = await SpawnHelper.create();
  } else {
    sockets = new NodeSocketFactory();
  }
  const nodeSockets = new NodeSocketFactory();
  return {
    helper,
    async probe(v, pod) {
      const ctx: ProbeContext = {
        // Path (d) is kubelet's: the node's own netns, straight to the pod IP.
        netns: path === 'node' ? undefined : pod.netns,
        podIPs: [pod.ipv4, pod.ipv6],
        timeoutSeconds,
        sockets,
        nodeSockets,
        kubeVersion: '1.34',
        hostFieldPolicy: 'refuse',
        happyEyeballs: true,
      };
      const out = await runProbe(v.handler, ctx);
      return out.result === 'warning' ? 'success' : out.result;
    },
    helperPid: () => helper?.stats().pid,
    close: async () => helper?.close(),
  };
}

/** Path (e): a /probe request to the exporter, success read from its probe_success. */
export function blackboxProber(url: string, pid: number, concurrency: number): Prober {
  const agent = new http.Agent({ keepAlive: true, maxSockets: concurrency });
  return {
    probe(v, pod) {
      const q = `/probe?module=${v.module}&target=${encodeURIComponent(v.target(pod.ipv4))}`;
      return new Promise((resolve) => {
        const req = http.get(`${url}${q}`, { agent }, (res) => {
          let body = '';
          res.setEncoding('utf8');
          res.on('data', (d: string) => { body += d; });
          res.on('end', () => {
            const m = /^probe_success (\d)/m.exec(body);
            resolve(res.statusCode !== 200 || !m ? 'error' : m[1] === '1' ? 'success' : 'failure');
          });
        });
        req.setTimeout(10_000, () => req.destroy(new Error('blackbox /probe timed out')));
        req.on('error', () => resolve('error'));
      });
    },
    helperPid: () => pid,
    close: async () => agent.destroy(),
  };
}
