/**
 * `probe-agent audit`: would switching this node from kubelet's probes to in-netns probes break
 * anything? Same kubelet and netns flags as `run`. Exit status (a contract for scripts):
 * 0 safe to switch, 1 something would break or is unsafe, 2 the audit could not run (fully).
 */
import { Command, Option } from 'commander';
import { AuditSetupError, runAudit } from '../audit/wiring.ts';
import { DEFAULT_AUDIT_CONCURRENCY, MAX_AUDIT_CONCURRENCY, messageOf } from '../audit/audit.ts';
import { EXIT_CANNOT_AUDIT, renderJson, renderTable, type AuditExitCode } from '../audit/report.ts';
import { ConfigError } from '../errors.ts';
import { createLogger } from '../log.ts';
import { parseRunConfig, type RawFlags } from '../config/run-config.ts';
import { addKubeletAndNetnsFlags } from './run-command.ts';

/** Adds `audit` to the program. */
export function registerAuditCommand(program: Command): void {
  const cmd = program
    .command('audit')
    .description('run every network probe on this node from the node and inside the pod netns, and report what switching would change');
  addKubeletAndNetnsFlags(cmd)
    .addOption(new Option('--output <format>', 'text (a table) or json').choices(['text', 'json']).default('text'))
    .addOption(new Option('--concurrency <n>', `probes audited at once (1..${MAX_AUDIT_CONCURRENCY})`).default(String(DEFAULT_AUDIT_CONCURRENCY)))
    .action(async (raw: RawFlags, self: Command) => {
      process.exitCode = await auditCommand(raw, self);
    });
}

async function auditCommand(raw: RawFlags, self: Command): Promise<AuditExitCode> {
  try {
    const config = parseRunConfig(raw, process.env);
    const concurrency = Number(raw.concurrency);
    if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > MAX_AUDIT_CONCURRENCY) {
      throw new ConfigError(`--concurrency: want an integer 1..${MAX_AUDIT_CONCURRENCY}, got "${String(raw.concurrency)}"`);
    }
    // A one-shot command's stderr is for problems: lifecycle info (helper started...) only when asked for.
    const asked = self.getOptionValueSource('logLevel') !== 'default' || raw.verbosity !== undefined;
    const log = createLogger({ level: asked ? config.logLevel : 'warn', format: config.logFormat });
    const report = await runAudit(config, { concurrency, log });
    process.stdout.write(raw.output === 'json' ? renderJson(report) : renderTable(report));
    return report.summary.exitCode;
  } catch (err) {
    const what = err instanceof AuditSetupError ? '' : err instanceof ConfigError ? 'bad configuration: ' : 'cannot run: ';
    process.stderr.write(`probe-agent audit: ${what}${messageOf(err)}\n`);
    return EXIT_CANNOT_AUDIT;
  }
}
