import { describe, expect, it } from 'vitest';
import { InvalidProbeError } from '../../agent/errors.ts';
import { ianaSvcNameProblem, parseProbe, parseProbeText, PROBE_DEFAULTS } from '../../agent/probe/spec.ts';

function errorOf(f: () => unknown): InvalidProbeError {
  try {
    f();
  } catch (err) {
    expect(err).toBeInstanceOf(InvalidProbeError);
    return err as InvalidProbeError;
  }
  throw new Error('expected InvalidProbeError, got a result');
}

describe('parseProbe: defaults', () => {
  it('applies kubelet defaults when fields are absent', () => {
    const spec = parseProbe({ tcpSocket: { port: 8080 } });
    expect(spec).toEqual({ handler: { kind: 'tcp', port: 8080 }, ...PROBE_DEFAULTS });
    expect(PROBE_DEFAULTS).toEqual({ timeoutSeconds: 1, periodSeconds: 10, successThreshold: 1, failureThreshold: 3, initialDelaySeconds: 0 });
  });

  it('treats 0 as "use the default" like SetDefaults_Probe', () => {
    const spec = parseProbe({ tcpSocket: { port: 1 }, timeoutSeconds: 0, periodSeconds: 0, successThreshold: 0, failureThreshold: 0 });
    expect([spec.timeoutSeconds, spec.periodSeconds, spec.successThreshold, spec.failureThreshold]).toEqual([1, 10, 1, 3]);
  });

  it('keeps explicit values', () => {
    const spec = parseProbe({
      grpc: { port: 9090, service: 'db' },
      timeoutSeconds: 5, periodSeconds: 2, successThreshold: 3, failureThreshold: 7, initialDelaySeconds: 4,
      terminationGracePeriodSeconds: 30,
    });
    expect(spec).toEqual({
      handler: { kind: 'grpc', port: 9090, service: 'db' },
      timeoutSeconds: 5, periodSeconds: 2, successThreshold: 3, failureThreshold: 7, initialDelaySeconds: 4,
      terminationGracePeriodSeconds: 30,
    });
  });

  it('normalises httpGet: scheme upper-cased, path defaulted, headers kept in order with repeats', () => {
    const spec = parseProbe({
      httpGet: { port: 'http-alt', scheme: 'https', host: '10.0.0.9', httpHeaders: [{ name: 'x-a', value: '1' }, { name: 'X-A', value: '2' }, { name: 'Accept', value: '' }] },
    });
    expect(spec.handler).toEqual({
      kind: 'http', port: 'http-alt', path: '/', scheme: 'HTTPS', host: '10.0.0.9',
      headers: [{ name: 'x-a', value: '1' }, { name: 'X-A', value: '2' }, { name: 'Accept', value: '' }],
    });
  });

  it('parses exec so callers can leave it to kubelet', () => {
    expect(parseProbe({ exec: { command: ['cat', '/tmp/ok'] } }).handler).toEqual({ kind: 'exec', command: ['cat', '/tmp/ok'] });
  });

  it('accepts a Probe with null handler slots (as JSON from the API can have)', () => {
    expect(parseProbe({ exec: null, httpGet: null, tcpSocket: { port: 22 } }).handler.kind).toBe('tcp');
  });
});

