/**
 * The HTTP/1.x response of an HTTP probe, read from bytes as they arrive, with the rules of Go's
 * net/http client as kubelet's prober meets them: ReadResponse (the status line, textproto's
 * header block), readTransfer (Transfer-Encoding, Content-Length, Trailer, 204/304 and 1xx without
 * a body, a body to EOF otherwise, 101 with Upgrade as the raw connection), the chunked reader and
 * the trailer check of a chunked body. Every error is Go's text; the caller adds Go's prefixes.
 *
 * Bounded against a hostile server in every dimension: a head (status line and headers) holds at
 * most MAX_HEADER_BYTES, at most MAX_1XX_RESPONSES informational heads come before the final one,
 * a chunk-size line 4 KiB and a trailer 4 KiB (Go's bufio buffer), chunk framing at most 16 KiB
 * beyond the data (Go's rule), and only the body bytes the caller asks for are kept; the rest is
 * parsed and dropped. Nothing is copied in the common case (the whole head in one read): lines
 * are read in place, only a line split across reads is kept, in a buffer that grows by doubling.
 */
import { MAX_1XX_RESPONSES, isInformational } from '../http2/informational.ts';

/**
 * The biggest response head we read. Go's client allows 10 MiB (Transport MaxResponseHeaderBytes
 * default); 64 KiB keeps real servers working and bounds what one hostile target can make the agent hold.
 */
export const MAX_HEADER_BYTES = 64 * 1024;
/** Go's chunked reader: a chunk-size line (with its CRLF) fits its 4 KiB bufio buffer. */
const MAX_CHUNK_LINE = 4096;
/** Go's readTrailer: the trailer's end must be in view within its 4 KiB bufio buffer. */
const MAX_TRAILER_BYTES = 4096;
/** Go's chunked reader: framing allowed beyond 16 bytes per chunk and twice its data. */
const MAX_CHUNK_EXCESS = 16 * 1024;
/** Go's readMIMEHeader quotes at most this much of a bad initial line. */
const INITIAL_LINE_ERROR_LIMIT = 80;

/** Why a response could not be read. `kind` says what the caller maps it to; the message is Go's. */
export type Http1ErrorKind =
  /** The connection ended before any byte of a response (Go: the bare io.EOF of its first peek). */
  | 'closed'
  /** A head beyond MAX_HEADER_BYTES. */
  | 'headers-too-big'
  /** More than MAX_1XX_RESPONSES informational heads. */
  | 'too-many-1xx'
  /** Anything else wrong with a head (ReadResponse's error), including the connection ending in it. */
  | 'head'
  /** A body framing fault or the connection ending inside the body (the body reader's error). */
  | 'body';

export class Http1Error extends Error {
  readonly kind: Http1ErrorKind;
  constructor(kind: Http1ErrorKind, message: string) {
    super(message);
    this.kind = kind;
  }
}

/** The final response's head, as far as a probe needs it. */
export interface ResponseHead {
  status: number;
  /** The first Location value (Go's Header.Get), latin1 as on the wire. */
  location: string | undefined;
  /** Go's resp.ContentLength: -1 when unknown (chunked, or to EOF). */
  contentLength: number;
}

/** Where a reader's outcome goes; exactly one of done() and fail() is called, once. */
export interface ResponseSink {
  /** The final head; returns how many body bytes to keep (0: none, the response ends here). */
  head(head: ResponseHead): number;
  /** The body ended, or the bytes to keep were read: `body` holds them. */
  done(body: Buffer): void;
  fail(err: Http1Error): void;
}

/** Where the reader is. */
const State = { Head: 0, Length: 1, ToEof: 2, ChunkLine: 3, ChunkData: 4, ChunkEnd: 5, Trailer: 6, Done: 7 } as const;
type State = (typeof State)[keyof typeof State];

const CR = 13;
const LF = 10;
const SP = 32;
const HT = 9;
const COLON = 58;

const EMPTY = Buffer.alloc(0);
const SPACE = Buffer.from(' ');

