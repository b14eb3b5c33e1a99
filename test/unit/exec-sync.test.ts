/**
 * ProbeService ExecSync (issue 26): kubelet's ExecSync for a rewritten command, forwarded by the
 * shim as it came, answered by the agent. No root: the agent's real PodProber, container lookup
 * (from the pod list), fair limiter and probers run against an HTTP server on 127.0.0.1 (the
 * "pod" IP; sockets from the test's own netns), behind the real ProbeApiServer on a temp socket.
 *
 *  - the parsed-command cache: a hit skips parsing (its `parses` counter), the bound, a new
 *    container ID misses, a container's entries go with it;
 *  - the lean server and grpc-js answer the same request with the same bytes (and a gRPC client
 *    built from the .proto reads them);
 *  - an agent without ExecSync (a ProbeService as older releases serve it): the shim answers
 *    kubelet UNAVAILABLE "upgrade the agent DaemonSet before the shim" and counts it;
 *  - byte for byte: the agent receives exactly kubelet's message bytes and kubelet exactly the
 *    agent's answer bytes, unknown fields and all.
 */
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import * as http from 'node:http';
import * as http2 from 'node:http2';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import type * as protoLoader from '@grpc/proto-loader';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ExecSyncHandlerCache, encodeExecSyncResponse } from '../../agent/api/exec-sync.ts';
import { INVALID_COMMAND_PREFIX } from '../../agent/contract/hook-refusal.ts';
import { loadProbeApi } from '../../agent/api/proto.ts';
import { encodeFrame } from '../../agent/grpc/frame.ts';
import { readFields, WireWriter } from '../../agent/grpc/protowire.ts';
import { AgentCallError, ShimProbeClient } from '../../agent/shim/agent-client.ts';
import { parseFeatureGates } from '../../agent/featuregates.ts';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { NetnsResolverChain, type NetnsResolver } from '../../agent/netns/resolver.ts';
import { PodProber } from '../../agent/prober/pod-prober.ts';
import { ContainerLocator } from '../../agent/prober/container-lookup.ts';
import type { PodInfo } from '../../agent/pods/types.ts';
import { encodeShimCommand, SHIM_COMMAND_PATH, type ShimKind } from '../../agent/contract/shim-command.ts';
import { FairLimiter } from '../../agent/scheduler/limiter.ts';
import { AGENT_TOO_OLD } from '../../agent/shim/answer.ts';
import { CriShim } from '../../agent/shim/proxy.ts';
import { startApiFixture, type ApiFixture } from '../support/api-harness.ts';
import { KubeletCri } from '../support/kubelet-cri.ts';
import { execSyncRequest } from '../support/relay-harness.ts';

const CID = 'a1'.repeat(32);
const EXEC_PATH = '/probe.v1alpha1.ProbeService/ExecSync';
const argv = (kind: ShimKind, handler: Record<string, unknown>): Buffer[] => encodeShimCommand(kind, handler).map((a) => Buffer.from(a));

