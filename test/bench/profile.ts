/**
 * Profiles the daemon under the scale curve's heaviest load (default 250 pods × 3 probes at 1 s):
 * `node --cpu-prof` on `probe-agent run`, summarising only a steady window (start-up and shutdown
 * are left out) with cpuprofile.ts. Run by bench.ts when BENCH_PROFILE=1, or alone:
 *
 *   node test/bench/profile.ts            (env: BENCH_PROFILE_PODS, BENCH_PROFILE_SECONDS, BENCH_RESOLVER,
 *                                          BENCH_PROFILE_KEEP: a path to copy the .cpuprofile to)
 */
import { copyFileSync, readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { startAgent } from './agent-process.ts';
import { buildForBench } from './build.ts';
import { profileMarkdown, summariseProfile, type CpuProfile, type ProfileSummary } from './cpuprofile.ts';
import { waitResolved } from './scale.ts';
import { createScaleEnv, type ScaleEnv } from './scale-env.ts';
import { round } from './stats.ts';

/** What a profiling run produced. */
export interface ProfileResult {
  pods: number;
  periodSeconds: number;
  windowSeconds: number;
  /** Agent + helper CPU over the window with the profiler on (it costs a little). */
  cpuPercent: number;
  /** Where the .cpuprofile was kept (deleted with the scratch dir unless copied). */
  file: string;
  summary: ProfileSummary;
  markdown: string;
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Runs the daemon with --cpu-prof for a steady window of `seconds` and summarises that window. */
export async function profileAgent(env: ScaleEnv, cli: string, pods: number, periodSeconds: number, seconds: number): Promise<ProfileResult> {
  env.kubelet.setPods(env.podList(pods, periodSeconds));
  const dir = join(env.dir, `profile-${Date.now()}`);
  const spawned = Date.now();
  const agent = await startAgent({
    cli,
    kubeletUrl: env.kubelet.httpUrl,
    resolver: env.resolver,
    dir: env.dir,
    nodeFlags: ['--cpu-prof', `--cpu-prof-dir=${dir}`, '--cpu-prof-name=agent.cpuprofile'],
  });
  let from: number;
  let to: number;
  let cpuPercent: number;
  try {
    if (pods > 0) await waitResolved(agent, pods, 180_000);
    await sleep(periodSeconds * 1000 + 1000);
    const c0 = agent.cpuMs();
    from = (Date.now() - spawned) / 1000;
    await sleep(seconds * 1000);
    to = (Date.now() - spawned) / 1000;
    const c1 = agent.cpuMs();
    cpuPercent = round((c1.agent + c1.helper - c0.agent - c0.helper) / (to - from) / 10, 2);
  } finally {
    await agent.stop();
  }
  const file = join(dir, readdirSync(dir).find((f) => f.endsWith('.cpuprofile')) ?? 'agent.cpuprofile');
  const summary = summariseProfile(JSON.parse(readFileSync(file, 'utf8')) as CpuProfile, { fromSeconds: from, toSeconds: to, top: 30 });
  return { pods, periodSeconds, windowSeconds: round(to - from, 1), cpuPercent, file, summary, markdown: profileMarkdown(summary) };
}

if (import.meta.main) {
  const pods = Number(process.env.BENCH_PROFILE_PODS ?? 250);
  const period = Number(process.env.BENCH_PROFILE_PERIOD ?? 1);
  const seconds = Number(process.env.BENCH_PROFILE_SECONDS ?? 20);
  const resolver = process.env.BENCH_RESOLVER === 'address' ? 'address' : 'procfs';
  const build = await buildForBench({ fromSource: process.env.BENCH_TS === '1' });
  const env = await createScaleEnv(Math.max(1, pods), resolver, (l) => process.stderr.write(`${l}\n`));
  try {
    const r = await profileAgent(env, build.cli, pods, period, seconds);
    if (process.env.BENCH_PROFILE_KEEP) copyFileSync(r.file, process.env.BENCH_PROFILE_KEEP);
    process.stdout.write(`${pods} pods x 3 probes @${period}s, profiler on: agent + helper ${r.cpuPercent} % of a core\n\n${r.markdown}\n`);
  } finally {
    await env.destroy();
    build.cleanup();
  }
}
