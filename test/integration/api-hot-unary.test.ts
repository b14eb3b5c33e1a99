/**
 * The agent's lean server for the shim's connections (agent/api/hot-unary.ts), on a real socket
 * with real probes in a lab pod: a connection whose first call is Probe (an older shim) or
 * ExecSync (the shim) from a client that is no gRPC library is served by it, with the same
 * answers, status codes, admission gate and cancellation as grpc-js; other methods on such a
 * connection are UNIMPLEMENTED, and grpc-js clients on the same socket are unaffected.
 */
import { requireRoot } from '../support/root.ts';
import * as http2 from 'node:http2';
import * as net from 'node:net';
import * as grpc from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApiError, ProbeApiClient } from '../../agent/api/client.ts';
import { AgentCallError, ShimProbeClient } from '../../agent/api/shim-client.ts';
import type { OnDemandProbeRequest, OnDemandProber } from '../../agent/scheduler/types.ts';
import { encodeFrame } from '../../agent/grpc/frame.ts';
import { readFields, WireWriter } from '../../agent/grpc/protowire.ts';
import { encodeShimCommand } from '../../agent/rewrite/shim-command.ts';
import { execSyncRequest } from '../support/relay-harness.ts';
import { ResidentHelper } from '../../agent/netns/helper.ts';
import { createLab, type Lab } from '../lab/lab.ts';
import { codeOf, LabProber, startApiFixture, until, type ApiFixture, type KnownPod } from '../support/api-harness.ts';

requireRoot();

let lab: Lab;
let helper: ResidentHelper;
let prober: LabProber;
let pods: KnownPod[];
const HTTP = 8080;
const HANG = 8082;

