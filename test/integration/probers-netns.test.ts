/**
 * The probers through the real in-netns path: sockets made inside lab pods by the resident netns
 * helper, while the node itself is cut off from the pods by the lab's node->pod drop rule. Every
 * kubelet rule again, on both address families, plus Happy Eyeballs and the host-field policy.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'openssl']);

import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ResidentHelper } from '../../agent/netns/helper.ts';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { runProbe } from '../../agent/probe/run.ts';
import type { HttpGetHandler, ProbeContext, ProbeHandler, ProbeOutcome, SocketFactory, TcpTarget } from '../../agent/probe/types.ts';
import { createLab, type Lab, type LabPod, type RunningServer } from '../lab/lab.ts';

let lab: Lab;
let helper: ResidentHelper;
const nodeSockets = new NodeSocketFactory();
/** Pod A: every port, dual-stack. Pod B: HTTP on loopback only. Pod C: Happy Eyeballs cases. */
let podA: LabPod;
let podB: LabPod;
let podC: LabPod;
let srvA: RunningServer;
let srvB: RunningServer;
let srvC: RunningServer;
let v6OnlyPort = 0;
let v6Only: ChildProcessWithoutNullStreams | undefined;
let nodeServer: http.Server | undefined;
let nodeServerPort = 0;
let nodeServerPeer = '';

beforeAll(async () => {
  lab = await createLab({ pods: 3, policy: 'drop', tag: 'probers-netns.test' });
  [podA, podB, podC] = lab.pods as [LabPod, LabPod, LabPod];
  helper = await ResidentHelper.start();
  [srvA, srvB, srvC] = await Promise.all([
    lab.startServer(podA, { http: 0, https: 0, tcp: 0, grpc: 0, hang: 0, grpcServices: { '': 'SERVING', db: 'NOT_SERVING' } }),
    lab.startServer(podB, { http: 0, bind: 'loopback' }),
    lab.startServer(podC, { http: 0 }),
  ]);
  v6OnlyPort = await startV6OnlyServer(podC);
  // Pod C drops its own IPv4 SYNs to its HTTP port: the primary family hangs, so Happy Eyeballs must stagger.
  const drop = await lab.exec(podC, 'nft', ['-f', '-'], {
    input: `table inet probers_he {\n  chain out {\n    type filter hook output priority 0;\n    ip daddr ${podC.ipv4} tcp dport ${srvC.ports.http} drop\n  }\n}\n`,
  });
  expect(drop.code, drop.stderr).toBe(0);
  // A server on the node's side of the lab bridge: the legacy host-field path must reach it from the node.
  nodeServer = http.createServer((req, res) => {
    nodeServerPeer = req.socket.remoteAddress ?? '';
    res.end('node');
  });
  await new Promise<void>((r) => nodeServer?.listen(0, lab.gatewayV4, r));
  nodeServerPort = (nodeServer.address() as AddressInfo).port;
});

afterAll(async () => {
  v6Only?.stdin.end();
  v6Only?.kill('SIGKILL');
  nodeServer?.closeAllConnections();
  nodeServer?.close();
  await helper?.close();
  await lab?.destroy();
});

/** A tiny HTTP server bound to :: with IPV6_V6ONLY inside `pod`: its IPv4 port is closed. */
async function startV6OnlyServer(pod: LabPod): Promise<number> {
  const script = `const s=require('node:http').createServer((q,r)=>r.end('v6only'));
s.listen({port:0,host:'::',ipv6Only:true},()=>console.log(s.address().port));
process.stdin.on('end',()=>process.exit(0));process.stdin.resume();`;
  v6Only = spawn('ip', ['netns', 'exec', pod.name, process.execPath, '-e', script]);
  const line = await new Promise<string>((resolve, reject) => {
    createInterface({ input: v6Only!.stdout }).once('line', resolve);
    v6Only!.once('exit', (code) => reject(new Error(`v6-only server exited with ${code}`)));
  });
  return Number(line);
}

