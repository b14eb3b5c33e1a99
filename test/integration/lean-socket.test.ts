/**
 * agent/io/lean-socket.ts on real unix sockets: reads come through the reused buffer (not the
 * stream path) on both connected and accepted sockets, arrive whole and in order however the
 * kernel splits them, stay valid through the microtasks of their read and no longer; writes of
 * such views are copies, large writes under a peer that does not read come through whole once it
 * reads (EAGAIN, partial writes, `drain`), and half-close, close and errors are reported once; a
 * socket adopt() cannot move is read as a stream, correctly; take() moves a connected socket Node
 * already reads, or reads it as a stream when Node holds octets or its end. An HTTP/2 connection that forwards
 * DATA waiting for a window keeps it intact while later reads reuse the buffer.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { isTransient, keep, LeanSocket, leanServer, READ_SIZE, StreamChannel, channelOf, type ChannelHandler } from '../../agent/io/lean-socket.ts';
import { duplexPair } from 'node:stream';
import { FrameSplitter, H2Connection } from '../../agent/http2/connection.ts';
import { encodeLiteralBlock } from '../../agent/http2/hpack.ts';
import { CLIENT_PREFACE, Flag, frameBytes, FrameType, Setting } from '../../agent/http2/wire.ts';
import { settingsFrame } from '../support/raw-h2.ts';

let dir: string;
let path: string;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'pa-lean-'));
  path = join(dir, 's.sock');
});
afterEach(() => rmSync(dir, { recursive: true, force: true }));

/** A handler that records what a channel reports; `reads` holds copies. */
function recorder(extra: Partial<ChannelHandler> = {}): ChannelHandler & { reads: Buffer[]; ended: number; closes: Array<Error | undefined>; drains: number; got(): Buffer } {
  const r = {
    reads: [] as Buffer[],
    ended: 0,
    closes: [] as Array<Error | undefined>,
    drains: 0,
    got: () => Buffer.concat(r.reads),
    data: (v: Buffer) => {
      r.reads.push(Buffer.from(v));
      extra.data?.(v);
    },
    end: () => {
      r.ended++;
      extra.end?.();
    },
    close: (err: Error | undefined) => r.closes.push(err),
    drain: () => {
      r.drains++;
    },
  };
  return r;
}

const until = async (cond: () => boolean, what: string): Promise<void> => {
  for (let i = 0; i < 2000 && !cond(); i++) await new Promise((r) => setTimeout(r, 10));
  if (!cond()) throw new Error(`never: ${what}`);
};

/** A lean server on `path` handing each accepted channel to `onConn`. */
async function listen(onConn: (c: LeanSocket) => void): Promise<net.Server> {
  const srv = leanServer(onConn);
  await new Promise<void>((r) => srv.listen(path, () => r()));
  return srv;
}

const pattern = (n: number): Buffer => {
  const b = Buffer.allocUnsafe(n);
  for (let i = 0; i < n; i++) b[i] = (i * 7 + (i >>> 8)) & 0xff;
  return b;
};

