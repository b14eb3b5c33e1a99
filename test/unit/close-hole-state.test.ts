/**
 * The close-hole sidecar's state file as the agent exports it (agent/metrics/close-hole-state.ts),
 * scraped through a real prom-client registry: table_present, the file's age, the fail-open count
 * and time; nothing at all while the file is missing or says nothing we know.
 */
import { mkdtempSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { Registry } from 'prom-client';
import { afterAll, describe, expect, it } from 'vitest';
import { parseCloseHoleState, registerCloseHoleState } from '../../agent/metrics/close-hole-state.ts';

const scratch = mkdtempSync(path.join(tmpdir(), 'probe-agent-close-hole-state-'));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

/** The value of an unlabelled series in a scrape, or undefined when the scrape lacks it. */
async function sample(registry: Registry, name: string): Promise<number | undefined> {
  const line = (await registry.metrics()).split('\n').find((l) => l.startsWith(`${name} `));
  return line === undefined ? undefined : Number(line.split(' ')[1]);
}

const ALL = [
  'probe_agent_close_hole_table_present',
  'probe_agent_close_hole_state_age_seconds',
  'probe_agent_close_hole_fail_opens_total',
  'probe_agent_close_hole_last_fail_open_timestamp_seconds',
];

describe('probe_agent_close_hole_*', () => {
  it('follows the state the sidecar wrote, and how long ago', async () => {
    const file = path.join(scratch, 'state');
    let now = Date.now();
    const registry = new Registry();
    registerCloseHoleState(registry, file, () => now);
    // No file yet: no series (a 0 would claim the sidecar saw no table, or no fail open).
    for (const name of ALL) expect(await sample(registry, name), name).toBeUndefined();

    writeFileSync(file, 'table_present 1\nfail_open_total 0\nlast_fail_open_seconds 0\n');
    const written = new Date(Math.floor(now / 1000) * 1000 - 30_000);
    utimesSync(file, written, written);
    now = written.getTime() + 30_000;
    expect(await sample(registry, 'probe_agent_close_hole_table_present')).toBe(1);
    expect(await sample(registry, 'probe_agent_close_hole_state_age_seconds')).toBe(30);
    expect(await sample(registry, 'probe_agent_close_hole_fail_opens_total')).toBe(0);
    expect(await sample(registry, 'probe_agent_close_hole_last_fail_open_timestamp_seconds')).toBe(0);

    writeFileSync(file, 'table_present 0\nfail_open_total 3\nlast_fail_open_seconds 1790000000\n');
    expect(await sample(registry, 'probe_agent_close_hole_table_present')).toBe(0);
    expect(await sample(registry, 'probe_agent_close_hole_fail_opens_total')).toBe(3);
    expect(await sample(registry, 'probe_agent_close_hole_last_fail_open_timestamp_seconds')).toBe(1790000000);

    // The old one-word format (and anything else) says nothing the agent knows: no series.
    writeFileSync(file, 'present\n');
    for (const name of ALL) expect(await sample(registry, name), name).toBeUndefined();
  });

  it('parses known keys with whole numbers only, and table_present only as 0 or 1', () => {
    expect(parseCloseHoleState('table_present 1\nfail_open_total 2\nlast_fail_open_seconds 5\n')).toEqual({
      tablePresent: 1, failOpens: 2, lastFailOpenSeconds: 5,
    });
    expect(parseCloseHoleState('table_present 2\nfail_open_total -1\nfail_open_total x\ntable_loaded 1\n')).toEqual({});
    expect(parseCloseHoleState(' table_present 0 \r\n')).toEqual({ tablePresent: 0 });
    expect(parseCloseHoleState(`${'x'.repeat(5000)}\ntable_present 1`)).toEqual({});
  });
});
