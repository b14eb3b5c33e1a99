/**
 * agent/http2/flow-control.ts: the window rules on their own (RFC 9113 5.2, 6.9), and through the
 * connection core (connection.ts) against a raw peer writing frames by hand: DATA waits for the
 * windows, and SETTINGS_INITIAL_WINDOW_SIZE moves an open stream's window, below zero too.
 */
import { duplexPair } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { checkInitialWindowSize, FlowControl, type StreamWindows } from '../../agent/http2/flow-control.ts';
import { H2Connection } from '../../agent/http2/connection.ts';
import { encodeLiteralBlock } from '../../agent/http2/hpack.ts';
import { CLIENT_PREFACE, DEFAULT_WINDOW, frameBytes, FrameType, H2ConnectionError, H2Error, MAX_WINDOW, Setting } from '../../agent/http2/wire.ts';

const stream = (sendWindow = DEFAULT_WINDOW, recvWindow = DEFAULT_WINDOW): StreamWindows => ({ sendWindow, recvWindow, unacked: 0 });

function connectionError(fn: () => void): H2ConnectionError {
  try {
    fn();
  } catch (err) {
    if (err instanceof H2ConnectionError) return err;
    throw err;
  }
  throw new Error('no connection error');
}

describe('sending: the peer\'s windows', () => {
  it('DATA gets the least of the connection window, the stream window and the frame size', () => {
    const fc = new FlowControl(DEFAULT_WINDOW);
    expect(fc.room(stream(), 16_384)).toBe(16_384);
    expect(fc.room(stream(1000), 16_384)).toBe(1000);
    fc.charge(stream(), DEFAULT_WINDOW - 10);
    expect(fc.sendWindow).toBe(10);
    expect(fc.room(stream(), 16_384)).toBe(10);
  });

  it('charges both windows, and DATA is blocked until a WINDOW_UPDATE opens them', () => {
    const fc = new FlowControl(DEFAULT_WINDOW);
    const s = stream(100);
    fc.charge(s, 100);
    expect(s.sendWindow).toBe(0);
    expect(fc.sendWindow).toBe(DEFAULT_WINDOW - 100);
    expect(fc.room(s, 16_384)).toBe(0);
    expect(fc.streamUpdate(s, 30)).toBe(0);
    expect(fc.room(s, 16_384)).toBe(30);
    fc.charge(stream(), fc.sendWindow);
    expect(fc.sendWindow).toBe(0);
    expect(fc.room(s, 16_384)).toBe(0);
    expect(fc.room(stream(), 16_384)).toBe(0);
    fc.connectionUpdate(5);
    expect(fc.room(stream(), 16_384)).toBe(5);
  });

  it.each([
    { what: 'WINDOW_UPDATE of 0 on the connection is a PROTOCOL_ERROR', inc: 0, code: H2Error.PROTOCOL_ERROR },
    { what: 'a connection window beyond 2^31-1 is a FLOW_CONTROL_ERROR', inc: MAX_WINDOW - DEFAULT_WINDOW + 1, code: H2Error.FLOW_CONTROL_ERROR },
  ])('$what (a connection error)', ({ inc, code }) => {
    expect(connectionError(() => new FlowControl(DEFAULT_WINDOW).connectionUpdate(inc)).code).toBe(code);
  });

  it('a connection window of exactly 2^31-1 is allowed', () => {
    const fc = new FlowControl(DEFAULT_WINDOW);
    fc.connectionUpdate(MAX_WINDOW - DEFAULT_WINDOW);
    expect(fc.sendWindow).toBe(MAX_WINDOW);
  });

  it.each([
    { what: 'WINDOW_UPDATE of 0 on a stream is its PROTOCOL_ERROR', start: DEFAULT_WINDOW, inc: 0, code: H2Error.PROTOCOL_ERROR },
    { what: 'a stream window beyond 2^31-1 is its FLOW_CONTROL_ERROR', start: DEFAULT_WINDOW, inc: MAX_WINDOW - DEFAULT_WINDOW + 1, code: H2Error.FLOW_CONTROL_ERROR },
    { what: 'exactly 2^31-1 is no error', start: DEFAULT_WINDOW, inc: MAX_WINDOW - DEFAULT_WINDOW, code: 0 },
    { what: 'a negative window may be raised', start: -500, inc: 200, code: 0 },
  ])('$what (a stream error: the code is returned)', ({ start, inc, code }) => {
    expect(new FlowControl(DEFAULT_WINDOW).streamUpdate(stream(start), inc)).toBe(code);
  });

  it('SETTINGS_INITIAL_WINDOW_SIZE moves every open stream\'s window by the change, below zero too (6.9.2)', () => {
    const fc = new FlowControl(DEFAULT_WINDOW);
    const a = stream(DEFAULT_WINDOW);
    const b = stream(100);
    fc.peerInitialWindow([a, b], 1000 - DEFAULT_WINDOW);
    expect(a.sendWindow).toBe(1000);
    expect(b.sendWindow).toBe(100 - DEFAULT_WINDOW + 1000);
    expect(b.sendWindow).toBeLessThan(0);
    expect(fc.room(b, 16_384)).toBeLessThan(0);
    expect(fc.sendWindow).toBe(DEFAULT_WINDOW); // the connection window is not a SETTINGS matter
    fc.peerInitialWindow([a, b], 50_000);
    expect(a.sendWindow).toBe(51_000);
  });

  it('SETTINGS_INITIAL_WINDOW_SIZE that overflows a stream window is a FLOW_CONTROL_ERROR', () => {
    const fc = new FlowControl(DEFAULT_WINDOW);
    expect(connectionError(() => fc.peerInitialWindow([stream(MAX_WINDOW - 10)], 11)).code).toBe(H2Error.FLOW_CONTROL_ERROR);
  });

  it.each([
    { v: MAX_WINDOW, ok: true },
    { v: MAX_WINDOW + 1, ok: false },
    { v: 0, ok: true },
  ])('SETTINGS_INITIAL_WINDOW_SIZE $v accepted: $ok', ({ v, ok }) => {
    if (ok) expect(() => checkInitialWindowSize(v)).not.toThrow();
    else expect(connectionError(() => checkInitialWindowSize(v)).code).toBe(H2Error.FLOW_CONTROL_ERROR);
  });
});

