/**
 * A CRI "not found" ends the netns resolver chain for a pod the runtime has run: during the pod
 * list's poll lag a deleted pod is still probed, and the address resolver would find whichever
 * netns now holds the IP the stale pod list gives it: another pod's. Real containerd (two real
 * sandboxes on the lab's CNI bridge), the real CRI and address resolvers, the resident helper.
 *
 * The IP reuse is staged without waiting for CNI to hand an address out again: the deleted pod's
 * stale record carries the IPs that the other, live sandbox holds, which is what the agent sees
 * when the new pod got the old pod's address.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'containerd', 'ctr', 'gcc', 'tar']);

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AddressResolver } from '../../agent/netns/address-resolver.ts';
import { CriClient } from '../../agent/netns/cri-client.ts';
import { CriResolver } from '../../agent/netns/cri-resolver.ts';
import { ResidentHelper } from '../../agent/netns/helper.ts';
import { NetnsPathChecker } from '../../agent/netns/netns-path.ts';
import { NetnsResolverChain, outcomeOf, type PodRef } from '../../agent/netns/resolver.ts';
import { createContainerdLab, type ContainerdLab, type LabSandbox } from '../lab/containerd.ts';

let ctrd: ContainerdLab;
let client: CriClient;
let helper: ResidentHelper;
let deleted: LabSandbox;
let reuser: LabSandbox;

beforeAll(async () => {
  ctrd = await createContainerdLab();
  client = new CriClient(ctrd.endpoint);
  helper = await ResidentHelper.start({ allowDirs: [ctrd.netnsDir] });
  [deleted, reuser] = await Promise.all([ctrd.runSandbox({ name: 'deleted' }), ctrd.runSandbox({ name: 'reuser' })]);
}, 120_000);

afterAll(async () => {
  await helper?.close();
  client?.close();
  await ctrd?.destroy();
});

function chain(): NetnsResolverChain {
  const checker = new NetnsPathChecker({ extraDirs: [ctrd.netnsDir] });
  return new NetnsResolverChain([
    new CriResolver({ client, pathChecker: checker }),
    new AddressResolver({ addresses: helper, dirs: [ctrd.netnsDir], pathChecker: checker, missReuseMs: 0, hitReuseMs: 0, checkNodeAddresses: false }),
  ], { cacheTtlMs: 0 });
}

describe('a pod the runtime no longer runs', () => {
  it('is not found, and never resolved by address to the pod that holds its IP now', async () => {
    const c = chain();
    const stale: PodRef = { uid: deleted.uid, namespace: 'lab', name: 'deleted', podIPs: deleted.ips };
    const first = await c.resolve(stale);
    expect(first).toMatchObject({ resolver: 'cri', path: deleted.netnsPath });
    await ctrd.stopSandbox(deleted.id);
    await ctrd.removeSandbox(deleted.id);
    // The pod list has not caught up; the deleted pod's IP now belongs to the other pod.
    const reused: PodRef = { ...stale, podIPs: reuser.ips };
    const err = await c.resolve(reused).then((r) => new Error(`resolved to ${JSON.stringify(r)}`), (e: unknown) => e as Error);
    expect(outcomeOf(err)).toBe('not-found');
    expect(err.message).toMatch(/the runtime no longer has a READY sandbox for it .*not falling back to the other resolvers/);
  });

  it('a pod the runtime never ran still falls back to the address resolver (another runtime, a static netns)', async () => {
    const c = chain();
    const unknown: PodRef = { uid: '0f0e0d0c-0b0a-4909-8807-060504030201', namespace: 'lab', name: 'elsewhere', podIPs: reuser.ips };
    expect(await c.resolve(unknown)).toMatchObject({ resolver: 'address', path: reuser.netnsPath });
  });
});
