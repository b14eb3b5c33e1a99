#!/usr/bin/env node
/**
 * The kubelet shim's own entry point (`node dist/shim/main.js`, used by the systemd unit), and the
 * runner behind `probe-agent shim`. Both parse the flags of flags.ts; this one imports only the
 * proxy, so it is listening within tens of milliseconds of exec.
 */
import { parseShimArgv, shimUsage, type ShimFlags } from './flags.ts';
import { parseHostPort, startShimMetricsServer } from './metrics-server.ts';
import { CriShim, socketPathOf, type ShimConfig } from './proxy.ts';

/** Starts the shim, logs one ready line, and stops it on SIGTERM/SIGINT. Resolves once it is listening. */
export async function runShim(flags: ShimFlags): Promise<CriShim> {
  const config: ShimConfig = {
    listenPath: socketPathOf(flags.listen),
    runtimeSocket: socketPathOf(flags.runtimeEndpoint),
    probeSocket: socketPathOf(flags.probeSocket),
    agentSocket: socketPathOf(flags.agentSocket),
    agentGraceMs: flags.agentGraceMs,
    hookAgentWaitMs: flags.hookAgentWaitMs,
  };
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
      socketPath: flags.metricsSocket,
      ...(flags.metricsListen ? { listen: flags.metricsListen } : {}),
    });
  } catch (err) {
    await shim.close(0);
    throw err;
  }
  // Once serving, the shim holds no state: an unexpected error in one call is logged and the rest
  // go on, since exiting would cut kubelet off its runtime until systemd restarts us.
  process.on('uncaughtException', (err) => {
    process.stderr.write(`${JSON.stringify({ time: new Date().toISOString(), level: 'error', msg: 'unexpected error', error: err.stack ?? String(err) })}\n`);
  });
  process.stderr.write(`${JSON.stringify({
    time: new Date().toISOString(), level: 'info', msg: 'shim listening',
    listen: config.listenPath, runtime: config.runtimeSocket, agentSocket: config.agentSocket, probeSocket: config.probeSocket,
    metricsSocket: flags.metricsSocket, metricsListen: flags.metricsListen,
    hookAgentWaitMs: shim.config.hookAgentWaitMs,
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

/** `node dist/shim/main.js [flags]`: the same flags as `probe-agent shim` (flags.ts). */
async function main(): Promise<void> {
  const flags = parseShimArgv(process.argv.slice(2));
  if (!flags) {
    process.stdout.write(shimUsage());
    return;
  }
  await runShim(flags);
}

if (import.meta.url === `file://${process.argv[1]}` || process.argv[1]?.endsWith('/shim/main.js')) {
  main().catch((err: Error) => {
    process.stderr.write(`probe-agent shim: ${err.message}\n`);
    process.exit(2);
  });
}
