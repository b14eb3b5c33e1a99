/**
 * The validated configuration of the daemon (and of the audit, which shares the kubelet, netns and
 * probe settings), built from raw flag values. The CLI declares the flags; this module owns what
 * they mean, so the daemon and the audit never import the CLI.
 */
import { existsSync } from 'node:fs';
import { isIP } from 'node:net';
import { DEFAULT_SOCKET_PATH } from '../api/proto.ts';
import { shimSocketBeside } from '../contract/shim-socket.ts';
import { ConfigError } from '../errors.ts';
import { parseFeatureGates, type FeatureGates } from '../featuregates.ts';
import { levelForVerbosity, type LogFormat, type LogLevel, type Logger } from '../log.ts';
import type { KubeletClientOptions } from '../pods/kubelet-client.ts';
import { convertPodItem } from '../pods/pod-model.ts';
import { DEFAULT_KUBE_PROBE_VERSION } from '../version.ts';
import { boundedInt } from './bounds.ts';
import { parseDuration } from './duration.ts';
import { DEFAULT_METRICS_ADDRESS, parseListenAddress, type ListenAddress } from './listen-address.ts';

/** The validated configuration of `run` (and of `audit`, which shares the kubelet/netns/probe settings). */
export interface RunConfig {
  kubeletUrl: string;
  /** The configured token file; absent = the service-account token when that file exists, else none. */
  kubeletTokenFile?: string;
  kubeletCaFile?: string;
  kubeletInsecureTls: boolean;
  kubeletPollIntervalMs: number;
  kubeletTimeoutMs: number;
  kubeletTlsServerName?: string;
  kubeletMaxResponseBytes: number;
  kubeletMaxPodBytes: number;
  nodeName?: string;
  criEndpoint?: string;
  netnsResolvers: ('cri' | 'procfs' | 'address')[];
  netnsDirs: string[];
  procRoot: string;
  sandboxedRuntimeHandlers: string[];
  socket: string;
  socketGroup?: string;
  /** The kubelet shim's socket (root-only, ExecSync only; default: `-shim.sock` beside `socket`). */
  shimSocket: string;
  grpcReflection: boolean;
  metricsAddress: ListenAddress | undefined;
  healthAddress: ListenAddress | undefined;
  /** The close-hole sidecar's state file (absolute), when that component runs beside the agent. */
  closeHoleStateFile?: string;
  logLevel: LogLevel;
  logFormat: LogFormat;
  featureGates: FeatureGates;
  kubeProbeVersion: string;
  maxConcurrentProbes: number;
  maxQueuedProbes: number;
  maxProbesPerNamespace: number;
  maxProbesPerPod: number;
  maxConcurrentHooks: number;
  maxHooksPerNamespace: number;
  maxHooksPerPod: number;
  maxHelperRequests: number;
  /** Long-lived netns helper workers (gate NetnsHelperPool). */
  helperPoolSize: number;
  helperPath?: string;
  shutdownGracePeriodMs: number;
  /** Probe ticks fire at multiples of this (0: when due); ticks due together then share one wakeup. */
  probeTickAlignmentMs: number;
  /** The kubelet shim's metrics socket, relayed at /metrics/shim (absent: not relayed). */
  shimMetricsSocket?: string;
  /** Gates mode (agent/gates/): write the pods' probe-agent.io/ready condition, stop containers on liveness failures. */
  gates: boolean;
  /** The API server for gates mode (absent: in-cluster from KUBERNETES_SERVICE_HOST/PORT). */
  apiServerUrl?: string;
  apiTokenFile?: string;
  apiCaFile?: string;
  /** Gates mode: renew the node's Lease this long (ms; 0: no lease), in `nodeLeaseNamespace`. */
  nodeLeaseDurationMs: number;
  nodeLeaseNamespace: string;
}

/** Default path of the ProbeService socket (a contract with the kubelet shim and deploy/). */
export const DEFAULT_SOCKET = DEFAULT_SOCKET_PATH;
export { DEFAULT_METRICS_ADDRESS };
/** Where Kubernetes mounts the pod's service-account token. */
export const DEFAULT_SA_TOKEN_FILE = '/var/run/secrets/kubernetes.io/serviceaccount/token';

