/**
 * The lease controller's bounds and clock (agent/gates/lease-controller.ts) with the real ApiWriter
 * against the API server stand-in (a real kube-apiserver cannot run in CI): expiry is judged from
 * when this process saw a renewal, writes per poll are capped and the rest wait for the next poll,
 * a swept node is not listed again until its Lease is renewed and expires anew, and a failed read
 * is said and retried; after its own polls failed every Lease's clock restarts; a Lease not named
 * for its holder is ignored; with two replicas only the leader writes. The clock is a plain number
 * the test advances (lease time is all it reads).
 */
import { afterEach, describe, expect, it } from 'vitest';
import { ApiWriter } from '../../agent/gates/api-writer.ts';
import { LeaderElector, LEADER_LEASE_NAME } from '../../agent/gates/leader.ts';
import { LeaseController } from '../../agent/gates/lease-controller.ts';
import { createLogger, silentLogger } from '../../agent/log.ts';
import { GATES_CONDITION } from '../../agent/rewrite/gates-rewrite.ts';
import { startApiServerStandIn, type ApiServerStandIn } from '../support/api-server-standin.ts';

type Obj = Record<string, any>;

let cleanup: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  for (const c of cleanup.reverse()) await c();
  cleanup = [];
});

function gatedPod(name: string, node: string): Obj {
  return {
    metadata: { name, namespace: 'shop', uid: `uid-${name}` },
    spec: { nodeName: node, readinessGates: [{ conditionType: GATES_CONDITION }] },
    status: { conditions: [{ type: GATES_CONDITION, status: 'True' }] },
  };
}

function lease(api: ApiServerStandIn, node: string, renewTime: string): void {
  api.leases.set(`probe-agent/probe-agent-${node}`, { metadata: { name: `probe-agent-${node}`, namespace: 'probe-agent' }, spec: { holderIdentity: node, leaseDurationSeconds: 10, renewTime } });
}

async function rig(o: { api?: ApiServerStandIn; clock?: { t: number }; leader?: LeaderElector; lines?: string[] } = {}) {
  const api = o.api ?? await startApiServerStandIn();
  if (!o.api) cleanup.push(() => api.close());
  const writer = new ApiWriter({ url: api.url, nodeName: 'probe-agent-webhook', conditionType: GATES_CONDITION });
  cleanup.push(() => writer.close());
  const clock = o.clock ?? { t: 1_000_000 };
  const ops: string[] = [];
  const log = o.lines ? createLogger({ level: 'info', write: (l) => o.lines!.push(l) }) : silentLogger;
  const controller = new LeaseController({
    api: writer, namespace: 'probe-agent', conditionType: GATES_CONDITION, intervalMs: 60_000, maxWritesPerPoll: 2, log,
    now: () => clock.t, onOp: (op, ok) => ops.push(`${op}:${ok}`), ...(o.leader ? { leader: o.leader } : {}),
  });
  return { api, controller, clock, ops, writer };
}

const writes = (api: ApiServerStandIn) => api.requests.filter((r) => r.method === 'PATCH' && r.url.endsWith('/status')).length;
const podLists = (api: ApiServerStandIn) => api.requests.filter((r) => r.method === 'GET' && r.url.startsWith('/api/v1/pods')).length;

