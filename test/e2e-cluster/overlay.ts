/**
 * The overlay an operator of this lab cluster writes: deploy/base with the components docs/deploy.md
 * names for the cluster's version and runtime (components(): containerd or crio, pod-monitor,
 * kubelet-shim, rewrite-webhook; nodes-proxy-fallback before 1.33 and before-1.30 before 1.30),
 * the webhook's certificates made without cert-manager (docs/rewrite.md), and the patches this
 * cluster needs because its two nodes share one machine:
 * - each node's own directories (/run/probe-agent, /run/probe-agent-shim, /run/containerd or /var/run/crio,
 *   /opt/probe-agent-shim, /etc/systemd/system, /var/lib/kubelet) are `<nodesDir>/<node>/...`:
 *   every hostPath the agent and the installer use for them becomes `nodesDir` with
 *   `subPathExpr: $(NODE_NAME)/...`, so each pod sees its own node's, as on separate machines;
 * - `<nodesDir>/<node>/run/containerd/containerd.sock` (CRI-O: `var/run/crio/crio.sock`) is a symlink to that node's lab runtime,
 *   whose directories the agent mounts at their host paths (its netns files are there);
 * - the installer has no systemd to talk to (SYSTEMCTL=none, install-shim.sh's own knob): the run
 *   starts the installed shim as the unit's ExecStart says.
 * The webhook is as deployed: it runs on the open node because the closed one's taint keeps it off.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { RuntimeKind } from '../lab/containerd.ts';

export interface OverlayOptions {
  repo: string;
  dir: string;
  version: string;
  /** Each node's lab runtime: its directory and netns directory (host paths). */
  containerds: { dir: string; netnsDir: string }[];
  /** The nodes' runtime: its component (containerd or crio). Default containerd. */
  runtime?: RuntimeKind;
  /** The parent of the nodes' own directories (`<nodesDir>/<node name>/run/probe-agent`, ...). */
  nodesDir: string;
  /** The address range the API server's connections to the webhook come from. */
  apiServerCidr: string;
  /** The API server's minor version (1.<minor>): which version components the overlay takes. */
  serverMinor: number;
  /** shim (default): the kubelet-shim component; gates: the gates and gates-lease components, no shim. */
  mode?: Mode;
}

export type Mode = 'shim' | 'gates';

/** The components docs/deploy.md names for a cluster of 1.<minor> (API server and kubelets alike) on `runtime`. */
export function components(minor: number, mode: Mode = 'shim', runtime: RuntimeKind = 'containerd'): string[] {
  return [
    runtime, 'pod-monitor',
    // The kubelet authorizes GET /pods as nodes/pods from 1.33 (KubeletFineGrainedAuthz), as nodes/proxy before.
    ...(minor < 33 ? ['nodes-proxy-fallback'] : []),
    // Gates mode leaves kubelet on its runtime: no shim; the fail-closed Lease option after the webhook.
    ...(mode === 'gates' ? ['rewrite-webhook', 'gates', 'gates-lease'] : ['kubelet-shim', 'rewrite-webhook']),
    // ValidatingAdmissionPolicy (v1) and matchConditions are 1.30's: before, the objects that need them go.
    ...(minor < 30 ? ['before-1.30'] : []),
  ];
}

/** The agent's volumes for node directories: name, mount path, the node's own path. */
const AGENT_NODE_DIRS = [
  ['probe-socket-dir', '/run/probe-agent', 'run/probe-agent'],
  ['shim-run', '/run/probe-agent-shim', 'run/probe-agent-shim'],
] as const;
/**
 * The runtime component's mount (deploy/components/<runtime>); propagation off: only a symlink to
 * the lab runtime's socket is in it.
 */