describe('parseProbe: validation errors name the field', () => {
  const cases: [string, unknown, string, object?][] = [
    ['no handler', { periodSeconds: 3 }, 'must specify a handler type'],
    ['two handlers', { tcpSocket: { port: 1 }, httpGet: { port: 1 } }, 'tcpSocket: may not specify more than 1 handler type'],
    ['port 0', { httpGet: { port: 0 } }, 'httpGet.port: must be 1..65535, got 0'],
    ['port 65536', { tcpSocket: { port: 65536 } }, 'tcpSocket.port: must be 1..65535, got 65536'],
    ['port fraction', { tcpSocket: { port: 80.5 } }, 'tcpSocket.port: must be an integer'],
    ['port missing', { httpGet: { path: '/' } }, 'httpGet.port: required'],
    ['numeric string port', { httpGet: { port: '8080' } }, 'httpGet.port: invalid port name "8080": must contain at least one letter'],
    ['port name too long', { tcpSocket: { port: 'abcdefghijklmnop' } }, 'tcpSocket.port: invalid port name "abcdefghijklmnop": must be no more than 15 characters'],
    ['port name upper case', { tcpSocket: { port: 'HTTP' } }, 'tcpSocket.port: invalid port name "HTTP": must contain only lowercase'],
    ['port name double hyphen', { tcpSocket: { port: 'a--b' } }, 'tcpSocket.port: invalid port name "a--b": must not contain consecutive hyphens'],
    ['port name leading hyphen', { tcpSocket: { port: '-ab' } }, 'tcpSocket.port: invalid port name "-ab"'],
    ['grpc named port', { grpc: { port: 'grpc' } }, 'grpc.port: must be a port number (gRPC has no named ports)'],
    ['grpc port 0', { grpc: { port: 0 } }, 'grpc.port: must be 1..65535, got 0'],
    ['grpc service not string', { grpc: { port: 1, service: 5 } }, 'grpc.service: must be a string'],
    ['bad scheme', { httpGet: { port: 80, scheme: 'ftp' } }, 'httpGet.scheme: unsupported value "ftp"'],
    ['header name with space', { httpGet: { port: 80, httpHeaders: [{ name: 'X Foo', value: 'a' }] } }, 'httpGet.httpHeaders[0].name: invalid header name "X Foo"'],
    ['header name empty', { httpGet: { port: 80, httpHeaders: [{ name: '', value: 'a' }] } }, 'httpGet.httpHeaders[0].name: required'],
    ['header value with newline', { httpGet: { port: 80, httpHeaders: [{ name: 'X', value: 'a\r\nEvil: 1' }] } }, 'httpGet.httpHeaders[0].value: must not contain control characters'],
    ['headers not a list', { httpGet: { port: 80, httpHeaders: { a: 'b' } } }, 'httpGet.httpHeaders: must be a list'],
    ['too many headers', { httpGet: { port: 80, httpHeaders: Array.from({ length: 65 }, () => ({ name: 'X', value: 'v' })) } }, 'httpGet.httpHeaders: must have at most 64 entries, got 65'],
    ['path too long', { httpGet: { port: 80, path: '/' + 'a'.repeat(3000) } }, 'httpGet.path: must be at most 2048 characters'],
    ['path with control char', { httpGet: { port: 80, path: '/a\u0000' } }, 'httpGet.path: must not contain control characters'],
    ['host with slash', { tcpSocket: { port: 80, host: 'a/b' } }, 'tcpSocket.host: invalid host'],
    ['negative timeout', { tcpSocket: { port: 1 }, timeoutSeconds: -1 }, 'timeoutSeconds: must be 1..3600, got -1'],
    ['huge timeout', { tcpSocket: { port: 1 }, timeoutSeconds: 86400 }, 'timeoutSeconds: must be 1..3600, got 86400'],
    ['negative period', { tcpSocket: { port: 1 }, periodSeconds: -5 }, 'periodSeconds: must be 1..2147483647, got -5'],
    ['string threshold', { tcpSocket: { port: 1 }, failureThreshold: '3' }, 'failureThreshold: must be an integer, got "3"'],
    ['negative initial delay', { tcpSocket: { port: 1 }, initialDelaySeconds: -1 }, 'initialDelaySeconds: must be 0..2147483647, got -1'],
    ['grace 0', { tcpSocket: { port: 1 }, terminationGracePeriodSeconds: 0 }, 'terminationGracePeriodSeconds: must be greater than 0, got 0'],
    ['exec without command', { exec: {} }, 'exec.command: required'],
    ['exec non-string arg', { exec: { command: ['a', 1] } }, 'exec.command[1]: must be a string'],
    ['handler not an object', { httpGet: 'http://x' }, 'httpGet: must be an object, got "http://x"'],
    ['not an object', 42, 'must be an object, got 42'],
    ['array', [], 'must be an object, got array'],
    ['liveness successThreshold', { tcpSocket: { port: 1 }, successThreshold: 2 }, 'successThreshold: must be 1 for Liveness probes, got 2', { probeType: 'Liveness' }],
    ['startup successThreshold', { tcpSocket: { port: 1 }, successThreshold: 3 }, 'successThreshold: must be 1 for Startup probes, got 3', { probeType: 'Startup' }],
    ['readiness grace', { tcpSocket: { port: 1 }, terminationGracePeriodSeconds: 5 }, 'terminationGracePeriodSeconds: must not be set for readinessProbes', { probeType: 'Readiness' }],
    ['field path prefix', { httpGet: { port: 0 } }, 'spec.containers[1].readinessProbe.httpGet.port: must be 1..65535, got 0', { fieldPath: 'spec.containers[1].readinessProbe' }],
    ['unknown field (handler-only input)', { tcpSocket: { port: 1 }, timeoutSecond: 3 }, 'timeoutSecond: unknown field', { allowHandlerOnly: true }],
  ];
  for (const [name, raw, message, opts] of cases) {
    it(name, () => {
      const err = errorOf(() => parseProbe(raw, opts));
      expect(err.message.startsWith(message), `"${err.message}" should start with "${message}"`).toBe(true);
      expect(err.code).toBe('invalid-probe');
    });
  }

  it('readiness may have successThreshold > 1', () => {
    expect(parseProbe({ tcpSocket: { port: 1 }, successThreshold: 2 }, { probeType: 'Readiness' }).successThreshold).toBe(2);
  });

  it('ignores unknown fields in pod specs (newer Kubernetes may add Probe fields)', () => {
    expect(parseProbe({ tcpSocket: { port: 1 }, someFutureField: true }).handler.kind).toBe('tcp');
  });

  it('the error carries the field path in its context', () => {
    expect(errorOf(() => parseProbe({ httpGet: { port: 0 } })).context).toMatchObject({ field: 'httpGet.port' });
  });
});

