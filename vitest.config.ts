import { defineConfig } from 'vitest/config';

// Integration tests build real network namespaces, nftables tables and servers; each lab takes
// a unique slot, so files may run in parallel, but the machine has two cores: keep it to two.
export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    // No PROBE_AGENT_* from the caller's shell reaches a test or the agents it spawns (suite-env.ts);
    // no agent or shim a test ran through the harnesses logged an unexpected warn/error (log-check.ts).
    setupFiles: ['test/support/setup-suite-env.ts', 'test/support/setup-log-check.ts'],
    pool: 'forks',
    maxWorkers: 2,
    testTimeout: 30_000,
    hookTimeout: 90_000,
    reporters: ['default'],
  },
});
