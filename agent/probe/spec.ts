/**
 * Parses and validates a Kubernetes `Probe` (or a bare handler) into a ProbeSpec, applying
 * kubelet's defaults (SetDefaults_Probe) and the checks of Kubernetes API validation
 * (validateProbe / validateHandler), plus the size bounds a node agent needs.
 */
import { createRequire } from 'node:module';

/**
 * The YAML parser, loaded on first use: only the one-shot CLI parses probe text, and the daemon
 * would otherwise carry its 70 modules (several MB of RSS) for nothing (issue 14).
 */
const parseYaml = (text: string, opts: object): unknown => (createRequire(import.meta.url)('yaml') as typeof import('yaml')).parse(text, opts);
import { InvalidProbeError } from '../errors.ts';
import type { HttpHeader, PortRef, ProbeHandler, ProbeSpec, ProbeType } from './types.ts';

/** Kubelet's defaults for a Probe whose field is absent or 0. */
export const PROBE_DEFAULTS = {
  timeoutSeconds: 1,
  periodSeconds: 10,
  successThreshold: 1,
  failureThreshold: 3,
  initialDelaySeconds: 0,
} as const;

/** Input bounds: Kubernetes has few, an agent that accepts specs from an API needs them. */
export const SPEC_LIMITS = {
  /** A probe that waits longer than an hour is a mistake, and it would hold a slot that long. */
  maxTimeoutSeconds: 3600,
  /** Probe fields are int32 in the API. */
  maxInt32: 2_147_483_647,
  /**
   * Grace periods and sleeps are int64 seconds in the API (any value up to 2^63-1 is admitted);
   * kubelet turns them into a Go time.Duration (int64 ns), whose largest whole number of seconds is
   * this (~292 years). Clamped here where they are read: no deadline, timer or gRPC timeout a pod
   * sets is larger, and none overflows (a JS timer is chained, see agent/scheduler/clock.ts).
   */
  maxDurationSeconds: 9_223_372_036,
  maxPathLength: 2048,
  maxHeaders: 64,
  maxHeaderNameLength: 256,
  maxHeaderValueLength: 4096,
  maxHostLength: 253,
  maxServiceLength: 1024,
  maxExecArgs: 256,
  maxExecArgLength: 4096,
  /** parseProbeText refuses larger documents before parsing them. */
  maxTextBytes: 64 * 1024,
} as const;

/** Options for parseProbe. */
export interface ParseProbeOptions {
  /**
   * The input comes from a person or an API client, not from a pod spec: it may be a bare handler
   * ({"httpGet":{...}}), and unknown top-level keys are rejected (a typo must not silently become a
   * default). Without it (pod specs from the kubelet), unknown keys are ignored so that fields added
   * to Probe by newer Kubernetes versions do not make pods unparseable.
   */
  allowHandlerOnly?: boolean;
  /** Enables the per-type rules (Liveness/Startup: successThreshold 1; Readiness: no terminationGracePeriodSeconds). */
  probeType?: ProbeType;
  /** Prefix for field paths in messages, e.g. "spec.containers[0].livenessProbe". */
  fieldPath?: string;
}

const HANDLER_KEYS = ['exec', 'httpGet', 'tcpSocket', 'grpc'] as const;
const PROBE_KEYS = new Set<string>([
  ...HANDLER_KEYS,
  'timeoutSeconds',
  'periodSeconds',
  'successThreshold',
  'failureThreshold',
  'initialDelaySeconds',
  'terminationGracePeriodSeconds',
]);

/** Kubernetes' IsHTTPHeaderName: stricter than an RFC 9110 token, and what the API server enforces. */
const HEADER_NAME = /^[-A-Za-z0-9]+$/;
/** Go's http client refuses header values with control characters other than HTAB. */
const HEADER_VALUE_FORBIDDEN = /[\u0000-\u0008\u000a-\u001f\u007f]/;
const IANA_SVC_NAME = /^[a-z0-9]([a-z0-9-]*[a-z0-9])?$/;

