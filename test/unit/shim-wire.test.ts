/**
 * The shim's hand-rolled wire code against protobufjs (through proto-loader, the reference
 * encoder): ExecSync requests and responses and the ProbeService messages decode to what the
 * reference reads, for generated and hostile inputs; the answer mapping is total.
 */
import * as protoLoader from '@grpc/proto-loader';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { encodeGrpcMessage, decodeGrpcMessage, readFields, WireError } from '../../agent/api/protowire.ts';
import { encodeLifecycleHandler, encodeProbeHandler, HandlerShapeError } from '../../agent/api/handler-wire.ts';
import { AgentCallError, GrpcCode, WireResult } from '../../agent/api/shim-client.ts';
import { CRI_PROTO_PATH } from '../../agent/netns/cri-client.ts';
import { answerFromCallError, answerFromResult } from '../../agent/shim/answer.ts';
import { parseGrpcTimeout } from '../../agent/shim/deadline.ts';
import { decodeExecSyncRequest, encodeExecSyncResponse } from '../../agent/shim/exec-sync.ts';
import { fileURLToPath } from 'node:url';

const opts = { keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true };
const cri = protoLoader.loadSync(CRI_PROTO_PATH, opts)['runtime.v1.RuntimeService'] as protoLoader.ServiceDefinition;
const probeProto = fileURLToPath(new URL('../../proto/probe/v1alpha1/api.proto', import.meta.url));
const api = protoLoader.loadSync(probeProto, opts)['probe.v1alpha1.ProbeService'] as protoLoader.ServiceDefinition;
const execSync = cri['ExecSync'] as protoLoader.MethodDefinition<object, object>;
const probeRpc = api['Probe'] as protoLoader.MethodDefinition<object, object>;
const hookRpc = api['RunLifecycleHandler'] as protoLoader.MethodDefinition<object, object>;

describe('ExecSync wire', () => {
  it('decodes any request the reference encodes', () => {
    fc.assert(fc.property(fc.string(), fc.array(fc.string({ unit: 'grapheme' })), fc.nat({ max: 1e9 }), (id, cmd, timeout) => {
      const bytes = execSync.requestSerialize({ container_id: id, cmd, timeout });
      expect(decodeExecSyncRequest(bytes)).toEqual({ containerId: id, cmd, timeoutSeconds: timeout });
    }));
  });

  it('encodes responses the reference reads back, including negative exit codes', () => {
    for (const code of [0, 1, 137, -1]) {
      const out = execSync.responseDeserialize(encodeExecSyncResponse(code, 'out ✓')) as { stdout: Buffer; exit_code: number };
      expect(out.exit_code).toBe(code);
      expect(out.stdout.toString()).toBe('out ✓');
    }
  });

  it('rejects truncated or garbage messages with a WireError, never anything else', () => {
    fc.assert(fc.property(fc.uint8Array({ maxLength: 64 }), (b) => {
      try {
        readFields(Buffer.from(b), () => {});
      } catch (err) {
        expect(err).toBeInstanceOf(WireError);
      }
    }));
  });
});

