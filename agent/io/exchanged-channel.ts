/**
 * A connection the netns helper has already used (connectAndSend): it wrote the first `sent` octets
 * of the request and read the answer's first octets, and the connection comes back unless the
 * peer ended it meanwhile. As a ByteChannel, it is what a fresh connection would have been: the
 * octets read come first, then the peer's end (or reset) or the rest of the reads, and the first
 * write skips what the helper wrote. So the reader above it keeps every rule, and cannot tell the
 * two routes apart.
 */
import type { Socket } from 'node:net';
import { performance } from 'node:perf_hooks';
import type { ConnectExchange } from '../probe/types.ts';
import { keep, LeanSocket, type ByteChannel, type ChannelHandler } from './lean-socket.ts';

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

/**
 * The channel of a connection connectAndSend made: what the helper's exchange read first when there
 * was one, the connection read lean after it (or alone).
 */
export function connectionChannel(exchange: ConnectExchange | undefined, socket: Socket | undefined): ByteChannel {
  return exchange ? new ExchangedChannel(exchange, socket) : LeanSocket.take(socket as Socket);
}

/**
 * When the answer began, on performance.now()'s clock: now, less the time it already took in the
 * helper (until its first octet, or all of the exchange).
 */
export function answerStartedAt(exchange: ConnectExchange | undefined): number {
  return performance.now() - (exchange ? (exchange.firstByteSeconds ?? exchange.seconds) * 1000 : 0);
}

/**
 * The channel a protocol writes its first octets to before the connection exists, so that they can
 * go with the helper's connect (connectAndSend): writes wait here, as does the handler, until
 * attach() gives the connection. The waiting writes then go to it first (an ExchangedChannel skips
 * what the helper sent), and the handler starts on it.
 */
export class PendingChannel implements ByteChannel {
  #target: ByteChannel | undefined;
  #handler: ChannelHandler | undefined;
  #waiting: Buffer[] = [];
  #destroyed = false;
  #settle!: (closed: Promise<void>) => void;
  readonly closed = new Promise<void>((resolve) => {
    this.#settle = (closed) => void closed.then(resolve, resolve);
  });

  /** The octets written so far (the protocol's first write: its turn must have ended). */
  written(): Buffer {
    return Buffer.concat(this.#waiting);
  }

  /** Gives the connection; returns it. */
  attach<C extends ByteChannel>(target: C): C {
    if (this.#destroyed) {
      target.destroy();
      return target;
    }
    this.#target = target;
    for (const b of this.#waiting.splice(0)) target.write(b);
    if (this.#handler) target.start(this.#handler);
    this.#settle(target.closed);
    return target;
  }

  start(handler: ChannelHandler): void {
    if (this.#target) this.#target.start(handler);
    else this.#handler = handler;
  }

  write(octets: Buffer): void {
    if (this.#target) this.#target.write(octets);
    else if (!this.#destroyed) this.#waiting.push(keep(octets));
  }

  get unsent(): number {
    return this.#target?.unsent ?? 0;
  }

  get writable(): boolean {
    return this.#target ? this.#target.writable : !this.#destroyed;
  }

  get destroyed(): boolean {
    return this.#target?.destroyed ?? this.#destroyed;
  }

  end(): void {
    this.#target?.end();
  }

  /** Without a connection yet: the handler hears that none will come. */
  destroy(): void {
    if (this.#target) return this.#target.destroy();
    if (this.#destroyed) return;
    this.#destroyed = true;
    this.#waiting = [];
    this.#handler?.close(new Error('no connection was made'));
    this.#settle(Promise.resolve());
  }

  get remoteAddress(): string | undefined {
    return this.#target?.remoteAddress;
  }
}
