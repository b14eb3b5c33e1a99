/**
 * The one I/O seam of the HTTP/2 code (the shim's relay, the agent's hot unary server, the shim's
 * agent client) and of the HTTP probe's plain connections to pod targets (take()): a byte channel
 * whose reads skip Node's stream machinery. A `net.Socket` opened
 * with the `onread` option reads into one reused buffer and hands the owner a view of it, with no
 * Readable, no 'data' event and no Buffer per read: at probe rates each wake-up otherwise walks
 * some twenty cold functions of the stream path (issue 44, `make bench-floor`).
 *
 * The contract that makes a reused buffer safe: a view handed to `data()` is valid during that
 * call and the microtasks it queues (Node drains them before the next read callback), never after.
 * What must outlive it is copied by whoever keeps it; `isTransient()` says whether a buffer is such
 * a view, and `write()` copies one itself, since a write the kernel does not take at once keeps its
 * buffer until later.
 *
 * Writes go through `socket.write`: public, and it keeps partial writes, EAGAIN and backpressure
 * (`unsent`, `drain`) correct. The HTTP/2 writer calls it once per turn.
 *
 * Node offers `onread` only to sockets it creates for `net.connect`; an accepted socket is moved
 * onto a new `net.Socket` with `onread` (adopt(), the only use of Node internals here, checked by
 * test/integration/lean-socket.test.ts). Where those internals are missing, the accepted socket
 * is used as a stream: slower, never wrong.
 */
import net from 'node:net';
import type { Duplex } from 'node:stream';

/** Octets one read may bring (Node's own read size). */
export const READ_SIZE = 64 * 1024;

/** The reused read buffer, shared by every lean socket of the process (reads never overlap). */
let shared: Buffer | null = null;

function readBuffer(): Buffer {
  // Its own ArrayBuffer, not the pool's: isTransient() tells views of it by that.
  shared ??= Buffer.allocUnsafeSlow(READ_SIZE);
  return shared;
}

/** Whether `b` is a view of the reused read buffer (valid only during the read that gave it). */
export function isTransient(b: Uint8Array): boolean {
  return shared !== null && b.buffer === shared.buffer;
}

/** `b` itself, or a copy when it is a view of the reused read buffer. */
export function keep(b: Buffer): Buffer {
  return isTransient(b) ? Buffer.from(b) : b;
}

/** What a channel tells its owner. */
export interface ChannelHandler {
  /** Octets read: a view valid during this call (and its microtasks) only. */
  data(view: Buffer): void;
  /** The peer ended its side. */
  end(): void;
  /** The channel is gone (err: a socket error). Called once. */
  close(err: Error | undefined): void;
  /** Output that waited in the socket has been written. */
  drain(): void;
}

/** A connected byte stream as the HTTP/2 code uses it. */
export interface ByteChannel {
  /** Starts delivering reads to `handler` (octets read before are delivered first). */
  start(handler: ChannelHandler): void;
  /** Writes `octets` (a transient view is copied). */
  write(octets: Buffer): void;
  /** Octets written but not yet taken by the kernel. */
  readonly unsent: number;
  /** Whether writes still go out (not ended, not destroyed). */
  readonly writable: boolean;
  readonly destroyed: boolean;
  /** Ends our side once what is unsent is written. */
  end(): void;
  destroy(): void;
  /** Resolves when the socket has closed. */
  readonly closed: Promise<void>;
  /** The peer's address, when the socket has one (a unix socket: undefined). */
  readonly remoteAddress: string | undefined;
}

/** Channel events of a socket, wired once a handler is there. */
function wire(socket: Duplex, self: { deliverEnd(): void; deliverClose(err: Error | undefined): void; deliverDrain(): void }): Promise<void> {
  // A socket that ended or closed before it became a channel (a stream fallback) says so at once.
  if (socket.readableEnded) self.deliverEnd();
  else socket.on('end', () => self.deliverEnd());
  socket.on('error', (err: Error) => self.deliverClose(err));
  socket.on('drain', () => self.deliverDrain());
  if (socket.closed) {
    self.deliverClose(socket.errored ?? undefined);
    return Promise.resolve();
  }
  return new Promise((resolve) => socket.once('close', () => {
    self.deliverClose(undefined);
    resolve();
  }));
}

/** Shared by both kinds of channel: events held until start(), close reported once. */
abstract class ChannelBase implements ByteChannel {
  readonly socket: Duplex;
  readonly closed: Promise<void>;
  protected h: ChannelHandler | null = null;
  /** Events that came before start(). */
  #early: Array<(h: ChannelHandler) => void> = [];
  #closeSent = false;

  constructor(socket: Duplex) {
    this.socket = socket;
    this.closed = wire(socket, this);
  }

  start(handler: ChannelHandler): void {
    this.h = handler;
    const early = this.#early;
    this.#early = [];
    for (const e of early) e(handler);
  }

  /** Runs `fn` on the handler now, or at start(). */
  protected deliver(fn: (h: ChannelHandler) => void): void {
    if (this.h !== null) fn(this.h);
    else this.#early.push(fn);
  }

  deliverEnd(): void {
    this.deliver((h) => h.end());
  }