/** Defaults of the raw values, as the flags show them (keys are the flags' camelCase names). */
export const RUN_DEFAULTS = {
  kubeletUrl: 'https://$HOST_IP:10250',
  kubeletPollInterval: '5s',
  kubeletRequestTimeout: '10s',
  kubeletMaxResponseBytes: String(64 * 1024 * 1024),
  kubeletMaxPodBytes: String(1024 * 1024),
  netnsResolvers: 'cri,procfs,address',
  procRoot: '/proc',
  sandboxedRuntimeHandlers: 'runsc,gvisor,kata,kata-qemu,kata-clh,kata-fc',
  kubeProbeVersion: DEFAULT_KUBE_PROBE_VERSION,
  // A probe waiting on its target holds a socket and a timer, so the node-wide cap is large; the
  // per-namespace and per-pod caps keep one tenant from holding it all (docs/deploy.md, "Threat model and limits").
  maxConcurrentProbes: '2048',
  maxQueuedProbes: '4096',
  maxProbesPerNamespace: '256',
  maxProbesPerPod: '64',
  maxConcurrentHooks: '512',
  maxHooksPerNamespace: '64',
  maxHooksPerPod: '16',
  maxHelperRequests: '128',
  helperPoolSize: '4',
  logLevel: 'info',
  logFormat: 'json',
  socket: DEFAULT_SOCKET,
  metricsAddress: DEFAULT_METRICS_ADDRESS,
  // Off by default (health is also on the metrics listener), so that agents started by hand or by
  // tests never fight over a port; the DaemonSet sets 127.0.0.1:9810, where kubelet (an exec probe)
  // and the close-hole sidecar reach it and no other pod can (docs/deploy.md, "Threat model and limits").
  healthAddress: '',
  shutdownGracePeriod: '10s',
  // 50 ms: at 250 pods x 3 probes every 10 s this cut the agent's CPU by about a third (fewer
  // wakeups of the agent and the helper), and shifts each probe by a fixed offset under 50 ms.
  probeTickAlignment: '50ms',
  nodeLeaseDuration: '0s',
  nodeLeaseNamespace: 'probe-agent',
} as const;

/** Raw flag values (already merged with their env twins), keyed by the flags' camelCase names. */
export type RawFlags = Record<string, string | boolean | string[] | undefined>;

function str(raw: RawFlags, key: string): string | undefined {
  const v = raw[key];
  return typeof v === 'string' && v !== '' ? v : undefined;
}

/** The raw value, or its default; '' counts as not given. */
function valueOf(raw: RawFlags, key: keyof typeof RUN_DEFAULTS): string {
  return str(raw, key) ?? RUN_DEFAULTS[key];
}

function flagInt(raw: RawFlags, key: keyof typeof RUN_DEFAULTS, flagName: string, max: number): number {
  const text = valueOf(raw, key);
  return boundedInt(/^\d+$/.test(text.trim()) ? Number(text) : Number.NaN, 1, max, flagName, `"${text}"`);
}

function list(text: string): string[] {
  return text.split(',').map((s) => s.trim()).filter(Boolean);
}