beforeAll(async () => {
  lab = await createLab({ pods: 1, policy: 'drop', tag: 'api-hot' });
  [, helper] = await Promise.all([lab.startServer(lab.pods[0]!, { http: HTTP, hang: HANG }), ResidentHelper.start()]);
  const p0 = lab.pods[0]!;
  pods = [{ uid: 'uid-web', namespace: 'default', name: 'web', sandboxId: 'sandbox-web', netns: p0.netns, podIPs: p0.ips, containers: [{ name: 'app', ports: [] }] }];
  prober = new LabProber({ pods, sockets: helper });
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

interface RawAnswer { status: number; message: string; result?: number; text?: string; stream: http2.ClientHttp2Stream }

function rawCall(s: http2.ClientHttp2Session, method: string, msg: Buffer, timeout = '10S'): { stream: http2.ClientHttp2Stream; done: Promise<RawAnswer> } {
  const stream = s.request({ ':method': 'POST', ':path': `/probe.v1alpha1.ProbeService/${method}`, 'content-type': 'application/grpc', te: 'trailers', 'grpc-timeout': timeout });
  const done = new Promise<RawAnswer>((resolve) => {
    const chunks: Buffer[] = [];
    let meta: http2.IncomingHttpHeaders = {};
    stream.on('response', (h) => { meta = { ...meta, ...h }; });
    stream.on('trailers', (t) => { meta = { ...meta, ...t }; });
    stream.on('data', (c: Buffer) => chunks.push(c));
    stream.on('error', () => {});
    stream.on('close', () => {
      const body = Buffer.concat(chunks);
      const out: RawAnswer = { status: Number(meta['grpc-status'] ?? -1), message: decodeURIComponent(String(meta['grpc-message'] ?? '')), stream };
      if (body.length >= 5) {
        readFields(body.subarray(5), (f, v) => {
          if (f === 1 && typeof v === 'number') out.result = v;
          if (f === 2 && Buffer.isBuffer(v)) out.text = v.toString('utf8');
        });
      }
      resolve(out);
    });
  });
  stream.end(encodeFrame(msg));
  return { stream, done };
}

/** ProbeRequest {pod_uid = 1, handler = 4 {http_get = 2 {path = 1, port = 2 {int_val = 1}}}, timeout_seconds = 5}, as an older shim sends it. */
function probeMsg(uid: string, port: number, timeoutSeconds: number): Buffer {
  const httpGet = new WireWriter().bytes(1, '/healthz').bytes(2, new WireWriter().varint(1, port).finish(), true).finish();
  return new WireWriter().bytes(1, uid).bytes(4, new WireWriter().bytes(2, httpGet, true).finish(), true).varint(5, timeoutSeconds).finish();
}

/** Kubelet's ExecSync body for a rewritten HTTP probe of `port`, as the shim forwards it. */
function execBody(containerId: string, kind: 'liveness' | 'readiness', port: number, timeoutSeconds: number): Buffer {
  return encodeFrame(execSyncRequest(containerId, encodeShimCommand(kind, { httpGet: { path: '/healthz', port } }), timeoutSeconds));
}

describe('the lean server for the shim\'s connections', () => {
  let fx: ApiFixture;
  beforeAll(async () => {
    fx = await startApiFixture({ prober, maxInFlightProbes: 1 });
  });
  afterAll(async () => {
    await fx?.close();
  });

  it('answers Probe as grpc-js does (result, NOT_FOUND with the same details), UNIMPLEMENTED for other methods on that connection, and leaves grpc-js clients alone', async () => {
    const s = shimSession(fx.socket);
    const grpcClient = new ProbeApiClient(fx.socket);
    try {
      const ok = await rawCall(s, 'Probe', probeMsg('uid-web', HTTP, 1)).done;
      expect(ok.status).toBe(0);
      expect(ok.result).toBe(1); // PROBE_RESULT_SUCCESS
      const lean = await rawCall(s, 'Probe', probeMsg('uid-nope', HTTP, 1)).done;
      const viaGrpcJs = await grpcClient.probe({ pod: { uid: 'uid-nope' }, handler: { kind: 'http', port: HTTP, path: '/healthz', scheme: 'HTTP', headers: [] }, timeoutSeconds: 1 }).then(
        () => { throw new Error('expected NOT_FOUND from grpc-js'); },
        (err: unknown) => err,
      );
      expect(lean.status).toBe(grpc.status.NOT_FOUND);
      expect(viaGrpcJs).toBeInstanceOf(ApiError);
      expect((viaGrpcJs as ApiError).grpcCode).toBe(grpc.status.NOT_FOUND);
      // The same details, word for word (ApiError keeps grpc-js's details apart from its
      // "Probe: NOT_FOUND: " prefix), and never empty: an empty grpc-message is contained in any text.
      expect(lean.message).toMatch(/\S/);
      expect((viaGrpcJs as ApiError).context['details']).toBe(lean.message);
      const other = await rawCall(s, 'Version', Buffer.alloc(0)).done;
      expect(other.status).toBe(grpc.status.UNIMPLEMENTED);
      expect(other.message).toContain('serves only ExecSync, Probe and RunLifecycleHandler');
      expect((await grpcClient.version()).apiVersion).toBe('v1alpha1');
    } finally {
      s.close();
      grpcClient.close();
    }
  });

  it('shares the admission gate with grpc-js (RESOURCE_EXHAUSTED beyond it), and a reset stream cancels the probe it runs', async () => {
    const s = shimSession(fx.socket);
    try {
      const hung = rawCall(s, 'Probe', probeMsg('uid-web', HANG, 20), '30S');
      await until(() => fx.server.stats().probesInFlight === 1, 5000, 'the hanging probe in flight');
      const refused = await rawCall(s, 'Probe', probeMsg('uid-web', HTTP, 1)).done;
      expect(refused.status).toBe(grpc.status.RESOURCE_EXHAUSTED);
      hung.stream.close(http2.constants.NGHTTP2_CANCEL);
      // Cut by the reset, long before the probe's own 20 s timeout.
      await until(() => fx.server.stats().probesInFlight === 0 && prober.limiter.inFlight === 0, 5000, 'the cancelled probe to be aborted');
    } finally {
      s.close();
    }
  });
});

describe('the real shim client and a grpc-js client on the same agent socket', () => {
  let fx: ApiFixture;
  beforeAll(async () => {
    // The shim names a pod by container ID only; the lab prober knows pods by UID: map one to the other.
    const byContainer: OnDemandProber = {
      probe: (req: OnDemandProbeRequest, signal?: AbortSignal) => prober.probe(req.containerID === 'ctr-web' ? { ...req, podUID: 'uid-web', containerID: undefined } : req, signal),
    } as OnDemandProber;
    fx = await startApiFixture({ prober: byContainer });
  });
  afterAll(async () => {
    await fx?.close();
  });

  it('both at once: 60 shim ExecSyncs on one connection and 20 grpc-js probes, every answer right; an unknown container is NOT_FOUND to both', async () => {
    const shim = new ShimProbeClient(fx.socket);
    const grpcClient = new ProbeApiClient(fx.socket);
    try {
      const body = execBody('ctr-web', 'readiness', HTTP, 2);
      const viaShim = Array.from({ length: 60 }, () => shim.execSync(body, { deadlineMs: 10_000 }));
      const viaGrpcJs = Array.from({ length: 20 }, () => grpcClient.probe({ pod: { uid: 'uid-web' }, handler: { kind: 'http', port: HTTP, path: '/healthz', scheme: 'HTTP', headers: [] }, timeoutSeconds: 2 }));
      const [a, b] = await Promise.all([Promise.all(viaShim), Promise.all(viaGrpcJs)]);
      expect(a.map((x) => x.exitCode)).toEqual(Array(60).fill(0));
      expect(b.map((x) => x.result)).toEqual(Array(20).fill('success'));
      const lost = await shim.execSync(execBody('ctr-nope', 'liveness', HTTP, 1), { deadlineMs: 10_000 }).then(() => undefined, (e: unknown) => e as AgentCallError);
      expect(lost).toBeInstanceOf(AgentCallError);
      expect(lost).toMatchObject({ failure: 'status', grpcCode: grpc.status.NOT_FOUND });
      expect(lost!.message).toMatch(/^probe-agent refused the liveness probe: /);
      expect((await codeOf(grpcClient.probe({ pod: { uid: 'uid-nope' }, handler: { kind: 'http', port: HTTP, path: '/healthz', scheme: 'HTTP', headers: [] }, timeoutSeconds: 1 }))).code).toBe(grpc.status.NOT_FOUND);
    } finally {
      shim.close();
      grpcClient.close();
    }
  });

  it('a shim probe its caller aborts is reset (RST_STREAM CANCEL): the agent aborts it and frees its slot long before its deadline', async () => {
    const shim = new ShimProbeClient(fx.socket);
    try {
      const abort = new AbortController();
      const pending = shim.execSync(execBody('ctr-web', 'liveness', HANG, 20), { deadlineMs: 30_000, signal: abort.signal }).then(() => undefined, (e: unknown) => e as { failure: string });
      await until(() => fx.server.stats().probesInFlight === 1, 5000, 'the hanging probe in flight');
      abort.abort();
      expect(await pending).toMatchObject({ failure: 'cancelled' });
      await until(() => fx.server.stats().probesInFlight === 0 && prober.limiter.inFlight === 0, 5000, 'the reset probe to be aborted');
    } finally {
      shim.close();
    }
  });
});
