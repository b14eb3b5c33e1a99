/**
 * One namespace's blackholed connects cannot starve another pod's netns helper requests. With the
 * agent's defaults (128 requests sent at once, a pool of 4 workers), one namespace starts 256
 * connects (TCP probes and HTTP/gRPC probes' connections, 4 pods x 64) to a target its pod drops;
 * past their shares of the send window (an eighth per pod, a quarter per namespace, half in all)
 * they take the socket route, as the probers do, and Node waits on them. A neighbour pod in
 * another namespace then asks for sockets, TCP probes and connections to its healthy server.
 *
 * The bound: every neighbour request is answered with its real outcome (a socket that connects to
 * its server, a TCP probe "connected", a connection that is open), before its own request
 * timeout (5 s) and before any of the hostile connects has ended; the hostile namespace holds at
 * most its quarter of the window in the helper. On main's code every neighbour request failed
 * "netns helper is busy (128 requests in flight, limit 128)".
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft']);

import { readdirSync, readlinkSync, statSync } from 'node:fs';
import type { Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ResidentHelper } from '../../agent/netns/helper.ts';
import type { TcpTarget } from '../../agent/probe/types.ts';
import { childrenOf } from '../bench/procstat.ts';
import { createLab, type Lab, type LabPod, type RunningServer } from '../lab/lab.ts';
import { waitFor } from '../support/proc-wait.ts';

let lab: Lab;
let hostile: LabPod;
let neighbour: LabPod;
let srvHostile: RunningServer;
let srvNeighbour: RunningServer;

beforeAll(async () => {
  lab = await createLab({ pods: 2, policy: 'drop', tag: 'helper-tenants.test' });
  [hostile, neighbour] = lab.pods as [LabPod, LabPod];
  [srvHostile, srvNeighbour] = await Promise.all([lab.startServer(hostile, { http: 0 }), lab.startServer(neighbour, { http: 0 })]);
  // The hostile pod drops its own SYNs to its server: every connect there waits its whole timeout.
  const drop = await lab.exec(hostile, 'nft', ['-f', '-'], {
    input: `table inet tenants_blackhole {\n  chain out {\n    type filter hook output priority 0;\n    ip daddr ${hostile.ipv4} tcp dport ${srvHostile.ports.http} drop\n  }\n}\n`,
  });
  expect(drop.code).toBe(0);
});

afterAll(async () => {
  await lab?.destroy();
});

/**
 * A socket from the helper, connected by Node, as a prober past its helper share connects: whether
 * it connected within `t`'s timeout (false at once when `stop` aborts).
 */
async function connectBySocket(h: ResidentHelper, netns: string, t: TcpTarget, stop?: AbortSignal): Promise<boolean> {
  const s: Socket = await h.createSocket(netns, 4);
  return new Promise<boolean>((resolve) => {
    const end = (ok: boolean): void => {
      clearTimeout(timer);
      stop?.removeEventListener('abort', onStop);
      s.destroy();
      resolve(ok);
    };
    const onStop = (): void => end(false);
    const timer = setTimeout(() => end(false), t.timeoutMs);
    stop?.addEventListener('abort', onStop, { once: true });
    s.once('error', () => end(false));
    s.connect({ host: t.ip, port: t.port }, () => end(true));
  });
}

