/**
 * Hands each accepted connection to an in-process HTTP/2 server, after reading the client's preface
 * and frames up to its first request's header block (connection-level HTTP/2 shared by the shim and
 * the agent's API socket). The shim: when that block's `:authority` is one nghttp2 accepts (kubelet
 * 1.31+, crictl 1.31+, grpc-go with WithAuthority), the octets read go back into the socket and the
 * raw socket goes to the server, so such a connection costs nothing per call; otherwise (kubelet up
 * to 1.30 sends the socket path; others send nothing) the connection runs through the
 * AuthorityRewriter for its whole life. The agent: the first request's headers pick the server
 * (agent/api/hot-unary.ts).
 *
 * A gRPC client waits for the server's SETTINGS before its first request, so the shim sends an
 * empty SETTINGS frame at once (all values at their initial defaults, which the server's own
 * SETTINGS then changes) and holds the connection until the client has acknowledged it: that ACK
 * is the shim's, not the server's, and is taken out of the stream. Everything else (a PING too)
 * stays in the octets the server gets, and the server answers it: the handoff is no endpoint.
 */
import type * as net from 'node:net';
import { duplexPair, type Duplex } from 'node:stream';
import { authorityAcceptable, AuthorityRewriter, clientHeaderDecoder, H2_LIMITS } from './authority.ts';
import { FrameSplitter, HeaderBlockJoiner } from './connection.ts';
import { HpackError, type HeaderField } from './hpack.ts';
import { CLIENT_PREFACE, Flag, frameBytes, FrameType, H2InputError } from './wire.ts';

/** Octets a connection may send before the shim has decided how to carry it. */
const MAX_SNIFFED = 256 * 1024;
const EMPTY_SETTINGS = frameBytes(FrameType.SETTINGS, 0, 0);

/** How a connection is carried, once known. */
export type Carriage = 'native' | 'rewritten';

/** Events of a handed-off connection, for the shim's log. */
export interface HandoffEvents {
  /** The connection is carried as `how`; `authority` is what its first request sent (absent: none). */
  carried(how: Carriage, authority: string | undefined): void;
  /** The connection was closed because the client's octets could not be carried. */
  refused(error: Error): void;
}

/** What takes a carried connection: an HTTP/2 server (its 'connection' event), or anything shaped so. */
export interface ConnectionTarget {
  emit(event: 'connection', connection: Duplex): unknown;
}

/** A target, or a choice of target by the connection's first request's header fields. */
export type TargetChoice = ConnectionTarget | ((first: readonly HeaderField[]) => ConnectionTarget);

/** A connection being handed off; cancel() closes it if it is still waiting for its first request. */
export interface Handoff {
  cancel(): void;
}

/** Starts reading `socket` and hands it to `server` as soon as its first request shows how. */
export function handOff(socket: net.Socket, choice: TargetChoice, events: HandoffEvents): Handoff {
  const reader = new FrameSplitter(true, H2_LIMITS.maxFrameSize);
  const blocks = new HeaderBlockJoiner(H2_LIMITS.maxHeaderBlock);
  const decoder = clientHeaderDecoder();
  const kept: Buffer[] = [];
  let first: HeaderField[] | null = null;
  let acked = false;
  let sniffed = 0;
  let decided = false;

  const refuse = (err: Error): void => {
    decided = true;
    detach();
    events.refused(err);
    socket.destroy();
  };
  const onError = (): void => {
    decided = true;
    detach();
    socket.destroy();
  };
  const onEnd = (): void => {
    if (!decided) onError();
  };
  const detach = (): void => {
    socket.off('data', onData);
    socket.off('end', onEnd);
    socket.off('error', onError);
  };
  const onData = (chunk: Buffer): void => {
    sniffed += chunk.length;
    if (sniffed > MAX_SNIFFED) {
      refuse(new H2InputError(`${sniffed} octets before a first request and the SETTINGS acknowledgement`));
      return;
    }
    reader.push(chunk);
    try {
      for (let f = reader.next(); f !== null; f = reader.next()) {
        const h = blocks.take(f);
        if (f.type === FrameType.SETTINGS && f.flags & Flag.ACK && !acked) {
          acked = true; // ours: the server never sent SETTINGS on this connection
        } else {
          kept.push(f.raw);
          if (first === null && h !== null) first = decoder.decode(h.block);
        }
        if (first !== null && acked) {
          decide(first);
          return;
        }
      }
    } catch (err) {
      if (err instanceof H2InputError || err instanceof HpackError) refuse(err);
      else refuse(new H2InputError(`unexpected: ${(err as Error).message}`));
    }
  };

  const decide = (fields: HeaderField[]): void => {
    decided = true;
    detach();
    const server = typeof choice === 'function' ? choice(fields) : choice;
    const octets = Buffer.concat([CLIENT_PREFACE, ...kept, reader.pending]);
    const authority = fields.find((f) => f.name === ':authority')?.value;
    if (authorityAcceptable(fields)) {
      socket.pause();
      socket.unshift(octets);
      // The HTTP/2 session takes the socket's native handle and first reads what is buffered.
      server.emit('connection', socket);
      events.carried('native', authority);
      return;
    }
    let start: Buffer;
    try {
      const rewriter = new AuthorityRewriter();
      start = rewriter.transform(octets);
      carryRewritten(socket, server, rewriter, start, events);
    } catch (err) {
      refuse(err as Error);
      return;
    }
    events.carried('rewritten', authority);
  };

  socket.on('data', onData);
  socket.on('end', onEnd);
  socket.on('error', onError);
  socket.write(EMPTY_SETTINGS);
  return {
    cancel: () => {
      if (!decided) onError();
    },
  };
}

/** Runs the connection's client→server octets through `rewriter` into the server; the other way is untouched. */
function carryRewritten(socket: net.Socket, server: ConnectionTarget, rewriter: AuthorityRewriter, start: Buffer, events: HandoffEvents): void {
  const [inner, outer] = duplexPair();
  const close = (): void => {
    socket.destroy();
    outer.destroy();
    inner.destroy();
  };
  socket.on('error', close);
  outer.on('error', close);
  inner.on('error', close);
  socket.on('close', close);
  outer.on('close', close);
  server.emit('connection', inner);
  const toServer = (octets: Buffer): void => {
    if (octets.length > 0 && !outer.write(octets)) {
      socket.pause();
      outer.once('drain', () => socket.resume());
    }
  };
  toServer(start);
  socket.on('data', (chunk: Buffer) => {
    let octets: Buffer;
    try {
      octets = rewriter.transform(chunk);
    } catch (err) {
      events.refused(err as Error);
      close();
      return;
    }
    toServer(octets);
  });
  socket.on('end', () => outer.end());
  outer.on('data', (chunk: Buffer) => {
    if (!socket.write(chunk)) {
      outer.pause();
      socket.once('drain', () => outer.resume());
    }
  });
  outer.on('end', () => socket.end());
  socket.resume();
}
