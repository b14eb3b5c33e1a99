/**
 * A probe's response body never reaches the info log: the "probe result changed" lines (the
 * worker's and the results store subscriber's) leave out a success's or warning's message, which
 * is the target's body (an app's /healthz can print anything, tokens included); at debug they carry
 * at most MAX_LOGGED_BODY_BYTES of it; a failure's message (never the body) is still logged.
 * Real HTTP server on 127.0.0.1, the real prober, worker, manager and results store.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger, type LogLevel } from '../../agent/log.ts';
import { logProbeTransitions } from '../../agent/metrics/probe-metrics.ts';
import { MAX_LOGGED_BODY_BYTES } from '../../agent/probe/message.ts';
import { ResultsStore } from '../../agent/scheduler/results-store.ts';
import type { ProbeStatus } from '../../agent/scheduler/types.ts';
import { Harness, container, httpProbe, pod, running } from '../support/scheduler-harness.ts';

const SECRET = 'session-token=eyJhbGciOiJIUzI1NiJ9.c2VjcmV0';
const BODY = `${SECRET} ${'x'.repeat(900)}`;
let server: http.Server;
let port = 0;

beforeAll(async () => {
  server = http.createServer((_req, res) => res.end(BODY));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  port = (server.address() as AddressInfo).port;
});

afterAll(() => {
  server.closeAllConnections();
  server.close();
});

function capture(level: LogLevel): { lines: Record<string, unknown>[]; logger: ReturnType<typeof createLogger> } {
  const lines: Record<string, unknown>[] = [];
  return { lines, logger: createLogger({ level, write: (l) => lines.push(JSON.parse(l)) }) };
}

describe('probe result logging', () => {
  it('the worker logs a change to success at info without the response body', async () => {
    const { lines, logger } = capture('info');
    const h = new Harness({ logger });
    try {
      await h.sync([pod('u1', [container('app', { Readiness: httpProbe(port) }, running('c1', h.t0))])]);
      expect(h.status('u1', 'app', 'Readiness')).toMatchObject({ result: 'success' });
      const changed = lines.filter((l) => l.msg === 'probe result changed');
      expect(changed.length).toBeGreaterThanOrEqual(1);
      expect(JSON.stringify(lines)).not.toContain(SECRET);
      expect(changed[0]).not.toHaveProperty('message');
    } finally {
      await h.close();
    }
  });

  it('at debug the worker carries a bounded excerpt of the body', async () => {
    const { lines, logger } = capture('debug');
    const h = new Harness({ logger });
    try {
      await h.sync([pod('u2', [container('app', { Readiness: httpProbe(port) }, running('c1', h.t0))])]);
      const changed = lines.find((l) => l.msg === 'probe result changed');
      expect(changed?.message).toMatch(/^session-token=.*… \(truncated\)$/);
      expect(Buffer.byteLength(String(changed?.message).replace('… (truncated)', ''))).toBeLessThanOrEqual(MAX_LOGGED_BODY_BYTES);
    } finally {
      await h.close();
    }
  });

  it('the results store subscriber leaves a success body out at info, keeps a failure message', () => {
    const { lines, logger } = capture('info');
    const store = new ResultsStore();
    const unsubscribe = logProbeTransitions(store, logger);
    const base: ProbeStatus = {
      key: { podUID: 'u3', containerName: 'app', probeType: 'Readiness' },
      namespace: 'shop', podName: 'web-0', containerID: 'containerd://a', result: 'failure', consecutive: 1,
      lastProbeTime: 0, lastMessage: 'HTTP probe failed with statuscode: 503', lastReason: 'status',
      started: true, ready: false, onHold: false,
    };
    store.upsert(base);
    store.upsert({ ...base, result: 'success', ready: true, lastMessage: BODY, lastReason: undefined });
    store.upsert({ ...base, result: 'failure', ready: false, lastMessage: 'HTTP probe failed with statuscode: 500', lastReason: 'status' });
    unsubscribe();
    expect(lines).toHaveLength(2);
    expect(lines[0]).toMatchObject({ msg: 'probe result changed', result: 'success', previous: 'failure' });
    expect(lines[0]).not.toHaveProperty('message');
    expect(lines[1]).toMatchObject({ msg: 'probe result changed', result: 'failure', message: 'HTTP probe failed with statuscode: 500' });
    expect(JSON.stringify(lines)).not.toContain(SECRET);
  });
});
