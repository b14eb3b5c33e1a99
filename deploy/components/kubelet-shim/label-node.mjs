// Helpers for install-shim.sh, run with the image's node:
//   node label-node.mjs probe <socket>          exit 0 when the socket accepts a connection
//   node label-node.mjs kubelet-calls <socket>  exit 0 when the shim's metrics socket shows kubelet
//                                               calling through the shim (below); prints what it saw
//   node label-node.mjs label ready|absent      set or remove probe-agent.io/shim on $NODE_NAME
//   node label-node.mjs rewritten-pods          print the rewritten pods on this node that have not
//                                               ended (namespace/name, one a line)
// The label is a JSON merge patch on the Node through the API server, with the pod's service
// account (RBAC: patch on nodes). The node's pods come from its own kubelet (GET /pods on its
// authenticated port, "get nodes/pods"), as the agent reads them: the account needs no pod list,
// which RBAC could not narrow to one node. KUBERNETES_API_URL and KUBELET_URL override the
// addresses (tests).
import { readFileSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';

const LABEL = 'probe-agent.io/shim';
const RECORD = 'probe-agent.io/original-handlers';
const COMMAND = '/.probe-agent/v1';
const SA = '/var/run/secrets/kubernetes.io/serviceaccount';
const [, , cmd, arg] = process.argv;

function probe(socket) {
  const s = net.connect(socket);
  const t = setTimeout(() => process.exit(1), 2000);
  s.on('connect', () => { clearTimeout(t); s.destroy(); process.exit(0); });
  s.on('error', () => process.exit(1));
}

/** GET of a small JSON document, over a unix socket or a URL; bounded in size and time. */
function getJson(target, { headers = {}, tls = {}, maxBytes = 1 << 20, timeoutMs = 10_000 } = {}) {
  return new Promise((resolve, reject) => {
    const opts = typeof target === 'string'
      ? { socketPath: target, path: '/cri-clients', headers }
      : { ...tls, headers, hostname: target.hostname.replace(/^\[|\]$/g, ''), port: target.port, path: `${target.pathname}${target.search}` };
    const mod = typeof target !== 'string' && target.protocol === 'https:' ? https : http;
    const req = mod.get(opts, (res) => {
      const chunks = [];
      let size = 0;
      res.on('data', (c) => {
        size += c.length;
        if (size > maxBytes) req.destroy(new Error(`answer larger than ${maxBytes} octets`));
        else chunks.push(c);
      });
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        if (res.statusCode !== 200) return reject(new Error(`HTTP ${res.statusCode} ${text.slice(0, 200).trim()}`));
        try { resolve(JSON.parse(text)); } catch (err) { reject(new Error(`not JSON: ${err.message}`)); }
      });
      res.on('error', reject);
    });
    req.setTimeout(timeoutMs, () => req.destroy(new Error(`no answer in ${timeoutMs} ms`)));
    req.on('error', reject);
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Kubelet keeps its runtime connection and calls through it about every second (PLEG relist:
// ListPodSandbox and ListContainers; Status every few seconds). So one connection of the shim's
// socket whose call count rises by at least KUBELET_CALLS_MIN in each of KUBELET_CALLS_ROUNDS
// intervals of KUBELET_CALLS_INTERVAL seconds is kubelet's; a configuration file naming the shim
// is not proof (a comment, a flag overriding it, kubelet not restarted yet), nor a socket that
// answers, nor calls from a tool that opens a connection per command.
async function kubeletCalls(socket) {
  const interval = Number(process.env.KUBELET_CALLS_INTERVAL ?? 5) * 1000;
  const rounds = Math.max(1, Number(process.env.KUBELET_CALLS_ROUNDS ?? 3));
  const min = Math.max(1, Number(process.env.KUBELET_CALLS_MIN ?? 3));
  const samples = [];
  for (let r = 0; r <= rounds; r++) {
    if (r > 0) await sleep(interval);
    let doc;
    try {
      doc = await getJson(socket);
    } catch (err) {
      return { ok: false, why: `cannot read the shim's calls from ${socket}: ${err.message}` };
    }
    samples.push(new Map((doc.clients ?? []).map((c) => [c.id, c.calls])));
  }
  let best;
  for (const id of samples[0].keys()) {
    // The same connection throughout: a new one (kubelet restarted meanwhile) is proven next time.
    if (samples.some((s) => !s.has(id))) continue;
    const rises = [];
    for (let r = 1; r <= rounds; r++) rises.push(samples[r].get(id) - samples[r - 1].get(id));
    if (!best || Math.min(...rises) > Math.min(...best.rises)) best = { id, rises };
  }
  const window = `${rounds} x ${interval / 1000}s`;
  if (best && Math.min(...best.rises) >= min) return { ok: true, why: `connection ${best.id} of the shim's socket made ${best.rises.map((n) => `+${n}`).join(' ')} calls in ${window}` };
  const open = samples[rounds].size;
  if (!best) return { ok: false, why: open === 0 ? `no connection to the shim's socket in ${window}` : `no connection to the shim's socket stayed open through ${window} (${open} open now)` };
  return { ok: false, why: `no connection's calls rose by ${min} in each interval of ${window} (busiest: connection ${best.id}, ${best.rises.map((n) => `+${n}`).join(' ')})` };
}

function api() {
  const node = process.env.NODE_NAME;
  if (!node) throw new Error('NODE_NAME is not set (downward API spec.nodeName)');
  const base = process.env.KUBERNETES_API_URL
    ?? `https://${process.env.KUBERNETES_SERVICE_HOST}:${process.env.KUBERNETES_SERVICE_PORT}`;
  const headers = { Accept: 'application/json' };
  const tokenFile = process.env.TOKEN_FILE ?? `${SA}/token`;
  try { headers.Authorization = `Bearer ${readFileSync(tokenFile, 'utf8').trim()}`; } catch { /* tests: no token */ }
  return { node, base, headers };
}

async function label(state) {
  const { node, base, headers } = api();
  const body = JSON.stringify({ metadata: { labels: { [LABEL]: state === 'ready' ? 'ready' : null } } });
  const res = await fetch(`${base}/api/v1/nodes/${encodeURIComponent(node)}`, { method: 'PATCH', headers: { ...headers, 'Content-Type': 'application/merge-patch+json' }, body, signal: AbortSignal.timeout(10_000) });
  if (!res.ok) throw new Error(`PATCH node ${node}: HTTP ${res.status} ${(await res.text()).slice(0, 200)}`);
}

// A pod is rewritten when it carries the record annotation or a probe-agent exec command.
function isRewritten(pod) {
  if (pod?.metadata?.annotations?.[RECORD] !== undefined) return true;
  const spec = pod?.spec ?? {};
  for (const c of [...(spec.initContainers ?? []), ...(spec.containers ?? [])]) {
    for (const h of [c.livenessProbe, c.readinessProbe, c.startupProbe, c.lifecycle?.postStart, c.lifecycle?.preStop]) {
      if (h?.exec?.command?.[0] === COMMAND) return true;
    }
  }
  return false;
}

/** The node's kubelet: its address, the token it authorizes, and how to check its serving certificate. */
function kubelet() {
  const hostIp = process.env.HOST_IP ?? '';
  const url = process.env.KUBELET_URL ?? (hostIp ? `https://${hostIp.includes(':') ? `[${hostIp}]` : hostIp}:10250` : '');
  if (!url) throw new Error('HOST_IP is not set (downward API status.hostIP), nor KUBELET_URL');
  const headers = { Accept: 'application/json' };
  const tokenFile = process.env.TOKEN_FILE ?? `${SA}/token`;
  try { headers.Authorization = `Bearer ${readFileSync(tokenFile, 'utf8').trim()}`; } catch { /* tests: no token */ }
  // Kubelet serving certificates issued from the cluster CA, or self-signed ones (kubelet-insecure-tls).
  const tls = process.env.KUBELET_INSECURE_TLS === 'true'
    ? { rejectUnauthorized: false }
    : { ca: readFileSync(process.env.KUBELET_CA_FILE ?? `${SA}/ca.crt`) };
  return { url: new URL('/pods', url), headers, tls };
}

async function rewrittenPods() {
  const { url, headers, tls } = kubelet();
  let list;
  try {
    list = await getJson(url, { headers, tls, maxBytes: 256 << 20, timeoutMs: 30_000 });
  } catch (err) {
    const hint = / 40[13] /.test(err.message) ? ': the installer needs get on nodes/pods (Kubernetes 1.33+), nodes/proxy before (nodes-proxy-fallback)' : '';
    throw new Error(`GET ${url.href} (this node's kubelet): ${err.message}${hint}`);
  }
  for (const pod of list.items ?? []) {
    if (pod.status?.phase === 'Succeeded' || pod.status?.phase === 'Failed') continue;
    if (isRewritten(pod)) process.stdout.write(`${pod.metadata.namespace}/${pod.metadata.name}\n`);
  }
}

if (cmd === 'probe') probe(arg);
else if (cmd === 'kubelet-calls' && arg) {
  kubeletCalls(arg).then(({ ok, why }) => { process.stdout.write(`${why}\n`); process.exit(ok ? 0 : 1); });
}
else if (cmd === 'label' && (arg === 'ready' || arg === 'absent')) {
  label(arg).catch((err) => { process.stderr.write(`label-node: ${err.message}\n`); process.exit(1); });
} else if (cmd === 'rewritten-pods') {
  rewrittenPods().catch((err) => { process.stderr.write(`label-node: ${err.message}\n`); process.exit(1); });
} else {
  process.stderr.write('usage: label-node.mjs probe <socket> | kubelet-calls <metrics socket> | label ready|absent | rewritten-pods\n');
  process.exit(2);
}
