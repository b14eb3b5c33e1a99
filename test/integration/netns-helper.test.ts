/**
 * The netns helper end to end: sockets made by the resident helper (a child per socket), its pool
 * of long-lived workers, its warm variant and the per-probe spawn really live in the pod's netns (they reach the pod while the
 * node is blocked, and 127.0.0.1 is the pod's loopback); bad paths fail with clear typed errors;
 * a killed helper fails its in-flight requests and comes back; 200 concurrent requests for two
 * pods each get a socket of their own pod.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft']);

import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, mkdirSync, readdirSync, readFileSync, rmdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import type { Socket } from 'node:net';
import tls from 'node:tls';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigError, HelperError, NetnsError } from '../../agent/errors.ts';
import { LeanSocket } from '../../agent/io/lean-socket.ts';
import { ResidentHelper } from '../../agent/netns/helper.ts';
import { Http1Get } from '../../agent/probe/http-client.ts';
import { buildHeaderMap, buildProbeRequest, requestBytes } from '../../agent/probe/http-request.ts';
import { isHelperReply, resolveHelperPath, type HelperReply } from '../../agent/netns/helper-protocol.ts';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { SpawnHelper } from '../../agent/netns/spawn-helper.ts';
import type { ConnectExchange, SocketFactory, TcpExchangeOutcome } from '../../agent/probe/types.ts';
import { startHostileServer } from '../lab/hostile-server.ts';
import { createLab, type Lab, type LabPod, type RunningServer } from '../lab/lab.ts';
import { processState, waitFor } from '../support/proc-wait.ts';

const HELPER = resolveHelperPath();

interface Echo { remoteAddress: string; url: string }

/** Runs GET /echo over an already connected stream; resolves the pod server's JSON answer. */
function readEcho(stream: Socket | tls.TLSSocket, from: string, timeoutMs = 2000): Promise<Echo> {
  return new Promise((resolve, reject) => {
    let data = '';
    const timer = setTimeout(() => { stream.destroy(); reject(new Error(`timeout talking to ${from}`)); }, timeoutMs);
    stream.once('error', (e) => { clearTimeout(timer); reject(e); });
    stream.on('data', (d: Buffer) => { data += d.toString(); });
    stream.on('end', () => {
      clearTimeout(timer);
      stream.destroy();
      const body = data.slice(data.indexOf('\r\n\r\n') + 4);
      try { resolve(JSON.parse(body) as Echo); } catch { reject(new Error(`not an echo answer: ${data.slice(0, 200)}`)); }
    });
    stream.write(`GET /echo?from=${encodeURIComponent(from)} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`);
  });
}

/** Connects `socket` to host:port, failing after timeoutMs. */
function connectOver(socket: Socket, host: string, port: number, timeoutMs = 2000): Promise<void> {
  return new Promise((resolve, reject) => {
    const fail = (e: Error): void => { clearTimeout(timer); socket.destroy(); reject(e); };
    const timer = setTimeout(() => fail(new Error(`connect to ${host}:${port} timed out`)), timeoutMs);
    socket.once('error', fail);
    socket.connect({ host, port }, () => {
      clearTimeout(timer);
      socket.removeListener('error', fail);
      resolve();
    });
  });
}

/** Connects `socket` to host:port, then runs GET /echo over it. */
async function echoOver(socket: Socket, host: string, port: number, timeoutMs = 2000): Promise<Echo> {
  await connectOver(socket, host, port, timeoutMs);
  return readEcho(socket, host, timeoutMs);
}

/** 'connected' or the error code of a bare connect attempt over `socket`. */
function tryConnect(socket: Socket, host: string, port: number, timeoutMs: number): Promise<string> {
  return new Promise((resolve) => {
    const done = (r: string): void => { socket.destroy(); resolve(r); };
    const timer = setTimeout(() => done('timeout'), timeoutMs);
    socket.once('error', (e: NodeJS.ErrnoException) => { clearTimeout(timer); done(e.code ?? e.message); });
    socket.connect({ host, port }, () => { clearTimeout(timer); done('connected'); });
  });
}

const plain = (a: string): string => a.replace(/^::ffff:/, '');

/** The error createSocket rejects with (fails the test if it resolves). */
async function failure(f: SocketFactory, netns: string, family: 4 | 6 = 4): Promise<Error> {
  const r = await f.createSocket(netns, family).then((s) => { s.destroy(); return undefined; }, (e: Error) => e);
  if (!r) throw new Error(`expected ${netns} to fail`);
  return r;
}

let lab: Lab;
let a: LabPod;
let b: LabPod;
let server: RunningServer;
let loopServer: RunningServer;
let scratch: string;
let resident: ResidentHelper;
let warm: ResidentHelper;
let pool: ResidentHelper;
let spawned: SpawnHelper;

