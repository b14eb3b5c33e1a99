/**
 * A connection the netns helper has already used (connectAndSend): it wrote the first `sent` octets
 * of the request and read the answer's first octets, and the connection comes back unless the
 * peer ended it meanwhile. As a ByteChannel, it is what a fresh connection would have been: the
 * octets read come first, then the peer's end (or reset) or the rest of the reads, and the first
 * write skips what the helper wrote. So the reader above it keeps every rule, and cannot tell the
 * two routes apart.
 */
import type { Socket } from 'node:net';
import type { ConnectExchange } from '../probe/types.ts';
import { LeanSocket, type ByteChannel, type ChannelHandler } from './lean-socket.ts';

export class ExchangedChannel implements ByteChannel {
  readonly #exchange: ConnectExchange;
  /** The rest of the connection, read lean; undefined when the peer ended it in the helper. */
  readonly #rest: LeanSocket | undefined;
  /** Octets of the next writes the helper wrote already. */
  #skip: number;
  #destroyed = false;
  readonly closed: Promise<void>;

  constructor(exchange: ConnectExchange, socket: Socket | undefined) {
    this.#exchange = exchange;
    this.#skip = exchange.sent;
    this.#rest = socket ? LeanSocket.take(socket) : undefined;
    this.closed = this.#rest?.closed ?? Promise.resolve();
  }

  start(handler: ChannelHandler): void {
    const { data, ended } = this.#exchange;
    if (data.length > 0) handler.data(data);
    if (this.#rest) {
      this.#rest.start(handler);
    } else if (ended && 'code' in ended) {
      // As Node reports a reset read: the errno's name, and the code a caller looks at.
      handler.close(Object.assign(new Error(`read ${ended.code}`), { code: ended.code, syscall: 'read' }));
    } else {
      handler.end();
      handler.close(undefined);
    }
  }

  write(octets: Buffer): void {
    const skipped = Math.min(this.#skip, octets.length);
    this.#skip -= skipped;
    if (skipped < octets.length) this.#rest?.write(octets.subarray(skipped));
  }

  get unsent(): number {
    return this.#rest?.unsent ?? 0;
  }

  get writable(): boolean {
    return this.#rest?.writable ?? false;
  }

  get destroyed(): boolean {
    return this.#rest?.destroyed ?? this.#destroyed;
  }

  end(): void {
    this.#rest?.end();
  }

  destroy(): void {
    this.#destroyed = true;
    this.#rest?.destroy();
  }

  get remoteAddress(): string | undefined {
    return this.#rest?.remoteAddress;
  }
}
