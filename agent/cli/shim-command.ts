/**
 * `probe-agent shim`: the kubelet CRI proxy (agent/shim/). The proxy is imported only when the
 * command runs, so the shim process never loads the agent's internals.
 */
import { Command, Option } from 'commander';
import { SHIM_FLAGS, shimFlagsFrom, type ShimFlagName } from '../shim/flags.ts';

/** Registers `shim`, with the flags of agent/shim/flags.ts (the systemd unit's entry point parses the same). */
export function registerShimCommand(program: Command): void {
  const cmd = program
    .command('shim')
    .description('CRI proxy for kubelet: passes every runtime call through and answers rewritten probes and hooks from the agent');
  // No commander defaults: shimFlagsFrom applies them, as for the other entry point.
  const options = (Object.entries(SHIM_FLAGS) as [ShimFlagName, (typeof SHIM_FLAGS)[ShimFlagName]][]).map(([name, spec]) => {
    const help = 'default' in spec ? `${spec.help} (default: "${spec.default}")` : spec.help;
    const option = new Option(`--${name} <${'duration' in spec ? 'duration' : 'value'}>`, help);
    cmd.addOption(option);
    return [name, option] as const;
  });
  cmd.action(async (o: Record<string, string | undefined>) => {
    try {
      const values: Partial<Record<ShimFlagName, string>> = {};
      for (const [name, option] of options) {
        const v = o[option.attributeName()];
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