describe('helper shares per namespace and pod', () => {
  it('256 blackholed connects of one namespace: every request of a neighbour is answered with its real outcome, within its own timeout', async () => {
    const h = await ResidentHelper.start({ pool: 4, maxSent: 128, maxInFlight: 2048 + 512 + 64 });
    // Long enough that they all still hang when the neighbour is done, however loaded the machine.
    const HOLD_MS = 60_000;
    const blackhole: TcpTarget = { family: 4, ip: hostile.ipv4, port: srvHostile.ports.http as number, timeoutMs: HOLD_MS };
    const healthy: TcpTarget = { family: 4, ip: neighbour.ipv4, port: srvNeighbour.ports.http as number, timeoutMs: 5000 };
    let hostileEnded = 0;
    let inHelper = 0;
    const stop = new AbortController();
    const hung: Promise<unknown>[] = [];
    try {
      for (let i = 0; i < 256; i++) {
        const tenant = { group: 'hostile', owner: `hostile-pod-${i % 4}` };
        const asked = i % 2 ? h.connectProbe(hostile.netns, blackhole, undefined, tenant) : h.connectSocket(hostile.netns, blackhole, undefined, tenant);
        hung.push(asked.then(async (out) => {
          if (out === undefined) return connectBySocket(h, hostile.netns, blackhole, stop.signal);
          inHelper++;
          if (out.outcome === 'connected' && 'socket' in out) (out.socket as Socket).destroy();
          return out.outcome;
        }).finally(() => hostileEnded++).catch((e: Error) => e.message));
      }
      // Until the hostile connects in the helper are all in their pod's netns, and Node holds the others.
      const helperPid = h.stats().pid as number;
      const hostileNs = `net:[${statSync(hostile.netns).ino}]`;
      const inHostile = (): number => childrenOf(helperPid).filter((c) => { try { return readlinkSync(`/proc/${c}/ns/net`) === hostileNs; } catch { return false; } }).length;
      expect(await waitFor(() => inHostile() >= 32, 30_000), `hostile connects in the helper: ${inHostile()}`).toBe(true);

      const started = Date.now();
      const tenant = { group: 'neighbour', owner: 'neighbour-pod' };
      const answers = await Promise.all(Array.from({ length: 60 }, async (_, i) => {
        try {
          if (i % 3 === 0) {
            // A socket made in the neighbour's netns: it reaches its server.
            const s = await h.createSocket(neighbour.netns, 4);
            return await new Promise<string>((resolve) => {
              s.once('error', (e) => resolve(`socket: ${e.message}`));
              s.connect({ host: healthy.ip, port: healthy.port }, () => { s.destroy(); resolve('connected'); });
            });
          }
          const out = i % 3 === 1
            ? await h.connectProbe(neighbour.netns, healthy, undefined, tenant)
            : await h.connectSocket(neighbour.netns, healthy, undefined, tenant);
          if (out?.outcome === 'connected' && 'socket' in out) (out.socket as Socket).destroy();
          // Past the pod's own share: the socket route.
          if (out === undefined) return (await connectBySocket(h, neighbour.netns, healthy)) ? 'connected' : 'socket route failed';
          return out.outcome;
        } catch (err) {
          return (err as Error).message;
        }
      }));
      const tookMs = Date.now() - started;
      expect(answers.filter((a) => a !== 'connected'), `neighbour answers (${tookMs} ms)`).toEqual([]);
      // Within their own timeout (5 s each, the helper's request bound), while the hostile connects still hang.
      expect(hostileEnded).toBe(0);
      expect(h.stats().failures).toBe(0);
      // The hostile namespace's connects in the helper: its quarter of the send window, the rest in Node.
      expect(await waitFor(() => inHostile() <= 32, 10_000), `hostile connects in the helper: ${inHostile()}`).toBe(true);
      expect(inHelper).toBe(0);
    } finally {
      stop.abort();
      await h.close();
      await Promise.all(hung);
    }
  }, 120_000);

  it('a pod holds at most a quarter of the pool\'s workers: its other connects take children, the other workers serve everyone else', async () => {
    const h = await ResidentHelper.start({ pool: 4 });
    const blackhole: TcpTarget = { family: 4, ip: hostile.ipv4, port: srvHostile.ports.http as number, timeoutMs: 60_000 };
    const hung = Array.from({ length: 4 }, () => h.connectProbe(hostile.netns, blackhole, undefined, { group: 'hostile', owner: 'hostile-pod' }).catch((e: Error) => e));
    try {
      const helperPid = h.stats().pid as number;
      const home = readlinkSync('/proc/self/ns/net');
      const hostileNs = `net:[${statSync(hostile.netns).ino}]`;
      const netnsOf = (pid: number): string | undefined => { try { return readlinkSync(`/proc/${pid}/ns/net`); } catch { return undefined; } };
      // A worker keeps its home netns open; a per-request child holds nothing but stdio, the channel and its work.
      const isWorker = (pid: number): boolean => {
        try {
          return readdirSync(`/proc/${pid}/fd`).some((fd) => readlinkSync(`/proc/${pid}/fd/${fd}`) === home);
        } catch {
          return false;
        }
      };
      expect(await waitFor(() => childrenOf(helperPid).filter((c) => netnsOf(c) === hostileNs).length === 4, 30_000)).toBe(true);
      const inHostile = childrenOf(helperPid).filter((c) => netnsOf(c) === hostileNs);
      expect(inHostile.filter(isWorker), 'workers in the hostile pod').toHaveLength(1);
      // Everyone else still has workers: sockets and TCP probes of the neighbour, all answered.
      for (let i = 0; i < 20; i++) {
        const s = await h.createSocket(neighbour.netns, i % 2 ? 4 : 6);
        s.destroy();
        expect(await h.connectProbe(neighbour.netns, { family: 4, ip: neighbour.ipv4, port: srvNeighbour.ports.http as number, timeoutMs: 5000 }))
          .toMatchObject({ outcome: 'connected' });
      }
      const workers = childrenOf(helperPid).filter(isWorker);
      expect(workers.filter((w) => netnsOf(w) === hostileNs)).toHaveLength(1);
      expect(workers.length).toBeGreaterThan(1);
      expect(h.stats()).toMatchObject({ failures: 0, workersLost: 0 });
    } finally {
      await h.close();
      await Promise.all(hung);
    }
  }, 120_000);
});
