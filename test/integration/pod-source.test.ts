/**
 * PodSource polling the real fake kubelet over HTTPS: snapshots, diffs, and what happens while
 * the kubelet is down or answers garbage (last good set kept, stale, backoff, recovery).
 */
import { readFileSync } from 'node:fs';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ConfigError } from '../../agent/errors.ts';
import { createLogger } from '../../agent/log.ts';
import { KubeletClient, type KubeletErrorKind } from '../../agent/pods/kubelet-client.ts';
import { convertPodItem } from '../../agent/pods/pod-model.ts';
import { PodSource, type PodDiff, type PodSnapshot, type PodSourceOptions } from '../../agent/pods/source.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { makePod, makePods } from '../support/pod-factory.ts';

let kubelet: FakeKubelet;
let client: KubeletClient;
const sources: PodSource[] = [];

beforeAll(async () => {
  kubelet = await FakeKubelet.start();
  client = new KubeletClient({ url: kubelet.httpsUrl, caFile: kubelet.certs.caFile, timeoutMs: 1000 });
});
afterAll(async () => {
  await client.close();
  await kubelet.stop();
});
afterEach(async () => {
  await Promise.all(sources.splice(0).map((s) => s.stop()));
  await kubelet.setFault('none');
});

interface Harness {
  source: PodSource;
  logs: { level: string; msg: string; [k: string]: unknown }[];
  polls: { seconds: number; kind?: KubeletErrorKind }[];
  diffs: PodDiff[];
  snapshots: PodSnapshot[];
}

function startSource(opts: Partial<PodSourceOptions> = {}): Harness {
  const h: Harness = { logs: [], polls: [], diffs: [], snapshots: [], source: undefined as unknown as PodSource };
  const log = createLogger({ level: 'debug', format: 'json', write: (line) => h.logs.push(JSON.parse(line)) });
  h.source = new PodSource({
    client, pollIntervalMs: 50, log,
    onPoll: (seconds, kind) => h.polls.push(kind ? { seconds, kind } : { seconds }),
    ...opts,
  });
  h.source.on('diff', (d) => h.diffs.push(d));
  h.source.on('snapshot', (s) => h.snapshots.push(s));
  sources.push(h.source);
  h.source.start();
  return h;
}

/** Resolves with the next event of that type (bounded wait). */
function next<K extends 'diff' | 'snapshot'>(source: PodSource, event: K, timeoutMs = 3000): Promise<K extends 'diff' ? PodDiff : PodSnapshot> {
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`no ${event} within ${timeoutMs} ms`)), timeoutMs);
    source.once(event, ((arg: unknown) => {
      clearTimeout(t);
      resolve(arg as K extends 'diff' ? PodDiff : PodSnapshot);
    }) as never);
  });
}

const names = (pods: { name: string }[]): string[] => pods.map((p) => p.name).sort();

