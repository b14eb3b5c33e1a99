/**
 * agent/http2/writer.ts on a real stream.Duplex: frames go out in the order queued, once per turn,
 * frames back to back in one buffer as one view; backpressure (`blocked`) and the cut of a peer
 * that does not read (`onOverflow`).
 */
import { Duplex } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { FrameWriter, HIGH_WATER } from '../../agent/http2/writer.ts';

/** A socket-like duplex that records each write; `hold` keeps writes unacknowledged (a peer that does not read). */
function sink(hold = false): { socket: Duplex; writes: Buffer[] } {
  const writes: Buffer[] = [];
  const socket = new Duplex({
    read() {},
    write(chunk: Buffer, _enc, cb) {
      writes.push(chunk);
      if (!hold) cb();
    },
    highWaterMark: 16,
  });
  return { socket, writes };
}

const turn = (): Promise<void> => new Promise((r) => setImmediate(r));
const hooks = { beforeWrite: () => {}, onOverflow: () => {} };

describe('FrameWriter', () => {
  it('writes what a turn queued once, in order', async () => {
    const { socket, writes } = sink();
    const w = new FrameWriter(socket, 1 << 20, hooks);
    w.push(Buffer.from('a'));
    w.push(Buffer.from('bb'));
    w.push(Buffer.from('ccc'));
    expect(writes).toHaveLength(0);
    await turn();
    expect(writes.map(String)).toEqual(['abbccc']);
    w.push(Buffer.from('d'));
    await turn();
    expect(writes.map(String)).toEqual(['abbccc', 'd']);
  });

  it('joins frames back to back in one buffer as one view, without a copy', async () => {
    const { socket, writes } = sink();
    const w = new FrameWriter(socket, 1 << 20, hooks);
    const read = Buffer.from('0123456789');
    w.push(read.subarray(0, 3));
    w.push(read.subarray(3, 7));
    w.push(read.subarray(7));
    await turn();
    expect(writes).toHaveLength(1);
    expect(String(writes[0])).toBe('0123456789');
    expect(writes[0]!.buffer).toBe(read.buffer);
    expect(writes[0]!.byteOffset).toBe(read.byteOffset);
  });

  it('keeps the order when views and other frames mix', async () => {
    const { socket, writes } = sink();
    const w = new FrameWriter(socket, 1 << 20, hooks);
    const read = Buffer.from('ABCDEF');
    w.push(read.subarray(0, 2));
    w.push(Buffer.from('x'));
    w.push(read.subarray(2, 4));
    w.push(read.subarray(4));
    w.push(read.subarray(0, 1)); // not adjacent to what precedes it
    await turn();
    expect(writes.map(String)).toEqual(['ABxCDEFA']);
  });

  it('add() queues without scheduling; the next write takes it first', async () => {
    const { socket, writes } = sink();
    const w = new FrameWriter(socket, 1 << 20, hooks);
    w.add(Buffer.from('preface'));
    await turn();
    expect(writes).toHaveLength(0);
    w.push(Buffer.from('+settings'));
    await turn();
    expect(writes.map(String)).toEqual(['preface+settings']);
  });

  it('lets the connection add a last frame at each write (the connection credit), told whether others go', async () => {
    const { socket, writes } = sink();
    const seen: boolean[] = [];
    const w = new FrameWriter(socket, 1 << 20, {
      beforeWrite: (queued) => {
        seen.push(queued);
        w.add(Buffer.from('!'));
      },
      onOverflow: () => {},
    });
    w.push(Buffer.from('x'));
    await turn();
    w.schedule();
    await turn();
    expect(seen).toEqual([true, false]);
    expect(writes.map(String)).toEqual(['x!', '!']);
  });

  it('is blocked while the socket holds HIGH_WATER octets', async () => {
    const { socket } = sink(true);
    const w = new FrameWriter(socket, 1 << 30, hooks);
    expect(w.blocked).toBe(false);
    w.push(Buffer.alloc(HIGH_WATER - 1));
    await turn();
    expect(w.blocked).toBe(false);
    w.push(Buffer.alloc(1));
    await turn();
    expect(w.blocked).toBe(true);
  });

  it('reports a peer that does not read once its unsent octets pass maxBufferedOutput', async () => {
    const { socket } = sink(true);
    const overflows: number[] = [];
    const w = new FrameWriter(socket, 1000, { beforeWrite: () => {}, onOverflow: (n) => overflows.push(n) });
    w.push(Buffer.alloc(1000));
    await turn();
    expect(overflows).toEqual([]);
    w.push(Buffer.alloc(1));
    await turn();
    expect(overflows).toEqual([1001]);
  });

  it('writes nothing once closed, or once the socket ended', async () => {
    const a = sink();
    const w = new FrameWriter(a.socket, 1 << 20, hooks);
    w.push(Buffer.from('lost'));
    w.close();
    w.push(Buffer.from('also lost'));
    await turn();
    w.flush();
    expect(a.writes).toHaveLength(0);

    const b = sink();
    const w2 = new FrameWriter(b.socket, 1 << 20, hooks);
    b.socket.end();
    w2.push(Buffer.from('after end'));
    await turn();
    expect(b.writes).toHaveLength(0);
  });
});
