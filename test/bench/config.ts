/**
 * The bench's knobs, from the environment (all optional). BENCH_QUICK=1 is the smoke variant:
 * tiny numbers, results in a temp dir unless BENCH_OUT says otherwise.
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { REPO } from './build.ts';

/** Everything bench.ts needs to know. */
export interface BenchConfig {
  quick: boolean;
  pods: number;
  probes: number;
  warmup: number;
  rounds: number;
  concurrency: number;
  paced: { rate: number; seconds: number } | undefined;
  timeoutSeconds: number;
  scale: boolean;
  scalePods: number[];
  scalePeriods: number[];
  scaleSeconds: number;
  resolver: 'procfs' | 'address';
  profile: boolean;
  profilePods: number;
  profileSeconds: number;
  fromSource: boolean;
  /** Where latest.json goes. */
  jsonPath: string;
  /** Where the markdown table goes. */
  markdownPath: string;
}

/** A bad BENCH_* value. */
export class BenchConfigError extends Error {}

function int(env: NodeJS.ProcessEnv, name: string, dflt: number, min: number, max: number): number {
  const raw = env[name];
  if (raw === undefined || raw === '') return dflt;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min || n > max) throw new BenchConfigError(`${name}: want an integer ${min}..${max}, got "${raw}"`);
  return n;
}

function list(env: NodeJS.ProcessEnv, name: string, dflt: number[], min: number, max: number): number[] {
  const raw = env[name];
  if (raw === undefined || raw === '') return dflt;
  const xs = raw.split(',').map((s) => Number(s.trim()));
  if (xs.length === 0 || xs.length > 8 || xs.some((n) => !Number.isInteger(n) || n < min || n > max)) {
    throw new BenchConfigError(`${name}: want up to 8 comma-separated integers ${min}..${max}, got "${raw}"`);
  }
  return xs;
}

function flag(env: NodeJS.ProcessEnv, name: string, dflt: boolean): boolean {
  const raw = env[name];
  if (raw === undefined || raw === '') return dflt;
  if (raw === '1' || raw === 'true') return true;
  if (raw === '0' || raw === 'false') return false;
  throw new BenchConfigError(`${name}: want 0 or 1, got "${raw}"`);
}

/** Reads the BENCH_* variables (see docs/benchmark.md for what each one does). */
export function benchConfig(env: NodeJS.ProcessEnv = process.env): BenchConfig {
  const quick = flag(env, 'BENCH_QUICK', false);
  const resolver = env.BENCH_RESOLVER ?? 'procfs';
  if (resolver !== 'procfs' && resolver !== 'address') throw new BenchConfigError(`BENCH_RESOLVER: want procfs or address, got "${resolver}"`);
  const rate = int(env, 'BENCH_PACED_RATE', quick ? 100 : 750, 0, 5000);
  const out = env.BENCH_OUT ? env.BENCH_OUT : quick ? mkdtempSync(join(tmpdir(), 'probe-agent-bench-quick-')) : undefined;
  return {
    quick,
    pods: int(env, 'BENCH_PODS', quick ? 2 : 50, 1, 64),
    probes: int(env, 'BENCH_PROBES', quick ? 20 : 150, 1, 100_000),
    warmup: int(env, 'BENCH_WARMUP', quick ? 4 : 25, 0, 10_000),
    rounds: int(env, 'BENCH_ROUNDS', quick ? 1 : 3, 1, 9),
    concurrency: int(env, 'BENCH_CONCURRENCY', 16, 1, 256),
    paced: rate > 0 ? { rate, seconds: int(env, 'BENCH_PACED_SECONDS', quick ? 1 : 3, 1, 120) } : undefined,
    timeoutSeconds: 1,
    scale: flag(env, 'BENCH_SCALE', true),
    scalePods: list(env, 'BENCH_SCALE_PODS', quick ? [4] : [10, 100, 250], 1, 256),
    scalePeriods: list(env, 'BENCH_SCALE_PERIODS', quick ? [1] : [10, 1], 1, 300),
    scaleSeconds: int(env, 'BENCH_SCALE_SECONDS', quick ? 3 : 10, 1, 3600),
    resolver,
    profile: flag(env, 'BENCH_PROFILE', false),
    profilePods: int(env, 'BENCH_PROFILE_PODS', quick ? 4 : 250, 1, 256),
    profileSeconds: int(env, 'BENCH_PROFILE_SECONDS', quick ? 2 : 20, 1, 600),
    fromSource: flag(env, 'BENCH_TS', false),
    jsonPath: out ? join(out, 'latest.json') : join(REPO, 'test/bench/results/latest.json'),
    markdownPath: out ? join(out, 'bench-latest.md') : join(REPO, 'docs/bench-latest.md'),
  };
}
