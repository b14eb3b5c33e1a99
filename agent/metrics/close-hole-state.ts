/**
 * Exports the close-hole sidecar's state (deploy/components/nftables-close-hole/close-hole.sh writes
 * it to a file both containers share) as probe_agent_close_hole_* metrics: the sidecar is a shell
 * script with no listener of its own, and a fail open must be visible where the agent is scraped.
 * The file is read at each scrape, bounded, and only known keys with numeric values are taken.
 */
import { readFileSync } from 'node:fs';
import { Counter, Gauge, type Registry } from 'prom-client';

/** The file is a few lines; anything larger is not the sidecar's. */
const MAX_STATE_BYTES = 4096;

/** The sidecar's state as read from its file; absent keys are undefined. */
export interface CloseHoleState {
  failOpens?: number;
  tableLoaded?: number;
  lastFailOpenSeconds?: number;
}

/** Parses the state file's `key value` lines; unknown keys and non-numbers are ignored. */
export function parseCloseHoleState(text: string): CloseHoleState {
  const out: CloseHoleState = {};
  for (const line of text.slice(0, MAX_STATE_BYTES).split('\n')) {
    const m = /^(fail_open_total|table_loaded|last_fail_open_seconds) (\d{1,15})$/.exec(line.trim());
    if (!m) continue;
    const value = Number(m[2]);
    if (m[1] === 'fail_open_total') out.failOpens = value;
    else if (m[1] === 'table_loaded') out.tableLoaded = value;
    else out.lastFailOpenSeconds = value;
  }
  return out;
}

function readState(path: string): CloseHoleState {
  try {
    return parseCloseHoleState(readFileSync(path, { encoding: 'utf8', flag: 'r' }).slice(0, MAX_STATE_BYTES));
  } catch {
    // No file yet (the sidecar has not started, or the component is not deployed): no samples.
    return {};
  }
}

/** Registers the probe_agent_close_hole_* metrics, read from `path` at each scrape. */
export function registerCloseHoleState(registry: Registry, path: string): void {
  const registers = [registry];
  new Counter({
    name: 'probe_agent_close_hole_fail_opens_total',
    help: "Times the close-hole sidecar removed its nftables table because the agent's health check failed (fail open); its log says why each time.",
    registers,
    collect() {
      this.reset();
      const v = readState(path).failOpens;
      if (v !== undefined) this.inc(v);
    },
  });
  new Gauge({
    name: 'probe_agent_close_hole_table_loaded',
    help: "1 while the close-hole sidecar's nftables table is loaded (the node->pod hole is closed), 0 while it is open.",
    registers,
    collect() {
      const v = readState(path).tableLoaded;
      if (v !== undefined) this.set(v === 0 ? 0 : 1);
    },
  });
  new Gauge({
    name: 'probe_agent_close_hole_last_fail_open_timestamp_seconds',
    help: 'Unix time of the last fail open of the close-hole sidecar (0: none since its state file was created).',
    registers,
    collect() {
      const v = readState(path).lastFailOpenSeconds;
      if (v !== undefined) this.set(v);
    },
  });
}
