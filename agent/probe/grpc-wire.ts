/**
 * The few bytes of gRPC and protobuf the health probe needs, by hand: a HealthCheckRequest, the
 * length-prefixed message frame, HealthCheckResponse.status, grpc-message decoding, and Go's
 * duration text for kubelet's messages.
 */

/** HealthCheckRequest{service}: field 1, wire type 2; proto3 omits the empty string. */
export function encodeHealthCheckRequest(service: string): Buffer {
  if (service === '') return Buffer.alloc(0);
  const s = Buffer.from(service, 'utf8');
  return Buffer.concat([Buffer.from([0x0a]), varint(s.length), s]);
}

/** A gRPC length-prefixed message: 1 byte "compressed" flag, 4 byte big-endian length. */
export function grpcFrame(message: Buffer): Buffer {
  const head = Buffer.alloc(5);
  head.writeUInt32BE(message.length, 1);
  return Buffer.concat([head, message]);
}

/** HealthCheckResponse.status (field 1, varint); absent = 0 (UNKNOWN). Unknown fields are skipped. */
export function decodeHealthStatus(msg: Buffer): number {
  let i = 0;
  let status = 0;
  const readVarint = (): number => {
    let result = 0;
    for (let shift = 0; shift < 64; shift += 7) {
      if (i >= msg.length) throw new Error('unexpected EOF');
      const b = msg[i++] as number;
      if (shift < 32) result += (b & 0x7f) * 2 ** shift;
      if ((b & 0x80) === 0) return result;
    }
    throw new Error('varint overflow');
  };
  while (i < msg.length) {
    const tag = readVarint();
    const field = Math.floor(tag / 8);
    const wire = tag & 7;
    if (wire === 0) {
      const v = readVarint();
      if (field === 1) status = v;
    } else if (wire === 2) {
      // Not `i += readVarint()`: that reads i before the varint advances it.
      const len = readVarint();
      i += len;
    } else if (wire === 1) {
      i += 8;
    } else if (wire === 5) {
      i += 4;
    } else {
      throw new Error(`bad wire type ${wire}`);
    }
    if (i > msg.length) throw new Error('unexpected EOF');
  }
  return status;
}

function varint(n: number): Buffer {
  const out: number[] = [];
  while (n > 0x7f) {
    out.push((n & 0x7f) | 0x80);
    n = Math.floor(n / 128);
  }
  out.push(n);
  return Buffer.from(out);
}

/** grpc-message is percent-encoded UTF-8; invalid escapes are kept as written (the gRPC spec says be lenient). */
export function percentDecode(s: string): string {
  if (!s.includes('%')) return s;
  const bytes: number[] = [];
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c === 0x25 && /^[0-9a-fA-F]{2}$/.test(s.slice(i + 1, i + 3))) {
      bytes.push(parseInt(s.slice(i + 1, i + 3), 16));
      i += 2;
    } else {
      bytes.push(...Buffer.from(s[i] as string, 'utf8'));
    }
  }
  return Buffer.from(bytes).toString('utf8');
}

/** Go's time.Duration String() for a millisecond count ("1s", "500ms", "1m30s", "1h0m0s"). */
export function goDuration(ms: number): string {
  ms = Math.round(ms);
  if (ms === 0) return '0s';
  if (ms < 1000) return `${ms}ms`;
  const h = Math.floor(ms / 3_600_000);
  const m = Math.floor((ms % 3_600_000) / 60_000);
  const s = (ms % 60_000) / 1000;
  const sec = `${Number.isInteger(s) ? s : s.toFixed(3).replace(/0+$/, '')}s`;
  if (h > 0) return `${h}h${m}m${sec}`;
  if (m > 0) return `${m}m${sec}`;
  return sec;
}
