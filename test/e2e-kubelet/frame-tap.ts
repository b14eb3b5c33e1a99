/**
 * A byte-for-byte unix-socket pipe between the shim and containerd that reads the HTTP/2 frame
 * headers going by: containerd does not log the GOAWAYs it sends (its grpc-go logger is silenced),
 * so this is where `too_many_pings` shows. It changes no octet and keeps each direction's
 * backpressure (pipe).
 */
import { existsSync, unlinkSync } from 'node:fs';
import * as net from 'node:net';

const PREFACE_LEN = 24;
const FRAME_PING = 6;
const FRAME_GOAWAY = 7;
const FLAG_ACK = 1;
const H2_ERRORS = ['NO_ERROR', 'PROTOCOL_ERROR', 'INTERNAL_ERROR', 'FLOW_CONTROL_ERROR', 'SETTINGS_TIMEOUT', 'STREAM_CLOSED', 'FRAME_SIZE_ERROR',
  'REFUSED_STREAM', 'CANCEL', 'COMPRESSION_ERROR', 'CONNECT_ERROR', 'ENHANCE_YOUR_CALM', 'INADEQUATE_SECURITY', 'HTTP_1_1_REQUIRED'];

export interface TapCounts {
  /** Connections the shim opened to the runtime. */
  connections: number;
  /** PINGs (not ACKs) from the shim to the runtime. */
  pingsToRuntime: number;
  /** PINGs (not ACKs) from the runtime to the shim. */
  pingsFromRuntime: number;
  /** GOAWAYs from the runtime, by "ERROR_CODE debug-data". */
  goaways: Map<string, number>;
}

export interface FrameTap {
  readonly counts: TapCounts;
  close(): Promise<void>;
}

/** Reads frame headers out of one direction of a connection; `skip` octets first (the client preface). */
class FrameScanner {
  #skip: number;
  #head = Buffer.alloc(0);
  /** Payload octets still to pass over, or to collect when `#want` is set. */
  #left = 0;
  #want: { type: number; flags: number; parts: Buffer[] } | null = null;
  readonly #onFrame: (type: number, flags: number, payload: Buffer | null) => void;

  constructor(skip: number, onFrame: (type: number, flags: number, payload: Buffer | null) => void) {
    this.#skip = skip;
    this.#onFrame = onFrame;
  }

  push(chunk: Buffer): void {
    let pos = 0;
    while (pos < chunk.length) {
      if (this.#skip > 0) {
        const n = Math.min(this.#skip, chunk.length - pos);
        this.#skip -= n;
        pos += n;
        continue;
      }
      if (this.#left > 0) {
        const n = Math.min(this.#left, chunk.length - pos);
        this.#want?.parts.push(chunk.subarray(pos, pos + n));
        this.#left -= n;
        pos += n;
        if (this.#left === 0 && this.#want) {
          this.#onFrame(this.#want.type, this.#want.flags, Buffer.concat(this.#want.parts));
          this.#want = null;
        }
        continue;
      }
      const need = 9 - this.#head.length;
      const n = Math.min(need, chunk.length - pos);
      this.#head = Buffer.concat([this.#head, chunk.subarray(pos, pos + n)]);
      pos += n;
      if (this.#head.length < 9) continue;
      const len = this.#head.readUIntBE(0, 3);
      const type = this.#head[3]!;
      const flags = this.#head[4]!;
      this.#head = Buffer.alloc(0);
      // Only PING and GOAWAY payloads are read; every other payload is passed over.
      const keep = type === FRAME_PING || type === FRAME_GOAWAY;
      if (len === 0) {
        this.#onFrame(type, flags, keep ? Buffer.alloc(0) : null);
        continue;
      }
      this.#left = len;
      if (keep) this.#want = { type, flags, parts: [] };
      else this.#onFrame(type, flags, null);
    }
  }
}

/** Listens on `listenPath` and carries every connection to `targetPath`. */
export async function startFrameTap(listenPath: string, targetPath: string): Promise<FrameTap> {
  const counts: TapCounts = { connections: 0, pingsToRuntime: 0, pingsFromRuntime: 0, goaways: new Map() };
  const sockets = new Set<net.Socket>();
  const server = net.createServer((down) => {
    counts.connections++;
    const up = net.connect(targetPath);
    sockets.add(down);
    sockets.add(up);
    const toRuntime = new FrameScanner(PREFACE_LEN, (type, flags) => {
      if (type === FRAME_PING && !(flags & FLAG_ACK)) counts.pingsToRuntime++;
    });
    const fromRuntime = new FrameScanner(0, (type, flags, payload) => {
      if (type === FRAME_PING && !(flags & FLAG_ACK)) counts.pingsFromRuntime++;
      if (type === FRAME_GOAWAY && payload && payload.length >= 8) {
        const code = payload.readUInt32BE(4);
        const key = `${H2_ERRORS[code] ?? `0x${code.toString(16)}`} ${payload.subarray(8).toString('latin1') || '(no debug data)'}`;
        counts.goaways.set(key, (counts.goaways.get(key) ?? 0) + 1);
      }
    });
    down.on('data', (c: Buffer) => toRuntime.push(c));
    up.on('data', (c: Buffer) => fromRuntime.push(c));
    down.pipe(up);
    up.pipe(down);
    const end = (): void => {
      down.destroy();
      up.destroy();
      sockets.delete(down);
      sockets.delete(up);
    };
    down.on('error', end).on('close', end);
    up.on('error', end).on('close', end);
  });
  if (existsSync(listenPath)) unlinkSync(listenPath);
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(listenPath, () => resolve());
  });
  return {
    counts,
    close: () => new Promise<void>((resolve) => {
      for (const s of sockets) s.destroy();
      server.close(() => resolve());
    }),
  };
}

/** "ENHANCE_YOUR_CALM too_many_pings: 3, NO_ERROR (no debug data): 1", or "none". */
export function goawaySummary(m: Map<string, number>): string {
  return m.size === 0 ? 'none' : [...m].sort((a, b) => b[1] - a[1]).map(([k, v]) => `${k}: ${v}`).join(', ');
}
