/**
 * agent/shim/flags.ts: the one definition of the shim's flags. Both entry points (the systemd
 * unit's `node dist/shim/main.js` and `probe-agent shim`) accept the same flags with the same
 * duration syntax, and the CLI's help shows the same defaults.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { parseShimArgv, SHIM_FLAGS, shimFlagsFrom, shimUsage } from '../../agent/shim/flags.ts';
import { builtEntry } from '../support/built-cli.ts';

describe('shim flags', () => {
  it('applies the defaults when nothing is given', () => {
    expect(parseShimArgv([])).toEqual({
      listen: 'unix:///run/probe-agent-shim/cri.sock',
      runtimeEndpoint: 'unix:///run/containerd/containerd.sock',
      probeSocket: '/run/probe-agent/probe.sock',
      agentSocket: '/run/probe-agent/probe-shim.sock',
      agentGraceMs: 2000,
      hookAgentWaitMs: 60_000,
      metricsSocket: '/run/probe-agent-shim/metrics.sock',
    });
  });

  it("finds the agent's socket for the shim beside --probe-socket unless --agent-socket names it", () => {
    expect(parseShimArgv(['--probe-socket', '/var/run/pa/api.sock'])?.agentSocket).toBe('/var/run/pa/api-shim.sock');
    expect(parseShimArgv(['--probe-socket', '/x/probe', '--agent-socket', '/y/shim.sock'])).toMatchObject({ probeSocket: '/x/probe', agentSocket: '/y/shim.sock' });
  });

  it('takes Go durations such as 1m30s on every duration flag', () => {
    const f = parseShimArgv(['--agent-grace', '1m30s', '--hook-agent-wait', '1h', '--metrics-socket', '']);
    expect(f).toMatchObject({ agentGraceMs: 90_000, hookAgentWaitMs: 3_600_000, metricsSocket: '' });
    expect(shimFlagsFrom({ 'agent-grace': '1m30s' }).agentGraceMs).toBe(90_000);
  });

  it('refuses a bad duration and an unknown flag, naming them', () => {
    expect(() => parseShimArgv(['--agent-grace', 'soon'])).toThrow(/--agent-grace: invalid duration "soon"/);
    expect(() => parseShimArgv(['--hook-agent-wait', '5x'])).toThrow(/--hook-agent-wait: invalid duration "5x"/);
    expect(() => parseShimArgv(['--no-such-flag', '1'])).toThrow(/no-such-flag/);
    // The flags that did nothing are gone: a unit still naming them is told so.
    expect(() => parseShimArgv(['--relay', 'frames'])).toThrow(/'--relay'/);
    expect(() => parseShimArgv(['--hook-deadline', '2m'])).toThrow(/'--hook-deadline'/);
    expect(parseShimArgv(['--help'])).toBeUndefined();
  });

  it('lists every flag in the usage line and in `probe-agent shim --help`, with its default', () => {
    const help = execFileSync(process.execPath, [builtEntry('cli.js'), 'shim', '--help'], { encoding: 'utf8' }).replace(/\s+/g, ' ');
    const usage = shimUsage();
    for (const [name, spec] of Object.entries(SHIM_FLAGS)) {
      expect(help, name).toContain(`--${name} `);
      expect(usage, name).toContain(`--${name} `);
      if ('default' in spec) expect(help, name).toContain(`(default: "${spec.default}")`);
    }
  });

  it('both entry points take 1m30s, and refuse a bad duration with exit 2', () => {
    for (const entry of [[builtEntry('shim/main.js')], [builtEntry('cli.js'), 'shim']]) {
      // Past the flags, the endpoint is refused: the duration was accepted.
      const ok = spawnSync(process.execPath, [...entry, '--agent-grace', '1m30s', '--runtime-endpoint', 'tcp://10.0.0.1:1'], { encoding: 'utf8' });
      expect(ok.status, entry.join(' ')).toBe(2);
      expect(ok.stderr, entry.join(' ')).toMatch(/unsupported endpoint "tcp:\/\/10.0.0.1:1"/);
    }
    expect(spawnSync(process.execPath, [builtEntry('shim/main.js'), '--help'], { encoding: 'utf8' }).stdout).toBe(shimUsage());
    for (const entry of [[builtEntry('shim/main.js')], [builtEntry('cli.js'), 'shim']]) {
      const bad = spawnSync(process.execPath, [...entry, '--agent-grace', '1x'], { encoding: 'utf8' });
      expect(bad.status, entry.join(' ')).toBe(2);
      expect(bad.stderr, entry.join(' ')).toMatch(/--agent-grace: invalid duration "1x"/);
      const gone = spawnSync(process.execPath, [...entry, '--hook-deadline', '2m'], { encoding: 'utf8' });
      expect(gone.status, entry.join(' ')).toBe(2);
      expect(gone.stderr, entry.join(' ')).toMatch(/unknown option '--hook-deadline'/i);
    }
  });
});

describe("README's shim flag table", () => {
  it('lists every shim flag once, with the default the code applies', () => {
    const readme = readFileSync(fileURLToPath(new URL('../../README.md', import.meta.url)), 'utf8');
    const names = Object.keys(SHIM_FLAGS);
    // The table whose first row is the shim's --listen.
    const start = readme.indexOf('| `--listen` |');
    const rows = readme.slice(start).split('\n').filter((_, i, all) => all.slice(0, i + 1).every((l) => l.startsWith('|')));
    const documented = new Map(rows.map((r) => {
      const [, flag, def] = r.split('|').map((c) => c.trim());
      return [flag!.replace(/`/g, '').slice(2), def!] as const;
    }));
    expect([...documented.keys()].sort()).toEqual([...names].sort());
    for (const [name, spec] of Object.entries(SHIM_FLAGS)) {
      expect(documented.get(name), name).toBe('default' in spec ? `\`${spec.default}\`` : '—');
    }
  });
});
