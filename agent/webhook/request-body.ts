/**
 * Reads an admission request body within a byte cap, into one buffer: sized from Content-Length
 * when declared (one copy of the body, never the chunk list plus the concatenation), grown by
 * doubling up to the cap when chunked. Reading stops the moment the cap is passed.
 */
import type { IncomingMessage } from 'node:http';

/** Why a body was not read whole. */
export type BodyShortfall = 'too-large' | 'aborted' | 'length-mismatch';

/** The body, or why it could not be read whole. Never rejects. */
export function readBoundedBody(req: IncomingMessage, maxBytes: number, declared: number | undefined): Promise<{ body: Buffer } | { shortfall: BodyShortfall }> {
  return new Promise((resolve) => {
    let buf = Buffer.allocUnsafe(declared ?? Math.min(maxBytes, 64 * 1024));
    let size = 0;
    let settled = false;
    const settle = (v: { body: Buffer } | { shortfall: BodyShortfall }): void => {
      if (settled) return;
      settled = true;
      req.off('data', onData);
      resolve(v);
    };
    const onData = (chunk: Buffer): void => {
      if (size + chunk.length > maxBytes) {
        req.pause();
        settle({ shortfall: 'too-large' });
        return;
      }
      if (declared !== undefined && size + chunk.length > declared) {
        req.pause();
        settle({ shortfall: 'length-mismatch' });
        return;
      }
      if (size + chunk.length > buf.length) {
        const grown = Buffer.allocUnsafe(Math.min(maxBytes, Math.max(buf.length * 2, size + chunk.length)));
        buf.copy(grown, 0, 0, size);
        buf = grown;
      }
      chunk.copy(buf, size);
      size += chunk.length;
    };
    req.on('data', onData);
    req.once('end', () => settle(declared !== undefined && size !== declared ? { shortfall: 'length-mismatch' } : { body: buf.subarray(0, size) }));
    // A client gone mid-body (or a socket error): nothing to answer, but settle so nothing waits forever.
    req.once('error', () => settle({ shortfall: 'aborted' }));
    req.once('close', () => settle({ shortfall: 'aborted' }));
  });
}
