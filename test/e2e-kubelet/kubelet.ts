/**
 * The kubelet under test: its version, how it takes the runtime endpoints, and its process
 * (started, stopped and restarted with other feature gates by the phases).
 */
import { spawnSync, type ChildProcess } from 'node:child_process';
import { readdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { httpGet, NODE_NAME, podsOf, sleep, startLogged, stopChild, waitFor } from './lib.ts';

/** What kubelet sets at start unless protectKernelDefaults (pkg/kubelet/cm/container_manager_linux.go). */
const KUBELET_SYSCTLS = ['vm.overcommit_memory', 'vm.panic_on_oom', 'kernel.panic', 'kernel.panic_on_oops', 'kernel.keys.root_maxkeys', 'kernel.keys.root_maxbytes'];

function sysctl(name: string): string | undefined {
  const r = spawnSync('sysctl', ['-n', name], { encoding: 'utf8' });
  return r.status === 0 ? r.stdout.trim() : undefined;
}

/** Reads the sysctls kubelet changes at start; the step returned puts back whatever they were. */
export function keepKubeletSysctls(): () => void {
  const saved = new Map(KUBELET_SYSCTLS.map((n) => [n, sysctl(n)] as const));
  return () => {
    for (const [n, v] of saved) if (v !== undefined && sysctl(n) !== v) spawnSync('sysctl', ['-q', '-w', `${n}=${v}`]);
  };
}

export interface KubeletInfo {
  bin: string;
  /** "v1.26.7", or "unknown". */
  version: string;
  /** The minor version, when known. */
  minor: number | undefined;
  /** Endpoints in the config file (containerRuntimeEndpoint, imageServiceEndpoint) rather than flags. */
  endpointsInConfig: boolean;
  /** How that was decided, for the table. */
  how: string;
}

/**
 * `kubelet --version`. Kubelets from 1.27 read the endpoints from the config file and some builds
 * (KubeEdge's fork) have no flags for them any more, while 1.26 reads only the flags. When the
 * version cannot be read, whether --help lists the flag decides.
 */
export function kubeletInfo(bin: string): KubeletInfo {
  const v = spawnSync(bin, ['--version'], { encoding: 'utf8', timeout: 30_000 });
  const m = /v1\.(\d+)\.\d+[\w.+-]*/.exec(`${v.stdout ?? ''}${v.stderr ?? ''}`);
  if (m) {
    const minor = Number(m[1]);
    return { bin, version: m[0], minor, endpointsInConfig: minor >= 27, how: minor >= 27 ? 'config file (>= 1.27)' : 'flags (< 1.27)' };
  }
  const help = spawnSync(bin, ['--help'], { encoding: 'utf8', timeout: 30_000 });
  const hasFlag = /--container-runtime-endpoint/.test(`${help.stdout ?? ''}${help.stderr ?? ''}`);
  return { bin, version: 'unknown', minor: undefined, endpointsInConfig: !hasFlag, how: hasFlag ? 'flags (--help lists them)' : 'config file (--help has no such flag)' };
}

export interface KubeletSetup {
  scratch: string;
  manifests: string;
  rootDir: string;
  port: number;
  roPort: number;
  healthzPort: number;
  /** unix://… of the shim (runtime service). */
  runtimeEndpoint: string;
  /** unix://… of containerd (image service: direct, as docs/closing-the-hole.md configures a node). */
  imageEndpoint: string;
  /** Registered with an API server (make e2e-cluster) rather than standalone with static pods. */
  cluster?: ClusterMembership;
  /** --hostname-override; default NODE_NAME. */
  nodeName?: string;
  /**
   * Where kubelet keeps pod logs (podLogsDir, 1.29+; /var/log/pods before). Kubelets sharing one
   * host need one each: each removes the directories of pods it does not know.
   */
  podLogsDir?: string;
}

/**
 * What a kubelet registered with an API server needs: its client credentials, the cluster CA for
 * the callers it authenticates (the API server, the agent's service-account token through the
 * webhook authenticator), and a serving certificate from the cluster CA, so the agent verifies it
 * as in deploy/base. No read-only port: pods could read it on the node address.
 */
export interface ClusterMembership {
  kubeconfig: string;
  clientCaFile: string;
  tlsCertFile: string;
  tlsPrivateKeyFile: string;
  nodeIp: string;
  maxPods: number;
}

export class Kubelet {
  readonly info: KubeletInfo;
  readonly setup: KubeletSetup;
  /** Feature gates every start sets (what this version needs for the run's pods). */
  readonly baseGates: Record<string, boolean>;
  proc: ChildProcess | undefined;
  /** The current start's log file. */
  log = '';
  /** Feature gates of the current start. */
  gates: Record<string, boolean> = {};

  constructor(info: KubeletInfo, setup: KubeletSetup, baseGates: Record<string, boolean>) {
    this.info = info;
    this.setup = setup;
    this.baseGates = baseGates;
  }

  #config(label: string, gates: Record<string, boolean>): string {
    const s = this.setup;
    const file = path.join(s.scratch, `kubelet-config-${label}.yaml`);
    const lines = [
      'apiVersion: kubelet.config.k8s.io/v1beta1',
      'kind: KubeletConfiguration',
      `staticPodPath: ${s.manifests}`,
      'fileCheckFrequency: 1s',
      'syncFrequency: 10s',
      `port: ${s.port}`,
      'healthzBindAddress: 127.0.0.1',
      `healthzPort: ${s.healthzPort}`,
      ...(s.cluster
        ? [
          `address: ${s.cluster.nodeIp}`,
          'readOnlyPort: 0',
          `authentication: {anonymous: {enabled: false}, webhook: {enabled: true}, x509: {clientCAFile: ${s.cluster.clientCaFile}}}`,
          'authorization: {mode: Webhook}',
          `tlsCertFile: ${s.cluster.tlsCertFile}`,
          `tlsPrivateKeyFile: ${s.cluster.tlsPrivateKeyFile}`,
          `maxPods: ${s.cluster.maxPods}`,
          'nodeStatusReportFrequency: 10s',
        ]
        : ['address: 127.0.0.1', `readOnlyPort: ${s.roPort}`, 'authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}', 'authorization: {mode: AlwaysAllow}']),
      'cgroupDriver: cgroupfs',
      'cgroupsPerQOS: false',
      'enforceNodeAllocatable: []',
      'failSwapOn: false',
      'evictionHard: {}',
      'makeIPTablesUtilChains: false',
      'localStorageCapacityIsolation: false',
      'serializeImagePulls: false',
      // kubelet's probe and sync lines ("SyncLoop (probe)", "Probe failed") are at verbosity 1-2.
      'logging: {verbosity: 2}',
    ];
    if (s.podLogsDir && this.atLeast(29)) lines.push(`podLogsDir: ${s.podLogsDir}`);
    if (this.info.endpointsInConfig) lines.push(`containerRuntimeEndpoint: ${s.runtimeEndpoint}`, `imageServiceEndpoint: ${s.imageEndpoint}`);
    if (Object.keys(gates).length > 0) lines.push(`featureGates: {${Object.entries(gates).map(([k, v]) => `${k}: ${v}`).join(', ')}}`);
    writeFileSync(file, `${lines.join('\n')}\n`);
    return file;
  }

  #args(config: string): string[] {
    const s = this.setup;
    return [
      `--config=${config}`,
      ...(this.info.endpointsInConfig ? [] : [`--container-runtime-endpoint=${s.runtimeEndpoint}`, `--image-service-endpoint=${s.imageEndpoint}`]),
      `--root-dir=${s.rootDir}`,
      `--cert-dir=${path.join(s.scratch, s.nodeName ? `pki-${s.nodeName}` : 'pki')}`,
      `--hostname-override=${s.nodeName ?? NODE_NAME}`,
      // Registered, the shim installer labels the node (make e2e-cluster's step 3).
      ...(s.cluster ? [`--kubeconfig=${s.cluster.kubeconfig}`, `--node-ip=${s.cluster.nodeIp}`] : ['--node-labels=probe-agent.io/shim=ready']),
    ];
  }

  /**
   * Starts kubelet (log `kubelet-<label>.log`) with the base gates plus `gates`; true once /healthz
   * answers and /pods lists every static pod. Until kubelet has taken in its first static pod list
   * its sources are not ready, and a manifest removed then is never killed ("Failed to delete pod
   * ... sources aren't ready yet"): the phases change manifests only after this.
   */
  async start(label: string, gates: Record<string, boolean> = {}): Promise<boolean> {
    this.gates = { ...this.baseGates, ...gates };
    this.log = path.join(this.setup.scratch, `kubelet-${label}.log`);
    const proc = startLogged(this.info.bin, this.#args(this.#config(label, this.gates)), this.log);
    this.proc = proc;
    const up = await waitFor(`kubelet /healthz (${label})`, 60_000, async () => (proc.exitCode !== null ? false : this.healthy()), 300);
    if (up !== true || proc.exitCode !== null) return false;
    if (this.setup.cluster) return true;
    const files = readdirSync(this.setup.manifests).filter((f) => f.endsWith('.json') && !f.startsWith('.')).length;
    const listed = await waitFor(`kubelet to list its ${files} static pods (${label})`, 60_000, async () =>
      (proc.exitCode !== null ? false : (await podsOf(this.setup.roPort)).length >= files || undefined), 300);
    // A standalone main over KubeEdge's fork flips its sources ready on that same signal (200 ms polls).
    await sleep(1000);
    return listed === true && proc.exitCode === null;
  }

  async stop(): Promise<void> {
    await stopChild(this.proc, 15_000);
  }

  /** The read-only port's /healthz (its "syncloop" check fails when the sync loop stalls), or the healthz port's when registered. */
  async healthy(): Promise<true | undefined> {
    const port = this.setup.cluster ? this.setup.healthzPort : this.setup.roPort;
    return (await httpGet(`http://127.0.0.1:${port}/healthz`, 1000)).status === 200 || undefined;
  }

  get exited(): boolean {
    return this.proc === undefined || this.proc.exitCode !== null || this.proc.signalCode !== null;
  }

  /** Where this kubelet's pod log directories are: its own podLogsDir (1.29+), else /var/log/pods. */
  get podLogsRoot(): string {
    return this.setup.podLogsDir && this.atLeast(29) ? this.setup.podLogsDir : '/var/log/pods';
  }

  /** Whether this kubelet's minor is at least `minor` (unknown versions count as new). */
  atLeast(minor: number): boolean {
    return this.info.minor === undefined || this.info.minor >= minor;
  }
}
