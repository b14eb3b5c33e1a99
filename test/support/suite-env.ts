/**
 * The environment every test, and every agent or CLI process a test spawns, runs with. The agent
 * reads PROBE_AGENT_* variables (each `run` flag's twin, PROBE_AGENT_HELPER, PROBE_AGENT_SOCKET), so a
 * variable in the caller's shell (say PROBE_AGENT_KUBELET_TOKEN_FILE left from trying the agent by
 * hand) would silently change what a test runs. vitest.config.ts loads setup-suite-env.ts in every
 * worker before each test file, so process.env, and with it every child that inherits it, holds
 * none; a test that wants one sets it on the child it spawns.
 */

/** Variables that steer the suite itself rather than the agent; they stay. */
export const SUITE_KNOBS: ReadonlySet<string> = new Set(['PROBE_AGENT_CONFORMANCE_CLI']);

/** The names in `env` the agent would read: PROBE_AGENT_* other than the suite's own knobs. */
export function agentVariables(env: NodeJS.ProcessEnv): string[] {
  return Object.keys(env).filter((k) => k.startsWith('PROBE_AGENT_') && !SUITE_KNOBS.has(k));
}

/** Deletes the agent's variables from `env` (in place); returns their names. */
export function stripAgentVariables(env: NodeJS.ProcessEnv): string[] {
  const names = agentVariables(env);
  for (const name of names) delete env[name];
  return names;
}
