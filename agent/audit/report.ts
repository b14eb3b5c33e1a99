/**
 * The audit report: one row per probe, a summary, the exit status, and the two renderings (an
 * aligned text table for people, JSON with stable field names for scripts). Cells hold text from
 * pods and apps (names, probe messages), so the table strips control characters: a pod must not
 * be able to drive the operator's terminal.
 */
import type { FailureReason, ProbeHandler, ProbeOutcome, ProbeResult, ProbeType } from '../probe/types.ts';
import { VERDICTS, type HostFieldKind, type Verdict } from './classify.ts';

/** What one path (from the node, or in the netns) produced; JSON field names are a contract. */
export interface PathResult {
  result: ProbeResult;
  reason: FailureReason | null;
  message: string;
  /** The address:port that answered or was tried last. */
  address: string | null;
  durationSeconds: number;
}

/** One row of the audit: a probe of one type on one container of one pod. */
export interface AuditedProbe {
  namespace: string;
  pod: string;
  podUID: string;
  /** "" for pod-level rows (a pod that could not be parsed). */
  container: string;
  probeType: ProbeType | null;
  handlerKind: ProbeHandler['kind'] | null;
  /** Human description, e.g. "httpGet :8080/healthz". */
  handler: string;
  /** The host field as written, or null. */
  host: string | null;
  hostField: HostFieldKind;
  /** The netns path probed in, when resolved. */
  netns: string | null;
  fromNode: PathResult | null;
  inNetns: PathResult | null;
  verdict: Verdict;
  blocking: boolean;
  note: string;
}

/** Counts over the whole audit. */
export interface AuditSummary {
  /** Pods the kubelet listed (parse failures included). */
  pods: number;
  podsWithoutProbes: number;
  /** Succeeded/Failed pods: kubelet no longer probes them, neither do we. */
  podsFinished: number;
  probes: number;
  verdicts: Record<Verdict, number>;
  /** Rows that make the audit exit 1. */
  blocking: number;
  safeToSwitch: boolean;
  exitCode: AuditExitCode;
}

/** 0: safe to switch; 1: something would break or is unsafe; 2: the audit could not run (fully). */
export type AuditExitCode = 0 | 1 | 2;
export const EXIT_SAFE = 0;
export const EXIT_UNSAFE = 1;
export const EXIT_CANNOT_AUDIT = 2;

/** The whole audit, as printed with --output json. */
export interface AuditReport {
  summary: AuditSummary;
  probes: AuditedProbe[];
}

/**
 * Exit status: any blocking row wins (1: a definite finding); otherwise any row that could not be
 * audited makes it 2, since "safe" cannot be claimed for a probe nobody ran; otherwise 0.
 */
export function exitCodeOf(probes: readonly AuditedProbe[]): AuditExitCode {
  if (probes.some((p) => p.blocking)) return EXIT_UNSAFE;
  if (probes.some((p) => p.verdict === 'error')) return EXIT_CANNOT_AUDIT;
  return EXIT_SAFE;
}

/** Builds the report: rows sorted by namespace, pod, container, probe type; summary counted from them. */
export function buildReport(rows: readonly AuditedProbe[], pods: { total: number; withoutProbes: number; finished: number }): AuditReport {
  const probes = [...rows].sort(compareRows);
  const verdicts = Object.fromEntries(VERDICTS.map((v) => [v, 0])) as Record<Verdict, number>;
  for (const p of probes) verdicts[p.verdict]++;
  const exitCode = exitCodeOf(probes);
  return {
    summary: {
      pods: pods.total,
      podsWithoutProbes: pods.withoutProbes,
      podsFinished: pods.finished,
      probes: probes.length,
      verdicts,
      blocking: probes.filter((p) => p.blocking).length,
      safeToSwitch: exitCode === EXIT_SAFE,
      exitCode,
    },
    probes,
  };
}

const TYPE_ORDER: Record<string, number> = { Startup: 0, Liveness: 1, Readiness: 2 };

function compareRows(a: AuditedProbe, b: AuditedProbe): number {
  return a.namespace.localeCompare(b.namespace) || a.pod.localeCompare(b.pod) || a.podUID.localeCompare(b.podUID) ||
    a.container.localeCompare(b.container) || (TYPE_ORDER[a.probeType ?? ''] ?? 9) - (TYPE_ORDER[b.probeType ?? ''] ?? 9);
}