describe('LeanSocket', () => {
  it('reads an accepted and a connected socket through the reused buffer, whole and in order, both ways', async () => {
    const data = pattern(3 * 1024 * 1024 + 17);
    const serverSide = recorder();
    let accepted: LeanSocket | undefined;
    const srv = await listen((c) => {
      accepted = c;
      c.start(serverSide);
    });
    const clientSide = recorder();
    const client = LeanSocket.connect(path);
    client.start(clientSide);
    await until(() => accepted !== undefined, 'accepted');
    expect(accepted!.lean).toBe(true);
    expect(client.lean).toBe(true);
    client.write(data);
    accepted!.write(data.subarray(0, 1000));
    await until(() => serverSide.got().length === data.length && clientSide.got().length === 1000, 'all octets');
    expect(serverSide.got().equals(data)).toBe(true);
    expect(clientSide.got().equals(data.subarray(0, 1000))).toBe(true);
    // More than one read, none beyond the buffer: the octets came in reads of the reused buffer.
    expect(serverSide.reads.length).toBeGreaterThan(1);
    expect(Math.max(...serverSide.reads.map((b) => b.length))).toBeLessThanOrEqual(READ_SIZE);
    client.destroy();
    await until(() => serverSide.closes.length === 1, 'server side closed');
    await new Promise<void>((r) => srv.close(() => r()));
  });

  it('hands views of the reused buffer that hold through their microtasks, and copies any it writes', async () => {
    const data = pattern(2 * 1024 * 1024);
    let views = 0;
    let intactAfterMicrotask = 0;
    let notTransient = 0;
    const echoed: Buffer[] = [];
    let kept: Buffer | undefined;
    let keptCopy: Buffer | undefined;
    const srv = await listen((c) => c.start(recorder({
      data: (v) => {
        views++;
        if (!isTransient(v)) notTransient++;
        const copy = Buffer.from(v);
        // The first view, kept past its read (the mistake the contract forbids), and a keep() of it.
        if (kept === undefined) {
          kept = v;
          keptCopy = keep(v);
        }
        queueMicrotask(() => {
          if (v.equals(copy)) intactAfterMicrotask++;
        });
        // A write of the view: the socket must get a copy, the next read reuses the buffer.
        c.write(v);
      },
    })));
    const back = recorder({ data: (v) => echoed.push(Buffer.from(v)) });
    const client = LeanSocket.connect(path);
    client.start(back);
    client.write(data);
    await until(() => Buffer.concat(echoed).length === data.length, 'the echo');
    expect(Buffer.concat(echoed).equals(data)).toBe(true);
    expect(views).toBeGreaterThan(1);
    expect(notTransient).toBe(0);
    expect(intactAfterMicrotask).toBe(views);
    // The kept view was overwritten by a later read; keep()'s copy was not.
    expect(isTransient(keptCopy!)).toBe(false);
    expect(keptCopy!.equals(data.subarray(0, keptCopy!.length))).toBe(true);
    expect(kept!.equals(keptCopy!)).toBe(false);
    client.destroy();
    await new Promise<void>((r) => srv.close(() => r()));
  });

  it('writes through a peer that stops reading: unsent grows, drain comes, every octet arrives in order', async () => {
    const chunk = pattern(256 * 1024);
    let peer: net.Socket | undefined;
    // A plain server whose socket is paused: the kernel buffers fill and writes go EAGAIN / partial.
    const srv = net.createServer({ pauseOnConnect: true }, (s) => {
      peer = s;
    });
    await new Promise<void>((r) => srv.listen(path, () => r()));
    const h = recorder();
    const client = LeanSocket.connect(path);
    client.start(h);
    await until(() => peer !== undefined, 'accepted');
    for (let i = 0; i < 16; i++) client.write(chunk);
    await new Promise((r) => setTimeout(r, 50));
    expect(client.unsent).toBeGreaterThan(0);
    const got: Buffer[] = [];
    peer!.on('data', (d: Buffer) => got.push(d));
    peer!.resume();
    await until(() => Buffer.concat(got).length === 16 * chunk.length, 'every octet');
    const all = Buffer.concat(got);
    for (let i = 0; i < 16; i++) expect(all.subarray(i * chunk.length, (i + 1) * chunk.length).equals(chunk)).toBe(true);
    await until(() => h.drains > 0 && client.unsent === 0, 'drain');
    client.destroy();
    peer!.destroy();
    await new Promise<void>((r) => srv.close(() => r()));
  });

  it('reports the peer half-closing, then the close (our side ends too) once', async () => {
    const serverSide = recorder();
    const srv = await listen((c) => c.start(serverSide));
    const client = net.connect(path);
    await new Promise<void>((r) => client.once('connect', () => r()));
    client.end(Buffer.from('last words'));
    await until(() => serverSide.ended === 1 && serverSide.closes.length === 1, 'end and close');
    expect(serverSide.got().toString()).toBe('last words');
    expect(serverSide.closes).toEqual([undefined]);
    await new Promise((r) => setTimeout(r, 20));
    expect(serverSide.ended).toBe(1);
    expect(serverSide.closes).toHaveLength(1);
    client.destroy();
    await new Promise<void>((r) => srv.close(() => r()));
  });

  it('keeps an adopted socket counted as the server\'s connection: close() waits for it', async () => {
    const serverSide = recorder();
    let accepted: LeanSocket | undefined;
    const srv = await listen((c) => {
      accepted = c;
      c.start(serverSide);
    });
    const client = net.connect(path);
    await until(() => accepted !== undefined, 'accepted');
    let srvClosed = false;
    srv.close(() => {
      srvClosed = true;
    });
    await new Promise((r) => setTimeout(r, 50));
    expect(srvClosed).toBe(false);
    accepted!.destroy();
    await until(() => srvClosed, 'server closed');
    expect(serverSide.closes).toEqual([undefined]);
    client.destroy();
  });

  it('falls back to the stream path, whole and in order, for an accepted socket it cannot move (already reading)', async () => {
    let adopted: LeanSocket | undefined;
    const h = recorder();
    // Not paused on connect: Node reads it already, so its handle must stay where it is.
    const srv = net.createServer((s) => {
      adopted = LeanSocket.adopt(s);
      adopted.start(h);
    });
    await new Promise<void>((r) => srv.listen(path, () => r()));
    const data = pattern(300_000);
    const client = net.connect(path);
    client.write(data);
    await until(() => h.got().length === data.length, 'all octets');
    expect(adopted!.lean).toBe(false);
    expect(h.got().equals(data)).toBe(true);
    adopted!.write(Buffer.from('back'));
    const back = await new Promise<Buffer>((r) => client.once('data', r));
    expect(back.toString()).toBe('back');
    client.destroy();
    await until(() => h.closes.length === 1, 'closed');
    await new Promise<void>((r) => srv.close(() => r()));
  });

  it('takes a connected socket Node already reads onto the reused buffer; one it cannot move is read as a stream, nothing lost', async () => {
    const serverSides: net.Socket[] = [];
    const srv = net.createServer((s) => void serverSides.push(s));
    await new Promise<void>((r) => srv.listen(path, () => r()));
    const open = async (): Promise<[net.Socket, net.Socket]> => {
      const c = net.connect(path);
      await new Promise<void>((r) => c.once('connect', () => r()));
      await until(() => serverSides.length > 0, 'accepted');
      return [c, serverSides.shift() as net.Socket];
    };
    // Nothing read yet (Node's read has started): the handle moves, reads are views of the reused buffer.
    const [c1, s1] = await open();
    const lean = LeanSocket.take(c1);
    expect(lean.lean).toBe(true);
    let transient = 0;
    const h1 = recorder({ data: (v) => void (isTransient(v) && transient++) });
    lean.start(h1);
    s1.write('to the lean side');
    lean.write(Buffer.from('back'));
    const back = await new Promise<Buffer>((r) => s1.once('data', r));
    await until(() => h1.got().toString() === 'to the lean side', 'lean read');
    expect(back.toString()).toBe('back');
    expect(transient).toBe(h1.reads.length);
    s1.end();
    await until(() => h1.ended === 1 && h1.closes.length === 1, 'end and close');
    // Octets Node has read already: read as a stream, those octets first.
    const [c2, s2] = await open();
    s2.write('early ');
    await until(() => c2.readableLength > 0, 'read by Node');
    const held = LeanSocket.take(c2);
    expect(held.lean).toBe(false);
    const h2 = recorder();
    held.start(h2);
    s2.write('late');
    await until(() => h2.got().toString() === 'early late', 'both reads in order');
    // The peer's end read by Node before the take: the end and the close still come.
    const [c3, s3] = await open();
    s3.end();
    await until(() => c3.readableEnded, 'the end read by Node');
    const ended = LeanSocket.take(c3);
    const h3 = recorder();
    ended.start(h3);
    await until(() => h3.ended === 1 && h3.closes.length === 1, 'end and close of an ended socket');
    // A socket already gone: its close comes once.
    const [c4] = await open();
    c4.destroy();
    await until(() => c4.closed, 'closed');
    const gone = LeanSocket.take(c4);
    const h4 = recorder();
    gone.start(h4);
    await until(() => h4.closes.length === 1, 'close of a closed socket');
    for (const s of [...serverSides, s1, s2, s3]) s.destroy();
    held.destroy();
    await new Promise<void>((r) => srv.close(() => r()));
  });

  it('reports a failed connect as a close with its error, once', async () => {
    const h = recorder();
    const c = LeanSocket.connect(join(dir, 'nobody.sock'));
    c.start(h);
    await c.closed;
    await new Promise((r) => setTimeout(r, 10));
    expect(h.closes).toHaveLength(1);
    expect((h.closes[0] as NodeJS.ErrnoException).code).toBe('ENOENT');
    expect(c.writable).toBe(false);
  });

  it('holds what was read before start() and delivers it first', async () => {
    let accepted: LeanSocket | undefined;
    const srv = await listen((c) => {
      accepted = c;
    });
    const client = net.connect(path);
    client.write('early ');
    await until(() => accepted !== undefined, 'accepted');
    await new Promise((r) => setTimeout(r, 50));
    const h = recorder();
    accepted!.start(h);
    client.write('late');
    await until(() => h.got().toString() === 'early late', 'both reads');
    client.destroy();
    await new Promise<void>((r) => srv.close(() => r()));
  });
});

