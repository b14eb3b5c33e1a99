/**
 * The event loop's lag is the agent's own time (agent/probe/loop-lag.ts, the Deadline in
 * connect.ts). The real prober runs in-process against a real HTTP server on loopback, and the test
 * blocks the event loop itself with a busy loop at a chosen moment:
 *  - the target answered at once, but the loop stalled past the probe's timeout before reading it:
 *    the stall is given back, the answer is read, the probe succeeds;
 *  - the stall outlasts what the probe's budget can give back: an error (agent-overloaded), never a failure;
 *  - a target that never answers, the loop idle or stalled for a while: a failure (timeout), as kubelet says.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { lagTickerRunning, overloadedTimeout, overloadedTimeouts, STALL_FLOOR_MS, watchLoopLag } from '../../agent/probe/loop-lag.ts';
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
    if (req.url === '/hang-and-stall') {
      setTimeout(() => busy(500), 200);
      return;
    }
    res.end('ok');
    // Answered: the bytes are on their way to the prober, which cannot read them until the loop is free.
    if (req.url === '/answer-then-stall') busy(1800);
    if (req.url === '/answer-then-long-stall') busy(3500);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  port = (server.address() as AddressInfo).port;
});

afterAll(async () => {
  server.closeAllConnections();
  await new Promise<void>((r) => server.close(() => r()));
});

describe('a probe the agent could not run on time', () => {
  it('succeeds when the target answered in time and the loop stalled past the timeout before reading it', async () => {
    const before = overloadedTimeouts();
    const out = await runProbe(get(port, '/answer-then-stall'), ctx(1));
    expect(out).toMatchObject({ result: 'success', message: 'ok' });
    expect(overloadedTimeouts()).toBe(before);
  });

  it('is an error (agent-overloaded), not a failure, when the stall outlasts what its budget can give back', async () => {
    const before = overloadedTimeouts();
    const out = await runProbe(get(port, '/answer-then-long-stall'), ctx(1));
    expect(out).toMatchObject({ result: 'error', reason: 'agent-overloaded' });
    expect(out.message).toMatch(/^agent overloaded: its event loop stalled \d+ ms more than the probe's 1000 ms timeout could make up; not counted against the target: /);
    // 3.5 s stalled, 1 s given back.
    expect(Number(/stalled (\d+) ms/.exec(out.message)?.[1])).toBeGreaterThanOrEqual(2000);
    expect(overloadedTimeouts()).toBe(before + 1);
  });

  it('is a failure (timeout) when the target never answers and the loop is idle', async () => {
    const before = overloadedTimeouts();
    const out = await runProbe(get(port, '/hang'), ctx(1));
    expect(out).toMatchObject({ result: 'failure', reason: 'timeout' });
    expect(out.message).toContain('context deadline exceeded');
    expect(overloadedTimeouts()).toBe(before);
  });

  it('is a failure (timeout) when the target never answers, after the target was given back a stall', async () => {
    const out = await runProbe(get(port, '/hang-and-stall'), ctx(1));
    expect(out).toMatchObject({ result: 'failure', reason: 'timeout' });
    // The 500 ms stall was added to the target's 1 s.
    expect(out.durationSeconds).toBeGreaterThan(1.4);
  });
});

describe('the rule and the stall meter', () => {
  it('turns a timeout into an error only for a stall not given back of at least a tenth of the timeout and the floor', () => {
    expect(overloadedTimeout(STALL_FLOOR_MS - 1, 100)).toBeUndefined();
    expect(overloadedTimeout(STALL_FLOOR_MS, 100)).toMatch(/^agent overloaded: its event loop stalled 100 ms more than the probe's 100 ms timeout/);
    expect(overloadedTimeout(999, 10_000)).toBeUndefined();
    expect(overloadedTimeout(1000, 10_000)).toMatch(/stalled 1000 ms more than the probe's 10000 ms timeout/);
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

describe('the stall ticker', () => {
  it('runs only while a probe runs, and a stall in progress when the last one ends still counts', async () => {
    expect(lagTickerRunning()).toBe(false);
    const quick = watchLoopLag();
    expect(lagTickerRunning()).toBe(true);
    quick.stop();
    // A probe shorter than a tick leaves no timer behind: no wake-up of its own.
    expect(lagTickerRunning()).toBe(false);
    const a = watchLoopLag();
    const b = watchLoopLag();
    a.stop();
    expect(lagTickerRunning()).toBe(true);
    busy(150);
    b.stop();
    expect(lagTickerRunning()).toBe(false);
    // The tick never ran during the stall: the lateness was taken when the last watch ended.
    expect(b.stalledMs()).toBeGreaterThanOrEqual(100);
    await new Promise((r) => setTimeout(r, 50));
    expect(lagTickerRunning()).toBe(false);
  });
});
