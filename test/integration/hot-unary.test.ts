/**
 * The kubelet shim's own socket (agent/api/hot-unary.ts, agent/contract/shim-socket.ts) and the ProbeService
 * socket beside it, on real sockets with real probes in a lab pod. The shim's socket is root-only
 * (0600, whatever the socket group), serves ExecSync and answers every other method UNIMPLEMENTED;
 * its answers, status codes, admission gate and cancellation are those grpc-js gives the same call
 * on the ProbeService socket. The ProbeService socket guesses nothing: a shim-shaped connection
 * there (no user-agent, ExecSync first) is served by grpc-js like any other, every method on it.
 * The shim's client falls back to the ProbeService socket only when nothing listens on its own.
 */
import { requireRoot } from '../support/root.ts';
import { existsSync, mkdtempSync, rmSync, statSync, symlinkSync } from 'node:fs';
import * as http2 from 'node:http2';
import * as net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApiError, ProbeApiClient } from '../../agent/api/client.ts';
import { AgentCallError, ShimProbeClient } from '../../agent/shim/agent-client.ts';
import type { ProbeHandler } from '../../agent/probe/types.ts';
import type { OnDemandProbeRequest, OnDemandProber } from '../../agent/scheduler/types.ts';
import { encodeFrame } from '../../agent/grpc/frame.ts';
import { readFields, WireWriter } from '../../agent/grpc/protowire.ts';
import { encodeShimCommand } from '../../agent/contract/shim-command.ts';
import { execSyncRequest } from '../support/relay-harness.ts';
import { ResidentHelper } from '../../agent/netns/helper.ts';
import { createLab, type Lab } from '../lab/lab.ts';
import { codeOf, LabProber, startApiFixture, until, type ApiFixture, type KnownPod } from '../support/api-harness.ts';

requireRoot();

let lab: Lab;
let helper: ResidentHelper;
let prober: LabProber;
/** The shim names a pod by container ID only; the lab prober knows pods by UID: map one to the other. */
let byContainer: OnDemandProber;
let pods: KnownPod[];
const HTTP = 8080;
const HANG = 8082;
const HTTP_HANDLER: ProbeHandler = { kind: 'http', port: HTTP, path: '/healthz', scheme: 'HTTP', headers: [] };

beforeAll(async () => {
  lab = await createLab({ pods: 1, policy: 'drop', tag: 'api-hot' });
  [, helper] = await Promise.all([lab.startServer(lab.pods[0]!, { http: HTTP, hang: HANG }), ResidentHelper.start()]);
  const p0 = lab.pods[0]!;
  pods = [{ uid: 'uid-web', namespace: 'default', name: 'web', sandboxId: 'sandbox-web', netns: p0.netns, podIPs: p0.ips, containers: [{ name: 'app', ports: [] }] }];
  prober = new LabProber({ pods, sockets: helper });
  byContainer = {
    probe: (req: OnDemandProbeRequest, signal?: AbortSignal) => prober.probe(req.containerID === 'ctr-web' ? { ...req, podUID: 'uid-web', containerID: undefined } : req, signal),
  } as OnDemandProber;
});

afterAll(async () => {
  await helper?.close();
  await lab?.destroy();
});

/** A shim-shaped connection: node:http2, no user-agent, messages by hand. */
function shimSession(socket: string): http2.ClientHttp2Session {
  const s = http2.connect('http://probe-agent', { createConnection: () => net.connect(socket) });
  s.on('error', () => {});
  return s;
}

interface RawAnswer { status: number; message: string; fields: Map<number, unknown>; stream: http2.ClientHttp2Stream }

