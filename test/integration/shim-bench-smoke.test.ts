/**
 * The shim part of `make bench` in quick mode (`node test/bench/shim.ts`, a few sandboxes and
 * calls), run as the real script: the result is complete and well formed, every path measured
 * positive numbers, every rewritten probe through the shim that ended within its timeout succeeded
 * and some did. Never a timing threshold: the bench itself judges performance, and a probe that ran
 * to its timeout on a loaded machine is not judged.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'nsenter', 'containerd', 'ctr', 'dpkg-deb']);

import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ShimBenchResult } from '../bench/shim.ts';

const SCRIPT = fileURLToPath(new URL('../bench/shim.ts', import.meta.url));
const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const out = mkdtempSync(join(tmpdir(), 'shim-bench-smoke-'));
let result: ShimBenchResult;
let markdown: string;

beforeAll(() => {
  spawnSync('make', ['-s', 'build'], { cwd: ROOT, stdio: 'pipe' });
  const run = spawnSync(process.execPath, [SCRIPT], {
    env: { ...process.env, BENCH_QUICK: '1', BENCH_SHIM_OUT: out, BENCH_SHIM_PODS: '3', BENCH_SHIM_PROBES: '20', BENCH_SHIM_EXECS: '5', BENCH_SHIM_CALLS: '20' },
    encoding: 'utf8',
    // A bound on a hung run only: a loaded machine (make test beside a parallel build) takes minutes.
    timeout: 900_000,
  });
  if (run.status !== 0) throw new Error(`shim bench exited ${run.status ?? run.signal}: ${run.stderr.slice(-4000)}`);
  result = JSON.parse(readFileSync(join(out, 'shim.json'), 'utf8')) as ShimBenchResult;
  markdown = run.stdout;
}, 960_000);

afterAll(() => rmSync(out, { recursive: true, force: true }));

describe('the shim bench, quick mode', () => {
  it('measured the shim path, (a) and a real exec probe with positive numbers and no probe failed before its timeout', () => {
    for (const s of [result.shimPath, result.inNetns, result.realExec]) {
      expect(s.n).toBeGreaterThan(0);
      expect(s.p50Ms).toBeGreaterThan(0);
      expect(s.p99Ms).toBeGreaterThanOrEqual(s.p50Ms);
      expect(s.cpuMsPerCall).toBeGreaterThanOrEqual(0);
    }
    expect(result.shimPath.n).toBe(20);
    expect(result.shimPath.unexpected).toBe(0);
    expect(result.shimPath.timedOut, 'every probe ran to its timeout: none was judged').toBeLessThan(result.shimPath.n);
    expect(result.shimPath.cpuMsPerCall).toBeGreaterThan(0);
    expect(result.realExec.cpuMsPerCall).toBeGreaterThan(0);
    expect(result.startupMs).toBeGreaterThan(0);
  });

  it('compared the four ordinary calls direct and through the shim, with the target table', () => {
    expect(Object.keys(result.ordinary).sort()).toEqual(['ContainerStatus', 'ListContainers', 'ListPodSandbox', 'PodSandboxStatus']);
    for (const x of Object.values(result.ordinary)) {
      expect(x.direct.p50Ms).toBeGreaterThan(0);
      expect(x.shim.p50Ms).toBeGreaterThan(0);
    }
    // CPU and p50 of the shim path, CPU and added p50 per ordinary call, the PLEG share.
    expect(result.targets.length).toBe(2 + 2 * 4 + 1);
    expect(markdown).toContain('## The kubelet shim');
  });
});
