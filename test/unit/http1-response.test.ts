/**
 * agent/probe/http1-response.ts, the HTTP probe's response reader, against the cases Go's own tests
 * hold for the rules kubelet's client runs (net/http response_test.go TestReadResponse and
 * TestReadResponseErrors, transfer_test.go, internal/chunked_test.go, textproto reader_test.go),
 * rewritten here, plus kubelet's 10 KiB ReadAtMost and the bounds we add. Every case is read three
 * ways (whole, one byte at a time, in uneven pieces) and must end the same: the reader is
 * incremental, and no split of the bytes changes an outcome.
 */
import { describe, expect, it } from 'vitest';
import { MAX_1XX_RESPONSES } from '../../agent/http2/informational.ts';
import { Http1Error, Http1ResponseReader, MAX_HEADER_BYTES, type ResponseHead } from '../../agent/probe/http1-response.ts';

interface Outcome {
  heads: ResponseHead[];
  body?: string;
  error?: { kind: string; message: string };
  /** Whether the outcome came before the connection's end was given. */
  beforeEof: boolean;
}

/** Reads `raw` split by `pieces` (sizes, cycled), then (with `eof`) the connection's end. */
function readSplit(raw: Buffer, pieces: number[], keep: number, eof: boolean): Outcome {
  const out: Outcome = { heads: [], beforeEof: false };
  const reader = new Http1ResponseReader({
    head: (h) => {
      out.heads.push(h);
      return keep;
    },
    done: (body) => void (out.body = body.toString('latin1')),
    fail: (err: Http1Error) => void (out.error = { kind: err.kind, message: err.message }),
  });
  let pos = 0;
  for (let i = 0; pos < raw.length; i++) {
    const n = pieces[i % pieces.length] as number;
    // Each piece in a buffer of its own that is overwritten after the read: views are transient.
    const view = Buffer.from(raw.subarray(pos, pos + n));
    reader.push(view);
    view.fill(0x5a);
    pos += n;
  }
  out.beforeEof = reader.finished;
  if (eof) reader.eof();
  return out;
}

/** The outcome, the same whole, byte by byte and in uneven pieces. */
function read(raw: string | Buffer, opts: { keep?: number; eof?: boolean } = {}): Outcome {
  const bytes = typeof raw === 'string' ? Buffer.from(raw, 'latin1') : raw;
  const keep = opts.keep ?? 10 * 1024;
  const eof = opts.eof ?? true;
  const whole = readSplit(bytes, [Math.max(1, bytes.length)], keep, eof);
  expect(readSplit(bytes, [1], keep, eof), 'byte by byte').toEqual(whole);
  expect(readSplit(bytes, [3, 7, 1, 64, 2], keep, eof), 'uneven pieces').toEqual(whole);
  return whole;
}

const final = (o: Outcome): ResponseHead => o.heads.at(-1) as ResponseHead;

