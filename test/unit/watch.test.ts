/**
 * agent/api/watch.ts: one WatchSession over a real ResultsStore, its call a Writable in object mode
 * standing in for grpc-js's server stream (what the session uses of it: write, writableLength,
 * 'drain', 'cancelled', 'error'). The end-to-end stream is test/integration/api-watch.test.ts.
 */
import { Writable } from 'node:stream';
import * as grpc from '@grpc/grpc-js';
import { describe, expect, it } from 'vitest';
import type { WireWatchRequest, WireWatchResponse } from '../../agent/api/proto.ts';
import { WatchSession, type WatchLimits } from '../../agent/api/watch.ts';
import { createLogger } from '../../agent/log.ts';
import { ResultsStore } from '../../agent/scheduler/results-store.ts';
import type { StatusFilter } from '../../agent/scheduler/types.ts';
import { status } from '../support/api-harness.ts';

/** A call that keeps what was written; `reading` false leaves it all in the buffer (a client that does not read). */
function call(reading: boolean) {
  const sent: WireWatchResponse[] = [];
  const errors: { code: number; details: string }[] = [];
  const stream = new Writable({
    objectMode: true,
    highWaterMark: 1,
    write(chunk: WireWatchResponse, _enc, cb) {
      sent.push(chunk);
      if (reading) cb();
    },
  });
  stream.on('error', (e: unknown) => errors.push(e as { code: number; details: string }));
  return { stream, sent, errors, asCall: stream as unknown as grpc.ServerWritableStream<WireWatchRequest, WireWatchResponse> };
}

function session(store: ResultsStore, c: ReturnType<typeof call>, opts: { filter?: StatusFilter; limits?: Partial<WatchLimits>; lines?: string[] } = {}) {
  let done = 0;
  const s = new WatchSession({
    call: c.asCall,
    results: store,
    filter: opts.filter ?? {},
    limits: { maxBufferedMessages: 100, snapshotChunk: 100, ...opts.limits },
    log: createLogger({ level: 'warn', format: 'json', write: (l) => opts.lines?.push(l) }),
    onDone: () => done++,
  });
  return { s, done: () => done };
}

describe('WatchSession', () => {
  it('a snapshot in chunks, the last one complete; an empty store still sends one complete snapshot', () => {
    const store = new ResultsStore();
    for (let i = 0; i < 5; i++) store.upsert(status(`u${i}`, 'ns', 'Readiness', 'success'));
    const c = call(true);
    session(store, c, { limits: { snapshotChunk: 2 } }).s.start({ fromRevision: 0, instanceId: '' }, 'inst');
    expect(c.sent.map((m) => [m.snapshot?.statuses?.length, m.snapshot?.complete])).toEqual([[2, false], [2, false], [1, true]]);
    expect(c.sent[0]!.snapshot).toMatchObject({ revision: 5, instance_id: 'inst', resynced: false });

    const empty = call(true);
    session(new ResultsStore(), empty).s.start({ fromRevision: 0, instanceId: '' }, 'inst');
    expect(empty.sent).toEqual([{ snapshot: { revision: 0, instance_id: 'inst', statuses: [], resynced: false, complete: true } }]);
  });

  it('resumes with a replay of the missed events, no snapshot; another instance\'s revision gets a resynced snapshot', () => {
    const store = new ResultsStore();
    store.upsert(status('u1', 'ns', 'Readiness', 'success'));
    store.upsert(status('u1', 'ns', 'Readiness', 'failure'));
    store.upsert(status('u2', 'ns', 'Readiness', 'success'));
    const c = call(true);
    const { s } = session(store, c);
    s.start({ fromRevision: 1, instanceId: 'inst' }, 'inst');
    expect(c.sent.map((m) => m.event?.revision)).toEqual([2, 3]);
    expect(s.resumeFrom).toBe(3);

    const other = call(true);
    session(store, other).s.start({ fromRevision: 1, instanceId: 'an-older-agent' }, 'inst');
    expect(other.sent).toHaveLength(1);
    expect(other.sent[0]!.snapshot).toMatchObject({ revision: 3, resynced: true });

    // A revision from the future (the store was reset) is a resync too.
    const ahead = call(true);
    session(store, ahead).s.start({ fromRevision: 99, instanceId: '' }, 'inst');
    expect(ahead.sent[0]!.snapshot).toMatchObject({ revision: 3, resynced: true });
  });

  it('follows the store; a filtered-out event is not sent but moves the resume point', () => {
    const store = new ResultsStore();
    const c = call(true);
    const { s } = session(store, c, { filter: { namespace: 'mine' } });
    s.start({ fromRevision: 0, instanceId: '' }, 'inst');
    store.upsert(status('u1', 'other', 'Readiness', 'success'));
    expect(c.sent).toHaveLength(1);
    expect(s.resumeFrom).toBe(1);
    store.upsert(status('u2', 'mine', 'Readiness', 'success'));
    expect(c.sent.at(-1)!.event).toMatchObject({ revision: 2 });
    expect(s.resumeFrom).toBe(2);
  });

  it('a client that does not read is cut with ABORTED naming the revision to resume from, and leaves the store', () => {
    const store = new ResultsStore();
    const c = call(false);
    const lines: string[] = [];
    const { s, done } = session(store, c, { limits: { maxBufferedMessages: 3 }, lines });
    s.start({ fromRevision: 0, instanceId: '' }, 'inst');
    for (let i = 0; i < 10; i++) store.upsert(status(`u${i}`, 'ns', 'Readiness', 'success'));
    expect(c.errors).toHaveLength(1);
    expect(c.errors[0]!.code).toBe(grpc.status.ABORTED);
    expect(c.errors[0]!.details).toBe(`watcher fell behind (more than 3 messages unread); resume from revision ${s.resumeFrom}`);
    expect(s.resumeFrom).toBeGreaterThan(0);
    expect(s.resumeFrom).toBeLessThan(10);
    expect(done()).toBe(1);
    expect(lines.filter((l) => l.includes('watcher fell behind'))).toHaveLength(1);
    const written = c.stream.writableLength;
    store.upsert(status('late', 'ns', 'Readiness', 'success'));
    expect(c.stream.writableLength).toBe(written);
  });

  it('a large initial snapshot is not counted against the buffer bound', () => {
    const store = new ResultsStore();
    for (let i = 0; i < 10; i++) store.upsert(status(`u${i}`, 'ns', 'Readiness', 'success'));
    const c = call(false);
    session(store, c, { limits: { maxBufferedMessages: 2, snapshotChunk: 1 } }).s.start({ fromRevision: 0, instanceId: '' }, 'inst');
    store.upsert(status('new', 'ns', 'Readiness', 'success'));
    expect(c.errors).toEqual([]);
  });

  it('a cancelled call unsubscribes once; end() after that does nothing', () => {
    const store = new ResultsStore();
    const c = call(true);
    const { s, done } = session(store, c);
    s.start({ fromRevision: 0, instanceId: '' }, 'inst');
    c.stream.emit('cancelled');
    c.stream.emit('close');
    expect(done()).toBe(1);
    store.upsert(status('u1', 'ns', 'Readiness', 'success'));
    expect(c.sent).toHaveLength(1);
    s.end(grpc.status.UNAVAILABLE, 'shutting down');
    expect(c.errors).toEqual([]);
  });
});
