/**
 * ExchangedChannel over real loopback connections: what the helper read comes first, then the
 * connection's own reads and end; the first write skips what the helper wrote; a connection the
 * peer ended in the helper reads as that end or that reset. PendingChannel: a protocol's first
 * writes wait for the connection and go to it first; one that never comes is reported.
 */
import { once } from 'node:events';
import net, { type AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { answerStartedAt, connectionChannel, ExchangedChannel, PendingChannel } from '../../agent/io/exchanged-channel.ts';
import { LeanSocket, type ChannelHandler } from '../../agent/io/lean-socket.ts';

/** What a handler saw, in order. */
function recorder(): { handler: ChannelHandler; events: string[]; closed: Promise<Error | undefined> } {
  const events: string[] = [];
  let done!: (e: Error | undefined) => void;
  const closed = new Promise<Error | undefined>((r) => (done = r));
  const handler: ChannelHandler = {
    data: (view) => events.push(`data ${view.toString('latin1')}`),
    end: () => events.push('end'),
    close: (err) => {
      events.push(`close${err ? ` ${(err as NodeJS.ErrnoException).code}` : ''}`);
      done(err);
    },
    drain: () => {},
  };
  return { handler, events, closed };
}

let server: net.Server | undefined;
afterEach(() => server?.close());

describe('ExchangedChannel', () => {
  it('a connection handed over: the helper\'s octets first, then the rest; the first write skips what was sent', async () => {
    let received = '';
    const gotAll = new Promise<void>((resolve) => {
      server = net.createServer((s) => {
        s.on('data', (d: Buffer) => {
          received += d.toString('latin1');
          if (received === 'REST') s.end('tail');
        });
        resolve();
      });
    });
    await new Promise<void>((r) => server!.listen(0, '127.0.0.1', r));
    const socket = net.connect((server!.address() as AddressInfo).port, '127.0.0.1');
    await once(socket, 'connect');
    await gotAll;
    const ch = new ExchangedChannel({ sent: 3, data: Buffer.from('head '), seconds: 0.001 }, socket);
    const r = recorder();
    ch.start(r.handler);
    expect(r.events).toEqual(['data head ']);
    ch.write(Buffer.from('reqREST'));
    expect(await r.closed).toBeUndefined();
    expect(received).toBe('REST');
    expect(r.events).toEqual(['data head ', 'data tail', 'end', 'close']);
    ch.destroy();
    expect(ch.destroyed).toBe(true);
  });

  it('a peer that ended in the helper: its octets, then the end; writes go nowhere', async () => {
    const ch = new ExchangedChannel({ sent: 4, data: Buffer.from('HTTP/1.1 200 OK\r\n\r\n'), ended: { eof: true }, seconds: 0.001 }, undefined);
    const r = recorder();
    ch.start(r.handler);
    ch.write(Buffer.from('GET / HTTP/1.1\r\n\r\n'));
    expect(r.events).toEqual(['data HTTP/1.1 200 OK\r\n\r\n', 'end', 'close']);
    expect(ch.writable).toBe(false);
    expect(ch.unsent).toBe(0);
    expect(ch.destroyed).toBe(false);
    ch.destroy();
    expect(ch.destroyed).toBe(true);
    await ch.closed;
  });

  it('a peer that reset in the helper: its octets, then the reset as Node reports a read\'s', () => {
    const ch = new ExchangedChannel({ sent: 4, data: Buffer.from('partial'), ended: { code: 'ECONNRESET' }, seconds: 0.001 }, undefined);
    const r = recorder();
    let error: NodeJS.ErrnoException | undefined;
    ch.start({ ...r.handler, close: (err) => { error = err; r.handler.close(err); } });
    expect(r.events).toEqual(['data partial', 'close ECONNRESET']);
    expect(error).toMatchObject({ message: 'read ECONNRESET', code: 'ECONNRESET', syscall: 'read' });
  });

  it('nothing read in the helper: no empty read reaches the handler', () => {
    const ch = new ExchangedChannel({ sent: 0, data: Buffer.alloc(0), ended: { eof: true }, seconds: 0.3 }, undefined);
    const r = recorder();
    ch.start(r.handler);
    expect(r.events).toEqual(['end', 'close']);
  });
});

/** A loopback server that collects what each connection sends, and answers `reply` to the first octets. */
async function collector(reply: string): Promise<{ port: number; received: () => string; ended: Promise<void> }> {
  let received = '';
  let ended!: () => void;
  const endedP = new Promise<void>((r) => (ended = r));
  server = net.createServer((s) => {
    s.once('data', () => s.write(reply));
    s.on('data', (d: Buffer) => (received += d.toString('latin1')));
    s.on('end', () => {
      s.end();
      ended();
    });
  });
  await new Promise<void>((r) => server!.listen(0, '127.0.0.1', r));
  return { port: (server!.address() as AddressInfo).port, received: () => received, ended: endedP };
}

describe('PendingChannel', () => {
  it('writes wait for the connection; attached to an exchange, what the helper sent is skipped and its octets come first', async () => {
    const peer = await collector('');
    const ch = new PendingChannel();
    const r = recorder();
    ch.start(r.handler);
    ch.write(Buffer.from('PREFACE+'));
    ch.write(Buffer.from('REQUEST'));
    expect(ch.written().toString()).toBe('PREFACE+REQUEST');
    expect(ch.writable).toBe(true);
    expect(r.events).toEqual([]);
    // The helper connected, wrote the first 8 octets (of 15) and read the server's first answer.
    const socket = net.connect(peer.port, '127.0.0.1');
    await once(socket, 'connect');
    socket.write('PREFACE+');
    const attached = ch.attach(new ExchangedChannel({ sent: 8, data: Buffer.from('SETTINGS'), seconds: 0.001 }, socket));
    expect(r.events).toEqual(['data SETTINGS']);
    ch.write(Buffer.from('+ACK'));
    ch.end();
    await peer.ended;
    expect(peer.received()).toBe('PREFACE+REQUEST+ACK');
    expect(await r.closed).toBeUndefined();
    expect(ch.destroyed).toBe(attached.destroyed);
    ch.destroy();
    await ch.closed;
  });

  it('attached to a plain connection: every waiting write goes out, in order, before later ones', async () => {
    const peer = await collector('pong');
    const ch = new PendingChannel();
    const r = recorder();
    ch.write(Buffer.from('one,'));
    ch.write(Buffer.from('two,'));
    ch.attach(LeanSocket.connect({ host: '127.0.0.1', port: peer.port }));
    ch.write(Buffer.from('three'));
    ch.start(r.handler);
    ch.end();
    await peer.ended;
    expect(await r.closed).toBeUndefined();
    expect(peer.received()).toBe('one,two,three');
    expect(r.events).toEqual(['data pong', 'end', 'close']);
  });

  it('destroyed before a connection came: the handler hears it once, later writes and a late connection go nowhere', async () => {
    const peer = await collector('');
    const ch = new PendingChannel();
    const r = recorder();
    ch.start(r.handler);
    ch.write(Buffer.from('lost'));
    ch.destroy();
    ch.destroy();
    expect((await r.closed)?.message).toBe('no connection was made');
    // Once, with that error (it has no errno code).
    expect(r.events).toEqual(['close undefined']);
    expect(ch.destroyed).toBe(true);
    expect(ch.writable).toBe(false);
    expect(ch.written().length).toBe(0);
    await ch.closed;
    const late = ch.attach(LeanSocket.connect({ host: '127.0.0.1', port: peer.port }));
    expect(late.destroyed).toBe(true);
    await late.closed;
    expect(peer.received()).toBe('');
  });
});

describe('connectionChannel and answerStartedAt', () => {
  it('a connection with the helper\'s exchange reads it first; one without is read lean; the answer began when the helper saw it', async () => {
    const peer = await collector('');
    const exchange = { sent: 0, data: Buffer.from('x'), ended: { eof: true }, seconds: 0.5, firstByteSeconds: 0.2 } as const;
    expect(connectionChannel(exchange, undefined)).toBeInstanceOf(ExchangedChannel);
    const socket = net.connect(peer.port, '127.0.0.1');
    await once(socket, 'connect');
    const plain = connectionChannel(undefined, socket);
    expect(plain).toBeInstanceOf(LeanSocket);
    expect((plain as LeanSocket).lean).toBe(true);
    plain.destroy();
    const before = performance.now();
    const first = answerStartedAt(exchange);
    const whole = answerStartedAt({ ...exchange, firstByteSeconds: undefined });
    const none = answerStartedAt(undefined);
    const after = performance.now();
    expect(first).toBeGreaterThanOrEqual(before - 200);
    expect(first).toBeLessThanOrEqual(after - 200);
    expect(whole).toBeLessThanOrEqual(after - 500);
    expect(whole).toBeGreaterThanOrEqual(before - 500);
    expect(none).toBeGreaterThanOrEqual(before);
    expect(none).toBeLessThanOrEqual(after);
  });
});