/** One response, fed with push() as bytes arrive and eof() when the connection has ended. */
export class Http1ResponseReader {
  readonly #sink: ResponseSink;
  #state: State = State.Head;

  // ---- the current head
  /** Bytes of the current head so far. */
  #headBytes = 0;
  /** Bytes of every head so far (0: nothing came, a close is Go's bare EOF). */
  #seen = 0;
  #informational = 0;
  /** Complete lines of the current head so far (0: the status line comes next). */
  #lines = 0;
  #status = 0;
  #atLeast11 = true;
  /** A line split across reads, kept until its LF comes. */
  #line: Buffer = EMPTY;
  #lineLen = 0;
  /** A header field whose end is not known yet (a continuation line may follow), kept trimmed. */
  #field: Buffer = EMPTY;
  #fieldLen = 0;
  #fieldPending = false;
  /** The header values readTransfer looks at (each bounded by the head's size). */
  #contentLength: string[] = [];
  #transferEncoding: string[] = [];
  #trailer: string[] = [];
  #connection: string[] = [];
  #upgrade: string | undefined;
  #location: string | undefined;

  // ---- the body
  #keep = 0;
  #kept: Buffer[] = [];
  #keptLen = 0;
  /** Bytes of the body (Content-Length) or of the chunk left to read. */
  #left = 0;
  #chunkExcess = 0;
  /** The chunk's trailing CRLF: how much of it came. */
  #chunkEndSeen = 0;

  constructor(sink: ResponseSink) {
    this.#sink = sink;
  }

  /** Whether the outcome is known (later bytes are ignored). */
  get finished(): boolean {
    return this.#state === State.Done;
  }

  /** Reads `view` (valid during this call only: what is kept is copied). */
  push(view: Uint8Array): void {
    let pos = 0;
    const end = view.length;
    while (pos < end && this.#state !== State.Done) {
      switch (this.#state) {
        case State.Head: pos = this.#readHead(view, pos); break;
        case State.Length: pos = this.#readLength(view, pos); break;
        case State.ToEof: pos = this.#keepBody(view, pos, end); break;
        case State.ChunkLine: pos = this.#readChunkLine(view, pos); break;
        case State.ChunkData: pos = this.#readChunkData(view, pos); break;
        case State.ChunkEnd: pos = this.#readChunkEnd(view, pos); break;
        case State.Trailer: pos = this.#readTrailer(view, pos); break;
      }
    }
  }

  /** The connection ended (FIN, or closed without an error of its own). */
  eof(): void {
    switch (this.#state) {
      case State.Done: return;
      case State.Head: return this.#headEof();
      case State.ToEof: return this.#finish();
      case State.Trailer:
        return this.#fail('body', this.#lineLen < 2 ? 'http: unexpected EOF reading trailer' : 'http: suspiciously long trailer after chunked body');
      default: return this.#fail('body', 'unexpected EOF');
    }
  }

  #fail(kind: Http1ErrorKind, message: string): void {
    if (this.#state === State.Done) return;
    this.#state = State.Done;
    this.#release();
    this.#sink.fail(new Http1Error(kind, message));
  }

  #finish(): void {
    if (this.#state === State.Done) return;
    this.#state = State.Done;
    const body = this.#kept.length === 1 ? this.#kept[0] as Buffer : Buffer.concat(this.#kept, this.#keptLen);
    this.#release();
    this.#sink.done(body);
  }

