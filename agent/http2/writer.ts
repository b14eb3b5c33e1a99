/**
 * The outbound side of one HTTP/2 connection: frames are queued in the order given and written
 * once per turn of the event loop (a microtask), as one buffer; frames that lie back to back in
 * one read's buffer (forwarded as received) are joined as one view, not copied. `blocked` is the
 * backpressure the core's DATA scheduling waits on (the socket holds HIGH_WATER octets); writes go
 * through the connection's channel (agent/io/lean-socket.ts), which copies a view of a reused read
 * buffer rather than let the socket keep it; a peer
 * that does not read and whose unsent octets pass `maxBufferedOutput` anyway (control frames it
 * provokes) is reported through `onOverflow`, once per write past it.
 */
import type { Duplex } from 'node:stream';
import { channelOf, type ByteChannel } from '../io/lean-socket.ts';

/** The socket's unsent octets past which DATA waits in the core's queues. */
export const HIGH_WATER = 256 * 1024;

/** What the writer tells its connection. */
export interface WriterHooks {
  /** Called at each write before the queue is taken, with whether frames are queued: a last frame may be added (the connection credit). */
  beforeWrite(queued: boolean): void;
  /** The socket holds more than maxBufferedOutput unsent octets after a write. */
  onOverflow(unsent: number): void;
}

/** Queues frames and writes them once per turn. */
export class FrameWriter {
  readonly #socket: ByteChannel;
  readonly #hooks: WriterHooks;
  readonly #maxBufferedOutput: number;
  #out: Buffer[] = [];
  #scheduled = false;
  #closed = false;
  readonly #flushNow = (): void => {
    this.#scheduled = false;
    this.flush();
  };

  constructor(socket: Duplex | ByteChannel, maxBufferedOutput: number, hooks: WriterHooks) {
    this.#socket = channelOf(socket);
    this.#maxBufferedOutput = maxBufferedOutput;
    this.#hooks = hooks;
  }

  /** Queues a frame (or frames) to go out this turn. */
  push(octets: Buffer): void {
    if (this.#closed) return;
    this.#out.push(octets);
    this.schedule();
  }

  /** Queues a frame to go out with the next write, without scheduling one. */
  add(octets: Buffer): void {
    if (!this.#closed) this.#out.push(octets);
  }

  /** Makes sure a write happens this turn. */
  schedule(): void {
    if (this.#scheduled || this.#closed) return;
    this.#scheduled = true;
    queueMicrotask(this.#flushNow);
  }

  /** Whether the socket holds enough unsent octets that DATA should wait. */
  get blocked(): boolean {
    return this.#socket.unsent >= HIGH_WATER;
  }

  /** Writes what is queued now. */
  flush(): void {
    // Ended (GOAWAY sent, or the peer left): a frame read since then gets no answer; writing would be an error.
    if (this.#closed || !this.#socket.writable) return;
    this.#hooks.beforeWrite(this.#out.length > 0);
    const out = this.#out;
    if (out.length === 0) return;
    this.#out = [];
    // Frames forwarded from one read lie back to back in its buffer: one view covers them.
    let merged = 0;
    for (let i = 1; i < out.length; i++) {
      const a = out[merged]!;
      const b = out[i]!;
      if (a.buffer === b.buffer && a.byteOffset + a.length === b.byteOffset) out[merged] = Buffer.from(a.buffer, a.byteOffset, a.length + b.length);
      else out[++merged] = b;
    }
    out.length = merged + 1;
    this.#socket.write(out.length === 1 ? out[0]! : Buffer.concat(out));
    if (this.#socket.unsent > this.#maxBufferedOutput) this.#hooks.onOverflow(this.#socket.unsent);
  }

  /** Drops what is queued; nothing is written after. */
  close(): void {
    this.#closed = true;
    this.#out = [];
  }
}
