/**
 * The event loop's lag is the agent's own time (agent/probe/loop-lag.ts). The real prober runs
 * in-process against real HTTP servers on loopback, and the test blocks the event loop itself with
 * a busy loop at a chosen moment:
 *  - the target answered at once, but the loop stalled past the probe's timeout before reading it:
 *    the probe is an error (agent-overloaded), never a failure;
 *  - a target that never answers, the loop idle: a failure (timeout), as kubelet says;
 *  - a stall that ends well before the timeout does not change an answer that came in time.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { overloadedTimeout, overloadedTimeouts, STALL_FLOOR_MS, watchLoopLag } from '../../agent/probe/loop-lag.ts';
import { runProbe } from '../../agent/probe/run.ts';
import type { HttpGetHandler, ProbeContext } from '../../agent/probe/types.ts';

const sockets = new NodeSocketFactory();

function ctx(timeoutSeconds: number): ProbeContext {
  return {
    netns: undefined, podIPs: ['127.0.0.1'], timeoutSeconds, sockets, nodeSockets: sockets,
    kubeVersion: '1.34', hostFieldPolicy: 'refuse', happyEyeballs: false,
  };
}

const get = (port: number, path: string): HttpGetHandler => ({ kind: 'http', port, path, scheme: 'HTTP', headers: [] });

/** Blocks this process's event loop for `ms` (what a flood of frames or a long task does to the agent). */
function busy(ms: number): void {
  const end = performance.now() + ms;
  while (performance.now() < end) { /* the loop is stalled */ }
}

let server: http.Server;
let port = 0;

beforeAll(async () => {
  server = http.createServer((req, res) => {
    if (req.url === '/hang') return; // never answers
    res.end('ok');
    // Answered: the bytes are on their way to the prober, which cannot read them until the loop is free.
    if (req.url === '/answer-then-stall') busy(1800);
    if (req.url === '/answer-then-short-stall') busy(100);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  port = (server.address() as AddressInfo).port;
});

afterAll(async () => {
  server.closeAllConnections();
  await new Promise<void>((r) => server.close(() => r()));
});

describe('a probe the agent could not run on time', () => {
  it('is an error (agent-overloaded), not a failure, when the loop stalled past its timeout with the answer unread', async () => {
    const before = overloadedTimeouts();
    const out = await runProbe(get(port, '/answer-then-stall'), ctx(1));
    expect(out).toMatchObject({ result: 'error', reason: 'agent-overloaded' });
    expect(out.message).toMatch(/^agent overloaded: event loop delayed \d+ ms of the probe's 1000 ms timeout; not counted against the target: /);
    const delayed = Number(/delayed (\d+) ms/.exec(out.message)?.[1]);
    expect(delayed).toBeGreaterThanOrEqual(1000);
    expect(overloadedTimeouts()).toBe(before + 1);
  });

  it('is a failure (timeout) when the target never answers and the loop is idle', async () => {
    const before = overloadedTimeouts();
    const out = await runProbe(get(port, '/hang'), ctx(1));
    expect(out).toMatchObject({ result: 'failure', reason: 'timeout' });
    expect(out.message).toContain('context deadline exceeded');
    expect(overloadedTimeouts()).toBe(before);
  });

  it('keeps an answer that came in time through a short stall', async () => {
    const out = await runProbe(get(port, '/answer-then-short-stall'), ctx(5));
    expect(out).toMatchObject({ result: 'success' });
  });
});

describe('the rule and the stall meter', () => {
  it('turns a timeout into an error only for a stall of at least a quarter of the timeout and the floor', () => {
    expect(overloadedTimeout(STALL_FLOOR_MS - 1, 100)).toBeUndefined();
    expect(overloadedTimeout(STALL_FLOOR_MS, 100)).toMatch(/^agent overloaded: event loop delayed 200 ms of the probe's 100 ms timeout/);
    expect(overloadedTimeout(2499, 10_000)).toBeUndefined();
    expect(overloadedTimeout(2500, 10_000)).toMatch(/delayed 2500 ms of the probe's 10000 ms timeout/);
  });

  it('measures a stall in progress and one that ended, and nothing before the watch began', async () => {
    const earlier = watchLoopLag();
    busy(300);
    const w = watchLoopLag();
    expect(w.stalledMs()).toBeLessThan(50);
    busy(400);
    // Still in the same task: the stall is in progress (the ticker has not run).
    expect(w.stalledMs()).toBeGreaterThanOrEqual(300);
    await new Promise((r) => setTimeout(r, 50));
    expect(w.stalledMs()).toBeGreaterThanOrEqual(300);
    expect(earlier.stalledMs()).toBeGreaterThanOrEqual(600);
    w.stop();
    earlier.stop();
  });
});