describe('the parsed-command cache', () => {
  const healthz = argv('readiness', { httpGet: { path: '/healthz', port: 8080 } });

  it('parses a command once per container: later calls are hits that skip base64url, JSON and validation', () => {
    const c = new ExecSyncHandlerCache();
    const first = c.get(CID, healthz);
    expect(first).toMatchObject({ kind: 'readiness', probeType: 'Readiness', containerID: CID, handler: { kind: 'http', port: 8080, path: '/healthz' } });
    // Equal bytes in other buffers (each call decodes a new request) still hit.
    for (let i = 0; i < 5; i++) expect(c.get(CID, healthz.map((b) => Buffer.from(b)))).toBe(first);
    expect({ parses: c.parses, hits: c.hits, size: c.size }).toEqual({ parses: 1, hits: 5, size: 1 });
  });

  it('misses for another container ID (a restarted container) and for another command of the same container', () => {
    const c = new ExecSyncHandlerCache();
    c.get(CID, healthz);
    c.get('b2'.repeat(32), healthz);
    c.get(CID, argv('liveness', { tcpSocket: { port: 8080 } }));
    expect({ parses: c.parses, hits: c.hits, size: c.size }).toEqual({ parses: 3, hits: 0, size: 3 });
  });

  it('is bounded: beyond its size the least recently used entry goes', () => {
    const c = new ExecSyncHandlerCache({ maxEntries: 2 });
    c.get('c1', healthz);
    c.get('c2', healthz);
    c.get('c1', healthz); // c1 is now the most recent
    c.get('c3', healthz); // evicts c2
    expect(c.size).toBe(2);
    const parses = c.parses;
    c.get('c1', healthz);
    c.get('c3', healthz);
    expect(c.parses).toBe(parses);
    c.get('c2', healthz);
    expect(c.parses).toBe(parses + 1);
    expect(c.size).toBe(2);
  });

  it('drops every entry of a container that is gone (by its pod-list spelling), and only those', () => {
    const c = new ExecSyncHandlerCache();
    c.get(CID, healthz);
    c.get(CID, argv('preStop', { httpGet: { path: '/quit', port: 8080 } }));
    c.get('b2'.repeat(32), healthz);
    c.forgetContainer(`containerd://${CID}`);
    expect(c.size).toBe(1);
    c.get(CID, healthz);
    expect(c.parses).toBe(4);
  });

  it('is bounded in bytes: a flood of distinct padded commands keeps only what fits, and no command bytes', () => {
    const maxBytes = 64 * 1024;
    const c = new ExecSyncHandlerCache({ maxBytes });
    // JSON whitespace pads each command to near the 16 KiB encoding limit; every one is distinct.
    const padded = (i: number): Buffer[] => {
      const json = `{"tcpSocket":{"port":${1 + (i % 60000)}}${' '.repeat(12_000 + (i % 100))}}`;
      return [Buffer.from(SHIM_COMMAND_PATH), Buffer.from('readiness'), Buffer.from(Buffer.from(json).toString('base64url'))];
    };
    expect(padded(0)[2]!.length).toBeGreaterThan(16_000);
    for (let i = 0; i < 2000; i++) c.get(`c${i}`, padded(i));
    expect(c.bytes).toBeLessThanOrEqual(maxBytes);
    expect(c.size).toBeGreaterThan(10);
    expect(c.size * 16_000).toBeGreaterThan(maxBytes); // what the command bytes alone would have cost
    expect(c.evictions).toBe(2000 - c.size);
    // A handler larger than the whole bound is answered, not kept.
    const tiny = new ExecSyncHandlerCache({ maxBytes: 600 });
    const big = argv('readiness', { httpGet: { path: `/${'p'.repeat(2000)}`, port: 8080 } });
    expect(tiny.get(CID, big)).toMatchObject({ handler: { kind: 'http' } });
    expect({ size: tiny.size, bytes: tiny.bytes }).toEqual({ size: 0, bytes: 0 });
  });

  it('keeps at most 8 commands per container: one container cannot churn the others out', () => {
    const c = new ExecSyncHandlerCache({ maxEntries: 16 });
    c.get('other', healthz);
    for (let port = 1; port <= 50; port++) c.get(CID, argv('readiness', { tcpSocket: { port } }));
    expect(c.size).toBe(9);
    const parses = c.parses;
    c.get('other', healthz);
    expect(c.parses).toBe(parses);
    c.forgetContainer(CID);
    expect(c.size).toBe(1);
    c.forgetContainer('other');
    expect({ size: c.size, bytes: c.bytes }).toEqual({ size: 0, bytes: 0 });
  });

  /** Distinct commands padded with JSON whitespace to near the 16 KiB encoding limit. */
  const padded = (i: number): Buffer[] => {
    const json = `{"tcpSocket":{"port":${1 + (i % 60000)}}${' '.repeat(12_000 + (i % 100))}}`;
    return [Buffer.from(SHIM_COMMAND_PATH), Buffer.from('readiness'), Buffer.from(Buffer.from(json).toString('base64url'))];
  };

  it('gives each namespace a share: a flood from one namespace evicts only its own entries', () => {
    const maxBytes = 256 * 1024;
    const c = new ExecSyncHandlerCache({ maxBytes });
    // The neighbour's probes are cached first, so they are the least recently used of all.
    for (let i = 0; i < 3; i++) c.get(`good${i}`, healthz, 'good');
    const goodBytes = c.bytesOf('good');
    for (let i = 0; i < 2000; i++) c.get(`flood${i}`, padded(i), 'hostile');
    expect(c.bytes).toBeLessThanOrEqual(maxBytes);
    expect(c.bytesOf('good')).toBe(goodBytes);
    // The flood holds what the neighbour leaves: more than its share, at most the rest of the bound.
    expect(c.bytesOf('hostile')).toBeGreaterThan(maxBytes / 2);
    expect(c.bytesOf('hostile')).toBeLessThanOrEqual(maxBytes - goodBytes);
    expect(c.evictions).toBe(2000 - (c.size - 3));
    const parses = c.parses;
    for (let i = 0; i < 3; i++) c.get(`good${i}`, healthz, 'good');
    expect(c.parses).toBe(parses);
    expect(c.stats()).toMatchObject({ namespaces: 2, namespaceShareBytes: maxBytes / 2, namespacesAtShare: 1 });
  });

  it('a namespace under its share takes room from the one holding the most; at its share, from itself', () => {
    // Entries of one size: 4-character namespaces, 7-character container IDs, 5-digit ports.
    const tcp = (i: number): Buffer[] => argv('readiness', { tcpSocket: { port: 10_000 + i } });
    const id = (ns: string, i: number): string => `${ns.slice(0, 3)}${String(i).padStart(4, '0')}`;
    const put = (c: ExecSyncHandlerCache, ns: string, i: number): void => void c.get(id(ns, i), tcp(i), ns);
    const probe = new ExecSyncHandlerCache();
    put(probe, 'bigs', 0);
    const E = probe.bytes;
    const c = new ExecSyncHandlerCache({ maxBytes: 40 * E });
    // Alone, a namespace may fill the whole bound.
    for (let i = 0; i < 100; i++) put(c, 'bigs', i);
    expect({ size: c.size, big: c.bytesOf('bigs') }).toEqual({ size: 40, big: 40 * E });
    for (let i = 0; i < 2; i++) put(c, 'smal', i);
    for (let i = 0; i < 2; i++) put(c, 'midl', i);
    expect({ big: c.bytesOf('bigs'), small: c.bytesOf('smal'), mid: c.bytesOf('midl') }).toEqual({ big: 36 * E, small: 2 * E, mid: 2 * E });
    // 'bigs' holds bigs0064..0099; a hit makes 0064 its most recent, so a newcomer evicts 0065.
    put(c, 'bigs', 64);
    put(c, 'newc', 0);
    expect({ big: c.bytesOf('bigs'), small: c.bytesOf('smal'), mid: c.bytesOf('midl') }).toEqual({ big: 35 * E, small: 2 * E, mid: 2 * E });
    let parses = c.parses;
    for (const i of [64, 66, 99]) put(c, 'bigs', i);
    expect(c.parses).toBe(parses);
    expect(c.lookup(id('bigs', 65), tcp(65)).keep).toBeDefined();
    expect(c.stats()).toMatchObject({ namespaces: 4, namespaceShareBytes: 10 * E, namespacesAtShare: 1 });
    // 'smal' grows to its share at the expense of 'bigs' only; past it, it evicts its own oldest.
    for (let i = 2; i < 10; i++) put(c, 'smal', i);
    expect({ big: c.bytesOf('bigs'), small: c.bytesOf('smal'), mid: c.bytesOf('midl') }).toEqual({ big: 27 * E, small: 10 * E, mid: 2 * E });
    put(c, 'smal', 10);
    expect({ big: c.bytesOf('bigs'), small: c.bytesOf('smal'), mid: c.bytesOf('midl') }).toEqual({ big: 27 * E, small: 10 * E, mid: 2 * E });
    parses = c.parses;
    put(c, 'smal', 1);
    expect(c.parses).toBe(parses);
    put(c, 'smal', 0);
    expect(c.parses).toBe(parses + 1);
    expect(c.stats()).toMatchObject({ namespacesAtShare: 2 });
  });

  it('shares the entry bound the same way', () => {
    const c = new ExecSyncHandlerCache({ maxEntries: 16 });
    for (let i = 0; i < 4; i++) c.get(`good${i}`, healthz, 'good');
    for (let i = 0; i < 100; i++) c.get(`flood${i}`, healthz, 'hostile');
    expect(c.size).toBe(16);
    const parses = c.parses;
    for (let i = 0; i < 4; i++) c.get(`good${i}`, healthz, 'good');
    expect(c.parses).toBe(parses);
    expect(c.evictions).toBe(100 - 12);
  });

  it('keeps a miss only once the namespace is named, and only once when two calls missed together', () => {
    const c = new ExecSyncHandlerCache();
    const a = c.lookup(CID, healthz);
    const b = c.lookup(CID, healthz);
    expect(a.parsed).toMatchObject({ probeType: 'Readiness' });
    expect(c.size).toBe(0);
    a.keep?.('tenant');
    b.keep?.('tenant');
    expect({ size: c.size, parses: c.parses, bytes: c.bytesOf('tenant') }).toEqual({ size: 1, parses: 2, bytes: c.bytes });
    const hit = c.lookup(CID, healthz);
    expect(hit.keep).toBeUndefined();
    expect(hit.parsed).toBe(a.parsed);
    c.forgetContainer(CID);
    expect(c.stats()).toMatchObject({ entries: 0, bytes: 0, namespaces: 0, namespaceShareBytes: c.maxBytes, namespacesAtShare: 0 });
  });

  it('never caches a command it refuses', () => {
    const c = new ExecSyncHandlerCache();
    const bad = [Buffer.from(SHIM_COMMAND_PATH), Buffer.from('readiness'), Buffer.from('***')];
    expect(() => c.get(CID, bad)).toThrow(/not base64url/);
    expect(() => c.get(CID, bad)).toThrow(/not base64url/);
    expect(() => c.get(CID, argv('postStart', { grpc: { port: 1 } }))).toThrow(/exactly one of httpGet, tcpSocket/);
    expect(() => c.get(CID, argv('readiness', { tcpSocket: { port: 70000 } }))).toThrow(/handler\.tcpSocket\.port/);
    expect({ parses: c.parses, size: c.size }).toEqual({ parses: 4, size: 0 });
  });
});