describe('handlers to ProbeService messages', () => {
  it('a probe request carries the handler field for field', () => {
    const handler = encodeProbeHandler({ httpGet: { path: '/h?x=$(Y)', port: 'http', scheme: 'HTTPS', host: '', httpHeaders: [{ name: 'A', value: '' }, { name: 'B', value: 'v' }] } });
    const msg = Buffer.concat([Buffer.from([0x22, handler.length]), handler]);
    const req = probeRpc.requestDeserialize(msg) as { handler: Record<string, unknown> };
    expect(req.handler['http_get']).toMatchObject({ path: '/h?x=$(Y)', port: { str_val: 'http' }, scheme: 'HTTPS', http_headers: [{ name: 'A', value: '' }, { name: 'B', value: 'v' }] });
    const tcp = encodeProbeHandler({ tcpSocket: { port: 8080 } });
    const r2 = probeRpc.requestDeserialize(Buffer.concat([Buffer.from([0x22, tcp.length]), tcp])) as { handler: Record<string, any> };
    expect(r2.handler['tcp_socket'].port.int_val).toBe(8080);
    const g = encodeProbeHandler({ grpc: { port: 9090, service: null } });
    const r3 = probeRpc.requestDeserialize(Buffer.concat([Buffer.from([0x22, g.length]), g])) as { handler: Record<string, any> };
    expect(r3.handler['grpc']).toMatchObject({ port: 9090, service: '' });
    const h = encodeLifecycleHandler({ httpGet: { path: '/stop', port: 80 } });
    const r4 = hookRpc.requestDeserialize(Buffer.concat([Buffer.from([0x22, h.length]), h])) as { handler: Record<string, any> };
    expect(r4.handler['http_get']).toMatchObject({ path: '/stop', port: { int_val: 80 } });
  });

  it('refuses shapes that cannot be a handler', () => {
    for (const bad of [{}, { exec: { command: ['x'] } }, { httpGet: { port: 1 }, tcpSocket: { port: 1 } }, { httpGet: 'x' }, { tcpSocket: { port: 1.5 } }, { httpGet: { port: 1, path: 7 } }, { httpGet: { port: 1, httpHeaders: {} } }]) {
      expect(() => encodeProbeHandler(bad as Record<string, unknown>)).toThrow(HandlerShapeError);
    }
    expect(() => encodeLifecycleHandler({ grpc: { port: 1 } })).toThrow(/exactly one of httpGet, tcpSocket/);
  });
});

describe('answer mapping', () => {
  const a = (result: number, message = 'm', reason = ''): Parameters<typeof answerFromResult>[0] => ({ result, message, reason, durationSeconds: 0 });
  it('success and warning are exit 0 with the message; failure a non-zero exit; error and unknown a gRPC error', () => {
    expect(answerFromResult(a(WireResult.SUCCESS), 'p')).toEqual({ kind: 'exit', exitCode: 0, stdout: 'm' });
    expect(answerFromResult(a(WireResult.WARNING, 'redirect'), 'p')).toEqual({ kind: 'exit', exitCode: 0, stdout: 'redirect' });
    expect(answerFromResult(a(WireResult.FAILURE, 'timeout'), 'p')).toEqual({ kind: 'exit', exitCode: 1, stdout: 'timeout' });
    for (const r of [WireResult.ERROR, WireResult.UNKNOWN, 99]) {
      const x = answerFromResult(a(r, 'netns gone', 'netns-gone'), 'readiness probe');
      expect(x).toMatchObject({ kind: 'error', grpcCode: GrpcCode.UNAVAILABLE });
    }
  });
  it('no call error ever becomes DEADLINE_EXCEEDED', () => {
    for (const failure of ['unreachable', 'broken', 'deadline', 'status'] as const) {
      for (const code of Object.values(GrpcCode)) {
        const x = answerFromCallError(new AgentCallError(failure, code, 'x'), 'p');
        expect(x.kind).toBe('error');
        if (x.kind === 'error') {
          expect(x.grpcCode).not.toBe(GrpcCode.DEADLINE_EXCEEDED);
          expect(x.grpcCode).not.toBe(GrpcCode.OK);
        }
      }
    }
    expect(answerFromCallError(new AgentCallError('status', GrpcCode.NOT_FOUND, 'x'), 'p')).toMatchObject({ grpcCode: GrpcCode.NOT_FOUND });
  });
});

describe('small parsers', () => {
  it('grpc-timeout', () => {
    expect(parseGrpcTimeout('125S')).toBe(125_000);
    expect(parseGrpcTimeout('100m')).toBe(100);
    expect(parseGrpcTimeout('2M')).toBe(120_000);
    expect(parseGrpcTimeout('x')).toBeUndefined();
    expect(parseGrpcTimeout(undefined)).toBeUndefined();
  });
  it('grpc-message percent-encoding round-trips', () => {
    fc.assert(fc.property(fc.string({ unit: 'grapheme' }), (s) => {
      const enc = encodeGrpcMessage(s);
      expect(enc).toMatch(/^[\x20-\x7e]*$/);
      expect(decodeGrpcMessage(enc)).toBe(s);
    }));
  });
});
