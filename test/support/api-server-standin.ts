/**
 * A stand-in for kube-apiserver (which cannot run here) holding real-shaped objects: Nodes (GET,
 * and PATCH with a JSON merge patch on labels/annotations, as `kubectl label`/the installer send
 * it), Pods (LIST with `fieldSelector=spec.nodeName=<node>`), RuntimeClasses (GET). Every request
 * is recorded, so tests can say exactly what a component asked for. Gates mode's writes: PATCH
 * pods/status with a strategic merge patch of `status.conditions` (merged by `type`, as the real
 * server's patch strategy for that list; `metadata.uid` a precondition, 409 on a mismatch), POST
 * events (kept in `events`), and Leases (merge-patch, PUT guarded by metadata.resourceVersion (409
 * when it moved), POST to create (409 when it exists), GET and LIST; kept in `leases` by
 * `<namespace>/<name>`, each write a new resourceVersion). `forbid` answers 403 as RBAC would. `down = true` makes it answer
 * 503 (an outage), `delayMs` answers that much later (a slow API server); unknown paths get 404
 * like the real server.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';

type Obj = Record<string, any>;

export interface RecordedApiRequest {
  method: string;
  url: string;
  contentType?: string;
  authorization?: string;
  body?: unknown;
  /** When it was received (Date.now()). */
  time: number;
}

export interface ApiServerStandIn {
  url: string;
  requests: RecordedApiRequest[];
  nodes: Map<string, Obj>;
  pods: Obj[];
  runtimeClasses: Map<string, Obj>;
  events: Obj[];
  leases: Map<string, Obj>;
  /** Answer everything with 503 while true. */
  down: boolean;
  /** Answer every request this many ms after it arrived (default 0). */
  delayMs: number;
  /** Answer 403 (as RBAC refuses) to the requests this matches. */
  forbid?: (method: string, path: string) => boolean;
  /** Called after each pods/status write is applied: a test's kubelet can show it, as kubelet's pod watch does. */
  onPodStatus?: (pod: Obj) => void;
  close(): Promise<void>;
}

/** A Node object with the given labels/annotations. */
export function nodeObject(name: string, labels: Record<string, string> = {}, annotations: Record<string, string> = {}): Obj {
  return { apiVersion: 'v1', kind: 'Node', metadata: { name, labels: { 'kubernetes.io/hostname': name, ...labels }, annotations }, spec: {}, status: {} };
}

/** Applies an RFC 7386 merge patch (null deletes). */
function mergePatch(target: Obj, patch: Obj): Obj {
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete target[k];
    else if (v && typeof v === 'object' && !Array.isArray(v)) target[k] = mergePatch(target[k] && typeof target[k] === 'object' ? target[k] : {}, v);
    else target[k] = v;
  }
  return target;
}

