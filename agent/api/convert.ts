/**
 * Conversions between the ProbeService wire messages (agent/api/proto.ts) and the agent's own
 * types: results, statuses, events, filters, outcomes. Handlers and requests: convert-request.ts.
 */
import { InvalidProbeError } from '../errors.ts';
// Messages in responses are capped so one chatty probe cannot bloat every status and event.
import { boundMessage } from '../probe/message.ts';
import type { ProbeOutcome, ProbePhases, ProbeResult, ProbeType, FailureReason } from '../probe/types.ts';
import type { ProbeEvent, ProbeStatus, StatusFilter, ThresholdResult } from '../scheduler/types.ts';
import type {
  WireEvent,
  WireEventType,
  WireInt64,
  WireProbePhases,
  WireProbeResponse,
  WireProbeResult,
  WireProbeStatus,
  WireProbeType,
  WireStatusFilter,
} from './proto.ts';

/** Longest pod UID, sandbox ID, namespace, name or container name accepted in a request. */
export const MAX_ID_CHARS = 256;

const RESULT_TO_WIRE: Record<ProbeResult | ThresholdResult, WireProbeResult> = {
  success: 'PROBE_RESULT_SUCCESS',
  warning: 'PROBE_RESULT_WARNING',
  failure: 'PROBE_RESULT_FAILURE',
  error: 'PROBE_RESULT_ERROR',
  unknown: 'PROBE_RESULT_UNKNOWN',
};

const TYPE_TO_WIRE: Record<ProbeType, WireProbeType> = {
  Liveness: 'PROBE_TYPE_LIVENESS',
  Readiness: 'PROBE_TYPE_READINESS',
  Startup: 'PROBE_TYPE_STARTUP',
};
const WIRE_TO_TYPE: Record<string, ProbeType> = {
  PROBE_TYPE_LIVENESS: 'Liveness',
  PROBE_TYPE_READINESS: 'Readiness',
  PROBE_TYPE_STARTUP: 'Startup',
};

const EVENT_TO_WIRE: Record<ProbeEvent['type'], WireEventType> = {
  added: 'PROBE_EVENT_TYPE_ADDED',
  changed: 'PROBE_EVENT_TYPE_CHANGED',
  removed: 'PROBE_EVENT_TYPE_REMOVED',
};

/** Maps an internal result onto the wire enum. */
export function resultToWire(result: ProbeResult | ThresholdResult): WireProbeResult {
  return RESULT_TO_WIRE[result];
}

/** Maps a wire result onto the thresholded vocabulary (WARNING, which a status never holds, counts as success). */
export function thresholdResultFromWire(result: WireProbeResult | string): ThresholdResult {
  switch (result) {
    case 'PROBE_RESULT_SUCCESS':
    case 'PROBE_RESULT_WARNING':
      return 'success';
    case 'PROBE_RESULT_FAILURE':
      return 'failure';
    case 'PROBE_RESULT_ERROR':
      return 'error';
    default:
      return 'unknown';
  }
}

/** Maps a probe type onto the wire enum. */
export function probeTypeToWire(type: ProbeType): WireProbeType {
  return TYPE_TO_WIRE[type];
}

/** Maps a wire probe type back; undefined for UNSPECIFIED, InvalidProbeError for values this agent does not know. */
export function probeTypeFromWire(type: WireProbeType | number | string | undefined, field = 'probe_type'): ProbeType | undefined {
  if (type === undefined || type === 0 || type === 'PROBE_TYPE_UNSPECIFIED') return undefined;
  const known = typeof type === 'string' ? WIRE_TO_TYPE[type] : undefined;
  if (!known) throw new InvalidProbeError(`${field}: unknown probe type ${JSON.stringify(type)}`, { field });
  return known;
}

/** Epoch milliseconds to int64 nanoseconds (as a string: it does not fit a double). 0 stays 0. */
export function msToNanos(ms: number): string {
  if (!Number.isFinite(ms) || ms <= 0) return '0';
  return (BigInt(Math.round(ms * 1000)) * 1000n).toString();
}

/** int64 nanoseconds back to epoch milliseconds. */
export function nanosToMs(ns: WireInt64 | undefined): number {
  if (ns === undefined || ns === '' || ns === 0 || ns === '0') return 0;
  return Number(BigInt(ns) / 1000n) / 1000;
}

/** A wire int64 revision as a number; refuses values a double cannot hold exactly. */
export function revisionFromWire(rev: WireInt64 | undefined, field = 'revision'): number {
  const n = typeof rev === 'string' ? Number(rev) : (rev ?? 0);
  if (!Number.isSafeInteger(n) || n < 0) throw new InvalidProbeError(`${field}: must be a non-negative integer, got ${JSON.stringify(rev)}`, { field });
  return n;
}

/** A stored status as a wire ProbeStatus. */
export function statusToWire(s: ProbeStatus): WireProbeStatus {
  return {
    pod_uid: s.key.podUID,
    pod_namespace: s.namespace,
    pod_name: s.podName,
    container_name: s.key.containerName,
    container_id: s.containerID,
    probe_type: probeTypeToWire(s.key.probeType),
    result: resultToWire(s.result),
    consecutive: s.consecutive,
    last_probe_time: msToNanos(s.lastProbeTime),
    last_message: boundMessage(s.lastMessage),
    last_reason: s.lastReason ?? '',
    started: s.started,
    ready: s.ready,
    on_hold: s.onHold,
  };
}