describe('Go ReadResponse: responses it reads (response_test.go respTests)', () => {
  it.each([
    ['HTTP/1.0 without Content-Length: the body runs to EOF', 'HTTP/1.0 200 OK\r\nConnection: close\r\n\r\nBody here\n', 200, -1, 'Body here\n'],
    ['HTTP/1.1 without Content-Length or Connection: to EOF', 'HTTP/1.1 200 OK\r\n\r\nBody here\n', 200, -1, 'Body here\n'],
    ['204 has no body, whatever follows', 'HTTP/1.1 204 No Content\r\n\r\nBody should not be read!\n', 204, 0, ''],
    ['Content-Length', 'HTTP/1.0 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\nBody here\n', 200, 10, 'Body here\n'],
    ['chunked', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0a\r\nBody here\n\r\n09\r\ncontinued\r\n0\r\n\r\n', 200, -1, 'Body here\ncontinued'],
    ['chunked overrides Content-Length', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 10\r\n\r\n0a\r\nBody here\n\r\n0\r\n\r\n', 200, -1, 'Body here\n'],
    ['an explicit Content-Length of 0', 'HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n', 200, 0, ''],
    ['a status line without reason, with its space', 'HTTP/1.0 303 \r\n\r\n', 303, -1, ''],
    ['a status line without reason or space', 'HTTP/1.0 303\r\n\r\n', 303, -1, ''],
    ['bare LF line ends (golang.org/issue/4767)', 'HTTP/1.1 206 Partial Content\nConnection: close\nContent-Type: multipart/byteranges; boundary=18a75608c8f47cef\n\nsome body', 206, -1, 'some body'],
    ['206 with Content-Length', 'HTTP/1.1 206 Partial Content\r\nContent-Type: text/plain; charset=utf-8\r\nAccept-Ranges: bytes\r\nContent-Range: bytes 0-5/1862\r\nContent-Length: 6\r\n\r\nfoobar', 206, 6, 'foobar'],
    ['HTTP/1.0 ignores Transfer-Encoding (issue 12785)', 'HTTP/1.0 200 OK\r\nTransfer-Encoding: bogus\r\n\r\nBody here\n', 200, -1, 'Body here\n'],
    ['HTTP/1.0 ignores Transfer-Encoding, Content-Length holds', 'HTTP/1.0 200 OK\r\nTransfer-Encoding: bogus\r\nContent-Length: 10\r\n\r\nBody here\n', 200, 10, 'Body here\n'],
  ])('%s', (_name, raw, status, contentLength, body) => {
    const o = read(raw);
    expect(o.error).toBeUndefined();
    expect(final(o)).toMatchObject({ status, contentLength });
    expect(o.body).toBe(body);
  });

  it('a body of known length ends at its length, not at the connection\'s end (the server may never close)', () => {
    expect(read('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok', { eof: false })).toMatchObject({ body: 'ok', beforeEof: true });
    expect(read('HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n', { eof: false })).toMatchObject({ body: 'ok', beforeEof: true });
    expect(read('HTTP/1.1 204 No Content\r\n\r\n', { eof: false })).toMatchObject({ body: '', beforeEof: true });
    // To EOF: nothing is done until the end comes.
    const toEof = read('HTTP/1.1 200 OK\r\n\r\nok', { eof: false });
    expect(toEof.beforeEof).toBe(false);
    expect(toEof.body).toBeUndefined();
  });

  it('the first Location value is the one followed (Header.Get)', () => {
    expect(final(read('HTTP/1.1 302 Found\r\nlocation: /a\r\nLocation: /b\r\nContent-Length: 0\r\n\r\n')).location).toBe('/a');
  });

  it('a continuation line joins its field with one space (obs-fold)', () => {
    expect(final(read('HTTP/1.1 302 Found\r\nLocation: /a\r\n \t b\r\nContent-Length: 0\r\n\r\n')).location).toBe('/a b');
    expect(final(read('HTTP/1.1 200 OK\r\nContent-Length:\r\n 2\r\n\r\nok')).contentLength).toBe(2);
  });

  it('a header name with a space in it is kept but never canonicalised (textproto TestReadMIMEHeaderNonCompliant)', () => {
    const o = read('HTTP/1.1 200 OK\r\nFoo: bar\r\nContent-Type: text/html\r\nSID : 0\r\nAudio Mode : None\r\nContent-Length : 5\r\n\r\nbody to EOF');
    expect(o.error).toBeUndefined();
    // "Content-Length " is another header: the body runs to EOF.
    expect(final(o).contentLength).toBe(-1);
    expect(o.body).toBe('body to EOF');
  });

  it('header names are matched without case; values keep obs-text', () => {
    const o = read('HTTP/1.1 200 OK\r\nCONTENT-length: 3\r\nX-Latin: caf\xe9\r\n\r\nabcdef', { eof: false });
    expect(o).toMatchObject({ body: 'abc', beforeEof: true });
  });
});

describe('Go ReadResponse: what it refuses (TestReadResponseErrors)', () => {
  const status = (s: string): string => `HTTP/1.1 ${s}\r\nFoo: bar\r\n\r\n`;
  const code = (c: string): string => `malformed HTTP status code ${c}`;
  it.each([
    ['20X Unknown', code('"20X"')], ['abcd Unknown', code('"abcd"')], ['二百/两百 OK', code('"二百/两百"')], [' Unknown', code('"Unknown"')],
    ['c8 OK', code('"c8"')], ['0x12d Moved Permanently', code('"0x12d"')], ['20 OK', code('"20"')], ['00 OK', code('"00"')],
    ['-10 OK', code('"-10"')], ['1000 OK', code('"1000"')], ['-1 OK', code('"-1"')], ['-200 OK', code('"-200"')],
  ])('status %j', (s, message) => {
    expect(read(Buffer.from(status(s), 'utf8')).error).toEqual({ kind: 'head', message });
  });

  it.each([['200 OK', 200], ['000 OK', 0], ['001 OK', 1], ['404 NOTFOUND', 404], ['999 Done', 999]])('status %j is read', (s, want) => {
    expect(final(read(status(s))).status).toBe(want);
  });

  it.each([['HTTP/1.2', undefined], ['HTTP/2.0', undefined], ['HTTP/1.100000000002', true], ['HTTP/1.-1', true], ['HTTP/A.B', true], ['HTTP/1', true], ['http/1.1', true]])(
    'version %j', (v, bad) => {
      const o = read(`${v} 200 OK\r\n\r\n`);
      if (bad) expect(o.error).toEqual({ kind: 'head', message: `malformed HTTP version "${v}"` });
      else expect(o.error).toBeUndefined();
    },
  );

  it('a line without a space is not a status line; nothing at all is the bare EOF of the transport', () => {
    expect(read('HTTP/1.1').error).toEqual({ kind: 'head', message: 'malformed HTTP response "HTTP/1.1"' });
    expect(read('garbage\r\n\r\n').error).toEqual({ kind: 'head', message: 'malformed HTTP response "garbage"' });
    // Go cuts at the first space: the second word is the status code.
    expect(read('this is not HTTP at all\r\n\r\n').error).toEqual({ kind: 'head', message: 'malformed HTTP status code "is"' });
    expect(read('').error).toEqual({ kind: 'closed', message: 'EOF' });
    expect(read('HTTP/1.1 301 Moved Permanently\r\nFoo: bar').error).toEqual({ kind: 'head', message: 'unexpected EOF' });
    expect(read('HTTP/1.1 200 OK\r\n').error).toEqual({ kind: 'head', message: 'unexpected EOF' });
  });

  const multi = (...vs: string[]): string => `http: message cannot contain multiple Content-Length headers; got [${vs.map((v) => `"${v}"`).join(' ')}]`;
  it.each([
    ['200 OK', 'Content-Length: 10\r\nContent-Length: 7\r\n\r\nGopher hey\r\n', multi('10', '7')],
    ['200 OK', 'Content-Length: 7\r\nContent-Length: 7\r\n\r\nGophers\r\n', undefined],
    ['201 OK', 'Content-Length: 0\r\nContent-Length: 7\r\n\r\nGophers\r\n', multi('0', '7')],
    ['300 OK', 'Content-Length: 0\r\nContent-Length: 0 \r\n\r\nGophers\r\n', undefined],
    ['200 OK', 'Content-Length:\r\nContent-Length:\r\n\r\nGophers\r\n', 'invalid empty Content-Length ""'],
    ['206 OK', 'Content-Length:\r\nContent-Length: 0 \r\nConnection: close\r\n\r\nGophers\r\n', multi('', '0')],
    // Repeated values are checked for 204 and 304 too, though neither has a body.
    ['204 OK', 'Content-Length: 7\r\nContent-Length: 8\r\n\r\n', multi('7', '8')],
    ['204 OK', 'Content-Length: 3\r\nContent-Length: 3\r\n\r\n', undefined],
    ['304 OK', 'Content-Length: 880\r\nContent-Length: 1\r\n\r\n', multi('880', '1')],
    ['304 OK', 'Content-Length: 961\r\nContent-Length: 961\r\n\r\n', undefined],
  ])('Content-Length: %s %j', (st, rest, message) => {
    const o = read(`HTTP/1.1 ${st}\r\n${rest}`);
    if (message === undefined) expect(o.error).toBeUndefined();
    else expect(o.error).toEqual({ kind: 'head', message });
  });

  it.each([
    ['3', 3], ['+3', 'bad Content-Length "+3"'], ['-3', 'bad Content-Length "-3"'], ['0x3', 'bad Content-Length "0x3"'],
    ['9223372036854775807', 9223372036854775807], ['9223372036854775808', 'bad Content-Length "9223372036854775808"'], [' 3 ', 3],
  ])('parseContentLength %j (transfer_test.go)', (v, want) => {
    const o = read(`HTTP/1.1 200 OK\r\nContent-Length: ${v}\r\n\r\n`, { eof: false });
    if (typeof want === 'number') expect(final(o).contentLength).toBe(want);
    else expect(o.error).toEqual({ kind: 'head', message: want });
  });

  it.each([
    ['Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked', 'too many transfer encodings: ["chunked" "chunked"]'],
    ['Transfer-Encoding: gzip', 'unsupported transfer encoding: "gzip"'],
    ['Transfer-Encoding: chunked, gzip', 'unsupported transfer encoding: "chunked, gzip"'],
    ['Transfer-Encoding: identity', 'unsupported transfer encoding: "identity"'],
    ['Transfer-Encoding: chunked\r\nTrailer: Content-Length', 'bad trailer key "Content-Length"'],
    ['Transfer-Encoding: chunked\r\nTrailer: X-A, transfer-encoding', 'bad trailer key "Transfer-Encoding"'],
  ])('Transfer-Encoding and Trailer: %j', (headers, message) => {
    expect(read(`HTTP/1.1 200 OK\r\n${headers}\r\n\r\n0\r\n\r\n`).error).toEqual({ kind: 'head', message });
  });

  it('Transfer-Encoding is read without case; a Trailer without chunking is no error', () => {
    expect(read('HTTP/1.1 200 OK\r\nTransfer-Encoding: CHUNKED\r\n\r\n2\r\nok\r\n0\r\n\r\n').body).toBe('ok');
    expect(read('HTTP/1.1 200 OK\r\nTrailer: Content-Length\r\nContent-Length: 2\r\n\r\nok').body).toBe('ok');
  });
});

describe('textproto readMIMEHeader: malformed header blocks (reader_test.go TestReadMIMEHeaderMalformed)', () => {
  it.each([
    ['No colon first line\r\nFoo: foo\r\n\r\n', 'malformed MIME header: missing colon: "No colon first line"'],
    [' No colon first line with leading space\r\nFoo: foo\r\n\r\n', 'malformed MIME header initial line:  No colon first line with leading space'],
    ['\tNo colon first line with leading tab\r\nFoo: foo\r\n\r\n', 'malformed MIME header initial line: \tNo colon first line with leading tab'],
    [' First: line with leading space\r\nFoo: foo\r\n\r\n', 'malformed MIME header initial line:  First: line with leading space'],
    ['Foo: foo\r\nNo colon second line\r\n\r\n', 'malformed MIME header: missing colon: "No colon second line"'],
    ['Foo-\n\tBar: foo\r\n\r\n', 'malformed MIME header: missing colon: "Foo-"'],
    ['Foo-\r\n\tBar: foo\r\n\r\n', 'malformed MIME header: missing colon: "Foo-"'],
    ['Foo\r\n\t: foo\r\n\r\n', 'malformed MIME header: missing colon: "Foo"'],
    ['Foo-\n\tBar', 'malformed MIME header: missing colon: "Foo-"'],
    ['Foo \tBar: foo\r\n\r\n', 'malformed MIME header line: Foo \tBar: foo'],
    [': empty name\r\n\r\n', 'malformed MIME header line: : empty name'],
    ['Foo: foo\x00bar\r\n\r\n', 'malformed MIME header line: Foo: foo\x00bar'],
    ['Foo: foo\x7f\r\n\r\n', 'malformed MIME header line: Foo: foo\x7f'],
    ['Foo: a\rb\r\n\r\n', 'malformed MIME header line: Foo: a\rb'],
    [` ${'x'.repeat(81)}\r\n\r\n`, 'message too large'],
  ])('%j', (block, message) => {
    expect(read(`HTTP/1.1 200 OK\r\n${block}`).error).toEqual({ kind: 'head', message });
  });

  it('a malformed line fails at once, without waiting for the rest of the head (a stalled server is not a timeout)', () => {
    expect(read('HTTP/1.1 200 OK\r\nNo colon\r\nX', { eof: false })).toMatchObject({ beforeEof: true, error: { kind: 'head' } });
    expect(read('SSH-2.0-OpenSSH_9.2p1\r\n', { eof: false })).toMatchObject({ beforeEof: true, error: { message: 'malformed HTTP response "SSH-2.0-OpenSSH_9.2p1"' } });
  });

  it('a trailing CR before the line end is trimmed, one more CR in a value is not', () => {
    expect(read('HTTP/1.1 200 OK\r\nContent-Length: 2\r\r\n\r\nok').body).toBe('ok');
  });
});

describe('Go chunked reader (internal/chunked_test.go) and the trailer (body.readTrailer)', () => {
  const chunked = (body: string): string => `HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n${body}`;
  it('chunk extensions are read and dropped (TestChunkReadingIgnoresExtensions)', () => {
    const o = read(chunked('7;ext="some quoted string"\r\nhello, \r\n17;someext\r\nworld! 0123456789abcdef\r\n0;someextension=sometoken\r\n\r\n'), { eof: false });
    expect(o).toMatchObject({ body: 'hello, world! 0123456789abcdef', beforeEof: true });
  });

  it.each([
    ['bare LF in chunk size', '1\na\r\n0\r\n\r\n', 'chunked line ends with bare LF'],
    ['extra CR in chunk size', '1\r\r\na\r\n0\r\n\r\n', 'invalid CR in chunked line'],
    ['bare LF in chunk extension', '1;\na\r\n0\r\n\r\n', 'chunked line ends with bare LF'],
    ['no CRLF after the data', '1\r\nab\r\n0\r\n\r\n', 'malformed chunked encoding'],
    ['a bare LF after the data', '1\r\na\n0\r\n\r\n', 'malformed chunked encoding'],
    ['a size that is not hex', '1x\r\na\r\n0\r\n\r\n', 'invalid byte in chunk length'],
    ['a space before the extension', '1 ;x\r\na\r\n0\r\n\r\n', 'invalid byte in chunk length'],
    ['no size', '\r\na\r\n0\r\n\r\n', 'empty hex number for chunk length'],
    ['more than 16 hex digits', '10000000000000000\r\n', 'http chunk length too large'],
    ['a size line longer than 4 KiB', `1;${'e'.repeat(4100)}\r\n`, 'header line too long'],
    ['the end within a chunk', '5\r\nab', 'unexpected EOF'],
    ['the end within a size line', '5', 'unexpected EOF'],
    ['the end before the CRLF after the data', '1\r\na\r', 'unexpected EOF'],
    ['the end before the trailer', '1\r\na\r\n0\r\n', 'http: unexpected EOF reading trailer'],
    ['a trailer without its end', '1\r\na\r\n0\r\nX: y\r\n', 'http: suspiciously long trailer after chunked body'],
    ['a trailer over 4 KiB', `1\r\na\r\n0\r\nX: ${'y'.repeat(5000)}\r\n\r\n`, 'http: suspiciously long trailer after chunked body'],
    ['a trailer line without a colon', '1\r\na\r\n0\r\nno colon\r\n\r\n', 'malformed MIME header: missing colon: "no colon"'],
  ])('%s', (_name, body, message) => {
    expect(read(chunked(body)).error).toEqual({ kind: 'body', message });
  });

  it('a trailer is read and dropped', () => {
    expect(read(chunked('3\r\nfoo\r\n3\r\nbar\r\n0\r\nTrailer-Key: Trailer-Value\r\n\r\n'), { eof: false })).toMatchObject({ body: 'foobar', beforeEof: true });
  });

  it('one-byte chunks with long extensions: too much framing for the data (TestChunkReaderTooMuchOverhead)', () => {
    const o = read(chunked(`1;${'x'.repeat(100)}\r\na\r\n`.repeat(200)));
    expect(o.error).toEqual({ kind: 'body', message: 'chunked encoding contains too much non-data' });
  });
});

describe('kubelet and the transport around the reader', () => {
  it('at most the bytes asked for are kept, and then it is done, however long the body (ReadAtMost 10 KiB)', () => {
    const big = 'b'.repeat(30_000);
    for (const raw of [
      `HTTP/1.1 200 OK\r\nContent-Length: ${big.length}\r\n\r\n${big}`,
      `HTTP/1.1 200 OK\r\n\r\n${big}`,
      `HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n${`400\r\n${'b'.repeat(1024)}\r\n`.repeat(30)}`,
    ]) {
      const o = read(raw, { eof: false });
      expect(o.beforeEof).toBe(true);
      expect(o.body).toBe('b'.repeat(10 * 1024));
    }
  });

  it('keeping nothing ends the response at its head', () => {
    expect(read('HTTP/1.1 301 Moved\r\nLocation: /x\r\nContent-Length: 100000\r\n\r\nabc', { keep: 0, eof: false })).toMatchObject({ body: '', beforeEof: true });
  });

  it(`skips up to ${MAX_1XX_RESPONSES} informational heads (Go's max1xxResponses); one more is Go's error`, () => {
    const hints = (n: number): string => 'HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n'.repeat(n);
    const ok = read(`${hints(MAX_1XX_RESPONSES)}HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok`);
    expect(ok.heads.map((h) => h.status)).toEqual([200]);
    expect(ok.body).toBe('ok');
    expect(read(`${hints(MAX_1XX_RESPONSES + 1)}HTTP/1.1 200 OK\r\n\r\n`, { eof: false }).error)
      .toEqual({ kind: 'too-many-1xx', message: 'net/http: too many 1xx informational responses' });
    // The end after an informational head is no longer the bare EOF of an empty connection.
    expect(read(hints(1)).error).toEqual({ kind: 'head', message: 'unexpected EOF' });
  });

  it('101 is the response: its body is the connection itself when it switches (Upgrade), none otherwise', () => {
    expect(read('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: keep-alive, Upgrade\r\n\r\nraw bytes')).toMatchObject({ body: 'raw bytes' });
    expect(read('HTTP/1.1 101 Switching Protocols\r\n\r\nraw bytes', { eof: false })).toMatchObject({ body: '', beforeEof: true });
  });

  it(`a head is bounded at ${MAX_HEADER_BYTES} bytes, and each informational head on its own`, () => {
    const head = (size: number, status = '200 OK'): string => {
      const start = `HTTP/1.1 ${status}\r\nX-Big: `;
      return `${start}${'a'.repeat(size - start.length - 4)}\r\n\r\n`;
    };
    expect(read(head(MAX_HEADER_BYTES) + 'ok').error).toBeUndefined();
    expect(read(head(MAX_HEADER_BYTES + 1), { eof: false }).error)
      .toEqual({ kind: 'headers-too-big', message: `net/http: server response headers exceeded ${MAX_HEADER_BYTES} bytes; aborted` });
    // A line that never ends is refused once it passes the bound, not held.
    expect(read(`HTTP/1.1 200 OK\r\nX: ${'a'.repeat(MAX_HEADER_BYTES)}`, { eof: false }).error?.kind).toBe('headers-too-big');
    const hint = (size: number): string => head(size, '103 Early Hints');
    expect(read(hint(MAX_HEADER_BYTES).repeat(2) + head(MAX_HEADER_BYTES)).error).toBeUndefined();
  });
});