/** A ProbeOutcome as a report cell, with stable null-for-absent fields. */
export function pathResult(o: ProbeOutcome): PathResult {
  return {
    result: o.result,
    reason: o.reason ?? null,
    message: o.message,
    address: o.address ?? null,
    durationSeconds: Math.round(o.durationSeconds * 1e6) / 1e6,
  };
}

/** Kubelet-style short form of a handler: "httpGet :8080/healthz", "tcpSocket 127.0.0.1:5432", "grpc :9090 (svc)". */
export function describeHandler(h: ProbeHandler): string {
  switch (h.kind) {
    case 'http': {
      const scheme = h.scheme === 'HTTPS' ? 'https://' : '';
      return `httpGet ${scheme}${hostPort(h.host, h.port)}${h.path}`;
    }
    case 'tcp':
      return `tcpSocket ${hostPort(h.host, h.port)}`;
    case 'grpc':
      return `grpc :${h.port}${h.service ? ` (${h.service})` : ''}`;
    case 'exec':
      return `exec ${h.command.join(' ')}`;
  }
}

function hostPort(host: string | undefined, port: number | string): string {
  const h = (host ?? '').trim();
  return `${h.includes(':') ? `[${h}]` : h}:${port}`;
}

/** Renders the report as JSON (one document, trailing newline). */
export function renderJson(report: AuditReport): string {
  return JSON.stringify(report, null, 2) + '\n';
}

const HEADERS = ['NAMESPACE/POD', 'CONTAINER', 'TYPE', 'HANDLER', 'FROM NODE', 'IN NETNS', 'VERDICT', 'NOTE'] as const;
const MAX_CELL = 60;
const MAX_NOTE = 400;

/** Renders the report as an aligned table plus a summary line. */
export function renderTable(report: AuditReport): string {
  const rows = report.probes.map((p) => [
    cell(`${p.namespace}/${p.pod}`, MAX_CELL),
    cell(p.container || '-', MAX_CELL),
    p.probeType ?? '-',
    cell(p.handler || '-', MAX_CELL),
    resultCell(p.fromNode),
    resultCell(p.inNetns),
    p.verdict,
    cell(p.note || '-', MAX_NOTE),
  ]);
  const all = [[...HEADERS], ...rows];
  const widths = HEADERS.map((_, i) => Math.max(...all.map((r) => (r[i] as string).length)));
  const lines = all.map((r) => r.map((c, i) => (i === r.length - 1 ? c : c.padEnd(widths[i] as number))).join('  ').trimEnd());
  return [...(rows.length ? lines : ['no probes to audit']), summaryLine(report.summary)].join('\n') + '\n';
}

/** "ok: 5 probes in 3 pods: 3 same, ... — safe to switch". */
export function summaryLine(s: AuditSummary): string {
  const counts = VERDICTS.map((v) => `${s.verdicts[v]} ${v}`).join(', ');
  const verdict = s.exitCode === EXIT_SAFE
    ? 'safe to switch'
    : s.exitCode === EXIT_UNSAFE
      ? `NOT safe to switch: ${s.blocking} probe${s.blocking === 1 ? '' : 's'} would break or ${s.blocking === 1 ? 'is' : 'are'} unsafe`
      : `audit incomplete: ${s.verdicts.error} probe${s.verdicts.error === 1 ? '' : 's'} could not be audited`;
  const skipped = [
    s.podsWithoutProbes ? `${s.podsWithoutProbes} without probes` : '',
    s.podsFinished ? `${s.podsFinished} finished` : '',
  ].filter(Boolean).join(', ');
  return `${s.probes} probe${s.probes === 1 ? '' : 's'} in ${s.pods} pod${s.pods === 1 ? '' : 's'}${skipped ? ` (${skipped})` : ''}: ${counts} — ${verdict}`;
}

function resultCell(r: PathResult | null): string {
  if (!r) return '-';
  return r.reason && r.result !== 'success' && r.result !== 'warning' ? `${r.result} (${r.reason})` : r.result;
}

/** One line, no control characters (C0, DEL, C1), line separators nor bidi overrides, bounded. */
export function cell(text: string, max: number): string {
  // eslint-disable-next-line no-control-regex
  const clean = text.replace(/[\u0000-\u001f\u007f-\u009f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]+/g, ' ').trim();
  return clean.length > max ? `${clean.slice(0, max - 1)}…` : clean;
}
