/**
 * `make bench` in its quick mode (BENCH_QUICK=1: 2 pods, a few probes, one small scale point),
 * run as the real script into a temp dir. Asserts only that the result is complete and well formed:
 * every path and mix entry has positive numbers, every path ran every probe and had probes judged,
 * the scale point and the target table exist. Never a timing threshold: performance is judged by
 * the bench itself, and a probe that ran to its own timeout (a loaded machine) is not judged; one
 * that ended in time with an error or a wrong verdict is a broken path.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'prometheus-blackbox-exporter']);

import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PATHS } from '../bench/driver.ts';
import { KINDS, VARIANT_NAMES } from '../bench/mix.ts';
import type { BenchResult } from '../bench/report.ts';

const BENCH = fileURLToPath(new URL('../bench/bench.ts', import.meta.url));
const out = mkdtempSync(join(tmpdir(), 'bench-smoke-'));
let result: BenchResult;
let markdown: string;
let benchPid = 0;

beforeAll(() => {
  const run = spawnSync(process.execPath, [BENCH], {
    // The shim part has its own smoke test (shim-bench-smoke.test.ts).
    env: { ...process.env, BENCH_QUICK: '1', BENCH_OUT: out, BENCH_SHIM: '0' },
    encoding: 'utf8',
    // A bound on a hung run only: a loaded machine (make test beside a parallel build) takes minutes.
    timeout: 900_000,
  });
  benchPid = run.pid;
  if (run.status !== 0) throw new Error(`bench exited ${run.status ?? run.signal}: ${run.stderr.slice(-4000)}`);
  result = JSON.parse(readFileSync(join(out, 'latest.json'), 'utf8')) as BenchResult;
  markdown = readFileSync(join(out, 'bench-latest.md'), 'utf8');
  expect(run.stdout).toBe(markdown);
}, 960_000);

afterAll(() => rmSync(out, { recursive: true, force: true }));

describe('make bench, quick mode', () => {
  it('measured every mix entry on every path with positive numbers and no probe that could not run', () => {
    for (const path of PATHS) {
      const p = result.sideBySide.paths[path];
      for (const name of VARIANT_NAMES) {
        const v = p.variants[name];
        expect(v.cpuMsPerProbe, `${path} ${name} cpu`).toBeGreaterThan(0);
        expect(v.probesPerSecond, `${path} ${name} rate`).toBeGreaterThan(0);
        expect(v.p50Ms, `${path} ${name} p50`).toBeGreaterThan(0);
        expect(v.p99Ms, `${path} ${name} p99`).toBeGreaterThanOrEqual(v.p50Ms);
        // Every probe ran, and some ended within their timeout, so the path's verdicts were checked.
        expect(v.probes, `${path} ${name} probes`).toBe(result.config.probes * result.config.rounds);
        expect(v.timedOut, `${path} ${name} all ran to their timeout`).toBeLessThan(v.probes);
        // A broken path cannot pass for a cheap one: nothing ended in time in 'error', most judged probes gave the expected result.
        expect(v.errorsInTime, `${path} ${name} errors before the timeout`).toBe(0);
        expect(v.unexpectedInTime, `${path} ${name} unexpected before the timeout`).toBeLessThan((v.probes - v.timedOut) / 2);
      }
      for (const kind of KINDS) expect(p.kinds[kind].cpuMsPerProbe, `${path} ${kind}`).toBeGreaterThan(0);
      expect(p.peakRssMB, `${path} rss`).toBeGreaterThan(0);
      expect(p.probesPerSecond, `${path} whole-mix rate`).toBeGreaterThan(0);
      if (path === 'blackbox') expect(p.loopP99Ms).toBeNull();
      else expect(p.loopP99Ms).toBeGreaterThanOrEqual(0);
    }
  });

  it('compared latency at a fixed rate for the in-netns paths and the direct one', () => {
    for (const path of ['resident', 'warm', 'node'] as const) {
      const paced = result.sideBySide.paths[path].paced;
      expect(paced, path).toBeDefined();
      expect(paced!.achievedRate).toBeGreaterThan(0);
      expect(paced!.p99Ms).toBeGreaterThan(0);
      expect(paced!.cpuMsPerProbe).toBeGreaterThan(0);
    }
    expect(result.sideBySide.paths.spawn.paced).toBeUndefined();
  });

  it('ran the real daemon for the scale point and measured it from /proc and /metrics', () => {
    const scale = result.scale!;
    // The idle point (0 pods) comes first, then pods × periods.
    expect(scale.points).toHaveLength(1 + result.config.scalePods.length * result.config.scalePeriods.length);
    const [idle, ...loaded] = scale.points;
    expect(idle!.pods).toBe(0);
    expect(idle!.probesPerSecond).toBe(0);
    expect(idle!.rssMB).toBeGreaterThan(0);
    expect(idle!.exitCode).toBe(0);
    for (const pt of loaded) {
      expect(pt.cpuPercent).toBeGreaterThan(0);
      expect(pt.probesPerSecond).toBeGreaterThan(0);
      expect(pt.rssMB).toBeGreaterThan(0);
      expect(pt.peakRssMB).toBeGreaterThanOrEqual(pt.rssMB);
      expect(pt.loopP99RawMs).toBeGreaterThan(0);
      expect(pt.exitCode).toBe(0);
    }
    expect(scale.resolverCost.map((c) => c.resolver).sort()).toEqual(['address', 'procfs']);
    for (const c of scale.resolverCost) expect(c.cpuMsPerRefresh).toBeGreaterThan(0);
    for (const pt of loaded) expect(pt.resolverCpuPercent).toBeGreaterThan(0);
  });

  it('wrote the target table and the markdown, and cleaned up after itself', () => {
    expect(result.targets.length).toBeGreaterThan(10);
    for (const t of result.targets) {
      expect(t.limit, t.target).toMatch(/\S/);
      // A target that was not measured cannot be judged; one that was is judged.
      if (t.measured === 'not run') expect(t.pass, t.target).toBeNull();
    }
    expect(result.targets.filter((t) => typeof t.pass === 'boolean').length).toBeGreaterThan(5);
    for (const heading of ['## Side by side', '## Scale curve', '## Targets']) expect(markdown).toContain(heading);
    for (const letter of ['(a)', '(b)', '(c)', '(d)', '(e)']) expect(markdown).toContain(letter);
    // The sandbox cgroups (procfs resolver) are gone with the run, whichever hierarchy it used.
    expect(benchPid).toBeGreaterThan(0);
    for (const root of ['/sys/fs/cgroup/pids', '/sys/fs/cgroup/unified', '/sys/fs/cgroup']) {
      expect(existsSync(join(root, `probe-agent-bench-${benchPid}`)), root).toBe(false);
    }
  });
});
