/**
 * One WatchProbeEvents stream: snapshot or replay, then live events, with a bounded send buffer.
 * The results store delivers events synchronously, so taking the snapshot (or the replay) and
 * subscribing in the same tick leaves no gap and no duplicate between them.
 */
import * as grpc from '@grpc/grpc-js';
import { describeError } from '../errors.ts';
import type { Logger } from '../log.ts';
import type { ProbeEvent, ResultsReader, StatusFilter } from '../scheduler/types.ts';
import { eventToWire, matchesFilter, statusToWire } from './convert.ts';
import type { WireWatchRequest, WireWatchResponse } from './proto.ts';

/** Bounds of one watcher. */
export interface WatchLimits {
  /** Messages queued for a client that does not read before it is cut with ABORTED. */
  maxBufferedMessages: number;
  /** Statuses per snapshot message, so each message stays far below the size limit. */
  snapshotChunk: number;
}

/** Where a watch starts. */
export interface WatchStart {
  fromRevision: number;
  /** Instance the client's revision belongs to; '' trusts the revision. */
  instanceId: string;
}

/** Serves one watch call until the client leaves, falls behind, or the server ends it. */
export class WatchSession {
  readonly #call: grpc.ServerWritableStream<WireWatchRequest, WireWatchResponse>;
  readonly #results: ResultsReader;
  readonly #filter: StatusFilter;
  readonly #limits: WatchLimits;
  readonly #log: Logger;
  readonly #onDone: (session: WatchSession) => void;
  #unsubscribe: (() => void) | undefined;
  /** Highest store revision handled (sent or filtered out). */
  #cursor = 0;
  /** Revision the client can resume from once it has read everything written so far. */
  #resumeFrom = 0;
  #done = false;
  /** Messages of the initial snapshot or replay, which may exceed the buffer bound once, by design. */
  #initialBacklog = 0;

  constructor(opts: {
    call: grpc.ServerWritableStream<WireWatchRequest, WireWatchResponse>;
    results: ResultsReader;
    filter: StatusFilter;
    limits: WatchLimits;
    log: Logger;
    onDone: (session: WatchSession) => void;
  }) {
    this.#call = opts.call;
    this.#results = opts.results;
    this.#filter = opts.filter;
    this.#limits = opts.limits;
    this.#log = opts.log;
    this.#onDone = opts.onDone;
    this.#call.on('cancelled', () => this.#cleanup());
    this.#call.on('close', () => this.#cleanup());
  }

  /** The revision a client should resume from after the messages written so far. */
  get resumeFrom(): number {
    return this.#resumeFrom;
  }

  /** Sends the snapshot or the replay, then follows the store. Synchronous on purpose (see the file comment). */
  start(from: WatchStart, instanceId: string): void {
    const current = this.#results.revision();
    const foreign = from.instanceId !== '' && from.instanceId !== instanceId;
    let replay: ProbeEvent[] | undefined;
    if (from.fromRevision > 0 && !foreign && from.fromRevision <= current) {
      replay = this.#results.eventsSince(from.fromRevision);
    }
    if (replay) {
      this.#cursor = from.fromRevision;
      this.#resumeFrom = from.fromRevision;
      // The replay is bounded by the store's ring, not by the watcher buffer.
      this.#initialBacklog = Number.POSITIVE_INFINITY;
      for (const event of replay) this.#onEvent(event);
    } else {
      this.#sendSnapshot(current, instanceId, from.fromRevision > 0);
    }
    this.#initialBacklog = this.#call.writableLength;
    if (this.#initialBacklog > 0) this.#call.once('drain', () => (this.#initialBacklog = 0));
    if (!this.#done) this.#unsubscribe = this.#results.subscribe((event) => this.#onEvent(event));
  }

  /** Ends the stream with `code` (the client learns it after reading what was already written). */
  end(code: grpc.status, details: string): void {
    if (this.#done) return;
    this.#cleanup();
    this.#call.emit('error', { code, details, metadata: new grpc.Metadata() });
  }

  #sendSnapshot(revision: number, instanceId: string, resynced: boolean): void {
    const statuses = this.#results.list(this.#filter).map(statusToWire);
    const chunk = Math.max(1, this.#limits.snapshotChunk);
    for (let i = 0; i === 0 || i < statuses.length; i += chunk) {
      this.#call.write({
        snapshot: {
          revision,
          instance_id: instanceId,
          statuses: statuses.slice(i, i + chunk),
          resynced,
          complete: i + chunk >= statuses.length,
        },
      });
    }
    this.#cursor = revision;
    this.#resumeFrom = revision;
  }

  #onEvent(event: ProbeEvent): void {
    if (this.#done || event.revision <= this.#cursor) return;
    this.#cursor = event.revision;
    if (!matchesFilter(event.status, this.#filter)) {
      // Nothing to send, but resuming past it is safe: a replay would filter it out again.
      this.#resumeFrom = event.revision;
      return;
    }
    if (this.#call.writableLength - this.#initialBacklog >= this.#limits.maxBufferedMessages) {
      this.#log.warn('watcher fell behind, cutting it', { buffered: this.#call.writableLength, resumeFrom: this.#resumeFrom });
      this.end(
        grpc.status.ABORTED,
        `watcher fell behind (more than ${this.#limits.maxBufferedMessages} messages unread); resume from revision ${this.#resumeFrom}`,
      );
      return;
    }
    try {
      this.#call.write({ event: eventToWire(event) });
      this.#resumeFrom = event.revision;
    } catch (err) {
      // The store calls us synchronously: an exception here must end this watcher, not the store's loop.
      this.end(grpc.status.INTERNAL, `cannot send event: ${describeError(err)}`);
    }
  }

  #cleanup(): void {
    if (this.#done) return;
    this.#done = true;
    this.#unsubscribe?.();
    this.#unsubscribe = undefined;
    this.#onDone(this);
  }
}
