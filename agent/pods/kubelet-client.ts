/**
 * Reads the kubelet's pod list (GET <url>/pods, a v1.PodList). The kubelet has no watch, so the
 * caller polls; this module only does one bounded, authenticated request per call.
 */
import { createHash } from 'node:crypto';
import { readFileSync, statSync } from 'node:fs';
import http, { type IncomingMessage } from 'node:http';
import { Agent as HttpsAgent, request as httpsRequest, type RequestOptions } from 'node:https';
import { boundedInt } from '../config/bounds.ts';
import { ConfigError, ProbeAgentError, describeError } from '../errors.ts';
import { silentLogger, type Logger } from '../log.ts';
import { PodListSplitter } from './pod-list-stream.ts';

/** Why a kubelet request failed; a bounded set, used as a metric label. */
export type KubeletErrorKind = 'unreachable' | 'timeout' | 'http-status' | 'too-large' | 'malformed' | 'unauthorized';
export const KUBELET_ERROR_KINDS: readonly KubeletErrorKind[] = [
  'unreachable', 'timeout', 'http-status', 'too-large', 'malformed', 'unauthorized',
];

/** A failed kubelet pod-list request (or an unusable answer). */
export class KubeletError extends ProbeAgentError {
  readonly kind: KubeletErrorKind;
  /** The HTTP status, for 'http-status' and 'unauthorized' answers. */
  readonly status?: number;
  constructor(kind: KubeletErrorKind, message: string, context: Record<string, unknown> = {}, options?: { cause?: unknown; status?: number }) {
    super(`kubelet-${kind}`, message, context, options);
    this.kind = kind;
    if (options?.status !== undefined) this.status = options.status;
  }
}

/** What the agent's service account needs for /pods; said in every 401/403 error. */
export const KUBELET_RBAC_HINT = 'the agent needs get on nodes/pods, or nodes/proxy on clusters before 1.33 (KubeletFineGrainedAuthz)';

/** How to reach and authenticate to the kubelet. */
export interface KubeletClientOptions {
  /** Base URL: https://<node>:10250, http://127.0.0.1:10255 (read-only port) or an apiserver node-proxy path. */
  url: string;
  /** PEM CA bundle that signed the kubelet serving certificate; absent = the system trust store. */
  caFile?: string;
  /** Skip kubelet certificate verification (self-signed kubelet certs); must be asked for explicitly. */
  insecureTLS?: boolean;
  /** Name to verify the kubelet certificate against when the URL holds an IP (certs often lack IP SANs). */
  tlsServerName?: string;
  /** Bearer token file (a projected service-account token); re-read when it changes. Absent = no Authorization header. */
  tokenFile?: string;
  /** Whole-request deadline; default 10 s. */
  timeoutMs?: number;
  /**
   * Response body cap; default 64 MiB. The answer is read pod by pod and never held whole, so this
   * bounds the time a poll takes, not memory.
   */
  maxResponseBytes?: number;
  /** Largest pod (its JSON) parsed; a larger one is dropped and reported, the others kept. Default 1 MiB. */
  maxPodBytes?: number;
  /** Pods parsed per list; the ones beyond are dropped and reported. Default 5000. */
  maxPods?: number;
  /**
   * Maps each pod as soon as it is read (the daemon: pod-model's convertPodItem, to PodInfo), so the
   * raw JSON of the list is never held whole. Default: items stay raw JSON.
   */
  convertItem?: (raw: unknown) => unknown;
  log?: Logger;
}

export const DEFAULT_KUBELET_TIMEOUT_MS = 10_000;
export const DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024 * 1024;
export const DEFAULT_MAX_POD_BYTES = 1024 * 1024;
/** Answers up to this size are held until they end, to skip an unchanged list without reading it again. */
const BUFFERED_ANSWER_BYTES = 4 * 1024 * 1024;
export const DEFAULT_MAX_PODS = 5000;
/** Service-account tokens are ~1-2 KiB; anything near this is not a token. */
const MAX_TOKEN_BYTES = 64 * 1024;
/** Kubelet error bodies are one line ("Forbidden (user=..., verb=get, ...)"); keep a short excerpt. */
const ERROR_EXCERPT_BYTES = 512;

