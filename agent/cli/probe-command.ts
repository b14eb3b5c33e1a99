/**
 * `probe-agent probe`: one probe, now, for people and scripts.
 * Exit status: 0 success (warning included), 1 failure, 2 the probe could not run.
 */
import { readFile, stat } from 'node:fs/promises';
import { isIP } from 'node:net';
import { Command, Option } from 'commander';
import { parseProbeText } from '../probe/spec.ts';
import { runProbe } from '../probe/run.ts';
import type { ProbeContext, ProbeHandler, ProbeOutcome, SocketFactory } from '../probe/types.ts';
import { ResidentHelper } from '../netns/helper.ts';
import { SpawnHelper } from '../netns/spawn-helper.ts';
import { NodeSocketFactory } from '../netns/node-sockets.ts';
import { readNetnsAddresses } from '../netns/pod-addresses.ts';
import { parseFeatureGates } from '../featuregates.ts';
import { describeError, InvalidProbeError, ProbeAgentError } from '../errors.ts';
import { DEFAULT_KUBE_PROBE_VERSION } from '../version.ts';
import { probeThroughAgent } from './probe-remote.ts';
import { DEFAULT_SOCKET_PATH } from '../api/proto.ts';

/** Exit codes of `probe` (a contract for scripts). */
export const EXIT_SUCCESS = 0;
export const EXIT_FAILURE = 1;
export const EXIT_ERROR = 2;

interface ProbeOptions {
  netns?: string;
  pod?: string;
  container?: string;
  socket: string;
  spec: string;
  podIp?: string[];
  containerPort?: string[];
  output: 'text' | 'json';
  verbose?: boolean;
  fromNode?: boolean;
  directSpawn?: boolean;
  kubeProbeVersion: string;
  featureGates?: string;
  legacyHostField?: boolean;
  helperPath?: string;
}

/** Adds `probe` to the program. */
export function registerProbeCommand(program: Command): void {
  program
    .command('probe')
    .description('run one Kubernetes probe now, inside a network namespace (or through the running agent with --pod)')
    .requiredOption('--spec <probe>', 'a Kubernetes Probe or just its handler, JSON or YAML, inline or @file')
    .option('--netns <path>', 'network namespace to probe inside: /proc/PID/ns/net or /run/netns/NAME')
    // --pod goes through the agent, which knows the pod's netns, IPs and ports: local-only flags would be ignored.
    .addOption(
      new Option('--pod <pod>', 'probe a pod known to the running agent (namespace/name or UID), through its socket')
        .conflicts(['netns', 'podIp', 'containerPort', 'fromNode', 'directSpawn', 'helperPath']),
    )
    .option('--container <name>', 'with --pod: the container whose named ports the spec uses')
    .option('--socket <path>', 'the agent socket (with --pod)', process.env.PROBE_AGENT_SOCKET ?? DEFAULT_SOCKET_PATH)
    .option('--pod-ip <ip>', "the pod's own IP (repeatable; default: read from inside the netns)", collect)
    .option('--container-port <name=port>', 'a named container port, for specs that use port names (repeatable)', collect)
    .addOption(new Option('--output <format>', 'output format').choices(['text', 'json']).default('text'))
    .option('-v, --verbose', 'text output: also print the response body of a success')
    .option('--from-node', "run the same probe the legacy way, from the node's netns (kubelet's path), for comparison")
    .option('--direct-spawn', 'spawn the helper per probe from Node instead of the resident helper (benchmark path)')
    .option('--kube-probe-version <major.minor>', 'version in User-Agent: kube-probe/<v>', DEFAULT_KUBE_PROBE_VERSION)
    .option('--feature-gates <gates>', 'Name=true|false,... (see `probe-agent feature-gates`)')
    .option('--legacy-host-field', 'let a host field naming another host run from the node netns (LegacyHostFieldProbes=true)')
    .option('--helper-path <path>', 'the netns helper binary')
    .action(async (opts: ProbeOptions) => {
      process.exitCode = await probeCommand(opts);
    });
}

