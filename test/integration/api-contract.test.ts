/**
 * The wire contract of ProbeService, as a shim written in another language would see it: the
 * client here loads ONLY proto/probe/v1alpha1/api.proto with @grpc/proto-loader (its own options:
 * camelCase names, enum names, int64 as strings) and shares no code with the server. The server
 * side is the real agent server probing a real lab pod.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft']);

import { join } from 'node:path';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
// Server side only: the agent's server, its real prober path and a lab pod.
import { ResidentHelper } from '../../agent/netns/helper.ts';
import { createLab, type Lab } from '../lab/lab.ts';
import { LabProber, startApiFixture, type ApiFixture } from '../support/api-harness.ts';

const PROTO = join(process.cwd(), 'proto/probe/v1alpha1/api.proto');
const HEALTH_PROTO = join(process.cwd(), 'node_modules/grpc-health-check/proto/health/v1/health.proto');
const LOADER = { keepCase: false, longs: String, enums: String, defaults: true, oneofs: true };

type Callback<T> = (err: grpc.ServiceError | null, res: T) => void;
// The client is untyped on purpose: it knows only what the .proto says.
type AnyClient = grpc.Client & Record<string, (req: unknown, md: grpc.Metadata | grpc.CallOptions, opts?: grpc.CallOptions | Callback<any>, cb?: Callback<any>) => any>;

let lab: Lab;
let helper: ResidentHelper;
let fx: ApiFixture;
let api: AnyClient;

function call<T>(method: string, req: unknown, deadlineMs = 5000): Promise<T> {
  return new Promise((resolve, reject) => {
    api[method]!(req, new grpc.Metadata(), { deadline: Date.now() + deadlineMs }, (err: grpc.ServiceError | null, res: T) => (err ? reject(err) : resolve(res)));
  });
}

async function failure(p: Promise<unknown>): Promise<grpc.ServiceError> {
  try {
    await p;
  } catch (err) {
    return err as grpc.ServiceError;
  }
  throw new Error('expected the call to fail');
}

beforeAll(async () => {
  lab = await createLab({ pods: 1, policy: 'drop', tag: 'api-contract.test' });
  const pod = lab.pods[0]!;
  [, helper] = await Promise.all([lab.startServer(pod, { http: 8080, tcp: 8081, grpc: 9090 }), ResidentHelper.start()]);
  const prober = new LabProber({
    pods: [{ uid: '0b9e3d1c-0000-4000-8000-000000000001', namespace: 'shop', name: 'cart', sandboxId: 'sb1', netns: pod.netns, podIPs: pod.ips, containers: [{ name: 'main', ports: [{ name: 'web', containerPort: 8080 }] }] }],
    sockets: helper,
  });
  fx = await startApiFixture({ prober, featureGates: [{ name: 'HappyEyeballs', stage: 'BETA', enabled: true }] });

  const pkg = grpc.loadPackageDefinition(protoLoader.loadSync(PROTO, LOADER)) as any;
  api = new pkg.probe.v1alpha1.ProbeService(`unix:${fx.socket}`, grpc.credentials.createInsecure());
});

afterAll(async () => {
  api?.close();
  await fx?.close();
  await helper?.close();
  await lab?.destroy();
});

describe('ProbeService wire contract', () => {
  it('keeps the field numbers of every message (changing one breaks every shim)', () => {
    const numbers: Record<string, string> = {};
    // keepCase: the descriptor then shows the .proto's own field names.
    for (const [name, def] of Object.entries(protoLoader.loadSync(PROTO, { keepCase: true }))) {
      const t = (def as { type?: { field?: { name: string; number: number }[] } }).type;
      if (t?.field) numbers[name.replace('probe.v1alpha1.', '')] = t.field.map((f) => `${f.name}=${f.number}`).join(' ');
    }
    expect(numbers).toEqual({
      VersionRequest: 'version=1',
      VersionResponse: 'agent_name=1 agent_version=2 api_version=3 feature_gates=4 instance_id=5',
      FeatureGate: 'name=1 stage=2 enabled=3',
      ProbeRequest: 'pod_uid=1 pod_sandbox_id=2 container_name=3 handler=4 timeout_seconds=5 pod_namespace=6 pod_name=7 container_id=8 probe_type=9',
      LifecycleHandler: 'http_get=2 tcp_socket=3',
      RunLifecycleHandlerRequest: 'pod_uid=1 pod_sandbox_id=2 container_name=3 handler=4 hook=5 timeout_seconds=6 container_id=7',
      RunLifecycleHandlerResponse: 'result=1 message=2 duration_seconds=3',
      ProbeHandler: 'http_get=2 tcp_socket=3 grpc=4',
      IntOrString: 'int_val=1 str_val=2',
      HTTPHeader: 'name=1 value=2 value_from=100',
      HTTPGetAction: 'path=1 port=2 host=3 scheme=4 http_headers=5',
      TCPSocketAction: 'port=1 host=2',
      GRPCAction: 'port=1 service=2',
      ProbeResponse: 'result=1 message=2 duration_seconds=3 phases=4 reason=5 address=6',
      ProbePhases: 'queue_seconds=1 helper_seconds=2 connect_seconds=3 tls_seconds=4 first_byte_seconds=5 total_seconds=6',
      ProbeStatusFilter: 'pod_uid=1 namespace=2 probe_type=3',
      ListProbeStatusRequest: 'filter=1',
      ListProbeStatusResponse: 'statuses=1 revision=2 instance_id=3',
      ProbeStatus:
        'pod_uid=1 pod_namespace=2 pod_name=3 container_name=4 container_id=5 probe_type=6 result=7 consecutive=8 last_probe_time=9 last_message=10 last_reason=11 started=12 ready=13 on_hold=14',
      WatchProbeEventsRequest: 'filter=1 from_revision=2 instance_id=3',
      WatchProbeEventsResponse: 'snapshot=1 event=2',
      ProbeSnapshot: 'revision=1 instance_id=2 statuses=3 resynced=4 complete=5',
      ProbeEvent: 'revision=1 type=2 status=3 previous_result=4 time=5',
      // CRI runtime.v1's own numbers (proto/cri/runtime_v1.proto): kubelet's bytes are the request.
      ExecSyncRequest: 'container_id=1 cmd=2 timeout=3',
      ExecSyncResponse: 'stdout=1 stderr=2 exit_code=3',
    });
  });

  it('Version', async () => {
    const v = await call<Record<string, unknown>>('Version', { version: 'v1alpha1' });
    expect(v).toMatchObject({ agentName: 'probe-agent', apiVersion: 'v1alpha1', featureGates: [{ name: 'HappyEyeballs', stage: 'BETA', enabled: true }] });
    expect(v['instanceId']).toMatch(/^[0-9a-f-]{36}$/);
  });

  it('Probe: results as enum names, timings in seconds, absent phases absent', async () => {
    const ok = await call<Record<string, any>>('Probe', {
      podNamespace: 'shop',
      podName: 'cart',
      containerName: 'main',
      handler: { httpGet: { port: { strVal: 'web' }, path: '/healthz', httpHeaders: [{ name: 'X-Shim', value: '1' }] } },
      timeoutSeconds: 2,
    });
    expect(ok).toMatchObject({ result: 'PROBE_RESULT_SUCCESS', reason: '' });
    expect(ok['durationSeconds']).toBeGreaterThan(0);
    expect(ok['phases'].totalSeconds).toBeGreaterThan(0);
    expect(ok['phases'].connectSeconds).toBeGreaterThan(0);
    expect(ok['phases'].tlsSeconds).toBeUndefined();

    const failed = await call<Record<string, any>>('Probe', { podUid: '0b9e3d1c-0000-4000-8000-000000000001', handler: { httpGet: { port: { intVal: 8080 }, path: '/status/503' } } });
    expect(failed).toMatchObject({ result: 'PROBE_RESULT_FAILURE', reason: 'status', message: 'HTTP probe failed with statuscode: 503' });

    const tcp = await call<Record<string, any>>('Probe', { podSandboxId: 'sb1', handler: { tcpSocket: { port: { intVal: 8081 } } } });
    expect(tcp.result).toBe('PROBE_RESULT_SUCCESS');
    const grpcProbe = await call<Record<string, any>>('Probe', { podSandboxId: 'sb1', handler: { grpc: { port: 9090, service: 'no.such.Service' } } });
    expect(grpcProbe.result).toBe('PROBE_RESULT_FAILURE');
  });

  it('Probe: status codes', async () => {
    expect((await failure(call('Probe', { podUid: 'ffffffff-0000-4000-8000-000000000000', handler: { tcpSocket: { port: { intVal: 1 } } } }))).code).toBe(grpc.status.NOT_FOUND);
    const invalid = await failure(call('Probe', { podSandboxId: 'sb1', handler: { grpc: { port: 70000 } } }));
    expect(invalid.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(invalid.details).toMatch(/^handler\.grpc\.port: /);
  });

  it('ListProbeStatus and WatchProbeEvents: snapshot, then events, int64 as decimal strings', async () => {
    fx.store.upsert({
      key: { podUID: 'u1', containerName: 'main', probeType: 'Readiness' }, namespace: 'shop', podName: 'cart', containerID: 'containerd://1',
      result: 'unknown', consecutive: 0, lastProbeTime: 0, lastMessage: '', started: true, ready: false, onHold: false,
    });
    const list = await call<Record<string, any>>('ListProbeStatus', { filter: { probeType: 'PROBE_TYPE_READINESS' } });
    expect(list).toMatchObject({ revision: '1', statuses: [{ podUid: 'u1', probeType: 'PROBE_TYPE_READINESS', result: 'PROBE_RESULT_UNKNOWN', lastProbeTime: '0' }] });
    expect((await call<Record<string, any>>('ListProbeStatus', { filter: { probeType: 'PROBE_TYPE_LIVENESS' } })).statuses).toEqual([]);

    const stream = api['WatchProbeEvents']!({ fromRevision: '0' }, new grpc.Metadata()) as grpc.ClientReadableStream<Record<string, any>>;
    const got: Record<string, any>[] = [];
    stream.on('data', (m) => got.push(m));
    stream.on('error', () => {});
    const wait = async (n: number): Promise<void> => {
      for (let i = 0; got.length < n && i < 200; i++) await new Promise((r) => setTimeout(r, 10));
    };
    await wait(1);
    expect(got[0]).toMatchObject({ payload: 'snapshot', snapshot: { revision: '1', complete: true, resynced: false, statuses: [{ podName: 'cart' }] } });
    const t = Date.UTC(2031, 5, 6, 7, 8, 9, 10);
    fx.store.upsert({
      key: { podUID: 'u1', containerName: 'main', probeType: 'Readiness' }, namespace: 'shop', podName: 'cart', containerID: 'containerd://1',
      result: 'success', consecutive: 1, lastProbeTime: t, lastMessage: 'ok', started: true, ready: true, onHold: false,
    });
    await wait(2);
    expect(got[1]).toMatchObject({
      payload: 'event',
      event: { revision: '2', type: 'PROBE_EVENT_TYPE_CHANGED', previousResult: 'PROBE_RESULT_UNKNOWN', status: { result: 'PROBE_RESULT_SUCCESS', ready: true, lastProbeTime: `${t}000000` } },
    });
    stream.cancel();
  });

  it('grpc.health.v1 on the same socket', async () => {
    const health = grpc.loadPackageDefinition(protoLoader.loadSync(HEALTH_PROTO, { enums: String })) as any;
    const h = new health.grpc.health.v1.Health(`unix:${fx.socket}`, grpc.credentials.createInsecure());
    const res = await new Promise<{ status: string }>((resolve, reject) => h.Check({ service: 'probe.v1alpha1.ProbeService' }, (e: Error | null, r: { status: string }) => (e ? reject(e) : resolve(r))));
    h.close();
    expect(res.status).toBe('SERVING');
  });
});