beforeAll(async () => {
  lab = await createLab({ pods: 2, policy: 'drop', tag: 'netns-helper.test' });
  [a, b] = lab.pods as [LabPod, LabPod];
  server = await lab.startServer(a, { http: 0, https: 0 });
  loopServer = await lab.startServer(a, { http: 0, bind: 'loopback' });
  scratch = mkdtempSync(join(tmpdir(), 'pa-helper-test-'));
  resident = await ResidentHelper.start({ allowDirs: [scratch], maxInFlight: 256 });
  warm = await ResidentHelper.start({ warm: true, allowDirs: [scratch] });
  pool = await ResidentHelper.start({ pool: 4, allowDirs: [scratch], maxInFlight: 256 });
  spawned = await SpawnHelper.create({ allowDirs: [scratch] });
});

afterAll(async () => {
  await Promise.all([resident?.close(), warm?.close(), pool?.close()]);
  try { execFileSync('umount', [join(scratch, 'bound')], { stdio: 'ignore' }); } catch { /* not mounted */ }
  if (scratch) rmSync(scratch, { recursive: true, force: true });
  await lab?.destroy();
});

describe.each([
  ['resident', () => resident],
  ['warm', () => warm],
  ['pool', () => pool],
  ['spawn', () => spawned],
] as const)('%s factory', (mode, factory) => {
  it('has its mode name', () => {
    expect(factory().mode).toBe(mode);
  });

  it.each([4, 6] as const)('reaches the pod over IPv%i from inside its netns while the node is blocked', async (family) => {
    const ip = family === 4 ? a.ipv4 : a.ipv6;
    const port = server.ports.http as number;
    const echo = await echoOver(await factory().createSocket(a.netns, family), ip, port);
    // The source address is the pod's own: the connection started inside the pod.
    expect(plain(echo.remoteAddress)).toBe(ip);
    const drops = await lab.nodeToPodDrops();
    expect(await tryConnect(await new NodeSocketFactory().createSocket(undefined, family), ip, port, 300)).toBe('timeout');
    expect(await lab.nodeToPodDrops()).toBeGreaterThan(drops);
  });

  it.each([['127.0.0.1', 4], ['::1', 6]] as const)('reaches the pod loopback server at %s, which the node does not have', async (host, family) => {
    const port = loopServer.ports.http as number;
    const echo = await echoOver(await factory().createSocket(a.netns, family), host, port);
    expect(echo.url).toBe(`/echo?from=${encodeURIComponent(host)}`);
    const fromNode = await echoOver(await new NodeSocketFactory().createSocket(undefined, family), host, port, 500).catch((e: Error) => e);
    expect(fromNode instanceof Error || fromNode.url !== echo.url).toBe(true);
  });

  it('carries TLS: tls.connect({ socket }) over a passed, connected socket', async () => {
    const socket = await factory().createSocket(a.netns, 6);
    await connectOver(socket, a.ipv6, server.ports.https as number);
    const t = tls.connect({ socket, rejectUnauthorized: false });
    await new Promise<void>((resolve, reject) => { t.once('error', reject); t.once('secureConnect', resolve); });
    expect(t.getProtocol()).toMatch(/^TLSv1\.[23]$/);
    const echo = await readEcho(t, a.ipv6);
    expect(plain(echo.remoteAddress)).toBe(a.ipv6);
  });

  it('accepts /proc/<pid>/ns/net of a process inside the pod', async () => {
    const echo = await echoOver(await factory().createSocket(`/proc/${server.pid}/ns/net`, 4), a.ipv4, server.ports.http as number);
    expect(plain(echo.remoteAddress)).toBe(a.ipv4);
  });
});

describe('bad netns references', () => {
  beforeAll(() => {
    symlinkSync(a.netns, join(scratch, 'link'));
    writeFileSync(join(scratch, 'regular'), '');
    mkdirSync(join(scratch, 'dir'));
    execFileSync('mkfifo', [join(scratch, 'fifo')]);
    writeFileSync(join(scratch, 'bound'), '');
    execFileSync('mount', ['--bind', b.netns, join(scratch, 'bound')]);
  });

  it.each([['resident'], ['warm'], ['pool'], ['spawn']] as const)('%s: each refusal is a typed error with a clear message', async (mode) => {
    const f = mode === 'resident' ? resident : mode === 'warm' ? warm : mode === 'pool' ? pool : spawned;
    const cases: [string, NetnsError['kind'], RegExp, string?][] = [
      [`/run/netns/pa-missing-${process.pid}`, 'gone', /^netns "\/run\/netns\/pa-missing-\d+" is gone \(ENOENT\)$/],
      ['/proc/999999999/ns/net', 'gone', /is gone \(ENOENT\)/],
      ['/etc/passwd', 'invalid', /refused: path is not \/proc\/<pid>\/ns\/net nor directly inside an allowed directory/],
      [`${a.netns}/../${a.name}`, 'invalid', /refused: path contains a \. or \.\. component/],
      ['/proc/self/ns/net', 'invalid', /refused: a \/proc path must be \/proc\/<pid>\/ns\/net with a decimal pid/],
      [join(scratch, 'link'), 'invalid', /refused: path is a symbolic link/, 'validate'],
      // What a torn-down sandbox leaves for a moment: its netns file, unmounted.
      [join(scratch, 'regular'), 'gone', /is no longer a mounted namespace$/, 'nstype'],
      [join(scratch, 'dir'), 'invalid', /refused: not a network namespace \(a directory\)/, 'nstype'],
      // A FIFO must be refused without ever being opened for reading (that would block).
      [join(scratch, 'fifo'), 'invalid', /refused: not a network namespace \(a fifo\)/, 'nstype'],
    ];
    for (const [path, kind, message, stage] of cases) {
      const err = await failure(f, path);
      expect(err, path).toBeInstanceOf(NetnsError);
      expect((err as NetnsError).kind, path).toBe(kind);
      expect(err.message, path).toMatch(message);
      expect(err.message, path).toContain(`"${path}"`);
      if (stage) expect((err as NetnsError).context.stage, path).toBe(stage);
    }
  });

  it('accepts a netns bind-mounted in an extra allowed directory (a runtime state dir)', async () => {
    const echo = await echoOver(await resident.createSocket(join(scratch, 'bound'), 4), a.ipv4, server.ports.http as number);
    expect(plain(echo.remoteAddress)).toBe(b.ipv4);
  });

  it('refuses a bad family and a missing netns argument before asking the helper', async () => {
    await expect(resident.createSocket(a.netns, 5 as 4)).rejects.toThrow(HelperError);
    await expect(resident.createSocket(undefined, 4)).rejects.toMatchObject({ kind: 'invalid' });
  });
});

