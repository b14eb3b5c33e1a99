/**
 * One HTTP/2 connection to a unix socket (the runtime's or the agent's), opened on first use and
 * reopened after it breaks, so the shim holds no state a restart of either side could spoil.
 */
import * as http2 from 'node:http2';
import * as net from 'node:net';

/** HTTP/2 settings for long CRI answers (ListContainers on a busy node): a 1 MiB window avoids round trips. */
export const H2_SETTINGS: http2.Settings = { initialWindowSize: 1 << 20, maxConcurrentStreams: 1000 };

/** A lazily (re)connected HTTP/2 client session. */
export class UpstreamSession {
  readonly socketPath: string;
  #session: http2.ClientHttp2Session | undefined;

  constructor(socketPath: string) {
    this.socketPath = socketPath;
  }

  /** The live session, or a new one when there is none. */
  get(): http2.ClientHttp2Session {
    const cur = this.#session;
    if (cur && !cur.closed && !cur.destroyed) return cur;
    const path = this.socketPath;
    const session = http2.connect('http://localhost', {
      createConnection: () => net.connect(path),
      settings: H2_SETTINGS,
      maxSessionMemory: 64,
    });
    const drop = (): void => {
      if (this.#session === session) this.#session = undefined;
    };
    // Errors surface on the streams; the session just goes away and the next call reconnects.
    session.on('error', drop);
    session.on('close', drop);
    session.on('goaway', drop);
    session.on('connect', () => session.setLocalWindowSize(1 << 22));
    session.unref();
    this.#session = session;
    return session;
  }

  close(): void {
    const s = this.#session;
    this.#session = undefined;
    s?.close();
  }
}
