/**
 * A test kubelet: real HTTPS and HTTP servers on 127.0.0.1 serving GET /pods with a v1.PodList it
 * holds, kubelet-style bearer-token checks, and fault modes for the failure paths of the pod source.
 * The TLS chain (a CA plus a serving cert for 127.0.0.1/localhost, and an unrelated second CA for
 * "wrong CA" tests) is made with the openssl CLI into a private temp dir.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer as createHttpServer, type IncomingHttpHeaders, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import type { AddressInfo, Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/** How the next /pods answers misbehave. */
export type KubeletFault =
  | 'none'
  /** Both servers closed: connections are refused. */
  | 'down'
  /** Connections accepted and reset at once. */
  | 'reset'
  /** Answer after `delayMs`. */
  | 'slow'
  | 'status-500'
  /** A complete 200 response whose JSON body stops half way. */
  | 'truncated'
  /** Headers promise the full body, half is sent, then the connection is dropped. */
  | 'cut'
  /** A complete 200 response that is not JSON. */
  | 'malformed'
  /** A valid but enormous PodList (`hugeBytes`), streamed; with `contentLength` the size is declared up front. */
  | 'huge';

export interface FaultOptions {
  delayMs?: number;
  hugeBytes?: number;
  contentLength?: boolean;
}

/** One request as the fake kubelet saw it. */
export interface RecordedRequest {
  transport: 'http' | 'https';
  method: string;
  url: string;
  headers: IncomingHttpHeaders;
  time: number;
}

/** Files of the generated TLS material. */
export interface FakeKubeletCerts {
  dir: string;
  caFile: string;
  certFile: string;
  keyFile: string;
  /** A CA that did not sign the serving cert. */
  otherCaFile: string;
}

const MAX_RECORDED = 1000;

/** A running fake kubelet; call stop() when done. */
export class FakeKubelet {
  readonly certs: FakeKubeletCerts;
  httpsUrl = '';
  httpUrl = '';
  /** Requests seen (newest last, at most 1000 kept). */
  readonly requests: RecordedRequest[] = [];
  requestCount = 0;
  /** Responses the client abandoned before the body was complete (the client dropped the connection). */
  abortedResponses = 0;
  /** Encoded once per setPods, as kubelet serializes once per request: a 50 MB string re-encoded on every poll would make the test's own process the bottleneck. */
  #body: Buffer;
  #token: string | undefined;
  #fault: KubeletFault = 'none';
  #faultOpts: FaultOptions = {};
  readonly #https: Server;
  readonly #http: Server;
  readonly #sockets = new Set<Socket>();
  readonly #timers = new Set<NodeJS.Timeout>();
  #ports = { https: 0, http: 0 };

