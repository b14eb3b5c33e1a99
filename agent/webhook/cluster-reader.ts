/**
 * What the webhook reads from the API server, and nothing more: one Node (its labels and
 * annotations, for a DaemonSet pod pinned to it) and one RuntimeClass (its handler). RBAC: `get`
 * on `nodes` and on `runtimeclasses.node.k8s.io`. Answers are cached (bounded, short TTL) so a
 * DaemonSet rollout over many nodes or a burst of pods of one class costs one read each; a read
 * that fails is never cached, and its error is typed so the admission can leave the pod as
 * written (the safe side) and say why.
 */
import { readFileSync } from 'node:fs';
import { Agent, request } from 'undici';
import { ProbeAgentError } from '../errors.ts';

/** What the webhook needs of a Node. */
export interface NodeFacts {
  labels: Record<string, string>;
  annotations: Record<string, string>;
}

/** Reads cluster objects for admission decisions. `null`: the object does not exist. */
export interface ClusterReader {
  node(name: string): Promise<NodeFacts | null>;
  runtimeHandler(runtimeClassName: string): Promise<string | null>;
}

/** A read from the API server that failed (unreachable, refused, not authorised, bad answer). */
export class ClusterReadError extends ProbeAgentError {
  constructor(what: string, message: string) {
    super('cluster-read', `${what}: ${message}`, { what });
  }
}

export interface ApiServerReaderOptions {
  /** Base URL, e.g. https://10.96.0.1:443; in a pod: from KUBERNETES_SERVICE_HOST/PORT. */
  url: string;
  /** Bearer token file (re-read on every request: projected tokens rotate). */
  tokenFile?: string;
  /** CA bundle of the API server (PEM file). */
  caFile?: string;
  /** Per-request timeout; the API server gives the whole webhook call `timeoutSeconds` (3 s). */
  timeoutMs?: number;
  /** How long an answer is reused. */
  ttlMs?: number;
  /** Most entries kept per kind. */
  maxEntries?: number;
}

const SA_DIR = '/var/run/secrets/kubernetes.io/serviceaccount';
/** Largest object body read (a Node with many labels and images is tens of KiB). */
const MAX_BODY = 4 * 1024 * 1024;
/** Kubernetes object names: DNS subdomains. */
const NAME = /^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/;

/** The in-cluster API server address and credentials, or undefined outside a pod. */
export function inClusterOptions(): ApiServerReaderOptions | undefined {
  const host = process.env.KUBERNETES_SERVICE_HOST;
  const port = process.env.KUBERNETES_SERVICE_PORT;
  if (!host || !port) return undefined;
  return { url: `https://${host.includes(':') ? `[${host}]` : host}:${port}`, tokenFile: `${SA_DIR}/token`, caFile: `${SA_DIR}/ca.crt` };
}

interface Entry<T> { value: T; until: number }

/** A small TTL cache with a size bound (oldest entry out first). */
class TtlCache<T> {
  private readonly map = new Map<string, Entry<T>>();
  private readonly ttlMs: number;
  private readonly max: number;
  constructor(ttlMs: number, max: number) {
    this.ttlMs = ttlMs;
    this.max = max;
  }
  get(key: string): T | undefined {
    const e = this.map.get(key);
    if (!e) return undefined;
    if (e.until <= Date.now()) {
      this.map.delete(key);
      return undefined;
    }
    return e.value;
  }
  set(key: string, value: T): void {
    this.map.delete(key);
    if (this.map.size >= this.max) this.map.delete(this.map.keys().next().value as string);
    this.map.set(key, { value, until: Date.now() + this.ttlMs });
  }
}

/** Reads Nodes and RuntimeClasses from the API server. */
export class ApiServerReader implements ClusterReader {
  private readonly dispatcher: Agent;
  private readonly nodes: TtlCache<NodeFacts | null>;
  private readonly classes: TtlCache<string | null>;
  private readonly timeoutMs: number;
  private readonly opts: ApiServerReaderOptions;

