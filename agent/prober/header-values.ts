/**
 * Header values a rewritten handler does not carry. Kubelet prints an exec handler's command in its
 * events and logs (FailedPostStartHook, "Probe failed"), so a rewrite may leave a header's value out
 * of the command and write `{"name": "Authorization", "valueFrom": "annotation"}` instead. The value
 * stays in the pod's `probe-agent.io/original-handlers` annotation, which kubelet copies onto the CRI
 * sandbox; the agent reads it from the runtime (never from the command) and puts it back here:
 * `handlers["<container>/<field>"].httpGet.httpHeaders[i].value`, at the same index, names matching.
 */
import { InvalidProbeError } from '../errors.ts';
import { checkHeaderValue } from '../probe/spec.ts';
import type { LifecycleHook } from '../probe/lifecycle.ts';
import type { HttpGetHandler, ProbeType } from '../probe/types.ts';
import { ORIGINAL_HANDLERS_ANNOTATION } from '../rewrite/pod-rewrite.ts';
import type { RecordedHeaders } from './sandbox-view.ts';

/** The record's key suffix for each probe type and hook, as the rewrite writes it. */
export type HandlerField = 'livenessProbe' | 'readinessProbe' | 'startupProbe' | 'lifecycle/postStart' | 'lifecycle/preStop';

const PROBE_FIELDS: Record<ProbeType, HandlerField> = { Liveness: 'livenessProbe', Readiness: 'readinessProbe', Startup: 'startupProbe' };
const HOOK_FIELDS: Record<LifecycleHook, HandlerField> = { postStart: 'lifecycle/postStart', preStop: 'lifecycle/preStop' };

/** The field a probe type or hook is recorded under. */
export function handlerFieldOf(kind: { probeType: ProbeType } | { hook: LifecycleHook }): HandlerField {
  return 'probeType' in kind ? PROBE_FIELDS[kind.probeType] : HOOK_FIELDS[kind.hook];
}

/** Whether any header of the handler wants its value from the annotation. */
export function needsHeaderValues(handler: { kind: string; headers?: readonly { valueFrom?: string }[] }): boolean {
  return handler.kind === 'http' && (handler.headers ?? []).some((h) => h.valueFrom !== undefined);
}

/** Where the values come from: the sandbox's recorded headers, or why there are none to read. */
export interface HeaderValueSource {
  /** From the sandbox's annotation (sandbox-view.ts); absent when the pod has no annotation. */
  recorded?: RecordedHeaders;
  /** Why the record could not be read (annotation too large or malformed, the runtime not asked). */
  unavailable?: string;
  containerName: string;
  field: HandlerField;
}

/**
 * The handler with every `valueFrom: annotation` header given its value from the record; the
 * handler itself when none asks. Throws InvalidProbeError (the call fails; kubelet discards a
 * probe's gRPC error and counts a hook's as failed) when the record, the handler, the header or
 * its name is missing or does not match.
 */
export function withHeaderValues(handler: HttpGetHandler, source: HeaderValueSource): HttpGetHandler {
  if (!needsHeaderValues(handler)) return handler;
  const key = `${source.containerName}/${source.field}`;
  const fail = (i: number, why: string): never => {
    throw new InvalidProbeError(`handler.http_get.http_headers[${i}]: value from annotation ${ORIGINAL_HANDLERS_ANNOTATION} ("${key}"): ${why}`, {
      field: `handler.http_get.http_headers[${i}].value_from`,
    });
  };
  const first = handler.headers.findIndex((h) => h.valueFrom !== undefined);
  if (source.unavailable !== undefined) fail(first, source.unavailable);
  if (source.recorded === undefined) fail(first, 'the pod has no such annotation');
  const recorded = (source.recorded as RecordedHeaders).get(key);
  if (recorded === undefined) fail(first, 'no httpGet handler with headers is recorded for it');
  const headers = handler.headers.map((h, i) => {
    if (h.valueFrom === undefined) return h;
    if (h.valueFrom !== 'annotation') fail(i, `unknown valueFrom ${JSON.stringify(h.valueFrom)}`);
    const entry = (recorded as readonly unknown[])[i];
    if (!isObject(entry)) return fail(i, `no recorded header at index ${i}`);
    if (entry['name'] !== h.name) return fail(i, `the recorded header at index ${i} is ${JSON.stringify(String(entry['name']).slice(0, 64))}, not "${h.name}"`);
    const value = entry['value'] ?? '';
    if (typeof value !== 'string') return fail(i, 'the recorded value is not a string');
    const bad = checkHeaderValue(value);
    if (bad) fail(i, `the recorded value ${bad}`);
    return { name: h.name, value };
  });
  return { ...handler, headers };
}

/**
 * Refuses a shim call's header sent with an empty value where the pod's record holds a non-empty
 * one under the same name at the same index: a command of a rewrite that moved the value to the
 * annotation (`valueFrom`), passed on by a shim too old to know the field, which dropped it.
 * Sending the header empty would reach the pod as a wrong credential (a liveness probe then
 * restarts the container); a gRPC error is discarded by kubelet for a probe and counted as a
 * failed hook. A record that cannot be read, or agrees, proves nothing: the header is sent as is
 * (an empty value is valid, e.g. `Accept` with no value).
 */
export function refuseDroppedHeaderValues(handler: HttpGetHandler, source: HeaderValueSource): void {
  const empty = handler.headers.flatMap((h, i) => (h.value === '' && h.valueFrom === undefined ? [i] : []));
  if (empty.length === 0 || source.unavailable !== undefined || source.recorded === undefined) return;
  const key = `${source.containerName}/${source.field}`;
  const recorded = source.recorded.get(key);
  if (recorded === undefined) return;
  for (const i of empty) {
    const entry = recorded[i];
    const name = handler.headers[i]!.name;
    if (!isObject(entry) || entry['name'] !== name || typeof entry['value'] !== 'string' || entry['value'] === '') continue;
    throw new InvalidProbeError(
      `handler.http_get.http_headers[${i}]: "${name}" has an empty value, but annotation ${ORIGINAL_HANDLERS_ANNOTATION} ("${key}") records one: ` +
        'the shim that sent this call dropped the rewrite\'s valueFrom (a shim older than the webhook that rewrote the pod); upgrade the shim on this node',
      { field: `handler.http_get.http_headers[${i}].value` },
    );
  }
}

function isObject(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}
