/**
 * The runtime watch's state machine (agent/gates/runtime-watch.ts) with a scripted runtime: the CRI
 * event stream and list as containerd answers them (1.6: UNIMPLEMENTED; 1.7: events). The real
 * runtimes are in test/integration/gates-runtime-events.test.ts; here the orders that a real one
 * produces only by chance: events during the catch-up list, a stream that ends, a full buffer.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { applyEvent, startRuntimeWatch, type RuntimeContainer, type RuntimeWatchSource } from '../../agent/gates/runtime-watch.ts';
import { NetnsUnavailableError } from '../../agent/errors.ts';
import { createLogger } from '../../agent/log.ts';
import type { CriContainer, CriContainerEvent, CriContainerStatus } from '../../agent/netns/cri-client.ts';
import { until as untilFor } from '../support/api-harness.ts';

const until = (what: string, pred: () => boolean): Promise<void> => untilFor(pred, 10_000, what);

const UID = 'pod-1';
const labels = (name: string) => ({ 'io.kubernetes.pod.uid': UID, 'io.kubernetes.container.name': name });
const status = (id: string, state: CriContainerStatus['state'], created = 1): CriContainerStatus => ({
  id, metadata: { name: 'app', attempt: 0 }, state, createdAt: String(created), startedAt: '7000000', finishedAt: '0', exitCode: 0, labels: labels('app'), annotations: {},
});
const event = (type: string, id: string, statuses: CriContainerStatus[]): CriContainerEvent => ({
  containerId: id, containerEventType: `CONTAINER_${type}_EVENT` as CriContainerEvent['containerEventType'], createdAt: '1', podSandboxStatus: null, containersStatuses: statuses,
});
const listed = (id: string, state: CriContainer['state'], created = 1): CriContainer => ({
  id, podSandboxId: 's', metadata: { name: 'app', attempt: 0 }, state, createdAt: String(created), labels: labels('app'), annotations: {},
});
const unimplemented = () => new NetnsUnavailableError('CRI endpoint unix:///x does not implement runtime.v1.RuntimeService/GetContainerEvents (unknown method)', { grpcCode: 12 });

/** A scripted runtime: the list it answers, and the streams opened on it. */
function runtime() {
  const streams: Array<{ emit: (e: CriContainerEvent) => void; end: (err: Error) => void; cancelled: boolean }> = [];
  let items: CriContainer[] = [];
  let listCalls = 0;
  let hold: Promise<void> | undefined;
  let down = false;
  return {
    /** Lists fail (the runtime is down). */
    set down(v: boolean) { down = v; },
    streams,
    get listCalls() { return listCalls; },
    set items(v: CriContainer[]) { items = v; },
    /** The next lists wait for this. */
    holdLists(p: Promise<void> | undefined) { hold = p; },
    list: async () => {
      listCalls++;
      if (down) throw new NetnsUnavailableError('CRI endpoint unix:///x unavailable: No connection established', { grpcCode: 14 });
      const snapshot = items;
      if (hold) await hold;
      return snapshot;
    },
    events: (onEvent: (e: CriContainerEvent) => void, onEnd: (err: Error) => void) => {
      const s = { emit: onEvent, end: onEnd, cancelled: false };
      streams.push(s);
      return { cancel: () => { s.cancelled = true; } };
    },
  };
}

let stops: Array<() => void> = [];
afterEach(() => {
  for (const s of stops) s();
  stops = [];
});

function watch(rt: ReturnType<typeof runtime>, extra: Partial<Parameters<typeof startRuntimeWatch>[0]> = {}) {
  const seen: RuntimeContainer[][] = [];
  const sources: RuntimeWatchSource[] = [];
  const lines: string[] = [];
  stops.push(startRuntimeWatch({
    list: rt.list, events: rt.events, intervalMs: 20, log: createLogger({ level: 'info', write: (l) => lines.push(l) }),
    onContainers: (cs) => seen.push(cs), onSource: (s) => sources.push(s),
    maxBackoffMs: 40, ...extra,
  }));
  const last = () => seen.at(-1)?.map((c) => `${c.id}:${c.running ? 'running' : 'exited'}`).sort().join(' ');
  return { seen, sources, lines, last };
}