describe('receiving: our windows', () => {
  it('DATA within the connection window is taken, beyond it a FLOW_CONTROL_ERROR', () => {
    const fc = new FlowControl(1000);
    fc.received(600);
    fc.received(400);
    expect(fc.recvWindow).toBe(0);
    expect(connectionError(() => fc.received(1)).code).toBe(H2Error.FLOW_CONTROL_ERROR);
  });

  it('opens a connection window beyond the default with the preface\'s WINDOW_UPDATE', () => {
    expect(new FlowControl(1 << 20).prefaceIncrement).toBe((1 << 20) - DEFAULT_WINDOW);
    expect(new FlowControl(DEFAULT_WINDOW).prefaceIncrement).toBe(0);
    expect(new FlowControl(1000).prefaceIncrement).toBe(0);
  });

  it.each([
    { what: 'a full batch goes at once', batch: 20_000, consumed: 20_000, withOutput: false, credit: 20_000 },
    { what: 'less than a batch waits', batch: 20_000, consumed: 19_999, withOutput: false, credit: 0 },
    { what: 'less than a batch rides along with other output', batch: 20_000, consumed: 4096, withOutput: true, credit: 4096 },
    { what: 'but not a few octets', batch: 20_000, consumed: 4095, withOutput: true, credit: 0 },
    { what: 'nothing consumed, nothing sent', batch: 20_000, consumed: 0, withOutput: true, credit: 0 },
  ])('connection credit: $what', ({ batch, consumed, withOutput, credit }) => {
    const fc = new FlowControl(1 << 20, batch);
    fc.received(consumed);
    const due = consumed > 0 && fc.consumed(consumed);
    expect(due).toBe(consumed >= batch);
    expect(fc.connectionCredit(withOutput)).toBe(credit);
    expect(fc.recvWindow).toBe((1 << 20) - consumed + credit);
    expect(fc.unacked).toBe(consumed - credit);
  });

  it('the default batch is a quarter of the window, at least 16 KiB', () => {
    expect(new FlowControl(1 << 20).creditBatch).toBe(1 << 18);
    expect(new FlowControl(DEFAULT_WINDOW).creditBatch).toBe(16_384);
  });

  it('a stream\'s window comes back once the peer has half of it or less, while it still sends', () => {
    const fc = new FlowControl(1 << 20);
    const s = stream(DEFAULT_WINDOW, DEFAULT_WINDOW);
    fc.receivedOn(s, 30_000);
    fc.consumed(30_000, s);
    expect(fc.refill(s, DEFAULT_WINDOW, false)).toBe(0); // 35,535 left: more than half
    fc.receivedOn(s, 10_000);
    fc.consumed(10_000, s);
    expect(fc.refill(s, DEFAULT_WINDOW, true)).toBe(0); // the peer ended: nothing to give back
    expect(fc.refill(s, DEFAULT_WINDOW, false)).toBe(40_000);
    expect(s.recvWindow).toBe(DEFAULT_WINDOW);
    expect(s.unacked).toBe(0);
    expect(fc.refill(s, DEFAULT_WINDOW, false)).toBe(0);
  });

  it('a smaller initial window we advertise shrinks open streams, and what was read comes back', () => {
    const fc = new FlowControl(1 << 20);
    const s = stream(DEFAULT_WINDOW, DEFAULT_WINDOW);
    fc.receivedOn(s, 1000);
    fc.consumed(1000, s);
    fc.localInitialWindow(s, 2000 - DEFAULT_WINDOW);
    expect(s.recvWindow).toBe(1000);
    expect(fc.refill(s, 2000, false)).toBe(1000);
    expect(s.recvWindow).toBe(2000);
    fc.grant(s, 500);
    expect(s.recvWindow).toBe(2500);
  });
});

