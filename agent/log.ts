/**
 * Structured logging to stderr, in the Kubernetes style: a constant message plus key/value
 * pairs, JSON for machines or text for terminals. Never log response bodies or header values.
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
    this.#sink.write(this.#sink.format === 'json' ? jsonLine(level, msg, all) : textLine(level, msg, all));
  }
}

function jsonLine(level: LogLevel, msg: string, fields: LogFields): string {
  return JSON.stringify({ ts: new Date().toISOString(), level, msg, ...normalise(fields) }) + '\n';
}

function textLine(level: LogLevel, msg: string, fields: LogFields): string {
  const kv = Object.entries(normalise(fields))
    .map(([k, v]) => `${k}=${typeof v === 'string' && !/[\s"=]/.test(v) ? v : JSON.stringify(v)}`)
    .join(' ');
  return `${new Date().toISOString()} ${level.toUpperCase().padEnd(5)} ${JSON.stringify(msg)}${kv ? ' ' + kv : ''}\n`;
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