export const RUNTIME_NODE_DIR = {
  containerd: ['containerd-run', '/run/containerd', 'run/containerd'],
  crio: ['crio-run', '/var/run/crio', 'var/run/crio'],
} as const;
/** The node's path of the runtime's socket, relative to its own root. */
export const RUNTIME_SOCKET = { containerd: 'run/containerd/containerd.sock', crio: 'var/run/crio/crio.sock' } as const;
/** The installer's. */
const INSTALLER_NODE_DIRS = [
  ['shim-dir', '/host/opt/probe-agent-shim', 'opt/probe-agent-shim'],
  ['units', '/host/etc/systemd/system', 'etc/systemd/system'],
  ['shim-run', '/host/run/probe-agent-shim', 'run/probe-agent-shim'],
  ['run', '/host/run/probe-agent', 'run/probe-agent'],
  ['kubelet', '/host/var/lib/kubelet', 'var/lib/kubelet'],
] as const;
const ALL_NODE_DIRS = [...AGENT_NODE_DIRS, ...Object.values(RUNTIME_NODE_DIR), ...INSTALLER_NODE_DIRS];
/** Every node directory the manifests mount, relative to a node's own root (`<nodesDir>/<node>`). */
export const NODE_DIRS = [...new Set(ALL_NODE_DIRS.map((d) => d[2]))];

const nodePath = (mountPath: string): string => ALL_NODE_DIRS.find((d) => d[1] === mountPath)![2];
const nodeMount = (name: string, mountPath: string): Record<string, unknown> =>
  ({ name, mountPath, subPathExpr: `$(NODE_NAME)/${nodePath(mountPath)}`, ...(Object.values(RUNTIME_NODE_DIR).some((d) => d[0] === name) ? { mountPropagation: 'None' } : {}) });
const nodesVolume = (name: string, nodesDir: string): Record<string, unknown> => ({ name, hostPath: { path: nodesDir, type: 'Directory' } });

/** The patches of the agent's and the installer's DaemonSets for this machine's nodes (the header says which). */
export function nodePatches(o: Pick<OverlayOptions, 'containerds' | 'nodesDir' | 'mode' | 'runtime'>): object[] {
  const agentDirs = [...AGENT_NODE_DIRS, RUNTIME_NODE_DIR[o.runtime ?? 'containerd']];
  const agentPatch = {
    apiVersion: 'apps/v1', kind: 'DaemonSet', metadata: { name: 'probe-agent', namespace: 'probe-agent' },
    spec: { template: { spec: {
      containers: [{
        name: 'agent',
        env: [{ name: 'PROBE_AGENT_NETNS_DIR', value: o.containerds.map((c) => c.netnsDir).join(',') }],
        volumeMounts: [
          ...agentDirs.map(([name, mountPath]) => nodeMount(name, mountPath)),
          ...o.containerds.map((c, i) => ({ name: `lab-containerd-${i}`, mountPath: c.dir, readOnly: true, mountPropagation: 'HostToContainer' })),
        ],
      }],
      volumes: [
        ...agentDirs.map(([name]) => nodesVolume(name, o.nodesDir)),
        ...o.containerds.map((c, i) => ({ name: `lab-containerd-${i}`, hostPath: { path: c.dir, type: 'Directory' } })),
      ],
    } } },
  };
  const installerPatch = {
    apiVersion: 'apps/v1', kind: 'DaemonSet', metadata: { name: 'probe-agent-shim-installer', namespace: 'probe-agent' },
    spec: { template: { spec: {
      containers: [{
        name: 'installer', env: [{ name: 'SYSTEMCTL', value: 'none' }, { name: 'CHECK_INTERVAL', value: '2' }],
        volumeMounts: INSTALLER_NODE_DIRS.map(([name, mountPath]) => nodeMount(name, mountPath)),
      }],
      volumes: INSTALLER_NODE_DIRS.map(([name]) => nodesVolume(name, o.nodesDir)),
    } } },
  };
  // Gates mode has no installer to patch.
  return o.mode === 'gates' ? [agentPatch] : [agentPatch, installerPatch];
}