describe('IANA_SVC_NAME', () => {
  it.each(['http', 'h2c', 'a-b-c', '8080a', 'abcdefghijklmno'])('accepts %s', (name) => expect(ianaSvcNameProblem(name)).toBeUndefined());
  it.each(['', '80', 'a_b', 'a.b', 'ab-', 'Http', 'abcdefghijklmnop', 'a--b'])('rejects %j', (name) => expect(ianaSvcNameProblem(name)).toBeTypeOf('string'));
});

describe('parseProbeText', () => {
  it('reads JSON', () => {
    expect(parseProbeText('{"httpGet":{"port":8080,"path":"/healthz"},"timeoutSeconds":3}').timeoutSeconds).toBe(3);
  });

  it('reads YAML, the way it sits in a pod manifest', () => {
    const spec = parseProbeText('httpGet:\n  path: /ready\n  port: web\n  httpHeaders:\n  - name: X-Probe\n    value: "1"\nperiodSeconds: 5\n');
    expect(spec.handler).toEqual({ kind: 'http', port: 'web', path: '/ready', scheme: 'HTTP', headers: [{ name: 'X-Probe', value: '1' }] });
    expect(spec.periodSeconds).toBe(5);
  });

  it('reports broken JSON as a JSON error with its position, not as a YAML parser message', () => {
    expect(errorOf(() => parseProbeText('{"tcpSocket": {"port": 80}')).message).toBe(
      "probe document is not valid JSON: Expected ',' or '}' after property value in JSON at position 26 (line 1 column 27)",
    );
    expect(errorOf(() => parseProbeText('{"tcpSocket": {"port": ')).message).toBe(
      'probe document is not valid JSON: Unexpected end of JSON input at position 23 (the end of the input)',
    );
    // A YAML flow mapping that is not JSON is still YAML.
    expect(parseProbeText('{tcpSocket: {port: 80}}').handler).toEqual({ kind: 'tcp', port: 80 });
  });

  it('emits no process warning for YAML the parser only warns about', async () => {
    const seen: Error[] = [];
    const onWarning = (w: Error): void => void seen.push(w);
    process.on('warning', onWarning);
    try {
      expect(errorOf(() => parseProbeText('!!js/function "function(){}"')).message).toMatch(/object/);
      expect(parseProbeText('%YAML 1.1\n---\ntcpSocket: {port: 1}\n').handler).toEqual({ kind: 'tcp', port: 1 });
      await new Promise((r) => setImmediate(r));
    } finally {
      process.off('warning', onWarning);
    }
    expect(seen.map((w) => `${w.name}: ${w.message}`)).toEqual([]);
  });

  it('refuses oversized documents before parsing', () => {
    expect(errorOf(() => parseProbeText('#'.repeat(70_000))).message).toMatch(/larger than 65536 bytes/);
  });

  it('refuses YAML alias bombs', () => {
    const bomb = 'a: &a ["x","x","x","x","x","x","x","x","x"]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ntcpSocket: {port: 1}\n';
    expect(errorOf(() => parseProbeText(bomb)).message).toMatch(/not valid YAML/);
  });

  it('validates after parsing', () => {
    expect(errorOf(() => parseProbeText('tcpSocket:\n  port: 0\n')).message).toBe('tcpSocket.port: must be 1..65535, got 0');
  });
});
