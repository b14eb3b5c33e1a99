/**
 * The helper pool (ResidentHelper `pool`, `--pool N`): long-lived workers serve one request at a
 * time and go home after each; a request finding every worker busy gets a child of its own. Real
 * kernel netns, real stalls: a worker waiting on a blackholed connect or stopped inside a pod's
 * netns costs only its own request, is killed past that request's deadline and replaced; a worker
 * killed mid-request costs only that request; no pod's netns fd or socket stays in a worker. The
 * agent (`probe-agent run`) runs its helper with the pool by default and counts a lost worker.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft']);

import { readdirSync, readlinkSync, readFileSync, statSync } from 'node:fs';
import type { Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ResidentHelper } from '../../agent/netns/helper.ts';
import { startAgent } from '../support/agent-harness.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { makePod } from '../support/pod-factory.ts';
import { childrenOf } from '../bench/procstat.ts';
import { createLab, type Lab, type LabPod, type RunningServer } from '../lab/lab.ts';
import { processState, waitFor } from '../support/proc-wait.ts';

const alive = (pid: number): boolean => { const s = processState(pid); return s !== undefined && s !== 'Z'; };

let lab: Lab;
let a: LabPod;
let b: LabPod;
let hostile: LabPod;
let srvA: RunningServer;
let srvB: RunningServer;
let srvHostile: RunningServer;

beforeAll(async () => {
  lab = await createLab({ pods: 3, policy: 'drop', tag: 'helper-pool.test' });
  [a, b, hostile] = lab.pods as [LabPod, LabPod, LabPod];
  [srvA, srvB, srvHostile] = await Promise.all([
    lab.startServer(a, { http: 0 }),
    lab.startServer(b, { http: 0 }),
    lab.startServer(hostile, { http: 0 }),
  ]);
  // The hostile pod drops its own SYNs to its server: a connect there waits its whole timeout.
  const drop = await lab.exec(hostile, 'nft', ['-f', '-'], {
    input: `table inet pool_blackhole {\n  chain out {\n    type filter hook output priority 0;\n    ip daddr ${hostile.ipv4} tcp dport ${srvHostile.ports.http} drop\n  }\n}\n`,
  });
  expect(drop.code).toBe(0);
});

afterAll(async () => {
  await lab?.destroy();
});

const netnsOf = (pid: number | 'self'): string => readlinkSync(`/proc/${pid}/ns/net`);
const netnsName = (path: string): string => `net:[${statSync(path).ino}]`;

/** The helper's workers: its children once nothing is in flight (per-request children are reaped within 20 ms). */
async function workersOf(h: ResidentHelper): Promise<number[]> {
  expect(await waitFor(() => h.stats().inFlight === 0, 10_000)).toBe(true);
  await new Promise((r) => setTimeout(r, 200));
  return childrenOf(h.stats().pid as number).sort((x, y) => x - y);
}

/** The source address a pod's server saw for a connection over `socket`, connected here to ip:port. */
function echoFrom(socket: Socket, ip: string, port: number): Promise<string> {
  const answer = echoOver(socket, false);
  socket.connect({ host: ip, port }, () => socket.write(ECHO_REQUEST));
  return answer;
}

const ECHO_REQUEST = 'GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n';

/** The source address a pod's server saw for `socket`; `send`: it is connected already, write the request now. */
function echoOver(socket: Socket, send = true): Promise<string> {
  const answer = new Promise<string>((resolve, reject) => {
    let data = '';
    const timer = setTimeout(() => { socket.destroy(); reject(new Error(`timeout talking to ${socket.remoteAddress ?? 'a pod'}`)); }, 20_000);
    socket.once('error', (e) => { clearTimeout(timer); reject(e); });
    socket.on('data', (d: Buffer) => { data += d.toString(); });
    socket.on('end', () => {
      clearTimeout(timer);
      socket.destroy();
      try {
        resolve((JSON.parse(data.slice(data.indexOf('\r\n\r\n') + 4)) as { remoteAddress: string }).remoteAddress.replace(/^::ffff:/, ''));
      } catch {
        reject(new Error(`not an echo answer: ${data.slice(0, 200)}`));
      }
    });
  });
  if (send) socket.write(ECHO_REQUEST);
  return answer;
}

/** One healthy probe's worth: a socket in `pod`'s netns that reaches its server from the pod's own address. */
async function healthy(h: ResidentHelper, pod: LabPod, srv: RunningServer, family: 4 | 6): Promise<boolean> {
  const ip = family === 4 ? pod.ipv4 : pod.ipv6;
  return (await echoFrom(await h.createSocket(pod.netns, family), ip, srv.ports.http as number)) === ip;
}

