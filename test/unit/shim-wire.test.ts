/**
 * The hand-rolled ExecSync wire code against protobufjs (through proto-loader, the reference
 * encoder): kubelet's ExecSyncRequest bytes are a valid ProbeService ExecSync request unchanged;
 * the agent's decoder and the shim's fact reader read what the reference encodes, for generated
 * and hostile inputs; the agent's answers decode as CRI's ExecSyncResponse; the shim's own answers
 * (no answer from the agent) are never DEADLINE_EXCEEDED.
 */
import * as protoLoader from '@grpc/proto-loader';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { decodeGrpcMessage, encodeGrpcMessage, parseGrpcTimeout } from '../../agent/grpc/headers.ts';
import { readFields, WireError } from '../../agent/grpc/protowire.ts';
import { GrpcCode } from '../../agent/grpc/status.ts';
import { AgentCallError } from '../../agent/shim/agent-client.ts';
import { decodeExecSyncRequest, encodeExecSyncResponse } from '../../agent/api/exec-sync.ts';
import { CRI_PROTO_PATH } from '../../agent/netns/cri-client.ts';
import { SHIM_COMMAND_PATH, SHIM_KINDS } from '../../agent/contract/shim-command.ts';
import { AGENT_TOO_OLD, answerFromCallError, causeOfCallError } from '../../agent/shim/answer.ts';
import { execSyncFacts } from '../../agent/shim/exec-sync.ts';
import { fileURLToPath } from 'node:url';

const opts = { keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true };
const cri = protoLoader.loadSync(CRI_PROTO_PATH, opts)['runtime.v1.RuntimeService'] as protoLoader.ServiceDefinition;
const probeProto = fileURLToPath(new URL('../../proto/probe/v1alpha1/api.proto', import.meta.url));
const api = protoLoader.loadSync(probeProto, opts)['probe.v1alpha1.ProbeService'] as protoLoader.ServiceDefinition;
const execSync = cri['ExecSync'] as protoLoader.MethodDefinition<object, object>;
const probeExecSync = api['ExecSync'] as protoLoader.MethodDefinition<object, object>;

describe('ExecSync wire', () => {
  it('kubelet\'s request bytes are a ProbeService ExecSync request unchanged; the agent decodes what the reference encodes', () => {
    fc.assert(fc.property(fc.string(), fc.array(fc.string({ unit: 'grapheme' })), fc.nat({ max: 1e9 }), (id, cmd, timeout) => {
      const bytes = execSync.requestSerialize({ container_id: id, cmd, timeout });
      expect(probeExecSync.requestDeserialize(bytes)).toEqual(execSync.requestDeserialize(bytes));
      const got = decodeExecSyncRequest(bytes);
      expect({ containerId: got.containerId, cmd: got.cmd.map((b) => b.toString('utf8')), timeout: got.timeout }).toEqual({ containerId: id, cmd, timeout });
    }));
  });

  it('the shim reads kind, timeout and container ID of a rewritten command without its handler, and nothing of any other', () => {
    fc.assert(fc.property(fc.string(), fc.oneof(fc.constantFrom(...SHIM_KINDS), fc.string()), fc.string(), fc.nat({ max: 1e9 }), (id, kind, rest, timeout) => {
      const ours = execSync.requestSerialize({ container_id: id, cmd: [SHIM_COMMAND_PATH, kind, rest], timeout });
      const facts = execSyncFacts(ours);
      expect(facts).not.toBeNull();
      expect(facts!.kind).toBe((SHIM_KINDS as readonly string[]).includes(kind) ? kind : 'unknown');
      expect(facts!.timeoutSeconds).toBe(timeout);
      expect(facts!.containerId.toString('utf8')).toBe(id);
      const theirs = execSync.requestSerialize({ container_id: id, cmd: [`${SHIM_COMMAND_PATH}x`, kind, rest], timeout });
      expect(execSyncFacts(theirs)).toBeNull();
    }));
  });

  it('the agent\'s answers are what the reference reads as CRI\'s ExecSyncResponse, including negative exit codes', () => {
    for (const code of [0, 1, 137, -1]) {
      const bytes = encodeExecSyncResponse(code, 'out ✓');
      const out = execSync.responseDeserialize(bytes) as { stdout: Buffer; stderr: Buffer; exit_code: number };
      expect(out.exit_code).toBe(code);
      expect(out.stdout.toString()).toBe('out ✓');
      expect(out.stderr.length).toBe(0);
      expect(probeExecSync.responseDeserialize(bytes)).toEqual(out);
    }
  });

  it('rejects truncated or garbage messages with a WireError, never anything else', () => {
    fc.assert(fc.property(fc.uint8Array({ maxLength: 64 }), (b) => {
      try {
        readFields(Buffer.from(b), () => {});
      } catch (err) {
        expect(err).toBeInstanceOf(WireError);
      }
      // The shim's reader: null (the runtime gets it) or facts, never a throw.
      const facts = execSyncFacts(Buffer.from(b));
      expect(facts === null || typeof facts.kind === 'string').toBe(true);
    }));
  });
});

describe('the shim\'s own answers (the agent gave none kubelet may see)', () => {
  it('never DEADLINE_EXCEEDED nor OK; the agent\'s other statuses pass with its message; UNIMPLEMENTED says the agent is too old', () => {
    for (const failure of ['unreachable', 'broken', 'deadline', 'cancelled', 'status'] as const) {
      for (const code of Object.values(GrpcCode)) {
        const x = answerFromCallError(new AgentCallError(failure, code, 'x'), 'p');
        expect(x.kind).toBe('error');
        if (x.kind === 'error') {
          expect(x.grpcCode).not.toBe(GrpcCode.DEADLINE_EXCEEDED);
          expect(x.grpcCode).not.toBe(GrpcCode.OK);
        }
      }
    }
    expect(answerFromCallError(new AgentCallError('status', GrpcCode.NOT_FOUND, 'probe-agent refused the readiness probe: gone'), 'p')).toEqual({ kind: 'error', grpcCode: GrpcCode.NOT_FOUND, message: 'probe-agent refused the readiness probe: gone' });
    expect(answerFromCallError(new AgentCallError('status', GrpcCode.UNIMPLEMENTED, 'unknown method'), 'p')).toEqual({ kind: 'error', grpcCode: GrpcCode.UNAVAILABLE, message: AGENT_TOO_OLD });
    expect(answerFromCallError(new AgentCallError('deadline', GrpcCode.DEADLINE_EXCEEDED, 'slow'), 'liveness probe')).toMatchObject({ grpcCode: GrpcCode.UNAVAILABLE, message: 'probe-agent did not run the liveness probe: slow' });
  });

  it('counts each cause: a command the agent cannot read apart from its refusals, a too-old agent apart from both', () => {
    expect(causeOfCallError(new AgentCallError('status', GrpcCode.INVALID_ARGUMENT, 'probe-agent: invalid rewritten command: not JSON'))).toBe('bad_command');
    expect(causeOfCallError(new AgentCallError('status', GrpcCode.INVALID_ARGUMENT, 'probe-agent refused the readiness probe: header'))).toBe('refused');
    expect(causeOfCallError(new AgentCallError('status', GrpcCode.UNIMPLEMENTED, 'x'))).toBe('agent_too_old');
    expect(causeOfCallError(new AgentCallError('cancelled', GrpcCode.CANCELLED, 'x'))).toBeUndefined();
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
