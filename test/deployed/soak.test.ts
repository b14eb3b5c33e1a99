/**
 * The churn soak inside the container, under the rendered manifest's memory limit (see
 * soak-in-container.ts): for about a minute 30 pods x 3 probes every second churn as in
 * test/integration/soak-short.test.ts. No result may be wrong, fds, children and memory stay flat,
 * SIGTERM (kubelet's StopContainer) ends it with exit 0, and the kernel's figures stay inside the
 * limit: no OOM kill, the agent's peak RSS at most 75 % of the limit.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'containerd', 'ctr', 'kubectl']);

import { expect, it } from 'vitest';
import { markdown, verdicts } from '../soak/soak.ts';
import { memoryLine, memoryVerdicts, runSoakInContainer } from './soak-in-container.ts';

it('a minute of churn in the container under the manifest memory limit: zero wrong results, no OOM kill, RSS at most 75 % of the limit', async () => {
  const seed = Number(process.env['SOAK_SEED'] ?? Date.now() % 1_000_000);
  const { report, memory, logTail } = await runSoakInContainer({
    minutes: 1, pods: 30, labs: 2, netnsPerLab: 3, seed, tickMs: 2000, recreateEveryMs: 30_000, log: () => {},
  });
  console.log(`${markdown(report)}\ntimeline [s, fds, children, zombies, RSS MB, CPU %, queued]: ${JSON.stringify(report.timeline)}\n${memoryLine(memory)}`);
  expect(memory.limitBytes).toBeGreaterThan(0);
  expect(memoryVerdicts(memory)).toEqual([]);
  expect(report.churn['lab-recreated']).toBeGreaterThanOrEqual(1);
  expect(report.churn['pod-removed']).toBeGreaterThanOrEqual(1);
  expect(report.probesRun).toBeGreaterThan(30 * 3 * 50);
  expect(report.judged).toBeGreaterThan(1000);
  expect(verdicts(report, 80), logTail).toEqual([]);
}, 300_000);
