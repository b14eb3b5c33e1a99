/**
 * A hostile client of a TLS server's connection slots: keeps `sockets` connections open from each
 * of its source addresses and opens a new one as soon as one is cut, so a server that counts
 * connections before TLS stays full. Modes:
 *
 * - `idle`:           TCP connect, send nothing
 * - `slow-handshake`: send the first bytes of a TLS record header, then nothing (a handshake that never ends)
 * - `tls-idle`:       finish the TLS handshake (no client certificate), then send nothing
 *
 * Counts connections opened and cut, for "did the attack run" assertions.
 */
import * as net from 'node:net';
import * as tls from 'node:tls';

export type FloodMode = 'idle' | 'slow-handshake' | 'tls-idle';

export interface FloodOptions {
  host: string;
  port: number;
  mode: FloodMode;
  /** Source addresses to connect from (loopback aliases such as 127.0.0.2 need no setup on Linux). */
  from: string[];
  /** Connections kept open per source address. */
  sockets: number;
  /** Server name for `tls-idle`. */
  servername?: string;
}

export interface ConnectionFlood {
  /** Connections opened so far. */
  readonly opened: number;
  /** Connections the server cut (closed while the flood was running). */
  readonly cut: number;
  /** Connections open now. */
  readonly open: number;
  stop(): void;
}

/** A TLS record header (handshake, TLS 1.0 version) announcing a ClientHello that never comes. */
const PARTIAL_RECORD = Buffer.from([0x16, 0x03, 0x01, 0x02]);

export function startConnectionFlood(opts: FloodOptions): ConnectionFlood {
  let stopped = false;
  let opened = 0;
  let cut = 0;
  const live = new Set<net.Socket>();
  const open = (from: string): void => {
    if (stopped) return;
    opened++;
    let socket: net.Socket;
    if (opts.mode === 'tls-idle') {
      socket = tls.connect({ socket: net.connect({ host: opts.host, port: opts.port, localAddress: from }), servername: opts.servername ?? 'localhost', rejectUnauthorized: false });
    } else {
      socket = net.connect({ host: opts.host, port: opts.port, localAddress: from });
      if (opts.mode === 'slow-handshake') socket.once('connect', () => socket.write(PARTIAL_RECORD));
    }
    live.add(socket);
    socket.on('error', () => undefined);
    socket.once('close', () => {
      live.delete(socket);
      if (stopped) return;
      cut++;
      // Reopen at once, but off this tick: a server refusing at accept must not make a hot loop.
      setImmediate(() => open(from));
    });
  };
  for (const from of opts.from) for (let i = 0; i < opts.sockets; i++) open(from);
  return {
    get opened() {
      return opened;
    },
    get cut() {
      return cut;
    },
    get open() {
      return live.size;
    },
    stop() {
      stopped = true;
      for (const s of live) s.destroy();
      live.clear();
    },
  };
}

/**
 * Run as a program (`node test/lab/connection-flood.ts '<FloodOptions[] as JSON>'`), the floods get
 * their own process, as a hostile pod has its own CPU: a flood sharing the event loop of the caller
 * it attacks would slow that caller's own handshakes. Prints `ready` once every flood is started;
 * at the end of stdin it stops them and prints their counts as one JSON line.
 */
if (process.argv[1] && import.meta.filename === process.argv[1]) {
  const floods = (JSON.parse(process.argv[2] ?? '[]') as FloodOptions[]).map(startConnectionFlood);
  process.stdout.write('ready\n');
  process.stdin.resume();
  process.stdin.once('end', () => {
    const counts = floods.map((f) => ({ opened: f.opened, cut: f.cut }));
    for (const f of floods) f.stop();
    process.stdout.write(`${JSON.stringify(counts)}\n`, () => process.exit(0));
  });
}