function rawCall(s: http2.ClientHttp2Session, fullPath: string, msg: Buffer, timeout = '10S'): { stream: http2.ClientHttp2Stream; done: Promise<RawAnswer> } {
  const stream = s.request({ ':method': 'POST', ':path': fullPath, 'content-type': 'application/grpc', te: 'trailers', 'grpc-timeout': timeout });
  const done = new Promise<RawAnswer>((resolve) => {
    const chunks: Buffer[] = [];
    let meta: http2.IncomingHttpHeaders = {};
    stream.on('response', (h) => { meta = { ...meta, ...h }; });
    stream.on('trailers', (t) => { meta = { ...meta, ...t }; });
    stream.on('data', (c: Buffer) => chunks.push(c));
    stream.on('error', () => {});
    stream.on('close', () => {
      const body = Buffer.concat(chunks);
      const out: RawAnswer = { status: Number(meta['grpc-status'] ?? -1), message: decodeURIComponent(String(meta['grpc-message'] ?? '')), fields: new Map(), stream };
      if (body.length >= 5) readFields(body.subarray(5), (f, v) => out.fields.set(f, v));
      resolve(out);
    });
  });
  stream.end(encodeFrame(msg));
  return { stream, done };
}

const SERVICE = '/probe.v1alpha1.ProbeService/';

/** ProbeRequest {pod_uid = 1, handler = 4 {http_get = 2 {path = 1, port = 2 {int_val = 1}}}, timeout_seconds = 5}, as a shim before ExecSync sent it. */
function probeMsg(uid: string, port: number, timeoutSeconds: number): Buffer {
  const httpGet = new WireWriter().bytes(1, '/healthz').bytes(2, new WireWriter().varint(1, port).finish(), true).finish();
  return new WireWriter().bytes(1, uid).bytes(4, new WireWriter().bytes(2, httpGet, true).finish(), true).varint(5, timeoutSeconds).finish();
}

/** Kubelet's ExecSyncRequest for a rewritten HTTP probe of `port`, as the shim forwards it. */
function execMsg(containerId: string, kind: 'liveness' | 'readiness', port: number, timeoutSeconds: number): Buffer {
  return execSyncRequest(containerId, encodeShimCommand(kind, { httpGet: { path: '/healthz', port } }), timeoutSeconds);
}

