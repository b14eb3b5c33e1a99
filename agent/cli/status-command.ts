/**
 * `probe-agent status`: the agent's probe statuses as a table (or JSON), through its socket.
 * Exit status: 0 listed, 2 the agent could not be asked.
 */
import { Command, Option } from 'commander';
import { ProbeApiClient } from '../api/client.ts';
import { DEFAULT_SOCKET_PATH } from '../api/proto.ts';
import { describeError, InvalidProbeError, ProbeAgentError } from '../errors.ts';
import { PROBE_TYPES, type ProbeType } from '../probe/types.ts';
import type { ProbeStatus, StatusFilter } from '../scheduler/types.ts';

/** The socket the shim commands use unless --socket says otherwise. */
export const CLIENT_DEFAULT_SOCKET = process.env.PROBE_AGENT_SOCKET ?? DEFAULT_SOCKET_PATH;

/** Options shared by status and watch. */
export interface FilterFlags {
  namespace?: string;
  podUid?: string;
  probeType?: string;
}

/** Adds --socket and the filter flags to a shim command. */
export function addClientFlags(cmd: Command): Command {
  return cmd
    .option('--socket <path>', 'the agent socket', CLIENT_DEFAULT_SOCKET)
    .option('--namespace <ns>', 'only pods in this namespace')
    .option('--pod-uid <uid>', 'only this pod')
    .option('--probe-type <type>', 'only liveness, readiness or startup probes');
}

/** Builds a StatusFilter from the filter flags. */
export function filterFromFlags(flags: FilterFlags): StatusFilter {
  const filter: StatusFilter = {};
  if (flags.namespace) filter.namespace = flags.namespace;
  if (flags.podUid) filter.podUID = flags.podUid;
  if (flags.probeType) {
    const type = PROBE_TYPES.find((t) => t.toLowerCase() === flags.probeType?.toLowerCase());
    if (!type) throw new InvalidProbeError(`--probe-type: want liveness, readiness or startup, got "${flags.probeType}"`);
    filter.probeType = type as ProbeType;
  }
  return filter;
}

/** An error for stderr: our own errors' messages are complete; others get describeError's detail. */
export function errorText(err: unknown): string {
  return err instanceof ProbeAgentError ? err.message : describeError(err);
}

/** A status as a plain JSON object (stable field names for scripts). */
export function statusJson(s: ProbeStatus): Record<string, unknown> {
  return {
    namespace: s.namespace,
    pod: s.podName,
    podUID: s.key.podUID,
    container: s.key.containerName,
    containerID: s.containerID,
    probeType: s.key.probeType,
    result: s.result,
    consecutive: s.consecutive,
    lastProbeTime: s.lastProbeTime > 0 ? new Date(s.lastProbeTime).toISOString() : null,
    lastMessage: s.lastMessage,
    lastReason: s.lastReason ?? null,
    started: s.started,
    ready: s.ready,
    onHold: s.onHold,
  };
}

/** One line of text, control characters flattened, at most `max` characters. */
export function oneLine(text: string, max: number): string {
  const flat = text.replace(/[\u0000-\u001f\u007f]+/g, ' ').trim();
  return flat.length > max ? flat.slice(0, max - 1) + '…' : flat;
}

function age(ms: number, now: number): string {
  if (ms <= 0) return '-';
  const s = Math.max(0, Math.round((now - ms) / 1000));
  if (s < 120) return `${s}s`;
  if (s < 7200) return `${Math.round(s / 60)}m`;
  return `${Math.round(s / 3600)}h`;
}

/** Renders statuses as an aligned table. */
export function statusTable(statuses: ProbeStatus[], now = Date.now()): string {
  const header = ['NAMESPACE', 'POD', 'CONTAINER', 'PROBE', 'RESULT', 'STARTED', 'READY', 'LAST', 'MESSAGE'];
  const rows = statuses.map((s) => [
    s.namespace,
    s.podName,
    s.key.containerName,
    s.key.probeType + (s.onHold ? ' (on hold)' : ''),
    s.result + (s.consecutive > 0 ? ` x${s.consecutive}` : ''),
    String(s.started),
    String(s.ready),
    age(s.lastProbeTime, now),
    oneLine(s.lastMessage, 60),
  ]);
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  return [header, ...rows].map((r) => r.map((c, i) => (i === r.length - 1 ? c : c.padEnd(widths[i] ?? 0))).join('  ').trimEnd()).join('\n') + '\n';
}

interface StatusOptions extends FilterFlags {
  socket: string;
  output: 'table' | 'json';
}

/** Adds `status` to the program. */
export function registerStatusCommand(program: Command): void {
  addClientFlags(program.command('status').description("list the running agent's probe statuses (through its socket)"))
    .addOption(new Option('--output <format>', 'output format').choices(['table', 'json']).default('table'))
    .action(async (opts: StatusOptions) => {
      process.exitCode = await statusCommand(opts);
    });
}

async function statusCommand(opts: StatusOptions): Promise<number> {
  let client: ProbeApiClient | undefined;
  try {
    const filter = filterFromFlags(opts);
    ({ client } = await ProbeApiClient.connect(opts.socket));
    const list = await client.listStatus(filter);
    if (opts.output === 'json') {
      process.stdout.write(JSON.stringify({ instanceId: list.instanceId, revision: list.revision, statuses: list.statuses.map(statusJson) }, null, 2) + '\n');
    } else if (list.statuses.length === 0) {
      process.stdout.write('no probes\n');
    } else {
      process.stdout.write(statusTable(list.statuses));
    }
    return 0;
  } catch (err) {
    process.stderr.write(`probe-agent status: ${errorText(err)}\n`);
    return 2;
  } finally {
    client?.close();
  }
}
