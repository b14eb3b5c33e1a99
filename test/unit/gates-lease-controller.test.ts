/**
 * The lease controller's bounds and clock (agent/gates/lease-controller.ts) with the real ApiWriter
 * against the API server stand-in (a real kube-apiserver cannot run in CI): expiry is judged from
 * when this process saw a renewal, writes per poll are capped and the rest wait for the next poll,
 * a swept node is not listed again until its Lease is renewed and expires anew, and a failed read
 * is said and retried. The clock is a plain number the test advances (lease time is all it reads).
 */
import { afterEach, describe, expect, it } from 'vitest';
import { ApiWriter } from '../../agent/gates/api-writer.ts';
import { LeaseController } from '../../agent/gates/lease-controller.ts';
import { silentLogger } from '../../agent/log.ts';
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

async function rig(): Promise<{ api: ApiServerStandIn; controller: LeaseController; clock: { t: number }; ops: string[] }> {
  const api = await startApiServerStandIn();
  cleanup.push(() => api.close());
  const writer = new ApiWriter({ url: api.url, nodeName: 'probe-agent-webhook', conditionType: GATES_CONDITION });
  cleanup.push(() => writer.close());
  const clock = { t: 1_000_000 };
  const ops: string[] = [];
  const controller = new LeaseController({
    api: writer, namespace: 'probe-agent', conditionType: GATES_CONDITION, intervalMs: 60_000, maxWritesPerPoll: 2, log: silentLogger,
    now: () => clock.t, onOp: (op, ok) => ops.push(`${op}:${ok}`),
  });
  return { api, controller, clock, ops };
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
});
