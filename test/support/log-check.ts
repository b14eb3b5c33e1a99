/**
 * No warn or error line from a healthy run: the agents and shims a test starts through the
 * harnesses (agent-harness.ts, shim-process.ts, shimLogSink() for a CriShim in the test's own
 * process) have their log lines collected, and once the test file is done (setup-log-check.ts)
 * every `warn`, `error` or non-JSON line fails it unless the test listed it as one it provokes
 * on purpose, with the reason. A `runtime unavailable` warning from the shim, for one, then
 * fails the healthy-path test it shows up in instead of passing unseen.
 */
import { appendFileSync } from 'node:fs';

/** One log line as the agent and the shim write it (JSON: level, msg, fields). */
export type LogRecord = Record<string, unknown>;

/** A warning or error a test provokes on purpose. */
export interface ExpectedLog {
  level: 'warn' | 'error';
  /** The line's msg, or a pattern its msg matches. */
  msg: string | RegExp;
  /** Optional: a pattern the whole line (as JSON) must match as well, to pin its fields. */
  line?: RegExp;
  /** Why the test provokes it (required, so an allow-list says what it is for). */
  why: string;
}

/** Lines no healthy run writes: these levels, and anything on stderr that is not a JSON log line. */
const CHECKED_LEVELS: ReadonlySet<unknown> = new Set(['warn', 'error', 'fatal', 'non-json']);

function matches(r: LogRecord, e: ExpectedLog): boolean {
  if (r['level'] !== e.level) return false;
  const msg = String(r['msg'] ?? '');
  if (typeof e.msg === 'string' ? msg !== e.msg : !e.msg.test(msg)) return false;
  return e.line === undefined || e.line.test(JSON.stringify(r));
}

/** The warn/error/non-JSON lines of `records` that no entry of `expected` allows. */
export function unexpectedLogs(records: readonly LogRecord[], expected: readonly ExpectedLog[]): LogRecord[] {
  return records.filter((r) => CHECKED_LEVELS.has(r['level']) && !expected.some((e) => matches(r, e)));
}

/** Throws, listing them, when `records` hold lines `expected` does not allow. */
export function assertNoUnexpectedLogs(who: string, records: readonly LogRecord[], expected: readonly ExpectedLog[]): void {
  const bad = unexpectedLogs(records, expected);
  if (bad.length === 0) return;
  const shown = bad.slice(0, 10).map((r) => `  ${JSON.stringify(r).slice(0, 600)}`);
  throw new Error(
    `${who} logged ${bad.length} warn/error line(s) this test does not expect (list the ones it provokes on purpose, with why):\n` +
      `${shown.join('\n')}${bad.length > 10 ? `\n  ... and ${bad.length - 10} more` : ''}`,
  );
}

/** Splits a stream of stderr text into log records: JSON lines parsed, anything else kept as `non-json`. */
export class LogLines {
  readonly records: LogRecord[] = [];
  #partial = '';

  push(chunk: string): LogRecord[] {
    this.#partial += chunk;
    const added: LogRecord[] = [];
    let nl: number;
    while ((nl = this.#partial.indexOf('\n')) >= 0) {
      const line = this.#partial.slice(0, nl);
      this.#partial = this.#partial.slice(nl + 1);
      if (line.trim() === '') continue;
      let rec: LogRecord;
      try {
        const parsed: unknown = JSON.parse(line);
        rec = parsed !== null && typeof parsed === 'object' && !Array.isArray(parsed) ? (parsed as LogRecord) : { level: 'non-json', msg: 'non-json', line };
      } catch {
        rec = { level: 'non-json', msg: 'non-json', line };
      }
      this.records.push(rec);
      added.push(rec);
    }
    return added;
  }
}

/** A process or in-process component whose log lines are checked when the test file ends. */
export interface CheckedLog {
  /** Names it in a failure, e.g. "agent pid 1234" or "shim cri.sock". */
  readonly who: string;
  readonly records: readonly LogRecord[];
  readonly expected: ExpectedLog[];
}

const tracked: CheckedLog[] = [];

/**
 * Checks `source` when the test file ends (setup-log-check.ts). Returns `expect`, to which a test
 * may add the warnings a later step provokes on purpose.
 */
export function trackLogs(who: string, records: readonly LogRecord[], expected: readonly ExpectedLog[] = []): { expect: (...more: ExpectedLog[]) => void } {
  const entry: CheckedLog = { who, records, expected: [...expected] };
  tracked.push(entry);
  return { expect: (...more) => void entry.expected.push(...more) };
}

/**
 * Every tracked source with lines it does not expect, as one error; forgets them all. With
 * LOG_CHECK_DUMP=<file> in the environment, every such line is also appended to that file (one
 * JSON object per line, with who logged it), for writing a test's allow-list.
 */
export function assertTrackedLogsClean(testFile = ''): void {
  const all = tracked.splice(0);
  const failures: string[] = [];
  const dump = process.env['LOG_CHECK_DUMP'];
  if (dump) {
    const lines = all.flatMap((t) => unexpectedLogs(t.records, t.expected).map((r) => `${JSON.stringify({ testFile, who: t.who, ...r })}\n`));
    if (lines.length > 0) appendFileSync(dump, lines.join(''));
  }
  for (const t of all) {
    try {
      assertNoUnexpectedLogs(t.who, t.records, t.expected);
    } catch (err) {
      failures.push((err as Error).message);
    }
  }
  if (failures.length > 0) throw new Error(failures.join('\n'));
}

/** The CriShim `log` option (agent/shim/proxy.ts ShimLog), collecting what the shim logs. */
export type ShimLogFn = (level: 'info' | 'warn' | 'error', msg: string, fields?: Record<string, unknown>) => void;

/**
 * A `log` for a CriShim run in the test's process: its lines are collected (`records`) and checked
 * when the test file ends, with `expected` and whatever `expect()` adds later.
 */
export function shimLogSink(who: string, expected: readonly ExpectedLog[] = []): { log: ShimLogFn; records: LogRecord[]; expect: (...more: ExpectedLog[]) => void } {
  const records: LogRecord[] = [];
  const log: ShimLogFn = (level, msg, fields) => void records.push({ level, msg, ...fields });
  return { log, records, ...trackLogs(who, records, expected) };
}
