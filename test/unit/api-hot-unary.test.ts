/**
 * The agent's lean server (agent/api/hot-unary.ts) reads and writes Probe and RunLifecycleHandler
 * messages by hand: what it decodes must be exactly what grpc-js (proto-loader) hands the same
 * handlers, and what it encodes must decode, with grpc-js, to the same answer.
 */
import { describe, expect, it } from 'vitest';
import { decodeLifecycleRequest, decodeProbeRequest, encodeLifecycleResponse, encodeProbeResponse, isHotConnection } from '../../agent/api/hot-unary.ts';
import { parseGrpcTimeout as parseGrpcTimeoutMs } from '../../agent/grpc/headers.ts';
import { loadProbeApi } from '../../agent/api/proto.ts';
import type { WireLifecycleResponse, WireProbeResponse } from '../../agent/api/proto.ts';

const svc = loadProbeApi().service as unknown as Record<string, {
  requestSerialize(v: unknown): Buffer; requestDeserialize(b: Buffer): unknown; responseSerialize(v: unknown): Buffer; responseDeserialize(b: Buffer): unknown;
}>;
const probe = svc['Probe']!;
const hook = svc['RunLifecycleHandler']!;

describe('hot-unary wire', () => {
  const probeRequests: object[] = [
    {},
    { container_id: 'containerd://abc', probe_type: 'PROBE_TYPE_READINESS', timeout_seconds: 3, handler: { http_get: { path: '/healthz', port: { int_val: 8080 }, scheme: 'HTTPS', host: 'h', http_headers: [{ name: 'X', value: 'y' }, { name: 'A', value: '', value_from: 'annotation' }] } } },
    { pod_uid: 'u', container_name: 'c', handler: { tcp_socket: { port: { str_val: 'http' }, host: '' } }, probe_type: 'PROBE_TYPE_LIVENESS' },
    { pod_namespace: 'ns', pod_name: 'p', pod_sandbox_id: 's', handler: { grpc: { port: 9000, service: 'svc' } }, timeout_seconds: -1, probe_type: 'PROBE_TYPE_STARTUP' },
    { container_id: 'x', handler: { tcp_socket: { port: { int_val: 0 } } } },
    { container_id: 'x', handler: { http_get: { port: { int_val: -5 } } } },
  ];
  it.each(probeRequests.map((r) => [JSON.stringify(r), r]))('decodes a ProbeRequest as grpc-js does: %s', (_name, r) => {
    const bytes = probe.requestSerialize(r);
    expect(decodeProbeRequest(bytes)).toEqual(probe.requestDeserialize(bytes));
  });

  const hookRequests: object[] = [
    {},
    { container_id: 'c1', hook: 'LIFECYCLE_HOOK_PRE_STOP', handler: { http_get: { path: '/stop', port: { str_val: 'http' }, http_headers: [] } } },
    { pod_uid: 'u', hook: 'LIFECYCLE_HOOK_POST_START', timeout_seconds: 30, container_name: 'n', handler: { tcp_socket: { port: { int_val: 80 }, host: 'h' } } },
  ];
  it.each(hookRequests.map((r) => [JSON.stringify(r), r]))('decodes a RunLifecycleHandlerRequest as grpc-js does: %s', (_name, r) => {
    const bytes = hook.requestSerialize(r);
    expect(decodeLifecycleRequest(bytes)).toEqual(hook.requestDeserialize(bytes));
  });

  it('encodes ProbeResponses that grpc-js decodes to the same answer (optional phases kept at zero)', () => {
    const answers: WireProbeResponse[] = [
      { result: 'PROBE_RESULT_SUCCESS', message: 'ok', duration_seconds: 0.0123, phases: { total_seconds: 0.0123, helper_seconds: 0, connect_seconds: 0.001 }, reason: '', address: '10.0.0.1:80' },
      { result: 'PROBE_RESULT_FAILURE', message: 'HTTP probe failed with statuscode: 503', duration_seconds: 1, phases: { total_seconds: 1 }, reason: 'status', address: '' },
      { result: 'PROBE_RESULT_ERROR', message: '', duration_seconds: 0, phases: null, reason: 'netns', address: '' },
    ];
    for (const a of answers) {
      expect(probe.responseDeserialize(encodeProbeResponse(a))).toEqual(probe.responseDeserialize(probe.responseSerialize(a)));
    }
  });

  it('encodes RunLifecycleHandlerResponses that grpc-js decodes to the same answer', () => {
    const a: WireLifecycleResponse = { result: 'PROBE_RESULT_FAILURE', message: 'hook failed', duration_seconds: 2.5 };
    expect(hook.responseDeserialize(encodeLifecycleResponse(a))).toEqual(hook.responseDeserialize(hook.responseSerialize(a)));
  });

  it('routes only non-gRPC-library connections whose first call is Probe or RunLifecycleHandler', () => {
    const f = (path: string, ua?: string) => [{ name: ':path', value: path }, ...(ua ? [{ name: 'user-agent', value: ua }] : [])];
    expect(isHotConnection(f('/probe.v1alpha1.ProbeService/Probe'))).toBe(true);
    expect(isHotConnection(f('/probe.v1alpha1.ProbeService/RunLifecycleHandler'))).toBe(true);
    expect(isHotConnection(f('/probe.v1alpha1.ProbeService/Probe', 'grpc-node-js/1.14.7'))).toBe(false);
    expect(isHotConnection(f('/probe.v1alpha1.ProbeService/Probe', 'grpc-go/1.60.0'))).toBe(false);
    expect(isHotConnection(f('/probe.v1alpha1.ProbeService/ListProbeStatus'))).toBe(false);
    expect(isHotConnection(f('/grpc.health.v1.Health/Check'))).toBe(false);
  });

  it('reads grpc-timeout in every unit and refuses malformed ones', () => {
    expect(parseGrpcTimeoutMs('1500m')).toBe(1500);
    expect(parseGrpcTimeoutMs('2S')).toBe(2000);
    expect(parseGrpcTimeoutMs('1M')).toBe(60_000);
    expect(parseGrpcTimeoutMs('1H')).toBe(3_600_000);
    expect(parseGrpcTimeoutMs('5000u')).toBe(5);
    expect(parseGrpcTimeoutMs('123456789m')).toBeUndefined();
    expect(parseGrpcTimeoutMs('1x')).toBeUndefined();
    expect(parseGrpcTimeoutMs(undefined)).toBeUndefined();
  });
});
