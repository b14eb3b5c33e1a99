/**
 * `probe-agent probe`: one probe, now, for people and scripts.
 * Exit status: 0 success (warning included), 1 failure, 2 the probe could not run.
 */
import { readFile } from 'node:fs/promises';
import { Command, Option } from 'commander';
import { parseProbeText } from '../probe/spec.ts';
import { runProbe } from '../probe/run.ts';
import type { ProbeContext, ProbeOutcome, SocketFactory } from '../probe/types.ts';
import { ResidentHelper } from '../netns/helper.ts';
import { SpawnHelper } from '../netns/spawn-helper.ts';
import { NodeSocketFactory } from '../netns/node-sockets.ts';
import { readNetnsAddresses } from '../netns/pod-addresses.ts';
import { parseFeatureGates } from '../featuregates.ts';
import { describeError, InvalidProbeError } from '../errors.ts';
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
  podIp: string[];
  containerPort: string[];
  output: 'text' | 'json';
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
    .option('--pod <pod>', 'probe a pod known to the running agent (namespace/name or UID), through its socket')
    .option('--container <name>', 'with --pod: the container whose named ports the spec uses')
    .option('--socket <path>', 'the agent socket (with --pod)', process.env.PROBE_AGENT_SOCKET ?? DEFAULT_SOCKET_PATH)
    .option('--pod-ip <ip>', "the pod's own IP (repeatable; default: read from inside the netns)", collect, [])
    .option('--container-port <name=port>', 'a named container port, for specs that use port names (repeatable)', collect, [])
    .addOption(new Option('--output <format>', 'output format').choices(['text', 'json']).default('text'))
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

function collect(value: string, previous: string[]): string[] {
  return [...previous, value];
}

async function probeCommand(opts: ProbeOptions): Promise<number> {
  let outcome: ProbeOutcome;
  try {
    const specText = opts.spec.startsWith('@') ? await readFile(opts.spec.slice(1), 'utf8') : opts.spec;
    const spec = parseProbeText(specText, { allowHandlerOnly: true });
    if (opts.pod) {
      outcome = await probeThroughAgent({ socket: opts.socket, pod: opts.pod, container: opts.container, spec });
    } else {
      outcome = await probeLocally(opts, spec);
    }
  } catch (err) {
    process.stderr.write(`probe-agent probe: ${describeError(err)}\n`);
    return EXIT_ERROR;
  }
  printOutcome(outcome, opts.output);
  if (outcome.result === 'error') {
    process.stderr.write(`probe-agent probe: ${outcome.message}\n`);
    return EXIT_ERROR;
  }
  return outcome.result === 'failure' ? EXIT_FAILURE : EXIT_SUCCESS;
}

async function probeLocally(opts: ProbeOptions, spec: ReturnType<typeof parseProbeText>): Promise<ProbeOutcome> {
  if (!opts.fromNode && !opts.netns) throw new InvalidProbeError('give --netns (or --pod, or --from-node)');
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
    const podIPs = opts.podIp.length > 0
      ? opts.podIp
      : opts.netns ? await readNetnsAddresses(opts.netns, { helper, helperPath: opts.helperPath }) : [];
    const ctx: ProbeContext = {
      netns: opts.fromNode ? undefined : opts.netns,
      podIPs,
      containerPorts: opts.containerPort.map(parseNamedPort),
      timeoutSeconds: spec.timeoutSeconds,
      sockets,
      nodeSockets,
      kubeVersion: opts.kubeProbeVersion,
      hostFieldPolicy: gates.enabled('LegacyHostFieldProbes') ? 'legacy-node' : 'refuse',
      happyEyeballs: gates.enabled('HappyEyeballs'),
    };
    return await runProbe(spec.handler, ctx);
  } finally {
    await close();
  }
}

function parseNamedPort(text: string): { name: string; containerPort: number } {
  const m = /^([a-z0-9-]{1,15})=(\d{1,5})$/.exec(text);
  if (!m) throw new InvalidProbeError(`--container-port: want name=port, got "${text}"`);
  return { name: m[1] as string, containerPort: Number(m[2]) };
}

/** Prints an outcome as one line of text or one JSON object. */
export function printOutcome(outcome: ProbeOutcome, format: 'text' | 'json'): void {
  if (format === 'json') {
    process.stdout.write(
      JSON.stringify({
        result: outcome.result,
        message: outcome.message,
        reason: outcome.reason,
        durationSeconds: outcome.durationSeconds,
        phases: outcome.phases,
        address: outcome.address,
      }) + '\n',
    );
    return;
  }
  const ms = (outcome.durationSeconds * 1000).toFixed(1);
  const via = outcome.address ? ` via ${outcome.address}` : '';
  const message = outcome.message ? `: ${outcome.message}` : '';
  process.stdout.write(`${outcome.result}${message} (${ms} ms${via})\n`);
}
