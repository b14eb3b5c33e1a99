/**
 * The health check's messages, by hand (on agent/grpc/protowire.ts): a HealthCheckRequest and
 * HealthCheckResponse.status; and Go's duration text for kubelet's messages.
 */
import { WireError, WireReader, WireTruncated, WireWriter } from '../grpc/protowire.ts';

/** HealthCheckRequest{service}: field 1, wire type 2; proto3 omits the empty string. */
export function encodeHealthCheckRequest(service: string): Buffer {
  return new WireWriter().bytes(1, service).finish();
}

/**
 * HealthCheckResponse.status (field 1, varint; an enum, so its low 32 bits signed, as Go reads it);
 * absent = 0 (UNKNOWN). Unknown fields are skipped. Errors in Go's protobuf words.
 */
export function decodeHealthStatus(msg: Buffer): number {
  const r = new WireReader(msg);
  let status = 0;
  try {
    while (r.pos < msg.length) {
      const wire = r.wireType;
      const field = Math.floor(r.varint() / 8);
      if (wire === 0) {
        if (field === 1) status = r.int32();
        else r.varint();
      } else if (wire === 2) {
        // A 10-byte length reads negative: past any message's end, like any length too large.
        const len = r.varint();
        r.pos = len < 0 ? Infinity : r.pos + len;
      } else if (wire === 1) {
        r.pos += 8;
      } else if (wire === 5) {
        r.pos += 4;
      } else {
        throw new Error(`bad wire type ${wire}`);
      }
      if (r.pos > msg.length) throw new Error('unexpected EOF');
    }
  } catch (err) {
    if (err instanceof WireTruncated) throw new Error('unexpected EOF');
    if (err instanceof WireError) throw new Error('varint overflow');
    throw err;
  }
  return status;
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