describe('runtime watch', () => {
  it('applyEvent: statuses upserted, a stopped container not running, a deleted one gone, unlabelled ignored, bounded', () => {
    const view = new Map<string, RuntimeContainer>();
    expect(applyEvent(view, event('STARTED', 'c1', [status('c1', 'CONTAINER_RUNNING'), { ...status('x', 'CONTAINER_RUNNING'), labels: {} }]), 10)).toBe(true);
    expect([...view.keys()]).toEqual(['c1']);
    expect(view.get('c1')).toMatchObject({ podUID: UID, name: 'app', running: true, startedAt: 7_000_000n });
    applyEvent(view, event('STOPPED', 'c1', []), 10);
    expect(view.get('c1')?.running).toBe(false);
    applyEvent(view, event('DELETED', 'c1', []), 10);
    expect(view.size).toBe(0);
    applyEvent(view, event('STARTED', 'c1', [status('c1', 'CONTAINER_RUNNING')]), 1);
    expect(applyEvent(view, event('STARTED', 'c2', [status('c2', 'CONTAINER_RUNNING')]), 1)).toBe(false);
    expect([...view.keys()]).toEqual(['c1']);
  });

  it('applyEvent: a container carries its sandbox\'s IPs, primary first, when the event names them', () => {
    const view = new Map<string, RuntimeContainer>();
    const sandbox = { network: { ip: '10.1.2.3', additionalIps: [{ ip: 'fd00::3' }] } } as unknown as CriContainerEvent['podSandboxStatus'];
    applyEvent(view, { ...event('STARTED', 'c1', [status('c1', 'CONTAINER_RUNNING')]), podSandboxStatus: sandbox }, 10);
    expect(view.get('c1')?.podIPs).toEqual(['10.1.2.3', 'fd00::3']);
    applyEvent(view, event('STARTED', 'c2', [status('c2', 'CONTAINER_RUNNING')]), 10);
    expect(view.get('c2')?.podIPs).toBeUndefined();
  });

  it('a runtime without the stream: the list every interval, said once at info, the stream asked for again later', async () => {
    const rt = runtime();
    rt.items = [listed('c1', 'CONTAINER_RUNNING')];
    const w = watch(rt, { retryEventsMs: 60 });
    rt.streams[0]!.end(unimplemented());
    await until('the list', () => w.last() === 'c1:running');
    expect(w.sources).toEqual(['list']);
    const polls = rt.listCalls;
    await until('more lists', () => rt.listCalls >= polls + 3);
    // Asked again, still without it: no second line, still the list.
    await until('a second subscription', () => rt.streams.length === 2);
    rt.streams[1]!.end(unimplemented());
    await until('a third subscription', () => rt.streams.length === 3);
    rt.streams[2]!.end(unimplemented());
    const said = w.lines.filter((l) => l.includes('no container event stream'));
    expect(said).toHaveLength(1);
    expect(JSON.parse(said[0]!)).toMatchObject({ level: 'info', reason: expect.stringMatching(/GetContainerEvents/) });
    expect(w.sources).toEqual(['list']);
  });

  it('a runtime whose stream ends at once, empty (CRI-O, pod events off): the list after three such ends, said once; asked again, one such end keeps the list', async () => {
    const rt = runtime();
    rt.items = [listed('c1', 'CONTAINER_RUNNING')];
    const w = watch(rt, { retryEventsMs: 60 });
    const clean = () => new NetnsUnavailableError('CRI endpoint unix:///x unavailable: ended the event stream', { grpcCode: 0 });
    for (let n = 1; n <= 3; n++) {
      await until(`subscription ${n}`, () => rt.streams.length === n);
      rt.streams[n - 1]!.end(clean());
    }
    await until('the list', () => w.sources.at(-1) === 'list');
    const polls = rt.listCalls;
    await until('more lists', () => rt.listCalls >= polls + 3);
    await until('asked again', () => rt.streams.length === 4);
    rt.streams[3]!.end(clean());
    await until('asked again once more', () => rt.streams.length === 5);
    const lines = w.lines.map((l) => JSON.parse(l) as { level: string; msg: string; source?: string; reason?: string });
    const said = lines.filter((l) => l.msg.includes('no container event stream'));
    expect(said).toEqual([expect.objectContaining({ level: 'info', source: 'list', reason: expect.stringMatching(/enable_pod_events/) })]);
    expect(w.sources).toEqual(['events', 'list']);
    // An event on the stream asked for again: the stream, said at info.
    rt.streams[4]!.emit(event('STARTED', 'c2', [status('c2', 'CONTAINER_RUNNING', 2)]));
    await until('the event seen', () => w.sources.at(-1) === 'events');
    expect(w.lines.filter((l) => l.includes('from the runtime\'s event stream'))).toHaveLength(2);
  });

  it('a runtime that gained the stream (upgraded in place): the stream once it delivers an event, the list until then', async () => {
    const rt = runtime();
    rt.items = [listed('c1', 'CONTAINER_RUNNING')];
    const w = watch(rt, { retryEventsMs: 30 });
    rt.streams[0]!.end(unimplemented());
    await until('a second subscription', () => rt.streams.length === 2);
    // Its catch-up list has answered: still the list, until an event comes.
    const polls = rt.listCalls;
    await until('the list goes on', () => rt.listCalls >= polls + 3);
    expect(w.sources).toEqual(['list']);
    rt.streams[1]!.emit(event('STARTED', 'c2', [status('c2', 'CONTAINER_RUNNING', 2)]));
    await until('the event seen', () => w.last() === 'c1:running c2:running');
    expect(w.sources).toEqual(['list', 'events']);
    const after = rt.listCalls;
    await new Promise((r) => setTimeout(r, 100));
    expect(rt.listCalls).toBe(after);
  });

  it('a runtime outage: subscribed again with back-off, the stream\'s end said once and the list\'s failure warned once', async () => {
    const rt = runtime();
    rt.items = [listed('c1', 'CONTAINER_RUNNING')];
    const w = watch(rt);
    await until('events', () => w.sources.includes('events'));
    rt.down = true;
    const down = new NetnsUnavailableError('CRI endpoint unix:///x unavailable: Connection dropped', { grpcCode: 14 });
    rt.streams[0]!.end(down);
    // Each new subscription ends at once while the runtime is down.
    for (let n = 2; n <= 6; n++) {
      await until(`subscription ${n}`, () => rt.streams.length === n);
      rt.streams[n - 1]!.end(down);
    }
    rt.down = false;
    rt.items = [listed('c2', 'CONTAINER_RUNNING', 2)];
    await until('caught up', () => w.last() === 'c2:running');
    const lines = w.lines.map((l) => JSON.parse(l) as { level: string; msg: string });
    expect(lines.filter((l) => l.msg.includes('event stream ended'))).toHaveLength(1);
    expect(lines.filter((l) => l.level === 'warn').map((l) => l.msg)).toEqual([expect.stringMatching(/^runtime container list not read/)]);
    expect(lines.filter((l) => l.msg === 'runtime container list read again')).toHaveLength(1);
  });

  it('events received during the catch-up list are replayed on it; then each event is seen without a list', async () => {
    const rt = runtime();
    let release!: () => void;
    rt.holdLists(new Promise<void>((r) => (release = r)));
    rt.items = [listed('c1', 'CONTAINER_RUNNING')];
    const w = watch(rt);
    // While the list is out, c1 stops and c2 starts: the list (taken before) still says c1 runs.
    rt.streams[0]!.emit(event('STOPPED', 'c1', [status('c1', 'CONTAINER_EXITED')]));
    rt.streams[0]!.emit(event('STARTED', 'c2', [status('c1', 'CONTAINER_EXITED'), status('c2', 'CONTAINER_RUNNING', 2)]));
    expect(w.seen).toEqual([]);
    rt.holdLists(undefined);
    release();
    await until('the view', () => w.seen.length > 0);
    expect(w.last()).toBe('c1:exited c2:running');
    expect(w.sources).toEqual(['events']);
    const lists = rt.listCalls;
    rt.streams[0]!.emit(event('DELETED', 'c1', [status('c2', 'CONTAINER_RUNNING', 2)]));
    await until('the deletion', () => w.last() === 'c2:running');
    expect(rt.listCalls).toBe(lists);
  });

  it('a stream that ends is subscribed again (backing off) and caught up by a list; a full buffer lists again', async () => {
    const rt = runtime();
    rt.items = [listed('c1', 'CONTAINER_RUNNING')];
    const w = watch(rt, { maxBuffered: 1 });
    await until('events', () => w.sources.includes('events'));
    rt.items = [listed('c1', 'CONTAINER_EXITED'), listed('c2', 'CONTAINER_RUNNING', 2)];
    rt.streams[0]!.end(new NetnsUnavailableError('CRI endpoint unix:///x unavailable: Connection dropped', { grpcCode: 14 }));
    await until('a new subscription', () => rt.streams.length === 2);
    expect(rt.streams[0]!.cancelled).toBe(true);
    await until('caught up', () => w.last() === 'c1:exited c2:running');
    expect(w.lines.some((l) => l.includes('event stream ended; subscribing again'))).toBe(true);
    // More events during a catch-up than the buffer holds: listed once more.
    let release!: () => void;
    rt.holdLists(new Promise<void>((r) => (release = r)));
    rt.streams[1]!.end(new NetnsUnavailableError('ended', { grpcCode: 0 }));
    await until('a third subscription', () => rt.streams.length === 3);
    const lists = rt.listCalls;
    for (const id of ['c3', 'c4']) rt.streams[2]!.emit(event('STARTED', id, [status(id, 'CONTAINER_RUNNING', 3)]));
    rt.items = [listed('c2', 'CONTAINER_RUNNING', 2), listed('c3', 'CONTAINER_RUNNING', 3), listed('c4', 'CONTAINER_RUNNING', 3)];
    rt.holdLists(undefined);
    release();
    await until('listed again', () => rt.listCalls > lists && w.last() === 'c2:running c3:running c4:running');
    expect(w.sources).toEqual(['events']);
    expect(w.lines.filter((l) => l.includes('"level":"warn"'))).toEqual([]);
  });
});
