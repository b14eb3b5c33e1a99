/**
 * readNetnsAddresses (agent/netns/pod-addresses.ts), as root, with the built resident helper: the
 * global addresses inside a netns, IPv4 first; a netns with only loopback has none; a path that is
 * no netns is a NetnsError naming it.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { NetnsError } from '../../agent/errors.ts';
import { readNetnsAddresses } from '../../agent/netns/pod-addresses.ts';

let empty: ChildProcess;
let pod: ChildProcess;
let dir: string;
beforeAll(async () => {
  dir = mkdtempSync(path.join(tmpdir(), 'pod-addresses-'));
  // A process in a new netns of its own: only lo, down.
  empty = spawn('unshare', ['--net', 'sleep', '300'], { stdio: 'ignore' });
  // A pod-like netns: a veth interface with two IPv4 and one IPv6 address (plus its link-local one).
  const setup = 'ip link set lo up && ip link add eth0 type veth peer name eth1 && ip link set eth1 up && ip -6 addr add fd99::5/64 dev eth0 nodad && ip addr add 10.99.1.7/24 dev eth0 && ip addr add 10.99.0.5/24 dev eth0 && ip link set eth0 up && echo ready && exec sleep 300';
  pod = spawn('unshare', ['--net', 'sh', '-c', setup], { stdio: ['ignore', 'pipe', 'inherit'] });
  await new Promise<void>((resolve, reject) => {
    pod.stdout!.once('data', () => resolve());
    pod.once('exit', (code) => reject(new Error(`netns setup exited ${code}`)));
  });
  await new Promise((r) => setTimeout(r, 500));
});
afterAll(() => {
  empty?.kill('SIGKILL');
  pod?.kill('SIGKILL');
  rmSync(dir, { recursive: true, force: true });
});

describe('readNetnsAddresses', () => {
  it('the global addresses inside the netns, IPv4 before IPv6; loopback and link-local left out', async () => {
    // The kernel's order within a family (the order they were added), the IPv6 one added first yet last.
    expect(await readNetnsAddresses(`/proc/${pod.pid}/ns/net`)).toEqual(['10.99.1.7', '10.99.0.5', 'fd99::5']);
  }, 120_000);

  it('none in a netns that has only loopback', async () => {
    expect(await readNetnsAddresses(`/proc/${empty.pid}/ns/net`)).toEqual([]);
  }, 120_000);

  it('a path that is not a netns: a NetnsError naming it', async () => {
    const notNetns = path.join(dir, 'plain-file');
    writeFileSync(notNetns, 'x');
    for (const p of [notNetns, path.join(dir, 'missing')]) {
      const err = await readNetnsAddresses(p).then(() => undefined, (e: unknown) => e);
      expect(err).toBeInstanceOf(NetnsError);
      expect((err as Error).message).toContain(p);
    }
  }, 120_000);
});
