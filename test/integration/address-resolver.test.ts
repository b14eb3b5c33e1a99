/**
 * The address resolver against lab netns (test/lab/lab.ts): it finds the one netns holding a pod's
 * IPs, refuses overlapping addresses as ambiguous, refuses node addresses (hostNetwork), and counts
 * one netns mounted under two names once. It only ever lists this lab's own netns (nameFilter).
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'nsenter', 'mount']);

import { execFileSync } from 'node:child_process';
import { rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { NetnsError, NetnsUnavailableError, UnsupportedPodError } from '../../agent/errors.ts';
import { AddressResolver, canonicalIp } from '../../agent/netns/address-resolver.ts';
import { ResidentHelper } from '../../agent/netns/helper.ts';
import { isSameNetns, NetnsPathChecker } from '../../agent/netns/netns-path.ts';
import { outcomeOf, type PodRef } from '../../agent/netns/resolver.ts';
import { createLab, type Lab, type LabPod } from '../lab/lab.ts';
import { labScratch } from '../lab/slots.ts';

let lab: Lab;
let resolver: AddressResolver;
let helper: ResidentHelper;
let scratch: string;
const bindMounts: string[] = [];

function ref(podIPs: string[]): PodRef {
  return { uid: '0b5e7c1a-1111-4222-8333-944455556666', namespace: 'lab', name: 'addr', podIPs };
}

async function rejection(p: Promise<unknown>): Promise<unknown> {
  try {
    await p;
  } catch (err) {
    return err;
  }
  throw new Error('expected a rejection');
}

function pod(i: number): LabPod {
  return lab.pods[i] as LabPod;
}

beforeAll(async () => {
  lab = await createLab({ pods: 3, policy: 'none', tag: 'address-resolver.test' });
  scratch = labScratch('addr-test-');
  // The helper reads each netns's addresses (netlink inside it); scratch holds a bind-mounted alias.
  helper = await ResidentHelper.start({ allowDirs: [scratch] });
  // hitReuseMs 0: every resolve lists afresh, so a duplicate added by a test is seen at once.
  resolver = new AddressResolver({ addresses: helper, hitReuseMs: 0, nameFilter: new RegExp(`^pa${lab.id}p\\d+$`) });
});

afterAll(async () => {
  for (const m of bindMounts) {
    try {
      execFileSync('umount', [m]);
    } catch {
      // already unmounted
    }
  }
  if (scratch) rmSync(scratch, { recursive: true, force: true });
  await helper?.close();
  await lab?.destroy();
});

describe('AddressResolver', () => {
  it('finds the netns holding both of a dual-stack pod\'s IPs', async () => {
    const p = pod(1);
    const t = performance.now();
    const res = await resolver.resolve(ref(p.ips));
    console.log(`address resolve over ${lab.pods.length} netns: ${(performance.now() - t).toFixed(1)} ms`);
    expect(res).toEqual({ resolver: 'address', path: p.netns, inode: statSync(p.netns).ino });
  });

  it('matches one address family alone, and non-canonical IPv6 spellings', async () => {
    const p = pod(2);
    expect((await resolver.resolve(ref([p.ipv4]))).path).toBe(p.netns);
    const expanded = p.ipv6.replace('::', ':0:0:0:').toUpperCase();
    expect(canonicalIp(expanded)).toBe(p.ipv6);
    expect((await resolver.resolve(ref([expanded]))).path).toBe(p.netns);
  });

  it('refuses an IP held by two netns as ambiguous, and resolves again once it is unique', async () => {
    const [a, b] = [pod(0), pod(1)];
    execFileSync('ip', ['-n', b.name, 'addr', 'add', `${a.ipv4}/32`, 'dev', 'lo']);
    try {
      const err = await rejection(resolver.resolve(ref(a.ips)));
      expect(err).toBeInstanceOf(NetnsUnavailableError);
      expect(outcomeOf(err)).toBe('ambiguous');
      expect((err as Error).message).toContain(a.netns);
      expect((err as Error).message).toContain(`${b.netns} (some)`);
      // The same duplicate also spoils a lookup by that IP alone.
      expect(outcomeOf(await rejection(resolver.resolve(ref([a.ipv4]))))).toBe('ambiguous');
    } finally {
      execFileSync('ip', ['-n', b.name, 'addr', 'del', `${a.ipv4}/32`, 'dev', 'lo']);
    }
    expect((await resolver.resolve(ref(a.ips))).path).toBe(a.netns);
  });

  it('lists every netns once per refresh: the pods resolved after it share the listing', async () => {
    const shared = new AddressResolver({ addresses: helper, nameFilter: new RegExp(`^pa${lab.id}p\\d+$`) });
    const before = helper.stats().spawned;
    for (const p of lab.pods) expect((await shared.resolve(ref(p.ips))).path).toBe(p.netns);
    // One helper request per netns for the first pod, none for the others (3 pods: 3, not 9).
    expect(helper.stats().spawned - before).toBe(lab.pods.length);
  });

  it('reports not-found for an IP no netns holds', async () => {
    const err = await rejection(resolver.resolve(ref([`10.250.${lab.id}.250`])));
    expect(outcomeOf(err)).toBe('not-found');
    expect((err as Error).message).toMatch(/no netns among 3 holds/);
  });

  it('reports a pod whose IP is a node address as unsupported (hostNetwork)', async () => {
    const err = await rejection(resolver.resolve(ref([lab.gatewayV4])));
    expect(err).toBeInstanceOf(UnsupportedPodError);
    expect((err as Error).message).toMatch(/node address/);
  });

  it('refuses a pod with a sandboxed runtimeClassName', async () => {
    const err = await rejection(resolver.resolve({ ...ref(pod(0).ips), runtimeClassName: 'kata-qemu' }));
    expect(err).toBeInstanceOf(UnsupportedPodError);
  });

  it('rejects malformed pod IPs and pods without IPs', async () => {
    expect(outcomeOf(await rejection(resolver.resolve(ref(['10.0.0.300']))))).toBe('invalid');
    expect(outcomeOf(await rejection(resolver.resolve(ref(['not-an-ip']))))).toBe('invalid');
    expect(outcomeOf(await rejection(resolver.resolve(ref([]))))).toBe('not-found');
  });

  it('counts one netns mounted under two names once, and reads netns outside /run/netns', async () => {
    const p = pod(2);
    const alias = path.join(scratch, 'alias');
    writeFileSync(alias, '');
    execFileSync('mount', ['--bind', p.netns, alias]);
    bindMounts.push(alias);
    const filter = new RegExp(`^(pa${lab.id}p\\d+|alias)$`);
    const both = new AddressResolver({ addresses: helper, dirs: ['/run/netns', scratch], nameFilter: filter });
    expect((await both.resolve(ref(p.ips))).path).toBe(p.netns);
    const extraOnly = new AddressResolver({
      addresses: helper,
      dirs: [scratch],
      nameFilter: filter,
      pathChecker: new NetnsPathChecker({ dirs: [scratch] }),
    });
    const res = await extraOnly.resolve(ref(p.ips));
    expect(res).toEqual({ resolver: 'address', path: alias, inode: statSync(p.netns).ino });
  });
});

describe('NetnsPathChecker on real netns files', () => {
  async function refusal(p: string, checker = new NetnsPathChecker()): Promise<NetnsError> {
    const err = await rejection(checker.check(p));
    expect(err).toBeInstanceOf(NetnsError);
    return err as NetnsError;
  }

  it('accepts a named netns and /proc/<pid>/ns/net, canonicalising /var/run to /run', async () => {
    const p = pod(0);
    const checker = new NetnsPathChecker();
    const viaVar = await checker.check(`/var/run/netns/${p.name}`);
    expect(viaVar).toMatchObject({ path: p.netns, inode: statSync(p.netns).ino });
    const self = await checker.check(`/proc/${process.pid}/ns/net`);
    expect(self.inode).toBe(statSync('/proc/self/ns/net').ino);
  });

  it('refuses paths outside the allowed places, "..", /proc/self and relative paths', async () => {
    for (const bad of ['/tmp/x', `/run/netns/../netns/${pod(0).name}`, '/proc/self/ns/net', 'run/netns/x', '/proc/1/ns/mnt']) {
      expect((await refusal(bad)).kind).toBe('invalid');
    }
  });

  it('refuses a symlink to a netns inside an allowed dir, and reports an unmounted file as gone', async () => {
    const dir = labScratch('path-test-');
    try {
      const checker = new NetnsPathChecker({ dirs: [dir] });
      symlinkSync(pod(1).netns, path.join(dir, 'link'));
      const link = await refusal(path.join(dir, 'link'), checker);
      expect(link.kind).toBe('invalid');
      expect(link.message).toMatch(/symlink/);
      writeFileSync(path.join(dir, 'plain'), '');
      const plain = await refusal(path.join(dir, 'plain'), checker);
      expect(plain.kind).toBe('gone');
      expect(plain.message).toMatch(/not a mounted namespace/);
      expect((await refusal(path.join(dir, 'missing'), checker)).kind).toBe('gone');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('isSameNetns follows the inode, not the name', async () => {
    const [a, b] = [pod(0), pod(1)];
    expect(await isSameNetns(a.netns, statSync(a.netns).ino)).toBe(true);
    expect(await isSameNetns(a.netns, statSync(b.netns).ino)).toBe(false);
    expect(await isSameNetns('/run/netns/does-not-exist', statSync(a.netns).ino)).toBe(false);
  });
});
