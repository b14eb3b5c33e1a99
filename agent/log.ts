/**
 * Structured logging to stderr, in the Kubernetes style: a constant message plus key/value
 * pairs, JSON for machines or text for terminals. Never log response bodies or header values.
 *
 * Level policy (klog verbosity in brackets; -v maps onto levels via levelForVerbosity):
 * - error: the agent cannot do its job (listener cannot bind, helper cannot start).
 * - warn:  degraded but working (kubelet unreachable: once per failure streak, not per poll).
 * - info  (-v 0..2): lifecycle, config, listeners, recoveries, and probe result TRANSITIONS
 *          (thresholded success<->failure, "probe result changed": logProbeTransitions in
 *          agent/metrics/probe-metrics.ts subscribes to the results store for this).
 * - debug (-v 3..4): EACH probe run ("probe run", logged by ProbeMetrics.probeRun), worker
 *          add/remove, per-poll details. Kubelet logs probe runs at V(3)/V(4) too.
 * - trace (-v 5+): wire-level detail (helper protocol, HTTP/2 frames).
 * Guard expensive field building with logger.enabled(level).
 */
export type LogLevel = 'error' | 'warn' | 'info' | 'debug' | 'trace';
export type LogFormat = 'json' | 'text';

const ORDER: Record<LogLevel, number> = { error: 0, warn: 1, info: 2, debug: 3, trace: 4 };

/** Key/value context; values are stringified with JSON. */
export type LogFields = Record<string, unknown>;

interface Sink {
  level: LogLevel;
  format: LogFormat;
  write: (line: string) => void;
}

/** A logger bound to a component and fixed fields; cheap to derive with child(). */
export class Logger {
  readonly #sink: Sink;
  readonly #fields: LogFields;

  constructor(sink: Sink, fields: LogFields = {}) {
    this.#sink = sink;
    this.#fields = fields;
  }

  /** A logger that adds `fields` to every line. */
  child(fields: LogFields): Logger {
    return new Logger(this.#sink, { ...this.#fields, ...fields });
  }

  /** True when lines at `level` are written; guard expensive field building with it. */
  enabled(level: LogLevel): boolean {
    return ORDER[level] <= ORDER[this.#sink.level];
  }

  error(msg: string, fields?: LogFields): void { this.#log('error', msg, fields); }
  warn(msg: string, fields?: LogFields): void { this.#log('warn', msg, fields); }
  info(msg: string, fields?: LogFields): void { this.#log('info', msg, fields); }
  debug(msg: string, fields?: LogFields): void { this.#log('debug', msg, fields); }
  trace(msg: string, fields?: LogFields): void { this.#log('trace', msg, fields); }

  #log(level: LogLevel, msg: string, fields?: LogFields): void {
    if (!this.enabled(level)) return;
    const all = fields ? { ...this.#fields, ...fields } : this.#fields;
    const line = this.#sink.format === 'json' ? jsonLine(level, msg, all) : textLine(level, msg, all);
    try {
      this.#sink.write(line);
    } catch {
      // Logging must never take the agent down (closed stderr, full pipe).
    }
  }
}

function jsonLine(level: LogLevel, msg: string, fields: LogFields): string {
  return safeStringify({ ts: new Date().toISOString(), level, msg, ...normalise(fields) }) + '\n';
}

/** JSON.stringify that cannot throw: BigInt becomes a string, cycles become "[Circular]". */
function safeStringify(value: unknown): string {
  const seen = new WeakSet<object>();
  try {
    return JSON.stringify(value, (_key, v: unknown) => {
      if (typeof v === 'bigint') return v.toString();
      if (typeof v === 'object' && v !== null) {
        if (seen.has(v)) return '[Circular]';
        seen.add(v);
      }
      return v;
    }) ?? 'null';
  } catch (err) {
    // A throwing toJSON/getter: keep the line, lose the value.
    return JSON.stringify({ unserialisable: err instanceof Error ? err.message : String(err) });
  }
}

function textLine(level: LogLevel, msg: string, fields: LogFields): string {
  const kv = Object.entries(normalise(fields))
    .map(([k, v]) => `${k}=${typeof v === 'string' && v !== '' && !/[\s"=]/.test(v) ? v : safeStringify(v)}`)
    .join(' ');
  return `${new Date().toISOString()} ${level.toUpperCase().padEnd(5)} ${safeStringify(msg)}${kv ? ' ' + kv : ''}\n`;
}

function normalise(fields: LogFields): LogFields {
  const out: LogFields = {};
  for (const [k, v] of Object.entries(fields)) {
    if (v === undefined) continue;
    out[k] = v instanceof Error ? { message: v.message, code: (v as { code?: unknown }).code } : v;
  }
  return out;
}

/** Maps klog-style verbosity (-v) onto a level: 0-2 info, 3-4 debug, 5+ trace. */
export function levelForVerbosity(v: number): LogLevel {
  if (v >= 5) return 'trace';
  if (v >= 3) return 'debug';
  return 'info';
}

/** Creates the root logger writing to stderr (or `write`, for tests). */
export function createLogger(opts: { level?: LogLevel; format?: LogFormat; write?: (line: string) => void } = {}): Logger {
  return new Logger({
    level: opts.level ?? 'info',
    format: opts.format ?? 'json',
    write: opts.write ?? ((line) => process.stderr.write(line)),
  });
}

/** A logger that writes nothing (library use, tests that do not read logs). */
export const silentLogger = createLogger({ level: 'error', write: () => {} });