export async function startApiServerStandIn(): Promise<ApiServerStandIn> {
  const state: ApiServerStandIn = { url: '', requests: [], nodes: new Map(), pods: [], runtimeClasses: new Map(), events: [], leases: new Map(), down: false, delayMs: 0, close: async () => {} };
  let leaseVersion = 0;
  const server = http.createServer((req, res) => {
    let raw = '';
    req.on('data', (c) => (raw += c));
    req.on('end', () => setTimeout(answer, state.delayMs));
    const answer = (): unknown => {
      let body: unknown;
      try { body = raw ? JSON.parse(raw) : undefined; } catch { body = raw; }
      state.requests.push({ time: Date.now(), method: req.method ?? '', url: req.url ?? '', ...(req.headers['content-type'] ? { contentType: req.headers['content-type'] } : {}), ...(req.headers.authorization ? { authorization: req.headers.authorization } : {}), ...(body !== undefined ? { body } : {}) });
      const send = (status: number, obj: unknown) => res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(obj));
      const notFound = (what: string) => send(404, { kind: 'Status', apiVersion: 'v1', status: 'Failure', reason: 'NotFound', code: 404, message: `${what} not found` });
      if (state.down) return send(503, { kind: 'Status', status: 'Failure', code: 503, message: 'stand-in outage' });
      const url = new URL(req.url ?? '/', 'http://x');
      if (state.forbid?.(req.method ?? '', url.pathname)) return send(403, { kind: 'Status', status: 'Failure', reason: 'Forbidden', code: 403, message: `${req.method} ${url.pathname} is forbidden` });
      let m = /^\/api\/v1\/nodes\/([^/]+)$/.exec(url.pathname);
      if (m) {
        const name = decodeURIComponent(m[1]!);
        const node = state.nodes.get(name);
        if (!node) return notFound(`nodes "${name}"`);
        if (req.method === 'GET') return send(200, node);
        if (req.method === 'PATCH' && req.headers['content-type'] === 'application/merge-patch+json' && body && typeof body === 'object') {
          mergePatch(node, body as Obj);
          return send(200, node);
        }
        return send(405, { kind: 'Status', code: 405 });
      }
      if (url.pathname === '/api/v1/pods' && req.method === 'GET') {
        const sel = url.searchParams.get('fieldSelector') ?? '';
        m = /^spec\.nodeName=(.+)$/.exec(sel);
        const items = m ? state.pods.filter((p) => p.spec?.nodeName === m![1]) : state.pods;
        return send(200, { kind: 'PodList', apiVersion: 'v1', metadata: { resourceVersion: '1' }, items });
      }
      m = /^\/api\/v1\/namespaces\/([^/]+)\/pods\/([^/]+)\/status$/.exec(url.pathname);
      if (m && req.method === 'PATCH') {
        const pod = state.pods.find((p) => p.metadata?.namespace === m![1] && p.metadata?.name === m![2]);
        if (!pod) return notFound(`pods "${m[2]}"`);
        if (req.headers['content-type'] !== 'application/strategic-merge-patch+json' || !body || typeof body !== 'object') return send(415, { kind: 'Status', code: 415 });
        const b = body as Obj;
        if (b.metadata?.uid !== undefined && b.metadata.uid !== pod.metadata.uid) return send(409, { kind: 'Status', code: 409, reason: 'Conflict', message: 'Precondition failed: UID in precondition' });
        const conditions: Obj[] = (pod.status ??= {}).conditions ??= [];
        for (const c of b.status?.conditions ?? []) {
          const i = conditions.findIndex((x) => x.type === c.type);
          if (i >= 0) conditions[i] = { ...conditions[i], ...c };
          else conditions.push(c);
        }
        send(200, pod);
        return state.onPodStatus?.(pod);
      }
      m = /^\/api\/v1\/namespaces\/([^/]+)\/events$/.exec(url.pathname);
      if (m && req.method === 'POST') {
        state.events.push(body as Obj);
        return send(201, body);
      }
      m = /^\/apis\/coordination\.k8s\.io\/v1\/namespaces\/([^/]+)\/leases(?:\/([^/]+))?$/.exec(url.pathname);
      if (m) {
        if (req.method === 'GET' && m[2] === undefined) {
          const items = [...state.leases].filter(([k]) => k.startsWith(`${m![1]}/`)).map(([, l]) => l);
          return send(200, { kind: 'LeaseList', apiVersion: 'coordination.k8s.io/v1', metadata: { resourceVersion: '1' }, items });
        }
        const key = `${m[1]}/${m[2] ?? (body as Obj)?.metadata?.name}`;
        const conflict = (message: string) => send(409, { kind: 'Status', status: 'Failure', reason: 'Conflict', code: 409, message });
        // Every write moves the resourceVersion, as the real server's does.
        const stored = (l: Obj): Obj => {
          (l.metadata ??= {}).resourceVersion = String(++leaseVersion);
          state.leases.set(key, l);
          return l;
        };
        if (req.method === 'POST') {
          if (state.leases.has(key)) return conflict(`leases "${key}" already exists`);
          return send(201, stored(body as Obj));
        }
        const lease = state.leases.get(key);
        if (!lease) return notFound(`leases "${m[2]}"`);
        if (req.method === 'GET') return send(200, lease);
        if (!body || typeof body !== 'object') return send(405, { kind: 'Status', code: 405 });
        if (req.method === 'PUT') {
          // An update carrying a resourceVersion is refused when the object changed since (optimistic concurrency).
          const rv = (body as Obj).metadata?.resourceVersion;
          if (rv !== undefined && rv !== lease.metadata?.resourceVersion) return conflict('the object has been modified; please apply your changes to the latest version and try again');
          return send(200, stored(body as Obj));
        }
        if (req.method !== 'PATCH') return send(405, { kind: 'Status', code: 405 });
        mergePatch(lease, body as Obj);
        return send(200, stored(lease));
      }
      m = /^\/apis\/node\.k8s\.io\/v1\/runtimeclasses\/([^/]+)$/.exec(url.pathname);
      if (m && req.method === 'GET') {
        const rc = state.runtimeClasses.get(decodeURIComponent(m[1]!));
        return rc ? send(200, rc) : notFound(`runtimeclasses.node.k8s.io "${m[1]}"`);
      }
      return notFound(url.pathname);
    };
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  state.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  state.close = () => new Promise<void>((r) => { server.closeAllConnections(); server.close(() => r()); });
  return state;
}
