/**
 * The CRI resolver against a real containerd (private instance, CNI bridge, real pause sandboxes):
 * the path it returns is the sandbox's netns, newest attempt wins, ambiguity/removal/host network/
 * sandboxed handlers are refused as they should be, and a stopped containerd gives a clear,
 * retryable error the same client recovers from. Plus endpoint auto-detection and deadlines.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'containerd', 'ctr', 'gcc', 'tar']);

import { randomUUID } from 'node:crypto';
import { rmSync, statSync, writeFileSync } from 'node:fs';
import * as net from 'node:net';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { NetnsUnavailableError, UnsupportedPodError } from '../../agent/errors.ts';
import { CriClient } from '../../agent/netns/cri-client.ts';
import { detectCriEndpoint } from '../../agent/netns/cri-endpoint.ts';
import { CriResolver } from '../../agent/netns/cri-resolver.ts';
import { NetnsPathChecker } from '../../agent/netns/netns-path.ts';
import { ProcfsResolver } from '../../agent/netns/procfs-resolver.ts';
import { NetnsResolverChain, outcomeOf, type PodRef } from '../../agent/netns/resolver.ts';
import { createContainerdLab, type ContainerdLab, type LabSandbox } from '../lab/containerd.ts';
import { labScratch } from '../lab/slots.ts';

let ctrd: ContainerdLab;
let checker: NetnsPathChecker;
let cri: CriResolver;
let scratch: string;

function ref(sb: { uid: string; name?: string; ips?: string[] }): PodRef {
  return { uid: sb.uid, namespace: 'lab', name: sb.name ?? 'p', podIPs: sb.ips ?? [] };
}

async function rejection(p: Promise<unknown>): Promise<unknown> {
  try {
    await p;
  } catch (err) {
    return err;
  }
  throw new Error('expected a rejection');
}

async function removeSandbox(sb: LabSandbox): Promise<void> {
  await ctrd.stopSandbox(sb.id);
  await ctrd.removeSandbox(sb.id);
}

beforeAll(async () => {
  const t = performance.now();
  ctrd = await createContainerdLab();
  console.log(`containerd lab bring-up: ${(performance.now() - t).toFixed(0)} ms (slot ${ctrd.slot})`);
  checker = new NetnsPathChecker({ extraDirs: [ctrd.netnsDir] });
  cri = new CriResolver({ client: new CriClient(ctrd.endpoint), pathChecker: checker });
  scratch = labScratch('cri-test-');
});

afterAll(async () => {
  cri?.client.close();
  const t = performance.now();
  await ctrd?.destroy();
  console.log(`containerd lab teardown: ${(performance.now() - t).toFixed(0)} ms`);
  if (scratch) rmSync(scratch, { recursive: true, force: true });
});

describe('CriResolver against containerd', () => {
  it('returns the sandbox netns of a dual-stack pod (same inode as the pause process netns)', async () => {
    const t = performance.now();
    const sb = await ctrd.runSandbox();
    console.log(`RunPodSandbox: ${(performance.now() - t).toFixed(0)} ms`);
    expect(sb.ipv4).toMatch(new RegExp(`^10\\.251\\.${ctrd.slot}\\.\\d+$`));
    expect(sb.ipv6).toMatch(new RegExp(`^fd00:10:251:${ctrd.slot}::`));
    const t2 = performance.now();
    const res = await cri.resolve(ref(sb));
    console.log(`CRI resolve: ${(performance.now() - t2).toFixed(1)} ms`);
    expect(res).toMatchObject({ resolver: 'cri', sandboxID: sb.id, path: sb.netnsPath });
    expect(res.path.startsWith(`${ctrd.netnsDir}/cni-`)).toBe(true);
    expect(res.inode).toBe(statSync(`/proc/${sb.pid}/ns/net`).ino);
    expect(res.inode).not.toBe(statSync('/proc/self/ns/net').ino);
    // And inside that netns the pod's own addresses are configured.
    const addrs = await ctrd.exec(sb, 'ip', ['-j', 'addr', 'show', 'dev', 'eth0']);
    expect(addrs.code).toBe(0);
    expect(sb.ips.length).toBeGreaterThan(0);
    for (const ip of sb.ips) expect(addrs.stdout).toContain(`"${ip}"`);
  });

  it('picks the newest attempt after a sandbox restart, even while the old one is still READY', async () => {
    const uid = randomUUID();
    const old = await ctrd.runSandbox({ uid, name: 'web', attempt: 0 });
    const fresh = await ctrd.runSandbox({ uid, name: 'web', attempt: 1 });
    const res = await cri.resolve(ref(fresh));
    expect(res.sandboxID).toBe(fresh.id);
    expect(res.inode).toBe(statSync(`/proc/${fresh.pid}/ns/net`).ino);
    // Once the new attempt is stopped, the old READY one is the only candidate.
    await ctrd.stopSandbox(fresh.id);
    expect((await cri.resolve(ref(fresh))).sandboxID).toBe(old.id);
  });

  it('refuses two READY sandboxes with the same newest attempt as ambiguous', async () => {
    const uid = randomUUID();
    await ctrd.runSandbox({ uid, name: 'twin-a', attempt: 2 });
    await ctrd.runSandbox({ uid, name: 'twin-b', attempt: 2 });
    const err = await rejection(cri.resolve(ref({ uid })));
    expect(err).toBeInstanceOf(NetnsUnavailableError);
    expect(outcomeOf(err)).toBe('ambiguous');
    expect((err as Error).message).toMatch(/2 READY sandboxes with attempt 2/);
  });

  it('reports not-found for a stopped and then a removed sandbox', async () => {
    const sb = await ctrd.runSandbox();
    await ctrd.stopSandbox(sb.id);
    expect(outcomeOf(await rejection(cri.resolve(ref(sb))))).toBe('not-found');
    await ctrd.removeSandbox(sb.id);
    const err = await rejection(cri.resolve(ref(sb)));
    expect(err).toBeInstanceOf(NetnsUnavailableError);
    expect(outcomeOf(err)).toBe('not-found');
    expect((err as Error).message).toMatch(/no READY sandbox/);
  });

  it('refuses a host-network sandbox as unsupported, and the chain does not fall through', async () => {
    const sb = await ctrd.runSandbox({ hostNetwork: true });
    const err = await rejection(cri.resolve(ref(sb)));
    expect(err).toBeInstanceOf(UnsupportedPodError);
    expect((err as Error).message).toMatch(/hostNetwork/);
    const seen: string[] = [];
    const chain = new NetnsResolverChain([cri, new ProcfsResolver()], { onResolve: (r, o) => seen.push(`${r}:${o}`) });
    await expect(chain.resolve(ref(sb))).rejects.toBeInstanceOf(UnsupportedPodError);
    expect(seen).toEqual(['cri:unsupported']);
  });

  it('refuses a sandbox under a sandboxed runtime handler (runsc), unless the list is emptied', async () => {
    const sb = await ctrd.runSandbox({ runtimeHandler: 'runsc' });
    const err = await rejection(cri.resolve(ref(sb)));
    expect(err).toBeInstanceOf(UnsupportedPodError);
    expect((err as Error).message).toMatch(/runtime handler "runsc"/);
    const permissive = new CriResolver({ client: cri.client, pathChecker: checker, sandboxedRuntimeHandlers: [] });
    const res = await permissive.resolve(ref(sb));
    expect(res).toMatchObject({ sandboxID: sb.id, runtimeHandler: 'runsc' });
  });

  it('refuses a netns path outside the allowed dirs as invalid; the chain then falls back to procfs', async () => {
    const sb = await ctrd.runSandbox();
    const strict = new CriResolver({ client: cri.client });
    const err = await rejection(strict.resolve(ref(sb)));
    expect(outcomeOf(err)).toBe('invalid');
    expect((err as Error).message).toMatch(/not inside an allowed netns directory/);
    const seen: string[] = [];
    const chain = new NetnsResolverChain([strict, new ProcfsResolver()], { onResolve: (r, o) => seen.push(`${r}:${o}`) });
    const res = await chain.resolve(ref(sb));
    expect(res).toMatchObject({ resolver: 'procfs', path: `/proc/${sb.pid}/ns/net` });
    expect(seen).toEqual(['cri:invalid', 'procfs:ok']);
  });

  it('chain: caches per pod, re-validates on use, and re-resolves after the sandbox is removed', async () => {
    const sb = await ctrd.runSandbox();
    const seen: string[] = [];
    const chain = new NetnsResolverChain([cri], { onResolve: (r, o) => seen.push(`${r}:${o}`) });
    const first = await chain.resolve(ref(sb));
    const t = performance.now();
    expect(await chain.resolve(ref(sb))).toEqual(first);
    console.log(`cached resolve (re-validated): ${(performance.now() - t).toFixed(2)} ms`);
    expect(seen).toEqual(['cri:ok']);
    await removeSandbox(sb);
    const err = await rejection(chain.resolve(ref(sb)));
    expect(outcomeOf(err)).toBe('not-found');
    expect(seen).toEqual(['cri:ok', 'cri:not-found']);
    expect(chain.cacheSize).toBe(0);
  });
});

describe('CRI endpoint detection and failures', () => {
  it('detects the first candidate that is a socket and answers Version', async () => {
    const file = path.join(scratch, 'not-a-socket');
    writeFileSync(file, '');
    const closer = net.createServer((s) => s.destroy()).listen(path.join(scratch, 'closer.sock'));
    try {
      const found = await detectCriEndpoint({
        candidates: [`unix://${scratch}/missing.sock`, `unix://${file}`, `unix://${scratch}/closer.sock`, ctrd.endpoint],
        deadlineMs: 500,
      });
      expect(found.endpoint).toBe(ctrd.endpoint);
      expect(found.version.runtimeName).toBe('containerd');
      expect(found.version.runtimeApiVersion).toBe('v1');
      const err = await rejection(detectCriEndpoint({ candidates: [`unix://${scratch}/missing.sock`, `unix://${file}`], deadlineMs: 500 }));
      expect(err).toBeInstanceOf(NetnsUnavailableError);
      expect((err as Error).message).toMatch(/missing\.sock: no socket \(ENOENT\).*not-a-socket: not a unix socket/);
    } finally {
      closer.close();
    }
  });

  it('gives up on a runtime that never answers within the call deadline', async () => {
    const sock = path.join(scratch, 'hang.sock');
    const held: net.Socket[] = [];
    const hang = net.createServer((s) => held.push(s.on('error', () => {}))).listen(sock);
    const client = new CriClient(`unix://${sock}`, { deadlineMs: 300 });
    try {
      const t = performance.now();
      const err = await rejection(client.listPodSandbox({}));
      const ms = performance.now() - t;
      expect(err).toBeInstanceOf(NetnsUnavailableError);
      expect((err as Error).message).toMatch(new RegExp(`CRI endpoint unix://${sock} unavailable: ListPodSandbox timed out`));
      expect(ms).toBeGreaterThanOrEqual(250);
      expect(ms).toBeLessThan(5000);
      // An abort ends the call at once, well before the deadline.
      const slow = new CriClient(`unix://${sock}`, { deadlineMs: 5000 });
      const t2 = performance.now();
      const aborted = await rejection(slow.listPodSandbox({}, AbortSignal.timeout(100)));
      slow.close();
      expect((aborted as Error).message).toMatch(/aborted/);
      expect(performance.now() - t2).toBeLessThan(4000);
    } finally {
      client.close();
      for (const s of held) s.destroy();
      hang.close();
    }
  });

  it('reports a stopped containerd clearly and recovers on the same client when it is back', async () => {
    const sb = await ctrd.runSandbox();
    expect((await cri.resolve(ref(sb))).sandboxID).toBe(sb.id);
    await ctrd.stopContainerd();
    const err = await rejection(cri.resolve(ref(sb)));
    expect(err).toBeInstanceOf(NetnsUnavailableError);
    expect(outcomeOf(err)).toBe('unavailable');
    expect((err as Error).message).toMatch(new RegExp(`^CRI endpoint ${ctrd.endpoint} unavailable: `));
    // The sandbox itself kept running without containerd, as on a node during a runtime restart.
    expect(statSync(`/proc/${sb.pid}/ns/net`).ino).toBeGreaterThan(0);

    const t = performance.now();
    await ctrd.startContainerd();
    const res = await cri.resolve(ref(sb));
    console.log(`recovery after containerd restart: ${(performance.now() - t).toFixed(0)} ms`);
    expect(res).toMatchObject({ sandboxID: sb.id, inode: statSync(`/proc/${sb.pid}/ns/net`).ino });
  });
});
