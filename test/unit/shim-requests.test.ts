import { describe, expect, it } from 'vitest';
import { lifecycleRequestFromWire, probeRequestFromWire } from '../../agent/api/convert-request.ts';
import { normalizeContainerID } from '../../agent/prober/container-lookup.ts';

const http = { http_get: { path: '/', port: { int_val: 80 } } };

describe('container IDs', () => {
  it('accepts an ID with or without the runtime prefix and refuses what is not an ID', () => {
    const id = 'ab'.repeat(32);
    expect(normalizeContainerID(id)).toBe(id);
    expect(normalizeContainerID(`containerd://${id}`)).toBe(id);
    expect(normalizeContainerID(`cri-o://${id}`)).toBe(id);
    for (const bad of ['', 'containerd://', '../x', 'a b', 'x'.repeat(129), 'containerd://../../etc/passwd']) {
      expect(() => normalizeContainerID(bad), bad).toThrow(/container_id: /);
    }
  });
});

describe('ProbeRequest with container_id and probe_type', () => {
  it('takes container_id as the one way of naming the pod and keeps probe_type', () => {
    expect(probeRequestFromWire({ container_id: 'containerd://abc123', probe_type: 'PROBE_TYPE_LIVENESS', handler: http })).toMatchObject({
      containerID: 'abc123', probeType: 'Liveness',
    });
  });

  it('refuses two ways of naming the pod, and a probe_type without a container', () => {
    expect(() => probeRequestFromWire({ container_id: 'abc', pod_uid: 'u', handler: http })).toThrow(/exactly one of pod_uid, pod_sandbox_id, pod_namespace with pod_name, or container_id/);
    expect(() => probeRequestFromWire({ pod_uid: 'u', probe_type: 'PROBE_TYPE_READINESS', handler: http })).toThrow(/probe_type: needs the container/);
    expect(() => probeRequestFromWire({ container_id: 'abc', probe_type: 'PROBE_TYPE_NOPE' as never, handler: http })).toThrow(/probe_type: unknown/);
  });
});

describe('RunLifecycleHandlerRequest', () => {
  it('parses an http or tcp hook named by container_id, pod_uid or pod_sandbox_id', () => {
    expect(lifecycleRequestFromWire({ container_id: 'abc', hook: 'LIFECYCLE_HOOK_PRE_STOP', handler: { http_get: { path: '/drain', port: { str_val: 'http' }, scheme: 'https' } } })).toMatchObject({
      containerID: 'abc', hook: 'preStop', timeoutSeconds: 0, handler: { kind: 'http', path: '/drain', port: 'http', scheme: 'HTTPS' },
    });
    expect(lifecycleRequestFromWire({ pod_uid: 'u', hook: 'LIFECYCLE_HOOK_POST_START', handler: { tcp_socket: { port: { int_val: 5 } } }, timeout_seconds: 30 })).toMatchObject({
      podUID: 'u', hook: 'postStart', timeoutSeconds: 30, handler: { kind: 'tcp', port: 5 },
    });
  });

  it('refuses a missing hook, a missing handler, a bad timeout and two ways of naming the pod', () => {
    expect(() => lifecycleRequestFromWire({ pod_uid: 'u', handler: http })).toThrow(/^hook: /);
    expect(() => lifecycleRequestFromWire({ pod_uid: 'u', hook: 'LIFECYCLE_HOOK_UNSPECIFIED', handler: http })).toThrow(/^hook: /);
    expect(() => lifecycleRequestFromWire({ pod_uid: 'u', hook: 'LIFECYCLE_HOOK_PRE_STOP' })).toThrow(/^handler: required/);
    expect(() => lifecycleRequestFromWire({ pod_uid: 'u', hook: 'LIFECYCLE_HOOK_PRE_STOP', handler: http, timeout_seconds: 3601 })).toThrow(/^timeout_seconds: /);
    expect(() => lifecycleRequestFromWire({ pod_uid: 'u', pod_sandbox_id: 's', hook: 'LIFECYCLE_HOOK_PRE_STOP', handler: http })).toThrow(/exactly one/);
    expect(() => lifecycleRequestFromWire({ pod_uid: 'u', hook: 'LIFECYCLE_HOOK_PRE_STOP', handler: { http_get: { port: { int_val: 0 } } } })).toThrow(/^handler\.http_get\.port/);
  });
});
