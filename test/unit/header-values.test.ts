/**
 * `valueFrom: "annotation"` headers (the contract with the rewrite): a rewritten handler's header
 * may leave its value out of the exec command kubelet prints; the agent takes it from the pod's
 * original-handlers annotation, `handlers["<container>/<field>"].httpGet.httpHeaders[i].value`,
 * same index, names matching. Parsing (pod specs, the command, the wire), the record's
 * bounds and every way the lookup can miss.
 */
import { fileURLToPath } from 'node:url';
import * as protoLoader from '@grpc/proto-loader';
import { describe, expect, it } from 'vitest';
import { parseCommand } from '../../agent/api/exec-sync.ts';
import { encodeShimCommand } from '../../agent/contract/shim-command.ts';
import { lifecycleRequestFromWire, probeRequestFromWire } from '../../agent/api/convert-request.ts';
import { InvalidProbeError } from '../../agent/errors.ts';
import { handlerFieldOf, refuseDroppedHeaderValues, withHeaderValues } from '../../agent/prober/header-values.ts';
import { MAX_ORIGINAL_HANDLERS_BYTES, recordedHeadersOf, sandboxViewOf } from '../../agent/prober/sandbox-view.ts';
import { planTargets } from '../../agent/probe/target.ts';
import { parseProbe } from '../../agent/probe/spec.ts';
import type { HttpGetHandler, ProbeContext } from '../../agent/probe/types.ts';
import { ORIGINAL_HANDLERS_ANNOTATION } from '../../agent/rewrite/pod-rewrite.ts';
import type { CriPodSandboxStatusResponse } from '../../agent/netns/cri-client.ts';

const SECRET = 'Bearer s3cret';
const record = (handlers: Record<string, unknown>): string => JSON.stringify({ v: 1, handlers, added: [] });
const RECORD = record({
  'web/readinessProbe': { httpGet: { path: '/r', port: 8080, httpHeaders: [{ name: 'X-A', value: 'a' }, { name: 'Authorization', value: SECRET }] } },
  'web/lifecycle/preStop': { httpGet: { path: '/quit', port: 'http', httpHeaders: [{ name: 'Authorization', value: SECRET }] } },
  'web/livenessProbe': { tcpSocket: { port: 8080 } },
});

function rewritten(headers: unknown[]): HttpGetHandler {
  return parseProbe({ httpGet: { path: '/r', port: 8080, httpHeaders: headers } }, { allowHandlerOnly: true }).handler as HttpGetHandler;
}

function recorded(raw = RECORD) {
  const r = recordedHeadersOf(raw);
  if (typeof r === 'string') throw new Error(r);
  return r;
}

describe('parsing valueFrom', () => {
  it('a header may carry valueFrom "annotation" instead of a value', () => {
    const h = rewritten([{ name: 'X-A', value: 'a' }, { name: 'Authorization', valueFrom: 'annotation' }]);
    expect(h.headers).toEqual([{ name: 'X-A', value: 'a' }, { name: 'Authorization', value: '', valueFrom: 'annotation' }]);
  });

  it('refuses another source, or a value beside it', () => {
    expect(() => rewritten([{ name: 'A', valueFrom: 'secret' }])).toThrow(/httpHeaders\[0\]\.valueFrom: unsupported value "secret"/);
    expect(() => rewritten([{ name: 'A', value: 'x', valueFrom: 'annotation' }])).toThrow(/httpHeaders\[0\]\.value: must be empty when valueFrom is set/);
  });

  it('travels in the command (kubelet\'s ExecSync, parsed by the agent) and on the Probe / RunLifecycleHandler wire (value_from, older shims) to the handler', () => {
    const json = { httpGet: { path: '/r', port: 8080, httpHeaders: [{ name: 'X-A', value: 'a' }, { name: 'Authorization', valueFrom: 'annotation' }] } };
    const want = { kind: 'http', headers: [{ name: 'X-A', value: 'a' }, { name: 'Authorization', value: '', valueFrom: 'annotation' }] };
    const cid = 'c'.repeat(64);
    const argv = (kind: 'readiness' | 'preStop'): Buffer[] => encodeShimCommand(kind, json).map((a) => Buffer.from(a));
    expect(parseCommand(cid, argv('readiness')).handler).toMatchObject(want);
    expect(parseCommand(cid, argv('preStop')).handler).toMatchObject(want);
    const api = protoLoader.loadSync(fileURLToPath(new URL('../../proto/probe/v1alpha1/api.proto', import.meta.url)), { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true })['probe.v1alpha1.ProbeService'] as protoLoader.ServiceDefinition;
    const probe = api['Probe'] as protoLoader.MethodDefinition<object, object>;
    const hook = api['RunLifecycleHandler'] as protoLoader.MethodDefinition<object, object>;
    const handler = { http_get: { path: '/r', port: { int_val: 8080 }, http_headers: [{ name: 'X-A', value: 'a' }, { name: 'Authorization', value_from: 'annotation' }] } };
    const msg = probe.requestSerialize({ container_id: cid, handler });
    expect(probeRequestFromWire(probe.requestDeserialize(msg) as Parameters<typeof probeRequestFromWire>[0]).handler).toMatchObject(want);
    const hmsg = hook.requestSerialize({ container_id: cid, handler, hook: 'LIFECYCLE_HOOK_PRE_STOP' });
    expect(lifecycleRequestFromWire(hook.requestDeserialize(hmsg) as Parameters<typeof lifecycleRequestFromWire>[0]).handler).toMatchObject(want);
  });

  it('an unresolved valueFrom header never reaches the pod empty: the prober refuses it', async () => {
    const ctx = { podIPs: ['10.0.0.1'], timeoutSeconds: 1 } as unknown as ProbeContext;
    await expect(planTargets(rewritten([{ name: 'Authorization', valueFrom: 'annotation' }]), ctx)).rejects.toThrow(InvalidProbeError);
  });
});

