/**
 * The exec command form of a rewritten handler (agent/contract/shim-command.ts): round trip, safety
 * against kubelet's $(VAR) expansion (with kubelet's expansion rules reimplemented here), and
 * every malformed form the shim may meet in an ExecSync.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  decodeShimCommand,
  encodeShimCommand,
  isShimCommand,
  MAX_ENCODED_HANDLER,
  SHIM_COMMAND_PATH,
  SHIM_KINDS,
  ShimCommandError,
} from '../../agent/contract/shim-command.ts';

/**
 * Kubelet's expansion of container command arguments (third_party/forked/golang/expansion): `$(NAME)`
 * of a defined variable is replaced, `$$` becomes `$`, anything else stays.
 */
function kubeletExpand(input: string, env: Record<string, string>): string {
  let out = '';
  for (let i = 0; i < input.length; i++) {
    if (input[i] !== '$' || i + 1 >= input.length) {
      out += input[i];
      continue;
    }
    const next = input[i + 1];
    if (next === '$') {
      out += '$';
      i++;
    } else if (next === '(') {
      const close = input.indexOf(')', i + 2);
      if (close < 0) {
        out += input.slice(i);
        break;
      }
      const name = input.slice(i + 2, close);
      out += name in env ? env[name] : `$(${name})`;
      i = close;
    } else {
      out += '$';
    }
  }
  return out;
}

const handler = fc.oneof(
  fc.record({ httpGet: fc.record({ path: fc.string(), port: fc.oneof(fc.integer({ min: 1, max: 65535 }), fc.string({ minLength: 1, maxLength: 15 })), httpHeaders: fc.array(fc.record({ name: fc.string(), value: fc.string() }), { maxLength: 3 }) }) }),
  fc.record({ tcpSocket: fc.record({ port: fc.integer({ min: 1, max: 65535 }) }) }),
  fc.record({ grpc: fc.record({ port: fc.integer({ min: 1, max: 65535 }), service: fc.string() }) }),
);

describe('shim command', () => {
  it('round-trips every kind and handler exactly, and is recognised by argv[0]', () => {
    fc.assert(
      fc.property(fc.constantFrom(...SHIM_KINDS), handler, (kind, h) => {
        const cmd = encodeShimCommand(kind, h);
        expect(cmd).toHaveLength(3);
        expect(cmd[0]).toBe(SHIM_COMMAND_PATH);
        expect(isShimCommand(cmd)).toBe(true);
        expect(decodeShimCommand(cmd)).toEqual({ kind, handler: h });
      }),
      { seed: 11, numRuns: 300 },
    );
  });

  it('survives kubelet $(VAR) expansion whatever the handler holds', () => {
    const env = { POD_NAME: 'web-0', HOME: '/root', HOSTNAME: 'web-0', A: 'x' };
    const hostile = { httpGet: { path: '/h?p=$(POD_NAME)&q=$$(HOME)&r=$(A', port: 'http', httpHeaders: [{ name: 'X', value: '$(HOSTNAME) $$ $( )' }] } };
    const cmd = encodeShimCommand('liveness', hostile);
    const expanded = cmd.map((a) => kubeletExpand(a, env));
    expect(expanded).toEqual(cmd);
    expect(decodeShimCommand(expanded)!.handler).toEqual(hostile);
    // The expansion model itself does expand: the guard above could fail.
    expect(kubeletExpand(JSON.stringify(hostile), env)).not.toBe(JSON.stringify(hostile));
    fc.assert(
      fc.property(handler, (h) => {
        const c = encodeShimCommand('readiness', h);
        expect(c.every((a) => !/[$()]/.test(a))).toBe(true);
      }),
      { seed: 12, numRuns: 200 },
    );
  });

  it('leaves commands that are not ours alone', () => {
    expect(isShimCommand(undefined)).toBe(false);
    expect(isShimCommand([])).toBe(false);
    expect(decodeShimCommand(['/bin/sh', '-c', 'true'])).toBeNull();
    expect(decodeShimCommand(['/.probe-agent/v2', 'liveness', 'e30'])).toBeNull();
    expect(decodeShimCommand([' /.probe-agent/v1', 'liveness', 'e30'])).toBeNull();
  });

  it.each([
    [['/.probe-agent/v1'], /expected 3 arguments, got 1/],
    [['/.probe-agent/v1', 'liveness'], /expected 3 arguments, got 2/],
    [['/.probe-agent/v1', 'liveness', 'e30', 'extra'], /expected 3 arguments, got 4/],
    [['/.probe-agent/v1', 'Liveness', 'e30'], /unknown kind "Liveness"/],
    [['/.probe-agent/v1', 'x'.repeat(100), 'e30'], /unknown kind "x{32}"$/],
    [['/.probe-agent/v1', 'readiness', 'e30='], /not base64url/],
    [['/.probe-agent/v1', 'readiness', 'e3+/'], /not base64url/],
    [['/.probe-agent/v1', 'readiness', Buffer.from('{"httpGet":').toString('base64url')], /not JSON/],
    [['/.probe-agent/v1', 'readiness', Buffer.from('[1]').toString('base64url')], /not a JSON object/],
    [['/.probe-agent/v1', 'readiness', Buffer.from('null').toString('base64url')], /not a JSON object/],
    [['/.probe-agent/v1', 'readiness', Buffer.from('"s"').toString('base64url')], /not a JSON object/],
    [['/.probe-agent/v1', 'readiness', 'A'.repeat(MAX_ENCODED_HANDLER + 1)], new RegExp(`limit ${MAX_ENCODED_HANDLER}`)],
  ])('refuses the malformed command %j with a clear message', (cmd, message) => {
    expect(() => decodeShimCommand(cmd)).toThrow(ShimCommandError);
    expect(() => decodeShimCommand(cmd)).toThrow(message);
  });
});
