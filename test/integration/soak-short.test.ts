/**
 * The CI variant of `make soak` (test/soak/soak.ts): the same code for about a minute with 30 pods
 * x 3 probes every second on 6 lab netns (5 pods share each netns and its IPs), while servers turn
 * unhealthy, stop serving gRPC, crash and restart, pods come and go, and one lab's netns are
 * replaced. No result may disagree with the server state once a change has had time to show; the
 * agent's fds, children, zombies and memory must stay flat; SIGTERM must end it with exit 0.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft']);

import { expect, it } from 'vitest';
import { markdown, runSoak, verdicts } from '../soak/soak.ts';

it('a minute of churn: zero wrong results, flat fds and children, no zombies, bounded memory, clean exit', async () => {
  const seed = Number(process.env['SOAK_SEED'] ?? Date.now() % 1_000_000);
  const report = await runSoak({
    minutes: 1,
    pods: 30,
    labs: 2,
    netnsPerLab: 3,
    seed,
    tickMs: 2000,
    recreateEveryMs: 30_000,
    resolver: 'procfs',
    log: () => {},
  });
  console.log(`${markdown(report)}\ntimeline [s, fds, children, zombies, RSS MB, CPU %, queued]: ${JSON.stringify(report.timeline)}`);
  expect(report.churn['lab-recreated']).toBeGreaterThanOrEqual(1);
  expect(report.churn['pod-removed']).toBeGreaterThanOrEqual(1);
  expect(report.probesRun).toBeGreaterThan(30 * 3 * 50);
  expect(report.judged).toBeGreaterThan(1000);
  expect(verdicts(report, 80)).toEqual([]);
}, 120_000);
