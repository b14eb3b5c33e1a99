/**
 * `probe-agent watch`: the agent's probe events as they happen (snapshot first), as text or one
 * JSON object per line. With --reconnect it follows the agent across restarts from its resume point.
 * Exit status: 0 stopped by --count or a signal, 2 the stream failed.
 */
import { Command, Option } from 'commander';
import { ProbeApiClient, watchWithResume, type WatchMessage } from '../api/client.ts';
import { InvalidProbeError } from '../errors.ts';
import type { ProbeStatus } from '../scheduler/types.ts';
import { addClientFlags, errorText, filterFromFlags, oneLine, statusJson, type FilterFlags } from './status-command.ts';

interface WatchFlags extends FilterFlags {
  socket: string;
  output: 'text' | 'json';
  fromRevision?: string;
  instanceId?: string;
  reconnect?: boolean;
  count?: string;
}

/** Adds `watch` to the program. */
export function registerWatchCommand(program: Command): void {
  addClientFlags(program.command('watch').description("print the running agent's probe events as they happen (through its socket)"))
    .addOption(new Option('--output <format>', 'output format').choices(['text', 'json']).default('text'))
    .option('--from-revision <n>', 'resume after this revision (no snapshot if the agent still has the events)')
    .option('--instance-id <id>', 'agent instance the revision belongs to (a different instance forces a fresh snapshot)')
    .option('--reconnect', 'reconnect after errors and agent restarts, resuming from the last revision seen')
    .option('--count <n>', 'exit after this many events (snapshots do not count)')
    .action(async (opts: WatchFlags) => {
      process.exitCode = await watchCommand(opts);
    });
}

function nonNegativeInt(text: string | undefined, flag: string): number | undefined {
  if (text === undefined) return undefined;
  if (!/^\d{1,15}$/.test(text)) throw new InvalidProbeError(`${flag}: want a non-negative integer, got "${text}"`);
  return Number(text);
}

function statusText(s: ProbeStatus, previous?: string): string {
  const msg = s.lastMessage ? ` ${JSON.stringify(oneLine(s.lastMessage, 120))}` : '';
  const result = previous !== undefined && previous !== s.result ? `${previous} -> ${s.result}` : s.result;
  return `${s.namespace}/${s.podName} container=${s.key.containerName} ${s.key.probeType} ${result} started=${s.started} ready=${s.ready}${s.onHold ? ' on-hold' : ''}${msg}`;
}

/** Renders one watch item as text lines (reconnect notices go to stderr). */
export function watchText(m: WatchMessage): string {
  switch (m.kind) {
    case 'snapshot': {
      const head = `snapshot revision=${m.revision} instance=${m.instanceId} statuses=${m.statuses.length}${m.resynced ? ' resynced' : ''}${m.complete ? '' : ' (continues)'}`;
      return [head, ...m.statuses.map((s) => `  ${statusText(s)}`)].join('\n') + '\n';
    }
    case 'event': {
      const e = m.event;
      return `${new Date(e.time).toISOString()} revision=${e.revision} ${e.type} ${statusText(e.status, e.type === 'changed' ? e.previous : undefined)}\n`;
    }
    case 'reconnecting':
      return `reconnecting in ${m.delayMs} ms after ${m.error.message}; resuming from revision ${m.fromRevision}\n`;
  }
}

/** Renders one watch item as a JSON object. */
export function watchJson(m: WatchMessage): Record<string, unknown> {
  switch (m.kind) {
    case 'snapshot':
      return { type: 'snapshot', revision: m.revision, instanceId: m.instanceId, resynced: m.resynced, complete: m.complete, statuses: m.statuses.map(statusJson) };
    case 'event':
      return {
        type: 'event',
        revision: m.event.revision,
        event: m.event.type,
        previous: m.event.previous ?? null,
        time: new Date(m.event.time).toISOString(),
        status: statusJson(m.event.status),
      };
    case 'reconnecting':
      return { type: 'reconnecting', error: m.error.message, fromRevision: m.fromRevision, delayMs: m.delayMs };
  }
}

async function watchCommand(opts: WatchFlags): Promise<number> {
  const ac = new AbortController();
  const stop = (): void => ac.abort();
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
  let client: ProbeApiClient | undefined;
  try {
    const filter = filterFromFlags(opts);
    const fromRevision = nonNegativeInt(opts.fromRevision, '--from-revision');
    const count = nonNegativeInt(opts.count, '--count');
    ({ client } = await ProbeApiClient.connect(opts.socket));
    const watchOpts = { filter, fromRevision, instanceId: opts.instanceId, signal: ac.signal };
    const stream = opts.reconnect ? watchWithResume(client, watchOpts) : client.watch(watchOpts);
    let events = 0;
    for await (const m of stream) {
      if (m.kind === 'reconnecting' && opts.output === 'text') process.stderr.write(watchText(m));
      else process.stdout.write(opts.output === 'json' ? JSON.stringify(watchJson(m)) + '\n' : watchText(m));
      if (m.kind === 'event' && count !== undefined && ++events >= count) break;
    }
    return 0;
  } catch (err) {
    process.stderr.write(`probe-agent watch: ${errorText(err)}\n`);
    return 2;
  } finally {
    process.off('SIGINT', stop);
    process.off('SIGTERM', stop);
    client?.close();
  }
}
