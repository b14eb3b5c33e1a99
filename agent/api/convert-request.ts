/**
 * ProbeRequest and ProbeHandler conversions. A wire handler is validated by turning it into the
 * Kubernetes JSON shape and running parseProbe, so the API and pod specs share one validation path.
 */
import { InvalidProbeError } from '../errors.ts';
import { parseProbe, PROBE_DEFAULTS, SPEC_LIMITS } from '../probe/spec.ts';
import type { HttpGetHandler, PortRef, ProbeHandler, TcpSocketHandler } from '../probe/types.ts';
import type { LifecycleHook } from '../probe/lifecycle.ts';
import type { OnDemandHookRequest, OnDemandProbeRequest } from '../scheduler/types.ts';
import { normalizeContainerID } from '../prober/container-lookup.ts';
import { boundedId, probeTypeFromWire } from './convert.ts';
import type { WireIntOrString, WireLifecycleHandler, WireLifecycleRequest, WireProbeHandler, WireProbeRequest } from './proto.ts';

function portToKubernetes(p: WireIntOrString | null | undefined): PortRef | undefined {
  if (!p) return undefined;
  const which = p.value ?? (p.str_val !== undefined && p.str_val !== '' ? 'str_val' : p.int_val !== undefined ? 'int_val' : undefined);
  if (which === 'str_val') return p.str_val ?? '';
  if (which === 'int_val') return p.int_val ?? 0;
  return undefined;
}

/** The wire handler in the Kubernetes JSON shape (httpGet/tcpSocket/grpc), for parseProbe. */
export function handlerToKubernetes(h: WireProbeHandler | null | undefined): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  if (!h) return out;
  if (h.http_get) {
    const g = h.http_get;
    out['httpGet'] = {
      path: g.path || undefined,
      port: portToKubernetes(g.port),
      host: g.host || undefined,
      scheme: g.scheme || undefined,
      httpHeaders: (g.http_headers ?? []).map((x) => (x.value_from ? { name: x.name, value: x.value, valueFrom: x.value_from } : { name: x.name, value: x.value })),
    };
  }
  if (h.tcp_socket) out['tcpSocket'] = { port: portToKubernetes(h.tcp_socket.port), host: h.tcp_socket.host || undefined };
  if (h.grpc) out['grpc'] = { port: h.grpc.port ?? 0, service: h.grpc.service || undefined };
  return out;
}

const SNAKE: Record<string, string> = { httpGet: 'http_get', tcpSocket: 'tcp_socket', httpHeaders: 'http_headers', valueFrom: 'value_from' };

/** Rewrites the Kubernetes field path at the start of a parseProbe message into the proto's names. */
function toProtoFieldPath(err: InvalidProbeError): InvalidProbeError {
  const field = err.context['field'];
  if (typeof field !== 'string' || !err.message.startsWith(`${field}: `)) return err;
  const protoField = field.replace(/[A-Za-z]+/g, (seg) => SNAKE[seg] ?? seg);
  return new InvalidProbeError(`${protoField}: ${err.message.slice(field.length + 2)}`, { field: protoField });
}

/** Validates a wire ProbeRequest into an OnDemandProbeRequest; throws InvalidProbeError naming the field. */
export function probeRequestFromWire(w: WireProbeRequest): OnDemandProbeRequest {
  const uid = w.pod_uid ?? '';
  const sandbox = w.pod_sandbox_id ?? '';
  const ns = w.pod_namespace ?? '';
  const name = w.pod_name ?? '';
  const containerID = w.container_id ?? '';
  const ways = [uid !== '', sandbox !== '', ns !== '' || name !== '', containerID !== ''].filter(Boolean).length;
  if (ways !== 1) {
    throw new InvalidProbeError('pod: give exactly one of pod_uid, pod_sandbox_id, pod_namespace with pod_name, or container_id', { field: 'pod_uid' });
  }
  if ((ns === '') !== (name === '')) {
    const missing = ns === '' ? 'pod_namespace' : 'pod_name';
    throw new InvalidProbeError(`${missing}: required together with ${missing === 'pod_name' ? 'pod_namespace' : 'pod_name'}`, { field: missing });
  }
  if (!w.handler) throw new InvalidProbeError('handler: required', { field: 'handler' });
  let handler: ProbeHandler;
  try {
    handler = parseProbe(handlerToKubernetes(w.handler), { allowHandlerOnly: true, fieldPath: 'handler' }).handler;
  } catch (err) {
    throw err instanceof InvalidProbeError ? toProtoFieldPath(err) : err;
  }
  const t = w.timeout_seconds ?? 0;
  if (!Number.isInteger(t) || t < 0 || t > SPEC_LIMITS.maxTimeoutSeconds) {
    throw new InvalidProbeError(`timeout_seconds: must be 0 (default ${PROBE_DEFAULTS.timeoutSeconds}) or 1..${SPEC_LIMITS.maxTimeoutSeconds}, got ${t}`, {
      field: 'timeout_seconds',
    });
  }
  const req: OnDemandProbeRequest = { handler, timeoutSeconds: t === 0 ? PROBE_DEFAULTS.timeoutSeconds : t };
  if (uid) req.podUID = boundedId(uid, 'pod_uid');
  if (sandbox) req.podSandboxID = boundedId(sandbox, 'pod_sandbox_id');
  if (ns) {
    req.podNamespace = boundedId(ns, 'pod_namespace');
    req.podName = boundedId(name, 'pod_name');
  }
  if (containerID) req.containerID = normalizeContainerID(containerID);
  if (w.container_name) req.containerName = boundedId(w.container_name, 'container_name');
  const probeType = probeTypeFromWire(w.probe_type);
  if (probeType) {
    if (!req.containerID && !req.containerName) {
      throw new InvalidProbeError('probe_type: needs the container (container_id or container_name)', { field: 'probe_type' });
    }
    req.probeType = probeType;
  }
  return req;
}

