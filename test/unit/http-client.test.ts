/**
 * agent/probe/http-client.ts over real sockets to a raw TCP server that records the request bytes
 * and answers what each test writes: the exact request on the wire (one write), the connection read
 * lean, the 1xx and header-size bounds, the body cap and cut bodies, the deadline; then hostile
 * peers, through the whole HTTP probe: a response a byte at a time, a header flood, an endless
 * chunked body, an endless run of 1xx heads, and a server that never closes after its body.
 */
import { connect, createServer, type AddressInfo, type Server, type Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { LeanSocket } from '../../agent/io/lean-socket.ts';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { Deadline } from '../../agent/probe/connect.ts';
import { Http1Get, MAX_1XX_RESPONSES, MAX_HEADER_BYTES } from '../../agent/probe/http-client.ts';
import { Http1Error } from '../../agent/probe/http1-response.ts';
import { requestBytes, type ProbeRequest } from '../../agent/probe/http-request.ts';
import { probeHttp } from '../../agent/probe/http.ts';

let server: Server | undefined;
afterEach(async () => {
  if (server) await new Promise((r) => server!.close(r));
  server = undefined;
});

/** A server that answers each request with `answer(requestBytes, socket)` once the request's head is in. */
async function listen(answer: (head: string, s: Socket) => void): Promise<{ port: number; head: Promise<string>; reads: () => number }> {
  let gotHead!: (h: string) => void;
  const head = new Promise<string>((r) => (gotHead = r));
  let reads = 0;
  server = createServer((s) => {
    let buf = '';
    s.on('error', () => {});
    s.on('data', (d: Buffer) => {
      reads++;
      buf += d.toString('latin1');
      if (buf.includes('\r\n\r\n')) {
        gotHead(buf);
        answer(buf, s);
      }
    });
  });
  await new Promise<void>((r) => server!.listen(0, '127.0.0.1', r));
  return { port: (server.address() as AddressInfo).port, head, reads: () => reads };
}

async function connected(answer: (head: string, s: Socket) => void): Promise<{ socket: Socket; head: Promise<string>; reads: () => number }> {
  const { port, head, reads } = await listen(answer);
  const socket = connect(port, '127.0.0.1');
  await new Promise((r) => socket.once('connect', r));
  return { socket, head, reads };
}

const req = (headers: [string, string][] = [['User-Agent', 'kube-probe/1.34'], ['Accept', '*/*']]): ProbeRequest => ({
  scheme: 'http', hostname: '10.0.0.1', port: 8080, pathAndQuery: '/healthz?x=1', hostHeader: '10.0.0.1:8080', headers, url: 'http://10.0.0.1:8080/healthz?x=1',
});

/** A GET of `r` on `socket` read lean, keeping up to `keep` body bytes. */
function get(socket: Socket, r: ProbeRequest = req(), signal = new AbortController().signal, keep = 10 * 1024): { get: Http1Get; channel: LeanSocket } {
  const channel = LeanSocket.take(socket);
  return { get: new Http1Get(channel, requestBytes(r), signal, () => keep), channel };
}

describe('Http1Get', () => {
  it("writes kubelet's request byte for byte in one write: Host first, the headers in order, Connection: close last, UTF-8 values as bytes", async () => {
    const { socket, head, reads } = await connected((_h, s) => s.end('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok'));
    const { get: g, channel } = get(socket, req([['User-Agent', 'kube-probe/1.34'], ['Accept', '*/*'], ['X-Price', '5 €']]));
    // The connection moved onto the lean read path (no stream machinery per read).
    expect(channel.lean).toBe(true);
    const out = await g.outcome;
    expect(out.head.status).toBe(200);
    expect(out.body?.toString()).toBe('ok');
    expect(Buffer.from(await head, 'latin1')).toEqual(Buffer.concat([
      Buffer.from('GET /healthz?x=1 HTTP/1.1\r\nHost: 10.0.0.1:8080\r\nUser-Agent: kube-probe/1.34\r\nAccept: */*\r\nX-Price: 5 '),
      Buffer.from('€', 'utf8'),
      Buffer.from('\r\nConnection: close\r\n\r\n'),
    ]));
    expect(reads()).toBe(1);
    channel.destroy();
    channel.destroy();
  });

  it('refuses a header value that would write a line of its own, as Go\'s transport does', () => {
    expect(() => requestBytes(req([['X-A', 'a\r\nX-Injected: 1']]))).toThrow('net/http: invalid header field value for "X-A"');
  });

  it(`up to ${MAX_1XX_RESPONSES} informational responses are skipped; one more is Go's "too many 1xx" error`, async () => {
    const oneXX = (n: number): string => 'HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n'.repeat(n);
    const ok = await connected((_h, s) => s.end(`${oneXX(MAX_1XX_RESPONSES)}HTTP/1.1 204 No Content\r\n\r\n`));
    const a = get(ok.socket);
    expect((await a.get.outcome).head.status).toBe(204);
    a.channel.destroy();
    await new Promise((r) => server!.close(r));
    const many = await connected((_h, s) => s.end(`${oneXX(MAX_1XX_RESPONSES + 1)}HTTP/1.1 204 No Content\r\n\r\n`));
    const b = get(many.socket);
    const err = await b.get.outcome.then(() => undefined, (e: unknown) => e);
    expect(err).toBeInstanceOf(Http1Error);
    expect(err).toMatchObject({ kind: 'too-many-1xx', message: 'net/http: too many 1xx informational responses' });
    b.channel.destroy();
  });

  it(`a response header block over ${MAX_HEADER_BYTES / 1024} KiB is refused, not held`, async () => {
    const { socket } = await connected((_h, s) => s.end(`HTTP/1.1 200 OK\r\nX-Big: ${'a'.repeat(70 * 1024)}\r\n\r\n`));
    const g = get(socket);
    await expect(g.get.outcome).rejects.toMatchObject({ kind: 'headers-too-big' });
    g.channel.destroy();
  });

  it('the deadline ends the exchange with its reason', async () => {
    const { socket } = await connected(() => {});
    const ac = new AbortController();
    const g = get(socket, req(), ac.signal);
    const why = new Error('context deadline exceeded');
    setTimeout(() => ac.abort(why), 50);
    await expect(g.get.outcome).rejects.toBe(why);
    g.channel.destroy();
  });

  it('a signal already aborted ends it at once', async () => {
    const { socket } = await connected(() => {});
    const ac = new AbortController();
    ac.abort('gone');
    const g = get(socket, req(), ac.signal);
    await expect(g.get.outcome).rejects.toThrow('probe aborted');
    g.channel.destroy();
  });

  it('a throw while the response is read ends this GET with it, not the process', async () => {
    const { socket } = await connected((_h, s) => s.end('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok'));
    const channel = LeanSocket.take(socket);
    const g = new Http1Get(channel, requestBytes(req()), new AbortController().signal, () => {
      throw new Error('decided badly');
    });
    await expect(g.outcome).rejects.toThrow('decided badly');
    expect(channel.destroyed).toBe(true);
  });

  it('keeps at most the limit of a longer body (more is not an error)', async () => {
    const { socket } = await connected((_h, s) => s.end(`HTTP/1.1 200 OK\r\nContent-Length: 30000\r\n\r\n${'b'.repeat(30_000)}`));
    const g = get(socket);
    expect((await g.get.outcome).body?.length).toBe(10 * 1024);
    g.channel.destroy();
  });

  it('a body that stops before its declared length ends with Go\'s body error', async () => {
    const { socket } = await connected((_h, s) => s.end('HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b'));
    const g = get(socket);
    const out = await g.get.outcome;
    expect(out.body).toBeUndefined();
    expect(out.bodyError).toMatchObject({ kind: 'body', message: 'unexpected EOF' });
    g.channel.destroy();
  });

  it('a chunked body is read whole when within the limit', async () => {
    const { socket } = await connected((_h, s) => s.end('HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n'));
    const g = get(socket);
    expect((await g.get.outcome).body?.toString()).toBe('abcde');
    g.channel.destroy();
  });
});

describe('the HTTP probe against hostile peers', () => {
  const sockets = new NodeSocketFactory();
  /** The probe against the raw server on `port`, with a deadline far beyond any answer: only the outcome counts. */
  async function probe(port: number, timeoutMs = 20_000) {
    const d = new Deadline(timeoutMs);
    try {
      return await probeHttp({ kind: 'http', port, path: '/', scheme: 'HTTP', headers: [] },
        { host: '127.0.0.1', port, ips: ['127.0.0.1'], netns: undefined, sockets, legacyNode: false }, d, '1.34');
    } finally {
      d.dispose();
    }
  }

  /** Writes `chunk` again and again while the peer reads; stops when it goes. */
  function flood(s: Socket, first: string, chunk: string): void {
    const buf = Buffer.from(chunk);
    const pump = (): void => {
      while (!s.destroyed && s.write(buf));
      if (!s.destroyed) s.once('drain', pump);
    };
    s.write(first);
    pump();
  }

  it('a response one byte at a time, over many reads, is read whole', async () => {
    const response = 'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n';
    const { port } = await listen((_h, s) => {
      s.setNoDelay(true);
      let i = 0;
      const next = (): void => {
        if (s.destroyed) return;
        if (i === response.length) return void s.end();
        s.write(response[i++] as string);
        setTimeout(next, 1);
      };
      next();
    });
    expect(await probe(port)).toMatchObject({ result: 'success', message: 'hello' });
  });

  it(`a header flood is cut at ${MAX_HEADER_BYTES / 1024} KiB: a failure in Go's words, the connection let go`, async () => {
    let closed!: () => void;
    const gone = new Promise<void>((r) => (closed = r));
    const { port } = await listen((_h, s) => {
      s.once('close', closed);
      flood(s, 'HTTP/1.1 200 OK\r\n', 'X-Flood: 0123456789abcdef0123456789abcdef\r\n');
    });
    const out = await probe(port);
    expect(out).toMatchObject({ result: 'failure', reason: 'protocol' });
    expect(out.message).toMatch(/: net\/http: HTTP\/1\.x transport connection broken: net\/http: server response headers exceeded 65536 bytes; aborted$/);
    await gone;
  });

  it('an endless chunked body: kubelet reads 10 KiB and calls it a success, while the server still writes', async () => {
    const { port } = await listen((_h, s) => flood(s, 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n', `400\r\n${'e'.repeat(1024)}\r\n`));
    const out = await probe(port);
    expect(out.result).toBe('success');
    expect(out.message).toBe('e'.repeat(10 * 1024));
  });

  it('an endless run of 1xx heads fails after the sixth, as in Go', async () => {
    const { port } = await listen((_h, s) => flood(s, '', 'HTTP/1.1 102 Processing\r\n\r\n'));
    expect(await probe(port)).toMatchObject({
      result: 'failure', reason: 'protocol', message: `Get "http://127.0.0.1:${port}/": net/http: HTTP/1.x transport connection broken: net/http: too many 1xx informational responses`,
    });
  });

  it('a server that never closes after a Content-Length body: the probe succeeds on the body, not at the deadline', async () => {
    const { port } = await listen((_h, s) => s.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok'));
    // Waiting for the connection's end would run into the deadline: an error, never this success.
    expect(await probe(port)).toMatchObject({ result: 'success', message: 'ok' });
  });
});