describe('through the connection core', () => {
  const REQUEST = encodeLiteralBlock([{ name: ':method', value: 'POST' }, { name: ':scheme', value: 'http' }, { name: ':path', value: '/x' }, { name: ':authority', value: 'a' }]);
  const settings = (id: number, v: number): Buffer => {
    const p = Buffer.alloc(6);
    p.writeUInt16BE(id, 0);
    p.writeUInt32BE(v, 2);
    return frameBytes(FrameType.SETTINGS, 0, 0, p);
  };
  const windowUpdate = (id: number, inc: number): Buffer => {
    const p = Buffer.alloc(4);
    p.writeUInt32BE(inc);
    return frameBytes(FrameType.WINDOW_UPDATE, 0, id, p);
  };
  const turn = (): Promise<void> => new Promise((r) => setImmediate(r));

  /** A client core whose peer (a raw server) counts the DATA octets it receives on stream 1. */
  async function client(): Promise<{ conn: H2Connection; send: (b: Buffer) => void; dataOctets: () => number }> {
    const [a, peer] = duplexPair();
    let buf = Buffer.alloc(0);
    let octets = 0;
    peer.on('data', (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      if (buf.subarray(0, CLIENT_PREFACE.length).equals(CLIENT_PREFACE)) buf = buf.subarray(CLIENT_PREFACE.length);
      while (buf.length >= 9 && buf.length >= 9 + buf.readUIntBE(0, 3)) {
        const len = buf.readUIntBE(0, 3);
        if (buf[3] === FrameType.DATA) octets += len;
        buf = buf.subarray(9 + len);
      }
    });
    const conn = new H2Connection(a, { role: 'client', settings: {}, connectionWindow: DEFAULT_WINDOW }).start({
      headers: () => {}, data: () => {}, reset: () => {}, goaway: () => {}, closed: () => {},
    });
    peer.write(frameBytes(FrameType.SETTINGS, 0, 0));
    await turn();
    return { conn, send: (b) => peer.write(b), dataOctets: () => octets };
  }

  it('DATA waits for the window, and goes as WINDOW_UPDATEs open it', async () => {
    const c = await client();
    c.send(settings(Setting.INITIAL_WINDOW_SIZE, 0));
    await turn();
    const id = c.conn.request(REQUEST, false);
    c.conn.data(id, Buffer.alloc(300), true);
    await turn();
    expect(c.dataOctets()).toBe(0);
    expect(c.conn.queuedData).toBe(300);
    c.send(windowUpdate(id, 100));
    await turn();
    expect(c.dataOctets()).toBe(100);
    expect(c.conn.queuedData).toBe(200);
    c.send(windowUpdate(id, 1000));
    await turn();
    expect(c.dataOctets()).toBe(300);
    expect(c.conn.queuedData).toBe(0);
    c.conn.destroy();
  });

  it('a lowered SETTINGS_INITIAL_WINDOW_SIZE takes an open stream below zero: DATA waits until updates bring it above', async () => {
    const c = await client();
    c.send(settings(Setting.INITIAL_WINDOW_SIZE, 100));
    await turn();
    const id = c.conn.request(REQUEST, false);
    c.conn.data(id, Buffer.alloc(100), false);
    await turn();
    expect(c.dataOctets()).toBe(100);
    c.send(settings(Setting.INITIAL_WINDOW_SIZE, 0)); // the stream's window: 0 - 100 = -100
    await turn();
    c.conn.data(id, Buffer.alloc(50), true);
    c.send(windowUpdate(id, 100)); // -> 0: still nothing may go
    await turn();
    expect(c.dataOctets()).toBe(100);
    expect(c.conn.queuedData).toBe(50);
    c.send(windowUpdate(id, 30)); // -> 30
    await turn();
    expect(c.dataOctets()).toBe(130);
    c.send(settings(Setting.INITIAL_WINDOW_SIZE, 20)); // +20 -> 20
    await turn();
    expect(c.dataOctets()).toBe(150);
    expect(c.conn.queuedData).toBe(0);
    c.conn.destroy();
  });

  it('a stream WINDOW_UPDATE past 2^31-1 resets that stream only; the connection\'s closes it', async () => {
    const c = await client();
    const id = c.conn.request(REQUEST, false);
    c.send(windowUpdate(id, MAX_WINDOW));
    await turn();
    expect(c.conn.has(id)).toBe(false);
    expect(c.conn.closed).toBe(false);
    c.send(windowUpdate(0, MAX_WINDOW));
    await turn();
    expect(c.conn.closed).toBe(true);
  });

});
