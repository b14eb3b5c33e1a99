/**
 * `probe-agent hook`: one HTTP lifecycle hook (postStart/preStop), now, inside a network namespace,
 * with kubelet's lifecycle semantics (agent/probe/lifecycle.ts), for people and scripts.
 * Exit status as `probe`: 0 the hook succeeded, 1 kubelet would count it as failed, 2 it could not run.
 */
import { readFile } from 'node:fs/promises';
import { Command, Option } from 'commander';
import { describeError, InvalidProbeError } from '../errors.ts';
import { runLifecycleHandler, type HookOutcome, type LifecycleHook } from '../probe/lifecycle.ts';
import { parseProbeText } from '../probe/spec.ts';
import { DEFAULT_KUBE_PROBE_VERSION } from '../version.ts';
import { parseDuration } from './duration.ts';
import { collect, EXIT_ERROR, EXIT_FAILURE, EXIT_SUCCESS, openLocalContext, type LocalContextOptions } from './probe-command.ts';

interface HookOptions extends LocalContextOptions {
  spec: string;
  hook: LifecycleHook;
  timeout: string;
  output: 'text' | 'json';
}

/** Adds `hook` to the program. */
export function registerHookCommand(program: Command): void {
  program
    .command('hook')
    .description("run one HTTP lifecycle hook now, inside a network namespace, as kubelet runs postStart/preStop hooks")
    .requiredOption('--spec <handler>', 'a Kubernetes LifecycleHandler ({httpGet: ...} or {tcpSocket: ...}), JSON or YAML, inline or @file')
    .requiredOption('--netns <path>', 'network namespace to run the hook inside: /proc/PID/ns/net or /run/netns/NAME')
    .addOption(new Option('--hook <hook>', 'which hook (only wording differs: kubelet treats both alike)').choices(['postStart', 'preStop']).default('postStart'))
    .option('--timeout <duration>', 'time allowed for the hook (kubelet has none of its own; 0 = the agent cap of 1h)', '0')
    .option('--pod-ip <ip>', "the pod's own IP (repeatable; default: read from inside the netns)", collect, [])
    .option('--container-port <name=port>', 'a named container port, for handlers that use port names (repeatable)', collect, [])
    .addOption(new Option('--output <format>', 'output format').choices(['text', 'json']).default('text'))
    .option('--kube-probe-version <major.minor>', 'version in User-Agent: kube-lifecycle/<v>', DEFAULT_KUBE_PROBE_VERSION)
    .option('--feature-gates <gates>', 'Name=true|false,... (see `probe-agent feature-gates`)')
    .option('--legacy-host-field', 'let a host field naming another host run from the node netns (LegacyHostFieldProbes=true)')
    .option('--helper-path <path>', 'the netns helper binary')
    .action(async (opts: HookOptions) => {
      process.exitCode = await hookCommand(opts);
    });
}

async function hookCommand(opts: HookOptions): Promise<number> {
  let outcome: HookOutcome;
  try {
    const specText = opts.spec.startsWith('@') ? await readFile(opts.spec.slice(1), 'utf8') : opts.spec;
    const { handler } = parseProbeText(specText, { allowHandlerOnly: true });
    if (handler.kind !== 'http' && handler.kind !== 'tcp') {
      throw new InvalidProbeError(`--spec: a lifecycle hook here is httpGet or tcpSocket, got ${handler.kind} (kubelet runs exec and sleep hooks itself)`);
    }
    const timeoutSeconds = opts.timeout === '0' ? 0 : parseDuration(opts.timeout, '--timeout') / 1000;
    const { ctx, close } = await openLocalContext(opts, timeoutSeconds);
    try {
      outcome = await runLifecycleHandler(handler, { ...ctx, hook: opts.hook });
    } finally {
      await close();
    }
  } catch (err) {
    process.stderr.write(`probe-agent hook: ${describeError(err)}\n`);
    return EXIT_ERROR;
  }
  printHookOutcome(outcome, opts.hook, opts.output);
  if (outcome.result === 'error') {
    process.stderr.write(`probe-agent hook: ${outcome.message}\n`);
    return EXIT_ERROR;
  }
  return outcome.result === 'failure' ? EXIT_FAILURE : EXIT_SUCCESS;
}

function printHookOutcome(o: HookOutcome, hook: LifecycleHook, format: 'text' | 'json'): void {
  if (format === 'json') {
    process.stdout.write(JSON.stringify({
      hook, result: o.result, message: o.message, reason: o.reason, status: o.status,
      fellBackToHttp: o.fellBackToHttp, durationSeconds: o.durationSeconds, phases: o.phases, address: o.address,
    }) + '\n');
    return;
  }
  const ms = (o.durationSeconds * 1000).toFixed(1);
  const via = o.address ? ` via ${o.address}` : '';
  const status = o.status !== undefined ? ` (HTTP ${o.status})` : '';
  const message = o.message ? `: ${o.message}` : '';
  process.stdout.write(`${hook} ${o.result}${status}${message} (${ms} ms${via})\n`);
}
