/**
 * gRPC's header fields (gRPC over HTTP/2): `grpc-timeout` read and written, `grpc-message`
 * percent-encoded, and the answer header blocks our servers send (literal HPACK, built once).
 */
import { encodeLiteralBlock, type HeaderField } from '../http2/hpack.ts';

const TIMEOUT_UNITS_MS: Record<string, number> = { H: 3_600_000, M: 60_000, S: 1000, m: 1, u: 0.001, n: 0.000001 };

/** grpc-timeout ("<1-8 digits><H|M|S|m|u|n>") in ms; undefined when absent or malformed. */
export function parseGrpcTimeout(value: string | string[] | undefined): number | undefined {
  if (typeof value !== 'string') return undefined;
  const m = /^(\d{1,8})([HMSmun])$/.exec(value);
  if (!m) return undefined;
  return Number(m[1]) * (TIMEOUT_UNITS_MS[m[2] as string] as number);
}

/**
 * A whole number of ms as grpc-timeout: at least 1m; past 8 digits of ms, in the first coarser unit
 * that fits, rounded up (a deadline is never shortened).
 */
export function formatGrpcTimeout(ms: number): string {
  const n = Math.max(1, ms);
  if (n <= 99_999_999) return `${n}m`;
  for (const unit of ['S', 'M'] as const) {
    const v = Math.ceil(n / (TIMEOUT_UNITS_MS[unit] as number));
    if (v <= 99_999_999) return `${v}${unit}`;
  }
  return `${Math.min(99_999_999, Math.ceil(n / 3_600_000))}H`;
}

/** grpc-message is percent-encoded UTF-8: printable ASCII except '%' stays as is. */
export function encodeGrpcMessage(msg: string): string {
  let out = '';
  for (const b of Buffer.from(msg, 'utf8')) {
    out += b >= 0x20 && b <= 0x7e && b !== 0x25 ? String.fromCharCode(b) : `%${b.toString(16).toUpperCase().padStart(2, '0')}`;
  }
  return out;
}

/** Inverse of encodeGrpcMessage; an invalid escape is kept as written (the gRPC spec says be lenient). */
export function decodeGrpcMessage(s: string): string {
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

/** The content-types our answers carry: the shim's (as containerd's grpc-go says it) and the agent's (as grpc-js says it). */
export type AnswerContentType = 'application/grpc' | 'application/grpc+proto';

const RESPONSE_HEADERS: Record<AnswerContentType, Buffer> = {
  'application/grpc': encodeLiteralBlock([{ name: ':status', value: '200' }, { name: 'content-type', value: 'application/grpc' }]),
  'application/grpc+proto': encodeLiteralBlock([{ name: ':status', value: '200' }, { name: 'content-type', value: 'application/grpc+proto' }]),
};

/** An answer's HEADERS block (:status 200 and the content-type). Shared: never written to. */
export function responseHeadersBlock(contentType: AnswerContentType): Buffer {
  return RESPONSE_HEADERS[contentType];
}

/** The trailers of an OK answer: grpc-status 0 (grpc-go's), and with grpc-message OK (grpc-js's). Shared: never written to. */
export const OK_TRAILERS_BLOCK = encodeLiteralBlock([{ name: 'grpc-status', value: '0' }]);
export const OK_TRAILERS_WITH_MESSAGE_BLOCK = encodeLiteralBlock([{ name: 'grpc-status', value: '0' }, { name: 'grpc-message', value: 'OK' }]);

/**
 * A trailers-only answer's block: :status 200, the content-type, grpc-status `code`, grpc-message
 * (`message`'s first `maxChars` characters, percent-encoded) and `extra` fields.
 */
export function trailersOnlyBlock(contentType: AnswerContentType, code: number, message: string, maxChars: number, extra?: readonly HeaderField[]): Buffer {
  const fields: HeaderField[] = [{ name: 'grpc-status', value: String(code) }, { name: 'grpc-message', value: encodeGrpcMessage(message.slice(0, maxChars)) }];
  if (extra) fields.push(...extra);
  // Literal fields encode one by one: the blocks concatenated are the whole list's block.
  return Buffer.concat([RESPONSE_HEADERS[contentType], encodeLiteralBlock(fields)]);
}
