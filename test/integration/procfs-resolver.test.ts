/**
 * The procfs resolver against real processes in real, kubelet-shaped cgroups: processes started in
 * lab pod netns and placed (by mkdir in the v1 pids hierarchy + cgroup.procs) under cgroupfs and
 * systemd-named pod cgroups; and a real containerd sandbox whose pause process containerd put in a
 * kubelet cgroup_parent.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'containerd', 'ctr', 'gcc', 'mount']);

import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmdirSync, statSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { NetnsUnavailableError, UnsupportedPodError } from '../../agent/errors.ts';
import { CriResolver } from '../../agent/netns/cri-resolver.ts';
import { NetnsPathChecker } from '../../agent/netns/netns-path.ts';
import { ProcfsResolver } from '../../agent/netns/procfs-resolver.ts';
import { NetnsResolverChain, outcomeOf, type PodRef } from '../../agent/netns/resolver.ts';
import { createLab, type Lab, type LabPod } from '../lab/lab.ts';
import { labScratch } from '../lab/slots.ts';
import { createContainerdLab, type ContainerdLab } from '../lab/containerd.ts';

const PIDS = '/sys/fs/cgroup/pids';
const PREFIX = `probe-agent-test-procfs-${process.pid}`;
const ROOT = path.join(PIDS, PREFIX);

let lab: Lab;
const children: ChildProcess[] = [];

/** Removes cgroup trees of earlier runs of this file whose process died. */
function sweepStaleCgroups(): void {
  for (const e of readdirSync(PIDS)) {
    const m = /^probe-agent-test-procfs-(\d+)$/.exec(e);
    if (m && !existsSync(`/proc/${m[1]}`)) removeCgroupTree(path.join(PIDS, e));
  }
}

function removeCgroupTree(dir: string): void {
  if (!existsSync(dir)) return;
  for (const e of readdirSync(dir, { withFileTypes: true })) if (e.isDirectory()) removeCgroupTree(path.join(dir, e.name));
  rmdirSync(dir);
}

/**
 * Starts `sleep` that first joins cgroup `rel` (under our prefix in the pids hierarchy) and then
 * enters `pod`'s netns (or stays in the node's), so it is in both from its first instruction on.
 */
async function podProcess(rel: string, pod: LabPod | undefined): Promise<number> {
  const dir = path.join(ROOT, rel);
  mkdirSync(dir, { recursive: true });
  const exec = pod ? `exec ip netns exec "$2" sleep 300` : 'exec sleep 300';
  const child = spawn('sh', ['-c', `echo $$ > "$1/cgroup.procs" && ${exec}`, 'sh', dir, pod?.name ?? ''], { stdio: 'ignore' });
  children.push(child);
  const pid = child.pid as number;
  const want = pod ? statSync(pod.netns).ino : statSync('/proc/self/ns/net').ino;
  const deadline = Date.now() + 5000;
  // Wait until the exec chain has reached sleep inside the netns.
  while (Date.now() < deadline) {
    try {
      const comm = readFileSync(`/proc/${pid}/comm`, 'utf8').trim();
      if (comm === 'sleep' && statSync(`/proc/${pid}/ns/net`).ino === want) return pid;
    } catch {
      // not there yet
    }
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error(`process for ${rel} did not start in the expected netns`);
}

async function killProcess(pid: number): Promise<void> {
  const child = children.find((c) => c.pid === pid);
  if (!child || child.exitCode !== null || child.signalCode !== null) return;
  const gone = new Promise((r) => child.once('exit', r));
  child.kill('SIGKILL');
  await gone;
}

function podRef(uid: string, podIPs: string[] = []): PodRef {
  return { uid, namespace: 'lab', name: `p-${uid.slice(0, 6)}`, podIPs };
}

async function rejection(p: Promise<unknown>): Promise<unknown> {
  try {
    await p;
  } catch (err) {
    return err;
  }
  throw new Error('expected a rejection');
}

beforeAll(async () => {
  sweepStaleCgroups();
  lab = await createLab({ pods: 2, policy: 'none', tag: 'procfs-resolver.test' });
});

afterAll(async () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  await new Promise((r) => setTimeout(r, 50));
  await lab?.destroy();
  removeCgroupTree(ROOT);
});