/** A wave of healthy requests for pods a and b (sockets, TCP probes and handed-over connections); the number that got their right answer. */
async function healthyWave(h: ResidentHelper, n: number): Promise<number> {
  const results = await Promise.all(Array.from({ length: n }, async (_, i) => {
    const [pod, srv] = i % 2 ? [a, srvA] : [b, srvB];
    if (i % 5 === 4) {
      const out = await h.connectProbe(pod.netns, { family: 4, ip: pod.ipv4, port: srv.ports.http as number, timeoutMs: 10_000 });
      return out?.outcome === 'connected';
    }
    if (i % 5 === 3) {
      // An HTTP probe's connection, made in the pod by the helper: the pod's server sees the pod's own address.
      const out = await h.connectSocket(pod.netns, { family: 4, ip: pod.ipv4, port: srv.ports.http as number, timeoutMs: 10_000 });
      return out?.outcome === 'connected' && (await echoOver(out.socket)) === pod.ipv4;
    }
    return healthy(h, pod, srv, i % 4 < 2 ? 4 : 6);
  }));
  return results.filter(Boolean).length;
}

/**
 * Starts a blackholed connect in the hostile pod (a TCP probe, or with `op` 'connect' an HTTP or gRPC
 * probe's connection) and waits until a worker (not one of `others`) is inside its netns with it.
 */
async function stuckInHostile(h: ResidentHelper, others: number[], timeoutMs: number, op: 'tcp' | 'connect' = 'tcp'): Promise<{ pending: Promise<unknown>; worker: number }> {
  const target = { family: 4 as const, ip: hostile.ipv4, port: srvHostile.ports.http as number, timeoutMs };
  const pending = (op === 'tcp' ? h.connectProbe(hostile.netns, target) : h.connectSocket(hostile.netns, target))
    .then((v) => ({ value: v }), (e: Error) => ({ error: e }));
  const inside = netnsName(hostile.netns);
  let worker: number | undefined;
  const helperPid = h.stats().pid as number;
  const inHostile = (w: number): boolean => {
    try {
      return alive(w) && netnsOf(w) === inside;
    } catch {
      return false; // gone meanwhile
    }
  };
  expect(await waitFor(() => (worker = childrenOf(helperPid).find((w) => !others.includes(w) && inHostile(w))) !== undefined, 10_000)).toBe(true);
  return { pending, worker: worker as number };
}

