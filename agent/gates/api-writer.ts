/**
 * The agent's writes to the API server in gates mode, and nothing more: its own pod condition
 * (`pods/status`, a strategic merge patch keyed on the condition type, so `Ready` and every other
 * condition stay untouched, with the pod's UID as a precondition), an Event, and its node's Lease;
 * for the webhook's lease controller, its reads and its leader-election Lease.
 * Same transport and credentials as the webhook's reads (agent/webhook/cluster-reader.ts
 * inClusterOptions): the service-account token re-read on every request (projected tokens
 * rotate), the API server's CA, a per-request timeout, a bounded answer.
 */
import { readFileSync } from 'node:fs';
import { Agent, request } from 'undici';
import { ProbeAgentError } from '../errors.ts';
import type { ApiServerReaderOptions } from '../webhook/cluster-reader.ts';

/** A write the API server refused or that could not be made; `status` is the HTTP status (0: none). */
export class ApiWriteError extends ProbeAgentError {
  readonly status: number;
  constructor(what: string, status: number, message: string) {
    super('api-write', `${what}: ${message}`, { what, status });
    this.status = status;
  }
}

/** The agent's condition, as written. */
export interface GateCondition {
  status: 'True' | 'False' | 'Unknown';
  reason: string;
  message: string;
}

/** A core/v1 Event about one container of a pod, as kubelet records them. */
export interface PodEvent {
  namespace: string;
  podName: string;
  podUID: string;
  container: string;
  type: 'Normal' | 'Warning';
  reason: string;
  message: string;
}

/** What gates mode writes; ApiWriter is the real one. */
export interface GatesWriter {
  patchCondition(namespace: string, name: string, uid: string, condition: GateCondition): Promise<void>;
  recordEvent(event: PodEvent): Promise<void>;
}

/** The largest answer read: a node's pod list (at most 110 pods by default, ~10 KiB each) fits. */
const MAX_BODY = 16 * 1024 * 1024;
const MAX_MESSAGE = 1024;

export class ApiWriter implements GatesWriter {
  readonly #opts: ApiServerReaderOptions;
  readonly #dispatcher: Agent;
  readonly #timeoutMs: number;
  readonly #nodeName: string;
  readonly #conditionType: string;

  constructor(opts: ApiServerReaderOptions & { nodeName: string; conditionType: string }) {
    this.#opts = opts;
    const ca = opts.caFile ? readFileSync(opts.caFile, 'utf8') : undefined;
    this.#dispatcher = new Agent({ connect: ca ? { ca } : {}, connections: 4 });
    this.#timeoutMs = opts.timeoutMs ?? 5000;
    this.#nodeName = opts.nodeName;
    this.#conditionType = opts.conditionType;
  }

