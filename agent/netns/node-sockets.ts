/**
 * Sockets in the agent's own (node) netns: for --from-node, the legacy host-field path and
 * tests. Node creates the real socket at connect() time, in whatever netns the agent runs in.
 */
import net from 'node:net';
import type { SocketFactory } from '../probe/types.ts';
import { abortError } from './helper-protocol.ts';

/** SocketFactory for the node netns (mode 'node'); the netns argument is ignored. */
export class NodeSocketFactory implements SocketFactory {
  readonly mode = 'node';

  /** A fresh, unconnected net.Socket; the family follows from the address it connects to. */
  createSocket(_netns: string | undefined, _family: 4 | 6, signal?: AbortSignal): Promise<net.Socket> {
    if (signal?.aborted) return Promise.reject(abortError(signal));
    return Promise.resolve(new net.Socket());
  }
}
