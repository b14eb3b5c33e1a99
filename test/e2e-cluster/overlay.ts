/**
 * The overlay an operator of this lab node writes: deploy/base with the components docs/deploy.md
 * names for the cluster's version with containerd (components(): containerd, pod-monitor,
 * kubelet-shim, rewrite-webhook; nodes-proxy-fallback before 1.33 and before-1.30 before 1.30),
 * the webhook's certificates made without cert-manager (docs/rewrite.md), and the patches this
 * node needs because its containerd, its
 * kubelet's directory and its host root are the lab's, not a distribution's:
 * - the agent reaches the lab containerd's socket and netns files at their host paths;
 * - the webhook tolerates the closed-hole taint: this one node is closed, and its pods stand for
 *   webhook pods on an open node;
 * - the installer's host directories (shim release, systemd units, kubelet's directory) are the
 *   run's scratch ones, and it has no systemd to talk to (SYSTEMCTL=none, install-shim.sh's own
 *   knob): the run starts the installed shim as the unit's ExecStart says.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { CLOSED_HOLE_TAINT_KEY } from '../../agent/rewrite/placement.ts';

export interface OverlayOptions {
  repo: string;
  dir: string;
  version: string;
  /** The lab containerd: its directory, socket endpoint and netns directory (host paths). */
  containerdDir: string;
  containerdEndpoint: string;
  netnsDir: string;
  /** Where the installer's host directories are. */
  hostRoot: string;
  kubeletDir: string;
  /** The address range the API server's connections to the webhook come from. */
  apiServerCidr: string;
  /** The API server's minor version (1.<minor>): which version components the overlay takes. */
  serverMinor: number;
}

/** The components docs/deploy.md names for a containerd cluster of 1.<minor> (API server and kubelets alike). */
export function components(minor: number): string[] {
  return [
    'containerd', 'pod-monitor',
    // The kubelet authorizes GET /pods as nodes/pods from 1.33 (KubeletFineGrainedAuthz), as nodes/proxy before.
    ...(minor < 33 ? ['nodes-proxy-fallback'] : []),
    'kubelet-shim', 'rewrite-webhook',
    // ValidatingAdmissionPolicy (v1) and matchConditions are 1.30's: before, the objects that need them go.
    ...(minor < 30 ? ['before-1.30'] : []),
  ];
}

export function writeOverlay(o: OverlayOptions): string {
  mkdirSync(o.dir, { recursive: true });
  const rel = (p: string): string => path.relative(o.dir, path.join(o.repo, 'deploy', p));
  const agentPatch = {
    apiVersion: 'apps/v1', kind: 'DaemonSet', metadata: { name: 'probe-agent', namespace: 'probe-agent' },
    spec: { template: { spec: {
      containers: [{
        name: 'agent',
        env: [
          { name: 'PROBE_AGENT_CRI_ENDPOINT', value: o.containerdEndpoint },
          { name: 'PROBE_AGENT_NETNS_DIR', value: o.netnsDir },
        ],
        volumeMounts: [{ name: 'lab-containerd', mountPath: o.containerdDir, readOnly: true, mountPropagation: 'HostToContainer' }],
      }],
      volumes: [{ name: 'lab-containerd', hostPath: { path: o.containerdDir, type: 'Directory' } }],
    } } },
  };
  const installerPatch = {
    apiVersion: 'apps/v1', kind: 'DaemonSet', metadata: { name: 'probe-agent-shim-installer', namespace: 'probe-agent' },
    spec: { template: { spec: {
      containers: [{ name: 'installer', env: [{ name: 'SYSTEMCTL', value: 'none' }, { name: 'CHECK_INTERVAL', value: '2' }] }],
      volumes: [
        { name: 'shim-dir', hostPath: { path: path.join(o.hostRoot, 'opt/probe-agent-shim'), type: 'DirectoryOrCreate' } },
        { name: 'units', hostPath: { path: path.join(o.hostRoot, 'etc/systemd/system'), type: 'Directory' } },
        { name: 'kubelet', hostPath: { path: o.kubeletDir, type: 'Directory' } },
      ],
    } } },
  };
  // One node, and it is closed: the webhook tolerates that, standing for webhook pods on an open node.
  const webhookPatch = {
    apiVersion: 'apps/v1', kind: 'Deployment', metadata: { name: 'probe-agent-webhook', namespace: 'probe-agent' },
    spec: { template: { spec: { tolerations: [{ key: CLOSED_HOLE_TAINT_KEY, operator: 'Exists', effect: 'NoSchedule' }] } } },
  };
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
    components: components(o.serverMinor).map((c) => rel(`components/${c}`)),
    images: [{ name: 'probe-agent', newName: 'probe-agent', newTag: o.version }],
    patches: [{ patch: JSON.stringify(agentPatch) }, { patch: JSON.stringify(installerPatch) }, { patch: JSON.stringify(webhookPatch) }, ...noCertManager],
  }, null, 2));
  writeFileSync(path.join(o.dir, 'api-server-cidr.json'), JSON.stringify({
    apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'probe-agent-webhook-network-policy', namespace: 'probe-agent' }, data: { API_SERVER_CIDR: o.apiServerCidr },
  }));
  return o.dir;
}

/**
 * The chart's values for the same node (E2E_CLUSTER_INSTALL=helm): what writeOverlay's components
 * and patches say, in the chart's words. One difference: runtime "" with the lab containerd's
 * endpoint in agent.extraEnv, since the chart sets PROBE_AGENT_CRI_ENDPOINT itself for runtime
 * containerd and an env list may not name a variable twice under server-side apply; the agent
 * resolves netns through the lab containerd either way (its directory is mounted).
 */
export function helmValues(o: OverlayOptions & { tag: string; caBundle: string }): Record<string, unknown> {
  return {
    mode: 'shim',
    image: { repository: 'probe-agent', tag: o.tag },
    runtime: '',
    agent: {
      nodesProxyFallback: o.serverMinor < 33,
      extraEnv: [
        { name: 'PROBE_AGENT_CRI_ENDPOINT', value: o.containerdEndpoint },
        { name: 'PROBE_AGENT_NETNS_DIR', value: o.netnsDir },
      ],
      extraVolumes: [{ name: 'lab-containerd', hostPath: { path: o.containerdDir, type: 'Directory' } }],
      extraVolumeMounts: [{ name: 'lab-containerd', mountPath: o.containerdDir, readOnly: true, mountPropagation: 'HostToContainer' }],
    },
    shimInstaller: {
      hostPaths: { shimDir: path.join(o.hostRoot, 'opt/probe-agent-shim'), systemdUnits: path.join(o.hostRoot, 'etc/systemd/system'), kubeletDir: o.kubeletDir },
      extraEnv: [{ name: 'SYSTEMCTL', value: 'none' }, { name: 'CHECK_INTERVAL', value: '2' }],
    },
    webhook: {
      enabled: true,
      failurePolicy: 'Ignore',
      timeoutSeconds: 3,
      apiServerCIDRs: [o.apiServerCidr],
      certManager: false,
      caBundle: o.caBundle,
      // One node, and it is closed (writeOverlay's webhook patch).
      tolerations: [{ key: CLOSED_HOLE_TAINT_KEY, operator: 'Exists', effect: 'NoSchedule' }],
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