/** Validates raw flag values into a RunConfig; a missing value takes its RUN_DEFAULTS entry. Throws ConfigError. */
export function parseRunConfig(raw: RawFlags, env: NodeJS.ProcessEnv): RunConfig {
  let kubeletUrl = valueOf(raw, 'kubeletUrl');
  if (kubeletUrl.includes('$HOST_IP')) {
    if (!env.HOST_IP) throw new ConfigError('--kubelet-url: the default uses $HOST_IP, which is not set (set it from status.hostIP, or give --kubelet-url)');
    const host = isIP(env.HOST_IP) === 6 ? `[${env.HOST_IP}]` : env.HOST_IP;
    kubeletUrl = kubeletUrl.replace('$HOST_IP', host);
  }
  let url: URL;
  try {
    url = new URL(kubeletUrl);
  } catch {
    throw new ConfigError(`--kubelet-url: not a URL: "${kubeletUrl}"`);
  }
  if (url.protocol !== 'https:' && url.protocol !== 'http:') throw new ConfigError(`--kubelet-url: want http(s)://, got "${kubeletUrl}"`);

  const resolvers = list(valueOf(raw, 'netnsResolvers'));
  if (resolvers.length === 0) throw new ConfigError('--netns-resolvers: give at least one of cri, procfs, address');
  for (const r of resolvers) {
    if (r !== 'cri' && r !== 'procfs' && r !== 'address') throw new ConfigError(`--netns-resolvers: unknown resolver "${r}" (cri, procfs, address)`);
  }
  if (new Set(resolvers).size !== resolvers.length) throw new ConfigError('--netns-resolvers: a resolver is listed twice');

  const logLevel = valueOf(raw, 'logLevel') as LogLevel;
  if (!['error', 'warn', 'info', 'debug', 'trace'].includes(logLevel)) throw new ConfigError(`--log-level: unknown level "${logLevel}"`);
  const logFormat = valueOf(raw, 'logFormat') as LogFormat;
  if (logFormat !== 'json' && logFormat !== 'text') throw new ConfigError(`--log-format: want json or text, got "${logFormat}"`);
  const verbosity = str(raw, 'verbosity');
  if (verbosity !== undefined && !/^\d$/.test(verbosity)) throw new ConfigError(`-v: want 0..9, got "${verbosity}"`);

  const kubeProbeVersion = valueOf(raw, 'kubeProbeVersion');
  if (!/^\d+\.\d+$/.test(kubeProbeVersion)) throw new ConfigError(`--kube-probe-version: want major.minor, got "${kubeProbeVersion}"`);

  const netnsDirs = raw.netnsDir;
  const socket = valueOf(raw, 'socket');
  if (!socket.startsWith('/')) throw new ConfigError(`--socket: want an absolute path, got "${socket}"`);
  const shimSocket = str(raw, 'shimSocket') || shimSocketBeside(socket);
  if (!shimSocket.startsWith('/')) throw new ConfigError(`--shim-socket: want an absolute path, got "${shimSocket}"`);
  if (shimSocket === socket) throw new ConfigError(`--shim-socket: must differ from --socket (${socket})`);
  // "" is a value here (it disables the listener), not an absent flag.
  const closeHoleStateFile = str(raw, 'closeHoleStateFile');
  if (closeHoleStateFile !== undefined && !closeHoleStateFile.startsWith('/')) {
    throw new ConfigError(`--close-hole-state-file: want an absolute path, got "${closeHoleStateFile}"`);
  }
  const metricsAddress = typeof raw.metricsAddress === 'string' ? raw.metricsAddress : RUN_DEFAULTS.metricsAddress;
  const healthAddress = typeof raw.healthAddress === 'string' ? raw.healthAddress : RUN_DEFAULTS.healthAddress;

  return {
    kubeletUrl: url.toString().replace(/\/$/, ''),
    kubeletTokenFile: str(raw, 'kubeletTokenFile'),
    kubeletCaFile: str(raw, 'kubeletCaFile'),
    kubeletInsecureTls: raw.kubeletInsecureTls === true || raw.kubeletInsecureTls === 'true',
    kubeletPollIntervalMs: parseDuration(valueOf(raw, 'kubeletPollInterval'), '--kubelet-poll-interval'),
    kubeletTimeoutMs: parseDuration(valueOf(raw, 'kubeletRequestTimeout'), '--kubelet-request-timeout'),
    kubeletTlsServerName: str(raw, 'kubeletTlsServerName'),
    kubeletMaxResponseBytes: flagInt(raw, 'kubeletMaxResponseBytes', '--kubelet-max-response-bytes', 1 << 30),
    kubeletMaxPodBytes: flagInt(raw, 'kubeletMaxPodBytes', '--kubelet-max-pod-bytes', 64 << 20),
    nodeName: str(raw, 'nodeName') ?? env.NODE_NAME,
    criEndpoint: str(raw, 'criEndpoint'),
    netnsResolvers: resolvers as RunConfig['netnsResolvers'],
    // The env twin is one string: accept comma-separated lists there (and in repeated flags).
    netnsDirs: (Array.isArray(netnsDirs) ? netnsDirs : typeof netnsDirs === 'string' ? [netnsDirs] : []).flatMap(list),
    procRoot: valueOf(raw, 'procRoot'),
    sandboxedRuntimeHandlers: list(valueOf(raw, 'sandboxedRuntimeHandlers')),
    socket,
    socketGroup: str(raw, 'socketGroup'),
    shimSocket,
    grpcReflection: raw.grpcReflection === true || raw.grpcReflection === 'true',
    metricsAddress: metricsAddress === '' ? undefined : parseListenAddress(metricsAddress, '--metrics-address'),
    healthAddress: healthAddress === '' ? undefined : parseListenAddress(healthAddress, '--health-address'),
    closeHoleStateFile,
    logLevel: verbosity !== undefined ? levelForVerbosity(Number(verbosity)) : logLevel,
    logFormat,
    featureGates: parseFeatureGates(str(raw, 'featureGates')),
    kubeProbeVersion,
    maxConcurrentProbes: flagInt(raw, 'maxConcurrentProbes', '--max-concurrent-probes', 4096),
    maxQueuedProbes: flagInt(raw, 'maxQueuedProbes', '--max-queued-probes', 1_000_000),
    maxProbesPerNamespace: flagInt(raw, 'maxProbesPerNamespace', '--max-probes-per-namespace', 1_000_000),
    maxProbesPerPod: flagInt(raw, 'maxProbesPerPod', '--max-probes-per-pod', 1_000_000),
    maxConcurrentHooks: flagInt(raw, 'maxConcurrentHooks', '--max-concurrent-hooks', 65_536),
    maxHooksPerNamespace: flagInt(raw, 'maxHooksPerNamespace', '--max-hooks-per-namespace', 65_536),
    maxHooksPerPod: flagInt(raw, 'maxHooksPerPod', '--max-hooks-per-pod', 65_536),
    maxHelperRequests: flagInt(raw, 'maxHelperRequests', '--max-helper-requests', 4096),
    helperPoolSize: flagInt(raw, 'helperPoolSize', '--helper-pool-size', 64),
    helperPath: str(raw, 'helperPath'),
    shutdownGracePeriodMs: parseDuration(valueOf(raw, 'shutdownGracePeriod'), '--shutdown-grace-period'),
    probeTickAlignmentMs: tickAlignment(valueOf(raw, 'probeTickAlignment')),
    shimMetricsSocket: str(raw, 'shimMetricsSocket'),
    gates: raw.gates === true || raw.gates === 'true',
    apiServerUrl: str(raw, 'apiServer'),
    apiTokenFile: str(raw, 'apiTokenFile'),
    apiCaFile: str(raw, 'apiCaFile'),
    nodeLeaseDurationMs: parseDuration(valueOf(raw, 'nodeLeaseDuration'), '--node-lease-duration'),
    nodeLeaseNamespace: valueOf(raw, 'nodeLeaseNamespace'),
  };
}

