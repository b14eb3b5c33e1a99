/**
 * The one place that reaches past Node's public API into a child's IPC channel, for the netns
 * helper, which is no Node process: it reads JSON lines, sends each socket with its answer and
 * never waits for anything. Node has no option for either thing done here:
 *
 * - Node answers every handle it receives with a NODE_HANDLE_ACK line, so that a Node sender may
 *   send its next handle. The helper reads and drops them (netns-helper/resident.c): each ACK only
 *   cost the agent a write and the helper a wake-up, once per socket handed over (HTTP and gRPC
 *   probes), 7.5 % of the agent's busy time at 250 pods x 3 probes every 10 s.
 * - child.send() writes each message on its own. Requests made in the same turn of the event loop
 *   (probes whose ticks fall due together) go out as one write of several lines instead: one write
 *   and one wake-up of the helper for the lot. Each write woke the helper (about 0.1 ms of the
 *   agent's CPU here, a microVM) and was 12.7 % of its busy time at that load.
 */
import type { ChildProcess } from 'node:child_process';
import { writeSync } from 'node:fs';

type InternalSend = (message: unknown, ...rest: unknown[]) => boolean;

/**
 * Stops `child`'s IPC channel from acknowledging the handles it receives (a NACK, for a handle
 * that did not arrive, still goes). Only for a peer that never waits for ACKs. Returns false, and
 * changes nothing, where the channel is not as expected (no IPC channel, or a Node version without
 * the internal send this wraps): the ACKs then cost what they did.
 */
export function dropHandleAcks(child: ChildProcess): boolean {
  const c = child as ChildProcess & { _send?: InternalSend };
  const send = c._send;
  if (typeof send !== 'function' || !child.channel) return false;
  c._send = function sendUnlessAck(this: unknown, message: unknown, ...rest: unknown[]): boolean {
    if (typeof message === 'object' && message !== null && (message as { cmd?: unknown }).cmd === 'NODE_HANDLE_ACK') return true;
    return send.call(this, message, ...rest);
  };
  return true;
}

/** How writeLines went. */
export type LinesWritten =
  /** All bytes are in the channel. */
  | 'written'
  /** Nothing was written (no channel descriptor, or no room now): send the messages the usual way. */
  | 'not-written'
  /** Only part went: the stream is torn, the channel is unusable. */
  | 'torn';

/**
 * Writes `text` (whole JSON lines, as Node's 'json' serialisation frames them) on `child`'s IPC
 * channel in one write(2). Only safe while Node itself has nothing queued on that channel: the
 * caller sends every message of its own here (or waits until Node's sends completed) and the
 * channel carries nothing else but NACKs, which are rare and whole.
 */
export function writeLines(child: ChildProcess, text: string): LinesWritten {
  const fd = (child.channel as { fd?: unknown } | null | undefined)?.fd;
  if (typeof fd !== 'number' || fd < 0 || !child.connected) return 'not-written';
  const bytes = Buffer.from(text, 'utf8');
  let n: number;
  try {
    n = writeSync(fd, bytes);
  } catch (err) {
    // A non-blocking socket with no room (never at the helper's bounded in-flight), or gone.
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'EAGAIN' || code === 'EWOULDBLOCK' || code === 'EINTR') return 'not-written';
    throw err;
  }
  return n === bytes.length ? 'written' : 'torn';
}