/** Commander's collector for repeatable options (no default, so help shows none). */
export function collect(value: string, previous: string[] | undefined): string[] {
  return [...(previous ?? []), value];
}

async function probeCommand(opts: ProbeOptions): Promise<number> {
  let outcome: ProbeOutcome;
  try {
    const specText = opts.spec.startsWith('@') ? await readFile(opts.spec.slice(1), 'utf8') : opts.spec;
    const spec = parseProbeText(specText, { allowHandlerOnly: true });
    if (opts.container && !opts.pod) throw new InvalidProbeError('--container goes with --pod (give named ports with --container-port)');
    if (opts.pod) {
      outcome = await probeThroughAgent({ socket: opts.socket, pod: opts.pod, container: opts.container, spec });
    } else {
      outcome = await probeLocally(opts, spec);
    }
  } catch (err) {
    // Our own errors are written for the user; the code suffix describeError adds is for logs.
    process.stderr.write(`probe-agent probe: ${err instanceof ProbeAgentError ? err.message : describeError(err)}\n`);
    return EXIT_ERROR;
  }
  printOutcome(outcome, opts.output, opts.verbose === true);
  if (outcome.result === 'error') {
    process.stderr.write(`probe-agent probe: ${outcome.message}\n`);
    return EXIT_ERROR;
  }
  return outcome.result === 'failure' ? EXIT_FAILURE : EXIT_SUCCESS;
}

async function probeLocally(opts: ProbeOptions, spec: ReturnType<typeof parseProbeText>): Promise<ProbeOutcome> {
  if (!opts.fromNode && !opts.netns) throw new InvalidProbeError('give --netns (or --pod, or --from-node)');
  const { ctx, close } = await openLocalContext(opts, spec.timeoutSeconds, spec.handler);
  try {
    return await runProbe(spec.handler, ctx);
  } finally {
    await close();
  }
}

/** What openLocalContext reads of the command's options (`probe` and `hook` share them). */
export type LocalContextOptions = Pick<ProbeOptions, 'netns' | 'podIp' | 'containerPort' | 'fromNode' | 'directSpawn' | 'kubeProbeVersion' | 'featureGates' | 'legacyHostField' | 'helperPath'>;

/** A probe context for --netns (or --from-node): the helper, the pod IPs from inside the netns, named ports, gates. */
export async function openLocalContext(
  opts: LocalContextOptions,
  timeoutSeconds: number,
  handler: ProbeHandler,
): Promise<{ ctx: ProbeContext; close: () => Promise<void> }> {
  if (opts.fromNode && opts.netns) throw new InvalidProbeError('--from-node probes from the node: drop --netns');
  const givenIPs = opts.podIp ?? [];
  for (const ip of givenIPs) {
    if (isIP(ip) === 0) throw new InvalidProbeError(`--pod-ip: "${ip}" is not a valid IP address`);
  }
  // Checked here, so a missing netns reads the same with or without --pod-ip, before any helper or program runs.
  if (opts.netns) await checkNetnsPath(opts.netns);
  const needsPodIP = handler.kind === 'grpc' || (handler.kind !== 'exec' && !(handler.host ?? '').trim());
  if (opts.fromNode && needsPodIP && givenIPs.length === 0) throw new InvalidProbeError("--from-node needs the pod's IP: give --pod-ip");
  const gates = parseFeatureGates(
    [opts.featureGates, opts.legacyHostField ? 'LegacyHostFieldProbes=true' : undefined].filter(Boolean).join(','),
  );
  const nodeSockets = new NodeSocketFactory();
  let sockets: SocketFactory = nodeSockets;
  let close = async (): Promise<void> => {};
  let helper: ResidentHelper | undefined;
  if (!opts.fromNode) {
    if (opts.directSpawn) {
      sockets = new SpawnHelper({ helperPath: opts.helperPath });
    } else {
      const resident = await ResidentHelper.start({ helperPath: opts.helperPath });
      helper = resident;
      sockets = resident;
      close = () => resident.close();
    }
  }
  try {
    const podIPs = givenIPs.length > 0 ? givenIPs : opts.netns ? await netnsAddresses(opts.netns, helper, opts.helperPath) : [];
    if (needsPodIP && podIPs.length === 0) {
      throw new InvalidProbeError(`netns "${opts.netns}" has no global address to probe: give the pod's IP with --pod-ip`);
    }
    const ctx: ProbeContext = {
      netns: opts.fromNode ? undefined : opts.netns,
      podIPs,
      containerPorts: (opts.containerPort ?? []).map(parseNamedPort),
      timeoutSeconds,
      sockets,
      nodeSockets,
      kubeVersion: opts.kubeProbeVersion,
      hostFieldPolicy: gates.enabled('LegacyHostFieldProbes') ? 'legacy-node' : 'refuse',
      happyEyeballs: gates.enabled('HappyEyeballs'),
    };
    return { ctx, close };
  } catch (err) {
    await close();
    throw err;
  }
}