  async patchCondition(namespace: string, name: string, uid: string, c: GateCondition): Promise<void> {
    const body = {
      // A precondition: a pod recreated under the same name is another pod (409, never a wrong write).
      metadata: { uid },
      status: { conditions: [{ type: this.#conditionType, status: c.status, reason: c.reason, message: c.message.slice(0, MAX_MESSAGE), lastProbeTime: null, lastTransitionTime: new Date().toISOString() }] },
    };
    await this.#send(`pod ${namespace}/${name} status`, 'PATCH', `/api/v1/namespaces/${enc(namespace)}/pods/${enc(name)}/status`, body, 'application/strategic-merge-patch+json');
  }

  async recordEvent(e: PodEvent): Promise<void> {
    const now = new Date().toISOString();
    const body = {
      apiVersion: 'v1',
      kind: 'Event',
      metadata: { generateName: `${e.podName}.`, namespace: e.namespace },
      involvedObject: { apiVersion: 'v1', kind: 'Pod', namespace: e.namespace, name: e.podName, uid: e.podUID, fieldPath: `spec.containers{${e.container}}` },
      reason: e.reason,
      message: e.message.slice(0, MAX_MESSAGE),
      type: e.type,
      source: { component: 'probe-agent', host: this.#nodeName },
      reportingComponent: 'probe-agent',
      reportingInstance: this.#nodeName,
      firstTimestamp: now,
      lastTimestamp: now,
      count: 1,
    };
    await this.#send(`event for ${e.namespace}/${e.podName}`, 'POST', `/api/v1/namespaces/${enc(e.namespace)}/events`, body, 'application/json');
  }

  /** Creates or renews the Lease `name` in `namespace` held by this node. */
  async renewLease(namespace: string, name: string, durationSeconds: number): Promise<void> {
    const path = `/apis/coordination.k8s.io/v1/namespaces/${enc(namespace)}/leases/${enc(name)}`;
    const spec = { holderIdentity: this.#nodeName, leaseDurationSeconds: durationSeconds, renewTime: new Date().toISOString().replace('Z', '000Z') };
    try {
      await this.#send(`lease ${namespace}/${name}`, 'PATCH', path, { spec }, 'application/merge-patch+json');
    } catch (err) {
      if (!(err instanceof ApiWriteError) || err.status !== 404) throw err;
      const body = { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name, namespace }, spec };
      await this.#send(`lease ${namespace}/${name}`, 'POST', `/apis/coordination.k8s.io/v1/namespaces/${enc(namespace)}/leases`, body, 'application/json');
    }
  }

  /** GET of `path`, parsed (the lease controller's reads: Lease and Pod lists, bounded like every answer). */
  async getJson(what: string, path: string): Promise<unknown> {
    return parseAnswer(what, await this.#send(what, 'GET', path, undefined, undefined));
  }

  /**
   * POST (create) or PUT (update) of a whole object at `path`, parsed: the leader election's Lease
   * (lease-controller.ts). A PUT carrying metadata.resourceVersion is refused with 409 when the
   * object changed since it was read, so two replicas never both take it.
   */
  async writeJson(what: string, method: 'POST' | 'PUT', path: string, body: unknown): Promise<unknown> {
    return parseAnswer(what, await this.#send(what, method, path, body, 'application/json'));
  }

  close(): Promise<void> {
    return this.#dispatcher.close();
  }

  async #send(what: string, method: string, path: string, body: unknown, contentType: string | undefined): Promise<string> {
    const headers: Record<string, string> = { accept: 'application/json', ...(contentType ? { 'content-type': contentType } : {}) };
    if (this.#opts.tokenFile) {
      try {
        headers.authorization = `Bearer ${readFileSync(this.#opts.tokenFile, 'utf8').trim()}`;
      } catch (err) {
        throw new ApiWriteError(what, 0, `cannot read the token: ${(err as Error).message}`);
      }
    }
    let res;
    try {
      res = await request(new URL(path, this.#opts.url), {
        method, headers, body: body === undefined ? null : JSON.stringify(body), dispatcher: this.#dispatcher,
        headersTimeout: this.#timeoutMs, bodyTimeout: this.#timeoutMs, signal: AbortSignal.timeout(this.#timeoutMs),
      });
    } catch (err) {
      throw new ApiWriteError(what, 0, `API server unreachable: ${(err as Error).message}`);
    }
    let size = 0;
    const chunks: Buffer[] = [];
    for await (const c of res.body as AsyncIterable<Buffer>) {
      size += c.length;
      if (size > MAX_BODY) {
        res.body.destroy();
        break;
      }
      chunks.push(c);
    }
    if (res.statusCode >= 200 && res.statusCode < 300) return size > MAX_BODY ? '' : Buffer.concat(chunks).toString('utf8');
    throw new ApiWriteError(what, res.statusCode, `HTTP ${res.statusCode}: ${statusMessage(Buffer.concat(chunks).toString('utf8'))}`);
  }
}

const enc = encodeURIComponent;

function parseAnswer(what: string, text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    throw new ApiWriteError(what, 200, 'the answer is not JSON (or is larger than the bound)');
  }
}

/** The `message` of a Status answer, else the start of the body. */
function statusMessage(text: string): string {
  try {
    const s = JSON.parse(text) as { message?: unknown };
    if (typeof s.message === 'string') return s.message.slice(0, 300);
  } catch { /* not JSON */ }
  return text.slice(0, 300);
}