describe('ExecSync on the agent, over both transports', () => {
  let web: http.Server;
  let port = 0;
  let fx: ApiFixture;
  let dir: string;

  beforeAll(async () => {
    web = http.createServer((req, res) => {
      if (req.url === '/fail') res.statusCode = 503;
      res.end('body');
    });
    await new Promise<void>((r) => web.listen(0, '127.0.0.1', r));
    port = (web.address() as AddressInfo).port;
    dir = mkdtempSync(path.join(tmpdir(), 'pa-exec-sync-'));
    const info: PodInfo = {
      uid: '0d7c1e2f-3a4b-4c5d-8e9f-000000000001', namespace: 'tenant', name: 'web', hostNetwork: false, podIPs: ['127.0.0.1'],
      phase: 'Running', restartPolicy: 'Always', isStatic: false, podReady: true,
      containers: [{
        name: 'app', kind: 'regular', ports: [], probes: {},
        state: { containerID: `containerd://${CID}`, running: true, startedAt: 0, terminated: false, ready: true, restartCount: 0 },
      }],
    };
    const pods = { get: (uid: string) => (uid === info.uid ? info : undefined), pods: () => [info] };
    const here: NetnsResolver = { name: 'cri', resolve: async () => ({ path: '/proc/self/ns/net', resolver: 'cri', inode: statSync('/proc/self/ns/net').ino }) };
    const prober = new PodProber({
      pods,
      resolver: new NetnsResolverChain([here]),
      limiter: new FairLimiter({ maxInFlight: 4, maxQueued: 16 }),
      sockets: new NodeSocketFactory(),
      nodeSockets: new NodeSocketFactory(),
      gates: parseFeatureGates(''),
      kubeVersion: '1.34',
      classify: () => undefined,
      containers: new ContainerLocator({ pods }),
    });
    fx = await startApiFixture({ prober, dir });
  });

  afterAll(async () => {
    await fx?.close();
    web?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const msgFor = (containerId: string, kind: ShimKind, handler: Record<string, unknown>, timeout: number): Buffer =>
    execSyncRequest(containerId, encodeShimCommand(kind, handler), timeout);

  /** grpc-js (user-agent grpc-node-js: served by grpc-js), messages as bytes both ways. */
  function viaGrpcJs(msg: Buffer): Promise<{ ok: true; raw: Buffer } | { ok: false; code: number; details: string }> {
    const c = new grpc.Client(`unix:${fx.socket}`, grpc.credentials.createInsecure());
    return new Promise((resolve) => {
      c.makeUnaryRequest(EXEC_PATH, (b: Buffer) => b, (b: Buffer) => b, msg, { deadline: Date.now() + 10_000 }, (err, raw) => {
        c.close();
        resolve(err ? { ok: false, code: err.code, details: err.details } : { ok: true, raw: raw as Buffer });
      });
    });
  }

  /** The shim's own client (no gRPC library: served by the lean server). */
  async function viaLean(msg: Buffer): Promise<{ ok: true; raw: Buffer } | { ok: false; code: number; details: string }> {
    const c = new ShimProbeClient(fx.socket);
    try {
      const a = await c.execSync(encodeFrame(msg), { deadlineMs: 10_000 });
      return { ok: true, raw: a.body.subarray(5) };
    } catch (err) {
      if (!(err instanceof AgentCallError)) throw err;
      return { ok: false, code: err.grpcCode, details: err.message };
    } finally {
      c.close();
    }
  }

  const decode = (raw: Buffer): { exitCode: number; stdout: string } => {
    const out = { exitCode: 0, stdout: '' };
    readFields(raw, (f, v) => {
      if (f === 1 && Buffer.isBuffer(v)) out.stdout = v.toString('utf8');
      if (f === 3 && typeof v === 'number') out.exitCode = v;
    });
    return out;
  };

  it('success, failure and a refusal: the lean server and grpc-js answer the same bytes, and the command is parsed once for both', async () => {
    const before = fx.server.execSyncCacheStats();
    const ok = msgFor(CID, 'readiness', { httpGet: { path: '/healthz', port } }, 1);
    const fail = msgFor(CID, 'liveness', { httpGet: { path: '/fail', port } }, 1);
    const a = await viaLean(ok);
    const b = await viaGrpcJs(ok);
    expect(a.ok && b.ok).toBe(true);
    if (!a.ok || !b.ok) return;
    expect(a.raw.equals(b.raw)).toBe(true);
    expect(a.raw.equals(encodeExecSyncResponse(0, decode(a.raw).stdout))).toBe(true);
    expect(decode(a.raw).exitCode).toBe(0);

    const f1 = await viaLean(fail);
    const f2 = await viaGrpcJs(fail);
    expect(f1.ok && f2.ok && f1.raw.equals(f2.raw)).toBe(true);
    if (!f1.ok) return;
    expect(decode(f1.raw)).toEqual({ exitCode: 1, stdout: expect.stringMatching(/503/) as unknown as string });

    // The same readiness command over both transports, three more times: no parse after the first.
    for (let i = 0; i < 3; i++) {
      expect((await viaLean(ok)).ok).toBe(true);
      expect((await viaGrpcJs(ok)).ok).toBe(true);
    }
    const after = fx.server.execSyncCacheStats();
    expect(after.parses - before.parses).toBe(2); // one per command
    expect(after.hits - before.hits).toBe(8);

    const gone = msgFor('f0'.repeat(32), 'readiness', { httpGet: { path: '/healthz', port } }, 1);
    const n1 = await viaLean(gone);
    const n2 = await viaGrpcJs(gone);
    expect(n1).toMatchObject({ ok: false, code: grpc.status.NOT_FOUND });
    expect(n2).toEqual(n1);
    expect(!n1.ok && n1.details).toMatch(/^probe-agent refused the readiness probe: .*not known/);
    // An unknown container has no namespace to charge: its command is parsed each time, never kept.
    const afterGone = fx.server.execSyncCacheStats();
    expect(afterGone.parses - after.parses).toBe(2);
    expect(afterGone.entries).toBe(after.entries);
    expect(afterGone.namespaces).toBe(1);
  });

  it('refuses what is not kubelet\'s call for a rewritten command (INVALID_ARGUMENT, the same on both), never DEADLINE_EXCEEDED', async () => {
    const cases = [
      execSyncRequest(CID, ['/bin/true'], 1),
      msgFor(CID, 'liveness', { tcpSocket: { port } }, 0), // a probe kind with a hook's timeout
      msgFor(CID, 'postStart', { tcpSocket: { port } }, 5), // a hook kind with a probe's timeout
      msgFor(CID, 'readiness', { tcpSocket: { port } }, 100_000), // beyond the agent's 3600 s cap
      execSyncRequest('', encodeShimCommand('readiness', { tcpSocket: { port } }), 1),
      execSyncRequest(CID, [SHIM_COMMAND_PATH, 'readiness', 'A'.repeat(20_000)], 1), // a handler beyond 16 KiB encoded
      Buffer.from([0x0a, 0x40]), // truncated
    ];
    for (const m of cases) {
      const a = await viaLean(m);
      const b = await viaGrpcJs(m);
      expect(a).toMatchObject({ ok: false, code: grpc.status.INVALID_ARGUMENT });
      expect(!a.ok && a.details.startsWith(INVALID_COMMAND_PREFIX)).toBe(true);
      expect(b).toEqual(a);
    }
  });

  it('a gRPC client built from the .proto alone calls it and reads the answer', async () => {
    const def = loadProbeApi().service['ExecSync'] as unknown as protoLoader.MethodDefinition<object, object>;
    expect(def.path).toBe(EXEC_PATH);
    const c = new grpc.Client(`unix:${fx.socket}`, grpc.credentials.createInsecure());
    const res = await new Promise<Record<string, unknown>>((resolve, reject) => {
      c.makeUnaryRequest(def.path, (v: object) => def.requestSerialize(v), (b: Buffer) => def.responseDeserialize(b), {
        container_id: CID, cmd: encodeShimCommand('startup', { tcpSocket: { port } }), timeout: 1,
      }, (err, r) => (err ? reject(err) : resolve(r as Record<string, unknown>)));
    });
    c.close();
    expect(res['exit_code']).toBe(0);
  });
});

describe('the shim against an agent without ExecSync (an older release)', () => {
  let dir: string;
  let old: grpc.Server;
  let shim: CriShim;
  let kubelet: KubeletCri;

  beforeAll(async () => {
    dir = mkdtempSync(path.join(tmpdir(), 'pa-skew-'));
    // ProbeService as releases before ExecSync served it: Version and Probe, nothing else.
    const api = loadProbeApi();
    const { ExecSync: _dropped, ...older } = api.service;
    old = new grpc.Server();
    old.addService(older, {
      Version: (_c: unknown, cb: grpc.sendUnaryData<object>) => cb(null, { agent_name: 'probe-agent', api_version: 'v1alpha1' }),
      Probe: (_c: unknown, cb: grpc.sendUnaryData<object>) => cb({ code: grpc.status.NOT_FOUND, details: 'no pods here' }),
    });
    await new Promise<void>((r, j) => old.bindAsync(`unix:${path.join(dir, 'probe.sock')}`, grpc.ServerCredentials.createInsecure(), (e) => (e ? j(e) : r())));
    shim = new CriShim({
      listenPath: path.join(dir, 'cri.sock'), runtimeSocket: path.join(dir, 'no-runtime.sock'), probeSocket: path.join(dir, 'probe.sock'),
      hookAgentWaitMs: 700, log: () => {},
    });
    await shim.listen();
    kubelet = new KubeletCri(path.join(dir, 'cri.sock'));
  });

  afterAll(async () => {
    kubelet?.close();
    await shim?.close(100);
    old?.forceShutdown();
    rmSync(dir, { recursive: true, force: true });
  });

  it('a probe: UNAVAILABLE (kubelet discards it) saying to upgrade the agent first, counted', async () => {
    const a = await kubelet.execSync(CID, encodeShimCommand('readiness', { tcpSocket: { port: 1 } }), 1);
    expect(a).toEqual({ ok: false, code: grpc.status.UNAVAILABLE, details: AGENT_TOO_OLD });
    const m = shim.metrics.render();
    expect(m).toMatch(/^probe_agent_shim_agent_errors_total\{cause="agent_too_old"\} 1$/m);
    expect(m).toMatch(/^probe_agent_shim_intercepted_total\{kind="readiness",answer="error"\} 1$/m);
  });

  it('a hook: nothing was started, so it is asked again within --hook-agent-wait, then the same answer', async () => {
    const t = Date.now();
    const a = await kubelet.execSync(CID, encodeShimCommand('preStop', { httpGet: { path: '/', port: 1 } }), 0);
    expect(a).toEqual({ ok: false, code: grpc.status.UNAVAILABLE, details: AGENT_TOO_OLD });
    expect(Date.now() - t).toBeGreaterThanOrEqual(400);
    expect(shim.metrics.render()).toMatch(/^probe_agent_shim_hook_waits_total\{outcome="gave_up"\} 1$/m);
  });
});

describe('byte for byte through the shim', () => {
  let dir: string;
  let agent: http2.Http2Server;
  let shim: CriShim;
  let kubelet: KubeletCri;
  const seen: { path: string; timeout: string | undefined; body: Buffer }[] = [];
  const ANSWER = encodeExecSyncResponse(1, 'the agent\'s words ✓');

  beforeAll(async () => {
    dir = mkdtempSync(path.join(tmpdir(), 'pa-bytes-'));
    // A stand-in agent on the probe socket that records what arrives and answers fixed bytes.
    agent = http2.createServer();
    agent.on('stream', (stream, headers) => {
      const chunks: Buffer[] = [];
      stream.on('data', (c: Buffer) => chunks.push(c));
      stream.on('end', () => {
        seen.push({ path: String(headers[':path']), timeout: headers['grpc-timeout'] as string | undefined, body: Buffer.concat(chunks) });
        stream.respond({ ':status': 200, 'content-type': 'application/grpc' }, { waitForTrailers: true });
        stream.on('wantTrailers', () => stream.sendTrailers({ 'grpc-status': '0' }));
        stream.end(encodeFrame(ANSWER));
      });
    });
    await new Promise<void>((r) => agent.listen(path.join(dir, 'probe.sock'), r));
    shim = new CriShim({ listenPath: path.join(dir, 'cri.sock'), runtimeSocket: path.join(dir, 'no-runtime.sock'), probeSocket: path.join(dir, 'probe.sock'), log: () => {} });
    await shim.listen();
    kubelet = new KubeletCri(path.join(dir, 'cri.sock'));
  });

  afterAll(async () => {
    kubelet?.close();
    await shim?.close(100);
    await new Promise<void>((r) => agent.close(() => r()));
    rmSync(dir, { recursive: true, force: true });
  });

  function send(msg: Buffer, deadlineMs: number): Promise<Buffer> {
    return new Promise((resolve, reject) => {
      kubelet.client.makeUnaryRequest('/runtime.v1.RuntimeService/ExecSync', (b: Buffer) => b, (b: Buffer) => b, msg, { deadline: Date.now() + deadlineMs }, (err, raw) =>
        err ? reject(err) : resolve(raw as Buffer));
    });
  }

  it('the agent gets kubelet\'s message bytes unchanged (fields the shim does not know included) and kubelet the agent\'s answer bytes', async () => {
    // Kubelet's request with a field the shim never reads (15), after the timeout.
    const probe = Buffer.concat([execSyncRequest(CID, encodeShimCommand('liveness', { tcpSocket: { port: 8080 } }), 3), new WireWriter().bytes(15, 'future').finish()]);
    const raw = await send(probe, 60_000);
    expect(raw.equals(ANSWER)).toBe(true);
    expect(seen).toHaveLength(1);
    expect(seen[0]!.path).toBe(EXEC_PATH);
    expect(seen[0]!.body.equals(encodeFrame(probe))).toBe(true);
    // A probe's deadline: its timeout (3 s) plus the agent's grace, within kubelet's.
    expect(seen[0]!.timeout).toMatch(/^\d+m$/);
    expect(Number(seen[0]!.timeout!.slice(0, -1))).toBeGreaterThan(3000);
    expect(Number(seen[0]!.timeout!.slice(0, -1))).toBeLessThanOrEqual(5000);

    const hook = execSyncRequest(CID, encodeShimCommand('postStart', { httpGet: { path: '/', port: 8080 } }), 0);
    expect((await send(hook, 60_000)).equals(ANSWER)).toBe(true);
    expect(seen[1]!.body.equals(encodeFrame(hook))).toBe(true);
    // A hook carries no deadline to the agent (kubelet's exec hooks have none).
    expect(seen[1]!.timeout).toBeUndefined();
    expect(shim.metrics.render()).toMatch(/^probe_agent_shim_intercepted_total\{kind="liveness",answer="failure"\} 1$/m);
  });
});