function ctx(pod: LabPod, over: Partial<ProbeContext> = {}): ProbeContext {
  return {
    netns: pod.netns, podIPs: pod.ips, timeoutSeconds: 1, sockets: helper, nodeSockets,
    kubeVersion: '1.34', hostFieldPolicy: 'refuse', happyEyeballs: false, ...over,
  };
}
const get = (port: number, path: string, over: Partial<HttpGetHandler> = {}): HttpGetHandler => ({ kind: 'http', port, path, scheme: 'HTTP', headers: [], ...over });
const probe = (h: ProbeHandler, c: ProbeContext): Promise<ProbeOutcome> => runProbe(h, c);

describe('the node is cut off, the netns path is not', () => {
  it('from the node (kubelet\'s path) the pod is unreachable; from inside its netns it answers', async () => {
    const drops = await lab.nodeToPodDrops();
    const fromNode = await probe({ kind: 'tcp', port: srvA.ports.tcp as number }, ctx(podA, { netns: undefined, sockets: nodeSockets }));
    expect(fromNode).toMatchObject({ result: 'failure', reason: 'timeout', message: `dial tcp ${podA.ipv4}:${srvA.ports.tcp}: i/o timeout` });
    expect(await lab.nodeToPodDrops()).toBeGreaterThan(drops);
    const inside = await probe({ kind: 'tcp', port: srvA.ports.tcp as number }, ctx(podA));
    expect(inside).toMatchObject({ result: 'success', address: `${podA.ipv4}:${srvA.ports.tcp}` });
    expect(inside.phases.helper).toBeGreaterThan(0);
  });

  it('the request comes from the pod\'s own address', async () => {
    const out = await probe(get(srvA.ports.http as number, '/echo'), ctx(podA));
    expect(JSON.parse(out.message)).toMatchObject({ remoteAddress: `::ffff:${podA.ipv4}` });
  });
});