  deliverClose(err: Error | undefined): void {
    if (this.#closeSent) return;
    this.#closeSent = true;
    this.deliver((h) => h.close(err));
  }

  deliverDrain(): void {
    if (this.h !== null) this.h.drain();
  }

  write(octets: Buffer): void {
    this.socket.write(keep(octets));
  }

  get unsent(): number {
    return this.socket.writableLength;
  }

  get writable(): boolean {
    return !this.socket.destroyed && !this.socket.writableEnded;
  }

  get destroyed(): boolean {
    return this.socket.destroyed;
  }

  end(): void {
    this.socket.end();
  }

  destroy(): void {
    this.socket.destroy();
  }

  get remoteAddress(): string | undefined {
    return (this.socket as { remoteAddress?: string }).remoteAddress;
  }
}

/** A stream (any Duplex: a TLS socket, a test's pair) as a channel: reads are the stream's chunks, owned by the reader. */
export class StreamChannel extends ChannelBase {
  constructor(socket: Duplex) {
    super(socket);
    socket.on('data', (chunk: Buffer) => this.deliver((h) => h.data(chunk)));
    // Read, even from a socket that came paused.
    socket.resume();
  }
}

/** A net.Socket read through `onread` into the reused buffer. */
export class LeanSocket extends ChannelBase {
  declare readonly socket: net.Socket;
  /** False when the socket fell back to the stream path (adopt() without the internals it needs). */
  readonly lean: boolean;

  private constructor(socket: net.Socket, lean: boolean) {
    super(socket);
    this.lean = lean;
    if (!lean) socket.on('data', (chunk: Buffer) => this.deliver((h) => h.data(chunk)));
  }

  /** The read callback (onread): a view of the shared buffer to the handler, or a copy held until start(). */
  static #onRead(self: LeanSocket | null, nread: number, buf: Buffer): boolean {
    if (self === null) return true;
    if (self.h !== null) {
      self.h.data(buf.subarray(0, nread));
      return true;
    }
    const copy = Buffer.from(buf.subarray(0, nread));
    self.deliver((h) => h.data(copy));
    return true;
  }

  /** Connects to a unix socket path (or host/port options), reading lean. */
  static connect(target: string | net.TcpNetConnectOpts): LeanSocket {
    let self: LeanSocket | null = null;
    const opts = typeof target === 'string' ? { path: target } : target;
    const socket = net.connect({ ...opts, onread: { buffer: readBuffer(), callback: (n: number, b: Uint8Array) => LeanSocket.#onRead(self, n, b as Buffer) } });
    self = new LeanSocket(socket, true);
    return self;
  }

  /**
   * Takes a socket a server accepted with `pauseOnConnect` (nothing read yet) onto a new net.Socket
   * with `onread`. Node has no public way to give an accepted socket `onread`: its handle moves,
   * with the server's connection count (so server.close() still waits for it).
   */
  static adopt(accepted: net.Socket): LeanSocket {
    const handle = movableHandle(accepted);
    if (!handle || accepted.readableFlowing !== false) return LeanSocket.#asStream(accepted);
    return LeanSocket.#move(accepted, handle);
  }

  /**
   * Takes a connected client socket nobody has read from yet (one the netns helper connected and
   * handed over, or one Node connected) onto a new net.Socket with `onread`. Node may have started
   * reading it already: the read stops and the handle moves, unless Node holds octets or the end of
   * it already (then, and where the internals are missing, it is read as a stream: correct, slower).
   */
  static take(connected: net.Socket): LeanSocket {
    const handle = movableHandle(connected);
    const state = (connected as unknown as { _readableState?: { ended?: unknown } })._readableState;
    if (!handle || typeof handle.readStop !== 'function' || connected.connecting || connected.destroyed
      || connected.readableLength > 0 || state?.ended !== false) {
      return LeanSocket.#asStream(connected);
    }
    if (handle.reading) {
      handle.reading = false;
      handle.readStop();
    }
    return LeanSocket.#move(connected, handle);
  }

  /** A socket whose handle stays where it is, read as a stream. */
  static #asStream(socket: net.Socket): LeanSocket {
    socket.resume();
    return new LeanSocket(socket, false);
  }

  /** Moves `handle` from `old` onto a new net.Socket reading into the reused buffer. */
  static #move(old: net.Socket, handle: MovableHandle): LeanSocket {
    const inner = old as unknown as { _handle?: unknown; _server?: unknown; server?: unknown };
    let self: LeanSocket | null = null;
    inner._handle = null;
    const socket = new net.Socket({
      handle, readable: true, writable: true,
      onread: { buffer: readBuffer(), callback: (n: number, b: Uint8Array) => LeanSocket.#onRead(self, n, b as Buffer) },
    } as unknown as net.SocketConstructorOpts);
    const moved = socket as unknown as { _server?: unknown; server?: unknown };
    moved._server = inner._server;
    moved.server = inner.server;
    inner._server = null;
    inner.server = null;
    // The husk owns nothing now; destroyed so that nothing of it stays behind.
    old.destroy();
    self = new LeanSocket(socket, true);
    return self;
  }
}

/** The parts of a socket's handle (Node internals) a move needs. */
interface MovableHandle {
  readStart: () => number;
  readStop?: () => number;
  useUserBuffer: (b: Buffer) => void;
  reading?: boolean;
}

/** `socket`'s handle when it has what a move onto an `onread` socket needs. */
function movableHandle(socket: net.Socket): MovableHandle | undefined {
  const handle = (socket as unknown as { _handle?: Partial<MovableHandle> | null })._handle;
  return handle && typeof handle.readStart === 'function' && typeof handle.useUserBuffer === 'function' ? handle as MovableHandle : undefined;
}

/** A server whose connections come as lean sockets. */
export function leanServer(onConnection: (c: LeanSocket) => void): net.Server {
  return net.createServer({ pauseOnConnect: true }, (s) => onConnection(LeanSocket.adopt(s)));
}

/** A channel for `s`: itself if it is one, else the stream as a channel. */
export function channelOf(s: Duplex | ByteChannel): ByteChannel {
  return 'start' in s && typeof s.start === 'function' && 'unsent' in s ? s : new StreamChannel(s as Duplex);
}
