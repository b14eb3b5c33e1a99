import { defineConfig } from 'vitest/config';
import { BaseSequencer, type TestSpecification } from 'vitest/node';

/**
 * Files of a minute or more, most of it fixed-length churn: started first, longest first, so the
 * two workers never end with one of them alone on a soak. Vitest orders a fresh clone by file
 * size, which put the deployed soak last. A stale list only costs time.
 */
const LONG_FIRST = [
  'test/integration/shim-grpc-go.test.ts',
  'test/deployed/soak.test.ts',
  'test/integration/soak-short.test.ts',
  'test/integration/faults-controlplane.test.ts',
  'test/deployed/deployed.test.ts',
  'test/integration/rewrite-cli.test.ts',
  'test/integration/shim-soak-short.test.ts',
];

class LongFirstSequencer extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const rank = (f: TestSpecification): number => {
      const i = LONG_FIRST.findIndex((p) => f.moduleId.endsWith(`/${p}`));
      return i < 0 ? LONG_FIRST.length : i;
    };
    const sorted = await super.sort(files);
    return sorted.map((f, i) => ({ f, i })).sort((a, b) => rank(a.f) - rank(b.f) || a.i - b.i).map((x) => x.f);
  }
}

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
    sequence: { sequencer: LongFirstSequencer },
  },
});