describe('the helper pool', () => {
  it('takes pods in turn when requests wait for the helper: one pod\'s backlog does not hold another pod\'s request behind it', async () => {
    // Two requests at once in the helper, and a helper that answers nothing until it is continued:
    // the hostile pod's eight requests wait in the agent, then the victim's one.
    const h = await ResidentHelper.start({ pool: 2, maxSent: 2, maxInFlight: 64 });
    const helperPid = h.stats().pid as number;
    try {
      process.kill(helperPid, 'SIGSTOP');
      let noisyDone = 0;
      const noisy = Array.from({ length: 8 }, () => h.createSocket(hostile.netns, 4).then((s) => s.destroy()).finally(() => noisyDone++));
      const victim = h.createSocket(a.netns, 4).then((sock) => {
        sock.destroy();
        return noisyDone;
      });
      process.kill(helperPid, 'SIGCONT');
      // In arrival order the victim would wait for all eight; in turn, for the two sent and one more.
      expect(await victim).toBeLessThanOrEqual(3);
      await Promise.all(noisy);
      expect(noisyDone).toBe(8);
    } finally {
      process.kill(helperPid, 'SIGCONT');
      await h.close();
    }
  }, 60_000);

  it('serves requests for several pods from long-lived workers, each socket in its own pod', async () => {
    const h = await ResidentHelper.start({ pool: 2 });
    try {
      expect(h.mode).toBe('pool');
      const before = await workersOf(h);
      expect(before).toHaveLength(1); // the self-test's
      for (let i = 0; i < 20; i++) {
        const [pod, srv] = i % 2 ? [a, srvA] : [b, srvB];
        expect(await healthy(h, pod, srv, i % 4 < 2 ? 4 : 6), `request ${i}`).toBe(true);
      }
      // Long-lived: the self-test's worker is still there, and the pool never grew past its size.
      const after = await workersOf(h);
      expect(after).toContain(before[0]);
      expect(after.length).toBeLessThanOrEqual(2);
      expect(h.stats()).toMatchObject({ failures: 0, workersLost: 0 });
    } finally {
      await h.close();
    }
  }, 60_000);

  it('leaves no pod netns fd or socket in a worker, and each worker back in the node netns', async () => {
    const h = await ResidentHelper.start({ pool: 3 });
    try {
      // One worker held in the hostile pod's connect for 3 s, so that others must serve meanwhile
      // (however loaded the machine), and it too must come back clean.
      const held = await stuckInHostile(h, [], 3000);
      // Every op, both pods, successes and failures, concurrently.
      await Promise.all(Array.from({ length: 30 }, async (_, i) => {
        const [pod, srv] = i % 2 ? [a, srvA] : [b, srvB];
        if (i % 3 === 0) (await h.createSocket(pod.netns, i % 4 < 2 ? 4 : 6)).destroy();
        else if (i % 3 === 1) expect(await h.readAddresses(pod.netns)).toContain(pod.ipv4);
        else expect(await h.connectProbe(pod.netns, { family: 4, ip: pod.ipv4, port: srv.ports.http as number, timeoutMs: 5000 })).toMatchObject({ outcome: 'connected' });
      }));
      await expect(h.createSocket(`/run/netns/pa-missing-${process.pid}`, 4)).rejects.toMatchObject({ kind: 'gone' });
      expect(await held.pending).toMatchObject({ value: { outcome: 'timeout' } });
      const workers = await workersOf(h);
      expect(workers).toContain(held.worker);
      expect(workers.length).toBeGreaterThan(1);
      expect(workers.length).toBeLessThanOrEqual(3);
      const home = netnsOf('self');
      const fdsOf = (pid: number): string[] => readdirSync(`/proc/${pid}/fd`).map((fd) => readlinkSync(`/proc/${pid}/fd/${fd}`));
      const helperFds = new Set(fdsOf(h.stats().pid as number));
      for (const w of workers) {
        expect(netnsOf(w), `worker ${w}`).toBe(home);
        const fds = fdsOf(w);
        // stdin and stdout (/dev/null), stderr and the channel (the helper's own), its control socket, its home netns.
        expect(fds.filter((l) => l.startsWith('socket:') && !helperFds.has(l)), `worker ${w}: ${fds.join(' ')}`).toHaveLength(1);
        expect(fds.filter((l) => l.startsWith('net:')), `worker ${w}`).toEqual([home]);
        expect(fds.length, `worker ${w}: ${fds.join(' ')}`).toBe(6);
      }
    } finally {
      await h.close();
    }
  }, 60_000);

  it.each([['tcp'], ['connect']] as const)('a worker waiting on a blackholed connect (op %s) costs only its own request: every other pod keeps every answer', async (op) => {
    const h = await ResidentHelper.start({ pool: 2 });
    try {
      // The first worker hangs in the hostile pod for the probe's whole timeout; the pod holds its
      // share of the pool (one of two workers), so its next probe hangs there in a child.
      const first = await stuckInHostile(h, [], 30_000, op);
      const second = await stuckInHostile(h, [first.worker], 30_000, op);
      expect(second.worker).not.toBe(first.worker);
      let hung = 0;
      for (const p of [first.pending, second.pending]) void p.then(() => hung++);
      expect(await healthyWave(h, 60)).toBe(60);
      // The healthy wave did not wait for the hung probes: they are still in their connect.
      expect(hung).toBe(0);
      expect([first.worker, second.worker].every((w) => netnsOf(w) === netnsName(hostile.netns))).toBe(true);
      expect(h.stats()).toMatchObject({ failures: 0, workersLost: 0 });
    } finally {
      await h.close();
    }
  }, 90_000);

  it('a worker stuck past its request\'s deadline is killed, only that request fails, and the pool refills', async () => {
    const lost: string[] = [];
    const h = await ResidentHelper.start({ pool: 1, onWorkerLost: (why) => lost.push(why) });
    try {
      const [worker] = await workersOf(h);
      // Inside the hostile pod, then frozen: it will answer nothing, not even the connect's timeout.
      const stuck = await stuckInHostile(h, [], 1000);
      expect(stuck.worker).toBe(worker);
      process.kill(stuck.worker, 'SIGSTOP');
      expect(await healthyWave(h, 40)).toBe(40);
      // --child-timeout-ms (2000) plus the probe's own 1000 ms.
      const out = await stuck.pending as { error?: Error };
      expect(out.error?.message).toMatch(/\(child\): worker killed after 3000 ms$/);
      expect(await waitFor(() => !alive(stuck.worker) && lost.length > 0, 5000)).toBe(true);
      expect(lost).toEqual(['timeout']);
      expect(h.stats()).toMatchObject({ failures: 1, workersLost: 1, restarts: 0 });
      // The next request starts a new worker.
      expect(await healthy(h, a, srvA, 6)).toBe(true);
      const [next] = await workersOf(h);
      expect(next).toBeDefined();
      expect(next).not.toBe(stuck.worker);
    } finally {
      await h.close();
    }
  }, 90_000);

  it('a worker killed mid-request costs only that request; the pool refills', async () => {
    const lost: string[] = [];
    const h = await ResidentHelper.start({ pool: 1, onWorkerLost: (why) => lost.push(why) });
    try {
      const [worker] = await workersOf(h);
      const stuck = await stuckInHostile(h, [], 30_000);
      expect(stuck.worker).toBe(worker);
      const wave = healthyWave(h, 20);
      process.kill(stuck.worker, 'SIGKILL');
      const out = await stuck.pending as { error?: Error };
      expect(out.error?.message).toMatch(/\(child\): worker killed by signal 9$/);
      expect(await wave).toBe(20);
      expect(await waitFor(() => lost.length > 0, 5000)).toBe(true);
      expect(lost).toEqual(['crash']);
      expect(h.stats()).toMatchObject({ failures: 1, workersLost: 1, restarts: 0 });
      expect(await healthy(h, b, srvB, 4)).toBe(true);
      const [next] = await workersOf(h);
      expect(next).toBeDefined();
      expect(next).not.toBe(stuck.worker);
      // An idle worker that dies is replaced too, and costs no request at all.
      process.kill(next as number, 'SIGKILL');
      expect(await waitFor(() => !alive(next as number), 5000)).toBe(true);
      expect(await healthy(h, a, srvA, 4)).toBe(true);
      expect(await waitFor(() => lost.length === 2, 5000)).toBe(true);
      expect(lost).toEqual(['crash', 'crash']);
      expect(h.stats().failures).toBe(1);
    } finally {
      await h.close();
    }
  }, 90_000);
});