/** How the resident helper serves requests: warm (gate WarmNetnsHelper), a pool of workers (NetnsHelperPool) or a child each. */
export function helperModeOptions(config: Pick<RunConfig, 'featureGates' | 'helperPoolSize'>): { warm: boolean; pool: number } {
  const warm = config.featureGates.enabled('WarmNetnsHelper');
  return { warm, pool: !warm && config.featureGates.enabled('NetnsHelperPool') ? config.helperPoolSize : 0 };
}

/** --probe-tick-alignment: 0 (off) or a divisor of one second, so every period stays whole. */
function tickAlignment(text: string): number {
  const ms = parseDuration(text, '--probe-tick-alignment');
  if (ms !== 0 && (ms > 1000 || 1000 % ms !== 0)) {
    throw new ConfigError(`--probe-tick-alignment: want 0 or a divisor of 1s (e.g. 10ms, 50ms, 100ms), got "${text}"`, { flag: '--probe-tick-alignment' });
  }
  return ms;
}

/**
 * The kubelet client settings of a RunConfig (the daemon and the audit both use this). The bearer
 * token is the configured file, else the service-account token when that file exists; with neither,
 * requests go without one (a plain-http read-only or test kubelet needs none), and this says so
 * once, here, at start.
 */
export function kubeletClientOptions(config: RunConfig, log: Logger, defaultTokenFile = DEFAULT_SA_TOKEN_FILE): KubeletClientOptions {
  let tokenFile = config.kubeletTokenFile;
  if (tokenFile === undefined) {
    if (existsSync(defaultTokenFile)) {
      tokenFile = defaultTokenFile;
    } else {
      const say = config.kubeletUrl.startsWith('https:') ? log.warn.bind(log) : log.info.bind(log);
      say('no kubelet bearer token: --kubelet-token-file is not set and the service-account token does not exist; asking the kubelet without one', {
        tokenFile: defaultTokenFile,
        kubelet: config.kubeletUrl,
      });
    }
  }
  return {
    url: config.kubeletUrl,
    ...(config.kubeletCaFile ? { caFile: config.kubeletCaFile } : {}),
    insecureTLS: config.kubeletInsecureTls,
    ...(config.kubeletTlsServerName ? { tlsServerName: config.kubeletTlsServerName } : {}),
    ...(tokenFile ? { tokenFile } : {}),
    timeoutMs: config.kubeletTimeoutMs,
    maxResponseBytes: config.kubeletMaxResponseBytes,
    maxPodBytes: config.kubeletMaxPodBytes,
    // Each pod becomes a PodInfo as it is read: the list's raw JSON is never held whole.
    convertItem: (raw: unknown) => convertPodItem(raw),
    log,
  };
}
