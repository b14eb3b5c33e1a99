/**
 * One HTTP/1.1 GET over a connection that is already made (inside the pod's netns), without
 * node:http: the request is kubelet's, byte for byte as Go's client writes it, in one write
 * (http-request.ts requestBytes); the response is read by our own reader with Go's rules
 * (http1-response.ts). Plain HTTP reads through a lean socket (agent/io/lean-socket.ts: the reused
 * buffer, no stream machinery per read), HTTPS through its TLS socket as a stream channel; both feed
 * the same reader. Errors are only recorded here (the reader's, and the first of the socket's);
 * http.ts turns them into Go's texts.
 */
import { performance } from 'node:perf_hooks';
import type { ByteChannel, ChannelHandler } from '../io/lean-socket.ts';
import { Http1ResponseReader, type Http1Error, type ResponseHead } from './http1-response.ts';

export { MAX_1XX_RESPONSES } from '../http2/informational.ts';
export { MAX_HEADER_BYTES } from './http1-response.ts';

/** How a GET ended once its final head came: the body bytes kept, or why the body stopped. */
export interface GetOutcome {
  head: ResponseHead;
  /** performance.now() when the final head was read. */
  headAt: number;
  /** The body bytes kept (at most what keep() asked for); undefined when bodyError is set. */
  body: Buffer | undefined;
  /** Why the body stopped short: an Http1Error, the socket's error or the abort reason. */
  bodyError?: unknown;
}

/** Reading a response must never write; nothing is queued from here after the request. */
const noop = (): void => {};

/** One GET in flight on a channel; the caller destroys the channel once done, whatever happened. */
export class Http1Get implements ChannelHandler {
  readonly #channel: ByteChannel;
  readonly #signal: AbortSignal;
  readonly #reader: Http1ResponseReader;
  #head: ResponseHead | undefined;
  #headAt = 0;
  #settled = false;
  #resolve!: (o: GetOutcome) => void;
  #reject!: (err: unknown) => void;
  /** The first error the connection itself reported (a reset by the peer, a broken pipe). */
  socketError: Error | undefined;
  /**
   * Settles once the response is done: resolves when the final head came (with the body kept, or
   * why the body stopped), rejects with why there is no final head (Http1Error, a socket error,
   * the abort reason).
   */
  readonly outcome: Promise<GetOutcome>;

  /**
   * Writes `request` on `channel` at once. `keep(head)` says, when the final head has come, how
   * many body bytes to keep (0: none, the GET ends there). The deadline's `signal` ends the GET.
   */
  constructor(channel: ByteChannel, request: Buffer, signal: AbortSignal, keep: (head: ResponseHead) => number) {
    this.#channel = channel;
    this.#signal = signal;
    this.outcome = new Promise<GetOutcome>((resolve, reject) => {
      this.#resolve = resolve;
      this.#reject = reject;
    });
    // The caller may look at it only later (or never, once the deadline has spoken).
    this.outcome.catch(noop);
    this.#reader = new Http1ResponseReader({
      head: (head) => {
        const at = performance.now();
        const n = keep(head);
        this.#head = head;
        this.#headAt = at;
        return n;
      },
      done: (body) => this.#settle(undefined, body),
      fail: (err: Http1Error) => this.#settle(err),
    });
    if (signal.aborted) {
      this.#onAbort();
      return;
    }
    signal.addEventListener('abort', this.#onAbort, { once: true });
    channel.start(this);
    channel.write(request);
  }

  data(view: Buffer): void {
    if (this.#settled) return;
    // A throw here would reach Node's read callback and end the process: it ends this GET instead.
    try {
      this.#reader.push(view);
    } catch (err) {
      this.#settle(err);
      this.#channel.destroy();
    }
  }

  end(): void {
    if (this.#settled) return;
    try {
      this.#reader.eof();
    } catch (err) {
      this.#settle(err);
    }
  }

  close(err: Error | undefined): void {
    if (err) {
      this.socketError ??= err;
      this.#settle(err);
    } else {
      // Closed without an error and without its end first (a TLS socket cut short): the end.
      this.end();
    }
  }

  drain(): void {}

  readonly #onAbort = (): void => {
    const reason: unknown = this.#signal.reason;
    this.#settle(reason instanceof Error ? reason : new Error('probe aborted'));
    this.#channel.destroy();
  };

  /** Settles once: a body (done), or an error (before the final head: rejected; after it: the body's error). */
  #settle(err: unknown, body?: Buffer): void {
    if (this.#settled) return;
    this.#settled = true;
    this.#signal.removeEventListener('abort', this.#onAbort);
    const head = this.#head;
    if (head === undefined) this.#reject(err);
    else if (err === undefined) this.#resolve({ head, headAt: this.#headAt, body });
    else this.#resolve({ head, headAt: this.#headAt, body: undefined, bodyError: err });
  }
}