export function writeOverlay(o: OverlayOptions): string {
  mkdirSync(o.dir, { recursive: true });
  const rel = (p: string): string => path.relative(o.dir, path.join(o.repo, 'deploy', p));
  const nodeFixes = nodePatches(o);
  // docs/rewrite.md, "Without cert-manager": the Issuers and Certificates go; the run creates the Secrets.
  const noCertManager = [
    ['Issuer', 'probe-agent-webhook-selfsigned'], ['Issuer', 'probe-agent-webhook-client-ca'],
    ['Certificate', 'probe-agent-webhook'], ['Certificate', 'probe-agent-webhook-client-ca'], ['Certificate', 'probe-agent-apiserver-admission'],
  ].map(([kind, name]) => ({ patch: JSON.stringify({ $patch: 'delete', apiVersion: 'cert-manager.io/v1', kind, metadata: { name, namespace: 'probe-agent' } }) }));
  writeFileSync(path.join(o.dir, 'kustomization.yaml'), JSON.stringify({
    apiVersion: 'kustomize.config.k8s.io/v1beta1',
    kind: 'Kustomization',
    // kustomize v4 (kubectl 1.21-1.26) runs an overlay's generators after its components and drops
    // local-config objects before them: the CIDR is a plain resource there (docs/deploy.md).
    resources: [rel('base'), 'api-server-cidr.json'],
    components: components(o.serverMinor, o.mode, o.runtime).map((c) => rel(`components/${c}`)),
    images: [{ name: 'probe-agent', newName: 'probe-agent', newTag: o.version }],
    patches: [...nodeFixes.map((p) => ({ patch: JSON.stringify(p) })), ...noCertManager],
  }, null, 2));
  writeFileSync(path.join(o.dir, 'api-server-cidr.json'), JSON.stringify({
    apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'probe-agent-webhook-network-policy', namespace: 'probe-agent' }, data: { API_SERVER_CIDR: o.apiServerCidr },
  }));
  return o.dir;
}

/**
 * The chart's values for the same cluster (E2E_CLUSTER_INSTALL=helm): what writeOverlay's components
 * say, in the chart's words. The machine's node patches (nodePatches) are not values: the run applies
 * them with a post-renderer (helm.ts), as they are applied to the kustomize overlay.
 */
export function helmValues(o: OverlayOptions & { tag: string; caBundle: string }): Record<string, unknown> {
  return {
    mode: 'shim',
    image: { repository: 'probe-agent', tag: o.tag },
    runtime: o.runtime ?? 'containerd',
    agent: { nodesProxyFallback: o.serverMinor < 33 },
    webhook: {
      enabled: true,
      failurePolicy: 'Ignore',
      timeoutSeconds: 3,
      apiServerCIDRs: [o.apiServerCidr],
      certManager: false,
      caBundle: o.caBundle,
    },
    podMonitor: { enabled: true },
    before130: 'auto',
  };
}

/**
 * The PodMonitor custom resource definition, so the API server accepts the pod-monitor component's
 * object. A stand-in: Prometheus Operator's own CRD (and the operator) cannot be fetched here; this
 * one accepts any PodMonitor body, so it proves the object is applied, not that its fields are valid.
 */
export const POD_MONITOR_CRD = {
  apiVersion: 'apiextensions.k8s.io/v1',
  kind: 'CustomResourceDefinition',
  metadata: { name: 'podmonitors.monitoring.coreos.com' },
  spec: {
    group: 'monitoring.coreos.com',
    names: { kind: 'PodMonitor', listKind: 'PodMonitorList', plural: 'podmonitors', singular: 'podmonitor' },
    scope: 'Namespaced',
    versions: [{ name: 'v1', served: true, storage: true, schema: { openAPIV3Schema: { type: 'object', 'x-kubernetes-preserve-unknown-fields': true } } }],
  },
};