/**
 * Fetches the kubelet's /pods over a dedicated keep-alive connection (never the global agent).
 * node:http(s), not undici: Node's built-in parser is native, while undici compiles its WASM HTTP
 * parser into every process that makes one request, about 18 MB of RSS an idle agent (no HTTP
 * probes) would carry only for this poll (measured with Node 24, undici 8).
 */
export class KubeletClient {
  readonly url: string;
  readonly #agent: http.Agent;
  readonly #https: boolean;
  readonly #origin: string;
  readonly #servername: string | undefined;
  readonly #path: string;
  /** The last answer's digest and what it parsed to: an unchanged pod list is handed back as the same object. */
  #last: { digest: string; json: unknown; items: ReadonlyMap<string, unknown> } | undefined;
  readonly #maxPodBytes: number;
  readonly #maxPods: number;
  readonly #convertItem: ((raw: unknown) => unknown) | undefined;
  readonly #timeoutMs: number;
  readonly #maxBytes: number;
  readonly #token: TokenFile | undefined;
  readonly #log: Logger;

  constructor(opts: KubeletClientOptions) {
    const url = parseKubeletUrl(opts.url);
    const https = url.protocol === 'https:';
    if (!https && (opts.caFile || opts.insecureTLS || opts.tlsServerName)) {
      throw new ConfigError(`kubelet URL ${url.origin} is plain http: TLS options (CA file, insecure TLS, server name) do not apply`);
    }
    if (opts.insecureTLS && opts.caFile) {
      throw new ConfigError('kubelet: give either a CA file or insecure TLS, not both');
    }
    this.#timeoutMs = boundedInt(opts.timeoutMs ?? DEFAULT_KUBELET_TIMEOUT_MS, 1, 3_600_000, 'kubelet request timeout (ms)');
    this.#maxBytes = boundedInt(opts.maxResponseBytes ?? DEFAULT_MAX_RESPONSE_BYTES, 1, 1 << 30, 'kubelet max response bytes');
    this.#maxPodBytes = boundedInt(opts.maxPodBytes ?? DEFAULT_MAX_POD_BYTES, 1024, 64 << 20, 'kubelet max pod bytes');
    this.#maxPods = boundedInt(opts.maxPods ?? DEFAULT_MAX_PODS, 1, 1_000_000, 'kubelet max pods');
    this.#convertItem = opts.convertItem;
    let ca: string | undefined;
    if (opts.caFile) {
      try {
        ca = readFileSync(opts.caFile, 'utf8');
      } catch (err) {
        throw new ConfigError(`kubelet CA file ${opts.caFile}: ${describeError(err)}`, { caFile: opts.caFile });
      }
      if (!ca.includes('-----BEGIN CERTIFICATE-----')) {
        throw new ConfigError(`kubelet CA file ${opts.caFile} holds no PEM certificate`, { caFile: opts.caFile });
      }
    }
    this.url = url.href;
    this.#path = `${url.pathname.replace(/\/+$/, '')}/pods`;
    this.#log = opts.log ?? silentLogger;
    this.#token = opts.tokenFile ? new TokenFile(opts.tokenFile, this.#log) : undefined;
    this.#https = https;
    this.#origin = url.origin;
    this.#servername = opts.tlsServerName;
    // One connection, kept between polls; the whole-request deadline in getPods bounds every phase.
    this.#agent = https
      ? new HttpsAgent({ keepAlive: true, maxSockets: 1, rejectUnauthorized: !opts.insecureTLS, ...(ca !== undefined ? { ca } : {}) })
      : new http.Agent({ keepAlive: true, maxSockets: 1 });
  }