describe('the agent with its defaults', () => {
  it('runs the helper with a pool of 4; a killed worker shows in its metrics and probes go on', async () => {
    const kubelet = await FakeKubelet.start({ pods: [makePod({ name: 'p', namespace: 'pool', ips: a.ips, port: srvA.ports.http as number, probe: 'tcp' })] });
    const agent = await startAgent({
      kubeletUrl: kubelet.httpUrl,
      pollInterval: '300ms',
      expectedLogs: [{ level: 'warn', msg: 'netns helper replaced a pool worker', why: 'a worker is killed on purpose' }],
    });
    try {
      await agent.waitForStatuses((l) => l.length > 0 && l.every((x) => x.lastProbeTime > 0), 30_000);
      const helper = childrenOf(agent.pid).find((c) => readFileSync(`/proc/${c}/cmdline`, 'utf8').split('\0').includes('--resident'));
      expect(helper).toBeDefined();
      const argv = readFileSync(`/proc/${helper}/cmdline`, 'utf8').split('\0');
      expect(argv.slice(argv.indexOf('--pool'), argv.indexOf('--pool') + 2)).toEqual(['--pool', '4']);
      const on = async (): Promise<{ result: string }> => agent.client.probe({ pod: { namespace: 'pool', name: 'p' }, handler: { kind: 'tcp', port: srvA.ports.http as number }, timeoutSeconds: 5 });
      expect(await on()).toMatchObject({ result: 'success' });
      // Idle between probes: killing it costs no request; the next one is served by a new worker.
      const [worker] = childrenOf(helper as number);
      expect(worker).toBeDefined();
      process.kill(worker as number, 'SIGKILL');
      expect(await waitFor(() => !alive(worker as number), 5000)).toBe(true);
      expect(await on()).toMatchObject({ result: 'success' });
      let body = '';
      expect(await waitFor(() => {
        void agent.http('/metrics').then((r) => (body = r.body));
        return /^probe_agent_helper_workers_lost_total\{reason="crash"\} 1$/m.test(body);
      }, 10_000), 'probe_agent_helper_workers_lost_total{reason="crash"} 1').toBe(true);
      expect(body).toMatch(/^probe_agent_helper_spawns_total\{mode="pool",result="success"\} [1-9]/m);
      expect(body).toMatch(/^probe_agent_helper_restarts_total(\{[^}]*\})? 0$/m);
    } finally {
      await agent.stop();
      await kubelet.stop();
    }
  }, 90_000);
});
