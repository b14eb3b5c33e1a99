/**
 * Reads an admission request body within a byte cap, into a buffer that grows with what has
 * arrived: 64 KiB first (or the declared length, when smaller), then, once that is full, the
 * declared length at once (one copy; a chunked body doubles up to the cap instead). So a client
 * that declares 3 MiB and sends a byte a second holds 64 KiB, not 3 MiB, and a real 3 MiB review
 * costs two allocations. Reading stops the moment the cap is passed, or when the caller aborts
 * (the body did not arrive in time, or the request was cut to make room for others).
 */
import type { IncomingMessage } from 'node:http';

/** Why a body was not read whole. */
export type BodyShortfall = 'too-large' | 'aborted' | 'length-mismatch' | 'timeout' | 'evicted' | 'over-budget';

/** Why the caller stopped a read (the AbortSignal's reason). */
export type ReadCut = 'timeout' | 'evicted';

/** First buffer of a body: most reviews fit (a pod of a few containers is a few KiB). */
const INITIAL_BYTES = 64 * 1024;

export interface ReadHooks {
  /** Asked before each increase of the buffer's size (the first allocation included); false stops the read ('over-budget'). */
  grow?: (bytes: number) => boolean;
  /** Aborting (reason 'timeout' or 'evicted') settles the read at once with that shortfall. */
  signal?: AbortSignal;
}

/** The body, or why it could not be read whole. Never rejects. */
export function readBoundedBody(
  req: IncomingMessage,
  maxBytes: number,
  declared: number | undefined,
  hooks: ReadHooks = {},
): Promise<{ body: Buffer } | { shortfall: BodyShortfall }> {
  return new Promise((resolve) => {
    const limit = declared ?? maxBytes;
    let buf = Buffer.allocUnsafe(0);
    let size = 0;
    let settled = false;
    const settle = (v: { body: Buffer } | { shortfall: BodyShortfall }): void => {
      if (settled) return;
      settled = true;
      req.off('data', onData);
      hooks.signal?.removeEventListener('abort', onAbort);
      resolve(v);
    };
    const onAbort = (): void => {
      req.pause();
      settle({ shortfall: hooks.signal?.reason === 'evicted' ? 'evicted' : 'timeout' });
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
        const next = buf.length === 0 ? INITIAL_BYTES : declared ?? buf.length * 2;
        const want = Math.min(limit, Math.max(next, size + chunk.length));
        if (hooks.grow && !hooks.grow(want - buf.length)) {
          req.pause();
          settle({ shortfall: 'over-budget' });
          return;
        }
        const grown = Buffer.allocUnsafe(want);
        buf.copy(grown, 0, 0, size);
        buf = grown;
      }
      chunk.copy(buf, size);
      size += chunk.length;
    };
    if (hooks.signal?.aborted) return onAbort();
    hooks.signal?.addEventListener('abort', onAbort, { once: true });
    req.on('data', onData);
    req.once('end', () => settle(declared !== undefined && size !== declared ? { shortfall: 'length-mismatch' } : { body: buf.subarray(0, size) }));
    // A client gone mid-body (or a socket error): nothing to answer, but settle so nothing waits forever.
    req.once('error', () => settle({ shortfall: 'aborted' }));
    req.once('close', () => settle({ shortfall: 'aborted' }));
  });
}
