/**
 * `probe-agent run`: the DaemonSet process. Every flag has a PROBE_AGENT_* environment twin
 * (flag wins over env, env over the default). These flag names are a contract with deploy/.
 */
import { Command, Option } from 'commander';
import { ConfigError, describeError } from '../errors.ts';
import { DEFAULT_SA_TOKEN_FILE, parseRunConfig, RUN_DEFAULTS, type RawFlags, type RunConfig } from '../config/run-config.ts';

// The configuration itself lives in agent/config/ (core code never imports the CLI); re-exported for callers of the flags.
export { DEFAULT_SOCKET, parseRunConfig, type RunConfig } from '../config/run-config.ts';

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

/** Adds the flags `run` and `audit` share: how to reach the kubelet, find netns, probe and log. */
export function addKubeletAndNetnsFlags(cmd: Command): Command {
  const d = RUN_DEFAULTS;
  return cmd
    .addOption(flag('--kubelet-url <url>', 'kubelet API base URL (http:// for a read-only or test kubelet)', d.kubeletUrl))
    .addOption(flag('--kubelet-token-file <path>', `bearer token file, re-read on change (default: ${DEFAULT_SA_TOKEN_FILE} when it exists, else no token)`))
    .addOption(flag('--kubelet-ca-file <path>', "CA bundle for the kubelet's serving certificate"))
    .addOption(boolFlag('--kubelet-insecure-tls', "do not verify the kubelet's serving certificate (self-signed kubelets)"))
    .addOption(flag('--kubelet-request-timeout <duration>', 'timeout of one GET /pods', d.kubeletRequestTimeout))
    .addOption(flag('--kubelet-tls-server-name <name>', "name to verify the kubelet's certificate against when the URL holds an IP (often the node name)"))
    .addOption(flag('--kubelet-max-response-bytes <n>', 'largest PodList read (read pod by pod: bounds time, not memory)', d.kubeletMaxResponseBytes))
    .addOption(flag('--kubelet-max-pod-bytes <n>', 'largest pod of the PodList parsed; a larger one is dropped and reported, the others kept', d.kubeletMaxPodBytes))
    .addOption(flag('--cri-endpoint <endpoint>', 'CRI runtime socket (default: auto-detect containerd, then CRI-O)'))
    .addOption(flag('--netns-resolvers <list>', 'ordered netns resolvers: cri,procfs,address', d.netnsResolvers))
    .addOption(flag('--netns-dir <dir...>', 'extra directories netns files may live in (besides /run/netns, /var/run/netns); comma-separated in the env twin'))
    .addOption(flag('--proc-root <path>', "where the host's /proc is mounted", d.procRoot))
    .addOption(flag('--sandboxed-runtime-handlers <list>', 'runtime handlers whose pods are left to kubelet', d.sandboxedRuntimeHandlers))
    .addOption(flag('--feature-gates <gates>', 'Name=true|false,... (probe-agent feature-gates lists them)'))
    .addOption(flag('--kube-probe-version <major.minor>', 'version sent in User-Agent: kube-probe/<v>', d.kubeProbeVersion))
    .addOption(flag('--helper-path <path>', 'the netns helper binary (default: next to the agent)'))
    .addOption(flag('--log-level <level>', 'error, warn, info, debug or trace', d.logLevel))
    .addOption(flag('--log-format <format>', 'json or text', d.logFormat))
    .addOption(flag('-v, --verbosity <n>', 'klog-style verbosity: 0-2 info, 3-4 debug, 5 trace (overrides --log-level)'));
}

/** Adds `run` to the program. */
export function registerRunCommand(program: Command): void {
  const cmd = program.command('run').description('run the node agent (DaemonSet mode)');
  const d = RUN_DEFAULTS;
  addKubeletAndNetnsFlags(cmd)
    .addOption(flag('--kubelet-poll-interval <duration>', 'how often to GET /pods', d.kubeletPollInterval))
    .addOption(flag('--node-name <name>', 'this node, for logs (default: $NODE_NAME)'))
    .addOption(flag('--max-concurrent-probes <n>', 'probes in flight at once on the node (one waiting on its target costs a socket and a timer)', d.maxConcurrentProbes))
    .addOption(flag('--max-queued-probes <n>', 'probes waiting for a slot before new ones are refused', d.maxQueuedProbes))
    .addOption(flag('--max-probes-per-namespace <n>', "probes one namespace may have in flight (waiting: up to --max-queued-probes)", d.maxProbesPerNamespace))
    .addOption(flag('--max-probes-per-pod <n>', 'probes one pod may have in flight (and as many waiting)', d.maxProbesPerPod))
    .addOption(flag('--max-concurrent-hooks <n>', 'lifecycle hooks in flight at once on the node (as many may wait)', d.maxConcurrentHooks))
    .addOption(flag('--max-hooks-per-namespace <n>', 'hooks one namespace may have in flight (and as many waiting)', d.maxHooksPerNamespace))
    .addOption(flag('--max-hooks-per-pod <n>', 'hooks one pod may have in flight (and as many waiting)', d.maxHooksPerPod))
    .addOption(flag('--max-helper-requests <n>', 'netns helper requests at once; the rest wait, pods taking turns', d.maxHelperRequests))
    .addOption(flag('--helper-pool-size <n>', 'long-lived netns helper workers, one request at a time each (gate NetnsHelperPool); past them, a child per request', d.helperPoolSize))
    .addOption(flag('--socket <path>', 'ProbeService unix socket (created 0600)', d.socket))
    .addOption(flag('--socket-group <group>', 'group allowed to use the socket (mode becomes 0660)'))
    .addOption(flag('--shim-socket <path>', "the kubelet shim's socket, root-only (0600), serving ExecSync only (default: --socket with -shim.sock for .sock)"))
    .addOption(boolFlag('--grpc-reflection', 'serve gRPC server reflection on the socket'))
    .addOption(flag('--metrics-address <host:port>', 'metrics and health listener ("" disables it)', d.metricsAddress))
    .addOption(flag('--health-address <host:port>', 'health-only listener for kubelet and the close-hole sidecar, on loopback ("" disables it)', d.healthAddress))
    .addOption(flag('--close-hole-state-file <path>', "the close-hole sidecar's state file, exported as probe_agent_close_hole_* (nftables-close-hole component)"))
    .addOption(flag('--shutdown-grace-period <duration>', 'time to drain probes and API calls (hooks included) on SIGTERM', d.shutdownGracePeriod))
    .addOption(flag('--probe-tick-alignment <duration>', 'probe ticks fire at multiples of this, so ticks due together share one wakeup ("0" fires each when due)', d.probeTickAlignment))
    .addOption(flag('--shim-metrics-socket <path>', "the kubelet shim's metrics socket, relayed at /metrics/shim on the metrics listener"))
    .addOption(boolFlag('--gates', 'gates mode: write the probe-agent.io/ready condition of gates-mode pods and stop containers whose liveness or startup probe failed'))
    .addOption(flag('--api-server <url>', 'API server for gates mode (default: in-cluster)'))
    .addOption(flag('--api-token-file <path>', 'bearer token for --api-server (default in-cluster: the pod-bound service-account token)'))
    .addOption(flag('--api-ca-file <path>', "CA bundle of --api-server (default in-cluster: the service account's ca.crt)"))
    .addOption(flag('--node-lease-duration <duration>', 'gates mode: renew the Lease probe-agent-<node> with this duration ("0s": no lease)', d.nodeLeaseDuration))
    .addOption(flag('--node-lease-namespace <ns>', 'namespace of the node Lease', d.nodeLeaseNamespace))
    .action(async (raw: RawFlags) => {
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
