#!/usr/bin/env node
/**
 * The kubelet shim's own entry point (`node dist/shim/main.js`, used by the systemd unit), and the
 * runner behind `probe-agent shim`. It parses its flags with node:util and imports only the proxy,
 * so it is listening within tens of milliseconds of exec.
 */
import { parseArgs } from 'node:util';
import { parseHostPort, startShimMetricsServer, DEFAULT_SHIM_METRICS_SOCKET } from './metrics-server.ts';
import { CriShim, RELAY_MODES, socketPathOf, type RelayMode, type ShimConfig } from './proxy.ts';

/** Flag defaults: the paths of docs/closing-the-hole.md. */
export const SHIM_DEFAULTS = {
  listen: 'unix:///run/probe-agent-shim/cri.sock',
  runtimeEndpoint: 'unix:///run/containerd/containerd.sock',
  probeSocket: '/run/probe-agent/probe.sock',
  metricsSocket: DEFAULT_SHIM_METRICS_SOCKET,
};

/** The shim's flags, as the CLI passes them. */
export interface ShimFlags {
  listen: string;
  runtimeEndpoint: string;
  probeSocket: string;
  agentGraceMs?: number;
  hookDeadlineMs?: number;
  hookAgentWaitMs?: number;
  /** 'frames' (default) or 'streams' (the node:http2 fallback). */
  relay?: string;
  /** Unix socket for GET /metrics ('' = none); default /run/probe-agent-shim/metrics.sock. */
  metricsSocket?: string;
  /** Optional HOST:PORT for GET /metrics over TCP. */
  metricsListen?: string;
}

/** Starts the shim, logs one ready line, and stops it on SIGTERM/SIGINT. Resolves once it is listening. */
export async function runShim(flags: ShimFlags): Promise<CriShim> {
  const config: ShimConfig = {
    listenPath: socketPathOf(flags.listen),
    runtimeSocket: socketPathOf(flags.runtimeEndpoint),
    probeSocket: socketPathOf(flags.probeSocket),
  };
  if (flags.agentGraceMs !== undefined) config.agentGraceMs = flags.agentGraceMs;
  if (flags.hookDeadlineMs !== undefined) config.hookDeadlineMs = flags.hookDeadlineMs;
  if (flags.hookAgentWaitMs !== undefined) config.hookAgentWaitMs = flags.hookAgentWaitMs;
  if (flags.relay !== undefined) {
    if (!(RELAY_MODES as readonly string[]).includes(flags.relay)) throw new Error(`--relay: invalid mode "${flags.relay}" (want ${RELAY_MODES.join(' or ')})`);
    config.relay = flags.relay as RelayMode;
  }
  // Flags first: a bad --metrics-listen must not leave kubelet's socket taken.
  if (flags.metricsListen) parseHostPort(flags.metricsListen);
  const shim = new CriShim(config);
  // The CRI socket first: it refuses to start when another shim is live, whose metrics socket
  // must then stay. A metrics socket that cannot be created is a startup error (exit 2).
  await shim.listen();
  let metricsServer: Awaited<ReturnType<typeof startShimMetricsServer>>;
  try {
    metricsServer = await startShimMetricsServer({
      metrics: shim.metrics,
      socketPath: flags.metricsSocket ?? SHIM_DEFAULTS.metricsSocket,
      ...(flags.metricsListen ? { listen: flags.metricsListen } : {}),
    });
  } catch (err) {
    await shim.close(0);
    throw err;
  }
  if (flags.hookDeadlineMs !== undefined) {
    process.stderr.write(`${JSON.stringify({ time: new Date().toISOString(), level: 'warn', msg: '--hook-deadline is deprecated and has no effect: hooks run until they finish or kubelet cancels them (the agent caps one at 1 h)' })}\n`);
  }
  // Once serving, the shim holds no state: an unexpected error in one call is logged and the rest
  // go on, since exiting would cut kubelet off its runtime until systemd restarts us.
  process.on('uncaughtException', (err) => {
    process.stderr.write(`${JSON.stringify({ time: new Date().toISOString(), level: 'error', msg: 'unexpected error', error: err.stack ?? String(err) })}\n`);
  });
  process.stderr.write(`${JSON.stringify({
    time: new Date().toISOString(), level: 'info', msg: 'shim listening',
    listen: config.listenPath, runtime: config.runtimeSocket, probeSocket: config.probeSocket,
    metricsSocket: flags.metricsSocket ?? SHIM_DEFAULTS.metricsSocket, metricsListen: flags.metricsListen,
    hookAgentWaitMs: shim.config.hookAgentWaitMs, relay: shim.config.relay,
    startupMs: Math.round(performance.now()),
  })}\n`);
  const stop = (sig: NodeJS.Signals): void => {
    process.stderr.write(`${JSON.stringify({ time: new Date().toISOString(), level: 'info', msg: 'shim stopping', signal: sig })}\n`);
    void Promise.all([shim.close(), metricsServer.close()]).then(() => process.exit(0));
  };
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
  return shim;
}

