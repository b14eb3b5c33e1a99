/**
 * The audit's judgement (classify.ts) and its report (report.ts): every verdict rule, the exit-code
 * precedence, and both renderings. Outcomes here are plain ProbeOutcome data, as runProbe returns them.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { hostFieldKind, judge, passes, type HostFieldKind } from '../../agent/audit/classify.ts';
import {
  buildReport, cell, describeHandler, exitCodeOf, pathResult, renderJson, renderTable, summaryLine, type AuditedProbe,
} from '../../agent/audit/report.ts';
import type { FailureReason, ProbeHandler, ProbeOutcome, ProbeResult } from '../../agent/probe/types.ts';

function outcome(result: ProbeResult, reason?: FailureReason, message = '', address?: string): ProbeOutcome {
  const o: ProbeOutcome = { result, message, durationSeconds: 0.0123456789, phases: { total: 0.0123456789 } };
  if (reason) o.reason = reason;
  if (address) o.address = address;
  return o;
}
const ok = (address = '10.0.0.5:8080'): ProbeOutcome => outcome('success', undefined, 'ok', address);
const refused = (address = '10.0.0.5:8080'): ProbeOutcome => outcome('failure', 'refused', `dial tcp ${address}: connect: connection refused`, address);

function j(hostKind: HostFieldKind, fromNode: ProbeOutcome, inNetns: ProbeOutcome, host?: string): ReturnType<typeof judge> {
  return judge({ hostKind, ...(host !== undefined ? { host } : {}), primaryIP: '10.0.0.5', fromNode, inNetns });
}

const http = (host?: string): ProbeHandler => ({ kind: 'http', port: 8080, path: '/healthz', scheme: 'HTTP', headers: [], ...(host !== undefined ? { host } : {}) });

describe('hostFieldKind', () => {
  const pod = ['10.0.0.5', 'fd00::5'];
  it.each([
    [undefined, 'none'], ['', 'none'], ['  ', 'none'],
    ['10.0.0.5', 'pod-ip'], ['fd00:0:0:0::5', 'pod-ip'],
    ['localhost', 'loopback'], ['LOCALHOST', 'loopback'], ['127.0.0.1', 'loopback'], ['127.9.9.9', 'loopback'], ['::1', 'loopback'],
    ['::ffff:127.0.0.1', 'loopback'],
    ['10.0.0.6', 'other'], ['169.254.169.254', 'other'], ['metadata.google.internal', 'other'], ['localhost.', 'other'],
  ] as const)('host %j is %s', (host, kind) => {
    expect(hostFieldKind(http(host), pod)).toBe(kind);
    expect(hostFieldKind({ kind: 'tcp', port: 1, ...(host !== undefined ? { host } : {}) }, pod)).toBe(kind);
  });
  it('gRPC and exec have no host field', () => {
    expect(hostFieldKind({ kind: 'grpc', port: 9090 }, pod)).toBe('none');
    expect(hostFieldKind({ kind: 'exec', command: ['true'] }, pod)).toBe('none');
  });
});

describe('judge', () => {
  it('same when both pass; a warning (unfollowed redirect) counts as a pass', () => {
    expect(j('none', ok(), ok())).toEqual({ verdict: 'same', blocking: false, note: '' });
    expect(passes(outcome('warning', undefined, 'Probe terminated redirects'))).toBe(true);
    expect(j('none', outcome('warning'), ok()).verdict).toBe('same');
  });

  it('same when both fail, naming both reasons when they differ', () => {
    expect(j('none', refused(), refused())).toMatchObject({ verdict: 'same', blocking: false, note: 'fails both ways (refused)' });
    expect(j('none', outcome('failure', 'timeout'), refused()).note).toBe('fails both ways (from node: timeout, in netns: refused)');
  });

  it.each([
    ['refused', /accepts only the node's source address/],
    ['reset', /accepts only the node's source address/],
    ['timeout', /firewall in the pod drops traffic/],
    ['status', /decides by source address/],
    ['grpc-not-serving', /decides by source address/],
    ['tls', /speaks differently/],
    ['unreachable', /not reachable inside the resolved netns/],
    ['other', /passes from the node, fails in the netns/],
  ] as const)('node-only blocks, with the likely cause of a %s failure in the netns', (reason, cause) => {
    const r = j('none', ok(), outcome('failure', reason, `the ${reason} text`));
    expect(r.verdict).toBe('node-only');
    expect(r.blocking).toBe(true);
    expect(r.note).toMatch(cause);
    expect(r.note).toContain(`in netns: the ${reason} text`);
  });

  it('netns-only when the node is already shut out, not blocking', () => {
    const r = j('none', outcome('failure', 'timeout', 'i/o timeout'), ok());
    expect(r).toMatchObject({ verdict: 'netns-only', blocking: false });
    expect(r.note).toMatch(/node cannot reach the pod .*i\/o timeout/);
  });

  it('netns-only names the other family when only it answers (kubelet dials the primary IP only)', () => {
    const r = j('none', refused(), ok('[fd00::5]:8080'));
    expect(r.verdict).toBe('netns-only');
    expect(r.note).toMatch(/answers only on fd00::5: kubelet dials the primary pod IP 10\.0\.0\.5 only/);
  });

  it('netns-only for an app answering the node differently', () => {
    expect(j('none', outcome('failure', 'status', 'HTTP probe failed with statuscode: 403'), ok()).note).toMatch(/answers the node's address differently/);
  });

  it('loopback host: a loopback-bound app newly passing is netns-only; the node loopback answering is node-only', () => {
    const newly = j('loopback', refused('127.0.0.1:8080'), ok('127.0.0.1:8080'), '127.0.0.1');
    expect(newly).toMatchObject({ verdict: 'netns-only', blocking: false });
    expect(newly.note).toMatch(/loopback-bound app newly passes/);
    const lost = j('loopback', ok('127.0.0.1:22'), refused('127.0.0.1:22'), 'localhost');
    expect(lost).toMatchObject({ verdict: 'node-only', blocking: true });
    expect(lost.note).toMatch(/"localhost" is the node's loopback to kubelet/);
  });

  it('loopback host with the same result both ways is host-field, not blocking', () => {
    const r = j('loopback', refused('127.0.0.1:1'), refused('127.0.0.1:1'), '127.0.0.1');
    expect(r).toMatchObject({ verdict: 'host-field', blocking: false });
    expect(r.note).toMatch(/fails both ways today, yet it will probe something else/);
  });

  it('another host is host-field and blocks, whatever the outcomes', () => {
    const refusedByAgent = outcome('error', 'host-refused', 'host "10.0.0.9" is neither the pod\'s own IP nor loopback');
    const a = j('other', ok('10.0.0.9:80'), refusedByAgent, '10.0.0.9');
    expect(a).toMatchObject({ verdict: 'host-field', blocking: true });
    expect(a.note).toMatch(/SSRF risk; passes today\); refused in the netns by default .* would start failing/);
    const b = j('other', refused('10.0.0.9:80'), refusedByAgent, '10.0.0.9');
    expect(b.note).toMatch(/fails today.*keeps failing/);
    const legacy = j('other', ok('10.0.0.9:80'), ok('10.0.0.9:80'), '10.0.0.9');
    expect(legacy).toMatchObject({ verdict: 'host-field', blocking: true });
    expect(legacy.note).toMatch(/LegacyHostFieldProbes runs it from the node, so the SSRF stays/);
  });

  it('error when the netns path could not run, not blocking', () => {
    for (const reason of ['helper-error', 'netns-gone', 'netns-denied'] as const) {
      const r = j('none', ok(), outcome('error', reason, `${reason} detail`));
      expect(r).toEqual({ verdict: 'error', blocking: false, note: `could not run in the netns: ${reason} detail` });
    }
    expect(j('none', outcome('error', 'other', 'probe crashed: boom'), ok()).note).toBe('could not run from the node: probe crashed: boom');
  });

  it('the same spec problem on both paths is the same (kubelet cannot run it either)', () => {
    const unresolved = outcome('error', 'port-unresolved', 'port "web" not found');
    expect(j('none', unresolved, unresolved)).toMatchObject({ verdict: 'same', blocking: false });
    expect(j('none', unresolved, unresolved).note).toMatch(/cannot run either way \(port-unresolved/);
  });

  it('keeps notes one line and bounded even for long multi-line messages', () => {
    const r = j('none', ok(), outcome('failure', 'status', `line one\n${'x'.repeat(1000)}`));
    expect(r.note).not.toMatch(/\n/);
    expect(r.note.length).toBeLessThan(400);
  });
});

function row(over: Partial<AuditedProbe>): AuditedProbe {
  return {
    namespace: 'ns', pod: 'p', podUID: 'u', container: 'app', probeType: 'Liveness', handlerKind: 'http', handler: 'httpGet :8080/healthz',
    host: null, hostField: 'none', netns: '/run/netns/x', fromNode: pathResult(ok()), inNetns: pathResult(ok()), verdict: 'same', blocking: false, note: '',
    ...over,
  };
}

describe('exit status', () => {
  it('is 0 when every row is same, netns-only, kubelet or a non-blocking host-field', () => {
    expect(exitCodeOf([row({}), row({ verdict: 'netns-only' }), row({ verdict: 'kubelet' }), row({ verdict: 'host-field' })])).toBe(0);
    expect(exitCodeOf([])).toBe(0);
  });
  it('is 1 for any blocking row, even when others could not be audited', () => {
    expect(exitCodeOf([row({}), row({ verdict: 'node-only', blocking: true })])).toBe(1);
    expect(exitCodeOf([row({ verdict: 'error' }), row({ verdict: 'host-field', blocking: true })])).toBe(1);
  });
  it('is 2 when nothing blocks but some probe could not be audited', () => {
    expect(exitCodeOf([row({}), row({ verdict: 'error' })])).toBe(2);
  });
});

describe('buildReport', () => {
  it('sorts rows by namespace, pod, container, then Startup, Liveness, Readiness, and counts verdicts', () => {
    const report = buildReport([
      row({ pod: 'b', probeType: 'Readiness' }),
      row({ pod: 'b', probeType: 'Startup', verdict: 'node-only', blocking: true }),
      row({ namespace: 'a', pod: 'z', verdict: 'kubelet' }),
      row({ pod: 'b', probeType: 'Liveness', verdict: 'error' }),
    ], { total: 3, withoutProbes: 1, finished: 2 });
    expect(report.probes.map((p) => `${p.namespace}/${p.pod}/${p.probeType}`)).toEqual(['a/z/Liveness', 'ns/b/Startup', 'ns/b/Liveness', 'ns/b/Readiness']);
    expect(report.summary).toEqual({
      pods: 3, podsWithoutProbes: 1, podsFinished: 2, probes: 4,
      verdicts: { same: 1, 'node-only': 1, 'netns-only': 0, 'host-field': 0, kubelet: 1, error: 1 },
      blocking: 1, safeToSwitch: false, exitCode: 1,
    });
  });
});

describe('renderJson', () => {
  it('prints {summary, probes} with stable field names and null for absent values', () => {
    const report = buildReport([row({ inNetns: null, netns: null, verdict: 'error', note: 'netns not resolvable' })], { total: 1, withoutProbes: 0, finished: 0 });
    const doc = JSON.parse(renderJson(report)) as { summary: object; probes: Record<string, unknown>[] };
    expect(Object.keys(doc)).toEqual(['summary', 'probes']);
    expect(Object.keys(doc.probes[0] as object)).toEqual([
      'namespace', 'pod', 'podUID', 'container', 'probeType', 'handlerKind', 'handler', 'host', 'hostField', 'netns',
      'fromNode', 'inNetns', 'verdict', 'blocking', 'note',
    ]);
    expect(doc.probes[0]).toMatchObject({ host: null, netns: null, inNetns: null, fromNode: { result: 'success', reason: null, message: 'ok', address: '10.0.0.5:8080', durationSeconds: 0.012346 } });
    expect(Object.keys(doc.summary)).toEqual(['pods', 'podsWithoutProbes', 'podsFinished', 'probes', 'verdicts', 'blocking', 'safeToSwitch', 'exitCode']);
  });
});

describe('renderTable', () => {
  it('aligns every column under its header and ends with the summary line', () => {
    const report = buildReport([
      row({ pod: 'a-much-longer-pod-name', fromNode: pathResult(ok()), inNetns: pathResult(refused()), verdict: 'node-only', blocking: true, note: 'accepted from the node' }),
      row({ pod: 'b', container: 'sidecar', probeType: 'Readiness', handler: 'tcpSocket :15000', verdict: 'same' }),
      row({ pod: 'c', fromNode: null, inNetns: null, handler: 'exec cat /tmp/x', verdict: 'kubelet', note: 'exec probe: run by kubelet' }),
    ], { total: 3, withoutProbes: 0, finished: 0 });
    const lines = renderTable(report).trimEnd().split('\n');
    const header = lines[0] as string;
    const starts = ['CONTAINER', 'TYPE', 'HANDLER', 'FROM NODE', 'IN NETNS', 'VERDICT', 'NOTE'].map((h) => header.indexOf(h));
    for (const line of lines.slice(1, 4)) {
      for (const s of starts) expect(line[s - 1], `${line} @${s}`).toBe(' ');
      for (const s of starts) expect(line[s]).not.toBe(' ');
    }
    expect(lines[1]).toMatch(/^ns\/a-much-longer-pod-name\s+app\s+Liveness\s+httpGet :8080\/healthz\s+success\s+failure \(refused\)\s+node-only\s+accepted from the node$/);
    expect(lines[3]).toMatch(/exec cat \/tmp\/x\s+-\s+-\s+kubelet/);
    expect(lines[4]).toBe('3 probes in 3 pods: 1 same, 1 node-only, 0 netns-only, 0 host-field, 1 kubelet, 0 error — NOT safe to switch: 1 probe would break or is unsafe');
  });

  it('says when there is nothing to audit, and why pods were skipped', () => {
    const text = renderTable(buildReport([], { total: 2, withoutProbes: 1, finished: 1 }));
    expect(text).toBe('no probes to audit\n0 probes in 2 pods (1 without probes, 1 finished): 0 same, 0 node-only, 0 netns-only, 0 host-field, 0 kubelet, 0 error — safe to switch\n');
  });

  it('reports an incomplete audit in the summary line', () => {
    const s = buildReport([row({ verdict: 'error' }), row({ verdict: 'error' })], { total: 1, withoutProbes: 0, finished: 0 }).summary;
    expect(summaryLine(s)).toMatch(/— audit incomplete: 2 probes could not be audited$/);
  });

  it('never lets pod- or app-controlled text put control characters on the terminal', () => {
    // Mostly the dangerous characters (ESC, CSI, NEL, bidi overrides, CR/LF), plus arbitrary Unicode.
    const nasty = fc.oneof(
      fc.string({ unit: fc.constantFrom('\u001b', '\u009b', '\u0085', '\u202e', '\u2066', '\r', '\n', '\u0000', '\u007f', 'a', '[', ' ') }),
      fc.string({ unit: 'binary' }),
    );
    fc.assert(fc.property(nasty, nasty, (name, note) => {
      const text = renderTable(buildReport([row({ pod: name, note, handler: name })], { total: 1, withoutProbes: 0, finished: 0 }));
      // eslint-disable-next-line no-control-regex
      expect(text.replace(/\n/g, '')).not.toMatch(/[\u0000-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069]/);
      expect(text.split('\n')).toHaveLength(4);
    }));
    expect(cell('\u001b[31mred\u001b[0m\r\nnext', 100)).toBe('[31mred [0m next');
  });

  it('bounds long cells', () => {
    expect(cell('x'.repeat(100), 10)).toBe(`${'x'.repeat(9)}…`);
  });
});

describe('describeHandler', () => {
  it.each([
    [http(), 'httpGet :8080/healthz'],
    [{ ...http('fd00::1'), scheme: 'HTTPS', port: 'https' } as ProbeHandler, 'httpGet https://[fd00::1]:https/healthz'],
    [{ kind: 'tcp', port: 5432, host: '127.0.0.1' } as ProbeHandler, 'tcpSocket 127.0.0.1:5432'],
    [{ kind: 'grpc', port: 9090, service: 'liveness' } as ProbeHandler, 'grpc :9090 (liveness)'],
    [{ kind: 'exec', command: ['sh', '-c', 'test -f /tmp/ok'] } as ProbeHandler, 'exec sh -c test -f /tmp/ok'],
  ])('%j -> %s', (handler, text) => {
    expect(describeHandler(handler)).toBe(text);
  });
});
