import { describe, expect, it } from 'vitest';
import { ManualClock } from '../../agent/scheduler/clock.ts';
import { DEFAULT_EVENT_MAX_AGE_MS, ResultsStore } from '../../agent/scheduler/results-store.ts';
import type { ProbeEvent, ProbeStatus } from '../../agent/scheduler/types.ts';

function status(over: Partial<ProbeStatus> & { uid?: string; container?: string } = {}): ProbeStatus {
  const { uid = 'u1', container = 'app', ...rest } = over;
  return {
    key: { podUID: uid, containerName: container, probeType: 'Readiness' },
    namespace: 'ns',
    podName: 'p',
    containerID: 'containerd://a',
    result: 'failure',
    consecutive: 1,
    lastProbeTime: 1,
    lastMessage: '',
    started: true,
    ready: false,
    onHold: false,
    ...rest,
  };
}

describe('ResultsStore', () => {
  it('emits added, then changed only for fields that matter, then removed, with increasing revisions', () => {
    const clock = new ManualClock();
    const store = new ResultsStore({ clock });
    const seen: ProbeEvent[] = [];
    store.subscribe((e) => seen.push(e));

    store.upsert(status());
    // Probe time, run length and message change every period: no event, but list() shows them.
    store.upsert(status({ lastProbeTime: 2, consecutive: 2, lastMessage: 'refused' }));
    expect(seen).toHaveLength(1);
    expect(store.list()[0]).toMatchObject({ lastProbeTime: 2, consecutive: 2, lastMessage: 'refused' });

    store.upsert(status({ result: 'success', ready: true, lastProbeTime: 3 }));
    store.upsert(status({ result: 'success', ready: true, onHold: true }));
    store.upsert(status({ result: 'success', ready: true, onHold: true, containerID: 'containerd://b' }));
    store.upsert(status({ result: 'success', ready: true, onHold: true, containerID: 'containerd://b', started: false }));
    store.remove(status().key);
    store.remove(status().key);

    expect(seen.map((e) => [e.revision, e.type, e.previous])).toEqual([
      [1, 'added', 'unknown'],
      [2, 'changed', 'failure'],
      [3, 'changed', 'success'],
      [4, 'changed', 'success'],
      [5, 'changed', 'success'],
      [6, 'removed', 'success'],
    ]);
    expect(seen.every((e) => e.time === clock.now())).toBe(true);
    expect(store.revision()).toBe(6);
    expect(store.list()).toEqual([]);
  });

  it('replays events after a revision and returns undefined once they left the ring', () => {
    const store = new ResultsStore({ ringSize: 4 });
    for (let i = 0; i < 6; i++) store.upsert(status({ uid: `u${i}` }));
    expect(store.revision()).toBe(6);
    // Revisions 3..6 are retained.
    expect(store.eventsSince(2)?.map((e) => e.revision)).toEqual([3, 4, 5, 6]);
    expect(store.eventsSince(5)?.map((e) => e.revision)).toEqual([6]);
    expect(store.eventsSince(6)).toEqual([]);
    expect(store.eventsSince(1)).toBeUndefined();
    expect(store.eventsSince(0)).toBeUndefined();
    // A revision from before an agent restart (ahead of us) cannot be resumed.
    expect(store.eventsSince(7)).toBeUndefined();
    expect(store.eventsSince(-1)).toBeUndefined();
    expect(store.eventsSince(2.5)).toBeUndefined();
  });

  it('drops events older than the age bound, so churn cannot keep its heap growing', async () => {
    const clock = new ManualClock();
    const store = new ResultsStore({ clock, maxEventAgeMs: DEFAULT_EVENT_MAX_AGE_MS });
    store.upsert(status({ uid: 'a' })); // revision 1
    await clock.advance(DEFAULT_EVENT_MAX_AGE_MS - 1000);
    store.upsert(status({ uid: 'b' })); // revision 2
    expect(store.eventsSince(0)?.map((e) => e.revision)).toEqual([1, 2]);
    await clock.advance(2000); // revision 1 is now past the bound, revision 2 is not
    expect(store.eventsSince(0)).toBeUndefined();
    expect(store.eventsSince(1)?.map((e) => e.revision)).toEqual([2]);
    await clock.advance(DEFAULT_EVENT_MAX_AGE_MS);
    store.upsert(status({ uid: 'c' })); // revision 3; revision 2 expires on this write
    expect(store.eventsSince(1)).toBeUndefined();
    expect(store.eventsSince(2)?.map((e) => e.revision)).toEqual([3]);
    // The latest statuses are never aged out: a resync lists them all.
    expect(store.list().map((s) => s.key.podUID)).toEqual(['a', 'b', 'c']);
  });

  it('delivers synchronously, in order, even when a listener writes during delivery', () => {
    const store = new ResultsStore();
    const a: number[] = [];
    const b: number[] = [];
    store.subscribe((e) => {
      a.push(e.revision);
      if (e.revision === 1) store.upsert(status({ uid: 'other' }));
    });
    store.subscribe((e) => b.push(e.revision));
    store.upsert(status());
    expect(a).toEqual([1, 2]);
    expect(b).toEqual([1, 2]);
  });

  it('keeps delivering when a listener throws, and stops after unsubscribe', () => {
    const errors: unknown[] = [];
    const store = new ResultsStore({ onListenerError: (err) => errors.push(err) });
    const got: number[] = [];
    store.subscribe(() => {
      throw new Error('bad listener');
    });
    const off = store.subscribe((e) => got.push(e.revision));
    store.upsert(status());
    off();
    store.upsert(status({ result: 'success' }));
    expect(got).toEqual([1]);
    expect(errors).toHaveLength(2);
  });

  it('hands out copies: callers cannot change what is stored', () => {
    const store = new ResultsStore();
    const s = status();
    store.upsert(s);
    s.result = 'success';
    s.key.podUID = 'mutated';
    const listed = store.list()[0] as ProbeStatus;
    expect(listed.result).toBe('failure');
    listed.key.containerName = 'x';
    expect(store.list({ podUID: 'u1' })[0]?.key.containerName).toBe('app');
    const ev = store.eventsSince(0)?.[0] as ProbeEvent;
    ev.status.result = 'error';
    expect(store.eventsSince(0)?.[0]?.status.result).toBe('failure');
  });

  it('filters list() by pod, namespace and probe type', () => {
    const store = new ResultsStore();
    store.upsert(status({ uid: 'a' }));
    store.upsert(status({ uid: 'b', namespace: 'other' }));
    store.upsert({ ...status({ uid: 'a' }), key: { podUID: 'a', containerName: 'app', probeType: 'Liveness' } });
    expect(store.list().map((s) => `${s.key.podUID}/${s.key.probeType}`)).toEqual(['a/Liveness', 'a/Readiness', 'b/Readiness']);
    expect(store.list({ podUID: 'a' })).toHaveLength(2);
    expect(store.list({ namespace: 'other' }).map((s) => s.key.podUID)).toEqual(['b']);
    expect(store.list({ probeType: 'Liveness' }).map((s) => s.key.podUID)).toEqual(['a']);
  });
});
