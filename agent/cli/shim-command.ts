/**
 * `probe-agent shim`: the kubelet CRI proxy (agent/shim/). The proxy is imported only when the
 * command runs, so the shim process never loads the agent's internals.
 */
import { Command } from 'commander';
import { parseDuration } from '../config/duration.ts';

const DEFAULTS = {
  listen: 'unix:///run/probe-agent-shim/cri.sock',
  runtimeEndpoint: 'unix:///run/containerd/containerd.sock',
  probeSocket: '/run/probe-agent/probe.sock',
};

/** Registers `shim`. */
export function registerShimCommand(program: Command): void {
  program
    .command('shim')
    .description('CRI proxy for kubelet: passes every runtime call through and answers rewritten probes and hooks from the agent')
    .option('--listen <endpoint>', 'socket kubelet connects to (its containerRuntimeEndpoint)', DEFAULTS.listen)
    .option('--runtime-endpoint <endpoint>', 'the real container runtime', DEFAULTS.runtimeEndpoint)
    .option('--probe-socket <path>', "the agent's ProbeService socket", DEFAULTS.probeSocket)
    .option('--agent-grace <duration>', 'time the agent gets beyond a probe timeout before the call is discarded', '2s')
    .option('--hook-agent-wait <duration>', 'how long a hook waits for an agent that has not started it (down, starting, draining, admission refused)', '60s')
    .option('--hook-deadline <duration>', 'deprecated, no effect: hooks run until they finish or kubelet cancels them (the agent caps one at 1 h)')
    .option('--relay <mode>', "how kubelet's connections reach the runtime: frames (HTTP/2 frames relayed) or streams (node:http2 streams; the fallback)", 'frames')
    .option('--metrics-socket <path>', "unix socket serving the shim's counters at GET /metrics ('' = none)", '/run/probe-agent-shim/metrics.sock')
    .option('--metrics-listen <host:port>', "also serve the shim's counters over TCP (e.g. 127.0.0.1:9810)")
    .action(async (o: { listen: string; runtimeEndpoint: string; probeSocket: string; agentGrace: string; hookDeadline?: string; hookAgentWait: string; relay: string; metricsSocket: string; metricsListen?: string }) => {
      try {
        const flags = {
          listen: o.listen,
          runtimeEndpoint: o.runtimeEndpoint,
          probeSocket: o.probeSocket,
          agentGraceMs: parseDuration(o.agentGrace, '--agent-grace'),
          hookAgentWaitMs: parseDuration(o.hookAgentWait, '--hook-agent-wait'),
          metricsSocket: o.metricsSocket,
          relay: o.relay,
          ...(o.hookDeadline !== undefined ? { hookDeadlineMs: parseDuration(o.hookDeadline, '--hook-deadline') } : {}),
          ...(o.metricsListen !== undefined ? { metricsListen: o.metricsListen } : {}),
        };
        const { runShim } = await import('../shim/main.ts');
        await runShim(flags);
      } catch (err) {
        // Could not start (bad flag, socket in use or not creatable): say why, exit 2 like every command that could not run.
        process.stderr.write(`probe-agent shim: ${(err as Error).message}\n`);
        process.exit(2);
      }
    });
}