describe('reading a netns\'s addresses (netlink inside the netns, no process run)', () => {
  it.each([['resident'], ['warm'], ['pool']] as const)('%s: returns the pod\'s own global addresses, canonical, and nothing of the node', async (mode) => {
    const h = mode === 'resident' ? resident : mode === 'warm' ? warm : pool;
    const addrs = await h.readAddresses(a.netns);
    expect(addrs).toContain(a.ipv4);
    expect(addrs).toContain(a.ipv6);
    expect(addrs).not.toContain(b.ipv4);
    // Loopback and link-local are the same in every netns: never reported.
    expect(addrs.some((x) => x === '127.0.0.1' || x === '::1' || x.startsWith('fe80:'))).toBe(false);
    expect(await h.readAddresses(`/proc/${server.pid}/ns/net`)).toEqual(addrs);
  });

  it('refuses what createSocket refuses, with the same typed errors', async () => {
    await expect(resident.readAddresses(`/run/netns/pa-missing-${process.pid}`)).rejects.toMatchObject({ kind: 'gone' });
    await expect(resident.readAddresses('/etc/passwd')).rejects.toMatchObject({ kind: 'invalid' });
    await expect(resident.readAddresses(join(scratch, 'regular'))).rejects.toMatchObject({ kind: 'gone' });
  });
});

const residentOf = (mode: 'resident' | 'warm' | 'pool'): ResidentHelper => (mode === 'resident' ? resident : mode === 'warm' ? warm : pool);

/** Pod a's server seen from inside it: its IPv4 and IPv6 addresses, and its loopback (another server). */
function podTargets(): (readonly [4 | 6, string, number])[] {
  const port = server.ports.http as number;
  const loopPort = loopServer.ports.http as number;
  return [[4, a.ipv4, port], [6, a.ipv6, port], [4, '127.0.0.1', loopPort], [6, '::1', loopPort]];
}

describe('op "tcp": the TCP probe in the helper\'s child', () => {
  it.each([['resident'], ['warm'], ['pool']] as const)('%s: connects inside the pod (v4, v6, its loopback) while the node is blocked; closed ports are refused', async (mode) => {
    const h = residentOf(mode);
    const port = server.ports.http as number;
    const drops = await lab.nodeToPodDrops();
    for (const [family, ip, p] of podTargets()) {
      expect(await h.connectProbe(a.netns, { family, ip, port: p, timeoutMs: 2000 }), ip).toMatchObject({ outcome: 'connected' });
    }
    // Nothing went from the node to the pod: the connects happened inside it.
    expect(await lab.nodeToPodDrops()).toBe(drops);
    const refused = await h.connectProbe(b.netns, { family: 4, ip: b.ipv4, port, timeoutMs: 2000 });
    expect(refused).toMatchObject({ outcome: 'error', code: 'ECONNREFUSED' });
  });

  it('refuses bad requests with typed errors: a gone netns, an ip of the wrong family, a bad port', async () => {
    await expect(resident.connectProbe(`/run/netns/pa-missing-${process.pid}`, { family: 4, ip: a.ipv4, port: 80, timeoutMs: 1000 })).rejects.toMatchObject({ kind: 'gone' });
    await expect(resident.connectProbe(a.netns, { family: 4, ip: a.ipv6, port: 80, timeoutMs: 1000 })).rejects.toThrow(/ip is not an IPv4 address/);
    await expect(resident.connectProbe(a.netns, { family: 4, ip: a.ipv4, port: 0, timeoutMs: 1000 })).rejects.toThrow(HelperError);
    // Beyond the helper's bound the probe takes the socket route instead.
    expect(await resident.connectProbe(a.netns, { family: 4, ip: a.ipv4, port: 80, timeoutMs: 3_600_001 })).toBeUndefined();
  });

  it('reports each answered TCP probe to onRequest (the spawn histogram) with the helper\'s share only', async () => {
    const seen: [number, boolean][] = [];
    const h = await ResidentHelper.start({ onRequest: (sec, ok) => seen.push([sec, ok]) });
    try {
      seen.length = 0; // the self-test's socket
      const out = await h.connectProbe(a.netns, { family: 4, ip: a.ipv4, port: server.ports.http as number, timeoutMs: 2000 });
      expect(out).toMatchObject({ outcome: 'connected' });
      expect(seen).toHaveLength(1);
      expect(seen[0]?.[1]).toBe(true);
      expect(seen[0]?.[0]).toBeCloseTo(out?.helperSeconds ?? -1, 6);
    } finally {
      await h.close();
    }
  });
});

