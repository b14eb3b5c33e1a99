/**
 * Resource bounds of the netns helper. Thousands of sockets (connected, closed, refused, aborted)
 * leave the agent's fd count at its baseline, the helper's fd count flat and no child or zombie
 * behind. On a raw channel (no Node IPC in the way): the child cap answers "busy", a child stuck
 * on a full channel is killed and answered for, malformed lines never crash the helper, and the
 * helper exits when the channel closes.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft']);

import { once } from 'node:events';
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { NetnsError } from '../../agent/errors.ts';
import { ResidentHelper } from '../../agent/netns/helper.ts';
import { SpawnHelper } from '../../agent/netns/spawn-helper.ts';
import type { SocketFactory } from '../../agent/probe/types.ts';
import { createLab, type Lab, type LabPod, type RunningServer } from '../lab/lab.ts';
import { RawHelper } from '../support/raw-helper.ts';

const SELF_NETNS = `/proc/${process.pid}/ns/net`;

const fdCount = (pid: number | 'self'): number => readdirSync(`/proc/${pid}/fd`).length;

/** The resident's descriptors but what each pool worker costs it (a control socket, and a pidfd where the kernel has them). */
function residentFds(pid: number): number {
  const links = readdirSync(`/proc/${pid}/fd`).map((fd) => { try { return readlinkSync(`/proc/${pid}/fd/${fd}`); } catch { return ''; } });
  return links.filter((l) => l !== 'anon_inode:[pidfd]').length - childrenOf(pid).length;
}

function childrenOf(pid: number): string[] {
  return readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean);
}

/** Pids in state Z whose parent is `ppid`, from /proc/<pid>/stat (fields after the comm's ')'). */
function zombiesOf(ppid: number): number[] {
  const found: number[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const rest = readFileSync(`/proc/${name}/stat`, 'utf8').split(') ').pop()?.split(' ') ?? [];
      if (rest[0] === 'Z' && Number(rest[1]) === ppid) found.push(Number(name));
    } catch {
      // gone meanwhile
    }
  }
  return found;
}

/** The agent's fd count once sockets closed a moment ago are gone: a baseline. */
async function quiet(): Promise<number> {
  await new Promise((r) => setTimeout(r, 200));
  return fdCount('self');
}

/** Polls `read` until it is at most `target` (or `ms` passed); returns the last reading. */
async function settleTo(read: () => number, target: number, ms = 3000): Promise<number> {
  const end = Date.now() + ms;
  while (read() > target && Date.now() < end) await new Promise((r) => setTimeout(r, 25));
  return read();
}

let lab: Lab;
let pods: LabPod[];
let server: RunningServer;

beforeAll(async () => {
  lab = await createLab({ pods: 2, policy: 'reject', tag: 'helper-leak.test' });
  pods = lab.pods;
  server = await lab.startServer(pods[0] as LabPod, { tcp: 0 });
});
afterAll(() => lab?.destroy());

/** One request: connect to the pod server and close; every 10th a gone netns, every 25th aborted at once. */
async function oneRound(f: SocketFactory, i: number): Promise<string> {
  const pod = pods[i % 2] as LabPod;
  const family = (i % 4 < 2 ? 4 : 6) as 4 | 6;
  if (i % 10 === 9) {
    const err = await f.createSocket(`/run/netns/pa-gone-${process.pid}`, family).then((s) => { s.destroy(); }, (e: unknown) => e);
    return err instanceof NetnsError && err.kind === 'gone' ? 'gone' : `unexpected ${String(err)}`;
  }
  if (i % 25 === 24) {
    const ac = new AbortController();
    const p = f.createSocket(pod.netns, family, ac.signal);
    ac.abort(new Error('abandoned'));
    return p.then((s) => { s.destroy(); return 'late'; }, () => 'aborted');
  }
  const socket = await f.createSocket(pod.netns, family);
  const target = pods[0] as LabPod;
  await new Promise<void>((resolve, reject) => {
    socket.once('error', reject);
    socket.connect({ host: family === 4 ? target.ipv4 : target.ipv6, port: server.ports.tcp as number }, () => resolve());
  });
  socket.destroy();
  await once(socket, 'close');
  return 'connected';
}

async function hammer(f: SocketFactory, total: number, concurrency: number): Promise<Map<string, number>> {
  const counts = new Map<string, number>();
  let next = 0;
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < total) {
      const r = await oneRound(f, next++);
      counts.set(r, (counts.get(r) ?? 0) + 1);
    }
  }));
  return counts;
}

describe.each(['resident', 'warm', 'pool'] as const)('%s helper under 1,000 requests', (mode) => {
  it('returns to its fd baseline with no children (but its pool workers) and no zombies', async () => {
    const h = await ResidentHelper.start({ warm: mode === 'warm', pool: mode === 'pool' ? 4 : 0 });
    try {
      const helperPid = h.stats().pid as number;
      // The pool's workers are long-lived children, each with a control socket (and a pidfd) in the resident.
      const workers = mode === 'pool' ? 4 : 0;
      await hammer(h, 40, 8);
      const agentFds = await quiet();
      const helperFds = residentFds(helperPid);
      const started = performance.now();
      const counts = await hammer(h, 1000, 16);
      const seconds = (performance.now() - started) / 1000;
      console.log(`${mode}: 1000 requests in ${seconds.toFixed(2)} s`, Object.fromEntries(counts));
      expect(counts.get('connected')).toBeGreaterThan(800);
      expect(counts.get('gone')).toBe(100);
      expect([...counts.keys()].filter((k) => k.startsWith('unexpected'))).toEqual([]);
      expect(h.stats()).toMatchObject({ inFlight: 0, restarts: 0 });
      expect(await settleTo(() => fdCount('self'), agentFds)).toBeLessThanOrEqual(agentFds);
      expect(await settleTo(() => childrenOf(helperPid).length, workers)).toBeLessThanOrEqual(workers);
      expect(zombiesOf(helperPid)).toEqual([]);
      expect(residentFds(helperPid)).toBe(helperFds);
      // stdio, the channel, the control socket and the home netns: nothing of a thousand requests.
      for (const w of childrenOf(helperPid)) expect(fdCount(Number(w)), `worker ${w}`).toBe(6);
    } finally {
      await h.close();
    }
  }, 60_000);
});

