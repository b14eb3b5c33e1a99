/**
 * Loads proto/probe/v1alpha1/api.proto at run time (no generated code: the .proto file is the one
 * source of truth) and declares the shapes grpc-js hands us with the loader options below.
 */
import { fileURLToPath } from 'node:url';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

/** Default path of the ProbeService unix socket. */
export const DEFAULT_SOCKET_PATH = '/run/probe-agent/probe.sock';
/** Fully qualified service name, also the grpc.health.v1 service name of the API. */
export const SERVICE_NAME = 'probe.v1alpha1.ProbeService';

// agent/api/proto.ts and dist/api/proto.js both sit two levels below the repository root.
/** Absolute path of the ProbeService .proto file. */
export const PROTO_PATH = fileURLToPath(new URL('../../proto/probe/v1alpha1/api.proto', import.meta.url));

/**
 * keepCase: field names stay as in the .proto (snake_case), so the wire contract is visible in code;
 * longs as strings: int64 nanosecond timestamps do not fit a double.
 */
export const LOADER_OPTIONS: protoLoader.Options = {
  keepCase: true,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
};

/** The loaded package definition and the ProbeService definition. */
export interface ProbeApiDefinition {
  packageDefinition: protoLoader.PackageDefinition;
  service: grpc.ServiceDefinition;
}

let cached: ProbeApiDefinition | undefined;

/** Loads (once) the ProbeService definition. */
export function loadProbeApi(): ProbeApiDefinition {
  if (!cached) {
    const packageDefinition = protoLoader.loadSync(PROTO_PATH, LOADER_OPTIONS);
    cached = { packageDefinition, service: packageDefinition[SERVICE_NAME] as grpc.ServiceDefinition };
  }
  return cached;
}

// ---- Wire shapes (what the loader produces and accepts); names mirror the .proto exactly. ----

export type WireProbeResult =
  | 'PROBE_RESULT_UNKNOWN'
  | 'PROBE_RESULT_SUCCESS'
  | 'PROBE_RESULT_WARNING'
  | 'PROBE_RESULT_FAILURE'
  | 'PROBE_RESULT_ERROR';
export type WireProbeType = 'PROBE_TYPE_UNSPECIFIED' | 'PROBE_TYPE_LIVENESS' | 'PROBE_TYPE_READINESS' | 'PROBE_TYPE_STARTUP';
export type WireEventType =
  | 'PROBE_EVENT_TYPE_UNSPECIFIED'
  | 'PROBE_EVENT_TYPE_ADDED'
  | 'PROBE_EVENT_TYPE_CHANGED'
  | 'PROBE_EVENT_TYPE_REMOVED';
/** int64 fields: strings when decoded (longs: String); numbers or strings when encoding. */
export type WireInt64 = string | number;

export interface WireVersionRequest {
  version?: string;
}
export interface WireFeatureGate {
  name: string;
  stage: string;
  enabled: boolean;
}
export interface WireVersionResponse {
  agent_name: string;
  agent_version: string;
  api_version: string;
  feature_gates: WireFeatureGate[];
  instance_id: string;
}
export interface WireIntOrString {
  int_val?: number;
  str_val?: string;
  /** Which member of the oneof is set (decoded messages only). */
  value?: 'int_val' | 'str_val';
}
export interface WireHttpHeader {
  name: string;
  value: string;
  /** "annotation": the value is read from the pod's original-handlers annotation. */
  value_from?: string;
}
export interface WireHttpGetAction {
  path?: string;
  port?: WireIntOrString | null;
  host?: string;
  scheme?: string;
  http_headers?: WireHttpHeader[];
}
export interface WireTcpSocketAction {
  port?: WireIntOrString | null;
  host?: string;
}
export interface WireGrpcAction {
  port?: number;
  service?: string;
}
export interface WireProbeHandler {
  http_get?: WireHttpGetAction | null;
  tcp_socket?: WireTcpSocketAction | null;
  grpc?: WireGrpcAction | null;
}
export interface WireProbeRequest {
  pod_uid?: string;
  pod_sandbox_id?: string;
  container_name?: string;
  handler?: WireProbeHandler | null;
  timeout_seconds?: number;
  pod_namespace?: string;
  pod_name?: string;
  container_id?: string;
  probe_type?: WireProbeType | number;
}
export type WireLifecycleHook = 'LIFECYCLE_HOOK_UNSPECIFIED' | 'LIFECYCLE_HOOK_POST_START' | 'LIFECYCLE_HOOK_PRE_STOP';
export interface WireLifecycleHandler {
  http_get?: WireHttpGetAction | null;
  tcp_socket?: WireTcpSocketAction | null;
}
export interface WireLifecycleRequest {
  pod_uid?: string;
  pod_sandbox_id?: string;
  container_name?: string;
  handler?: WireLifecycleHandler | null;
  hook?: WireLifecycleHook | number;
  timeout_seconds?: number;
  container_id?: string;
}
export interface WireLifecycleResponse {
  result: WireProbeResult;
  message: string;
  duration_seconds: number;
}
export interface WireProbePhases {
  queue_seconds?: number;
  helper_seconds?: number;
  connect_seconds?: number;
  tls_seconds?: number;
  first_byte_seconds?: number;
  total_seconds: number;
}
export interface WireProbeResponse {
  result: WireProbeResult;
  message: string;
  duration_seconds: number;
  phases: WireProbePhases | null;
  reason: string;
  address: string;
}
export interface WireStatusFilter {
  pod_uid?: string;
  namespace?: string;
  probe_type?: WireProbeType | number;
}
export interface WireListRequest {
  filter?: WireStatusFilter | null;
}
export interface WireProbeStatus {
  pod_uid: string;
  pod_namespace: string;
  pod_name: string;
  container_name: string;
  container_id: string;
  probe_type: WireProbeType;
  result: WireProbeResult;
  consecutive: number;
  last_probe_time: WireInt64;
  last_message: string;
  last_reason: string;
  started: boolean;
  ready: boolean;
  on_hold: boolean;
}
export interface WireListResponse {
  statuses: WireProbeStatus[];
  revision: WireInt64;
  instance_id: string;
}
export interface WireWatchRequest {
  filter?: WireStatusFilter | null;
  from_revision?: WireInt64;
  instance_id?: string;
}
export interface WireSnapshot {
  revision: WireInt64;
  instance_id: string;
  statuses: WireProbeStatus[];
  resynced: boolean;
  complete: boolean;
}
export interface WireEvent {
  revision: WireInt64;
  type: WireEventType;
  status: WireProbeStatus | null;
  previous_result: WireProbeResult;
  time: WireInt64;
}
export interface WireWatchResponse {
  snapshot?: WireSnapshot | null;
  event?: WireEvent | null;
  payload?: 'snapshot' | 'event';
}