  #release(): void {
    this.#kept = [];
    this.#line = EMPTY;
    this.#field = EMPTY;
  }

  // ---------------------------------------------------------------- head

  /** Head bytes from `pos`: complete lines in place, a split line kept. Returns where the head's reading stopped. */
  #readHead(view: Uint8Array, pos: number): number {
    const end = view.length;
    while (pos < end && this.#state === State.Head) {
      // A pending field ends when the next line does not start with a space or tab.
      if (this.#fieldPending && this.#lineLen === 0) {
        const c = view[pos] as number;
        if (c !== SP && c !== HT && !this.#flushField()) return end;
      }
      const budget = MAX_HEADER_BYTES - this.#headBytes;
      const limit = Math.min(end, pos + budget);
      const nl = view.indexOf(LF, pos);
      if (nl === -1 || nl >= limit) {
        // No line end within what the head may still hold: keep it, unless over the bound.
        const take = limit - pos;
        this.#appendLine(view, pos, limit);
        this.#headBytes += take;
        this.#seen += take;
        if (limit < end) this.#fail('headers-too-big', `net/http: server response headers exceeded ${MAX_HEADER_BYTES} bytes; aborted`);
        return end;
      }
      const take = nl + 1 - pos;
      this.#headBytes += take;
      this.#seen += take;
      const next = nl + 1 < end ? view[nl + 1] as number : -1;
      if (this.#lineLen === 0) {
        this.#headLine(view, pos, stripCr(view, pos, nl), next);
      } else {
        this.#appendLine(view, pos, nl);
        const line = this.#line;
        const len = this.#lineLen;
        this.#lineLen = 0;
        this.#headLine(line, 0, stripCr(line, 0, len), next);
      }
      pos = nl + 1;
    }
    return pos;
  }

  /** Keeps view[from, to) as (part of) the line being read. */
  #appendLine(view: Uint8Array, from: number, to: number): void {
    const n = to - from;
    if (n === 0) return;
    const need = this.#lineLen + n;
    this.#line = room(this.#line, this.#lineLen, need);
    this.#line.set(view.subarray(from, to), this.#lineLen);
    this.#lineLen = need;
  }

  /** One complete head line (CRLF or LF gone). `next`: the byte after its LF, -1 when not read yet. */
  #headLine(buf: Uint8Array, s: number, e: number, next: number): void {
    const n = this.#lines++;
    if (n === 0) return this.#statusLine(latin1(buf, s, e));
    this.#mimeLine(buf, s, e, next, n === 1);
  }

  /**
   * A line of a MIME header block (the head's, or a trailer's). Go's readMIMEHeader: a first
   * line may not start with a space, a field's first line needs a colon, a line starting with a
   * space or tab continues the field (joined with one space), an empty line ends the block.
   */
  #mimeLine(buf: Uint8Array, s: number, e: number, next: number, first: boolean): void {
    if (e === s) {
      if (this.#fieldPending && !this.#flushField()) return;
      return this.#endOfBlock();
    }
    const c = buf[s] as number;
    if (c === SP || c === HT) {
      if (first) {
        const line = latin1(buf, s, e);
        return this.#headFail(e - s > INITIAL_LINE_ERROR_LIMIT ? 'message too large' : `malformed MIME header initial line: ${line}`);
      }
      // A continuation: its leading blanks go, one space joins it to the field.
      this.#appendField(SPACE, 0, 1);
      const [ts, te] = trim(buf, s, e);
      this.#appendField(buf, ts, te);
      if (next !== -1 && next !== SP && next !== HT) this.#flushField();
      return;
    }
    if (this.#fieldPending && !this.#flushField()) return;
    const colon = buf.indexOf(COLON, s);
    if (colon === -1 || colon >= e) {
      return this.#headFail(`malformed MIME header: missing colon: ${goQuote(buf, s, e)}`);
    }
    const [ts, te] = trim(buf, s, e);
    // The common case, the next line in view and not a continuation: read in place.
    if (next !== -1 && next !== SP && next !== HT) return this.#fieldOf(buf, ts, te);
    // Its end is not known yet: kept until the next line's first byte says.
    this.#fieldLen = 0;
    this.#appendField(buf, ts, te);
    this.#fieldPending = true;
  }

  #appendField(buf: Uint8Array, from: number, to: number): void {
    const need = this.#fieldLen + (to - from);
    this.#field = room(this.#field, this.#fieldLen, need);
    this.#field.set(buf.subarray(from, to), this.#fieldLen);
    this.#fieldLen = need;
  }

  /** The pending field is complete: checks and records it. False when it failed the response. */
  #flushField(): boolean {
    this.#fieldPending = false;
    this.#fieldOf(this.#field, 0, this.#fieldLen);
    this.#fieldLen = 0;
    return this.#state !== State.Done;
  }

  /** One header field, trimmed (continuations joined): Go's key and value checks, and what readTransfer needs. */
  #fieldOf(buf: Uint8Array, s: number, e: number): void {
    const colon = buf.indexOf(COLON, s);
    let spaced = false;
    for (let i = s; i < colon; i++) {
      const c = buf[i] as number;
      if (c === SP) spaced = true;
      else if (!isTokenByte(c)) return this.#headFail(`malformed MIME header line: ${latin1(buf, s, e)}`);
    }
    if (colon === s) return this.#headFail(`malformed MIME header line: ${latin1(buf, s, e)}`);
    for (let i = colon + 1; i < e; i++) {
      if (!isValueByte(buf[i] as number)) return this.#headFail(`malformed MIME header line: ${latin1(buf, s, e)}`);
    }
    // Go does not canonicalise a name with a space in it: it never matches a known header.
    if (spaced) return;
    const name = knownHeader(buf, s, colon);
    if (name === Known.None) return;
    let vs = colon + 1;
    while (vs < e && (buf[vs] === SP || buf[vs] === HT)) vs++;
    const value = latin1(buf, vs, e);
    switch (name) {
      case Known.ContentLength: this.#contentLength.push(value); break;
      case Known.TransferEncoding: this.#transferEncoding.push(value); break;
      case Known.Trailer: this.#trailer.push(value); break;
      case Known.Connection: this.#connection.push(value); break;
      case Known.Upgrade: this.#upgrade ??= value; break;
      case Known.Location: this.#location ??= value; break;
    }
  }

  /** Go's ReadResponse, first line: "<proto> <code>[ <text>]". */
  #statusLine(line: string): void {
    const sp = line.indexOf(' ');
    if (sp === -1) return this.#headFail(`malformed HTTP response ${goQuoteString(line)}`);
    const proto = line.slice(0, sp);
    const status = line.slice(sp + 1).replace(/^ +/, '');
    const cut = status.indexOf(' ');
    const code = cut === -1 ? status : status.slice(0, cut);
    // strconv.Atoi: an optional sign and decimal digits; a negative code is refused.
    if (code.length !== 3 || !/^[+-]?[0-9]+$/.test(code) || Number(code) < 0) {
      return this.#headFail(`malformed HTTP status code ${goQuoteString(code)}`);
    }
    const version = httpVersion(proto);
    if (version === undefined) return this.#headFail(`malformed HTTP version ${goQuoteString(proto)}`);
    this.#status = Math.abs(Number(code));
    this.#atLeast11 = version[0] > 1 || (version[0] === 1 && version[1] >= 1);
  }

  /** A head's (or, after the last chunk, a trailer's: the body's) error. */
  #headFail(message: string): void {
    this.#fail(this.#state === State.Trailer ? 'body' : 'head', message);
  }

  /** The blank line: Go's readTransfer on this head, then the next head (1xx) or the body. */
  #endOfBlock(): void {
    if (this.#state === State.Trailer) return this.#finish();
    const status = this.#status;
    let chunked = false;
    let lengths = this.#contentLength;
    // parseTransferEncoding: ignored before HTTP/1.1; else exactly one value, "chunked", which overrides Content-Length.
    if (this.#transferEncoding.length > 0 && this.#atLeast11) {
      const te = this.#transferEncoding;
      if (te.length !== 1) return this.#headFail(`too many transfer encodings: ${goQuoteList(te)}`);
      if ((te[0] as string).toLowerCase() !== 'chunked') {
        return this.#headFail(`unsupported transfer encoding: ${goQuoteString(te[0] as string)}`);
      }
      lengths = [];
      chunked = true;
    }
    // fixLength: repeated Content-Length values must agree, whatever the status.
    if (lengths.length > 1) {
      const first = trimString(lengths[0] as string);
      for (const v of lengths) {
        if (trimString(v) !== first) return this.#headFail(`http: message cannot contain multiple Content-Length headers; got ${goQuoteList(lengths)}`);
      }
    }
    let length: number;
    if (isInformational(status) || status === 204 || status === 304) length = 0;
    else if (chunked) length = -1;
    else if (lengths.length > 0) {
      const cl = trimString(lengths[0] as string);
      if (cl === '') return this.#headFail('invalid empty Content-Length ""');
      // strconv.ParseUint(cl, 10, 63)
      if (!/^[0-9]+$/.test(cl) || BigInt(cl) >= 1n << 63n) return this.#headFail(`bad Content-Length ${goQuoteString(cl)}`);
      length = Number(cl);
    } else length = -1;
    // fixTrailer: only a chunked message's Trailer is read, and it may not name these.
    if (chunked) {
      for (const v of this.#trailer) {
        for (const key of headerElements(v)) {
          const bad = BAD_TRAILER_KEYS.get(key.toLowerCase());
          if (bad !== undefined && /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/.test(key)) return this.#headFail(`bad trailer key ${goQuoteString(bad)}`);
        }
      }
    }
    // 1xx but 101 is not the response: Go reads the next head, up to MAX_1XX_RESPONSES of them.
    if (isInformational(status) && status !== 101) {
      if (++this.#informational > MAX_1XX_RESPONSES) return this.#fail('too-many-1xx', 'net/http: too many 1xx informational responses');
      return this.#resetHead();
    }
    const keep = this.#sink.head({ status, location: this.#location, contentLength: length });
    if (this.#state === State.Done) return;
    this.#keep = Math.max(0, keep);
    this.#line = EMPTY;
    this.#field = EMPTY;
    if (this.#keep === 0) return this.#finish();
    // A protocol switch: the body is the connection itself, to its end (Go's readWriteCloserBody).
    if (status === 101 && this.#upgrade && this.#connection.some((v) => hasToken(v, 'upgrade'))) {
      this.#state = State.ToEof;
    } else if (chunked && length === -1) {
      this.#state = State.ChunkLine;
    } else if (length > 0) {
      this.#left = length;
      this.#state = State.Length;
    } else if (length === 0) {
      this.#finish();
    } else {
      this.#state = State.ToEof;
    }
  }

  #resetHead(): void {
    this.#headBytes = 0;
    this.#lines = 0;
    this.#contentLength = [];
    this.#transferEncoding = [];
    this.#trailer = [];
    this.#connection = [];
    this.#upgrade = undefined;
    this.#location = undefined;
  }

  /**
   * The connection ended inside a head. Nothing at all: Go's bare EOF. Otherwise a line cut short
   * is still a line (bufio returns it), the field before it is complete, and then Go's
   * ReadResponse reports io.ErrUnexpectedEOF.
   */
  #headEof(): void {
    if (this.#seen === 0) return this.#fail('closed', 'EOF');
    if (this.#lineLen > 0) {
      const line = this.#line;
      const len = this.#lineLen;
      this.#lineLen = 0;
      if (this.#fieldPending && line[0] !== SP && line[0] !== HT && !this.#flushField()) return;
      this.#headLine(line, 0, len, -1);
    }
    if (this.#fieldPending && !this.#flushField()) return;
    this.#fail('head', 'unexpected EOF');
  }

  // ---------------------------------------------------------------- body

  /** Keeps body bytes up to the limit asked for; once there, the response is done (kubelet's ReadAtMost). */
  #keepBody(view: Uint8Array, from: number, to: number): number {
    const room = this.#keep - this.#keptLen;
    const n = Math.min(room, to - from);
    if (n > 0) {
      this.#kept.push(Buffer.from(view.subarray(from, from + n)));
      this.#keptLen += n;
    }
    if (this.#keptLen >= this.#keep) this.#finish();
    return to;
  }

  #readLength(view: Uint8Array, pos: number): number {
    const n = Math.min(this.#left, view.length - pos);
    this.#left -= n;
    this.#keepBody(view, pos, pos + n);
    if (this.#left === 0) this.#finish();
    return pos + n;
  }

  /** Go's readChunkLine and beginChunk: "<hex>[;ext]" CRLF, no bare LF, no other CR, at most 4 KiB. */
  #readChunkLine(view: Uint8Array, pos: number): number {
    const end = view.length;
    const limit = Math.min(end, pos + (MAX_CHUNK_LINE - this.#lineLen));
    const nl = view.indexOf(LF, pos);
    if (nl === -1 || nl >= limit) {
      this.#appendLine(view, pos, limit);
      if (this.#lineLen >= MAX_CHUNK_LINE) this.#fail('body', 'header line too long');
      return limit;
    }
    let buf: Uint8Array = view;
    let s = pos;
    let e = nl;
    if (this.#lineLen > 0) {
      this.#appendLine(view, pos, nl);
      buf = this.#line;
      s = 0;
      e = this.#lineLen;
      this.#lineLen = 0;
    }
    const cr = buf.indexOf(CR, s);
    if (cr === -1 || cr >= e) {
      this.#fail('body', 'chunked line ends with bare LF');
      return end;
    }
    if (cr !== e - 1) {
      this.#fail('body', 'invalid CR in chunked line');
      return end;
    }
    e -= 1;
    this.#chunkExcess += e - s + 2;
    // trimTrailingWhitespace, then removeChunkExtension (the extension is dropped unread).
    while (e > s && isSpace(buf[e - 1] as number)) e--;
    const semi = buf.indexOf(0x3b, s);
    if (semi !== -1 && semi < e) e = semi;
    const size = parseHexUint(buf, s, e);
    if (typeof size === 'string') {
      this.#fail('body', size);
      return end;
    }
    this.#chunkExcess = Math.max(0, this.#chunkExcess - (16 + 2 * size));
    if (this.#chunkExcess > MAX_CHUNK_EXCESS) {
      this.#fail('body', 'chunked encoding contains too much non-data');
      return end;
    }
    if (size === 0) {
      this.#state = State.Trailer;
      this.#lineLen = 0;
    } else {
      this.#left = size;
      this.#state = State.ChunkData;
    }
    return nl + 1;
  }

  #readChunkData(view: Uint8Array, pos: number): number {
    const n = Math.min(this.#left, view.length - pos);
    this.#left -= n;
    this.#keepBody(view, pos, pos + n);
    if (this.#state === State.Done) return view.length;
    if (this.#left === 0) {
      this.#chunkEndSeen = 0;
      this.#state = State.ChunkEnd;
    }
    return pos + n;
  }

  /** The CRLF after a chunk's data. */
  #readChunkEnd(view: Uint8Array, pos: number): number {
    while (pos < view.length && this.#chunkEndSeen < 2) {
      const want = this.#chunkEndSeen === 0 ? CR : LF;
      if (view[pos] !== want) {
        this.#fail('body', 'malformed chunked encoding');
        return view.length;
      }
      this.#chunkEndSeen++;
      pos++;
    }
    if (this.#chunkEndSeen === 2) this.#state = State.ChunkLine;
    return pos;
  }

  /**
   * After the last chunk: Go's body.readTrailer. A bare CRLF ends the body; otherwise a CRLF CRLF
   * must come within 4 KiB, and what is before it is read as a MIME header block (kept nowhere).
   */
  #readTrailer(view: Uint8Array, pos: number): number {
    const end = view.length;
    const before = this.#lineLen;
    const take = Math.min(end - pos, MAX_TRAILER_BYTES - before);
    this.#appendLine(view, pos, pos + take);
    const buf = this.#line;
    const len = this.#lineLen;
    if (len >= 2 && buf[0] === CR && buf[1] === LF) {
      this.#finish();
      return end;
    }
    // Searched from where the last read left off: linear however the bytes are split.
    const at = len >= 4 ? buf.subarray(0, len).indexOf('\r\n\r\n', Math.max(0, before - 3)) : -1;
    if (at === -1) {
      if (len >= MAX_TRAILER_BYTES) this.#fail('body', 'http: suspiciously long trailer after chunked body');
      return end;
    }
    this.#readTrailerBlock(buf.subarray(0, at + 4));
    return end;
  }

  /** The trailer's lines, with the head's line rules (the values are not kept: kubelet never reads them). */
  #readTrailerBlock(block: Buffer): void {
    this.#line = EMPTY;
    this.#lineLen = 0;
    this.#resetHead();
    this.#lines = 1;
    let pos = 0;
    let first = true;
    while (this.#state === State.Trailer) {
      const nl = block.indexOf(LF, pos);
      const next = nl + 1 < block.length ? block[nl + 1] as number : -1;
      this.#mimeLine(block, pos, stripCr(block, pos, nl), next, first);
      first = false;
      pos = nl + 1;
    }
  }
}

/** `buf` (its first `len` bytes kept) with room for `need`, grown by doubling: linear however bytes are split. */
function room(buf: Buffer, len: number, need: number): Buffer {
  if (need <= buf.length) return buf;
  const grown = Buffer.allocUnsafe(Math.max(need, Math.min(2 * buf.length, MAX_HEADER_BYTES), 128));
  buf.copy(grown, 0, 0, len);
  return grown;
}

/** The end of a line that ends at `nl` (its LF), less a CR before the LF. */
function stripCr(buf: Uint8Array, s: number, nl: number): number {
  return nl > s && buf[nl - 1] === CR ? nl - 1 : nl;
}

function latin1(buf: Uint8Array, s: number, e: number): string {
  return Buffer.from(buf.buffer, buf.byteOffset + s, e - s).toString('latin1');
}

/** textproto's isASCIISpace. */
function isSpace(c: number): boolean {
  return c === SP || c === HT || c === LF || c === CR;
}

/** textproto's trim: ASCII space on both ends. */
function trim(buf: Uint8Array, s: number, e: number): [number, number] {
  while (s < e && isSpace(buf[s] as number)) s++;
  while (e > s && isSpace(buf[e - 1] as number)) e--;
  return [s, e];
}

function trimString(v: string): string {
  return v.replace(/^[ \t\r\n]+|[ \t\r\n]+$/g, '');
}

/** RFC 7230 token characters (Go's validHeaderFieldByte). */
function isTokenByte(c: number): boolean {
  return TOKEN[c] === 1;
}

const TOKEN = new Uint8Array(256);
for (const ch of "!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz") TOKEN[ch.charCodeAt(0)] = 1;

/** Go's validHeaderValueByte: HTAB, SP, VCHAR and obs-text; no other control byte. */
function isValueByte(c: number): boolean {
  return c === HT || (c >= 0x20 && c !== 0x7f);
}

const Known = { None: 0, ContentLength: 1, TransferEncoding: 2, Trailer: 3, Connection: 4, Upgrade: 5, Location: 6 } as const;
type Known = (typeof Known)[keyof typeof Known];

const KNOWN: ReadonlyArray<[string, Known]> = [
  ['content-length', Known.ContentLength],
  ['transfer-encoding', Known.TransferEncoding],
  ['trailer', Known.Trailer],
  ['connection', Known.Connection],
  ['upgrade', Known.Upgrade],
  ['location', Known.Location],
];

/** Which of the headers readTransfer and the redirect need `buf[s, e)` names (case-insensitive), if any. */
function knownHeader(buf: Uint8Array, s: number, e: number): Known {
  const n = e - s;
  outer: for (const [name, id] of KNOWN) {
    if (name.length !== n) continue;
    for (let i = 0; i < n; i++) {
      if (((buf[s + i] as number) | 0x20) !== name.charCodeAt(i)) continue outer;
    }
    return id;
  }
  return Known.None;
}

const BAD_TRAILER_KEYS = new Map([['transfer-encoding', 'Transfer-Encoding'], ['trailer', 'Trailer'], ['content-length', 'Content-Length']]);

/** Go's foreachHeaderElement: comma-separated, trimmed, empty elements skipped. */
function headerElements(v: string): string[] {
  return v.split(',').map(trimString).filter((x) => x !== '');
}

/** httpguts.HeaderValuesContainsToken for one value: a comma-separated token, case-insensitive. */
function hasToken(v: string, token: string): boolean {
  return v.split(',').some((x) => x.replace(/^[ \t]+|[ \t]+$/g, '').toLowerCase() === token);
}

/** Go's ParseHTTPVersion. */
function httpVersion(v: string): [number, number] | undefined {
  if (v === 'HTTP/1.1') return [1, 1];
  if (v === 'HTTP/1.0') return [1, 0];
  const m = /^HTTP\/([0-9])\.([0-9])$/.exec(v);
  return m ? [Number(m[1]), Number(m[2])] : undefined;
}

/** Go's parseHexUint: the size, or its error text. */
function parseHexUint(buf: Uint8Array, s: number, e: number): number | string {
  if (e === s) return 'empty hex number for chunk length';
  let n = 0;
  for (let i = s; i < e; i++) {
    const c = buf[i] as number;
    let d: number;
    if (c >= 0x30 && c <= 0x39) d = c - 0x30;
    else if (c >= 0x61 && c <= 0x66) d = c - 0x61 + 10;
    else if (c >= 0x41 && c <= 0x46) d = c - 0x41 + 10;
    else return 'invalid byte in chunk length';
    if (i - s === 16) return 'http chunk length too large';
    n = n * 16 + d;
  }
  return n;
}

/** Go's %q of a byte string (strconv.Quote): UTF-8 kept where printable, everything else escaped. */
export function goQuote(buf: Uint8Array, s: number, e: number): string {
  return goQuoteBytes(Buffer.from(buf.buffer, buf.byteOffset + s, e - s));
}

/** Go's %q of a string whose characters are bytes (latin1, as header text is held here). */
function goQuoteString(v: string): string {
  return goQuoteBytes(Buffer.from(v, 'latin1'));
}

/** Go's %q of a []string: ["a" "b"]. */
function goQuoteList(vs: readonly string[]): string {
  return `[${vs.map(goQuoteString).join(' ')}]`;
}

const PRINTABLE = /^[\p{L}\p{M}\p{N}\p{P}\p{S}]$/u;
const ESCAPES: Record<number, string> = { 7: '\\a', 8: '\\b', 12: '\\f', 10: '\\n', 13: '\\r', 9: '\\t', 11: '\\v', 34: '\\"', 92: '\\\\' };

function goQuoteBytes(b: Buffer): string {
  let out = '"';
  let i = 0;
  while (i < b.length) {
    const c = b[i] as number;
    const esc = ESCAPES[c];
    if (esc !== undefined) {
      out += esc;
      i++;
      continue;
    }
    if (c < 0x80) {
      out += c >= 0x20 && c < 0x7f ? String.fromCharCode(c) : `\\x${hex2(c)}`;
      i++;
      continue;
    }
    const [cp, len] = decodeUtf8(b, i);
    if (cp === -1) {
      out += `\\x${hex2(c)}`;
      i++;
      continue;
    }
    const ch = String.fromCodePoint(cp);
    out += PRINTABLE.test(ch) ? ch : cp < 0x10000 ? `\\u${cp.toString(16).padStart(4, '0')}` : `\\U${cp.toString(16).padStart(8, '0')}`;
    i += len;
  }
  return out + '"';
}

function hex2(c: number): string {
  return c.toString(16).padStart(2, '0');
}

/** One UTF-8 sequence at `i`: [code point, length], or [-1, 1] when invalid (Go's RuneError). */
function decodeUtf8(b: Buffer, i: number): [number, number] {
  const c = b[i] as number;
  const len = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c <= 0xdf ? 2 : 0;
  if (len === 0 || i + len > b.length) return [-1, 1];
  let cp = c & (len === 2 ? 0x1f : len === 3 ? 0x0f : 0x07);
  for (let k = 1; k < len; k++) {
    const x = b[i + k] as number;
    if ((x & 0xc0) !== 0x80) return [-1, 1];
    cp = (cp << 6) | (x & 0x3f);
  }
  const min = len === 2 ? 0x80 : len === 3 ? 0x800 : 0x10000;
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return [-1, 1];
  return [cp, len];
}
