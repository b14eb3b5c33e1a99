#!/usr/bin/env node
/** probe-agent command line: the daemon (`run`), one-shot probes, the shim client and the audit. */
import { Command } from 'commander';
import { registerProbeCommand } from './cli/probe-command.ts';
import { registerRunCommand } from './cli/run-command.ts';
import { registerStatusCommand } from './cli/status-command.ts';
import { registerWatchCommand } from './cli/watch-command.ts';
import { registerAuditCommand } from './cli/audit-command.ts';
import { registerShimCommand } from './cli/shim-command.ts';
import { registerHookCommand } from './cli/hook-command.ts';
import { registerRewriteCommand } from './cli/rewrite-command.ts';
import { registerWebhookCommand } from './cli/webhook-command.ts';
import { FEATURES, type FeatureSpec } from './featuregates.ts';
import { AGENT_NAME, AGENT_VERSION, API_VERSION } from './version.ts';

const program = new Command()
  .name(AGENT_NAME)
  .description('Runs Kubernetes TCP/HTTP/gRPC probes inside each pod network namespace (KEP-4559, outside kubelet).')
  .version(`${AGENT_NAME} ${AGENT_VERSION} (api ${API_VERSION}, node ${process.version})`, '--version')
  // One hint line, not the whole help, after a usage error: the error is what the user needs to see.
  .showHelpAfterError('(add --help for usage)')
  .enablePositionalOptions()
  // Usage errors exit 2 ("could not run"); set before the subcommands, which inherit it.
  .exitOverride((err) => {
    process.exit(err.exitCode === 0 ? 0 : 2);
  });

registerRunCommand(program);
registerProbeCommand(program);
registerStatusCommand(program);
registerWatchCommand(program);
registerAuditCommand(program);
registerShimCommand(program);
registerHookCommand(program);
registerRewriteCommand(program);
registerWebhookCommand(program);

program
  .command('feature-gates')
  .description('list the feature gates with their stage and default')
  .action(() => {
    for (const [name, spec] of Object.entries(FEATURES) as [string, FeatureSpec][]) {
      const lock = spec.lockToDefault ? ' (locked)' : '';
      process.stdout.write(`${name}=${spec.default} ${spec.stage}${lock}\n  ${spec.description}\n`);
    }
  });

await program.parseAsync(process.argv);