describe('snapshots and diffs', () => {
  it('polls at once on start and reports every pod as added', async () => {
    kubelet.setPods(makePods(3));
    const t0 = Date.now();
    const h = startSource({ pollIntervalMs: 10_000 });
    await h.source.synced();
    // At once, not after the 10 s interval (half of it is the bound: liveness, not speed).
    expect(Date.now() - t0).toBeLessThan(5000);
    expect(names(h.source.pods())).toEqual(['app-0', 'app-1', 'app-2']);
    expect(h.diffs).toHaveLength(1);
    expect(names(h.diffs[0]!.added)).toEqual(['app-0', 'app-1', 'app-2']);
    expect(h.diffs[0]!.updated).toEqual([]);
    expect(h.diffs[0]!.removed).toEqual([]);
    expect(h.snapshots[0]!.pods).toHaveLength(3);
    expect(h.source.stale).toBe(false);
    expect(h.source.lastSuccess).toBeGreaterThanOrEqual(t0);
    expect(h.polls[0]).toEqual({ seconds: expect.any(Number) });
  });

  it('emits snapshots every poll but a diff only when something we use changed', async () => {
    kubelet.setPods(makePods(2));
    const h = startSource();
    await h.source.synced();
    const before = h.snapshots.length;
    // Fields we do not use (resourceVersion, labels) change: no diff.
    const pods = makePods(2);
    (pods[0]!['metadata'] as Record<string, unknown>)['resourceVersion'] = '99999';
    (pods[0]!['metadata'] as Record<string, unknown>)['labels'] = { app: 'renamed' };
    kubelet.setPods(pods);
    await expect.poll(() => h.snapshots.length, { timeout: 3000 }).toBeGreaterThanOrEqual(before + 4);
    expect(h.diffs).toHaveLength(1);
  });

  it('hands out the same PodInfo objects while kubelet answers the same bytes, new ones after a change', async () => {
    kubelet.setPods(makePods(2));
    const h = startSource();
    await h.source.synced();
    const first = h.source.get(h.source.pods()[0]!.uid);
    await expect.poll(() => h.snapshots.length, { timeout: 3000 }).toBeGreaterThanOrEqual(3);
    // Unchanged answer: not parsed again, so consumers (the probe manager) can skip pods by identity.
    expect(h.source.get(first!.uid)).toBe(first);
    expect(h.snapshots.at(-1)!.pods).toContain(first);
    const pods = makePods(2);
    (pods[0]!['metadata'] as Record<string, unknown>)['resourceVersion'] = '424242';
    kubelet.setPods(pods);
    const seen = h.snapshots.length;
    await expect.poll(() => h.snapshots.length, { timeout: 3000 }).toBeGreaterThanOrEqual(seen + 2);
    expect(h.source.get(first!.uid)).not.toBe(first);
    expect(h.source.get(first!.uid)).toEqual(first);
  });

  it('reports added, updated and removed pods by UID', async () => {
    kubelet.setPods([makePod({ name: 'keep' }), makePod({ name: 'change' }), makePod({ name: 'gone' })]);
    const h = startSource();
    await h.source.synced();
    const diff = next(h.source, 'diff');
    kubelet.setPods([makePod({ name: 'keep' }), makePod({ name: 'change', ready: false }), makePod({ name: 'new' })]);
    const d = await diff;
    expect(names(d.added)).toEqual(['new']);
    expect(names(d.updated)).toEqual(['change']);
    expect(d.updated[0]!.podReady).toBe(false);
    expect(names(d.removed)).toEqual(['gone']);
    expect(names(h.source.pods())).toEqual(['change', 'keep', 'new']);
  });

  it('reports a container restart (new container ID) as an update', async () => {
    kubelet.setPods([makePod({ name: 'web', restartCount: 0 })]);
    const h = startSource();
    await h.source.synced();
    const oldID = h.source.pods()[0]!.containers[0]!.state!.containerID;
    const diff = next(h.source, 'diff');
    kubelet.setPods([makePod({ name: 'web', restartCount: 1 })]);
    const d = await diff;
    expect(d.updated).toHaveLength(1);
    const state = d.updated[0]!.containers[0]!.state!;
    expect(state.restartCount).toBe(1);
    expect(state.containerID).not.toBe(oldID);
  });

  it('keeps a pod whose status lags and reports it updated when IPs and container status arrive', async () => {
    kubelet.setPods([makePod({ name: 'fresh', ips: [] })]);
    const h = startSource();
    await h.source.synced();
    const lagging = h.source.pods()[0]!;
    expect(lagging.podIPs).toEqual([]);
    expect(lagging.containers[0]!.state).toBeUndefined();
    const diff = next(h.source, 'diff');
    kubelet.setPods([makePod({ name: 'fresh', ips: ['10.244.1.50', 'fd00:10:244:1::32'] })]);
    const d = await diff;
    expect(d.updated[0]!.podIPs).toEqual(['10.244.1.50', 'fd00:10:244:1::32']);
    expect(d.updated[0]!.containers[0]!.state?.running).toBe(true);
  });

  it('exposes unparseable pods and logs each once, not once per poll', async () => {
    kubelet.setPods(JSON.parse(readFileSync(new URL('../fixtures/podlist-malformed.json', import.meta.url), 'utf8')));
    const h = startSource();
    await h.source.synced();
    await expect.poll(() => h.snapshots.length, { timeout: 3000 }).toBeGreaterThanOrEqual(4);
    expect(h.source.podErrors()).toHaveLength(5);
    expect(names(h.source.pods())).toEqual(['bad-probe-0', 'good-0']);
    expect(h.logs.filter((l) => l.msg.startsWith('pod from kubelet cannot be parsed'))).toHaveLength(5);
  });

  it('drops an oversized pod and a pod that is not JSON alone: every other pod is known, each dropped one counted by reason and logged once', async () => {
    // The client as the daemon builds it: pods mapped as they are read, default caps (1 MiB a pod).
    const streaming = new KubeletClient({ url: kubelet.httpsUrl, caFile: kubelet.certs.caFile, timeoutMs: 5000, convertItem: (raw) => convertPodItem(raw) });
    try {
      const good = makePods(20);
      const huge = makePod({ name: 'huge', uid: '00000000-0000-4000-8000-00000000beef' });
      // 9 MiB: more than a pod may be, and more than the whole answer could be before (the DaemonSet's 8 MiB).
      (huge['metadata'] as Record<string, unknown>)['annotations'] = { pad: 'x'.repeat(9 * 1024 * 1024) };
      const items = [...good.slice(0, 10).map((p) => JSON.stringify(p)), JSON.stringify(huge), '{"metadata":{"name":"broken","namespace":"ns1","uid":"u-broken"},"spec":{"containers":[{"name":,}]}}', ...good.slice(10).map((p) => JSON.stringify(p))];
      kubelet.setBody(`{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[${items.join(',')}]}`);
      const h = startSource({ client: streaming });
      await h.source.synced();
      await expect.poll(() => h.snapshots.length, { timeout: 5000 }).toBeGreaterThanOrEqual(3);
      expect(h.source.stale).toBe(false);
      expect(names(h.source.pods())).toEqual(names(good.map((p) => ({ name: (p['metadata'] as { name: string }).name }))));
      const errors = h.source.podErrors();
      expect(errors.map((e) => [e.name, e.reason])).toEqual([['huge', 'too-large'], ['broken', 'malformed']]);
      expect(errors[0]!.error).toMatch(/^items\[10\]: pod is \d+ bytes, more than the 1048576-byte cap per pod/);
      expect(errors[0]!.uid).toBe('00000000-0000-4000-8000-00000000beef');
      const logged = h.logs.filter((l) => l.msg.startsWith('pod from kubelet cannot be parsed'));
      expect(logged.map((l) => [l['pod'], l['reason']])).toEqual([['huge', 'too-large'], ['broken', 'malformed']]);
    } finally {
      await streaming.close();
    }
  });

  it('keeps polling when a listener throws', async () => {
    kubelet.setPods(makePods(1));
    const h = startSource();
    h.source.on('snapshot', () => {
      throw new Error('listener bug');
    });
    await expect.poll(() => h.snapshots.length, { timeout: 3000 }).toBeGreaterThanOrEqual(3);
    expect(h.logs.some((l) => l.level === 'error' && l.msg === 'pod source listener threw')).toBe(true);
  });

  it('refresh() polls at once instead of waiting for the interval', async () => {
    kubelet.setPods(makePods(1));
    const h = startSource({ pollIntervalMs: 30_000, minRefreshMs: 20 });
    await h.source.synced();
    const diff = next(h.source, 'diff', 2000);
    kubelet.setPods(makePods(2));
    h.source.refresh();
    expect(names((await diff).added)).toEqual(['app-1']);
  });

  it('refuses nonsensical intervals with ConfigError', () => {
    for (const bad of [{ pollIntervalMs: 0 }, { pollIntervalMs: Number.NaN }, { pollIntervalMs: 100, maxBackoffMs: -1 }]) {
      expect(() => new PodSource({ client, ...bad })).toThrow(ConfigError);
    }
    expect(new PodSource({ client, pollIntervalMs: 5000 }).maxBackoffMs).toBe(30_000);
    expect(new PodSource({ client, pollIntervalMs: 50 }).maxBackoffMs).toBe(300);
    expect(new PodSource({ client, pollIntervalMs: 60_000 }).maxBackoffMs).toBe(60_000);
  });

  it('stop() aborts a poll in flight promptly', async () => {
    await kubelet.setFault('slow', { delayMs: 5000 });
    const h = startSource();
    await expect.poll(() => kubelet.requestCount > 0, { timeout: 2000 }).toBe(true);
    const t0 = performance.now();
    await h.source.stop();
    // Aborted, not waited for: the kubelet answers only after 5 s.
    expect(performance.now() - t0).toBeLessThan(2500);
    expect(h.polls).toEqual([]);
  });
});