/** Parses a Kubernetes Probe (or, with allowHandlerOnly, a bare handler) and applies kubelet's defaults. Throws InvalidProbeError. */
export function parseProbe(raw: unknown, opts: ParseProbeOptions = {}): ProbeSpec {
  const p = new FieldPath(opts.fieldPath);
  const obj = requireObject(raw, p);
  if (opts.allowHandlerOnly) {
    for (const key of Object.keys(obj)) {
      if (!PROBE_KEYS.has(key)) throw p.child(key).error('unknown field');
    }
  }
  const handler = parseHandler(obj, p);
  const spec: ProbeSpec = {
    handler,
    timeoutSeconds: defaultedInt(obj, 'timeoutSeconds', p, 1, SPEC_LIMITS.maxTimeoutSeconds),
    periodSeconds: defaultedInt(obj, 'periodSeconds', p, 1, SPEC_LIMITS.maxInt32),
    successThreshold: defaultedInt(obj, 'successThreshold', p, 1, SPEC_LIMITS.maxInt32),
    failureThreshold: defaultedInt(obj, 'failureThreshold', p, 1, SPEC_LIMITS.maxInt32),
    initialDelaySeconds: defaultedInt(obj, 'initialDelaySeconds', p, 0, SPEC_LIMITS.maxInt32),
  };
  const grace = obj['terminationGracePeriodSeconds'];
  if (grace !== undefined && grace !== null) {
    const gp = p.child('terminationGracePeriodSeconds');
    // int64 in the API, validated > 0: anything larger than kubelet's Duration can hold is that.
    spec.terminationGracePeriodSeconds = clampSeconds(integer(grace, gp, 1, Number.MAX_VALUE, 'must be greater than 0'));
    if (opts.probeType === 'Readiness') throw gp.error('must not be set for readinessProbes');
  }
  if ((opts.probeType === 'Liveness' || opts.probeType === 'Startup') && spec.successThreshold !== 1) {
    throw p.child('successThreshold').error(`must be 1 for ${opts.probeType} probes, got ${spec.successThreshold}`);
  }
  return spec;
}

