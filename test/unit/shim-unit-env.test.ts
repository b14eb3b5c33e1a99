/**
 * The shim's systemd unit sets glibc's allocator for it (issue 31: under kubelet's churn glibc, not
 * the V8 heap, held the shim's growing memory), and the harnesses that measure the shim's memory
 * start it with the unit's environment, read from the unit itself.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { AGENT_DAEMONSET, agentDaemonSetEnv, SHIM_UNIT, shimUnitEnv, shimUnitNodeFlags } from '../soak/shim-soak.ts';

const scratch = mkdtempSync(path.join(tmpdir(), 'probe-agent-unit-env-'));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

function unit(body: string): string {
  const p = path.join(scratch, `u${Math.random().toString(36).slice(2)}.service`);
  writeFileSync(p, `[Service]\n${body}\nExecStart=/opt/x/node --max-old-space-size=128 /opt/x/dist/shim/main.js --listen unix:///run/x.sock\n`);
  return p;
}

describe('the shim unit environment', () => {
  it('gives the shipped shim one malloc arena and a fixed mmap threshold', () => {
    const env = shimUnitEnv(SHIM_UNIT);
    expect(env['MALLOC_ARENA_MAX']).toBe('1');
    expect(env['MALLOC_MMAP_THRESHOLD_']).toBe('131072');
    // The node flags are still read from the same unit.
    expect(shimUnitNodeFlags(SHIM_UNIT)).toContain('--max-old-space-size=128');
  });

  it('gives the shipped agent the same allocator settings and its heap cap, read from the DaemonSet', () => {
    const env = agentDaemonSetEnv(AGENT_DAEMONSET);
    expect(env).toEqual({ NODE_OPTIONS: '--max-old-space-size=96', MALLOC_ARENA_MAX: '1', MALLOC_MMAP_THRESHOLD_: '131072' });
    const bare = path.join(scratch, 'ds.yaml');
    writeFileSync(bare, 'env:\n  - name: OTHER\n    value: x\n');
    expect(() => agentDaemonSetEnv(bare)).toThrow(/no NODE_OPTIONS/);
  });

  it('reads every Environment= line and every assignment on it', () => {
    expect(shimUnitEnv(unit('Environment=A=1 B=two\nEnvironment=C=3'))).toEqual({ A: '1', B: 'two', C: '3' });
    expect(shimUnitEnv(unit(''))).toEqual({});
    // A later assignment wins, as in systemd.
    expect(shimUnitEnv(unit('Environment=A=1\nEnvironment=A=2'))).toEqual({ A: '2' });
  });

  it('refuses what it would read differently from systemd (quotes, specifiers, no name)', () => {
    expect(() => shimUnitEnv(unit('Environment="A=1 2"'))).toThrow(/not a plain NAME=value/);
    expect(() => shimUnitEnv(unit('Environment=A=%h'))).toThrow(/not a plain NAME=value/);
    expect(() => shimUnitEnv(unit('Environment==1'))).toThrow(/not a plain NAME=value/);
  });
});