describe('op "connect": the connect in the helper\'s child, the connection handed over', () => {
  it.each([['resident'], ['warm'], ['pool']] as const)('%s: a connection made inside the pod (v4, v6, its loopback) while the node is blocked carries a request', async (mode) => {
    const h = residentOf(mode);
    const drops = await lab.nodeToPodDrops();
    for (const [family, ip, p] of podTargets()) {
      const out = await h.connectSocket(a.netns, { family, ip, port: p, timeoutMs: 2000 });
      if (out?.outcome !== 'connected') throw new Error(`${ip}: ${JSON.stringify(out)}`);
      expect(out.won).toBe(0);
      // Made connected in the pod: Node never connects it, yet it reads and writes at once.
      expect(out.socket.connecting).toBe(false);
      expect(plain((await readEcho(out.socket, ip)).remoteAddress), ip).toBe(ip === '127.0.0.1' || ip === '::1' ? ip : family === 4 ? a.ipv4 : a.ipv6);
    }
    expect(await lab.nodeToPodDrops()).toBe(drops);
  });

  it('a connection handed over moves onto the lean read path and carries the HTTP probe\'s exchange (request bytes in one write, our reader)', async () => {
    const out = await pool.connectSocket(a.netns, { family: 4, ip: a.ipv4, port: server.ports.http as number, timeoutMs: 2000 });
    if (out?.outcome !== 'connected') throw new Error(JSON.stringify(out));
    const channel = LeanSocket.take(out.socket);
    expect(channel.lean).toBe(true);
    const req = buildProbeRequest('HTTP', a.ipv4, server.ports.http as number, `/echo?from=${a.ipv4}`, buildHeaderMap([], '1.33'));
    const get = new Http1Get(channel, requestBytes(req), new AbortController().signal, () => 10 * 1024);
    try {
      const res = await get.outcome;
      expect(res.head.status).toBe(200);
      expect((JSON.parse(res.body?.toString() ?? '') as Echo).remoteAddress).toMatch(a.ipv4);
    } finally {
      channel.destroy();
    }
  });

  it('answers a refused or blackholed target with its outcome and hands nothing over; Happy Eyeballs hands over the winner', async () => {
    const port = server.ports.http as number;
    expect(await pool.connectSocket(b.netns, { family: 4, ip: b.ipv4, port, timeoutMs: 2000 })).toMatchObject({ outcome: 'error', code: 'ECONNREFUSED' });
    // 192.0.2.1 (TEST-NET-1) is routed nowhere from the pod: the connect waits out its timeout in the child.
    const t0 = performance.now();
    const late = await pool.connectSocket(a.netns, { family: 4, ip: '192.0.2.1', port, timeoutMs: 300 }).catch((e: Error) => e);
    expect(late, String(late)).toMatchObject({ outcome: expect.stringMatching(/^(timeout|error)$/) });
    expect(late).not.toHaveProperty('socket');
    expect(performance.now() - t0).toBeLessThan(2000);
    // The first address (pod b, nothing listening there) refuses at once; the second (the other family) connects and is the one handed over.
    const he = await pool.connectSocket(a.netns, { family: 6, ip: b.ipv6, port, timeoutMs: 2000, second: { family: 4, ip: a.ipv4, staggerMs: 250 } });
    if (he?.outcome !== 'connected') throw new Error(JSON.stringify(he));
    expect(he.won).toBe(1);
    expect(plain((await readEcho(he.socket, a.ipv4)).remoteAddress)).toBe(a.ipv4);
  });

  it('leaks no connection when the caller gives up before the answer: the agent closes the one that arrives late', async () => {
    // A server of its own: the only connection its port ever sees is this test's.
    const own = await lab.startServer(a, { http: 0 });
    const port = own.ports.http as number;
    try {
      const ac = new AbortController();
      const p = pool.connectSocket(a.netns, { family: 4, ip: a.ipv4, port, timeoutMs: 2000 }, ac.signal);
      ac.abort(new Error('caller gave up'));
      await expect(p).rejects.toThrow('caller gave up');
      // Both ends live in the pod's netns: once the connection was made, none of its ends may stay established.
      const states = async (): Promise<string[]> => (await lab.exec(a, 'ss', ['-Htan', `( sport = :${port} or dport = :${port} )`])).stdout
        .split('\n').map((l) => l.trim().split(/\s+/)[0] ?? '').filter((x) => x !== '' && x !== 'LISTEN');
      let seen = await states();
      for (let i = 0; i < 60 && (seen.length === 0 || seen.includes('ESTAB')); i++) {
        await new Promise((r) => setTimeout(r, 50));
        seen = await states();
      }
      expect(seen.length, 'the connection was made').toBeGreaterThan(0);
      expect(seen).not.toContain('ESTAB');
    } finally {
      await own.stop();
    }
  });
});

