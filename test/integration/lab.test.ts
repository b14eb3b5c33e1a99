/**
 * Proves the lab library: the node->pod rule blocks (and counts) node-originated connections while
 * in-netns, pod<->pod and pod->node traffic still work; labs get distinct slots; teardown (explicit,
 * on signal, or by sweeping a crashed owner) leaves no netns, link or nft table behind.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'openssl', 'curl']);

import { execFileSync, spawn } from 'node:child_process';
import { once } from 'node:events';
import { existsSync } from 'node:fs';
import * as net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLab, LabError, type Lab, type LabPod } from '../lab/lab.ts';
import { ownerAlive, readOwner, SLOTS_DIR, sweepSlots } from '../lab/slots.ts';

/** Tries a TCP connect from the test process (the node netns); resolves 'connected' or the error code. */
function connectFromNode(host: string, port: number, timeoutMs = 400): Promise<string> {
  return new Promise((resolve) => {
    const s = net.connect({ host, port });
    const done = (r: string): void => { s.destroy(); resolve(r); };
    s.setTimeout(timeoutMs, () => done('timeout'));
    s.on('connect', () => done('connected'));
    s.on('error', (e: NodeJS.ErrnoException) => done(e.code ?? e.message));
  });
}

/** Node one-liner run inside a netns: connects to host:port and prints "connected" or the error code. */
function connectScript(host: string, port: number): string[] {
  return ['-e', `const s=require('net').connect({host:${JSON.stringify(host)},port:${port}});` +
    `s.setTimeout(2000,()=>{console.log('timeout');process.exit(0)});` +
    `s.on('connect',()=>{console.log('connected');s.destroy()});s.on('error',e=>console.log(e.code))`];
}

/** Everything the lab `id` could have left in the kernel, by name. */
function leftovers(id: number): string[] {
  const netns = execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' });
  const links = execFileSync('ip', ['-o', 'link', 'show'], { encoding: 'utf8' });
  const tables = execFileSync('nft', ['list', 'tables'], { encoding: 'utf8' });
  return [
    ...netns.split('\n').filter((l) => new RegExp(`^pa${id}p\\d+\\b`).test(l)),
    ...links.split('\n').map((l) => l.split(':')[1]?.trim().split('@')[0] ?? '').filter((n) => new RegExp(`^pa${id}(br|v\\d+)$`).test(n)),
    ...tables.split('\n').filter((l) => l.trim() === `table inet probe_agent_lab_${id}`),
  ];
}

/**
 * Asserts slot `id` holds no kernel objects, except those of a live process that claimed the freed
 * slot meanwhile (parallel test files do that: a released slot is the first one they find).
 */
function expectNoLeftovers(id: number): void {
  const left = leftovers(id);
  if (left.length === 0) return;
  const owner = readOwner(`${SLOTS_DIR}/${id}/owner`);
  expect(owner !== undefined && owner.pid !== process.pid && ownerAlive(owner), `slot ${id} left: ${left.join(', ')}`).toBe(true);
}

describe('lab with the drop rule', () => {
  let lab: Lab;
  let a: LabPod;
  let b: LabPod;

  beforeAll(async () => {
    lab = await createLab({ pods: 2, policy: 'drop', tag: 'lab.test drop' });
    [a, b] = lab.pods as [LabPod, LabPod];
    await lab.startServer(a, { tcp: 9000 });
  });
  afterAll(() => lab?.destroy());

  it('derives names and addresses from its slot', () => {
    expect(a.name).toBe(`pa${lab.id}p1`);
    expect(a.netns).toBe(`/run/netns/pa${lab.id}p1`);
    expect(a.ipv4).toBe(`10.250.${lab.id}.2`);
    expect(b.ipv6).toBe(`fd00:10:250:${lab.id}::3`);
    expect(a.ips).toEqual([a.ipv4, a.ipv6]);
    expect(lab.bridge).toBe(`pa${lab.id}br`);
    expect(lab.nftTable).toBe(`probe_agent_lab_${lab.id}`);
    expect(existsSync(a.netns)).toBe(true);
  });

  it('blocks node->pod connections on v4 and v6 and counts them', async () => {
    const before = await lab.nodeToPodDrops();
    expect(await connectFromNode(a.ipv4, 9000)).toBe('timeout');
    expect(await connectFromNode(a.ipv6, 9000)).toBe('timeout');
    expect(await lab.nodeToPodDrops()).toBeGreaterThanOrEqual(before + 2);
  });

  it('lets the pod reach its own addresses and loopback', async () => {
    for (const host of [a.ipv4, a.ipv6, '127.0.0.1', '::1']) {
      const r = await lab.exec(a, process.execPath, connectScript(host, 9000));
      expect(r.stdout.trim(), host).toBe('connected');
    }
  });

  it('lets pods reach each other on v4 and v6', async () => {
    for (const host of [a.ipv4, a.ipv6]) {
      const r = await lab.exec(b, process.execPath, connectScript(host, 9000));
      expect(r.stdout.trim(), host).toBe('connected');
    }
  });

  it('lets replies to pod->node connections through', async () => {
    const server = net.createServer((s) => s.on('error', () => {}).end('hi'));
    server.listen(0, lab.gatewayV4);
    await once(server, 'listening');
    try {
      const port = (server.address() as net.AddressInfo).port;
      const r = await lab.exec(a, process.execPath, connectScript(lab.gatewayV4, port));
      expect(r.stdout.trim()).toBe('connected');
    } finally {
      server.close();
    }
  });

  it('reports exec exit codes and output', async () => {
    const r = await lab.exec(a, 'sh', ['-c', 'echo out; echo err >&2; exit 3']);
    expect(r).toEqual({ code: 3, stdout: 'out\n', stderr: 'err\n' });
  });
});