  /**
   * GET /pods: resolves with the parsed JSON (the very same object as last time when the answer is
   * byte-identical: treat it as read-only); rejects with KubeletError (or the caller's abort reason).
   */
  async getPods(signal?: AbortSignal): Promise<unknown> {
    signal?.throwIfAborted();
    const headers: Record<string, string> = { accept: 'application/json', 'user-agent': 'probe-agent' };
    const token = this.#token?.read();
    if (token) headers.authorization = `Bearer ${token}`;

    const deadline = new AbortController();
    const timer = setTimeout(() => deadline.abort(new KubeletError('timeout', `kubelet did not answer /pods within ${this.#timeoutMs} ms`, { url: this.url })), this.#timeoutMs);
    const combined = signal ? AbortSignal.any([signal, deadline.signal]) : deadline.signal;
    try {
      const res = await this.#request(headers, combined);
      const declared = Number(res.headers['content-length']);
      if (Number.isFinite(declared) && declared > this.#maxBytes) {
        // Destroying (not draining) drops the connection instead of reading 64+ MiB we will not use.
        res.destroy();
        throw tooLarge(this.#maxBytes, this.url);
      }
      if (res.statusCode !== 200) {
        const excerpt = await readExcerpt(res);
        throw statusError(res.statusCode ?? 0, excerpt, this.url);
      }
      // Pod by pod: only the pod being read is held, so one oversized pod costs its cap, not the
      // whole list (and is dropped alone, see pod-list-stream.ts). An answer of up to
      // BUFFERED_ANSWER_BYTES (a real node's) is kept until it ends instead: between pod changes
      // kubelet answers the same bytes every poll, and those are recognised by their digest
      // without being read again (issue 14).
      const splitter = new PodListSplitter({ maxPodBytes: this.#maxPodBytes, maxPods: this.#maxPods, previous: this.#last?.items, convert: this.#convertItem });
      let buffered: Buffer[] | undefined = [];
      let bufferedBytes = 0;
      for await (const chunk of res) {
        const bytes = chunk as Buffer;
        if (splitter.totalBytes + bufferedBytes + bytes.length > this.#maxBytes) {
          res.destroy();
          throw tooLarge(this.#maxBytes, this.url);
        }
        if (buffered && bufferedBytes + bytes.length <= BUFFERED_ANSWER_BYTES) {
          buffered.push(bytes);
          bufferedBytes += bytes.length;
          continue;
        }
        if (buffered) {
          for (const b of buffered) splitter.push(b);
          buffered = undefined;
          bufferedBytes = 0;
        }
        splitter.push(bytes);
      }
      if (buffered) {
        const digest = createHash('sha256').update(Buffer.concat(buffered, bufferedBytes)).digest('hex');
        // The same bytes as last time: the same object, which the pod source recognises and skips.
        if (this.#last?.digest === digest) return this.#last.json;
        for (const b of buffered) splitter.push(b);
      }
      const { list, digest } = splitter.end();
      if (this.#last?.digest === digest) return this.#last.json;
      this.#last = { digest, json: list, items: splitter.parsedByDigest };
      return list;
    } catch (err) {
      if (signal?.aborted && !deadline.signal.aborted) throw signal.reason;
      throw toKubeletError(err, deadline.signal, this.url, this.#maxBytes);
    } finally {
      clearTimeout(timer);
    }
  }

  /** Closes the connection; pending requests fail. */
  async close(): Promise<void> {
    this.#agent.destroy();
  }

  #request(headers: Record<string, string>, signal: AbortSignal): Promise<IncomingMessage> {
    return new Promise<IncomingMessage>((resolve, reject) => {
      const options: RequestOptions = { method: 'GET', headers, agent: this.#agent, signal };
      if (this.#servername) options.servername = this.#servername;
      const target = new URL(this.#path, this.#origin);
      const req = this.#https ? httpsRequest(target, options, resolve) : http.request(target, options, resolve);
      req.once('error', reject);
      req.end();
    });
  }
}

/** Re-reads a token file whenever its identity (inode, size, mtime) changes: projected tokens rotate by symlink swap. */
class TokenFile {
  readonly #path: string;
  readonly #log: Logger;
  #stamp = '';
  #token: string | undefined;
  #warned = false;

  constructor(path: string, log: Logger) {
    this.#path = path;
    this.#log = log;
  }

  /** The current token; a failed re-read keeps the previous token (a rotation may be half done). */
  read(): string {
    try {
      const st = statSync(this.#path);
      const stamp = `${st.dev}:${st.ino}:${st.size}:${st.mtimeMs}`;
      if (stamp === this.#stamp && this.#token !== undefined) return this.#token;
      if (st.size > MAX_TOKEN_BYTES) throw new Error(`token file is ${st.size} bytes, more than ${MAX_TOKEN_BYTES}`);
      const token = readFileSync(this.#path, 'utf8').trim();
      if (!token) throw new Error('token file is empty');
      if (/[\s\x00-\x1f\x7f]/.test(token)) throw new Error('token holds whitespace or control characters');
      if (this.#token !== undefined && token !== this.#token) this.#log.info('kubelet bearer token reloaded', { tokenFile: this.#path });
      this.#stamp = stamp;
      this.#token = token;
      this.#warned = false;
      return token;
    } catch (err) {
      if (this.#token !== undefined) {
        if (!this.#warned) this.#log.warn('kubelet token file unreadable; using the previous token', { tokenFile: this.#path, error: describeError(err) });
        this.#warned = true;
        return this.#token;
      }
      throw new KubeletError('unauthorized', `cannot read kubelet bearer token file ${this.#path}: ${describeError(err)}`, { tokenFile: this.#path });
    }
  }
}

function parseKubeletUrl(raw: string): URL {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new ConfigError(`kubelet URL "${raw}" is not a URL (want https://<node>:10250 or http://127.0.0.1:10255)`);
  }
  if (url.protocol !== 'https:' && url.protocol !== 'http:') throw new ConfigError(`kubelet URL ${raw}: scheme must be https or http`);
  if (url.username || url.password) throw new ConfigError('kubelet URL must not hold credentials: use the token file');
  if (url.search || url.hash) throw new ConfigError(`kubelet URL ${raw} must not have a query or fragment`);
  return url;
}

function tooLarge(max: number, url: string): KubeletError {
  return new KubeletError('too-large', `kubelet /pods answer is larger than the ${max}-byte cap (raise --kubelet-max-response-bytes)`, { url, maxBytes: max });
}

async function readExcerpt(body: AsyncIterable<unknown> & { destroy(): unknown }): Promise<string> {
  let text = '';
  try {
    for await (const chunk of body) {
      text += Buffer.from(chunk as Buffer).toString('utf8');
      if (text.length >= ERROR_EXCERPT_BYTES) break;
    }
  } catch {
    // The status is what matters; a broken error body is not worth a second error.
  } finally {
    body.destroy();
  }
  return text.slice(0, ERROR_EXCERPT_BYTES).replace(/[\x00-\x1f\x7f]+/g, ' ').trim();
}

function statusError(status: number, excerpt: string, url: string): KubeletError {
  const said = excerpt ? ` (${excerpt})` : '';
  if (status === 401 || status === 403) {
    const who = status === 401 ? 'rejected the credentials' : 'denied access';
    return new KubeletError('unauthorized', `kubelet ${who} for /pods: HTTP ${status}${said}; ${KUBELET_RBAC_HINT}`, { url, status }, { status });
  }
  return new KubeletError('http-status', `kubelet /pods answered HTTP ${status}${said}`, { url, status }, { status });
}

function toKubeletError(err: unknown, deadline: AbortSignal, url: string, maxBytes: number): KubeletError {
  if (err instanceof KubeletError) return err;
  if (deadline.aborted && deadline.reason instanceof KubeletError) return deadline.reason;
  const code = (err as { code?: string } | undefined)?.code ?? '';
  if (code === 'UND_ERR_RES_EXCEEDED_MAX_SIZE') return tooLarge(maxBytes, url);
  if (code === 'ETIMEDOUT') {
    return new KubeletError('timeout', `kubelet /pods timed out: ${describeError(err)}`, { url }, { cause: err });
  }
  if (isTlsError(code, err)) {
    return new KubeletError('unreachable', `TLS to the kubelet failed: ${describeError(err)}; check --kubelet-ca-file / --kubelet-tls-server-name, or use --kubelet-insecure-tls`, { url, code }, { cause: err });
  }
  return new KubeletError('unreachable', `kubelet /pods unreachable: ${describeError(err)}`, { url, code }, { cause: err });
}

function isTlsError(code: string, err: unknown): boolean {
  if (/^ERR_TLS_|^ERR_SSL_|CERT|SELF_SIGNED|UNABLE_TO_(GET|VERIFY)|HOSTNAME_MISMATCH/.test(code)) return true;
  return err instanceof Error && /certificate|SSL routines|TLS/i.test(err.message);
}