describe('ProcfsResolver with kubelet-shaped cgroups', () => {
  const resolver = new ProcfsResolver();

  it('finds a besteffort pod (cgroupfs) and returns its process netns', async () => {
    const uid = randomUUID();
    const pod = lab.pods[0] as LabPod;
    const pid = await podProcess(`kubepods/besteffort/pod${uid}/${'c'.repeat(64)}`, pod);
    const res = await resolver.resolve(podRef(uid));
    expect(res).toMatchObject({ resolver: 'procfs', path: `/proc/${pid}/ns/net` });
    expect(res.inode).toBe(statSync(pod.netns).ino);
  });

  it('finds a guaranteed pod (cgroupfs, directly under kubepods)', async () => {
    const uid = randomUUID();
    const pod = lab.pods[1] as LabPod;
    await podProcess(`kubepods/pod${uid}/${'d'.repeat(64)}`, pod);
    const res = await resolver.resolve(podRef(uid));
    expect(res.inode).toBe(statSync(pod.netns).ino);
  });

  it('finds a systemd-driver pod (kubepods-burstable-pod<uid_>.slice) created in a v1 hierarchy', async () => {
    const uid = randomUUID();
    const pod = lab.pods[0] as LabPod;
    const slice = `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod${uid.replace(/-/g, '_')}.slice`;
    const pid = await podProcess(`${slice}/cri-containerd-${'e'.repeat(64)}.scope`, pod);
    expect(readFileSync(`/proc/${pid}/cgroup`, 'utf8')).toContain(`pids:/${PREFIX}/${slice}/`);
    const res = await resolver.resolve(podRef(uid));
    expect(res).toMatchObject({ path: `/proc/${pid}/ns/net`, inode: statSync(pod.netns).ino });
  });

  it('agrees across several containers of one pod and picks the lowest pid', async () => {
    const uid = randomUUID();
    const pod = lab.pods[1] as LabPod;
    const a = await podProcess(`kubepods/burstable/pod${uid}/${'1'.repeat(64)}`, pod);
    const b = await podProcess(`kubepods/burstable/pod${uid}/${'2'.repeat(64)}`, pod);
    const res = await resolver.resolve(podRef(uid));
    expect(res.path).toBe(`/proc/${Math.min(a, b)}/ns/net`);
    expect(res.inode).toBe(statSync(pod.netns).ino);
  });

  it('refuses a pod whose processes live in two different netns (ambiguous)', async () => {
    const uid = randomUUID();
    await podProcess(`kubepods/besteffort/pod${uid}/${'3'.repeat(64)}`, lab.pods[0]);
    await podProcess(`kubepods/besteffort/pod${uid}/${'4'.repeat(64)}`, lab.pods[1]);
    const err = await rejection(resolver.resolve(podRef(uid)));
    expect(err).toBeInstanceOf(NetnsUnavailableError);
    expect(outcomeOf(err)).toBe('ambiguous');
    expect((err as Error).message).toMatch(/2 different network namespaces/);
  });

  it("reports not-found, to retry, while a pod's only process is still in the node netns (a container starting)", async () => {
    const uid = randomUUID();
    await podProcess(`kubepods/besteffort/pod${uid}/${'5'.repeat(64)}`, undefined);
    const err = await rejection(resolver.resolve(podRef(uid)));
    expect(err).toBeInstanceOf(NetnsUnavailableError);
    expect(outcomeOf(err)).toBe('not-found');
    expect((err as Error).message).toMatch(/still in the node's network namespace/);
  });

  it('ignores a node-netns helper in the pod cgroup when the pod has its own netns', async () => {
    const uid = randomUUID();
    const pod = lab.pods[0] as LabPod;
    await podProcess(`kubepods/besteffort/pod${uid}/${'6'.repeat(64)}`, undefined);
    await podProcess(`kubepods/besteffort/pod${uid}/${'7'.repeat(64)}`, pod);
    const res = await resolver.resolve(podRef(uid));
    expect(res.inode).toBe(statSync(pod.netns).ino);
  });

  it('reports not-found for a pod with no process', async () => {
    const err = await rejection(resolver.resolve(podRef(randomUUID())));
    expect(err).toBeInstanceOf(NetnsUnavailableError);
    expect(outcomeOf(err)).toBe('not-found');
  });

  it('chain: a cached /proc path is dropped when the process exits, and the pod re-resolves', async () => {
    const uid = randomUUID();
    const pod = lab.pods[1] as LabPod;
    const first = await podProcess(`kubepods/besteffort/pod${uid}/${'8'.repeat(64)}`, pod);
    const outcomes: string[] = [];
    const chain = new NetnsResolverChain([resolver], { onResolve: (_r, o) => outcomes.push(o) });
    expect((await chain.resolve(podRef(uid))).path).toBe(`/proc/${first}/ns/net`);
    expect((await chain.resolve(podRef(uid))).path).toBe(`/proc/${first}/ns/net`);
    expect(outcomes).toEqual(['ok']);
    const second = await podProcess(`kubepods/besteffort/pod${uid}/${'9'.repeat(64)}`, pod);
    await killProcess(first);
    const again = await chain.resolve(podRef(uid));
    expect(again.path).toBe(`/proc/${second}/ns/net`);
    expect(outcomes).toEqual(['ok', 'ok']);
    await killProcess(second);
    const err = await rejection(chain.resolve(podRef(uid)));
    expect(outcomeOf(err)).toBe('not-found');
  });

  it('refuses a pod with a sandboxed runtimeClassName before scanning (the netns it would find is not the app\'s)', async () => {
    const uid = randomUUID();
    await podProcess(`kubepods/besteffort/pod${uid}/${'b'.repeat(64)}`, lab.pods[0]);
    const err = await rejection(resolver.resolve({ ...podRef(uid), runtimeClassName: 'gvisor' }));
    expect(err).toBeInstanceOf(UnsupportedPodError);
    expect((err as Error).message).toMatch(/runtimeClassName "gvisor"/);
    expect((await new ProcfsResolver({ sandboxedRuntimeClasses: [] }).resolve({ ...podRef(uid), runtimeClassName: 'gvisor' })).resolver).toBe('procfs');
  });

  it('chain: single-flight for concurrent callers; invalidate, new pod IPs and TTL expiry each force a fresh resolve', async () => {
    const uid = randomUUID();
    const pod = lab.pods[0] as LabPod;
    await podProcess(`kubepods/burstable/pod${uid}/${'f'.repeat(64)}`, pod);
    let calls = 0;
    const chain = new NetnsResolverChain([resolver], { onResolve: () => calls++ });
    const all = await Promise.all(Array.from({ length: 10 }, () => chain.resolve(podRef(uid, pod.ips))));
    expect(new Set(all.map((r) => r.path)).size).toBe(1);
    expect(calls).toBe(1);
    await chain.resolve(podRef(uid, pod.ips));
    expect(calls).toBe(1);
    chain.invalidate(uid);
    await chain.resolve(podRef(uid, pod.ips));
    expect(calls).toBe(2);
    await chain.resolve(podRef(uid, [pod.ipv4]));
    expect(calls).toBe(3);
    const short = new NetnsResolverChain([resolver], { cacheTtlMs: 0, onResolve: () => calls++ });
    await short.resolve(podRef(uid));
    await short.resolve(podRef(uid));
    expect(calls).toBe(5);
  });

  it('chain: an invalidate() during a resolution keeps that result out of the cache', async () => {
    const uid = randomUUID();
    await podProcess(`kubepods/besteffort/pod${uid}/${'0'.repeat(64)}`, lab.pods[1]);
    let calls = 0;
    const chain = new NetnsResolverChain([resolver], { onResolve: () => calls++ });
    const pending = chain.resolve(podRef(uid));
    // One loop turn: the /proc scan (many file reads) is under way, not finished.
    await new Promise((r) => setImmediate(r));
    chain.invalidate(uid);
    await pending;
    expect(chain.cacheSize).toBe(0);
    await chain.resolve(podRef(uid));
    expect(calls).toBe(2);
    expect(chain.cacheSize).toBe(1);
  });

  it('uses an injected procRoot (a second procfs mount) for both the scan and the returned path', async () => {
    const uid = randomUUID();
    const pod = lab.pods[0] as LabPod;
    const pid = await podProcess(`kubepods/besteffort/pod${uid}/${'a'.repeat(64)}`, pod);
    const mnt = labScratch('procfs-test-');
    execFileSync('mount', ['-t', 'proc', 'proc', mnt]);
    try {
      const r = new ProcfsResolver({ procRoot: mnt });
      const res = await r.resolve(podRef(uid));
      expect(res).toMatchObject({ path: `${mnt}/${pid}/ns/net`, inode: statSync(pod.netns).ino });
      // The default checker refuses that path: it is not under the default /proc.
      await expect(new NetnsPathChecker().check(res.path)).rejects.toThrow(/refused/);
    } finally {
      execFileSync('umount', [mnt]);
      rmdirSync(mnt);
    }
  });
});

describe('ProcfsResolver with a real containerd sandbox', () => {
  let ctrd: ContainerdLab;
  beforeAll(async () => {
    ctrd = await createContainerdLab();
  });
  afterAll(async () => {
    await ctrd?.destroy();
  });

  it('finds the pause process containerd placed in the kubelet cgroup parent, agreeing with CRI', async () => {
    for (const qos of ['burstable', 'guaranteed'] as const) {
      const sb = await ctrd.runSandbox({ qos });
      const cg = readFileSync(`/proc/${sb.pid}/cgroup`, 'utf8');
      expect(cg).toContain(qos === 'guaranteed' ? `/kubepods/pod${sb.uid}/${sb.id}` : `/kubepods/${qos}/pod${sb.uid}/${sb.id}`);
      const viaProc = await new ProcfsResolver().resolve(podRef(sb.uid, sb.ips));
      expect(viaProc.path).toBe(`/proc/${sb.pid}/ns/net`);
      const cri = new CriResolver({ client: ctrd.client, pathChecker: new NetnsPathChecker({ extraDirs: [ctrd.netnsDir] }) });
      const viaCri = await cri.resolve(podRef(sb.uid, sb.ips));
      expect(viaProc.inode).toBe(viaCri.inode);
    }
  });
});
