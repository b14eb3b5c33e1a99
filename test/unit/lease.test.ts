/**
 * gates/lease.ts: the renewal loop against a writer the test controls (the LeaseRenewer seam, the
 * way the daemon gives it the kube client). The controller's side is gates-lease-controller.test.ts.
 */
import { describe, expect, it } from 'vitest';
import { LEASE_PREFIX, nodeLeaseName, startLeaseRenewal, type LeaseRenewer } from '../../agent/gates/lease.ts';
import { createLogger } from '../../agent/log.ts';

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

describe('nodeLeaseName', () => {
  it('is the prefix plus the node name, cut to a valid object name length', () => {
    expect(nodeLeaseName('node-1')).toBe(`${LEASE_PREFIX}node-1`);
    expect(nodeLeaseName('n'.repeat(300))).toHaveLength(253);
  });
});

describe('startLeaseRenewal', () => {
  it('renews at once with the duration in whole seconds (at least 1), then every third of it', async () => {
    const calls: [string, string, number][] = [];
    const writer: LeaseRenewer = { renewLease: async (ns, name, s) => void calls.push([ns, name, s]) };
    const stop = startLeaseRenewal({ writer, namespace: 'probe-agent', node: 'n1', durationMs: 3000, log: createLogger({ level: 'error', write: () => {} }) });
    try {
      expect(calls).toEqual([['probe-agent', 'probe-agent-n1', 3]]);
      const until = Date.now() + 20_000;
      while (calls.length < 3 && Date.now() < until) await sleep(50);
      expect(calls.length).toBeGreaterThanOrEqual(3);
    } finally {
      stop();
    }
    const n = calls.length;
    await sleep(1500);
    expect(calls.length).toBe(n);

    const sub: number[] = [];
    startLeaseRenewal({ writer: { renewLease: async (_ns, _n, s) => void sub.push(s) }, namespace: 'x', node: 'n', durationMs: 200, log: createLogger({ level: 'error', write: () => {} }) })();
    expect(sub).toEqual([1]);
  });

  it('never runs two renewals at once: a slow API server does not pile them up', async () => {
    let inFlight = 0;
    let most = 0;
    let calls = 0;
    const writer: LeaseRenewer = {
      renewLease: async () => {
        calls++;
        most = Math.max(most, ++inFlight);
        await sleep(2500);
        inFlight--;
      },
    };
    const stop = startLeaseRenewal({ writer, namespace: 'ns', node: 'n', durationMs: 3000, log: createLogger({ level: 'error', write: () => {} }) });
    await sleep(4000);
    stop();
    expect(most).toBe(1);
    expect(calls).toBeLessThanOrEqual(2);
  });

  it('warns once per failure streak, says when it recovers, and reports each outcome', async () => {
    const lines: string[] = [];
    const outcomes: boolean[] = [];
    let fail = true;
    const writer: LeaseRenewer = { renewLease: async () => { if (fail) throw new Error('the API server is down'); } };
    const stop = startLeaseRenewal({ writer, namespace: 'ns', node: 'n', durationMs: 3000, log: createLogger({ level: 'info', format: 'json', write: (l) => lines.push(l) }), onRenew: (ok) => outcomes.push(ok) });
    try {
      const until = Date.now() + 20_000;
      while (outcomes.length < 3 && Date.now() < until) await sleep(50);
      fail = false;
      while (!outcomes.includes(true) && Date.now() < until) await sleep(50);
    } finally {
      stop();
    }
    expect(outcomes.slice(0, 3)).toEqual([false, false, false]);
    expect(outcomes.at(-1)).toBe(true);
    const warns = lines.filter((l) => l.includes('node lease not renewed'));
    expect(warns).toHaveLength(1);
    expect(warns[0]).toContain('the API server is down');
    expect(warns[0]).toContain('ns/probe-agent-n');
    expect(lines.filter((l) => l.includes('node lease renewed again'))).toHaveLength(1);
  });
});
