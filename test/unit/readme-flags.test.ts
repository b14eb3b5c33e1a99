/**
 * The README's flag reference must list every `probe-agent run` flag (deploy manifests and users
 * read it), and every flag must have its PROBE_AGENT_* environment twin.
 */
import { readFileSync } from 'node:fs';
import { Command } from 'commander';
import { describe, expect, it } from 'vitest';
import { registerRunCommand } from '../../agent/cli/run-command.ts';
import { registerShimCommand } from '../../agent/cli/shim-command.ts';

const readme = readFileSync(new URL('../../README.md', import.meta.url), 'utf8');

function runOptions() {
  const program = new Command();
  registerRunCommand(program);
  const run = program.commands.find((c) => c.name() === 'run');
  if (!run) throw new Error('no run command');
  return run.options;
}

describe('README flag reference', () => {
  it('lists every run flag', () => {
    const missing = runOptions().map((o) => o.long as string).filter((long) => !readme.includes(`\`${long}\``));
    expect(missing).toEqual([]);
  });

  it('gives each run flag the default the code applies, where it shows a literal', () => {
    const wrong: string[] = [];
    for (const o of runOptions()) {
      const cell = readme.split('\n').find((l) => l.startsWith(`| \`${o.long}\` |`))?.split('|')[2]?.trim();
      // A single literal (not an elision like `a,b,…`); prose cells (64 MiB, off, in-cluster) are read by people.
      const literal = /^`([^`…]+)`$/.exec(cell ?? '')?.[1];
      if (literal === undefined || o.defaultValue === undefined) continue;
      if (literal !== String(o.defaultValue)) wrong.push(`${o.long}: README ${literal}, code ${String(o.defaultValue)}`);
    }
    expect(wrong).toEqual([]);
  });

  it('lists every shim flag in the shim flag table', () => {
    const program = new Command();
    registerShimCommand(program);
    const shim = program.commands.find((c) => c.name() === 'shim');
    if (!shim) throw new Error('no shim command');
    const section = readme.slice(readme.indexOf('### `probe-agent shim`'), readme.indexOf('### `probe-agent hook`'));
    const missing = shim.options.map((o) => o.long as string).filter((long) => !section.includes(`| \`${long}\` |`));
    expect(missing).toEqual([]);
  });

  it('gives every run flag a PROBE_AGENT_* environment twin', () => {
    for (const o of runOptions()) {
      const twin = `PROBE_AGENT_${(o.long as string).slice(2).toUpperCase().replaceAll('-', '_')}`;
      expect(o.envVar, o.long).toBe(twin);
    }
  });

  it('keeps the contract flag names of the issue', () => {
    const longs = new Set(runOptions().map((o) => o.long));
    for (const name of [
      '--kubelet-url', '--kubelet-token-file', '--kubelet-ca-file', '--kubelet-insecure-tls', '--kubelet-poll-interval',
      '--node-name', '--cri-endpoint', '--netns-resolvers', '--socket', '--metrics-address', '--log-level', '--log-format',
    ]) {
      expect(longs.has(name), name).toBe(true);
    }
  });
});