/** A wire ProbeStatus as the agent's ProbeStatus (for clients). */
export function statusFromWire(w: WireProbeStatus): ProbeStatus {
  const status: ProbeStatus = {
    key: { podUID: w.pod_uid, containerName: w.container_name, probeType: probeTypeFromWire(w.probe_type) ?? 'Readiness' },
    namespace: w.pod_namespace,
    podName: w.pod_name,
    containerID: w.container_id,
    result: thresholdResultFromWire(w.result),
    consecutive: w.consecutive,
    lastProbeTime: nanosToMs(w.last_probe_time),
    lastMessage: w.last_message,
    started: w.started,
    ready: w.ready,
    onHold: w.on_hold,
  };
  if (w.last_reason) status.lastReason = w.last_reason as FailureReason;
  return status;
}

/** A store event as a wire ProbeEvent. */
export function eventToWire(e: ProbeEvent): WireEvent {
  return {
    revision: e.revision,
    type: EVENT_TO_WIRE[e.type],
    status: statusToWire(e.status),
    previous_result: resultToWire(e.previous ?? 'unknown'),
    time: msToNanos(e.time),
  };
}

/** A wire ProbeEvent as the agent's ProbeEvent (for clients). */
export function eventFromWire(w: WireEvent): ProbeEvent {
  const type = w.type === 'PROBE_EVENT_TYPE_ADDED' ? 'added' : w.type === 'PROBE_EVENT_TYPE_REMOVED' ? 'removed' : 'changed';
  if (!w.status) throw new InvalidProbeError('event without status');
  return {
    revision: revisionFromWire(w.revision),
    type,
    status: statusFromWire(w.status),
    previous: thresholdResultFromWire(w.previous_result),
    time: nanosToMs(w.time),
  };
}

/** A wire filter as a StatusFilter; InvalidProbeError (field path included) for bad values. */
export function filterFromWire(w: WireStatusFilter | null | undefined): StatusFilter {
  const filter: StatusFilter = {};
  if (!w) return filter;
  if (w.pod_uid) filter.podUID = boundedId(w.pod_uid, 'filter.pod_uid');
  if (w.namespace) filter.namespace = boundedId(w.namespace, 'filter.namespace');
  const type = probeTypeFromWire(w.probe_type, 'filter.probe_type');
  if (type) filter.probeType = type;
  return filter;
}

/** A StatusFilter as a wire filter (for clients). */
export function filterToWire(f: StatusFilter = {}): WireStatusFilter {
  return {
    pod_uid: f.podUID ?? '',
    namespace: f.namespace ?? '',
    probe_type: f.probeType ? probeTypeToWire(f.probeType) : 'PROBE_TYPE_UNSPECIFIED',
  };
}

/** True when `s` passes `f` (the same rule the store applies to list()). */
export function matchesFilter(s: ProbeStatus, f: StatusFilter): boolean {
  return (
    (!f.podUID || s.key.podUID === f.podUID) &&
    (!f.namespace || s.namespace === f.namespace) &&
    (!f.probeType || s.key.probeType === f.probeType)
  );
}

/** Returns `value` if it is short enough for an ID field; InvalidProbeError naming the field otherwise. */
export function boundedId(value: string, field: string): string {
  if (value.length > MAX_ID_CHARS) throw new InvalidProbeError(`${field}: must be at most ${MAX_ID_CHARS} characters`, { field });
  return value;
}

const WIRE_PHASES: [keyof Omit<ProbePhases, 'total'>, keyof WireProbePhases][] = [
  ['queue', 'queue_seconds'],
  ['helper', 'helper_seconds'],
  ['connect', 'connect_seconds'],
  ['tls', 'tls_seconds'],
  ['firstByte', 'first_byte_seconds'],
];

/** A probe outcome as a wire ProbeResponse. */
export function outcomeToWire(o: ProbeOutcome): WireProbeResponse {
  const phases: WireProbePhases = { total_seconds: o.phases.total };
  for (const [ours, wire] of WIRE_PHASES) {
    const v = o.phases[ours];
    if (v !== undefined) (phases as unknown as Record<string, number>)[wire] = v;
  }
  return {
    result: resultToWire(o.result),
    message: boundMessage(o.message),
    duration_seconds: o.durationSeconds,
    phases,
    reason: o.reason ?? '',
    address: o.address ?? '',
  };
}

/** A wire ProbeResponse as a ProbeOutcome (for clients); UNKNOWN, which the agent never sends, becomes 'error'. */
export function outcomeFromWire(w: WireProbeResponse): ProbeOutcome {
  const phases: ProbePhases = { total: w.phases?.total_seconds ?? w.duration_seconds };
  for (const [ours, wire] of WIRE_PHASES) {
    const v = w.phases?.[wire];
    if (typeof v === 'number') phases[ours] = v;
  }
  let result: ProbeResult;
  switch (w.result) {
    case 'PROBE_RESULT_SUCCESS':
      result = 'success';
      break;
    case 'PROBE_RESULT_WARNING':
      result = 'warning';
      break;
    case 'PROBE_RESULT_FAILURE':
      result = 'failure';
      break;
    default:
      result = 'error';
  }
  const outcome: ProbeOutcome = { result, message: w.message, durationSeconds: w.duration_seconds, phases };
  if (w.reason) outcome.reason = w.reason as FailureReason;
  if (w.address) outcome.address = w.address;
  return outcome;
}