it('spawn helper: 200 requests leave no fds and no zombies behind', async () => {
  const f = await SpawnHelper.create();
  await hammer(f, 20, 4);
  const agentFds = await quiet();
  const counts = await hammer(f, 200, 8);
  expect(counts.get('gone')).toBe(20);
  expect(await settleTo(() => fdCount('self'), agentFds)).toBeLessThanOrEqual(agentFds);
  expect(await settleTo(() => zombiesOf(process.pid).length, 0)).toBe(0);
}, 60_000);

const request = (id: number, extra = ''): string => `{"id":${id},"netns":${JSON.stringify(SELF_NETNS)},"family":4${extra}}\n`;

describe('resident helper on a raw channel', () => {
  it('answers each request once, drops Node\'s ACKs and survives malformed lines', async () => {
    const h = new RawHelper([]);
    h.chan.write([
      '{"cmd":"NODE_HANDLE_ACK"}\n',
      `{"id":1,"netns":${JSON.stringify(SELF_NETNS)},"family":5}\n`,
      `{"id":2,"netns":${JSON.stringify(SELF_NETNS)}}\n`,
      'not json at all\n',
      '{"id":3,"netns":"/proc/self/ns/net","family":4}\n',
      '{"id":4,"netns":"/run/netns/\\u0000x","family":4}\n',
      `${'x'.repeat(10_000)}\n`,
      request(5, ',"extra":{"a":[1,2.5e3,{"b":"c\\"d"}],"t":true,"n":null}'),
      `{"id":6,"netns":"${SELF_NETNS.replaceAll('/', '\\/')}","family":6}\n`,
    ].join(''));
    await h.waitReplies(6);
    expect(h.answersFor(1)).toMatchObject([{ ok: false, stage: 'request' }]);
    expect(h.answersFor(2)).toMatchObject([{ ok: false, stage: 'request' }]);
    expect(h.answersFor(3)).toMatchObject([{ ok: false, stage: 'validate', code: 'EINVAL' }]);
    expect(h.answersFor(4)).toMatchObject([{ ok: false, stage: 'request', error: 'malformed request: NUL in string' }]);
    expect(h.answersFor(5)).toEqual([{ id: 5, ok: true }]);
    expect(h.answersFor(6)).toEqual([{ id: 6, ok: true }]);
    expect(h.replies).toHaveLength(6);
    expect(h.stderr).toContain('dropping a malformed line');
    expect(h.stderr).toContain('longer than 8192 bytes');
    expect(await h.stop()).toBe(0);
  });

  it('answers "busy" beyond its child cap, and every request still gets one answer', async () => {
    const h = new RawHelper(['--max-children', '1']);
    h.chan.write(Array.from({ length: 40 }, (_, i) => request(i + 1)).join(''));
    await h.waitReplies(40);
    const answers = Array.from({ length: 40 }, (_, i) => h.answersFor(i + 1));
    expect(answers.every((a) => a.length === 1)).toBe(true);
    const flat = answers.map((a) => a[0] as Record<string, unknown>);
    expect(flat.filter((a) => a.stage === 'busy').length).toBeGreaterThan(0);
    expect(flat.filter((a) => a.ok === true).length).toBeGreaterThan(0);
    expect(await h.stop()).toBe(0);
  });

  it('kills children stuck on a full channel and answers for them once the agent reads again', async () => {
    const n = 1500;
    const h = new RawHelper(['--max-children', String(n), '--child-timeout-ms', '300']);
    const pid = h.child.pid as number;
    h.chan.pause();
    h.chan.write(Array.from({ length: n }, (_, i) => request(i + 1)).join(''));
    // Long enough for every child to be forked and for the blocked ones to be killed.
    await new Promise((r) => setTimeout(r, 2500));
    h.chan.resume();
    await h.waitReplies(n, 15_000);
    const stages = new Map<string, number>();
    for (let id = 1; id <= n; id++) {
      const a = h.answersFor(id);
      expect(a.length, `answers for ${id}`).toBe(1);
      const key = a[0]?.ok ? 'ok' : String(a[0]?.stage);
      stages.set(key, (stages.get(key) ?? 0) + 1);
    }
    console.log('stuck-children run:', Object.fromEntries(stages));
    expect(stages.get('child')).toBeGreaterThan(0);
    expect(h.replies.some((r) => r.stage === 'child' && r.code === 'ETIMEDOUT')).toBe(true);
    expect(childrenOf(pid)).toEqual([]);
    expect(zombiesOf(pid)).toEqual([]);
    expect(await h.stop()).toBe(0);
  }, 30_000);
});
