/**
 * `probe-agent run`: the DaemonSet process. Every flag has a PROBE_AGENT_* environment twin
 * (flag wins over env, env over the default). These flag names are a contract with deploy/.
 */
import { isIP } from 'node:net';
import { Command, Option } from 'commander';
import { ConfigError, describeError } from '../errors.ts';
import { parseFeatureGates, type FeatureGates } from '../featuregates.ts';
import { levelForVerbosity, type LogFormat, type LogLevel } from '../log.ts';
import { DEFAULT_KUBE_PROBE_VERSION } from '../version.ts';
import { parseDuration } from './duration.ts';
import { DEFAULT_SOCKET_PATH } from '../api/proto.ts';

/** The validated configuration of `run` (and of `audit`, which shares the kubelet/netns flags). */
export interface RunConfig {
  kubeletUrl: string;
  kubeletTokenFile?: string;
  kubeletCaFile?: string;
  kubeletInsecureTls: boolean;
  kubeletPollIntervalMs: number;
  kubeletTimeoutMs: number;
  kubeletTlsServerName?: string;
  kubeletMaxResponseBytes: number;
  nodeName?: string;
  criEndpoint?: string;
  netnsResolvers: ('cri' | 'procfs' | 'address')[];
  netnsDirs: string[];
  procRoot: string;
  sandboxedRuntimeHandlers: string[];
  socket: string;
  socketGroup?: string;
  grpcReflection: boolean;
  metricsAddress: { host: string; port: number } | undefined;
  logLevel: LogLevel;
  logFormat: LogFormat;
  featureGates: FeatureGates;
  kubeProbeVersion: string;
  maxConcurrentProbes: number;
  maxQueuedProbes: number;
  helperPath?: string;
  shutdownGracePeriodMs: number;
}

/** Default path of the ProbeService socket (a contract with the kubelet shim and deploy/). */
export const DEFAULT_SOCKET = DEFAULT_SOCKET_PATH;
/** Default metrics/health listener: loopback only, so nothing is open to pods by default. */
export const DEFAULT_METRICS_ADDRESS = '127.0.0.1:9809';
const SA_TOKEN = '/var/run/secrets/kubernetes.io/serviceaccount/token';

type Raw = Record<string, string | boolean | string[] | undefined>;

/** Declares a flag with its PROBE_AGENT_* env twin. */
function flag(spec: string, description: string, defaultValue?: string | boolean): Option {
  const long = /--([a-z0-9-]+)/.exec(spec)?.[1] as string;
  const opt = new Option(spec, description).env(`PROBE_AGENT_${long.toUpperCase().replaceAll('-', '_')}`);
  if (defaultValue !== undefined) opt.default(defaultValue);
  return opt;
}

/**
 * A boolean flag whose env twin is read as true/false (commander would turn any set variable, even
 * "false", into true): `--x`, `--x=false` and `PROBE_AGENT_X=false` all mean what they say.
 */
function boolFlag(spec: string, description: string): Option {
  return flag(`${spec} [bool]`, description, false).argParser((value: string) => {
    if (/^(true|1|yes)$/i.test(value)) return true;
    if (/^(false|0|no|)$/i.test(value)) return false;
    throw new ConfigError(`${spec}: want true or false, got "${value}"`);
  });
}

