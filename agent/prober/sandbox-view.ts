/**
 * What the runtime says about a container's pod, for a shim call that names the container and
 * nothing else: the sandbox's identity (kubelet's labels), IPs, network mode, runtime handler and
 * the annotations the agent reads (kubelet copies the pod's annotations onto the sandbox), and the
 * container's own ports (kubelet's `io.kubernetes.container.ports` annotation). Everything here
 * is known once the sandbox and container exist, before kubelet's status round trip reaches /pods.
 */
import type { CriContainer, CriPodSandboxStatusResponse } from '../netns/cri-client.ts';
import { SPEC_LIMITS } from '../probe/spec.ts';
import { ORIGINAL_HANDLERS_ANNOTATION } from '../rewrite/pod-rewrite.ts';
import type { ContainerPort } from '../pods/types.ts';

/** kubelet's labels on every sandbox and container it creates (pkg/kubelet/types/labels.go). */
export const CONTAINER_LABELS = {
  podUID: 'io.kubernetes.pod.uid',
  podName: 'io.kubernetes.pod.name',
  podNamespace: 'io.kubernetes.pod.namespace',
  containerName: 'io.kubernetes.container.name',
} as const;

/** kubelet's container annotation holding the container's `ports` as JSON (pkg/kubelet/kuberuntime/labels.go). */
export const CONTAINER_PORTS_ANNOTATION = 'io.kubernetes.container.ports';

/**
 * Largest original-handlers annotation kept: the API server's budget for all of a pod's
 * annotations together (256 KiB), so a real one always fits.
 */
export const MAX_ORIGINAL_HANDLERS_BYTES = 256 * 1024;
/** Largest ports annotation read (512 ports of ~100 bytes each). */
const MAX_PORTS_ANNOTATION_BYTES = 64 * 1024;
const MAX_PORTS = 512;

/** Record key -> the recorded httpGet.httpHeaders entries of that handler, as written (checked when used). */
export type RecordedHeaders = ReadonlyMap<string, readonly unknown[]>;

/**
 * The headers an original-handlers annotation records, or why it cannot be read. Bounded: the
 * annotation by the API server's budget, the kept part by SPEC_LIMITS' headers per handler.
 */
export function recordedHeadersOf(raw: string): RecordedHeaders | string {
  if (Buffer.byteLength(raw, 'utf8') > MAX_ORIGINAL_HANDLERS_BYTES) {
    return `annotation ${ORIGINAL_HANDLERS_ANNOTATION} is larger than ${MAX_ORIGINAL_HANDLERS_BYTES} bytes`;
  }
  let rec: unknown;
  try {
    rec = JSON.parse(raw);
  } catch (err) {
    return `annotation ${ORIGINAL_HANDLERS_ANNOTATION} is not JSON: ${(err as Error).message}`;
  }
  const handlers = isObject(rec) ? rec['handlers'] : undefined;
  if (!isObject(handlers)) return `annotation ${ORIGINAL_HANDLERS_ANNOTATION} has no "handlers" object`;
  const out = new Map<string, readonly unknown[]>();
  for (const [key, h] of Object.entries(handlers)) {
    const httpGet = isObject(h) ? h['httpGet'] : undefined;
    const headers = isObject(httpGet) ? httpGet['httpHeaders'] : undefined;
    if (Array.isArray(headers) && headers.length > 0) out.set(key, headers.slice(0, SPEC_LIMITS.maxHeaders));
  }
  return out;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

/** A sandbox as the runtime reports it (the netns is added by the locator, which checks it). */
export interface SandboxView {
  id: string;
  uid: string;
  namespace: string;
  name: string;
  /** Primary first, deduplicated. */
  podIPs: string[];
  hostNetwork: boolean;
  runtimeHandler: string;
  /**
   * The httpGet headers the pod's `probe-agent.io/original-handlers` annotation records, by record key
   * (`<container>/<field>`): only these are kept, not the whole annotation. Absent: no annotation.
   */
  recordedHeaders?: RecordedHeaders;
  /** Why a present annotation could not be used (too large, not JSON, no handlers). */
  recordedHeadersError?: string;
}

/** The sandbox of a PodSandboxStatus answer, or a message saying what is missing. */
export function sandboxViewOf(res: CriPodSandboxStatusResponse, sandboxID: string): SandboxView | string {
  const st = res.status;
  if (!st) return 'no status';
  const labels = st.labels ?? {};
  const uid = labels[CONTAINER_LABELS.podUID] || st.metadata?.uid || '';
  if (!uid) return `no ${CONTAINER_LABELS.podUID} label (not created by kubelet)`;
  const ips = [st.network?.ip ?? '', ...(st.network?.additionalIps ?? []).map((a) => a?.ip ?? '')].filter((ip) => ip !== '');
  const view: SandboxView = {
    id: sandboxID,
    uid,
    namespace: st.metadata?.namespace || labels[CONTAINER_LABELS.podNamespace] || '',
    name: st.metadata?.name || labels[CONTAINER_LABELS.podName] || '',
    podIPs: [...new Set(ips)].slice(0, 8),
    hostNetwork: st.linux?.namespaces?.options?.network === 'NODE',
    runtimeHandler: st.runtimeHandler ?? '',
  };
  const record = st.annotations?.[ORIGINAL_HANDLERS_ANNOTATION];
  if (typeof record === 'string') {
    const headers = recordedHeadersOf(record);
    if (typeof headers === 'string') view.recordedHeadersError = headers;
    else view.recordedHeaders = headers;
  }
  return view;
}

/** The container's name (kubelet's label, else the CRI metadata name). */
export function containerNameOf(c: CriContainer): string {
  return c.labels?.[CONTAINER_LABELS.containerName] || c.metadata?.name || '';
}

/**
 * The container's ports from kubelet's annotation; [] when absent or malformed (named ports then
 * come from /pods, as before). Only entries with a name and a valid number matter for a lookup.
 */
export function containerPortsOf(c: CriContainer): ContainerPort[] {
  const raw = c.annotations?.[CONTAINER_PORTS_ANNOTATION];
  if (typeof raw !== 'string' || raw.length === 0 || raw.length > MAX_PORTS_ANNOTATION_BYTES) return [];
  let parsed: unknown;
  try {
    parsed = JSON.parse(raw);
  } catch {
    return [];
  }
  if (!Array.isArray(parsed)) return [];
  const out: ContainerPort[] = [];
  for (const p of parsed.slice(0, MAX_PORTS)) {
    if (p === null || typeof p !== 'object') continue;
    const { name, containerPort, protocol } = p as Record<string, unknown>;
    if (typeof containerPort !== 'number' || !Number.isInteger(containerPort) || containerPort < 1 || containerPort > 65535) continue;
    const port: ContainerPort = { containerPort };
    if (typeof name === 'string' && name !== '' && name.length <= 15) port.name = name;
    if (typeof protocol === 'string' && protocol !== '') port.protocol = protocol;
    out.push(port);
  }
  return out;
}