describe('gates lease controller', () => {
  it('waits a whole duration from the last renewal it saw, then writes at most the cap per poll', async () => {
    const { api, controller, clock } = await rig();
    for (let i = 0; i < 5; i++) api.pods.push(gatedPod(`p${i}`, 'node-a'));
    // A renewTime far in the past: its age on the node's clock counts for nothing.
    lease(api, 'node-a', '2000-01-01T00:00:00.000000Z');
    await controller.poll();
    clock.t += 9_000;
    await controller.poll();
    expect(writes(api)).toBe(0);
    clock.t += 2_000;
    await controller.poll();
    expect(writes(api)).toBe(2);
    await controller.poll();
    expect(writes(api)).toBe(4);
    await controller.poll();
    expect(writes(api)).toBe(5);
    expect(api.pods.every((p) => p.status.conditions[0].status === 'False' && p.status.conditions[0].reason === 'NodeLeaseExpired')).toBe(true);
    // Swept: not listed again.
    const lists = podLists(api);
    await controller.poll();
    expect(podLists(api)).toBe(lists);

    // Renewed (a new agent), the pods go True again (its writes); expired anew, swept anew.
    lease(api, 'node-a', '2000-01-01T00:00:05.000000Z');
    for (const p of api.pods) p.status.conditions[0].status = 'True';
    await controller.poll();
    expect(writes(api)).toBe(5);
    clock.t += 11_000;
    await controller.poll();
    expect(writes(api)).toBe(7);
  });

  it('a failed read is counted and retried at the next poll', async () => {
    const { api, controller, clock, ops } = await rig();
    api.pods.push(gatedPod('p0', 'node-a'));
    lease(api, 'node-a', 't0');
    await controller.poll();
    clock.t += 11_000;
    api.down = true;
    await controller.poll();
    expect(ops).toEqual(['poll:true', 'poll:false']);
    api.down = false;
    await controller.poll();
    expect(ops).toEqual(['poll:true', 'poll:false', 'poll:true', 'write:true']);
    expect(api.pods[0]!.status.conditions[0].status).toBe('False');
  });

  it('after its own polls failed, every Lease\'s clock restarts: an outage expires no one; a single failed poll restarts nothing', async () => {
    const { api, controller, clock } = await rig();
    for (const n of ['node-a', 'node-b', 'node-c']) {
      api.pods.push(gatedPod(`p-${n}`, n));
      lease(api, n, 't0');
    }
    await controller.poll();
    // The API server is down for longer than the Leases' duration: no agent could renew.
    api.down = true;
    for (let i = 0; i < 4; i++) {
      clock.t += 5_000;
      await controller.poll();
    }
    api.down = false;
    await controller.poll();
    expect(writes(api)).toBe(0);
    // The agents renew after the outage, but node-c's is gone: a whole duration later it alone expires.
    lease(api, 'node-a', 't1');
    lease(api, 'node-b', 't1');
    clock.t += 5_000;
    await controller.poll();
    expect(writes(api)).toBe(0);
    clock.t += 6_000;
    await controller.poll();
    expect(api.pods.map((p) => p.status.conditions[0].status)).toEqual(['True', 'True', 'False']);

    // One failed poll among good ones: node-b's clock is not restarted, it expires on time.
    clock.t += 5_000;
    api.down = true;
    await controller.poll();
    api.down = false;
    clock.t += 6_000;
    lease(api, 'node-a', 't2');
    await controller.poll();
    expect(api.pods.map((p) => p.status.conditions[0].status)).toEqual(['True', 'False', 'False']);
  });

  it('a Lease not named for its holder is ignored (counted and logged once): a forged one cannot keep another node alive', async () => {
    const lines: string[] = [];
    const { api, controller, clock, ops } = await rig({ lines });
    api.pods.push(gatedPod('p0', 'node-b'));
    lease(api, 'node-b', 't0');
    const forge = (t: string) => api.leases.set('probe-agent/probe-agent-x', { metadata: { name: 'probe-agent-x', namespace: 'probe-agent' }, spec: { holderIdentity: 'node-b', leaseDurationSeconds: 10, renewTime: t } });
    forge('f0');
    await controller.poll();
    // node-b's agent is gone; the forged Lease keeps being renewed.
    for (let i = 1; i <= 3; i++) {
      clock.t += 5_000;
      forge(`f${i}`);
      await controller.poll();
    }
    expect(api.pods[0]!.status.conditions[0]).toMatchObject({ status: 'False', reason: 'NodeLeaseExpired' });
    expect(ops.filter((o) => o.startsWith('ignored'))).toEqual(['ignored:true']);
    const said = lines.filter((l) => l.includes('node lease ignored')).map((l) => JSON.parse(l));
    expect(said).toMatchObject([{ level: 'warn', lease: 'probe-agent/probe-agent-x', holder: 'node-b', want: 'probe-agent-node-b' }]);
  });

  it('two replicas: one holds the leader Lease and writes; the other takes over only after it lapsed, and the first stopped before', async () => {
    const api = await startApiServerStandIn();
    cleanup.push(() => api.close());
    const clock = { t: 1_000_000 };
    const electors: LeaderElector[] = [];
    const rigs = [];
    for (const identity of ['webhook-a', 'webhook-b']) {
      const writer = new ApiWriter({ url: api.url, nodeName: 'probe-agent-webhook', conditionType: GATES_CONDITION });
      cleanup.push(() => writer.close());
      const leader = new LeaderElector({ api: writer, namespace: 'probe-agent', identity, durationMs: 15_000, requestTimeoutMs: 5_000, log: silentLogger, now: () => clock.t });
      electors.push(leader);
      rigs.push(await rig({ api, clock, leader }));
    }
    const [a, b] = electors as [LeaderElector, LeaderElector];
    // Both try at once: the create is refused to one of them (409).
    await Promise.all([a.tryOnce(), b.tryOnce()]);
    expect([a.isLeader(), b.isLeader()].filter(Boolean)).toHaveLength(1);
    const [first, second] = a.isLeader() ? [a, b] : [b, a];
    const [firstRig, secondRig] = a.isLeader() ? [rigs[0]!, rigs[1]!] : [rigs[1]!, rigs[0]!];
    expect(api.leases.get(`probe-agent/${LEADER_LEASE_NAME}`)!.spec.holderIdentity).toBe(first === a ? 'webhook-a' : 'webhook-b');

    api.pods.push(gatedPod('p0', 'node-a'), gatedPod('p1', 'node-a'), gatedPod('p2', 'node-a'));
    lease(api, 'node-a', 't0');
    await Promise.all([firstRig.controller.poll(), secondRig.controller.poll()]);
    clock.t += 5_000;
    await Promise.all([first.tryOnce(), second.tryOnce()]);
    clock.t += 6_000;
    // node-a expired: only the leader writes (its cap of 2 this poll).
    await Promise.all([firstRig.controller.poll(), secondRig.controller.poll()]);
    expect(firstRig.ops.filter((o) => o.startsWith('write'))).toEqual(['write:true', 'write:true']);
    expect(secondRig.ops.filter((o) => o.startsWith('write'))).toEqual([]);

    // The leader stops renewing (cut off, or gone). Its lead ends before the other could take the Lease.
    let lapsedAt: number | undefined;
    while (!second.isLeader()) {
      clock.t += 1_000;
      if (!first.isLeader()) lapsedAt ??= clock.t;
      await second.tryOnce();
      expect(clock.t).toBeLessThan(1_100_000);
    }
    expect(lapsedAt).toBeDefined();
    expect(lapsedAt!).toBeLessThan(clock.t);
    expect(first.isLeader()).toBe(false);
    expect(api.leases.get(`probe-agent/${LEADER_LEASE_NAME}`)!.spec).toMatchObject({ holderIdentity: second === a ? 'webhook-a' : 'webhook-b', leaseTransitions: 1 });
    // The new leader writes what is left; the old one writes nothing more.
    await Promise.all([firstRig.controller.poll(), secondRig.controller.poll()]);
    expect(firstRig.ops.filter((o) => o.startsWith('write'))).toHaveLength(2);
    expect(secondRig.ops.filter((o) => o.startsWith('write'))).toEqual(['write:true']);
    expect(api.pods.every((p) => p.status.conditions[0].status === 'False')).toBe(true);
    // The old leader's next try finds the Lease held: it stays a follower.
    await first.tryOnce();
    expect(first.isLeader()).toBe(false);
    // Released on close: the other replica takes it at its next try, without waiting out a duration.
    await second.release();
    expect(api.leases.get(`probe-agent/${LEADER_LEASE_NAME}`)!.spec.holderIdentity).toBe('');
    await first.tryOnce();
    expect(first.isLeader()).toBe(true);
  });

  it('a leader Lease RBAC refuses (older manifests): every replica acts, said once, instead of none', async () => {
    const api = await startApiServerStandIn();
    cleanup.push(() => api.close());
    api.forbid = (_method, p) => p.endsWith(`/leases/${LEADER_LEASE_NAME}`) || (_method === 'POST' && p.endsWith('/leases'));
    const writer = new ApiWriter({ url: api.url, nodeName: 'probe-agent-webhook', conditionType: GATES_CONDITION });
    cleanup.push(() => writer.close());
    const lines: string[] = [];
    const ops: boolean[] = [];
    const leader = new LeaderElector({ api: writer, namespace: 'probe-agent', identity: 'webhook-a', durationMs: 15_000, requestTimeoutMs: 5_000, log: createLogger({ level: 'info', write: (l) => lines.push(l) }), onOp: (ok) => ops.push(ok) });
    await leader.tryOnce();
    await leader.tryOnce();
    expect(leader.isLeader()).toBe(true);
    expect(ops).toEqual([false, false]);
    expect(lines.filter((l) => l.includes('"level":"warn"')).map((l) => JSON.parse(l).msg)).toEqual([expect.stringMatching(/^leader lease refused \(RBAC\)/)]);
    // Granted later: back to the election, holding the Lease.
    api.forbid = undefined;
    await leader.tryOnce();
    expect(leader.isLeader()).toBe(true);
    expect(api.leases.get(`probe-agent/${LEADER_LEASE_NAME}`)!.spec.holderIdentity).toBe('webhook-a');
  });
});
