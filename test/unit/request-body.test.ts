/** readBoundedBody over a real HTTP server and raw client sockets. */
import { createServer, type IncomingMessage, type Server } from 'node:http';
import { connect, type AddressInfo, type Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { readBoundedBody, type ReadHooks } from '../../agent/webhook/request-body.ts';

type Result = Awaited<ReturnType<typeof readBoundedBody>>;

let server: Server | undefined;
const sockets: Socket[] = [];
afterEach(async () => {
  for (const s of sockets.splice(0)) s.destroy();
  if (server) await new Promise((r) => server!.close(r));
  server = undefined;
});

/** Serves one request with readBoundedBody(maxBytes, its Content-Length, hooks); returns the raw client socket and the result. */
async function serve(maxBytes: number, hooks: (req: IncomingMessage) => ReadHooks = () => ({})): Promise<{ client: Socket; result: Promise<Result> }> {
  let deliver!: (r: Result) => void;
  const result = new Promise<Result>((r) => (deliver = r));
  server = createServer((req, res) => {
    const cl = req.headers['content-length'];
    void readBoundedBody(req, maxBytes, cl === undefined ? undefined : Number(cl), hooks(req)).then((r) => {
      deliver(r);
      res.end();
    });
  });
  await new Promise<void>((r) => server!.listen(0, '127.0.0.1', r));
  const client = connect((server.address() as AddressInfo).port, '127.0.0.1');
  client.on('error', () => {});
  sockets.push(client);
  await new Promise((r) => client.once('connect', r));
  return { client, result };
}

const head = (extra: string): string => `POST /validate HTTP/1.1\r\nHost: x\r\n${extra}\r\n`;

describe('readBoundedBody', () => {
  it('reads a body of its declared length whole', async () => {
    const { client, result } = await serve(1024);
    client.write(head('Content-Length: 5\r\n') + 'hello');
    const r = await result;
    expect('body' in r && r.body.toString()).toBe('hello');
  });

  it('reads a chunked body whole, growing its buffer past 64 KiB', async () => {
    const asked: number[] = [];
    const { client, result } = await serve(1 << 20, () => ({ grow: (b) => (asked.push(b), true) }));
    const chunk = 'a'.repeat(50_000);
    client.write(head('Transfer-Encoding: chunked\r\n'));
    for (let i = 0; i < 4; i++) client.write(`${chunk.length.toString(16)}\r\n${chunk}\r\n`);
    client.write('0\r\n\r\n');
    const r = await result;
    expect('body' in r && r.body.length).toBe(200_000);
    expect(asked[0]).toBe(64 * 1024);
    // Each increase was asked for; together they are the final buffer, at most the cap.
    const total = asked.reduce((a, b) => a + b, 0);
    expect(total).toBeGreaterThanOrEqual(200_000);
    expect(total).toBeLessThanOrEqual(1 << 20);
  });

  it('stops at the cap: too-large, without waiting for the rest', async () => {
    const { client, result } = await serve(100);
    client.write(head('Transfer-Encoding: chunked\r\n') + `c8\r\n${'a'.repeat(200)}\r\n`);
    expect(await result).toEqual({ shortfall: 'too-large' });
  });

  it('a body shorter than declared, then the client gone, is "aborted"', async () => {
    const { client, result } = await serve(1024);
    client.write(head('Content-Length: 3\r\n') + 'ab');
    client.end();
    expect(await result).toEqual({ shortfall: 'aborted' });
  });

  it('a client that declares 3 MiB and sends a little holds a 64 KiB buffer, not 3 MiB', async () => {
    const asked: number[] = [];
    const { client, result } = await serve(4 << 20, () => ({ grow: (b) => (asked.push(b), true) }));
    client.write(head(`Content-Length: ${3 << 20}\r\n`) + 'x'.repeat(1000));
    while (asked.length === 0) await new Promise((r) => setTimeout(r, 10));
    expect(asked).toEqual([64 * 1024]);
    client.destroy();
    expect(await result).toEqual({ shortfall: 'aborted' });
  });

  it('a refused growth stops the read as over-budget', async () => {
    const { client, result } = await serve(1024, () => ({ grow: () => false }));
    client.write(head('Content-Length: 5\r\n') + 'hello');
    expect(await result).toEqual({ shortfall: 'over-budget' });
  });

  it('an abort settles at once with its reason: evicted, or timeout for any other', async () => {
    const acs = [new AbortController(), new AbortController()];
    let n = 0;
    const first = await serve(1024, () => ({ signal: acs[n++]!.signal }));
    first.client.write(head('Content-Length: 10\r\n') + 'abc');
    await new Promise((r) => setTimeout(r, 50));
    acs[0]!.abort('evicted');
    expect(await first.result).toEqual({ shortfall: 'evicted' });
    first.client.destroy();
    await new Promise((r) => server!.close(r));
    server = undefined;
    const second = await serve(1024, () => ({ signal: acs[1]!.signal }));
    second.client.write(head('Content-Length: 10\r\n') + 'abc');
    await new Promise((r) => setTimeout(r, 50));
    acs[1]!.abort(new Error('anything'));
    expect(await second.result).toEqual({ shortfall: 'timeout' });
  });

  it('a signal already aborted settles without reading', async () => {
    const ac = new AbortController();
    ac.abort('evicted');
    const { client, result } = await serve(1024, () => ({ signal: ac.signal }));
    client.write(head('Content-Length: 5\r\n') + 'hello');
    expect(await result).toEqual({ shortfall: 'evicted' });
  });
});