  private constructor(certs: FakeKubeletCerts, token: string | undefined, items: unknown[]) {
    this.certs = certs;
    this.#token = token;
    this.#body = Buffer.from(JSON.stringify(podList(items)));
    const tls = { key: readFileSync(certs.keyFile), cert: readFileSync(certs.certFile) };
    this.#https = createHttpsServer(tls, (req, res) => this.#handle('https', req, res));
    this.#http = createHttpServer((req, res) => this.#handle('http', req, res));
    for (const server of [this.#https, this.#http]) {
      // As kubelet's own server (IdleTimeout 90 s), not Node's 5 s: with Node's default a test whose
      // event loop is blocked for seconds (a spawnSync build) closes the agent's idle connection
      // under the poll it just sent, and the agent logs "kubelet /pods unreachable: read ECONNRESET".
      server.keepAliveTimeout = 90_000;
      server.on('connection', (socket: Socket) => {
        socket.on('error', () => {});
        if (this.#fault === 'reset') {
          socket.resetAndDestroy();
          return;
        }
        this.#sockets.add(socket);
        socket.on('close', () => this.#sockets.delete(socket));
      });
      server.on('tlsClientError', () => {});
    }
  }

  /** Starts both servers on 127.0.0.1 with fresh certificates. */
  static async start(opts: { token?: string; pods?: unknown[] } = {}): Promise<FakeKubelet> {
    const kubelet = new FakeKubelet(makeCerts(), opts.token, opts.pods ?? []);
    await kubelet.#listen();
    return kubelet;
  }

  /** Serves `items` (v1.Pod objects) as the PodList; a non-array object is served verbatim. */
  setPods(items: unknown[] | Record<string, unknown>): void {
    this.#body = Buffer.from(JSON.stringify(Array.isArray(items) ? podList(items) : items));
  }

  /** Serves these exact bytes as the /pods answer (a list with a broken item, say). */
  setBody(text: string): void {
    this.#body = Buffer.from(text);
  }

  /** The bearer token to require; undefined = no authentication (anonymous allowed). */
  setToken(token: string | undefined): void {
    this.#token = token;
  }

  /** Switches fault mode; 'down' closes the listeners and clearing it re-opens them on the same ports. */
  async setFault(fault: KubeletFault, opts: FaultOptions = {}): Promise<void> {
    const wasDown = this.#fault === 'down';
    this.#fault = fault;
    this.#faultOpts = opts;
    if (fault === 'down' && !wasDown) {
      await this.#close();
    } else if (fault !== 'down' && wasDown) {
      await this.#listen();
    }
  }

  /** Headers of the newest request. */
  lastHeaders(): IncomingHttpHeaders | undefined {
    return this.requests.at(-1)?.headers;
  }

  /** Closes everything and removes the certificates. */
  async stop(): Promise<void> {
    for (const t of this.#timers) clearTimeout(t);
    await this.#close();
    rmSync(this.certs.dir, { recursive: true, force: true });
  }

  async #listen(): Promise<void> {
    await Promise.all([
      listenOn(this.#https, this.#ports.https).then((p) => (this.#ports.https = p)),
      listenOn(this.#http, this.#ports.http).then((p) => (this.#ports.http = p)),
    ]);
    this.httpsUrl = `https://127.0.0.1:${this.#ports.https}`;
    this.httpUrl = `http://127.0.0.1:${this.#ports.http}`;
  }

  async #close(): Promise<void> {
    for (const s of this.#sockets) s.destroy();
    this.#sockets.clear();
    await Promise.all([this.#https, this.#http].map((s) => new Promise<void>((r) => (s.listening ? s.close(() => r()) : r()))));
  }

  #handle(transport: 'http' | 'https', req: IncomingMessage, res: ServerResponse): void {
    this.requestCount++;
    this.requests.push({ transport, method: req.method ?? '', url: req.url ?? '', headers: req.headers, time: Date.now() });
    if (this.requests.length > MAX_RECORDED) this.requests.shift();
    res.on('error', () => {});
    res.on('close', () => {
      if (!res.writableFinished) this.abortedResponses++;
    });

    if (req.method !== 'GET' || req.url !== '/pods') return text(res, 404, '404 page not found');
    if (this.#token !== undefined) {
      const auth = req.headers.authorization;
      if (!auth) return text(res, 401, 'Unauthorized');
      if (auth !== `Bearer ${this.#token}`) {
        return text(res, 403, 'Forbidden (user=system:serviceaccount:kube-system:probe-agent, verb=get, resource=nodes, subresource(s)=[pods])');
      }
    }
    switch (this.#fault) {
      case 'slow': {
        const t = setTimeout(() => {
          this.#timers.delete(t);
          if (!res.destroyed) json(res, this.#body);
        }, this.#faultOpts.delayMs ?? 1000);
        this.#timers.add(t);
        return;
      }
      case 'status-500':
        return text(res, 500, 'Internal Server Error: pod manager not ready');
      case 'truncated':
        return json(res, this.#body.subarray(0, Math.floor(this.#body.length / 2)));
      case 'cut': {
        const half = this.#body.subarray(0, Math.floor(this.#body.length / 2));
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': this.#body.length });
        res.write(half, () => res.destroy());
        return;
      }
      case 'malformed':
        return json(res, '<html><body>502 Bad Gateway</body></html>');
      case 'huge':
        return streamHuge(res, this.#faultOpts.hugeBytes ?? 80 * 1024 * 1024, this.#faultOpts.contentLength === true);
      default:
        return json(res, this.#body);
    }
  }
}

/** Wraps pod objects in a PodList the way the kubelet encodes it. */
export function podList(items: unknown[]): Record<string, unknown> {
  return { kind: 'PodList', apiVersion: 'v1', metadata: {}, items };
}

function json(res: ServerResponse, body: string | Buffer): void {
  res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
  res.end(body);
}

function text(res: ServerResponse, status: number, body: string): void {
  res.writeHead(status, { 'content-type': 'text/plain; charset=utf-8', 'content-length': Buffer.byteLength(body) + 1 });
  res.end(`${body}\n`);
}

/** Streams a valid PodList padded with whitespace to `bytes`, respecting backpressure. */
function streamHuge(res: ServerResponse, bytes: number, declare: boolean): void {
  const head = '{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[]';
  const tail = '}';
  const padTotal = Math.max(0, bytes - head.length - tail.length);
  res.writeHead(200, { 'content-type': 'application/json', ...(declare ? { 'content-length': bytes } : {}) });
  res.write(head);
  const chunk = ' '.repeat(64 * 1024);
  let left = padTotal;
  const pump = (): void => {
    while (left > 0 && !res.destroyed) {
      const n = Math.min(left, chunk.length);
      left -= n;
      if (!res.write(n === chunk.length ? chunk : chunk.slice(0, n))) {
        res.once('drain', pump);
        return;
      }
    }
    if (!res.destroyed) res.end(tail);
  };
  pump();
}

function listenOn(server: Server, port: number): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, '127.0.0.1', () => {
      server.off('error', reject);
      resolve((server.address() as AddressInfo).port);
    });
  });
}

/** A CA, a serving cert it signed (IP:127.0.0.1, DNS:localhost), and an unrelated CA. */
export function makeCerts(): FakeKubeletCerts {
  const dir = mkdtempSync(join(tmpdir(), 'fake-kubelet-'));
  const f = (name: string): string => join(dir, name);
  const ssl = (args: string[]): void => {
    execFileSync('openssl', args, { stdio: ['ignore', 'ignore', 'pipe'], timeout: 30_000 });
  };
  const newCa = (name: string): void => ssl([
    'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
    '-keyout', f(`${name}.key`), '-out', f(`${name}.crt`), '-days', '2', '-subj', `/CN=${name}`,
    '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign',
  ]);
  newCa('fake-kubelet-ca');
  newCa('unrelated-ca');
  ssl([
    'req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
    '-keyout', f('kubelet.key'), '-out', f('kubelet.csr'), '-subj', '/CN=node-a@fake-kubelet',
  ]);
  writeFileSync(f('ext.cnf'), 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n');
  ssl([
    'x509', '-req', '-in', f('kubelet.csr'), '-CA', f('fake-kubelet-ca.crt'), '-CAkey', f('fake-kubelet-ca.key'),
    '-CAcreateserial', '-out', f('kubelet.crt'), '-days', '2', '-extfile', f('ext.cnf'),
  ]);
  return { dir, caFile: f('fake-kubelet-ca.crt'), certFile: f('kubelet.crt'), keyFile: f('kubelet.key'), otherCaFile: f('unrelated-ca.crt') };
}
