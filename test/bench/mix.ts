/**
 * The fixed probe mix: four kinds (TCP, HTTP, HTTPS, gRPC), each once succeeding and once failing,
 * as the agent's handlers and as the blackbox exporter's module + target for the same check.
 */
import type { ProbeHandler } from '../../agent/probe/types.ts';

/** Probe kinds as reported (targets are per kind). */
export type Kind = 'tcp' | 'http' | 'https' | 'grpc';
/** Report order of the kinds. */
export const KINDS: readonly Kind[] = ['tcp', 'http', 'https', 'grpc'];

/** One entry of the mix, e.g. "http-ok". */
export type VariantName = `${Kind}-${'ok' | 'fail'}`;

/** Ports the side-by-side pod servers listen on (each pod has its own netns, so they can be fixed). */
export const POD_PORTS = { http: 8080, https: 8443, tcp: 9000, grpc: 9090 } as const;
/** Nothing listens here inside a pod: the kernel answers with a reset (refused). */
export const CLOSED_PORT = 1;
/** gRPC service the pod servers report NOT_SERVING. */
export const DOWN_SERVICE = 'bench.down';

/** One entry of the mix, for the agent and for blackbox. */
export interface Variant {
  name: VariantName;
  kind: Kind;
  expectSuccess: boolean;
  handler: ProbeHandler;
  /** blackbox_exporter module name (see blackbox.ts). */
  module: string;
  /** blackbox_exporter target for a pod IPv4 address. */
  target: (ip: string) => string;
}

/** The eight entries of the mix, in report order. */
export function variants(ports: { http: number; https: number; tcp: number; grpc: number } = POD_PORTS): Variant[] {
  const http = (scheme: 'HTTP' | 'HTTPS', port: number, path: string): ProbeHandler => ({ kind: 'http', port, path, scheme, headers: [] });
  const url = (scheme: string, port: number, path: string) => (ip: string) => `${scheme}://${ip}:${port}${path}`;
  return [
    { name: 'tcp-ok', kind: 'tcp', expectSuccess: true, handler: { kind: 'tcp', port: ports.tcp }, module: 'tcp_connect', target: (ip) => `${ip}:${ports.tcp}` },
    { name: 'tcp-fail', kind: 'tcp', expectSuccess: false, handler: { kind: 'tcp', port: CLOSED_PORT }, module: 'tcp_connect', target: (ip) => `${ip}:${CLOSED_PORT}` },
    { name: 'http-ok', kind: 'http', expectSuccess: true, handler: http('HTTP', ports.http, '/healthz'), module: 'http_2xx', target: url('http', ports.http, '/healthz') },
    { name: 'http-fail', kind: 'http', expectSuccess: false, handler: http('HTTP', ports.http, '/status/503'), module: 'http_2xx', target: url('http', ports.http, '/status/503') },
    { name: 'https-ok', kind: 'https', expectSuccess: true, handler: http('HTTPS', ports.https, '/healthz'), module: 'https_insecure', target: url('https', ports.https, '/healthz') },
    { name: 'https-fail', kind: 'https', expectSuccess: false, handler: http('HTTPS', ports.https, '/status/503'), module: 'https_insecure', target: url('https', ports.https, '/status/503') },
    { name: 'grpc-ok', kind: 'grpc', expectSuccess: true, handler: { kind: 'grpc', port: ports.grpc, service: '' }, module: 'grpc_plain', target: (ip) => `${ip}:${ports.grpc}` },
    { name: 'grpc-fail', kind: 'grpc', expectSuccess: false, handler: { kind: 'grpc', port: ports.grpc, service: DOWN_SERVICE }, module: 'grpc_plain_down', target: (ip) => `${ip}:${ports.grpc}` },
  ];
}

/** The names of variants(), in order. */
export const VARIANT_NAMES: readonly VariantName[] = variants().map((v) => v.name);