/** Adds the kubelet and netns flags shared by `run` and `audit`. */
export function addKubeletAndNetnsFlags(cmd: Command): Command {
  return cmd
    .addOption(flag('--kubelet-url <url>', 'kubelet API base URL (http:// for a read-only or test kubelet)', 'https://$HOST_IP:10250'))
    .addOption(flag('--kubelet-token-file <path>', 'bearer token file, re-read on change', SA_TOKEN))
    .addOption(flag('--kubelet-ca-file <path>', "CA bundle for the kubelet's serving certificate"))
    .addOption(boolFlag('--kubelet-insecure-tls', "do not verify the kubelet's serving certificate (self-signed kubelets)"))
    .addOption(flag('--kubelet-poll-interval <duration>', 'how often to GET /pods', '5s'))
    .addOption(flag('--kubelet-request-timeout <duration>', 'timeout of one GET /pods', '10s'))
    .addOption(flag('--kubelet-tls-server-name <name>', "name to verify the kubelet's certificate against when the URL holds an IP (often the node name)"))
    .addOption(flag('--kubelet-max-response-bytes <n>', 'largest PodList accepted', String(64 * 1024 * 1024)))
    .addOption(flag('--node-name <name>', 'this node (default $NODE_NAME), for logs'))
    .addOption(flag('--cri-endpoint <endpoint>', 'CRI runtime socket (default: auto-detect containerd, then CRI-O)'))
    .addOption(flag('--netns-resolvers <list>', 'ordered netns resolvers: cri,procfs,address', 'cri,procfs,address'))
    .addOption(flag('--netns-dir <dir...>', 'extra directories netns files may live in (besides /run/netns, /var/run/netns); comma-separated in the env twin'))
    .addOption(flag('--proc-root <path>', "where the host's /proc is mounted", '/proc'))
    .addOption(
      flag('--sandboxed-runtime-handlers <list>', 'runtime handlers whose pods are left to kubelet', 'runsc,gvisor,kata,kata-qemu,kata-clh,kata-fc'),
    )
    .addOption(flag('--feature-gates <gates>', 'Name=true|false,... (probe-agent feature-gates lists them)'))
    .addOption(flag('--kube-probe-version <major.minor>', 'version sent in User-Agent: kube-probe/<v>', DEFAULT_KUBE_PROBE_VERSION))
    .addOption(flag('--helper-path <path>', 'the netns helper binary (default: next to the agent)'))
    .addOption(flag('--max-concurrent-probes <n>', 'probes in flight at once (helper children included)', '64'))
    .addOption(flag('--max-queued-probes <n>', 'probes waiting for a slot before new ones are refused', '4096'))
    .addOption(flag('--log-level <level>', 'error, warn, info, debug or trace', 'info'))
    .addOption(flag('--log-format <format>', 'json or text', 'json'))
    .addOption(flag('-v, --verbosity <n>', 'klog-style verbosity: 0-2 info, 3-4 debug, 5 trace (overrides --log-level)'));
}

/** Adds `run` to the program. */
export function registerRunCommand(program: Command): void {
  const cmd = program.command('run').description('run the node agent (DaemonSet mode)');
  addKubeletAndNetnsFlags(cmd)
    .addOption(flag('--socket <path>', 'ProbeService unix socket (created 0600)', DEFAULT_SOCKET))
    .addOption(flag('--socket-group <group>', 'group allowed to use the socket (mode becomes 0660)'))
    .addOption(boolFlag('--grpc-reflection', 'serve gRPC server reflection on the socket'))
    .addOption(flag('--metrics-address <host:port>', 'metrics and health listener ("" disables it)', DEFAULT_METRICS_ADDRESS))
    .addOption(flag('--shutdown-grace-period <duration>', 'time to drain probes and API calls on SIGTERM', '10s'))
    .action(async (raw: Raw) => {
      let config: RunConfig;
      try {
        config = parseRunConfig(raw, process.env);
      } catch (err) {
        process.stderr.write(`probe-agent run: ${describeError(err)}\n`);
        process.exitCode = 2;
        return;
      }
      const { startDaemon } = await import('../daemon.ts');
      try {
        await startDaemon(config);
      } catch {
        // startDaemon logged why (in the configured log format); an uncaught rethrow would add a
        // multi-line stack dump to stderr and break --log-format=json for log collectors.
        process.exit(1);
      }
    });
}

function str(raw: Raw, key: string): string | undefined {
  const v = raw[key];
  return typeof v === 'string' && v !== '' ? v : undefined;
}

function positiveInt(raw: Raw, key: string, flagName: string, max = 1_000_000_000): number {
  const text = str(raw, key) ?? '';
  const n = Number(text);
  if (!Number.isInteger(n) || n < 1 || n > max) throw new ConfigError(`--${flagName}: want an integer 1..${max}, got "${text}"`);
  return n;
}

/** Parses "host:port" ("[v6]:port" for IPv6); "" means disabled. */
export function parseListenAddress(text: string, flagName: string): { host: string; port: number } | undefined {
  if (text === '') return undefined;
  const m = /^(?:\[([0-9a-fA-F:.]+)\]|([^:[\]]*)):(\d{1,5})$/.exec(text);
  const host = m?.[1] ?? m?.[2] ?? '';
  const port = Number(m?.[3]);
  if (!m || port > 65535 || (host !== '' && host !== 'localhost' && isIP(host) === 0)) {
    throw new ConfigError(`--${flagName}: want host:port with an IP host (e.g. 127.0.0.1:9809), got "${text}"`);
  }
  return { host: host === '' ? '0.0.0.0' : host, port };
}

