/**
 * What one tenant's blackholed connects cost another pod's netns helper requests, with the agent's
 * defaults (128 requests sent at once, a pool of 4 workers):
 *   - starvation: 256 blackholed connects of one namespace (4 pods x 64; past the helper's share,
 *     each takes the socket route as the probers do), then a neighbour pod's sockets, TCP probes and
 *     connections: how many are answered, and their latency;
 *   - pool tax: a neighbour's socket latency alone, then with 4 blackholed connects of one pod in
 *     flight, then with a pool of 2 whose both workers hang in connects of 2 pods.
 *
 *   node test/bench/helper-isolation.ts [--n 200] [--hold-ms 15000]
 * Root only (lab pods are the netns).
 */
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { ResidentHelper } from '../../agent/netns/helper.ts';
import type { TcpTarget } from '../../agent/probe/types.ts';
import { createLab, type LabPod } from '../lab/lab.ts';
import { quantile } from './stats.ts';

const { values: args } = parseArgs({ options: { n: { type: 'string', default: '200' }, 'hold-ms': { type: 'string', default: '15000' } } });
const N = Number(args.n);
const HOLD_MS = Number(args['hold-ms']);

const lab = await createLab({ pods: 2, policy: 'drop', tag: 'helper-isolation bench' });
const [hostile, neighbour] = lab.pods as [LabPod, LabPod];
try {
  const [srvHostile, srvNeighbour] = await Promise.all([lab.startServer(hostile, { http: 0 }), lab.startServer(neighbour, { http: 0 })]);
  const drop = await lab.exec(hostile, 'nft', ['-f', '-'], {
    input: `table inet bench_blackhole {\n  chain out {\n    type filter hook output priority 0;\n    ip daddr ${hostile.ipv4} tcp dport ${srvHostile.ports.http} drop\n  }\n}\n`,
  });
  if (drop.code !== 0) throw new Error(`nft: ${drop.stderr}`);
  const blackhole: TcpTarget = { family: 4, ip: hostile.ipv4, port: srvHostile.ports.http as number, timeoutMs: HOLD_MS };
  const healthy: TcpTarget = { family: 4, ip: neighbour.ipv4, port: srvNeighbour.ports.http as number, timeoutMs: 5000 };
  const defaults = { pool: 4, maxSent: 128, maxInFlight: 2048 + 512 + 64 };

  /** One blackholed connect as an HTTP probe makes it: in the helper, or past its share through a socket Node connects. */
  const hang = async (h: ResidentHelper, pod: number, netns = hostile.netns): Promise<void> => {
    const out = await h.connectSocket(netns, blackhole, undefined, { group: 'hostile', owner: `hostile-${pod}` }).catch(() => undefined);
    if (out !== undefined) {
      if (out.outcome === 'connected') out.socket.destroy();
      return;
    }
    const s = await h.createSocket(hostile.netns, 4).catch(() => undefined);
    if (!s) return;
    await new Promise<void>((resolve) => {
      const t = setTimeout(() => { s.destroy(); resolve(); }, HOLD_MS);
      s.once('error', () => { clearTimeout(t); resolve(); });
      s.connect({ host: blackhole.ip, port: blackhole.port });
    });
  };

  /** A socket from the helper, connected by Node: whether it connected within the target's timeout. */
  const connectBySocket = async (h: ResidentHelper, netns: string, t: TcpTarget): Promise<boolean> => {
    const s = await h.createSocket(netns, 4);
    return new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => { s.destroy(); resolve(false); }, t.timeoutMs);
      s.once('error', () => { clearTimeout(timer); resolve(false); });
      s.connect({ host: t.ip, port: t.port }, () => { clearTimeout(timer); s.destroy(); resolve(true); });
    });
  };

  /** `n` neighbour requests (sockets, TCP probes, connections): ms each, and how many got their real answer. */
  const neighbourWave = async (h: ResidentHelper, n: number, sequential: boolean, socketsOnly = false): Promise<{ ms: number[]; ok: number }> => {
    const ms: number[] = [];
    let ok = 0;
    const one = async (i: number): Promise<void> => {
      const t0 = performance.now();
      const tenant = { group: 'neighbour', owner: 'neighbour-0' };
      try {
        if (socketsOnly || i % 3 === 0) {
          const s = await h.createSocket(neighbour.netns, 4);
          ms.push(performance.now() - t0);
          s.destroy();
          ok++;
        } else {
          const out = i % 3 === 1
            ? await h.connectProbe(neighbour.netns, healthy, undefined, tenant)
            : await h.connectSocket(neighbour.netns, healthy, undefined, tenant).then((o) => {
              if (o?.outcome === 'connected') o.socket.destroy();
              return o;
            });
          // Past the pod's share: the socket route, as the probers take it.
          const connected = out === undefined ? await connectBySocket(h, neighbour.netns, healthy) : out.outcome === 'connected';
          ms.push(performance.now() - t0);
          if (connected) ok++;
        }
      } catch (err) {
        ms.push(performance.now() - t0);
        console.log(`  neighbour request ${i}: ${(err as Error).message}`);
      }
    };
    if (sequential) for (let i = 0; i < n; i++) await one(i);
    else await Promise.all(Array.from({ length: n }, (_, i) => one(i)));
    return { ms, ok };
  };
  const show = (what: string, r: { ms: number[]; ok: number }, n: number): void => {
    const s = [...r.ms].sort((x, y) => x - y);
    console.log(`${what}: ${r.ok}/${n} answered right; ms p50 ${quantile(s, 0.5).toFixed(2)} p90 ${quantile(s, 0.9).toFixed(2)} max ${(s.at(-1) ?? 0).toFixed(2)}`);
  };

  {
    const h = await ResidentHelper.start(defaults);
    try {
      show('pool tax, alone (sockets, sequential)', await neighbourWave(h, N, true, true), N);
      const held = Array.from({ length: 4 }, () => hang(h, 0));
      await new Promise((r) => setTimeout(r, 500));
      show('pool tax, 4 blackholed connects of one pod (sockets, sequential)', await neighbourWave(h, N, true, true), N);
      await Promise.all(held);
    } finally {
      await h.close();
    }
  }
  {
    // Two paths of the hostile netns are two pods to the helper: their connects hold both workers.
    const h = await ResidentHelper.start({ ...defaults, pool: 2 });
    try {
      const held = [hang(h, 0), hang(h, 1, `/proc/${srvHostile.pid}/ns/net`)];
      await new Promise((r) => setTimeout(r, 500));
      show('pool tax, pool of 2 held by blackholed connects of 2 pods (sockets, sequential)', await neighbourWave(h, N, true, true), N);
      await Promise.all(held);
    } finally {
      await h.close();
    }
  }
  {
    const h = await ResidentHelper.start(defaults);
    try {
      const held = Array.from({ length: 256 }, (_, i) => hang(h, i % 4));
      await new Promise((r) => setTimeout(r, 1000));
      show('starvation, 256 blackholed connects of one namespace (60 mixed, at once)', await neighbourWave(h, 60, false), 60);
      await Promise.all(held);
    } finally {
      await h.close();
    }
  }
} finally {
  await lab.destroy();
}