  constructor(opts: ApiServerReaderOptions) {
    this.opts = opts;
    const ca = opts.caFile ? readFileSync(opts.caFile, 'utf8') : undefined;
    this.dispatcher = new Agent({ connect: ca ? { ca } : {}, connections: 4 });
    this.timeoutMs = opts.timeoutMs ?? 2000;
    this.nodes = new TtlCache(opts.ttlMs ?? 10_000, opts.maxEntries ?? 5000);
    this.classes = new TtlCache(opts.ttlMs ?? 10_000, opts.maxEntries ?? 5000);
  }

  async node(name: string): Promise<NodeFacts | null> {
    const cached = this.nodes.get(name);
    if (cached !== undefined) return cached;
    const obj = await this.get(`node ${name}`, name, `/api/v1/nodes/${encodeURIComponent(name)}`);
    const meta = obj && typeof obj.metadata === 'object' && obj.metadata ? (obj.metadata as Record<string, unknown>) : {};
    const facts = obj ? { labels: stringMap(meta.labels), annotations: stringMap(meta.annotations) } : null;
    this.nodes.set(name, facts);
    return facts;
  }

  async runtimeHandler(runtimeClassName: string): Promise<string | null> {
    const cached = this.classes.get(runtimeClassName);
    if (cached !== undefined) return cached;
    const obj = await this.get(`runtimeclass ${runtimeClassName}`, runtimeClassName, `/apis/node.k8s.io/v1/runtimeclasses/${encodeURIComponent(runtimeClassName)}`);
    const handler = obj ? (typeof obj.handler === 'string' ? obj.handler : '') : null;
    if (handler === '') throw new ClusterReadError(`runtimeclass ${runtimeClassName}`, 'has no handler');
    this.classes.set(runtimeClassName, handler);
    return handler;
  }

  close(): Promise<void> {
    return this.dispatcher.close();
  }

  private async get(what: string, name: string, path: string): Promise<Record<string, unknown> | null> {
    if (!NAME.test(name)) throw new ClusterReadError(what, 'not a valid object name');
    const headers: Record<string, string> = { accept: 'application/json' };
    if (this.opts.tokenFile) {
      try {
        headers.authorization = `Bearer ${readFileSync(this.opts.tokenFile, 'utf8').trim()}`;
      } catch (err) {
        throw new ClusterReadError(what, `cannot read the token: ${(err as Error).message}`);
      }
    }
    let res;
    try {
      res = await request(new URL(path, this.opts.url), { method: 'GET', headers, dispatcher: this.dispatcher, headersTimeout: this.timeoutMs, bodyTimeout: this.timeoutMs, signal: AbortSignal.timeout(this.timeoutMs) });
    } catch (err) {
      throw new ClusterReadError(what, `API server unreachable: ${(err as Error).message}`);
    }
    const chunks: Buffer[] = [];
    let size = 0;
    for await (const c of res.body as AsyncIterable<Buffer>) {
      size += c.length;
      if (size > MAX_BODY) {
        res.body.destroy();
        throw new ClusterReadError(what, `answer larger than ${MAX_BODY} bytes`);
      }
      chunks.push(c);
    }
    if (res.statusCode === 404) return null;
    if (res.statusCode !== 200) throw new ClusterReadError(what, `HTTP ${res.statusCode}: ${Buffer.concat(chunks).toString('utf8').slice(0, 200)}`);
    try {
      const obj = JSON.parse(Buffer.concat(chunks).toString('utf8')) as unknown;
      if (obj === null || typeof obj !== 'object' || Array.isArray(obj)) throw new Error('not an object');
      return obj as Record<string, unknown>;
    } catch (err) {
      throw new ClusterReadError(what, `answer is not a JSON object: ${(err as Error).message}`);
    }
  }
}

function stringMap(v: unknown): Record<string, string> {
  const out: Record<string, string> = {};
  if (v && typeof v === 'object' && !Array.isArray(v)) for (const [k, x] of Object.entries(v)) if (typeof x === 'string') out[k] = x;
  return out;
}
