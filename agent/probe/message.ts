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

/** Longest excerpt of a success's message (the target's response body) a debug log line carries. */
export const MAX_LOGGED_BODY_BYTES = 128;

/**
 * The `message` field of a "probe result changed" log line. A success's or warning's message is the
 * target's response body (what an app prints on /healthz can be anything, tokens included): it is
 * never logged at info, and at debug only its first MAX_LOGGED_BODY_BYTES. A failure's or error's
 * message never holds the body (kubernetes#99425) and is logged as is.
 */
export function messageLogField(result: string, message: string, debug: boolean): { message?: string } {
  if (result !== 'success' && result !== 'warning') return { message };
  if (!debug || message === '') return {};
  if (Buffer.byteLength(message, 'utf8') <= MAX_LOGGED_BODY_BYTES) return { message };
  let out = '';
  let used = 0;
  for (const ch of message) {
    used += Buffer.byteLength(ch, 'utf8');
    if (used > MAX_LOGGED_BODY_BYTES) break;
    out += ch;
  }
  return { message: `${out}${MARKER}` };
}