/** Parses a probe written as JSON or YAML (size-bounded), then validates it like parseProbe. */
export function parseProbeText(text: string, opts: ParseProbeOptions = {}): ProbeSpec {
  if (Buffer.byteLength(text, 'utf8') > SPEC_LIMITS.maxTextBytes) {
    throw new InvalidProbeError(`probe document is larger than ${SPEC_LIMITS.maxTextBytes} bytes`);
  }
  let doc: unknown;
  try {
    // YAML 1.2 is a superset of JSON, so one parser covers both; aliases are capped against billion-laughs.
    // logLevel 'error': a YAML warning (an unknown tag, a %YAML directive) must not reach stderr as a
    // process warning; what the document means is checked below either way.
    doc = parseYaml(text, { maxAliasCount: 16, prettyErrors: false, uniqueKeys: true, logLevel: 'error' });
  } catch (err) {
    // Text that starts like JSON was meant as JSON: say where the JSON breaks, not what the YAML parser saw.
    const json = /^\s*[{[]/.test(text) ? jsonSyntaxError(text) : undefined;
    if (json !== undefined) throw new InvalidProbeError(`probe document is not valid JSON: ${json}`);
    const msg = err instanceof Error ? err.message.split('\n')[0] : String(err);
    throw new InvalidProbeError(`probe document is not valid YAML: ${msg}`);
  }
  return parseProbe(doc, opts);
}

/** JSON.parse's message for `text` (with its position; the end of the input when the text stops short), or undefined when it parses. */
function jsonSyntaxError(text: string): string | undefined {
  try {
    JSON.parse(text);
    return undefined;
  } catch (err) {
    const msg = err instanceof Error ? err.message : String(err);
    return /position \d+/.test(msg) ? msg : `${msg} at position ${text.length} (the end of the input)`;
  }
}

/** Returns the one handler of a Probe-shaped object; exactly one is required, as in validateHandler. */
function parseHandler(obj: Record<string, unknown>, p: FieldPath): ProbeHandler {
  const present = HANDLER_KEYS.filter((k) => obj[k] !== undefined && obj[k] !== null);
  if (present.length === 0) throw p.error('must specify a handler type (one of exec, httpGet, tcpSocket, grpc)');
  if (present.length > 1) throw p.child(present[1] as string).error(`may not specify more than 1 handler type (got ${present.join(', ')})`);
  const key = present[0] as (typeof HANDLER_KEYS)[number];
  const hp = p.child(key);
  const body = requireObject(obj[key], hp);
  switch (key) {
    case 'httpGet':
      return parseHttpGet(body, hp);
    case 'tcpSocket':
      return { kind: 'tcp', port: portRef(body['port'], hp.child('port')), ...optionalHost(body, hp) };
    case 'grpc':
      return parseGrpc(body, hp);
    case 'exec':
      return parseExec(body, hp);
  }
}

function parseHttpGet(body: Record<string, unknown>, p: FieldPath): ProbeHandler {
  const port = portRef(body['port'], p.child('port'));
  const path = optionalString(body, 'path', p, SPEC_LIMITS.maxPathLength) || '/';
  // Go's url.Parse rejects control characters, so kubelet could never send such a path.
  if (/[\u0000-\u001f\u007f]/.test(path)) throw p.child('path').error('must not contain control characters');
  const schemeRaw = optionalString(body, 'scheme', p, 16) || 'HTTP';
  const scheme = schemeRaw.toUpperCase();
  if (scheme !== 'HTTP' && scheme !== 'HTTPS') {
    throw p.child('scheme').error(`unsupported value "${schemeRaw}": supported values: "HTTP", "HTTPS"`);
  }
  return { kind: 'http', port, path, scheme, headers: parseHeaders(body['httpHeaders'], p.child('httpHeaders')), ...optionalHost(body, p) };
}

function parseHeaders(raw: unknown, p: FieldPath): HttpHeader[] {
  if (raw === undefined || raw === null) return [];
  if (!Array.isArray(raw)) throw p.error('must be a list of {name, value}');
  if (raw.length > SPEC_LIMITS.maxHeaders) throw p.error(`must have at most ${SPEC_LIMITS.maxHeaders} entries, got ${raw.length}`);
  return raw.map((entry, i) => {
    const ep = p.index(i);
    const h = requireObject(entry, ep);
    const name = h['name'];
    if (typeof name !== 'string' || name === '') throw ep.child('name').error('required');
    if (name.length > SPEC_LIMITS.maxHeaderNameLength) throw ep.child('name').error(`must be at most ${SPEC_LIMITS.maxHeaderNameLength} characters`);
    if (!HEADER_NAME.test(name)) throw ep.child('name').error(`invalid header name "${name}": a valid HTTP header must consist of alphanumeric characters or '-'`);
    const valueFrom = h['valueFrom'];
    if (valueFrom !== undefined && valueFrom !== null && valueFrom !== '') {
      // A rewritten handler's header whose value the agent reads from the pod's original-handlers
      // annotation (agent/prober/header-values.ts), so that it never appears in the exec command.
      if (valueFrom !== 'annotation') throw ep.child('valueFrom').error(`unsupported value ${JSON.stringify(String(valueFrom).slice(0, 32))}: supported values: "annotation"`);
      if (h['value'] !== undefined && h['value'] !== null && h['value'] !== '') throw ep.child('value').error('must be empty when valueFrom is set');
      return { name, value: '', valueFrom };
    }
    const value = h['value'] ?? '';
    if (typeof value !== 'string') throw ep.child('value').error('must be a string');
    const bad = checkHeaderValue(value);
    if (bad) throw ep.child('value').error(bad);
    return { name, value };
  });
}

/** What is wrong with a header value (kubelet's and Go's rules), or undefined when nothing is. */
export function checkHeaderValue(value: string): string | undefined {
  if (value.length > SPEC_LIMITS.maxHeaderValueLength) return `must be at most ${SPEC_LIMITS.maxHeaderValueLength} characters`;
  if (HEADER_VALUE_FORBIDDEN.test(value)) return 'must not contain control characters';
  return undefined;
}

function parseGrpc(body: Record<string, unknown>, p: FieldPath): ProbeHandler {
  const pp = p.child('port');
  // The API type is int32: a named port is impossible for gRPC, so a string is an error here.
  if (typeof body['port'] !== 'number') throw pp.error(body['port'] === undefined ? 'required' : 'must be a port number (gRPC has no named ports)');
  const port = integer(body['port'], pp, 1, 65535, 'must be 1..65535');
  const service = body['service'];
  if (service === undefined || service === null) return { kind: 'grpc', port };
  if (typeof service !== 'string') throw p.child('service').error('must be a string');
  if (service.length > SPEC_LIMITS.maxServiceLength) throw p.child('service').error(`must be at most ${SPEC_LIMITS.maxServiceLength} characters`);
  return { kind: 'grpc', port, service };
}

function parseExec(body: Record<string, unknown>, p: FieldPath): ProbeHandler {
  const cp = p.child('command');
  const cmd = body['command'] ?? [];
  if (!Array.isArray(cmd)) throw cp.error('must be a list of strings');
  if (cmd.length === 0) throw cp.error('required');
  if (cmd.length > SPEC_LIMITS.maxExecArgs) throw cp.error(`must have at most ${SPEC_LIMITS.maxExecArgs} entries`);
  const command = cmd.map((arg, i) => {
    if (typeof arg !== 'string') throw cp.index(i).error('must be a string');
    if (arg.length > SPEC_LIMITS.maxExecArgLength) throw cp.index(i).error(`must be at most ${SPEC_LIMITS.maxExecArgLength} characters`);
    return arg;
  });
  return { kind: 'exec', command };
}

/** An intstr port: a number 1..65535, or an IANA_SVC_NAME (ValidatePortNumOrName). */
function portRef(raw: unknown, p: FieldPath): PortRef {
  if (raw === undefined || raw === null) throw p.error('required');
  if (typeof raw === 'number') return integer(raw, p, 1, 65535, 'must be 1..65535');
  if (typeof raw !== 'string') throw p.error(`must be a port number or name, got ${typeof raw}`);
  const problem = ianaSvcNameProblem(raw);
  if (problem) throw p.error(`invalid port name ${JSON.stringify(raw.slice(0, 64))}: ${problem}`);
  return raw;
}

/** Why `name` is not an IANA_SVC_NAME (RFC 6335), or undefined if it is one. */
export function ianaSvcNameProblem(name: string): string | undefined {
  if (name.length === 0) return 'must not be empty';
  if (name.length > 15) return 'must be no more than 15 characters';
  if (!IANA_SVC_NAME.test(name)) return "must contain only lowercase alphanumeric characters or '-', and start and end with an alphanumeric";
  if (name.includes('--')) return "must not contain consecutive hyphens";
  if (!/[a-z]/.test(name)) return 'must contain at least one letter (a-z)';
  return undefined;
}

function optionalHost(body: Record<string, unknown>, p: FieldPath): { host?: string } {
  const host = optionalString(body, 'host', p, SPEC_LIMITS.maxHostLength);
  if (host === undefined || host === '') return {};
  if (/[\s/?#@\u0000-\u001f\u007f]/.test(host)) throw p.child('host').error(`invalid host ${JSON.stringify(host)}`);
  return { host };
}

function optionalString(body: Record<string, unknown>, key: string, p: FieldPath, max: number): string | undefined {
  const v = body[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'string') throw p.child(key).error(`must be a string, got ${typeof v}`);
  if (v.length > max) throw p.child(key).error(`must be at most ${max} characters, got ${v.length}`);
  return v;
}

/** A whole number of seconds (an API int64 grace or sleep) within what kubelet's time.Duration holds. */
export function clampSeconds(seconds: number): number {
  return Math.min(Math.max(0, Math.trunc(seconds)), SPEC_LIMITS.maxDurationSeconds);
}

/** Reads an int field where absent or 0 means "kubelet default" (SetDefaults_Probe); negatives are invalid. */
function defaultedInt(obj: Record<string, unknown>, key: keyof typeof PROBE_DEFAULTS, p: FieldPath, min: number, max: number): number {
  const v = obj[key];
  if (v === undefined || v === null || v === 0) return PROBE_DEFAULTS[key];
  return integer(v, p.child(key), min, max);
}

function integer(v: unknown, p: FieldPath, min: number, max: number, rangeMsg?: string): number {
  if (typeof v !== 'number' || !Number.isInteger(v)) throw p.error(`must be an integer, got ${describe(v)}`);
  if (v < min || v > max) throw p.error(`${rangeMsg ?? `must be ${min}..${max}`}, got ${v}`);
  return v;
}

function requireObject(v: unknown, p: FieldPath): Record<string, unknown> {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw p.error(`must be an object, got ${describe(v)}`);
  return v as Record<string, unknown>;
}

function describe(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  if (typeof v === 'string') return JSON.stringify(v.length > 32 ? v.slice(0, 32) + '…' : v);
  if (typeof v === 'number') return String(v);
  return typeof v;
}

/** A Kubernetes-style field path ("httpGet.httpHeaders[2].name") used in every error message. */
class FieldPath {
  readonly path: string;
  constructor(path = '') {
    this.path = path;
  }
  child(name: string): FieldPath {
    return new FieldPath(this.path ? `${this.path}.${name}` : name);
  }
  index(i: number): FieldPath {
    return new FieldPath(`${this.path}[${i}]`);
  }
  error(msg: string): InvalidProbeError {
    return new InvalidProbeError(this.path ? `${this.path}: ${msg}` : msg, { field: this.path || undefined });
  }
}
