/**
 * kubelet's TCP probe (agent/probe/tcp.ts) done whole inside the netns by the resident helper (its
 * connectProbe route), as root, against listeners in this process's netns. probers.test.ts covers
 * the socket route from Node; this covers the helper route and its dual-stack stagger.
 */
import { createServer, type AddressInfo, type Server } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ResidentHelper } from '../../agent/netns/helper.ts';
import { Deadline } from '../../agent/probe/connect.ts';
import { probeTcp } from '../../agent/probe/tcp.ts';

const NETNS = `/proc/${process.pid}/ns/net`;
let helper: ResidentHelper;
let v4: Server;
let port: number;
let accepted = 0;
const received: Buffer[] = [];
let closedPort: number;

beforeAll(async () => {
  helper = await ResidentHelper.start();
  v4 = createServer((s) => {
    accepted++;
    s.on('data', (d: Buffer) => received.push(d));
    s.on('error', () => {});
  });
  await new Promise<void>((r) => v4.listen(0, '127.0.0.1', r));
  port = (v4.address() as AddressInfo).port;
  const gone = createServer();
  await new Promise<void>((r) => gone.listen(0, '127.0.0.1', r));
  closedPort = (gone.address() as AddressInfo).port;
  await new Promise((r) => gone.close(r));
}, 120_000);
afterAll(async () => {
  v4?.close();
  await helper?.close();
});

/** A probe with a 10 s deadline, disposed after. */
async function run(p: ReturnType<typeof plan>) {
  const d = new Deadline(10_000);
  try {
    return await probeTcp(p, d);
  } finally {
    d.dispose();
  }
}

const plan = (ips: string[], p: number) => ({ host: ips[0]!, port: p, ips, netns: NETNS, sockets: helper, legacyNode: false });

describe('probeTcp through the helper', () => {
  it('a completed handshake is success, timed by the helper; no byte is sent', async () => {
    const before = accepted;
    const r = await run(plan(['127.0.0.1'], port));
    expect(r).toMatchObject({ result: 'success', message: '', address: `127.0.0.1:${port}` });
    expect(r.phases.helper).toBeGreaterThanOrEqual(0);
    expect(r.phases.connect).toBeGreaterThanOrEqual(0);
    await new Promise((res) => setTimeout(res, 200));
    expect(accepted).toBe(before + 1);
    expect(received).toEqual([]);
  }, 120_000);

  it("a refused connection is a failure with Go's dial text", async () => {
    const r = await run(plan(['127.0.0.1'], closedPort));
    expect(r).toMatchObject({ result: 'failure', reason: 'refused', message: `dial tcp 127.0.0.1:${closedPort}: connect: connection refused`, address: `127.0.0.1:${closedPort}` });
  }, 120_000);

  it('dual-stack: the family that answers wins and is the address reported', async () => {
    const r = await run(plan(['::1', '127.0.0.1'], port));
    expect(r).toMatchObject({ result: 'success', address: `127.0.0.1:${port}` });
  }, 120_000);

  it('a netns the helper cannot enter is an error, never a failure', async () => {
    const r = await run({ ...plan(['127.0.0.1'], port), netns: '/proc/999999999/ns/net' });
    expect(r.result).toBe('error');
  }, 120_000);
});