function ms(text: string | undefined, flag: string): number | undefined {
  if (text === undefined) return undefined;
  const m = /^(\d+(?:\.\d+)?)(ms|s|m)?$/.exec(text.trim());
  if (!m) throw new Error(`${flag}: invalid duration "${text}" (want e.g. 500ms, 5s, 1m)`);
  const unit = m[2] ?? 's';
  return Math.round(Number(m[1]) * (unit === 'ms' ? 1 : unit === 's' ? 1000 : 60_000));
}

/** `node dist/shim/main.js [flags]`: the same flags as `probe-agent shim`. */
async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      listen: { type: 'string', default: SHIM_DEFAULTS.listen },
      'runtime-endpoint': { type: 'string', default: SHIM_DEFAULTS.runtimeEndpoint },
      'probe-socket': { type: 'string', default: SHIM_DEFAULTS.probeSocket },
      'agent-grace': { type: 'string' },
      'hook-deadline': { type: 'string' },
      'hook-agent-wait': { type: 'string' },
      relay: { type: 'string' },
      'metrics-socket': { type: 'string', default: SHIM_DEFAULTS.metricsSocket },
      'metrics-listen': { type: 'string' },
      help: { type: 'boolean', default: false },
    },
    strict: true,
  });
  if (values.help) {
    process.stdout.write('usage: probe-agent-shim [--listen unix:///run/probe-agent-shim/cri.sock] [--runtime-endpoint unix:///run/containerd/containerd.sock] [--probe-socket /run/probe-agent/probe.sock] [--agent-grace 2s] [--hook-agent-wait 60s] [--relay frames|streams] [--metrics-socket /run/probe-agent-shim/metrics.sock] [--metrics-listen HOST:PORT] [--hook-deadline (deprecated, no effect)]\n');
    return;
  }
  const flags: ShimFlags = { listen: values.listen, runtimeEndpoint: values['runtime-endpoint'], probeSocket: values['probe-socket'], metricsSocket: values['metrics-socket'] };
  if (values['metrics-listen'] !== undefined) flags.metricsListen = values['metrics-listen'];
  if (values.relay !== undefined) flags.relay = values.relay;
  const grace = ms(values['agent-grace'], '--agent-grace');
  const hook = ms(values['hook-deadline'], '--hook-deadline');
  const wait = ms(values['hook-agent-wait'], '--hook-agent-wait');
  if (grace !== undefined) flags.agentGraceMs = grace;
  if (hook !== undefined) flags.hookDeadlineMs = hook;
  if (wait !== undefined) flags.hookAgentWaitMs = wait;
  await runShim(flags);
}

if (import.meta.url === `file://${process.argv[1]}` || process.argv[1]?.endsWith('/shim/main.js')) {
  main().catch((err: Error) => {
    process.stderr.write(`probe-agent shim: ${err.message}\n`);
    process.exit(2);
  });
}