describe('resolving values from the record', () => {
  const source = (field: Parameters<typeof handlerFieldOf>[0], containerName = 'web') => ({ recorded: recorded(), containerName, field: handlerFieldOf(field) });

  it('takes the value at the same index, names matching, for probes and hooks; inline values are kept', () => {
    const h = withHeaderValues(rewritten([{ name: 'X-A', value: 'inline' }, { name: 'Authorization', valueFrom: 'annotation' }]), source({ probeType: 'Readiness' }));
    expect(h.headers).toEqual([{ name: 'X-A', value: 'inline' }, { name: 'Authorization', value: SECRET }]);
    const stop = withHeaderValues(rewritten([{ name: 'Authorization', valueFrom: 'annotation' }]), source({ hook: 'preStop' }));
    expect(stop.headers).toEqual([{ name: 'Authorization', value: SECRET }]);
  });

  it('a handler without valueFrom headers is returned as is, with or without a record', () => {
    const h = rewritten([{ name: 'X-A', value: 'a' }]);
    expect(withHeaderValues(h, { containerName: 'web', field: 'livenessProbe' })).toBe(h);
  });

  it.each([
    ['another container', { probeType: 'Readiness' }, 'app', [{ name: 'Authorization', valueFrom: 'annotation' }], /"app\/readinessProbe"\): no httpGet handler with headers is recorded/],
    ['another kind', { probeType: 'Startup' }, 'web', [{ name: 'Authorization', valueFrom: 'annotation' }], /"web\/startupProbe"/],
    ['a recorded tcpSocket handler', { probeType: 'Liveness' }, 'web', [{ name: 'Authorization', valueFrom: 'annotation' }], /no httpGet handler/],
    ['a name mismatch', { probeType: 'Readiness' }, 'web', [{ name: 'Authorization', valueFrom: 'annotation' }], /http_headers\[0\].*recorded header at index 0 is "X-A", not "Authorization"/],
    ['an index past the record', { hook: 'preStop' }, 'web', [{ name: 'Authorization', valueFrom: 'annotation' }, { name: 'Authorization', valueFrom: 'annotation' }], /http_headers\[1\].*no recorded header at index 1/],
  ] as const)('misses on %s: InvalidProbeError naming the header and the record entry', (_n, kind, container, headers, message) => {
    const err = (() => {
      try {
        withHeaderValues(rewritten([...headers]), source(kind, container));
      } catch (e) {
        return e;
      }
      return undefined;
    })();
    expect(err).toBeInstanceOf(InvalidProbeError);
    expect((err as Error).message).toMatch(message);
  });

  it('an empty value the record contradicts (a shim that dropped valueFrom) is refused; one it agrees with, or cannot judge, is sent', () => {
    // What a shim older than field 100 sends for {"name":"Authorization","valueFrom":"annotation"}: the name, no value.
    const dropped = rewritten([{ name: 'X-A', value: 'a' }, { name: 'Authorization', value: '' }]);
    expect(() => refuseDroppedHeaderValues(dropped, source({ probeType: 'Readiness' }))).toThrow(InvalidProbeError);
    expect(() => refuseDroppedHeaderValues(dropped, source({ probeType: 'Readiness' }))).toThrow(/http_headers\[1\]: "Authorization" has an empty value.*upgrade the shim/);
    expect(() => refuseDroppedHeaderValues(rewritten([{ name: 'Authorization', value: '' }]), source({ hook: 'preStop' }))).toThrow(/"web\/lifecycle\/preStop"/);
    const agreeing = recorded(record({ 'web/readinessProbe': { httpGet: { port: 1, httpHeaders: [{ name: 'Accept', value: '' }] } } }));
    expect(() => refuseDroppedHeaderValues(rewritten([{ name: 'Accept', value: '' }]), { recorded: agreeing, containerName: 'web', field: 'readinessProbe' })).not.toThrow();
    // Names that differ from the record's at that index: not the rewrite's header, sent as written.
    expect(() => refuseDroppedHeaderValues(rewritten([{ name: 'Other', value: '' }, { name: 'X-B', value: '' }]), source({ probeType: 'Readiness' }))).not.toThrow();
    // No entry for the field, no record, a record not read: nothing to judge by.
    expect(() => refuseDroppedHeaderValues(dropped, source({ probeType: 'Startup' }))).not.toThrow();
    expect(() => refuseDroppedHeaderValues(dropped, { containerName: 'web', field: 'readinessProbe' })).not.toThrow();
    expect(() => refuseDroppedHeaderValues(dropped, { containerName: 'web', field: 'readinessProbe', unavailable: 'not read' })).not.toThrow();
  });

  it('a missing, malformed or oversized record, or one not read, is a clear error', () => {
    const h = rewritten([{ name: 'Authorization', valueFrom: 'annotation' }]);
    expect(() => withHeaderValues(h, { containerName: 'web', field: 'readinessProbe' })).toThrow(/the pod has no such annotation/);
    expect(() => withHeaderValues(h, { containerName: 'web', field: 'readinessProbe', unavailable: 'the runtime was not asked' })).toThrow(/the runtime was not asked/);
    expect(recordedHeadersOf('{nope')).toMatch(/is not JSON/);
    expect(recordedHeadersOf('{"v":1}')).toMatch(/has no "handlers" object/);
    expect(recordedHeadersOf(' '.repeat(MAX_ORIGINAL_HANDLERS_BYTES + 1))).toMatch(/larger than 262144 bytes/);
    // A recorded value kubelet could never have sent is refused too.
    const bad = recorded(record({ 'web/readinessProbe': { httpGet: { port: 1, httpHeaders: [{ name: 'Authorization', value: 'a\nb' }] } } }));
    expect(() => withHeaderValues(h, { recorded: bad, containerName: 'web', field: 'readinessProbe' })).toThrow(/recorded value must not contain control characters/);
  });

  it('the sandbox view keeps only the recorded headers, and says why an annotation was unusable', () => {
    const status = (annotations: Record<string, string>): CriPodSandboxStatusResponse => ({
      status: {
        id: 's', metadata: { name: 'p', uid: 'u-1', namespace: 'ns', attempt: 0 }, state: 'SANDBOX_READY', createdAt: '0',
        network: { ip: '10.0.0.2', additionalIps: [{ ip: 'fd00::2' }] }, linux: null,
        labels: { 'io.kubernetes.pod.uid': 'u-1' }, annotations, runtimeHandler: '',
      },
      info: {},
    });
    const v = sandboxViewOf(status({ [ORIGINAL_HANDLERS_ANNOTATION]: RECORD }), 's');
    if (typeof v === 'string') throw new Error(v);
    expect(v).toMatchObject({ uid: 'u-1', namespace: 'ns', name: 'p', podIPs: ['10.0.0.2', 'fd00::2'], hostNetwork: false });
    expect([...v.recordedHeaders!.keys()].sort()).toEqual(['web/lifecycle/preStop', 'web/readinessProbe']);
    const broken = sandboxViewOf(status({ [ORIGINAL_HANDLERS_ANNOTATION]: '[' }), 's');
    expect(typeof broken !== 'string' && broken.recordedHeadersError).toMatch(/not JSON/);
    const none = sandboxViewOf(status({}), 's');
    expect(typeof none !== 'string' && none.recordedHeaders).toBeUndefined();
  });
});