describe.each([
  ['IPv4 primary', (p: LabPod) => [p.ipv4, p.ipv6]],
  ['IPv6 primary', (p: LabPod) => [p.ipv6, p.ipv4]],
])('kubelet rules in the netns, %s', (_name, order) => {
  const c = (over: Partial<ProbeContext> = {}): ProbeContext => ctx(podA, { podIPs: order(podA), ...over });
  const primary = (): string => order(podA)[0] as string;
  const authority = (port: number): string => (primary().includes(':') ? `[${primary()}]:${port}` : `${primary()}:${port}`);

  it('HTTP 200 with kubelet\'s headers; the failure body never shows', async () => {
    const port = srvA.ports.http as number;
    const ok = await probe(get(port, '/echo?x=1', { headers: [{ name: 'x-probe', value: 'a' }, { name: 'X-PROBE', value: 'b' }] }), c());
    expect(ok.result).toBe('success');
    const echo = JSON.parse(ok.message) as { url: string; rawHeaders: string[] };
    expect(echo.url).toBe('/echo?x=1');
    // Go's bytes: Host first, Connection: close last (net/http transport.go persistConn.roundTrip puts it in
    // extraHeaders when DisableKeepAlives, which Request.write writes after the header map; undici wrote both first).
    expect(echo.rawHeaders).toEqual(['Host', authority(port), 'User-Agent', 'kube-probe/1.34', 'Accept', '*/*', 'X-Probe', 'a', 'X-Probe', 'b', 'Connection', 'close']);
    const secret = await probe(get(port, '/secret'), c());
    expect(secret).toMatchObject({ result: 'failure', reason: 'status', message: 'HTTP probe failed with statuscode: 500' });
    expect(JSON.stringify(secret)).not.toContain('TOP-SECRET');
  });

  it('HTTP redirects: same host followed, other host a warning, a loop a failure', async () => {
    const port = srvA.ports.http as number;
    expect((await probe(get(port, `/redirect?to=${encodeURIComponent('/healthz')}`), c())).result).toBe('success');
    const other = await probe(get(port, `/redirect?to=${encodeURIComponent(`http://${podB.ipv4}:${port}/`)}&code=301`), c());
    expect(other).toMatchObject({ result: 'warning' });
    expect(other.message).toMatch(/^Probe terminated redirects, Response body: redirect to /);
    expect(await probe(get(port, '/loop'), c())).toMatchObject({ result: 'failure', reason: 'redirects', message: 'Get "/loop": stopped after 10 redirects' });
  });

  it('HTTPS with the lab\'s self-signed certificate', async () => {
    const out = await probe(get(srvA.ports.https as number, '/healthz', { scheme: 'HTTPS' }), c());
    expect(out).toMatchObject({ result: 'success', message: 'ok' });
    expect(out.phases.tls).toBeGreaterThan(0);
  });

  it('TCP: open, closed, and a port that accepts and never speaks', async () => {
    expect((await probe({ kind: 'tcp', port: srvA.ports.tcp as number }, c())).result).toBe('success');
    expect((await probe({ kind: 'tcp', port: srvA.ports.hang as number }, c())).result).toBe('success');
    const closed = await probe({ kind: 'tcp', port: 1 }, c());
    expect(closed).toMatchObject({ result: 'failure', reason: 'refused', message: `dial tcp ${authority(1)}: connect: connection refused` });
  });

  it('gRPC: SERVING, NOT_SERVING, unknown service', async () => {
    const port = srvA.ports.grpc as number;
    expect(await probe({ kind: 'grpc', port }, c())).toMatchObject({ result: 'success', message: 'service healthy' });
    expect(await probe({ kind: 'grpc', port, service: 'db' }, c())).toMatchObject({ result: 'failure', message: 'service unhealthy (responded with "NOT_SERVING")' });
    expect((await probe({ kind: 'grpc', port, service: 'nope' }, c())).message).toMatch(/^error: health rpc probe failed: rpc error: code = NotFound/);
  });

  it('a hung target times out within the timeout (HTTP and gRPC)', async () => {
    const t0 = performance.now();
    const [h, g] = await Promise.all([
      probe(get(srvA.ports.http as number, '/hang'), c()),
      probe({ kind: 'grpc', port: srvA.ports.hang as number }, c()),
    ]);
    expect(performance.now() - t0).toBeLessThan(10_000);
    expect(h).toMatchObject({ result: 'failure', reason: 'timeout' });
    expect(h.message).toContain('Client.Timeout exceeded while awaiting headers');
    expect(g).toMatchObject({ result: 'failure', reason: 'timeout', message: `timeout: failed to connect service "${authority(srvA.ports.hang as number)}" within 1s: context deadline exceeded` });
  });
});

describe('Happy Eyeballs (pod C)', () => {
  it('v4 server down, v6 up: fails with HE off (kubelet), passes with HE on', async () => {
    const off = await probe(get(v6OnlyPort, '/'), ctx(podC));
    expect(off).toMatchObject({ result: 'failure', reason: 'refused' });
    const on = await probe(get(v6OnlyPort, '/'), ctx(podC, { happyEyeballs: true }));
    expect(on).toMatchObject({ result: 'success', message: 'v6only', address: `[${podC.ipv6}]:${v6OnlyPort}` });
  });

  it('v4 silently dropped: HE off times out, HE on connects over v6 after the 250 ms stagger', async () => {
    const port = srvC.ports.http as number;
    const off = await probe({ kind: 'tcp', port }, ctx(podC));
    expect(off).toMatchObject({ result: 'failure', reason: 'timeout' });
    const on = await probe({ kind: 'tcp', port }, ctx(podC, { happyEyeballs: true }));
    expect(on).toMatchObject({ result: 'success', address: `[${podC.ipv6}]:${port}` });
    // A success at all is what shows v6 won before the 1 s timeout; the stagger is the lower bound.
    expect(on.durationSeconds).toBeGreaterThanOrEqual(0.25);
    expect(on.phases.connect).toBeGreaterThanOrEqual(0.24);
  });
});

describe('host field policy', () => {
  const port = (): number => srvB.ports.http as number;

  it.each(['127.0.0.1', '::1', 'localhost'])('%s is the pod\'s own loopback', async (host) => {
    const out = await probe(get(port(), '/healthz', { host }), ctx(podB));
    expect(out).toMatchObject({ result: 'success', message: 'ok' });
  });

  it('the pod\'s own IP as host goes to that IP (nothing listens there on a loopback-only server)', async () => {
    expect(await probe({ kind: 'tcp', port: port(), host: podB.ipv6 }, ctx(podB))).toMatchObject({ result: 'failure', reason: 'refused', address: `[${podB.ipv6}]:${port()}` });
  });

  it('another host is refused with a reason naming the gate, and nothing is sent', async () => {
    // Nothing from the node (the lab's node->pod counter) and nothing from pod B's own netns to pod A
    // (a counter in pod B's output hook: pod-to-pod packets never pass the node's).
    const port = srvA.ports.tcp as number;
    const table = `table inet probers_sent {\n  counter to_a {}\n  chain out {\n    type filter hook output priority 0;\n    ip daddr ${podA.ipv4} tcp dport ${port} counter name to_a\n  }\n}\n`;
    const made = await lab.exec(podB, 'nft', ['-f', '-'], { input: table });
    expect(made.code, made.stderr).toBe(0);
    const sentToA = async (): Promise<number> => {
      const r = await lab.exec(podB, 'nft', ['-j', 'list', 'counter', 'inet', 'probers_sent', 'to_a']);
      expect(r.code, r.stderr).toBe(0);
      const entry = (JSON.parse(r.stdout) as { nftables: { counter?: { packets: number } }[] }).nftables.find((e) => e.counter);
      return entry?.counter?.packets ?? -1;
    };
    try {
      const drops = await lab.nodeToPodDrops();
      const out = await probe({ kind: 'tcp', port, host: podA.ipv4 }, ctx(podB));
      expect(out).toMatchObject({ result: 'error', reason: 'host-refused' });
      expect(out.message).toContain('LegacyHostFieldProbes');
      await new Promise((r) => setTimeout(r, 200)); // a connection started in the background would have sent its SYN by now
      expect(await lab.nodeToPodDrops()).toBe(drops);
      expect(await sentToA()).toBe(0);
      // The counter does see pod B connecting to pod A.
      const knock = await lab.exec(podB, 'bash', ['-c', `exec 3<>/dev/tcp/${podA.ipv4}/${port}`]);
      expect(knock.code, knock.stderr).toBe(0);
      expect(await sentToA()).toBeGreaterThan(0);
    } finally {
      await lab.exec(podB, 'nft', ['delete', 'table', 'inet', 'probers_sent']);
    }
  });

  it('legacy-node: that probe alone runs from the node, exactly like kubelet', async () => {
    const out = await probe(get(nodeServerPort, '/', { host: lab.gatewayV4 }), ctx(podB, { hostFieldPolicy: 'legacy-node' }));
    expect(out).toMatchObject({ result: 'success', message: 'node', address: `${lab.gatewayV4}:${nodeServerPort}` });
    expect(nodeServerPeer).toBe(lab.gatewayV4);
    // ...and so it meets the node->pod rule like kubelet does.
    const drops = await lab.nodeToPodDrops();
    const blocked = await probe({ kind: 'tcp', port: srvA.ports.tcp as number, host: podA.ipv4 }, ctx(podB, { hostFieldPolicy: 'legacy-node' }));
    expect(blocked).toMatchObject({ result: 'failure', reason: 'timeout' });
    expect(await lab.nodeToPodDrops()).toBeGreaterThan(drops);
  });
});

describe('the TCP probe done whole in the helper\'s child (op "tcp": no socket passed)', () => {
  /** The resident helper with the socket route cut off: a probe that still asks for a socket errors. */
  const childOnly = (): SocketFactory => ({
    mode: 'resident',
    createSocket: () => Promise.reject(new Error('the socket route was taken')),
    connectProbe: (netns, target, signal) => helper.connectProbe(netns, target, signal),
  });

  it('succeeds, is refused and times out with kubelet\'s exact results, without a socket in Node', async () => {
    const ok = await probe({ kind: 'tcp', port: srvA.ports.tcp as number }, ctx(podA, { sockets: childOnly() }));
    expect(ok).toMatchObject({ result: 'success', message: '', address: `${podA.ipv4}:${srvA.ports.tcp}` });
    expect(ok.phases.connect).toBeGreaterThanOrEqual(0);
    const v6 = await probe({ kind: 'tcp', port: srvA.ports.tcp as number }, ctx(podA, { sockets: childOnly(), podIPs: [podA.ipv6, podA.ipv4] }));
    expect(v6).toMatchObject({ result: 'success', address: `[${podA.ipv6}]:${srvA.ports.tcp}` });
    // Pod B's server listens on its loopback only: its pod IP refuses.
    const refused = await probe({ kind: 'tcp', port: srvB.ports.http as number }, ctx(podB, { sockets: childOnly() }));
    expect(refused).toMatchObject({ result: 'failure', reason: 'refused', message: `dial tcp ${podB.ipv4}:${srvB.ports.http}: connect: connection refused` });
    const loop = await probe({ kind: 'tcp', port: srvB.ports.http as number, host: '127.0.0.1' }, ctx(podB, { sockets: childOnly() }));
    expect(loop).toMatchObject({ result: 'success', address: `127.0.0.1:${srvB.ports.http}` });
    // Pod C drops its own IPv4 SYNs to this port: the child's connect waits the whole timeout.
    const hung = await probe({ kind: 'tcp', port: srvC.ports.http as number }, ctx(podC, { sockets: childOnly() }));
    expect(hung).toMatchObject({ result: 'failure', reason: 'timeout', message: `dial tcp ${podC.ipv4}:${srvC.ports.http}: i/o timeout` });
    expect(hung.durationSeconds).toBeGreaterThanOrEqual(0.99);
    const gone = await probe({ kind: 'tcp', port: 80 }, ctx(podA, { sockets: childOnly(), netns: `/run/netns/${podA.name}-gone` }));
    expect(gone).toMatchObject({ result: 'error', reason: 'netns-gone' });
  });

  it('Happy Eyeballs in the child: v4 dropped waits the stagger and wins on v6; v4 refused falls to v6 at once; both refused is the primary\'s error', async () => {
    const he = { sockets: childOnly(), happyEyeballs: true };
    const port = srvC.ports.http as number;
    const staggered = await probe({ kind: 'tcp', port }, ctx(podC, he));
    expect(staggered).toMatchObject({ result: 'success', message: '', address: `[${podC.ipv6}]:${port}` });
    expect(staggered.phases.connect).toBeGreaterThanOrEqual(0.24);
    const fallback = await probe({ kind: 'tcp', port: v6OnlyPort }, ctx(podC, he));
    expect(fallback).toMatchObject({ result: 'success', address: `[${podC.ipv6}]:${v6OnlyPort}` });
    const both = await probe({ kind: 'tcp', port: srvB.ports.http as number }, ctx(podB, he));
    expect(both).toMatchObject({ result: 'failure', reason: 'refused', message: `dial tcp ${podB.ipv4}:${srvB.ports.http}: connect: connection refused` });
  });

  it('an aborted probe ends at once as an error, its child left to the helper', async () => {
    const abort = new AbortController();
    const pending = probe({ kind: 'tcp', port: srvC.ports.http as number }, ctx(podC, { sockets: childOnly(), timeoutSeconds: 30, signal: abort.signal }));
    setTimeout(() => abort.abort(), 100);
    expect(await pending).toMatchObject({ result: 'error', reason: 'other', message: 'probe aborted' });
  });

  it('past its share of the helper\'s send window a TCP probe takes the socket route, so hung targets cannot crowd out others', async () => {
    const small = await ResidentHelper.start({ maxInFlight: 4 });
    try {
      // A window of four: a namespace's share is one, and the hung probe holds it for its whole timeout.
      const hung = small.connectProbe(podC.netns, { family: 4, ip: podC.ipv4, port: srvC.ports.http as number, timeoutMs: 1000 });
      expect(await small.connectProbe(podA.netns, { family: 4, ip: podA.ipv4, port: srvA.ports.tcp as number, timeoutMs: 1000 })).toBeUndefined();
      const out = await probe({ kind: 'tcp', port: srvA.ports.tcp as number }, ctx(podA, { sockets: small }));
      expect(out).toMatchObject({ result: 'success', address: `${podA.ipv4}:${srvA.ports.tcp}` });
      expect(out.phases.helper).toBeGreaterThan(0);
      expect(await hung).toMatchObject({ outcome: 'timeout' });
      expect(await small.connectProbe(podA.netns, { family: 4, ip: podA.ipv4, port: srvA.ports.tcp as number, timeoutMs: 1000 })).toMatchObject({ outcome: 'connected' });
    } finally {
      await small.close();
    }
  });
});

describe('the plain HTTP and gRPC probes\' exchange in the helper\'s child (op "connect" with send)', () => {
  /** The helper's exchange only, counting the connections that came over: no socket route, no plain connect. */
  const exchangeOnly = (): SocketFactory & { handedOver: number; ended: number } => {
    const f = {
      mode: 'resident', handedOver: 0, ended: 0,
      createSocket: () => Promise.reject(new Error('the socket route was taken')),
      connectExchange: async (netns: string, target: TcpTarget, send: Buffer, signal?: AbortSignal) => {
        const out = await helper.connectExchange(netns, target, send, signal);
        if (out?.outcome === 'connected') {
          if (out.socket) f.handedOver++;
          else f.ended++;
        }
        return out;
      },
    };
    return f;
  };

  it('kubelet\'s results on both families, redirects and the 10 KiB cap included; answers that end in the child leave no fd to pass', async () => {
    const sockets = exchangeOnly();
    const ok = await probe(get(srvA.ports.http as number, '/healthz'), ctx(podA, { sockets }));
    expect(ok).toMatchObject({ result: 'success', message: 'ok', address: `${podA.ipv4}:${srvA.ports.http}` });
    expect(ok.phases.firstByte).toBeGreaterThanOrEqual(0);
    const v6 = await probe(get(srvA.ports.http as number, '/echo'), ctx(podA, { sockets, podIPs: [podA.ipv6, podA.ipv4] }));
    expect(v6).toMatchObject({ result: 'success', address: `[${podA.ipv6}]:${srvA.ports.http}` });
    expect(JSON.parse(v6.message)).toMatchObject({ remoteAddress: podA.ipv6, rawHeaders: expect.arrayContaining(['Connection', 'close']) });
    const redirected = await probe(get(srvA.ports.http as number, '/redirect?to=/healthz'), ctx(podA, { sockets }));
    expect(redirected).toMatchObject({ result: 'success', message: 'ok' });
    const big = await probe(get(srvA.ports.http as number, '/big?bytes=50000'), ctx(podA, { sockets }));
    expect(big).toMatchObject({ result: 'success' });
    expect(big.message).toMatch(/… \(truncated\)$/);
    const bad = await probe(get(srvA.ports.http as number, '/secret'), ctx(podA, { sockets }));
    expect(bad).toMatchObject({ result: 'failure', reason: 'status', message: 'HTTP probe failed with statuscode: 500' });
    const hung = await probe(get(srvA.ports.hang as number, '/'), ctx(podA, { sockets }));
    expect(hung).toMatchObject({ result: 'failure', reason: 'timeout' });
    expect(hung.message).toMatch(/awaiting headers\)$/);
    // Every connection (two for the redirect) went through the exchange. The lab server ends each
    // answer (Connection: close), so most end in the child; one whose end comes after the child's
    // short wait (a loaded machine) is handed over, which is as correct.
    expect(sockets.ended + sockets.handedOver).toBe(7);
  });

  it('gRPC: the client\'s first octets go with the connect, the server\'s first answer comes back with the connection; kubelet\'s results', async () => {
    const exchanges: { send: number; sent: number; read: number }[] = [];
    const sockets: SocketFactory = {
      ...exchangeOnly(),
      connectExchange: async (netns, target, send, signal) => {
        const out = await helper.connectExchange(netns, target, send, signal);
        if (out?.outcome === 'connected' && out.exchange) exchanges.push({ send: send.length, sent: out.exchange.sent, read: out.exchange.data.length });
        return out;
      },
    };
    const port = srvA.ports.grpc as number;
    expect(await probe({ kind: 'grpc', port }, ctx(podA, { sockets }))).toMatchObject({ result: 'success', message: 'service healthy', address: `${podA.ipv4}:${port}` });
    expect(await probe({ kind: 'grpc', port, service: 'db' }, ctx(podA, { sockets }))).toMatchObject({ result: 'failure', message: 'service unhealthy (responded with "NOT_SERVING")' });
    expect((await probe({ kind: 'grpc', port, service: 'nope' }, ctx(podA, { sockets }))).message).toMatch(/^error: health rpc probe failed: rpc error: code = NotFound/);
    const hung = await probe({ kind: 'grpc', port: srvA.ports.hang as number }, ctx(podA, { sockets }));
    expect(hung).toMatchObject({ result: 'failure', reason: 'timeout', message: `timeout: failed to connect service "${podA.ipv4}:${srvA.ports.hang}" within 1s: context deadline exceeded` });
    // Each of the four went whole with the connect (preface, SETTINGS, HEADERS, DATA); the servers
    // that speak had said something by the time the connection came over (at least their SETTINGS).
    expect(exchanges).toHaveLength(4);
    for (const x of exchanges) expect(x.sent).toBe(x.send);
    expect(exchanges.slice(0, 3).every((x) => x.read > 0)).toBe(true);
    expect(exchanges[3]!.read).toBe(0);
  });

  it('a wait over 10 s (a long timeout, a hook\'s grace period) is not the helper\'s: the connection comes over and Node waits', async () => {
    const connects: string[] = [];
    const sockets: SocketFactory = {
      ...exchangeOnly(),
      connectSocket: (netns, target, signal) => { connects.push('connect'); return helper.connectSocket(netns, target, signal); },
      connectExchange: (netns, target, send, signal) => { connects.push('exchange'); return helper.connectExchange(netns, target, send, signal); },
    };
    expect(await probe(get(srvA.ports.http as number, '/healthz'), ctx(podA, { sockets, timeoutSeconds: 11 }))).toMatchObject({ result: 'success', message: 'ok' });
    expect(await probe(get(srvA.ports.http as number, '/healthz'), ctx(podA, { sockets, timeoutSeconds: 10 }))).toMatchObject({ result: 'success', message: 'ok' });
    const grpc = { kind: 'grpc', port: srvA.ports.grpc as number } as const;
    expect(await probe(grpc, ctx(podA, { sockets, timeoutSeconds: 11 }))).toMatchObject({ result: 'success', message: 'service healthy' });
    expect(await probe(grpc, ctx(podA, { sockets, timeoutSeconds: 10 }))).toMatchObject({ result: 'success', message: 'service healthy' });
    expect(connects).toEqual(['connect', 'exchange', 'connect', 'exchange']);
  });
});

describe('netns trouble', () => {
  it('a netns that is gone is an error, not a failure', async () => {
    const out = await probe({ kind: 'tcp', port: 80 }, ctx(podA, { netns: `/run/netns/${podA.name}-gone` }));
    expect(out).toMatchObject({ result: 'error', reason: 'netns-gone' });
  });
});
