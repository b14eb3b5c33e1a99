/**
 * Node's IPC channel answers every handle it receives with a NODE_HANDLE_ACK line: a Node sender
 * sends its next handle only after that ACK. The netns helper is no Node process: it sends each
 * handle with its answer and never waits for an ACK (netns-helper/resident.c reads and drops
 * them). So each ACK only costs the agent a write and the helper a wake-up, once per socket it
 * hands over (HTTP and gRPC probes): the write was a fifth of the agent's busy time at 250 pods x 3
 * probes every 10 s. Node has no option for it; this module is the one place that reaches into the
 * channel's internals to drop exactly that message.
 */
import type { ChildProcess } from 'node:child_process';

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
