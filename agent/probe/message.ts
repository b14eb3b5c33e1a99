/**
 * The one cap on result messages, in UTF-8 bytes (what an event, a log line and the wire carry):
 * the prober applies it, and every later copy (store, API) stays within it.
 */

/** Messages are for people and events; a body or error text longer than this is cut. */
export const MAX_MESSAGE_BYTES = 1024;

const MARKER = '… (truncated)';

/** Cuts `text` to MAX_MESSAGE_BYTES of UTF-8 without splitting a character; text within the cap is returned as is. */
export function boundMessage(text: string): string {
  if (Buffer.byteLength(text, 'utf8') <= MAX_MESSAGE_BYTES) return text;
  const budget = MAX_MESSAGE_BYTES - Buffer.byteLength(MARKER, 'utf8');
  let out = '';
  let used = 0;
  for (const ch of text) {
    const n = Buffer.byteLength(ch, 'utf8');
    if (used + n > budget) break;
    out += ch;
    used += n;
  }
  return out + MARKER;
}
