// Helpers for install-shim.sh, run with the image's node:
//   node label-node.mjs probe <socket>         exit 0 when the socket accepts a connection
//   node label-node.mjs label ready|absent     set or remove probe-agent.io/shim on $NODE_NAME
//   node label-node.mjs rewritten-pods         print the rewritten pods on $NODE_NAME that have not
//                                              ended (namespace/name, one a line)
// The label is a JSON merge patch on the Node through the API server, with the pod's service
// account (RBAC: patch on nodes, list on pods). KUBERNETES_API_URL overrides the in-cluster address (tests).
import { readFileSync } from 'node:fs';
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

async function rewrittenPods() {
  const { node, base, headers } = api();
  const url = `${base}/api/v1/pods?fieldSelector=${encodeURIComponent(`spec.nodeName=${node}`)}`;
  const res = await fetch(url, { headers, signal: AbortSignal.timeout(30_000) });
  if (!res.ok) throw new Error(`LIST pods on ${node}: HTTP ${res.status} ${(await res.text()).slice(0, 200)}`);
  const list = await res.json();
  for (const pod of list.items ?? []) {
    if (pod.status?.phase === 'Succeeded' || pod.status?.phase === 'Failed') continue;
    if (isRewritten(pod)) process.stdout.write(`${pod.metadata.namespace}/${pod.metadata.name}\n`);
  }
}

if (cmd === 'probe') probe(arg);
else if (cmd === 'label' && (arg === 'ready' || arg === 'absent')) {
  label(arg).catch((err) => { process.stderr.write(`label-node: ${err.message}\n`); process.exit(1); });
} else if (cmd === 'rewritten-pods') {
  rewrittenPods().catch((err) => { process.stderr.write(`label-node: ${err.message}\n`); process.exit(1); });
} else {
  process.stderr.write('usage: label-node.mjs probe <socket> | label ready|absent | rewritten-pods\n');
  process.exit(2);
}