/** Validates raw flag values (already merged with their env twins) into a RunConfig. */
export function parseRunConfig(raw: Raw, env: NodeJS.ProcessEnv): RunConfig {
  let kubeletUrl = str(raw, 'kubeletUrl') ?? 'https://$HOST_IP:10250';
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

  const resolvers = (str(raw, 'netnsResolvers') ?? '').split(',').map((s) => s.trim()).filter(Boolean);
  if (resolvers.length === 0) throw new ConfigError('--netns-resolvers: give at least one of cri, procfs, address');
  for (const r of resolvers) {
    if (r !== 'cri' && r !== 'procfs' && r !== 'address') throw new ConfigError(`--netns-resolvers: unknown resolver "${r}" (cri, procfs, address)`);
  }
  if (new Set(resolvers).size !== resolvers.length) throw new ConfigError('--netns-resolvers: a resolver is listed twice');

  const logLevel = (str(raw, 'logLevel') ?? 'info') as LogLevel;
  if (!['error', 'warn', 'info', 'debug', 'trace'].includes(logLevel)) throw new ConfigError(`--log-level: unknown level "${logLevel}"`);
  const logFormat = (str(raw, 'logFormat') ?? 'json') as LogFormat;
  if (logFormat !== 'json' && logFormat !== 'text') throw new ConfigError(`--log-format: want json or text, got "${logFormat}"`);
  const verbosity = str(raw, 'verbosity');
  if (verbosity !== undefined && !/^\d$/.test(verbosity)) throw new ConfigError(`-v: want 0..9, got "${verbosity}"`);

  const kubeProbeVersion = str(raw, 'kubeProbeVersion') ?? DEFAULT_KUBE_PROBE_VERSION;
  if (!/^\d+\.\d+$/.test(kubeProbeVersion)) throw new ConfigError(`--kube-probe-version: want major.minor, got "${kubeProbeVersion}"`);

  const netnsDirs = raw.netnsDir;
  const socket = str(raw, 'socket') ?? DEFAULT_SOCKET;
  if (!socket.startsWith('/')) throw new ConfigError(`--socket: want an absolute path, got "${socket}"`);

  return {
    kubeletUrl: url.toString().replace(/\/$/, ''),
    kubeletTokenFile: str(raw, 'kubeletTokenFile'),
    kubeletCaFile: str(raw, 'kubeletCaFile'),
    kubeletInsecureTls: raw.kubeletInsecureTls === true || raw.kubeletInsecureTls === 'true',
    kubeletPollIntervalMs: parseDuration(str(raw, 'kubeletPollInterval') ?? '5s', '--kubelet-poll-interval'),
    kubeletTimeoutMs: parseDuration(str(raw, 'kubeletRequestTimeout') ?? '10s', '--kubelet-request-timeout'),
    kubeletTlsServerName: str(raw, 'kubeletTlsServerName'),
    kubeletMaxResponseBytes: positiveInt(raw, 'kubeletMaxResponseBytes', 'kubelet-max-response-bytes', 1 << 30),
    nodeName: str(raw, 'nodeName') ?? env.NODE_NAME,
    criEndpoint: str(raw, 'criEndpoint'),
    netnsResolvers: resolvers as RunConfig['netnsResolvers'],
    // The env twin is one string: accept comma-separated lists there (and in repeated flags).
    netnsDirs: (Array.isArray(netnsDirs) ? netnsDirs : typeof netnsDirs === 'string' ? [netnsDirs] : [])
      .flatMap((d) => d.split(','))
      .map((d) => d.trim())
      .filter(Boolean),
    procRoot: str(raw, 'procRoot') ?? '/proc',
    sandboxedRuntimeHandlers: (str(raw, 'sandboxedRuntimeHandlers') ?? '').split(',').map((s) => s.trim()).filter(Boolean),
    socket,
    socketGroup: str(raw, 'socketGroup'),
    grpcReflection: raw.grpcReflection === true || raw.grpcReflection === 'true',
    metricsAddress: parseListenAddress(typeof raw.metricsAddress === 'string' ? raw.metricsAddress : DEFAULT_METRICS_ADDRESS, 'metrics-address'),
    logLevel: verbosity !== undefined ? levelForVerbosity(Number(verbosity)) : logLevel,
    logFormat,
    featureGates: parseFeatureGates(str(raw, 'featureGates')),
    kubeProbeVersion,
    maxConcurrentProbes: positiveInt(raw, 'maxConcurrentProbes', 'max-concurrent-probes', 4096),
    maxQueuedProbes: positiveInt(raw, 'maxQueuedProbes', 'max-queued-probes', 1_000_000),
    helperPath: str(raw, 'helperPath'),
    shutdownGracePeriodMs: parseDuration(str(raw, 'shutdownGracePeriod') ?? '10s', '--shutdown-grace-period'),
  };
}
