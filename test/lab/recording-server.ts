/**
 * A small HTTP/HTTPS server that records every request it gets, for tests that must count requests
 * or see their headers at the server (lifecycle hooks, on-demand mode): started in a netns with
 * startRecordingServer(); each request is one `req {json}` line on stdout, collected by the parent.
 * Endpoints: /status/NNN answers NNN, /redirect?to=URL&code=NNN a redirect, /slow?ms=N after N ms,
 * /loop redirects to itself, /hang never answers; anything else 200 with a body that must never show up in a result.
 * `httpOnTls`: a plain HTTP server, to stand where an HTTPS one is expected (kubelet's HTTP fallback).
 */
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { readFileSync } from 'node:fs';
import * as http from 'node:http';
import * as https from 'node:https';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

/** One recorded request. */
export interface RecordedHit {
  port: number;
  tls: boolean;
  method: string;
  url: string;
  headers: Record<string, string | string[] | undefined>;
  /** When the server got it (Date.now() in the server, the same host clock). */
  time: number;
}

/** Where to listen (0 = any free port) and the TLS key pair for https. */
export interface RecordingOptions {
  http?: number;
  https?: number;
  cert?: string;
  key?: string;
}

/** A running recording server. */
export interface RecordingServer {
  ports: { http?: number; https?: number };
  hits: RecordedHit[];
  /** Hits whose path starts with `prefix`. */
  count(prefix: string): number;
  /**
   * Waits until `n` requests in all have been recorded (a request's line can arrive after its
   * response), or rejects after `timeoutMs`; returns the hits.
   */
  waitFor(n: number, timeoutMs?: number): Promise<RecordedHit[]>;
  stop(): Promise<void>;
}

const SELF = fileURLToPath(import.meta.url);

/** Starts the server inside `netnsName` (ip netns) or the given nsenter netns path. */
export async function startRecordingServer(netns: string, opts: RecordingOptions): Promise<RecordingServer> {
  const argv = netns.startsWith('/')
    ? ['nsenter', [`--net=${netns}`, '--', process.execPath, SELF, JSON.stringify(opts)]] as const
    : ['ip', ['netns', 'exec', netns, process.execPath, SELF, JSON.stringify(opts)]] as const;
  const child: ChildProcessWithoutNullStreams = spawn(argv[0], [...argv[1]], { stdio: ['pipe', 'pipe', 'pipe'] });
  child.stdin.on('error', () => {});
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => { stderr = (stderr + d.toString()).slice(-4000); });
  const hits: RecordedHit[] = [];
  const lines = createInterface({ input: child.stdout });
  const ports = await new Promise<RecordingServer['ports']>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`recording server did not start: ${stderr}`)), 10_000);
    lines.on('line', (line) => {
      if (line.startsWith('ready ')) {
        clearTimeout(timer);
        resolve(JSON.parse(line.slice(6)) as RecordingServer['ports']);
      } else if (line.startsWith('req ')) {
        hits.push(JSON.parse(line.slice(4)) as RecordedHit);
      }
    });
    child.once('exit', (code) => { clearTimeout(timer); reject(new Error(`recording server exited (${code}): ${stderr}`)); });
  });
  return {
    ports,
    hits,
    count: (prefix) => hits.filter((h) => h.url.startsWith(prefix)).length,
    waitFor: async (n, timeoutMs = 5000) => {
      const end = Date.now() + timeoutMs;
      while (hits.length < n) {
        if (Date.now() > end) throw new Error(`recording server: ${hits.length} requests, waited for ${n}`);
        await new Promise((r) => setTimeout(r, 10));
      }
      return hits;
    },
    stop: async () => {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const closed = new Promise((r) => child.once('close', r));
      child.stdin.end();
      const t = setTimeout(() => child.kill('SIGKILL'), 3000);
      await closed;
      clearTimeout(t);
    },
  };
}

/** The server itself (this file run as a program). */
async function serve(opts: RecordingOptions): Promise<void> {
  const handler = (tls: boolean) => (req: http.IncomingMessage, res: http.ServerResponse): void => {
    const port = req.socket.localPort ?? 0;
    process.stdout.write(`req ${JSON.stringify({ port, tls, method: req.method, url: req.url, headers: req.headers, time: Date.now() })}\n`);
    const url = new URL(req.url ?? '/', 'http://x.invalid');
    const status = /^\/status\/(\d{3})$/.exec(url.pathname);
    if (status) return void res.writeHead(Number(status[1]), { 'Content-Type': 'text/plain' }).end(`status ${status[1]} SECRET-BODY`);
    if (url.pathname === '/redirect') {
      return void res.writeHead(Number(url.searchParams.get('code') ?? 302), { Location: url.searchParams.get('to') ?? '/' }).end();
    }
    if (url.pathname === '/slow') {
      const t = setTimeout(() => res.end('slept'), Number(url.searchParams.get('ms') ?? 1000));
      return void res.on('close', () => clearTimeout(t));
    }
    if (url.pathname === '/loop') return void res.writeHead(302, { Location: '/loop' }).end();
    if (url.pathname === '/hang') return;
    res.writeHead(200, { 'Content-Type': 'text/plain' }).end('ok SECRET-BODY');
  };
  const ports: RecordingServer['ports'] = {};
  const listen = (srv: http.Server, port: number): Promise<number> =>
    new Promise((resolve) => srv.listen(port, '::', () => resolve((srv.address() as { port: number }).port)));
  if (opts.http !== undefined) ports.http = await listen(http.createServer(handler(false)), opts.http);
  if (opts.https !== undefined) {
    const srv = https.createServer({ cert: readFileSync(opts.cert ?? ''), key: readFileSync(opts.key ?? '') }, handler(true));
    ports.https = await listen(srv, opts.https);
  }
  process.stdout.write(`ready ${JSON.stringify(ports)}\n`);
  process.stdin.resume();
  process.stdin.on('end', () => process.exit(0));
}

if (process.argv[1] === SELF) await serve(JSON.parse(process.argv[2] ?? '{}') as RecordingOptions);
