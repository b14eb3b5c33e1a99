/**
 * agent/probe/http-client.ts over real sockets to a raw TCP server that records the request bytes
 * and answers what each test writes: the exact request on the wire, the 1xx and header-size bounds,
 * readAtMost's cap and cut bodies, the deadline.
 */
import { connect, createServer, type AddressInfo, type Server, type Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { BodyCutError, MAX_1XX_RESPONSES, readAtMost, SocketGet, TooMany1xxError } from '../../agent/probe/http-client.ts';
import type { ProbeRequest } from '../../agent/probe/http-request.ts';

let server: Server | undefined;
afterEach(async () => {
  if (server) await new Promise((r) => server!.close(r));
  server = undefined;
});

/** A server that answers each request with `answer(requestBytes, socket)` once the request's head is in. */
async function connected(answer: (head: string, s: Socket) => void): Promise<{ socket: Socket; head: Promise<string> }> {
  let gotHead!: (h: string) => void;
  const head = new Promise<string>((r) => (gotHead = r));
  server = createServer((s) => {
    let buf = '';
    s.on('error', () => {});
    s.on('data', (d: Buffer) => {
      buf += d.toString('latin1');
      if (buf.includes('\r\n\r\n')) {
        gotHead(buf);
        answer(buf, s);
      }
    });
  });
  await new Promise<void>((r) => server!.listen(0, '127.0.0.1', r));
  const socket = connect((server.address() as AddressInfo).port, '127.0.0.1');
  await new Promise((r) => socket.once('connect', r));
  return { socket, head };
}

const req = (headers: [string, string][] = [['User-Agent', 'kube-probe/1.34'], ['Accept', '*/*']]): ProbeRequest => ({
  scheme: 'http', hostname: '10.0.0.1', port: 8080, pathAndQuery: '/healthz?x=1', hostHeader: '10.0.0.1:8080', headers, url: 'http://10.0.0.1:8080/healthz?x=1',
});

describe('SocketGet', () => {
  it("writes kubelet's request byte for byte: Host first, the headers in order, Connection: close last, UTF-8 values as bytes", async () => {
    const { socket, head } = await connected((_h, s) => s.end('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok'));
    const get = new SocketGet(socket, req([['User-Agent', 'kube-probe/1.34'], ['Accept', '*/*'], ['X-Price', '5 €']]), new AbortController().signal);
    const res = await get.response;
    expect(res.statusCode).toBe(200);
    expect((await readAtMost(res, 100)).toString()).toBe('ok');
    expect(Buffer.from(await head, 'latin1')).toEqual(Buffer.concat([
      Buffer.from('GET /healthz?x=1 HTTP/1.1\r\nHost: 10.0.0.1:8080\r\nUser-Agent: kube-probe/1.34\r\nAccept: */*\r\nX-Price: 5 '),
      Buffer.from('€', 'utf8'),
      Buffer.from('\r\nConnection: close\r\n\r\n'),
    ]));
    get.destroy();
    get.destroy();
  });

  it(`up to ${MAX_1XX_RESPONSES} informational responses are skipped; one more is Go's "too many 1xx" error`, async () => {
    const oneXX = (n: number): string => 'HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n'.repeat(n);
    const ok = await connected((_h, s) => s.end(`${oneXX(MAX_1XX_RESPONSES)}HTTP/1.1 204 No Content\r\n\r\n`));
    const a = new SocketGet(ok.socket, req(), new AbortController().signal);
    expect((await a.response).statusCode).toBe(204);
    a.destroy();
    await new Promise((r) => server!.close(r));
    const many = await connected((_h, s) => s.end(`${oneXX(MAX_1XX_RESPONSES + 1)}HTTP/1.1 204 No Content\r\n\r\n`));
    const b = new SocketGet(many.socket, req(), new AbortController().signal);
    await expect(b.response).rejects.toBeInstanceOf(TooMany1xxError);
    expect(b.requestError?.message).toBe('net/http: too many 1xx informational responses');
    b.destroy();
  });

  it('a response header block over 64 KiB is refused, not held', async () => {
    const { socket } = await connected((_h, s) => s.end(`HTTP/1.1 200 OK\r\nX-Big: ${'a'.repeat(70 * 1024)}\r\n\r\n`));
    const get = new SocketGet(socket, req(), new AbortController().signal);
    await expect(get.response).rejects.toThrow();
    expect((get.requestError as NodeJS.ErrnoException | undefined)?.code).toBe('HPE_HEADER_OVERFLOW');
    get.destroy();
  });

  it('the deadline destroys the exchange with its reason', async () => {
    const { socket } = await connected(() => {});
    const ac = new AbortController();
    const get = new SocketGet(socket, req(), ac.signal);
    const why = new Error('context deadline exceeded');
    setTimeout(() => ac.abort(why), 50);
    await expect(get.response).rejects.toBe(why);
    get.destroy();
  });

  it('a signal already aborted ends it at once', async () => {
    const { socket } = await connected(() => {});
    const ac = new AbortController();
    ac.abort('gone');
    const get = new SocketGet(socket, req(), ac.signal);
    await expect(get.response).rejects.toThrow('probe aborted');
    get.destroy();
  });
});

describe('readAtMost', () => {
  it('reads at most the limit of a longer body (more is not an error)', async () => {
    const { socket } = await connected((_h, s) => s.end(`HTTP/1.1 200 OK\r\nContent-Length: 30000\r\n\r\n${'b'.repeat(30_000)}`));
    const get = new SocketGet(socket, req(), new AbortController().signal);
    const body = await readAtMost(await get.response, 10 * 1024);
    expect(body.length).toBe(10 * 1024);
    get.destroy();
  });

  it('a body that stops before its declared length rejects', async () => {
    const { socket } = await connected((_h, s) => s.end('HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b'));
    const get = new SocketGet(socket, req(), new AbortController().signal);
    const err = await readAtMost(await get.response, 1000).then(() => undefined, (e: unknown) => e);
    expect(err).toBeInstanceOf(Error);
    // The response stream's own error (node: "aborted", ECONNRESET) or, closed without one, a BodyCutError.
    expect(err instanceof BodyCutError || (err as NodeJS.ErrnoException).code === 'ECONNRESET').toBe(true);
    get.destroy();
  });

  it('a chunked body is read whole when within the limit', async () => {
    const { socket } = await connected((_h, s) => s.end('HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n'));
    const get = new SocketGet(socket, req(), new AbortController().signal);
    expect((await readAtMost(await get.response, 1000)).toString()).toBe('abcde');
    get.destroy();
  });
});
