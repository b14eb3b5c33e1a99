/**
 * Exports the close-hole sidecar's state as probe_agent_close_hole_* metrics. The sidecar
 * (deploy/components/nftables-close-hole/close-hole.sh) is a shell script with no listener of its
 * own, and the agent cannot read nftables itself (that needs CAP_NET_ADMIN): so the sidecar writes
 * a small file into a volume both containers share, after every check, and the agent reads it at
 * each scrape. The format is `key value` lines:
 *   table_present 0|1          the sidecar's nftables table as last seen (1: the node->pod hole is closed)
 *   fail_open_total N          times it removed the table because the agent stayed unready
 *   last_fail_open_seconds T   Unix time of the last of those (0: none)
 * The file's mtime is the time of the last check: probe_agent_close_hole_state_age_seconds grows
 * when the sidecar stops checking. Reads are bounded; unknown keys and non-numbers are ignored;
 * a value the file does not give is left out of the scrape (never a made-up 0); nothing throws.
 */
import { Counter, Gauge, type Registry } from 'prom-client';
import { leaveOut, readSmallFile } from './scrape-file.ts';

/** The file is a few lines; anything larger is not the sidecar's. */
const MAX_STATE_BYTES = 4096;

/** The sidecar's state as read from its file; absent keys are undefined. */
export interface CloseHoleState {
  tablePresent?: 0 | 1;
  failOpens?: number;
  lastFailOpenSeconds?: number;
}

/** Parses the state file's `key value` lines; unknown keys, bad values and extra text are ignored. */
export function parseCloseHoleState(text: string): CloseHoleState {
  const out: CloseHoleState = {};
  for (const line of text.slice(0, MAX_STATE_BYTES).split('\n')) {
    const m = /^(table_present|fail_open_total|last_fail_open_seconds) (\d{1,15})$/.exec(line.trim());
    if (!m) continue;
    const value = Number(m[2]);
    if (m[1] === 'table_present') {
      if (value === 0 || value === 1) out.tablePresent = value;
    } else if (m[1] === 'fail_open_total') out.failOpens = value;
    else out.lastFailOpenSeconds = value;
  }
  return out;
}

/** The file's state and mtime; undefined when it cannot be read (no sidecar yet, or not deployed). */
async function readStateFile(path: string): Promise<{ state: CloseHoleState; mtimeMs: number } | undefined> {
  const file = await readSmallFile(path);
  return file && { state: parseCloseHoleState(file.text), mtimeMs: file.mtimeMs };
}

/**
 * Registers probe_agent_close_hole_table_present, _state_age_seconds, _fail_opens_total and
 * _last_fail_open_timestamp_seconds, read from `stateFile` at each scrape.
 */
export function registerCloseHoleState(registry: Registry, stateFile: string, now: () => number = Date.now): void {
  const registers = [registry];
  // Each metric reads the file itself: prom-client may collect them concurrently.
  const read = () => readStateFile(stateFile);
  new Gauge({
    name: 'probe_agent_close_hole_table_present',
    help: "Whether the close-hole sidecar last found its nftables table loaded in the node's netns (1: the node->pod hole is closed) or not (0); from its state file.",
    registers,
    async collect() {
      const v = (await read())?.state.tablePresent;
      if (v === undefined) leaveOut(this);
      else this.set(v);
    },
  });
  new Gauge({
    name: 'probe_agent_close_hole_state_age_seconds',
    help: 'Seconds since the close-hole sidecar last wrote its state file (it writes after every check).',
    registers,
    async collect() {
      const file = await read();
      if (file === undefined || file.state.tablePresent === undefined) leaveOut(this);
      else this.set(Math.max(0, (now() - file.mtimeMs) / 1000));
    },
  });
  new Counter({
    name: 'probe_agent_close_hole_fail_opens_total',
    help: "Times the close-hole sidecar removed its nftables table because the agent's health check failed (fail open); its log says why each time.",
    registers,
    async collect() {
      const v = (await read())?.state.failOpens;
      this.reset();
      if (v === undefined) leaveOut(this);
      else this.inc(v);
    },
  });
  new Gauge({
    name: 'probe_agent_close_hole_last_fail_open_timestamp_seconds',
    help: 'Unix time of the last fail open of the close-hole sidecar (0: none since its state file was created).',
    registers,
    async collect() {
      const v = (await read())?.state.lastFailOpenSeconds;
      if (v === undefined) leaveOut(this);
      else this.set(v);
    },
  });
}