describe('lab with the reject rule', () => {
  it('resets node->pod TCP at once, counts it, and setPolicy none opens the path', async () => {
    const lab = await createLab({ pods: 1, policy: 'reject' });
    try {
      const [pod] = lab.pods as [LabPod];
      await lab.startServer(pod, { tcp: 0 }).then(async (srv) => {
        const port = srv.ports.tcp!;
        // ECONNREFUSED (not a 2 s timeout) is what shows the reset came at once.
        expect(await connectFromNode(pod.ipv4, port, 2000)).toBe('ECONNREFUSED');
        expect(await connectFromNode(pod.ipv6, port, 2000)).toBe('ECONNREFUSED');
        expect(await lab.nodeToPodDrops()).toBe(2);
        await lab.setPolicy('none');
        expect(await connectFromNode(pod.ipv4, port)).toBe('connected');
        expect(await lab.nodeToPodDrops()).toBe(0);
      });
    } finally {
      await lab.destroy();
    }
  });
});

describe('slots and teardown', () => {
  it('gives parallel labs different slots and leaves nothing behind', async () => {
    const [l1, l2] = await Promise.all([createLab({ pods: 1 }), createLab({ pods: 1 })]);
    expect(l1.id).not.toBe(l2.id);
    expect(l1.pods[0]!.ipv4).not.toBe(l2.pods[0]!.ipv4);
    expect(leftovers(l1.id).length).toBe(1 + 1 + 1 + 1); // netns, bridge, veth, table
    await Promise.all([l1.destroy(), l2.destroy()]);
    await l1.destroy(); // idempotent
    expectNoLeftovers(l1.id);
    expectNoLeftovers(l2.id);
    expect(readOwner(`${SLOTS_DIR}/${l1.id}/owner`)?.pid).not.toBe(process.pid);
  });

  it('cleans up on SIGTERM and reclaims a SIGKILLed owner', async () => {
    const script = (hold: string): string[] => ['--input-type=module', '-e',
      `import { createLab } from ${JSON.stringify(new URL('../lab/lab.ts', import.meta.url).pathname)};` +
      `const lab = await createLab({ pods: 2, tag: 'crash' }); await lab.startServer(lab.pods[0], { tcp: 0 });` +
      `console.log(lab.id); ${hold}`];
    const startChild = async (hold: string): Promise<{ child: ReturnType<typeof spawn>; id: number }> => {
      const child = spawn(process.execPath, script(hold), { stdio: ['ignore', 'pipe', 'inherit'] });
      const [line] = (await once(child.stdout!, 'data')) as [Buffer];
      return { child, id: Number(line.toString().trim()) };
    };

    const term = await startChild('setInterval(() => {}, 1000);');
    expect(leftovers(term.id).length).toBe(2 + 1 + 2 + 1); // netns, bridge, veths, table
    term.child.kill('SIGTERM');
    await once(term.child, 'exit');
    expect(term.child.signalCode).toBe('SIGTERM'); // the handler re-raised the signal after cleaning up
    expectNoLeftovers(term.id);

    const killed = await startChild('setInterval(() => {}, 1000);');
    killed.child.kill('SIGKILL');
    await once(killed.child, 'exit');
    const ownerFile = `${SLOTS_DIR}/${killed.id}/owner`;
    const left = leftovers(killed.id);
    // A crash leaves everything behind (unless a parallel createLab already reclaimed the slot)...
    if (readOwner(ownerFile)?.pid === killed.child.pid) expect(left.length).toBe(6);
    // ...until a sweep (or a createLab that needs the slot) reclaims the dead owner's slot.
    const swept = sweepSlots();
    if (!swept.includes(killed.id)) expect(readOwner(ownerFile)?.pid).not.toBe(killed.child.pid);
    expectNoLeftovers(killed.id);
  });
});

describe('bad input', () => {
  it('rejects bad options and foreign pods with LabError', async () => {
    await expect(createLab({ pods: 0 })).rejects.toBeInstanceOf(LabError);
    await expect(createLab({ policy: 'open' as never })).rejects.toBeInstanceOf(LabError);
    const [l1, l2] = await Promise.all([createLab({ pods: 1 }), createLab({ pods: 1 })]);
    try {
      await expect(l1.startServer(l2.pods[0]!, { http: 0 })).rejects.toThrow(/does not belong/);
      await expect(l1.exec(l2.pods[0]!, 'true', [])).rejects.toBeInstanceOf(LabError);
      await expect(l1.startServer(l1.pods[0]!, { http: 70000 })).rejects.toThrow(/http must be a port/);
      const srv = await l1.startServer(l1.pods[0]!, { tcp: 0 });
      await expect(l1.startServer(l1.pods[0]!, { tcp: srv.ports.tcp! })).rejects.toThrow(/EADDRINUSE/);
      await expect(srv.control('/control/health?ok=2')).rejects.toThrow(/400/);
      await expect(srv.control('no-slash')).rejects.toBeInstanceOf(LabError);
    } finally {
      await Promise.all([l1.destroy(), l2.destroy()]);
    }
  });
});
