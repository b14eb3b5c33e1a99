/**
 * The shim's flags, defined once for both entry points: `node dist/shim/main.js` (the systemd unit)
 * and `probe-agent shim`. A leaf: the CLI reads it to register the command without loading the proxy.
 */
import { parseArgs } from 'node:util';
import { parseDuration } from '../config/duration.ts';
import { shimSocketBeside } from '../contract/shim-socket.ts';

/** Where the shim's own sockets live (root-only directory). */
export const SHIM_RUN_DIR = '/run/probe-agent-shim';

/** One flag: its default, its help, and whether it is a duration (parsed by config/duration.ts). */
interface FlagSpec {
  readonly help: string;
  readonly default?: string;
  readonly duration?: boolean;
}

/** Every flag, in help order. The paths are those of docs/closing-the-hole.md. */
export const SHIM_FLAGS = {
  listen: { help: 'socket kubelet connects to (its containerRuntimeEndpoint)', default: `unix://${SHIM_RUN_DIR}/cri.sock` },
  'runtime-endpoint': { help: 'the real container runtime', default: 'unix:///run/containerd/containerd.sock' },
  'probe-socket': { help: "the agent's ProbeService socket: the shim's own socket is found beside it, and an agent without one is reached here", default: '/run/probe-agent/probe.sock' },
  'agent-socket': { help: "the agent's socket for the shim, ExecSync only (default: --probe-socket's path ending -shim.sock instead of .sock)" },
  'agent-grace': { help: 'time the agent gets beyond a probe timeout before the call is discarded', default: '2s', duration: true },
  'hook-agent-wait': { help: 'how long a hook waits for an agent that has not started it (down, starting, draining, admission refused)', default: '60s', duration: true },
  'metrics-socket': { help: "unix socket serving the shim's counters at GET /metrics ('' = none)", default: `${SHIM_RUN_DIR}/metrics.sock` },
  'metrics-listen': { help: "also serve the shim's counters over TCP (e.g. 127.0.0.1:9810)" },
} as const satisfies Record<string, FlagSpec>;

export type ShimFlagName = keyof typeof SHIM_FLAGS;

/** The shim's flags, parsed. */
export interface ShimFlags {
  listen: string;
  runtimeEndpoint: string;
  probeSocket: string;
  /** The agent's socket for the shim; when nothing listens there, calls go to probeSocket. */
  agentSocket: string;
  agentGraceMs: number;
  hookAgentWaitMs: number;
  /** Unix socket for GET /metrics ('' = none). */
  metricsSocket: string;
  /** Optional HOST:PORT for GET /metrics over TCP. */
  metricsListen?: string;
}

/** Turns flag values by name (unset ones absent) into ShimFlags, with the defaults; throws on a bad duration. */
export function shimFlagsFrom(values: Partial<Record<ShimFlagName, string>>): ShimFlags {
  const text = (name: ShimFlagName): string | undefined => values[name] ?? (SHIM_FLAGS[name] as FlagSpec).default;
  const ms = (name: ShimFlagName): number | undefined => {
    const t = text(name);
    return t === undefined ? undefined : parseDuration(t, `--${name}`);
  };
  const flags: ShimFlags = {
    listen: text('listen')!,
    runtimeEndpoint: text('runtime-endpoint')!,
    probeSocket: text('probe-socket')!,
    agentSocket: text('agent-socket') || shimSocketBeside(text('probe-socket')!),
    agentGraceMs: ms('agent-grace')!,
    hookAgentWaitMs: ms('hook-agent-wait')!,
    metricsSocket: text('metrics-socket')!,
  };
  const metricsListen = text('metrics-listen');
  if (metricsListen !== undefined) flags.metricsListen = metricsListen;
  return flags;
}

/** The usage line of `node dist/shim/main.js --help`. */
export function shimUsage(): string {
  const parts = Object.entries(SHIM_FLAGS).map(([name, spec]: [string, FlagSpec]) =>
    `[--${name} ${spec.default !== undefined && spec.default !== '' ? spec.default : 'VALUE'}]`);
  return `usage: probe-agent-shim ${parts.join(' ')}\n`;
}

/** Parses argv (without node and the script) as `node dist/shim/main.js` does; undefined for --help. */
export function parseShimArgv(argv: string[]): ShimFlags | undefined {
  const options: Record<string, { type: 'string' } | { type: 'boolean' }> = { help: { type: 'boolean' } };
  for (const name of Object.keys(SHIM_FLAGS)) options[name] = { type: 'string' };
  const { values } = parseArgs({ args: argv, options, strict: true, allowPositionals: false });
  if (values['help'] === true) return undefined;
  return shimFlagsFrom(values as Partial<Record<ShimFlagName, string>>);
}