describe('kubelet failures', () => {
  it('keeps the last good set while the kubelet is down, warns once, and recovers', async () => {
    kubelet.setPods(makePods(3));
    const h = startSource({ pollIntervalMs: 50, maxBackoffMs: 200 });
    await h.source.synced();
    await kubelet.setFault('down');
    const downAt = Date.now();
    await expect.poll(() => h.source.consecutiveFailures, { timeout: 3000 }).toBeGreaterThanOrEqual(4);
    expect(h.source.stale).toBe(true);
    expect(h.source.staleSince).toBeGreaterThanOrEqual(downAt);
    expect(h.source.lastError?.kind).toBe('unreachable');
    expect(names(h.source.pods())).toEqual(['app-0', 'app-1', 'app-2']);
    expect(h.diffs.flatMap((d) => d.removed)).toEqual([]);
    expect(h.polls.filter((p) => p.kind === 'unreachable').length).toBeGreaterThanOrEqual(4);
    expect(h.logs.filter((l) => l.level === 'warn' && l.msg.startsWith('kubelet pod list unavailable'))).toHaveLength(1);

    kubelet.setPods(makePods(2));
    const upAt = Date.now();
    await kubelet.setFault('none');
    const d = await next(h.source, 'diff', 10_000);
    // The backoff is capped at 200 ms: recovery comes at one of the next polls (a liveness bound, not a latency target).
    expect(Date.now() - upAt).toBeLessThan(5000);
    expect(names(d.removed)).toEqual(['app-2']);
    expect(h.source.stale).toBe(false);
    expect(h.source.staleSince).toBeUndefined();
    expect(h.source.consecutiveFailures).toBe(0);
    expect(h.logs.filter((l) => l.level === 'info' && l.msg === 'kubelet pod list recovered')).toHaveLength(1);
  });

  it('backs off exponentially up to the cap while polls fail', async () => {
    kubelet.setPods(makePods(1));
    const h = startSource({ pollIntervalMs: 40, maxBackoffMs: 160 });
    await h.source.synced();
    const from = kubelet.requestCount;
    await kubelet.setFault('status-500');
    // Nine failed polls take 40 + 80 + 7 x 160 ms capped; uncapped the ninth would come 10 s in.
    await expect.poll(() => kubelet.requestCount - from, { timeout: 30_000 }).toBeGreaterThanOrEqual(9);
    const times = kubelet.requests.slice(-(kubelet.requestCount - from)).map((r) => r.time);
    const gaps = times.slice(1).map((t, i) => t - times[i]!);
    // Gap i follows failure i+1: 40, 80, 160, 160... (timers never fire early; allow clock rounding).
    gaps.forEach((gap, i) => expect(gap, `gap ${i}`).toBeGreaterThanOrEqual(Math.min(160, 40 * 2 ** i) - 5));
    // The cap: uncapped, every gap from the sixth on would be at least 1280 ms. Capped at 160 ms, a
    // late timer may stretch one gap, not all three of gaps 6-8 to half of that.
    expect(Math.min(...gaps.slice(5, 8)), `gaps ${gaps.join(', ')}`).toBeLessThan(640);
    expect(h.polls.filter((p) => p.kind === 'http-status').length).toBeGreaterThanOrEqual(8);
    expect(h.source.pods()).toHaveLength(1);
  }, 60_000);

  const garbage: [string, Parameters<FakeKubelet['setFault']>, KubeletErrorKind][] = [
    ['HTTP 500', ['status-500'], 'http-status'],
    ['truncated JSON', ['truncated'], 'malformed'],
    ['non-JSON', ['malformed'], 'malformed'],
    ['a slow kubelet', ['slow', { delayMs: 3000 }], 'timeout'],
    ['an oversized answer', ['huge', { hugeBytes: 8 * 1024 * 1024 }], 'too-large'],
  ];
  it.each(garbage)('keeps the last good set through %s', async (_what, fault, kind) => {
    const small = new KubeletClient({ url: kubelet.httpsUrl, caFile: kubelet.certs.caFile, timeoutMs: 200, maxResponseBytes: 1024 * 1024 });
    try {
      kubelet.setPods(makePods(2));
      const h = startSource({ client: small, maxBackoffMs: 100 });
      await h.source.synced();
      await kubelet.setFault(...fault);
      await expect.poll(() => h.source.consecutiveFailures, { timeout: 3000 }).toBeGreaterThanOrEqual(2);
      expect(h.source.lastError?.kind).toBe(kind);
      expect(h.polls.at(-1)?.kind).toBe(kind);
      expect(h.source.pods()).toHaveLength(2);
      expect(h.diffs).toHaveLength(1);
      await kubelet.setFault('none');
      await expect.poll(() => h.source.stale, { timeout: 2000 }).toBe(false);
      await h.source.stop();
    } finally {
      await small.close();
    }
  });

  it('treats an answer that is not a PodList as a failed poll', async () => {
    kubelet.setPods(makePods(2));
    const h = startSource();
    await h.source.synced();
    kubelet.setPods({ kind: 'Status', apiVersion: 'v1', status: 'Failure' });
    await expect.poll(() => h.source.lastError?.kind, { timeout: 3000 }).toBe('malformed');
    expect(h.source.pods()).toHaveLength(2);
  });

  it('reports 401 as unauthorized with the RBAC hint and keeps polling', async () => {
    kubelet.setPods(makePods(1));
    kubelet.setToken('needed');
    try {
      const h = startSource({ maxBackoffMs: 100 });
      await expect.poll(() => h.source.consecutiveFailures, { timeout: 3000 }).toBeGreaterThanOrEqual(2);
      expect(h.source.lastError?.kind).toBe('unauthorized');
      expect(h.source.stale).toBe(true);
      expect(h.source.lastSuccess).toBeUndefined();
      const warn = h.logs.find((l) => l.level === 'warn');
      expect(String(warn?.['error'])).toMatch(/nodes\/pods/);
    } finally {
      kubelet.setToken(undefined);
    }
  });
});

describe('scale', () => {
  it('polls 2000 pods over HTTPS and diffs a single change', async () => {
    const pods = makePods(2000, { sidecar: true });
    kubelet.setPods(pods);
    const h = startSource({ pollIntervalMs: 200 });
    await h.source.synced();
    expect(h.source.pods()).toHaveLength(2000);
    expect(h.polls[0]!.seconds).toBeLessThan(5);
    const changed = structuredClone(pods);
    changed[1234] = makePod({ name: 'app-1234', ips: ['10.244.4.236'], restartCount: 3, sidecar: true });
    const diff = next(h.source, 'diff');
    kubelet.setPods(changed);
    const d = await diff;
    expect(d.added).toEqual([]);
    expect(d.removed).toEqual([]);
    expect(names(d.updated)).toEqual(['app-1234']);
  });
});
