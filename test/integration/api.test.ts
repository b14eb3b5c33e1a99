/**
 * ProbeService against the real server on a real unix socket in a temp dir, probing real servers
 * in lab pods through the resident netns helper: Version, Probe with every status code, deadlines,
 * ListProbeStatus, socket permissions, health, reflection and drain on shutdown.
 * WatchProbeEvents: api-watch.test.ts. The wire contract: api-contract.test.ts.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft']);

import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { chmod, mkdtemp, rm, stat, writeFile } from 'node:fs/promises';
import * as net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ProbeApiClient } from '../../agent/api/client.ts';
import { ProbeApiServer } from '../../agent/api/server.ts';
import { SocketInUseError } from '../../agent/api/socket.ts';
import { ConfigError } from '../../agent/errors.ts';
import { FeatureGates } from '../../agent/featuregates.ts';
import { ResidentHelper } from '../../agent/netns/helper.ts';
import { REPLY_MARGIN_MS } from '../../agent/probe/time-budget.ts';
import { FairLimiter } from '../../agent/scheduler/limiter.ts';
import { ResultsStore } from '../../agent/scheduler/results-store.ts';
import { createLab, type Lab } from '../lab/lab.ts';
import { connectScript, portableNode, runNodeAs, tmpdirOthersReach } from '../support/other-user.ts';
import { codeOf, collect, LabProber, rawUnary, startApiFixture, status, until, type ApiFixture, type KnownPod } from '../support/api-harness.ts';

let lab: Lab;
let helper: ResidentHelper;
let pods: KnownPod[];
let prober: LabProber;
let fx: ApiFixture;
let client: ProbeApiClient;

const HTTP = 8080;
const TCP = 8081;
const HANG = 8082;
const GRPC = 9090;

beforeAll(async () => {
  lab = await createLab({ pods: 1, policy: 'drop', tag: 'api.test' });
  [, helper] = await Promise.all([
    lab.startServer(lab.pods[0]!, { http: HTTP, tcp: TCP, hang: HANG, grpc: GRPC }),
    ResidentHelper.start(),
  ]);
  const p0 = lab.pods[0]!;
  pods = [
    {
      uid: 'uid-web', namespace: 'default', name: 'web', sandboxId: 'sandbox-web', netns: p0.netns, podIPs: p0.ips,
      containers: [{ name: 'app', ports: [{ name: 'http', containerPort: HTTP }, { name: 'grpc', containerPort: GRPC }] }],
    },
    { uid: 'uid-host', namespace: 'kube-system', name: 'hostnet', sandboxId: 'sandbox-host', netns: p0.netns, podIPs: p0.ips, hostNetwork: true, containers: [] },
    { uid: 'uid-gone', namespace: 'default', name: 'gone', sandboxId: 'sandbox-gone', netns: `/run/netns/pa-api-test-gone-${process.pid}`, podIPs: ['10.0.0.1'], containers: [] },
  ];
  prober = new LabProber({ pods, sockets: helper });
  fx = await startApiFixture({ prober, featureGates: new FeatureGates().list(), reflection: true });
  client = new ProbeApiClient(fx.socket);
});

afterAll(async () => {
  client?.close();
  await fx?.close();
  await helper?.close();
  await lab?.destroy();
});

describe('Version', () => {
  it('reports the agent, the API version, the feature gates and the instance', async () => {
    const v = await client.version();
    expect(v).toMatchObject({ agentName: 'probe-agent', apiVersion: 'v1alpha1', instanceId: fx.server.instanceId });
    expect(v.agentVersion).toMatch(/^\d+\.\d+\.\d+/);
    expect(v.featureGates).toEqual(new FeatureGates().list().map((g) => ({ name: g.name, stage: g.stage, enabled: g.enabled })));
    expect(v.instanceId).toMatch(/^[0-9a-f-]{36}$/);
  });
});

describe('Probe', () => {
  it('runs an HTTP probe inside the pod netns, naming the pod by UID, sandbox ID or namespace/name', async () => {
    for (const pod of [{ uid: 'uid-web' }, { sandboxId: 'sandbox-web' }, { namespace: 'default', name: 'web' }]) {
      const out = await client.probe({ pod, handler: { kind: 'http', port: HTTP, path: '/healthz', scheme: 'HTTP', headers: [] }, timeoutSeconds: 2 });
      expect(out.result, JSON.stringify(pod)).toBe('success');
      expect(out.address).toContain(String(HTTP));
      expect(out.phases.total).toBeGreaterThan(0);
      expect(out.phases.connect).toBeGreaterThan(0);
    }
    // The node itself is blocked from the pod: the probe above can only have run inside the netns.
    const before = await lab.nodeToPodDrops();
    const s = net.connect({ host: lab.pods[0]!.ipv4, port: HTTP });
    s.on('error', () => {});
    await new Promise((r) => setTimeout(r, 200));
    s.destroy();
    expect(await lab.nodeToPodDrops()).toBeGreaterThan(before);
  });

  it('resolves named ports against the container, and reports an unknown one as ERROR', async () => {
    const named = await client.probe({ pod: { uid: 'uid-web' }, containerName: 'app', handler: { kind: 'http', port: 'http', path: '/healthz', scheme: 'HTTP', headers: [] } });
    expect(named.result).toBe('success');
    const unknown = await client.probe({ pod: { uid: 'uid-web' }, containerName: 'app', handler: { kind: 'tcp', port: 'nope' } });
    expect(unknown).toMatchObject({ result: 'error', reason: 'port-unresolved' });
  });

  it('returns a failed probe as a successful RPC carrying FAILURE, without the body', async () => {
    const bad = await client.probe({ pod: { uid: 'uid-web' }, handler: { kind: 'http', port: HTTP, path: '/secret', scheme: 'HTTP', headers: [] } });
    expect(bad).toMatchObject({ result: 'failure', reason: 'status' });
    expect(bad.message).toContain('statuscode: 500');
    expect(bad.message).not.toContain('TOP-SECRET-BODY');
    const refused = await client.probe({ pod: { uid: 'uid-web' }, handler: { kind: 'tcp', port: 8099 } });
    expect(refused).toMatchObject({ result: 'failure', reason: 'refused' });
    const grpcOk = await client.probe({ pod: { uid: 'uid-web' }, handler: { kind: 'grpc', port: GRPC } });
    expect(grpcOk.result).toBe('success');
    const warn = await client.probe({
      pod: { uid: 'uid-web' },
      handler: { kind: 'http', port: HTTP, path: `/redirect?to=${encodeURIComponent('http://other.example/')}&code=302`, scheme: 'HTTP', headers: [] },
    });
    expect(warn.result).toBe('warning');
  });

  it('maps every refusal onto its status code, with the field path for bad handlers', async () => {
    const tcp = { tcp_socket: { port: { int_val: TCP } } };
    const cases: [unknown, grpc.status, RegExp][] = [
      [{ pod_uid: 'uid-web', handler: { tcp_socket: { port: { int_val: 0 } } } }, grpc.status.INVALID_ARGUMENT, /^handler\.tcp_socket\.port: must be 1\.\.65535/],
      [{ pod_uid: 'uid-web', handler: { http_get: { port: { int_val: 80 }, http_headers: [{ name: 'a b', value: '' }] } } }, grpc.status.INVALID_ARGUMENT, /^handler\.http_get\.http_headers\[0\]\.name/],
      [{ pod_uid: 'uid-web', handler: { http_get: { port: { int_val: 80 } }, ...tcp } }, grpc.status.INVALID_ARGUMENT, /more than 1 handler/],
      [{ pod_uid: 'uid-web', handler: {} }, grpc.status.INVALID_ARGUMENT, /must specify a handler/],
      [{ pod_uid: 'uid-web' }, grpc.status.INVALID_ARGUMENT, /^handler: required/],
      [{ pod_uid: 'uid-web', pod_sandbox_id: 'sandbox-web', handler: tcp }, grpc.status.INVALID_ARGUMENT, /exactly one of pod_uid/],
      [{ pod_namespace: 'default', handler: tcp }, grpc.status.INVALID_ARGUMENT, /^pod_name: required/],
      [{ pod_uid: 'uid-web', handler: tcp, timeout_seconds: 4000 }, grpc.status.INVALID_ARGUMENT, /^timeout_seconds/],
      [{ pod_uid: 'no-such-pod', handler: tcp }, grpc.status.NOT_FOUND, /not known on this node/],
      [{ pod_uid: 'uid-host', handler: tcp }, grpc.status.FAILED_PRECONDITION, /host network/],
      [{ pod_uid: 'uid-gone', handler: tcp }, grpc.status.UNAVAILABLE, /not available/],
      [{ pod_uid: 'x'.repeat(2 * 1024 * 1024), handler: tcp }, grpc.status.RESOURCE_EXHAUSTED, /larger than max/i],
    ];
    for (const [req, code, details] of cases) {
      const got = await codeOf(rawUnary(fx.socket, 'Probe', req));
      expect(grpc.status[got.code], JSON.stringify(req).slice(0, 120)).toBe(grpc.status[code]);
      expect(got.details).toMatch(details);
    }
  });

  it('returns RESOURCE_EXHAUSTED when the limiter queue or the API in-flight cap is full', async () => {
    const tight = new LabProber({ pods, sockets: helper, limiter: new FairLimiter({ maxInFlight: 1, maxQueued: 0 }) });
    const fx2 = await startApiFixture({ prober: tight });
    const fx3 = await startApiFixture({ prober, maxInFlightProbes: 1 });
    try {
      for (const [f, msg] of [[fx2, /queue full/], [fx3, /too many Probe calls/]] as const) {
        const hang = { pod_uid: 'uid-web', handler: { tcp_socket: { port: { int_val: HANG } } }, timeout_seconds: 2 };
        const first = rawUnary(f.socket, 'Probe', { ...hang, handler: { http_get: { port: { int_val: HANG } } } }, 400).catch((e: unknown) => e);
        await until(() => f.server.stats().probesInFlight === 1, 2000, 'first probe in flight');
        const got = await codeOf(rawUnary(f.socket, 'Probe', hang));
        expect(got.code).toBe(grpc.status.RESOURCE_EXHAUSTED);
        expect(got.details).toMatch(msg);
        await first;
      }
    } finally {
      await Promise.all([fx2.close(), fx3.close()]);
    }
  });

  it('lets the call deadline cap the probe: DEADLINE_EXCEEDED just before the deadline, slot released', async () => {
    const t0 = performance.now();
    const req = { pod_uid: 'uid-web', handler: { http_get: { port: { int_val: HANG } } }, timeout_seconds: 10 };
    const got = await codeOf(rawUnary(fx.socket, 'Probe', req, 300));
    const elapsed = performance.now() - t0;
    expect(got.code).toBe(grpc.status.DEADLINE_EXCEEDED);
    // The agent answers by the deadline less the reply margin, so that its answer is heard.
    expect(elapsed).toBeGreaterThanOrEqual(300 - REPLY_MARGIN_MS - 10);
    // Cut by the 300 ms call deadline, not by the probe's own 10 s timeout.
    expect(elapsed).toBeLessThan(5000);
    await until(() => fx.server.stats().probesInFlight === 0 && prober.limiter.inFlight === 0, 5000, 'the aborted probe to release its slot');
    // A probe timeout inside the deadline is the probe's own result: FAILURE, not a status code.
    const own = await client.probe({ pod: { uid: 'uid-web' }, handler: { kind: 'http', port: HANG, path: '/', scheme: 'HTTP', headers: [] }, timeoutSeconds: 1, deadlineMs: 5000 });
    expect(own).toMatchObject({ result: 'failure', reason: 'timeout' });
  });
});

describe('ListProbeStatus', () => {
  it('lists statuses sorted, filtered, with the revision and nanosecond times', async () => {
    const t = Date.UTC(2030, 0, 2, 3, 4, 5, 678);
    fx.store.upsert(status('u-b', 'ns-b', 'Readiness', 'failure', { lastProbeTime: t }));
    fx.store.upsert(status('u-a', 'ns-a', 'Startup', 'success'));
    fx.store.upsert(status('u-a', 'ns-a', 'Liveness', 'success'));
    fx.store.upsert(status('u-a', 'ns-a', 'Readiness', 'error', { lastReason: 'port-unresolved' }));
    const all = await client.listStatus();
    expect(all.instanceId).toBe(fx.server.instanceId);
    expect(all.revision).toBe(fx.store.revision());
    expect(all.statuses.map((s) => `${s.namespace}/${s.key.probeType}`)).toEqual(['ns-a/Liveness', 'ns-a/Readiness', 'ns-a/Startup', 'ns-b/Readiness']);
    expect(all.statuses[1]).toMatchObject({ result: 'error', lastReason: 'port-unresolved', ready: false });
    expect(all.statuses[3]?.lastProbeTime).toBe(t);
    const raw = await rawUnary<{ statuses: { last_probe_time: string }[] }>(fx.socket, 'ListProbeStatus', { filter: { pod_uid: 'u-b' } });
    expect(raw.statuses.map((s) => s.last_probe_time)).toEqual([`${BigInt(t) * 1_000_000n}`]);
    expect((await client.listStatus({ namespace: 'ns-a', probeType: 'Startup' })).statuses.map((s) => s.key.podUID)).toEqual(['u-a']);
    const bad = await codeOf(rawUnary(fx.socket, 'ListProbeStatus', { filter: { probe_type: 7 } }));
    expect(bad.code).toBe(grpc.status.INVALID_ARGUMENT);
    for (const s of fx.store.list()) fx.store.remove(s.key);
  });
});

describe('socket, health, reflection, shutdown', () => {
  it('creates the socket 0600 in a 0700 directory; a non-root user cannot connect unless its group is allowed', async () => {
    const st = await stat(fx.socket);
    expect(st.mode & 0o777).toBe(0o600);
    expect(st.uid).toBe(0);
    expect((await stat(join(fx.dir, 'run'))).mode & 0o777).toBe(0o700);

    const dir = await mkdtemp(join(tmpdirOthersReach(), 'pa-api-perm-'));
    await chmod(dir, 0o755); // an existing, world-searchable directory: only the socket's mode protects it
    // nobody may not reach the checkout's node binary (a clone under /root): it runs its own copy.
    const nodeForNobody = portableNode();
    const tryAsNobody = (path: string): Promise<string> => runNodeAs(nodeForNobody.node, 65534, connectScript(path));
    try {
      await writeFile(join(dir, 'before'), '');
      // Started together: the private umask of the two binds must not leak into the process.
      const [closed, shared] = await Promise.all([
        ProbeApiServer.start({ results: new ResultsStore(), prober, socketPath: join(dir, 'closed.sock') }),
        ProbeApiServer.start({ results: new ResultsStore(), prober, socketPath: join(dir, 'shared.sock'), socketGroup: 'nogroup' }),
      ]);
      await writeFile(join(dir, 'after'), '');
      try {
        expect((await stat(join(dir, 'after'))).mode).toBe((await stat(join(dir, 'before'))).mode);
        expect((await stat(join(dir, 'shared.sock'))).mode & 0o777).toBe(0o660);
        expect((await stat(join(dir, 'shared.sock'))).gid).toBe(65534);
        expect(await tryAsNobody(join(dir, 'closed.sock'))).toBe('EACCES');
        expect(await tryAsNobody(join(dir, 'shared.sock'))).toBe('connected');
      } finally {
        await Promise.all([closed.stop(), shared.stop()]);
      }
    } finally {
      await rm(dir, { recursive: true, force: true });
      nodeForNobody.remove();
    }
  });

  it('replaces a stale socket, refuses a live one or a non-socket, and removes its socket at exit', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'pa-api-stale-'));
    const path = join(dir, 'probe.sock');
    try {
      // A socket left by a killed process: nothing answers on it.
      const child = spawn(process.execPath, ['-e', `require('net').createServer().listen(${JSON.stringify(path)},()=>console.log('up'))`]);
      await once(child.stdout, 'data');
      child.kill('SIGKILL');
      await once(child, 'exit');
      expect((await stat(path)).isSocket()).toBe(true);
      const srv = await ProbeApiServer.start({ results: new ResultsStore(), prober, socketPath: path });
      const live = await codeOf(ProbeApiServer.start({ results: new ResultsStore(), prober, socketPath: path }));
      expect(live.details).toMatch(/another process is serving/);
      await expect(ProbeApiServer.start({ results: new ResultsStore(), prober, socketPath: path })).rejects.toBeInstanceOf(SocketInUseError);
      const c = new ProbeApiClient(path);
      expect((await c.version()).instanceId).toBe(srv.instanceId); // the refused starts left it alone
      c.close();
      await srv.stop();
      await expect(stat(path)).rejects.toMatchObject({ code: 'ENOENT' });
      await writeFile(path, 'not a socket');
      await expect(ProbeApiServer.start({ results: new ResultsStore(), prober, socketPath: path })).rejects.toBeInstanceOf(ConfigError);
      expect((await stat(path)).isFile()).toBe(true);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('serves grpc.health.v1 and server reflection on the same socket', async () => {
    const healthPkg = grpc.loadPackageDefinition(protoLoader.loadSync(join(process.cwd(), 'node_modules/grpc-health-check/proto/health/v1/health.proto'), { enums: String })) as any;
    const h = new healthPkg.grpc.health.v1.Health(`unix:${fx.socket}`, grpc.credentials.createInsecure());
    for (const service of ['', 'probe.v1alpha1.ProbeService']) {
      const res = await new Promise<{ status: string }>((resolve, reject) => h.Check({ service }, (e: Error | null, r: { status: string }) => (e ? reject(e) : resolve(r))));
      expect(res.status).toBe('SERVING');
    }
    h.close();
    const reflPkg = grpc.loadPackageDefinition(
      protoLoader.loadSync(join(process.cwd(), 'node_modules/@grpc/reflection/build/proto/grpc/reflection/v1/reflection.proto'), { keepCase: true }),
    ) as any;
    const listServices = async (socket: string): Promise<string[]> => {
      const r = new reflPkg.grpc.reflection.v1.ServerReflection(`unix:${socket}`, grpc.credentials.createInsecure());
      const call = r.ServerReflectionInfo();
      call.on('error', () => {}); // the cancel below ends the call with CANCELLED
      const reply = once(call, 'data').catch((e: Error) => [e]);
      call.write({ list_services: '' });
      const [msg] = (await reply) as [{ list_services_response?: { service: { name: string }[] } } | Error];
      call.cancel();
      r.close();
      if (msg instanceof Error) throw msg;
      return msg.list_services_response?.service.map((s) => s.name) ?? [];
    };
    expect(await listServices(fx.socket)).toEqual(expect.arrayContaining(['probe.v1alpha1.ProbeService', 'grpc.health.v1.Health']));
    const plain = await startApiFixture({ prober });
    try {
      expect((await codeOf(listServices(plain.socket))).code).toBe(grpc.status.UNIMPLEMENTED);
    } finally {
      await plain.close();
    }
  });

  it('drains on shutdown: NOT_SERVING first, watchers told where to resume, in-flight probes finish, new calls refused', async () => {
    const f = await startApiFixture({ prober, shutdownGraceMs: 5000 });
    const c = new ProbeApiClient(f.socket);
    const healthPkg = grpc.loadPackageDefinition(protoLoader.loadSync(join(process.cwd(), 'node_modules/grpc-health-check/proto/health/v1/health.proto'), { enums: String })) as any;
    const h = new healthPkg.grpc.health.v1.Health(`unix:${f.socket}`, grpc.credentials.createInsecure());
    try {
      f.store.upsert(status('d1', 'ns', 'Readiness', 'success'));
      const healthSeen: string[] = [];
      h.Watch({ service: 'probe.v1alpha1.ProbeService' }).on('data', (m: { status: string }) => healthSeen.push(m.status)).on('error', () => {});
      const w = collect(c.watch());
      await until(() => healthSeen.length === 1 && w.items.length === 1, 2000, 'health watch and probe watch');
      const slow = c.probe({ pod: { uid: 'uid-web' }, handler: { kind: 'http', port: HTTP, path: '/slow?ms=700', scheme: 'HTTP', headers: [] }, timeoutSeconds: 5 });
      await until(() => f.server.stats().probesInFlight === 1, 2000, 'probe in flight');
      const t0 = performance.now();
      const stopping = f.server.stop();
      await until(() => healthSeen.includes('NOT_SERVING'), 5000, 'NOT_SERVING');
      // New calls are refused during the drain, while the probe is still in flight (not only once it is over).
      const during = await codeOf(c.version(2000));
      expect(during.code).toBe(grpc.status.UNAVAILABLE);
      expect(f.server.stats().probesInFlight).toBe(1);
      await w.done;
      expect(w.error?.grpcCode).toBe(grpc.status.UNAVAILABLE);
      expect(w.error?.message).toMatch(/resume from revision 1/);
      expect((await slow).result).toBe('success');
      await stopping;
      const took = performance.now() - t0;
      expect(took).toBeGreaterThan(500);
      expect(took).toBeLessThan(10_000);
      await expect(stat(f.socket)).rejects.toMatchObject({ code: 'ENOENT' });
      const after = await codeOf(c.version(1000));
      expect(after.code).toBe(grpc.status.UNAVAILABLE);
    } finally {
      h.close();
      c.close();
      await f.close();
    }
  });

  it('cancels what is still running when the grace period ends, and aborts its probes', async () => {
    const f = await startApiFixture({ prober, shutdownGraceMs: 300 });
    const c = new ProbeApiClient(f.socket);
    try {
      const hung = codeOf(c.probe({ pod: { uid: 'uid-web' }, handler: { kind: 'http', port: HANG, path: '/', scheme: 'HTTP', headers: [] }, timeoutSeconds: 20 }));
      await until(() => f.server.stats().probesInFlight === 1, 2000, 'probe in flight');
      const t0 = performance.now();
      await f.server.stop();
      // Cut by the 300 ms grace period, not by the probe's 20 s timeout.
      expect(performance.now() - t0).toBeLessThan(10_000);
      expect([grpc.status.CANCELLED, grpc.status.UNAVAILABLE, grpc.status.INTERNAL]).toContain((await hung).code);
      await until(() => f.server.stats().probesInFlight === 0 && prober.limiter.inFlight === 0, 5000, 'the probe to be aborted');
    } finally {
      c.close();
      await f.close();
    }
  });
});