function portToWire(port: PortRef): WireIntOrString {
  return typeof port === 'number' ? { int_val: port } : { str_val: port };
}

/** A parsed handler as a wire ProbeHandler (for clients). Exec handlers are refused: kubelet runs them. */
export function handlerToWire(h: ProbeHandler): WireProbeHandler {
  switch (h.kind) {
    case 'http':
      return {
        http_get: {
          path: h.path,
          port: portToWire(h.port),
          host: h.host ?? '',
          scheme: h.scheme,
          http_headers: h.headers.map((x) => (x.valueFrom ? { name: x.name, value: x.value, value_from: x.valueFrom } : { name: x.name, value: x.value })),
        },
      };
    case 'tcp':
      return { tcp_socket: { port: portToWire(h.port), host: h.host ?? '' } };
    case 'grpc':
      return { grpc: { port: h.port, service: h.service ?? '' } };
    case 'exec':
      throw new InvalidProbeError('exec: exec probes are run by kubelet, never through probe-agent', { field: 'exec' });
  }
}

const HOOKS: Record<string, LifecycleHook> = { LIFECYCLE_HOOK_POST_START: 'postStart', LIFECYCLE_HOOK_PRE_STOP: 'preStop', '1': 'postStart', '2': 'preStop' };

/** Validates a wire RunLifecycleHandlerRequest; throws InvalidProbeError naming the field. */
export function lifecycleRequestFromWire(w: WireLifecycleRequest): OnDemandHookRequest {
  const uid = w.pod_uid ?? '';
  const sandbox = w.pod_sandbox_id ?? '';
  const containerID = w.container_id ?? '';
  if ([uid, sandbox, containerID].filter((x) => x !== '').length !== 1) {
    throw new InvalidProbeError('pod: give exactly one of pod_uid, pod_sandbox_id or container_id', { field: 'pod_uid' });
  }
  const hook = HOOKS[String(w.hook ?? '')];
  if (!hook) throw new InvalidProbeError(`hook: must be LIFECYCLE_HOOK_POST_START or LIFECYCLE_HOOK_PRE_STOP, got ${JSON.stringify(w.hook ?? 'unset')}`, { field: 'hook' });
  const h = w.handler;
  if (!h || (!h.http_get && !h.tcp_socket)) throw new InvalidProbeError('handler: required (http_get or tcp_socket)', { field: 'handler' });
  let parsed: ProbeHandler;
  try {
    parsed = parseProbe(handlerToKubernetes(h), { allowHandlerOnly: true, fieldPath: 'handler' }).handler;
  } catch (err) {
    throw err instanceof InvalidProbeError ? toProtoFieldPath(err) : err;
  }
  if (parsed.kind !== 'http' && parsed.kind !== 'tcp') throw new InvalidProbeError('handler: must be http_get or tcp_socket', { field: 'handler' });
  const t = w.timeout_seconds ?? 0;
  if (!Number.isInteger(t) || t < 0 || t > SPEC_LIMITS.maxTimeoutSeconds) {
    throw new InvalidProbeError(`timeout_seconds: must be 0 (no limit of its own) or 1..${SPEC_LIMITS.maxTimeoutSeconds}, got ${t}`, { field: 'timeout_seconds' });
  }
  const req: OnDemandHookRequest = { handler: parsed, hook, timeoutSeconds: t };
  if (uid) req.podUID = boundedId(uid, 'pod_uid');
  if (sandbox) req.podSandboxID = boundedId(sandbox, 'pod_sandbox_id');
  if (containerID) req.containerID = normalizeContainerID(containerID);
  if (w.container_name) req.containerName = boundedId(w.container_name, 'container_name');
  return req;
}

/** A lifecycle handler (http or tcp) as a wire LifecycleHandler (for clients). */
export function lifecycleHandlerToWire(h: HttpGetHandler | TcpSocketHandler): WireLifecycleHandler {
  const w = handlerToWire(h);
  return h.kind === 'http' ? { http_get: w.http_get ?? null } : { tcp_socket: w.tcp_socket ?? null };
}