describe("the shim's socket", () => {
  let fx: ApiFixture;
  beforeAll(async () => {
    // A socket group opens the ProbeService socket to it; never the shim's.
    fx = await startApiFixture({ prober: byContainer, socketGroup: 'nogroup', maxInFlightProbes: 1 });
  });
  afterAll(async () => {
    await fx?.close();
  });

  it('is root-only (0600) beside the ProbeService socket (0660 with a group), and serves ExecSync alone: every other method is UNIMPLEMENTED', async () => {
    expect(fx.shimSocket).toBe(path.join(path.dirname(fx.socket), 'probe-shim.sock'));
    const shim = statSync(fx.shimSocket);
    expect(shim.isSocket()).toBe(true);
    expect(shim.mode & 0o777).toBe(0o600);
    expect(shim.uid).toBe(process.getuid!());
    expect(statSync(fx.socket).mode & 0o777).toBe(0o660);
    const s = shimSession(fx.shimSocket);
    try {
      const ok = await rawCall(s, `${SERVICE}ExecSync`, execMsg('ctr-web', 'readiness', HTTP, 2)).done;
      expect(ok.status).toBe(0);
      expect(ok.fields.get(3) ?? 0).toBe(0); // exit_code 0
      for (const [method, msg] of [[`${SERVICE}Probe`, probeMsg('uid-web', HTTP, 1)], [`${SERVICE}RunLifecycleHandler`, Buffer.alloc(0)], [`${SERVICE}Version`, Buffer.alloc(0)],
        [`${SERVICE}ListProbeStatus`, Buffer.alloc(0)], ['/grpc.health.v1.Health/Check', Buffer.alloc(0)]] as const) {
        const other = await rawCall(s, method, msg).done;
        expect(other.status, method).toBe(grpc.status.UNIMPLEMENTED);
        expect(other.message, method).toContain("the kubelet shim's socket serves only ExecSync");
      }
      // Nothing ran for the refused Probe: the one probe slot is free.
      expect(fx.server.stats().probesInFlight).toBe(0);
    } finally {
      s.close();
    }
  });

  it('answers ExecSync as grpc-js does on the ProbeService socket (the same NOT_FOUND details), and grpc-js clients there are unaffected', async () => {
    const shim = new ShimProbeClient(fx.shimSocket);
    // A shim of the release before the shim's socket: ExecSync on the ProbeService socket, served by grpc-js.
    const previousShim = new ShimProbeClient(fx.socket);
    const grpcClient = new ProbeApiClient(fx.socket);
    try {
      const body = encodeFrame(execMsg('ctr-nope', 'liveness', HTTP, 1));
      const lean = await shim.execSync(body, { deadlineMs: 10_000 }).then(() => undefined, (e: unknown) => e as AgentCallError);
      const viaGrpcJs = await previousShim.execSync(body, { deadlineMs: 10_000 }).then(() => undefined, (e: unknown) => e as AgentCallError);
      expect(lean).toMatchObject({ failure: 'status', grpcCode: grpc.status.NOT_FOUND });
      expect(viaGrpcJs).toMatchObject({ failure: 'status', grpcCode: grpc.status.NOT_FOUND });
      expect(lean!.message).toMatch(/^probe-agent refused the liveness probe: \S/);
      expect(viaGrpcJs!.message).toBe(lean!.message);
      const answered = await previousShim.execSync(encodeFrame(execMsg('ctr-web', 'readiness', HTTP, 2)), { deadlineMs: 10_000 });
      expect(answered.exitCode).toBe(0);
      expect((await grpcClient.version()).apiVersion).toBe('v1alpha1');
    } finally {
      shim.close();
      previousShim.close();
      grpcClient.close();
    }
  });

  it('shares the admission gate with grpc-js (RESOURCE_EXHAUSTED beyond it), and a reset stream cancels the probe it runs', async () => {
    const s = shimSession(fx.shimSocket);
    const grpcClient = new ProbeApiClient(fx.socket);
    try {
      const hung = rawCall(s, `${SERVICE}ExecSync`, execMsg('ctr-web', 'liveness', HANG, 20), '30S');
      await until(() => fx.server.stats().probesInFlight === 1, 5000, 'the hanging probe in flight');
      const refused = await rawCall(s, `${SERVICE}ExecSync`, execMsg('ctr-web', 'readiness', HTTP, 1)).done;
      expect(refused.status).toBe(grpc.status.RESOURCE_EXHAUSTED);
      expect((await codeOf(grpcClient.probe({ pod: { uid: 'uid-web' }, handler: HTTP_HANDLER, timeoutSeconds: 1 }))).code).toBe(grpc.status.RESOURCE_EXHAUSTED);
      hung.stream.close(http2.constants.NGHTTP2_CANCEL);
      // Cut by the reset, long before the probe's own 20 s timeout.
      await until(() => fx.server.stats().probesInFlight === 0 && prober.limiter.inFlight === 0, 5000, 'the cancelled probe to be aborted');
    } finally {
      s.close();
      grpcClient.close();
    }
  });
});

