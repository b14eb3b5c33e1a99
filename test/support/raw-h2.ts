/**
 * A bare HTTP/2 gRPC client for one unary call with exactly the request headers a test gives it,
 * for what no gRPC library sends: a request without `:authority` at all (grpc-js, grpc-go and
 * Node's http2 client always send one). Frames and HPACK are the shim's own modules; the answer
 * (status, messages, trailers, a reset) is returned as the server sent it. Also the SETTINGS
 * frames raw test peers write and read.
 */
import * as net from 'node:net';
import { FrameSplitter, HeaderBlockJoiner } from '../../agent/http2/connection.ts';
import { CLIENT_PREFACE, Flag, frameBytes, FrameType } from '../../agent/http2/wire.ts';
import { encodeLiteralBlock, HpackDecoder, type HeaderField } from '../../agent/http2/hpack.ts';

/** What came back on the call's stream. */
export interface RawAnswer {
  headers: HeaderField[];
  trailers: HeaderField[];
  /** gRPC messages (length prefixes removed). */
  messages: Buffer[];
  /** RST_STREAM error code, when the server reset the stream. */
  rstCode?: number;
  /** GOAWAY error code, when the server closed the connection. */
  goawayCode?: number;
}

/** The gRPC request headers for `path`, with `authority` (or none at all when undefined). */
export function grpcRequestHeaders(path: string, authority: string | undefined): HeaderField[] {
  const h: HeaderField[] = [{ name: ':method', value: 'POST' }, { name: ':scheme', value: 'http' }, { name: ':path', value: path }];
  if (authority !== undefined) h.push({ name: ':authority', value: authority });
  h.push({ name: 'content-type', value: 'application/grpc' }, { name: 'te', value: 'trailers' });
  return h;
}

/** Makes one unary gRPC call on a new connection to `socketPath`. */
export function rawUnary(socketPath: string, headers: HeaderField[], message: Buffer, timeoutMs = 10_000): Promise<RawAnswer> {
  return new Promise((resolve, reject) => {
    const sock = net.connect(socketPath);
    const reader = new FrameSplitter(false);
    const blocks = new HeaderBlockJoiner(1 << 20);
    const decoder = new HpackDecoder({ maxTableSize: 4096, maxHeaderListSize: 1 << 20 });
    const answer: RawAnswer = { headers: [], trailers: [], messages: [] };
    let data = Buffer.alloc(0);
    const timer = setTimeout(() => finish(new Error(`no answer in ${timeoutMs} ms`)), timeoutMs);
    const finish = (err?: Error): void => {
      clearTimeout(timer);
      sock.destroy();
      if (err) {
        reject(err);
        return;
      }
      for (let o = 0; o + 5 <= data.length;) {
        const len = data.readUInt32BE(o + 1);
        answer.messages.push(data.subarray(o + 5, o + 5 + len));
        o += 5 + len;
      }
      resolve(answer);
    };
    sock.on('error', (err) => finish(err));
    sock.on('close', () => finish(new Error('connection closed before the call ended')));
    sock.on('data', (chunk: Buffer) => {
      reader.push(chunk);
      for (let f = reader.next(); f !== null; f = reader.next()) {
        if (f.type === FrameType.SETTINGS && !(f.flags & Flag.ACK)) sock.write(frameBytes(FrameType.SETTINGS, Flag.ACK, 0, Buffer.alloc(0)));
        else if (f.type === FrameType.PING && !(f.flags & Flag.ACK)) sock.write(frameBytes(FrameType.PING, Flag.ACK, 0, f.payload));
        else if (f.type === FrameType.GOAWAY) {
          answer.goawayCode = f.payload.readUInt32BE(4);
          finish();
          return;
        } else if (f.streamId === 1 && f.type === FrameType.RST_STREAM) {
          answer.rstCode = f.payload.readUInt32BE(0);
          finish();
          return;
        } else if (f.streamId === 1 && (f.type === FrameType.HEADERS || f.type === FrameType.CONTINUATION)) {
          const h = blocks.take(f);
          if (h === null) continue;
          const fields = decoder.decode(h.block);
          if (answer.headers.length === 0) answer.headers = fields;
          else answer.trailers = fields;
          if (h.endStream) {
            if (answer.trailers.length === 0) answer.trailers = fields;
            finish();
            return;
          }
        } else if (f.streamId === 1 && f.type === FrameType.DATA) {
          data = Buffer.concat([data, f.payload]);
          if (f.flags & Flag.END_STREAM) {
            finish();
            return;
          }
        }
      }
    });
    const prefix = Buffer.alloc(5);
    prefix.writeUInt32BE(message.length, 1);
    sock.write(Buffer.concat([
      CLIENT_PREFACE,
      frameBytes(FrameType.SETTINGS, 0, 0, Buffer.alloc(0)),
      frameBytes(FrameType.HEADERS, Flag.END_HEADERS, 1, encodeLiteralBlock(headers)),
      frameBytes(FrameType.DATA, Flag.END_STREAM, 1, Buffer.concat([prefix, message])),
    ]));
  });
}

/** A SETTINGS frame with these entries ([identifier, value]), as a raw peer writes one. */
export function settingsFrame(entries: ReadonlyArray<readonly [number, number]>): Buffer {
  const p = Buffer.alloc(6 * entries.length);
  entries.forEach(([id, v], i) => {
    p.writeUInt16BE(id, i * 6);
    p.writeUInt32BE(v, i * 6 + 2);
  });
  return frameBytes(FrameType.SETTINGS, 0, 0, p);
}

/** The entries of a SETTINGS frame's payload. */
export function parseSettings(payload: Buffer): Array<[number, number]> {
  const out: Array<[number, number]> = [];
  for (let i = 0; i + 6 <= payload.length; i += 6) out.push([payload.readUInt16BE(i), payload.readUInt32BE(i + 2)]);
  return out;
}

/** A header's value, or undefined. */
export function headerValue(fields: HeaderField[], name: string): string | undefined {
  return fields.find((f) => f.name === name)?.value;
}