/** One line naming the path when the netns file is missing or unreadable. */
async function checkNetnsPath(netns: string): Promise<void> {
  try {
    await stat(netns);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    const why = code === 'ENOENT' ? 'does not exist' : code === 'EACCES' || code === 'EPERM' ? 'is not readable (run as root)' : `cannot be read (${code ?? describeError(err)})`;
    throw new InvalidProbeError(`--netns: "${netns}" ${why}`, { netns });
  }
}

/** The netns's own addresses, or one line saying they could not be read (never the text of the program that read them). */
async function netnsAddresses(netns: string, helper: ResidentHelper | undefined, helperPath: string | undefined): Promise<string[]> {
  try {
    return await readNetnsAddresses(netns, { helper, helperPath });
  } catch {
    throw new InvalidProbeError(`cannot read the pod's addresses inside netns "${netns}": give them with --pod-ip`, { netns });
  }
}

function parseNamedPort(text: string): { name: string; containerPort: number } {
  const m = /^([a-z0-9-]{1,15})=(\d{1,5})$/.exec(text);
  if (!m) throw new InvalidProbeError(`--container-port: want name=port, got "${text}"`);
  return { name: m[1] as string, containerPort: Number(m[2]) };
}

/** Seconds rounded to microseconds: more digits are float noise, not precision. */
function micros(seconds: number): number {
  return Math.round(seconds * 1e6) / 1e6;
}

/**
 * Prints an outcome as one JSON object, or as text: one line, where a success's message (the
 * response body) follows on its own lines only when `verbose`.
 */
export function printOutcome(outcome: ProbeOutcome, format: 'text' | 'json', verbose = false): void {
  if (format === 'json') {
    const phases = Object.fromEntries(Object.entries(outcome.phases).map(([k, v]) => [k, typeof v === 'number' ? micros(v) : v]));
    process.stdout.write(
      JSON.stringify({
        result: outcome.result,
        message: outcome.message,
        reason: outcome.reason,
        durationSeconds: micros(outcome.durationSeconds),
        phases,
        address: outcome.address,
      }) + '\n',
    );
    return;
  }
  const ms = (outcome.durationSeconds * 1000).toFixed(1);
  const via = outcome.address ? ` via ${outcome.address}` : '';
  if (outcome.result === 'success') {
    process.stdout.write(`success (${ms} ms${via})\n`);
    if (verbose && outcome.message) process.stdout.write(outcome.message.endsWith('\n') ? outcome.message : `${outcome.message}\n`);
    return;
  }
  const message = outcome.message ? `: ${outcome.message}` : '';
  process.stdout.write(`${outcome.result}${message} (${ms} ms${via})\n`);
}