describe('op "connect" with send: the child writes the request and reads the answer\'s first octets', () => {
  const get = (path: string, close: boolean): Buffer => Buffer.from(`GET ${path} HTTP/1.1\r\nHost: x\r\n${close ? 'Connection: close\r\n' : ''}\r\n`);
  /** The body of a whole HTTP/1.1 answer with a Content-Length (the lab server's). */
  const bodyOf = (answer: string): string => answer.slice(answer.indexOf('\r\n\r\n') + 4);
  /** What a connection still brings until its end (or reset, whose code comes back). */
  const rest = (socket: Socket): Promise<{ data: string; code?: string }> => new Promise((resolve) => {
    let data = '';
    socket.on('data', (d: Buffer) => (data += d.toString('latin1')));
    socket.once('end', () => { socket.destroy(); resolve({ data }); });
    socket.once('error', (e: NodeJS.ErrnoException) => resolve({ data, code: e.code }));
  });
  /**
   * The whole of what the peer sent and how it ended, from the exchange and, when the child handed
   * the connection over (the peer's end came after the child's quiet wait: a loaded machine), from
   * the connection: the two routes must add up to the same stream.
   */
  const whole = async (out: TcpExchangeOutcome | undefined): Promise<{ data: string; end: string }> => {
    if (out?.outcome !== 'connected' || !out.exchange) throw new Error(JSON.stringify(out));
    const first = out.exchange.data.toString('latin1');
    const ended = out.exchange.ended;
    if (!out.socket) return { data: first, end: ended && 'code' in ended ? ended.code : 'eof' };
    const more = await rest(out.socket);
    return { data: first + more.data, end: more.code ?? 'eof' };
  };

  it.each([['resident'], ['warm'], ['pool']] as const)('%s: writes the request in the pod and reads the answer to the peer\'s end', async (mode) => {
    const send = get(`/echo?from=${a.ipv4}`, true);
    const out = await residentOf(mode).connectExchange(a.netns, { family: 4, ip: a.ipv4, port: server.ports.http as number, timeoutMs: 2000 }, send);
    expect(out).toMatchObject({ outcome: 'connected', exchange: { sent: send.length } });
    const got = await whole(out);
    expect(got.end).toBe('eof');
    expect(got.data).toMatch(/^HTTP\/1\.1 200 OK\r\n/);
    // Written inside the pod: the server saw the pod's own address.
    expect((JSON.parse(bodyOf(got.data)) as Echo).remoteAddress).toMatch(a.ipv4);
    const ex = (out as { exchange: ConnectExchange }).exchange;
    expect(ex.firstByteSeconds).toBeGreaterThanOrEqual(0);
    expect(ex.seconds).toBeGreaterThanOrEqual(ex.firstByteSeconds!);
  });

  it('a peer that ends before any answer: the end is in the answer line and no connection is handed over', async () => {
    // The lab's TCP port ends every connection at once; the child waits for anything but the deadline.
    const tcp = await lab.startServer(a, { tcp: 0 });
    try {
      const out = await pool.connectExchange(a.netns, { family: 4, ip: a.ipv4, port: tcp.ports.tcp as number, timeoutMs: 2000 }, get('/', true));
      if (out?.outcome !== 'connected') throw new Error(JSON.stringify(out));
      expect(out.socket).toBeUndefined();
      expect(out.exchange).toMatchObject({ ended: { eof: true }, data: Buffer.alloc(0) });
      expect(out.exchange!.firstByteSeconds).toBeUndefined();
    } finally {
      await tcp.stop();
    }
  });

  it('a peer that keeps the connection: it comes back with the octets read, live for the caller\'s next write', async () => {
    const send = get(`/echo?from=${a.ipv4}`, false);
    const out = await pool.connectExchange(a.netns, { family: 4, ip: a.ipv4, port: server.ports.http as number, timeoutMs: 2000 }, send);
    if (out?.outcome !== 'connected' || !out.socket) throw new Error(JSON.stringify(out));
    expect(out.exchange).toMatchObject({ sent: send.length });
    expect(out.exchange!.ended).toBeUndefined();
    expect(out.exchange!.data.toString('latin1')).toMatch(/^HTTP\/1\.1 200 OK\r\n/);
    // The same connection carries a second request.
    expect(plain((await readEcho(out.socket, a.ipv4)).remoteAddress)).toBe(a.ipv4);
  });

  it('a silent peer: the connection comes back at the timeout, nothing read; a reset mid-answer: the octets before it, then its errno', async () => {
    const hang = await lab.startServer(a, { hang: 0 });
    const hostile = await startHostileServer(a.name, { resetMidBody: 0 });
    try {
      const t0 = performance.now();
      const silent = await pool.connectExchange(a.netns, { family: 4, ip: a.ipv4, port: hang.ports.hang as number, timeoutMs: 300 }, get('/', true));
      if (silent?.outcome !== 'connected' || !silent.socket) throw new Error(JSON.stringify(silent));
      silent.socket.destroy();
      expect(silent.exchange).toMatchObject({ data: Buffer.alloc(0) });
      expect(silent.exchange!.firstByteSeconds).toBeUndefined();
      expect(silent.exchange!.seconds).toBeGreaterThan(0.2);
      expect(performance.now() - t0).toBeGreaterThanOrEqual(300);
      const reset = await whole(await pool.connectExchange(a.netns, { family: 4, ip: a.ipv4, port: hostile.ports.resetMidBody as number, timeoutMs: 2000 }, get('/', true)));
      expect(reset).toEqual({ data: expect.stringMatching(/^HTTP\/1\.1 200 OK\r\n[^]*\r\n\r\npartial$/), end: 'ECONNRESET' });
    } finally {
      await Promise.all([hang.stop(), hostile.stop()]);
    }
  });

  it('a request too long for the helper\'s line goes unsent: the connection comes back for the caller to write it all', async () => {
    const send = get(`/echo?pad=${'p'.repeat(5000)}`, true);
    const out = await pool.connectExchange(a.netns, { family: 4, ip: a.ipv4, port: server.ports.http as number, timeoutMs: 2000 }, send);
    if (out?.outcome !== 'connected' || !out.socket) throw new Error(JSON.stringify(out));
    expect(out.exchange).toBeUndefined();
    out.socket.destroy();
  });
});

