/**
 * `probe-agent shim`: the kubelet CRI proxy (agent/shim/). The proxy is imported only when the
 * command runs, so the shim process never loads the agent's internals.
 */
import { Command } from 'commander';
import { SHIM_FLAGS, shimFlagsFrom, type ShimFlagName } from '../shim/flags.ts';

/** Commander's camelCase name of a flag. */
const camel = (name: string): string => name.replace(/-([a-z])/g, (_, c: string) => c.toUpperCase());

/** Registers `shim`, with the flags of agent/shim/flags.ts (the systemd unit's entry point parses the same). */
export function registerShimCommand(program: Command): void {
  const cmd = program
    .command('shim')
    .description('CRI proxy for kubelet: passes every runtime call through and answers rewritten probes and hooks from the agent');
  // No commander defaults: shimFlagsFrom applies them, as for the other entry point.
  for (const [name, spec] of Object.entries(SHIM_FLAGS)) {
    const help = 'default' in spec ? `${spec.help} (default: "${spec.default}")` : spec.help;
    cmd.option(`--${name} <${'duration' in spec ? 'duration' : 'value'}>`, help);
  }
  cmd.action(async (o: Record<string, string | undefined>) => {
    try {
      const values: Partial<Record<ShimFlagName, string>> = {};
      for (const name of Object.keys(SHIM_FLAGS) as ShimFlagName[]) {
        const v = o[camel(name)];
        if (v !== undefined) values[name] = v;
      }
      const flags = shimFlagsFrom(values);
      const { runShim } = await import('../shim/main.ts');
      await runShim(flags);
    } catch (err) {
      // Could not start (bad flag, socket in use or not creatable): say why, exit 2 like every command that could not run.
      process.stderr.write(`probe-agent shim: ${(err as Error).message}\n`);
      process.exit(2);
    }
  });
}
