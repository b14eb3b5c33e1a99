/**
 * The suite's environment (test/support/suite-env.ts, loaded by vitest.config.ts): no PROBE_AGENT_*
 * variable of the caller's shell reaches a test or a process it spawns. `.ci/run` exports a junk
 * PROBE_AGENT_KUBELET_TOKEN_FILE so that CI runs with one, as a developer's shell may.
 */
import { execFileSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { agentVariables, stripAgentVariables, SUITE_KNOBS } from '../support/suite-env.ts';

describe('suite environment', () => {
  it('holds no PROBE_AGENT_* variable the agent reads, in the test or in a child that inherits it', () => {
    expect(agentVariables(process.env)).toEqual([]);
    const inChild = execFileSync(process.execPath, ['-p', 'JSON.stringify(Object.keys(process.env).filter((k) => k.startsWith("PROBE_AGENT_")))'], { encoding: 'utf8' });
    expect((JSON.parse(inChild) as string[]).filter((k) => !SUITE_KNOBS.has(k))).toEqual([]);
  });

  it('strips every PROBE_AGENT_* variable but the suite knobs', () => {
    const env: NodeJS.ProcessEnv = { PROBE_AGENT_KUBELET_TOKEN_FILE: '/x', PROBE_AGENT_HELPER: '/y', PROBE_AGENT_CONFORMANCE_CLI: '/z', PATH: '/bin', XPROBE_AGENT_Y: '1' };
    expect(stripAgentVariables(env).sort()).toEqual(['PROBE_AGENT_HELPER', 'PROBE_AGENT_KUBELET_TOKEN_FILE']);
    expect(env).toEqual({ PROBE_AGENT_CONFORMANCE_CLI: '/z', PATH: '/bin', XPROBE_AGENT_Y: '1' });
  });
});
