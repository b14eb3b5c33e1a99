/**
 * The log check the harnesses apply to every agent and shim a test runs (test/support/log-check.ts):
 * which lines it fails on, what an allow-list entry lets through, and how stderr becomes records.
 */
import { describe, expect, it } from 'vitest';
import { assertNoUnexpectedLogs, LogLines, unexpectedLogs, type ExpectedLog } from '../support/log-check.ts';

const warn = (msg: string, fields: Record<string, unknown> = {}) => ({ ts: 't', level: 'warn', msg, ...fields });

describe('unexpectedLogs', () => {
  it('passes info/debug lines and fails warn, error and non-JSON lines', () => {
    const lines = [{ level: 'info', msg: 'a' }, { level: 'debug', msg: 'b' }, warn('c'), { level: 'error', msg: 'd' }, { level: 'non-json', msg: 'non-json', line: 'Trace: x' }];
    expect(unexpectedLogs(lines, []).map((l) => l.msg)).toEqual(['c', 'd', 'non-json']);
  });

  it('lets through only what an entry names: its level, its msg (text or pattern) and its line pattern', () => {
    const allow: ExpectedLog[] = [
      { level: 'warn', msg: 'runtime unavailable', line: /"error":"connection refused"/, why: 'containerd stopped on purpose' },
      { level: 'warn', msg: /^probe errored/, why: 'x' },
    ];
    expect(unexpectedLogs([warn('runtime unavailable', { error: 'connection refused' })], allow)).toEqual([]);
    expect(unexpectedLogs([warn('runtime unavailable', { error: 'connection closed' })], allow)).toHaveLength(1);
    expect(unexpectedLogs([{ level: 'error', msg: 'runtime unavailable', error: 'connection refused' }], allow)).toHaveLength(1);
    expect(unexpectedLogs([warn('probe errored; result kept')], allow)).toEqual([]);
    expect(unexpectedLogs([warn('a probe errored')], allow)).toHaveLength(1);
  });

  it('throws naming who logged what', () => {
    expect(() => assertNoUnexpectedLogs('shim (x)', [warn('runtime unavailable', { error: 'connection refused' })], []))
      .toThrow(/shim \(x\) logged 1 warn\/error line\(s\)[^]*"msg":"runtime unavailable"/);
    expect(() => assertNoUnexpectedLogs('shim (x)', [{ level: 'info', msg: 'shim listening' }], [])).not.toThrow();
  });
});

describe('LogLines', () => {
  it('splits stderr into records across chunks, keeping a line that is not JSON as non-json', () => {
    const l = new LogLines();
    expect(l.push('{"level":"info","msg":"a"}\n{"level":"wa')).toHaveLength(1);
    l.push('rn","msg":"b"}\n\nnode:internal/process: Trace\n');
    expect(l.records).toEqual([{ level: 'info', msg: 'a' }, { level: 'warn', msg: 'b' }, { level: 'non-json', msg: 'non-json', line: 'node:internal/process: Trace' }]);
  });
});