describe('resident helper lifecycle', () => {
  it('fails an in-flight request when the helper is killed, then restarts and serves the next one', async () => {
    const restarts: string[] = [];
    const h = await ResidentHelper.start({ onRestart: (r) => restarts.push(r), restartBackoffMs: { initial: 20, max: 100 } });
    try {
      const pid = h.stats().pid as number;
      // Stopped, it cannot answer: the request is surely in flight when SIGKILL lands.
      process.kill(pid, 'SIGSTOP');
      const inFlight = h.createSocket(a.netns, 4);
      await waitFor(() => h.stats().inFlight === 1, 5000);
      // Requests leave at the end of the event loop's turn (one write for all of that turn's).
      await new Promise((r) => setImmediate(r));
      process.kill(pid, 'SIGKILL');
      await expect(inFlight).rejects.toThrow(/^netns helper exited \(signal SIGKILL\) before answering$/);
      const echo = await echoOver(await h.createSocket(a.netns, 4), a.ipv4, server.ports.http as number);
      expect(plain(echo.remoteAddress)).toBe(a.ipv4);
      expect(h.stats()).toMatchObject({ restarts: 1, inFlight: 0 });
      expect(h.stats().pid).not.toBe(pid);
      expect(restarts).toEqual(['netns helper exited (signal SIGKILL)']);
    } finally {
      await h.close();
    }
  });

  it('times out a request a stuck helper never answers, then replaces that helper', async () => {
    const h = await ResidentHelper.start({ requestTimeoutMs: 150, restartBackoffMs: { initial: 20, max: 100 } });
    try {
      const pid = h.stats().pid as number;
      process.kill(pid, 'SIGSTOP');
      await expect(h.createSocket(a.netns, 4)).rejects.toThrow(/^netns helper did not answer within 150 ms$/);
      expect(await waitFor(() => h.stats().restarts === 1 && h.stats().pid !== undefined, 2000)).toBe(true);
      expect(processState(pid)).toBeUndefined();
      const echo = await echoOver(await h.createSocket(a.netns, 4), a.ipv4, server.ports.http as number);
      expect(plain(echo.remoteAddress)).toBe(a.ipv4);
      expect(h.stats()).toMatchObject({ failures: 1, inFlight: 0 });
    } finally {
      await h.close();
    }
  });

  it('rejects an aborted request at once and drops the socket that arrives later', async () => {
    const h = await ResidentHelper.start();
    try {
      const pid = h.stats().pid as number;
      const fds = readdirSync('/proc/self/fd').length;
      process.kill(pid, 'SIGSTOP');
      const aborted = new AbortController();
      const p = h.createSocket(a.netns, 6, aborted.signal);
      aborted.abort(new Error('probe deadline'));
      await expect(p).rejects.toThrow('probe deadline');
      await expect(h.createSocket(a.netns, 4, aborted.signal)).rejects.toThrow('probe deadline');
      process.kill(pid, 'SIGCONT');
      // The late answer carries a socket: it must be closed, not leaked.
      await new Promise((r) => setTimeout(r, 200));
      expect(readdirSync('/proc/self/fd').length).toBeLessThanOrEqual(fds);
      expect(h.stats()).toMatchObject({ failures: 0, inFlight: 0, restarts: 0 });
    } finally {
      await h.close();
    }
  });

  it('reports each settled request to onRequest, and a throwing callback breaks nothing', async () => {
    const seen: boolean[] = [];
    const h = await ResidentHelper.start({
      onRequest: (seconds, ok) => {
        seen.push(ok);
        expect(seconds).toBeGreaterThan(0);
        throw new Error('metrics bug');
      },
    });
    try {
      (await h.createSocket(a.netns, 4)).destroy();
      await expect(h.createSocket(`/run/netns/pa-missing-${process.pid}`, 4)).rejects.toMatchObject({ kind: 'gone' });
      // The self-test, the socket, the gone netns.
      expect(seen).toEqual([true, true, false]);
    } finally {
      await h.close();
    }
  });

  it('refuses requests beyond maxInFlight at once', async () => {
    const h = await ResidentHelper.start({ maxInFlight: 2 });
    try {
      process.kill(h.stats().pid as number, 'SIGSTOP');
      const first = [h.createSocket(a.netns, 4), h.createSocket(a.netns, 4)];
      await expect(h.createSocket(a.netns, 4)).rejects.toThrow(/overloaded: 2 requests in flight/);
      process.kill(h.stats().pid as number, 'SIGCONT');
      for (const s of await Promise.all(first)) s.destroy();
    } finally {
      await h.close();
    }
  });

  it('sends at most maxSent requests to the helper at once; the rest wait their turn, in order, and succeed', async () => {
    const h = await ResidentHelper.start({ maxInFlight: 8, maxSent: 2 });
    try {
      const spawned0 = h.stats().spawned;
      process.kill(h.stats().pid as number, 'SIGSTOP');
      const all = Array.from({ length: 5 }, () => h.createSocket(a.netns, 4));
      await new Promise((r) => setTimeout(r, 100));
      // Two children asked for; three requests wait on the agent's side, none refused.
      expect(h.stats().spawned - spawned0).toBe(2);
      expect(h.stats().inFlight).toBe(5);
      process.kill(h.stats().pid as number, 'SIGCONT');
      for (const s of await Promise.all(all)) s.destroy();
      expect(h.stats().spawned - spawned0).toBe(5);
    } finally {
      await h.close();
    }
  });

  it('close() stops the helper and rejects what is pending', async () => {
    const h = await ResidentHelper.start();
    const pid = h.stats().pid as number;
    process.kill(pid, 'SIGSTOP');
    const pending = h.createSocket(a.netns, 4).then(() => 'resolved', (e: Error) => e);
    process.kill(pid, 'SIGCONT');
    await h.close();
    expect(await pending).toBeInstanceOf(HelperError);
    expect(await waitFor(() => processState(pid) === undefined, 2000)).toBe(true);
    await expect(h.createSocket(a.netns, 4)).rejects.toThrow('netns helper is closed');
  });

  it('exits when the agent dies (no orphan helper)', async () => {
    const script = `import { ResidentHelper } from ${JSON.stringify(new URL('../../agent/netns/helper.ts', import.meta.url).pathname)};
      const h = await ResidentHelper.start(); console.log(h.stats().pid); setInterval(() => {}, 1000);`;
    const agent = spawn(process.execPath, ['--input-type=module', '-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
    const helperPid = await new Promise<number>((resolve) => agent.stdout.once('data', (d: Buffer) => resolve(Number(String(d).trim()))));
    expect(processState(helperPid)).toMatch(/[RS]/);
    agent.kill('SIGKILL');
    expect(await waitFor(() => { const s = processState(helperPid); return s === undefined || s === 'Z'; }, 3000)).toBe(true);
  });

  it('start() rejects with a clear HelperError when the binary is missing or broken', async () => {
    await expect(ResidentHelper.start({ helperPath: '/nonexistent/probe-agent-netns-helper' })).rejects.toThrow(
      /^netns helper binary "\/nonexistent\/probe-agent-netns-helper" is not usable \(ENOENT\): build it with 'make helper'/);
    await expect(ResidentHelper.start({ helperPath: '/bin/false' })).rejects.toThrow(
      /^netns helper self-test failed: (netns helper exited \(code 1\)|cannot send a request to the netns helper: (write EPIPE|channel closed))/);
    await expect(SpawnHelper.create({ helperPath: '/nonexistent/x' })).rejects.toThrow(HelperError);
    await expect(new SpawnHelper({ helperPath: '/nonexistent/x' }).createSocket(a.netns, 4)).rejects.toThrow(/cannot run the netns helper "\/nonexistent\/x": .*ENOENT/);
  });
});

/** Runs `probe-agent-netns-helper --once` itself on an IPC channel: the C side's own answer, no TS checks in front. */
function helperOnce(args: string[]): Promise<{ reply?: HelperReply; code: number | null; stderr: string }> {
  return new Promise((resolve) => {
    const child = spawn(HELPER, ['--once', '--family', '4', ...args], { stdio: ['ignore', 'ignore', 'pipe', 'ipc'], serialization: 'json', env: {} });
    let reply: HelperReply | undefined;
    let stderr = '';
    child.stderr?.on('data', (d: Buffer) => { stderr += d.toString(); });
    child.on('message', (msg: unknown, handle: unknown) => {
      if (isHelperReply(msg)) reply = msg;
      (handle as { close?: () => void } | undefined)?.close?.();
    });
    child.on('close', (code) => resolve({ reply, code, stderr }));
  });
}

describe('a host procfs mounted elsewhere (--proc-root)', () => {
  let hostProc: string;
  let mounted = false;
  let h: ResidentHelper | undefined;

  beforeAll(() => {
    // What a DaemonSet gets from a hostPath /proc volume at /host/proc.
    hostProc = mkdtempSync(join(tmpdir(), 'pa-host-proc-'));
    execFileSync('mount', ['--bind', '/proc', hostProc]);
    mounted = true;
  });

  afterAll(async () => {
    await h?.close();
    if (mounted) {
      execFileSync('umount', [hostProc]);
      mounted = false;
    }
    // Never a recursive rm here: a mistake would walk the real /proc.
    if (hostProc) rmdirSync(hostProc);
  });

  it('makes sockets from <proc root>/<pid>/ns/net in every mode and passes the root to the helper', async () => {
    h = await ResidentHelper.start({ procRoot: hostProc });
    const warmRooted = await ResidentHelper.start({ procRoot: `${hostProc}/`, warm: true });
    const poolRooted = await ResidentHelper.start({ procRoot: hostProc, pool: 2 });
    try {
      const spawnRooted = await SpawnHelper.create({ procRoot: hostProc });
      for (const f of [h, warmRooted, poolRooted, spawnRooted]) {
        const echo = await echoOver(await f.createSocket(`${hostProc}/${server.pid}/ns/net`, 4), a.ipv4, server.ports.http as number);
        expect(plain(echo.remoteAddress), f.mode).toBe(a.ipv4);
      }
      for (const pid of [h.stats().pid, warmRooted.stats().pid]) {
        const argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
        expect(argv.slice(argv.indexOf('--proc-root'), argv.indexOf('--proc-root') + 2)).toEqual(['--proc-root', hostProc]);
      }
    } finally {
      await Promise.all([warmRooted.close(), poolRooted.close()]);
    }
  });

  it('refuses /proc/<pid>/ns/net: only the configured proc root names processes', async () => {
    h ??= await ResidentHelper.start({ procRoot: hostProc });
    const err = await failure(h, `/proc/${server.pid}/ns/net`);
    expect(err).toBeInstanceOf(NetnsError);
    expect(err.message).toBe(`netns "/proc/${server.pid}/ns/net" refused: a /proc path is refused: the proc root is ${hostProc}`);
    const self = await failure(h, `${hostProc}/self/ns/net`);
    expect(self.message).toContain(`a ${hostProc} path must be ${hostProc}/<pid>/ns/net with a decimal pid`);
    // The helper refuses on its own too (the TS check in front is only a mirror).
    const c = await helperOnce(['--proc-root', hostProc, '--netns', `/proc/${server.pid}/ns/net`]);
    expect(c.reply).toMatchObject({ ok: false, stage: 'validate', error: `a /proc path is refused: the proc root is ${hostProc}` });
    const ok = await helperOnce(['--proc-root', hostProc, '--netns', `${hostProc}/${server.pid}/ns/net`]);
    expect(ok.reply).toMatchObject({ ok: true });
    // Without --proc-root the same /proc path is fine: the default root is /proc.
    expect((await helperOnce(['--netns', `/proc/${server.pid}/ns/net`])).reply).toMatchObject({ ok: true });
  });

  it('refuses a proc root that is not a procfs mount, in the agent and in the helper', async () => {
    const notProc = mkdtempSync(join(tmpdir(), 'pa-not-proc-'));
    try {
      await expect(ResidentHelper.start({ procRoot: notProc })).rejects.toThrow(ConfigError);
      await expect(ResidentHelper.start({ procRoot: notProc })).rejects.toThrow(`proc root "${notProc}" is not a procfs mount`);
      await expect(SpawnHelper.create({ procRoot: notProc })).rejects.toThrow('is not a procfs mount');
      const c = await helperOnce(['--proc-root', notProc, '--netns', `${notProc}/1/ns/net`]);
      expect(c.code).toBe(2);
      expect(c.reply).toBeUndefined();
      expect(c.stderr).toContain(`--proc-root ${notProc}: not a procfs mount`);
      await expect(ResidentHelper.start({ procRoot: '/' })).rejects.toThrow('proc root may not be / or under /proc');
    } finally {
      rmdirSync(notProc);
    }
  });
});

it.each([['resident'], ['pool']] as const)('%s: 200 concurrent requests for two pods each get a socket of their own pod', async (mode) => {
  const h = mode === 'pool' ? pool : resident;
  const pods = [a, b];
  const port = server.ports.http as number;
  const results = await Promise.all(Array.from({ length: 200 }, async (_, i) => {
    const pod = pods[i % 2] as LabPod;
    const family = (i % 4 < 2 ? 4 : 6) as 4 | 6;
    const socket = await h.createSocket(pod.netns, family);
    const echo = await echoOver(socket, family === 4 ? a.ipv4 : a.ipv6, port, 10_000);
    return plain(echo.remoteAddress) === (family === 4 ? pod.ipv4 : pod.ipv6);
  }));
  expect(results.filter((ok) => !ok)).toHaveLength(0);
  expect(results).toHaveLength(200);
  expect(h.stats().inFlight).toBe(0);
}, 60_000);
