/**
 * A frame tap on a unix socket: listens on `listenPath`, connects each accepted connection to
 * `targetPath` and copies the octets both ways unchanged, while reading the HTTP/2 frame headers
 * of each direction. Put between the shim and the runtime, it shows what the runtime did to the
 * shim's connections (GOAWAY and its reason) and which connection-level frames crossed the shim
 * (PINGs from the shim), as the tap behind issue 24's diagnosis did.
 */
import * as net from 'node:net';
import { rmSync } from 'node:fs';

const PREFACE_LEN = 24;
const DATA = 0x0;
const HEADERS = 0x1;
const CONTINUATION = 0x9;
const PADDED = 0x8;
const PRIORITY = 0x20;
const PING = 0x6;
const GOAWAY = 0x7;
const ACK = 0x1;

/** What crossed the tap so far. */
export interface TapCounts {
  connections: number;
  /** GOAWAY frames the target (runtime) sent, with their error code and debug data. */
  goawaysFromTarget: { conn: number; code: number; debug: string }[];
  /** PINGs (not ACKs) the client (the shim) sent to the target. */
  pingsToTarget: number;
  /** PINGs (not ACKs) the target sent to the client. */
  pingsFromTarget: number;
  /** DATA payloads the client sent the target, in order (kept only with `captureData`). */
  dataToTarget: Buffer[];
  /** Header blocks the target sent the client, padding and priority removed, in order (kept only with `captureHeaders`). */
  headersFromTarget: Buffer[];
}

/** A HEADERS frame's block fragment: its payload without padding and priority fields. */
function headerFragment(flags: number, payload: Buffer): Buffer {
  let start = 0;
  let end = payload.length;
  if (flags & PADDED) {
    end -= payload[0]!;
    start = 1;
  }
  if (flags & PRIORITY) start += 5;
  return Buffer.from(payload.subarray(start, end));
}

/** Reads frame headers out of one direction's octets; `onFrame` gets GOAWAY and PING payloads whole. */
class FrameScanner {
  #skip: number;
  #buf: Buffer = Buffer.alloc(0);
  readonly #onFrame: (type: number, flags: number, payload: Buffer) => void;
  constructor(skip: number, onFrame: (type: number, flags: number, payload: Buffer) => void) {
    this.#skip = skip;
    this.#onFrame = onFrame;
  }
  push(chunk: Buffer): void {
    if (this.#skip > 0) {
      const n = Math.min(this.#skip, chunk.length);
      this.#skip -= n;
      chunk = chunk.subarray(n);
    }
    this.#buf = this.#buf.length ? Buffer.concat([this.#buf, chunk]) : chunk;
    while (this.#buf.length >= 9) {
      const len = this.#buf.readUIntBE(0, 3);
      if (this.#buf.length < 9 + len) break;
      this.#onFrame(this.#buf[3]!, this.#buf[4]!, this.#buf.subarray(9, 9 + len));
      this.#buf = this.#buf.subarray(9 + len);
    }
    // Keep no reference to a large consumed chunk.
    if (this.#buf.length > 0 && this.#buf.length < 9) this.#buf = Buffer.from(this.#buf);
  }
}

/** A running tap. */
export class H2Tap {
  readonly counts: TapCounts = { connections: 0, goawaysFromTarget: [], pingsToTarget: 0, pingsFromTarget: 0, dataToTarget: [], headersFromTarget: [] };
  readonly #server: net.Server;
  readonly #sockets = new Set<net.Socket>();
  readonly listenPath: string;

  private constructor(listenPath: string, targetPath: string, captureData: boolean, captureHeaders: boolean) {
    this.listenPath = listenPath;
    this.#server = net.createServer((client) => {
      const conn = ++this.counts.connections;
      const target = net.connect(targetPath);
      for (const s of [client, target]) {
        this.#sockets.add(s);
        s.on('close', () => this.#sockets.delete(s));
        // Either side gone: the other goes too, as it would without the tap.
        s.on('error', () => {
          client.destroy();
          target.destroy();
        });
      }
      const up = new FrameScanner(PREFACE_LEN, (type, flags, payload) => {
        if (type === PING && !(flags & ACK)) this.counts.pingsToTarget++;
        else if (type === DATA && captureData) this.counts.dataToTarget.push(Buffer.from(payload));
      });
      const down = new FrameScanner(0, (type, flags, payload) => {
        if (type === GOAWAY) this.counts.goawaysFromTarget.push({ conn, code: payload.length >= 8 ? payload.readUInt32BE(4) : -1, debug: payload.subarray(8).toString('latin1') });
        else if (type === PING && !(flags & ACK)) this.counts.pingsFromTarget++;
        else if (type === HEADERS && captureHeaders) this.counts.headersFromTarget.push(headerFragment(flags, payload));
        else if (type === CONTINUATION && captureHeaders) {
          const i = this.counts.headersFromTarget.length - 1;
          if (i >= 0) this.counts.headersFromTarget[i] = Buffer.concat([this.counts.headersFromTarget[i]!, payload]);
        }
      });
      client.on('data', (d: Buffer) => up.push(d));
      target.on('data', (d: Buffer) => down.push(d));
      client.pipe(target);
      target.pipe(client);
    });
  }

  /**
   * Starts a tap on `listenPath` in front of `targetPath` (`captureData`: keep the DATA the client
   * sends; `captureHeaders`: keep the header blocks the target sends).
   */
  static async start(listenPath: string, targetPath: string, captureData = false, captureHeaders = false): Promise<H2Tap> {
    rmSync(listenPath, { force: true });
    const tap = new H2Tap(listenPath, targetPath, captureData, captureHeaders);
    await new Promise<void>((resolve, reject) => {
      tap.#server.once('error', reject);
      tap.#server.listen(listenPath, resolve);
    });
    return tap;
  }

  async close(): Promise<void> {
    for (const s of this.#sockets) s.destroy();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }
}
