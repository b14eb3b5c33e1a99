/**
 * One HTTP/1.1 GET over a socket that is already connected (made inside the pod's netns), with
 * Node's own client: node:http's ClientRequest handed the socket through createConnection, no agent,
 * no pool, the native llhttp parser. No undici: it compiled its WASM parser into every agent that
 * ran an HTTP probe (about 30 MB of peak RSS in the side-by-side bench, test/bench/driver.ts).
 *
 * What goes on the wire is kubelet's request byte for byte as Go's client writes it, as a raw
 * header list so node adds nothing of its own: "GET <path> HTTP/1.1", Host, then the probe's headers
 * in Go's order (User-Agent, the rest by sorted canonical name; http-request.ts), then
 * "Connection: close" last (Go's transport adds it to the extra headers it writes after the
 * request's own when DisableKeepAlives is set, as kubelet's probe transport has it). Errors are
 * only recorded here (the first of the socket's and of the request's); http.ts turns them into
 * Go's texts.
 */
import { request as httpRequest, type ClientRequest, type IncomingMessage } from 'node:http';
import type { Socket } from 'node:net';
import type { ProbeRequest } from './http-request.ts';
import { MAX_1XX_RESPONSES } from '../http2/informational.ts';

export { MAX_1XX_RESPONSES } from '../http2/informational.ts';

/**
 * The biggest response header block we parse. Go's client allows 10 MiB (Transport
 * MaxResponseHeaderBytes default); node's own default is 16 KiB. 64 KiB keeps real servers working
 * and bounds what one hostile target can make the agent hold.
 */
export const MAX_HEADER_BYTES = 64 * 1024;
/** Go's "too many 1xx" client error, raised when the sixth informational response arrives. */
export class TooMany1xxError extends Error {
  readonly code = 'TOO_MANY_1XX';
  constructor() {
    super('net/http: too many 1xx informational responses');
  }
}

/** One GET in flight on `socket`; destroy() it once done, whatever happened. */
export class SocketGet {
  readonly #request: ClientRequest;
  readonly #socket: Socket;
  readonly #signal: AbortSignal;
  /** The first error the socket itself reported (a reset by the peer, a broken pipe). */
  socketError: Error | undefined;
  /** The first error the request reported: parser errors (HPE_*), "socket hang up", too many 1xx, the deadline. */
  requestError: Error | undefined;
  /** The final (non-1xx) response's head; rejects with the request's first error. */
  readonly response: Promise<IncomingMessage>;

  /** Writes `req` on `socket` at once; the deadline's `signal` destroys the exchange when it fires. */
  constructor(socket: Socket, req: ProbeRequest, signal: AbortSignal) {
    this.#socket = socket;
    this.#signal = signal;
    socket.on('error', this.#onSocketError);
    // Raw header pairs: node writes them as given (order, case, latin1 bytes) and adds no Host,
    // Connection or Transfer-Encoding of its own. Go writes a value's UTF-8 bytes; node validates
    // and writes each character as one latin1 byte, so non-ASCII values go in as their UTF-8 bytes.
    const headers = rawHeaders(req);
    let informational = 0;
    this.#request = httpRequest({
      method: 'GET',
      path: req.pathAndQuery,
      headers,
      createConnection: () => socket,
      maxHeaderSize: MAX_HEADER_BYTES,
    });
    const request = this.#request;
    this.response = new Promise<IncomingMessage>((resolve, reject) => {
      const fail = (err: Error): void => {
        this.requestError ??= err;
        reject(err);
      };
      request.on('response', resolve);
      // Stays attached for the whole exchange: a parser error or reset while the body is read lands here too.
      request.on('error', fail);
      // node skips 1xx (but 101) itself and keeps parsing; Go gives up after MAX_1XX_RESPONSES of them.
      // Rejected here, at once: the final response may follow in the very same chunk of bytes.
      request.on('information', () => {
        if (++informational <= MAX_1XX_RESPONSES) return;
        const err = new TooMany1xxError();
        fail(err);
        request.destroy(err);
      });
    });
    // The body phase may never look at it; an early rejection must not be unhandled.
    this.response.catch(() => {});
    request.end();
    if (signal.aborted) this.#onAbort();
    else signal.addEventListener('abort', this.#onAbort, { once: true });
  }

  readonly #onSocketError = (err: Error): void => {
    this.socketError ??= err;
  };

  readonly #onAbort = (): void => {
    this.#request.destroy(this.#signal.reason instanceof Error ? this.#signal.reason : new Error('probe aborted'));
  };

  /** Ends the exchange and closes the connection (Go: DisableKeepAlives); safe to call more than once. */
  destroy(): void {
    this.#signal.removeEventListener('abort', this.#onAbort);
    this.#request.destroy();
    this.#socket.destroy();
  }
}

/** Why a body read stopped short: the response stream's own error, or it closed before its end. */
export class BodyCutError extends Error {}

/**
 * Reads at most `limit` bytes of `res` (more is not an error: kubelet's ReadAtMost) and destroys
 * the rest. Rejects when the body stops short (reset, parser error, EOF before its length, the
 * deadline): the caller reads SocketGet's recorded errors to say which.
 */
export function readAtMost(res: IncomingMessage, limit: number): Promise<Buffer> {
  return new Promise<Buffer>((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let settled = false;
    const finish = (err?: Error): void => {
      if (settled) return;
      settled = true;
      res.removeListener('data', onData);
      if (err) reject(err);
      else resolve(chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks, size));
      // Whatever is left is not read (Go closes the connection under it).
      if (!res.complete) res.destroy();
    };
    const onData = (chunk: Buffer): void => {
      const room = limit - size;
      chunks.push(chunk.length > room ? chunk.subarray(0, room) : chunk);
      size += Math.min(chunk.length, room);
      if (size >= limit) finish();
    };
    res.on('data', onData);
    res.once('end', () => finish());
    // Stays attached: destroying an unfinished body emits 'aborted', which must not crash the agent.
    res.on('error', (err: Error) => finish(err));
    res.once('close', () => finish(res.complete ? undefined : new BodyCutError('response closed before its end')));
  });
}

/** Drops a body nobody reads (its connection is closed next). */
export function discardBody(res: IncomingMessage): void {
  res.on('error', () => {});
  res.destroy();
}

/** Raw header lists by request: a worker's first request is the same object every period (http.ts). */
const rawHeaderLists = new WeakMap<ProbeRequest, readonly string[]>();

/** The request's header lines as node:http takes them raw (node only reads the list). */
function rawHeaders(req: ProbeRequest): string[] {
  const known = rawHeaderLists.get(req);
  if (known) return known as string[];
  const headers: string[] = ['Host', req.hostHeader];
  for (const [name, value] of req.headers) headers.push(name, utf8OnTheWire(value));
  headers.push('Connection', 'close');
  rawHeaderLists.set(req, Object.freeze(headers));
  return headers;
}

/**
 * Go writes a header value's UTF-8 bytes as they are; node writes each character as one latin1
 * byte and refuses anything wider ("€"). Handing node the UTF-8 bytes as latin1 characters puts
 * exactly Go's bytes on the wire.
 */
function utf8OnTheWire(value: string): string {
  return /[^\u0000-\u007f]/.test(value) ? Buffer.from(value, 'utf8').toString('latin1') : value;
}