describe('the ProbeService socket guesses nothing', () => {
  let fx: ApiFixture;
  beforeAll(async () => {
    fx = await startApiFixture({ prober: byContainer });
  });
  afterAll(async () => {
    await fx?.close();
  });

  it('a shim-shaped connection whose first call is ExecSync is served by grpc-js: Probe and Version follow on the same connection', async () => {
    const s = shimSession(fx.socket);
    try {
      const exec = await rawCall(s, `${SERVICE}ExecSync`, execMsg('ctr-web', 'readiness', HTTP, 2)).done;
      expect(exec.status).toBe(0);
      const probe = await rawCall(s, `${SERVICE}Probe`, probeMsg('uid-web', HTTP, 1)).done;
      expect(probe.status).toBe(0);
      expect(probe.fields.get(1)).toBe(1); // PROBE_RESULT_SUCCESS
      const version = await rawCall(s, `${SERVICE}Version`, Buffer.alloc(0)).done;
      expect(version.status).toBe(0);
      expect((version.fields.get(3) as Buffer).toString()).toBe('v1alpha1'); // api_version
    } finally {
      s.close();
    }
  });

  it('both sockets at once: 60 shim ExecSyncs on one connection and 20 grpc-js probes, every answer right', async () => {
    const shim = new ShimProbeClient(fx.shimSocket, fx.socket);
    const grpcClient = new ProbeApiClient(fx.socket);
    try {
      const body = encodeFrame(execMsg('ctr-web', 'readiness', HTTP, 2));
      const viaShim = Array.from({ length: 60 }, () => shim.execSync(body, { deadlineMs: 10_000 }));
      const viaGrpcJs = Array.from({ length: 20 }, () => grpcClient.probe({ pod: { uid: 'uid-web' }, handler: HTTP_HANDLER, timeoutSeconds: 2 }));
      const [a, b] = await Promise.all([Promise.all(viaShim), Promise.all(viaGrpcJs)]);
      expect(a.map((x) => x.exitCode)).toEqual(Array(60).fill(0));
      expect(b.map((x) => x.result)).toEqual(Array(20).fill('success'));
      const notFound = await codeOf(grpcClient.probe({ pod: { uid: 'uid-nope' }, handler: HTTP_HANDLER, timeoutSeconds: 1 }));
      expect(notFound.code).toBe(grpc.status.NOT_FOUND);
      expect(await grpcClient.probe({ pod: { uid: 'uid-nope' }, handler: HTTP_HANDLER, timeoutSeconds: 1 }).catch((e: unknown) => e)).toBeInstanceOf(ApiError);
    } finally {
      shim.close();
      grpcClient.close();
    }
  });
});

describe("the shim's client and an agent without the shim's socket", () => {
  let fx: ApiFixture;
  beforeAll(async () => {
    fx = await startApiFixture({ prober: byContainer });
  });
  afterAll(async () => {
    await fx?.close();
  });

  it("goes to the ProbeService socket when nothing listens on the shim's, and reports the shim's socket when neither listens", async () => {
    const scratch = mkdtempSync(path.join(tmpdir(), 'pa-noshim-'));
    const absent = path.join(scratch, 'probe-shim.sock');
    const heard: Array<[string, boolean]> = [];
    const withFallback = new ShimProbeClient(absent, fx.socket, (socket, fallback) => heard.push([socket, fallback]));
    const nowhere = new ShimProbeClient(absent, path.join(scratch, 'probe.sock'));
    try {
      const body = encodeFrame(execMsg('ctr-web', 'readiness', HTTP, 2));
      expect((await withFallback.execSync(body, { deadlineMs: 10_000 })).exitCode).toBe(0);
      expect((await withFallback.execSync(body, { deadlineMs: 10_000 })).exitCode).toBe(0);
      // Said once, when answers first came through the ProbeService socket.
      expect(heard).toEqual([[fx.socket, true]]);
      const away = await nowhere.execSync(body, { deadlineMs: 10_000 }).then(() => undefined, (e: unknown) => e as AgentCallError);
      expect(away).toMatchObject({ failure: 'unreachable', notStarted: true, agentAway: true });
      expect(away!.message).toContain(absent);
      // The agent's shim socket appears (the agent was upgraded): said once more.
      symlinkSync(fx.shimSocket, absent);
      expect((await withFallback.execSync(body, { deadlineMs: 10_000 })).exitCode).toBe(0);
      expect(heard).toEqual([[fx.socket, true], [absent, false]]);
    } finally {
      withFallback.close();
      nowhere.close();
      rmSync(scratch, { recursive: true, force: true });
    }
  });

  it("a stopped agent removes both sockets", async () => {
    const own = await startApiFixture({ prober: byContainer, dir: mkdtempSync(path.join(tmpdir(), 'pa-stop-')) });
    try {
      expect(existsSync(own.socket) && existsSync(own.shimSocket)).toBe(true);
      await own.server.stop();
      expect([existsSync(own.socket), existsSync(own.shimSocket)]).toEqual([false, false]);
    } finally {
      rmSync(own.dir, { recursive: true, force: true });
    }
  });
});