describe('channelOf', () => {
  it('takes a lean socket as it is and any other stream as a stream channel whose reads are owned', async () => {
    const [a, b] = duplexPair();
    const ch = channelOf(a);
    expect(ch).toBeInstanceOf(StreamChannel);
    const h = recorder({ data: (v) => expect(isTransient(v)).toBe(false) });
    ch.start(h);
    b.write('x');
    await until(() => h.got().toString() === 'x', 'read');
    ch.write(Buffer.from('y'));
    const got = await new Promise<Buffer>((r) => b.once('data', r));
    expect(got.toString()).toBe('y');
    const lean = LeanSocket.connect(join(dir, 'none.sock'));
    lean.start(recorder());
    expect(channelOf(lean)).toBe(lean);
    await lean.closed;
  });
});

describe('the HTTP/2 connection on lean sockets', () => {
  it('forwards DATA that waits for a window intact although later reads reuse the buffer it came in', async () => {
    // B: a client connection to a peer (Y) that grants no stream window until told; A: a server
    // connection whose DATA goes on to B as the shim's relay passes it (the frame as received).
    const yPath = join(dir, 'y.sock');
    const yFrames = new FrameSplitter(true);
    const forwarded: Buffer[] = [];
    let yEnded = false;
    let ySock: net.Socket | undefined;
    const y = net.createServer((s) => {
      ySock = s;
      s.write(settingsFrame([[Setting.INITIAL_WINDOW_SIZE, 0]]));
      s.on('data', (chunk: Buffer) => {
        yFrames.push(chunk);
        for (let f = yFrames.next(); f !== null; f = yFrames.next()) {
          if (f.type !== FrameType.DATA) continue;
          forwarded.push(Buffer.from(f.payload));
          if (f.flags & Flag.END_STREAM) yEnded = true;
        }
      });
    });
    await new Promise<void>((r) => y.listen(yPath, () => r()));
    const b = new H2Connection(LeanSocket.connect(yPath), { role: 'client', settings: {}, connectionWindow: 1 << 20 });
    const bClosed: Array<Error | undefined> = [];
    b.start({ headers: () => {}, data: () => {}, reset: () => {}, goaway: () => {}, closed: (err) => bClosed.push(err) });
    let bid = 0;
    let dataFrames = 0;
    const srv = await listen((c) => {
      const a: H2Connection = new H2Connection(c, { role: 'server', settings: { maxConcurrentStreams: 10 }, connectionWindow: 1 << 20 });
      a.start({
        headers: (_id, fields, endStream) => {
          bid = b.request(fields, endStream);
        },
        data: (_id, f, payload, endStream) => {
          dataFrames++;
          b.data(bid, payload, endStream, a, f.payload.length, f.raw);
        },
        reset: () => {},
        goaway: () => {},
        closed: () => {},
      });
    });
    const peer = net.connect(path);
    peer.on('data', () => {});
    const headers = encodeLiteralBlock([{ name: ':method', value: 'POST' }, { name: ':scheme', value: 'http' }, { name: ':path', value: '/x' }, { name: ':authority', value: 'a' }]);
    const p1 = pattern(10_000);
    const p2 = Buffer.alloc(10_000, 0x5a);
    peer.write(Buffer.concat([CLIENT_PREFACE, frameBytes(FrameType.SETTINGS, 0, 0), frameBytes(FrameType.HEADERS, Flag.END_HEADERS, 1, headers), frameBytes(FrameType.DATA, 0, 1, p1)]));
    await until(() => dataFrames === 1, 'the first DATA forwarded');
    // Reads of other octets into the same buffer while the first DATA waits for Y's window.
    for (let i = 0; i < 20; i++) {
      peer.write(frameBytes(FrameType.PING, 0, 0, Buffer.alloc(8, i)));
      await new Promise((r) => setTimeout(r, 2));
    }
    peer.write(frameBytes(FrameType.DATA, Flag.END_STREAM, 1, p2));
    await until(() => dataFrames === 2, 'the second DATA forwarded');
    expect(forwarded).toHaveLength(0);
    ySock!.write(frameBytes(FrameType.WINDOW_UPDATE, 0, bid, Buffer.from([0, 1, 0, 0])));
    await until(() => yEnded, 'both DATA at Y');
    expect(Buffer.concat(forwarded).equals(Buffer.concat([p1, p2]))).toBe(true);
    expect(bClosed).toEqual([]);
    peer.destroy();
    b.destroy();
    ySock!.destroy();
    await new Promise<void>((r) => srv.close(() => r()));
    await new Promise<void>((r) => y.close(() => r()));
  });
});
