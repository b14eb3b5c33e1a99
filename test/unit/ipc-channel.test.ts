/**
 * agent/netns/ipc-channel.ts over real IPC channels. A Node child sends a handle, as the netns
 * helper does, and reports on stdout which of Node's internal messages reached it (its own channel
 * holds back every later message until an ACK comes, so the report cannot travel on the channel);
 * another reads what writeLines wrote, as Node's own receiver parses it.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import type { Server } from 'node:net';
import { createInterface } from 'node:readline';
import { describe, expect, it } from 'vitest';
import { dropHandleAcks, writeLines } from '../../agent/netns/ipc-channel.ts';

/** Sends a listening server's handle, then prints the internal commands it got when told 'report'. */
const SENDER = `
const net = require('node:net');
const got = [];
process.on('internalMessage', (m) => got.push(m.cmd));
process.on('message', (m) => { if (m === 'report') process.stdout.write(JSON.stringify(got) + '\\n'); });
const server = net.createServer().listen(0, '127.0.0.1', () => process.send({ id: 1, ok: true }, server));
`;

/** Prints every message it receives on a line of its own. */
const PRINTER = "process.on('message', (m) => process.stdout.write(JSON.stringify(m) + '\\n'));";

function ipcChild(script: string): ChildProcess {
  return spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'inherit', 'ipc'], serialization: 'json' });
}

/** Starts the sender, receives its handle, asks for its report and returns what it saw. */
async function exchange(drop: boolean): Promise<{ applied: boolean; message: unknown; handle: unknown; internal: string[] }> {
  const child = ipcChild(SENDER);
  try {
    const applied = drop ? dropHandleAcks(child) : false;
    const lines = createInterface({ input: child.stdout! });
    const [message, handle] = await new Promise<[unknown, unknown]>((resolve) => child.once('message', (m, h) => resolve([m, h])));
    (handle as Server | undefined)?.close();
    // Node writes the ACK before the 'message' event; a message sent now arrives after it.
    const report = new Promise<string>((resolve) => lines.once('line', resolve));
    child.send('report');
    return { applied, message, handle, internal: JSON.parse(await report) as string[] };
  } finally {
    child.kill('SIGKILL');
  }
}

describe('dropHandleAcks', () => {
  it('keeps the handle and its message, and no ACK reaches the sender', async () => {
    const r = await exchange(true);
    expect(r.applied).toBe(true);
    expect(r.message).toEqual({ id: 1, ok: true });
    expect(r.handle).toBeDefined();
    expect(r.internal).toEqual([]);
  });

  it('without it Node acknowledges the handle (what the helper used to be woken for)', async () => {
    const r = await exchange(false);
    expect(r.handle).toBeDefined();
    expect(r.internal).toEqual(['NODE_HANDLE_ACK']);
  });

  it('changes nothing for a child without an IPC channel', async () => {
    const child = spawn(process.execPath, ['-e', ''], { stdio: 'ignore' });
    try {
      expect(dropHandleAcks(child)).toBe(false);
    } finally {
      child.kill('SIGKILL');
    }
  });
});

describe('writeLines', () => {
  it('writes several messages at once; the receiver gets each, in order, then those Node sends after', async () => {
    const child = ipcChild(PRINTER);
    try {
      const lines = createInterface({ input: child.stdout! });
      const got: unknown[] = [];
      const all = new Promise<void>((resolve) => lines.on('line', (l) => {
        got.push(JSON.parse(l));
        if (got.length === 4) resolve();
      }));
      const msgs = [{ id: 1, op: 'tcp', netns: '/run/netns/a' }, { id: 2, netns: '/run/netns/ü', family: 6 }, { id: 3 }];
      expect(writeLines(child, `${msgs.map((m) => JSON.stringify(m)).join('\n')}\n`)).toBe('written');
      child.send({ id: 4 });
      await all;
      expect(got).toEqual([...msgs, { id: 4 }]);
    } finally {
      child.kill('SIGKILL');
    }
  });

  it('never blocks: a peer that does not read fills the channel, then nothing more is written', () => {
    // A process that holds the channel and never reads it (not Node, which always reads).
    const child = spawn('sleep', ['60'], { stdio: ['ignore', 'ignore', 'inherit', 'ipc'] });
    try {
      const line = `${JSON.stringify({ id: 1, netns: '/run/netns/'.padEnd(200, 'x') })}\n`;
      const results: string[] = [];
      for (let i = 0; i < 100_000 && results.at(-1) !== 'not-written'; i++) {
        const r = writeLines(child, line);
        if (r !== 'written') results.push(r);
      }
      // Full: at most the last write went in part (the kernel takes what fits), then none at all.
      expect(['not-written', 'torn,not-written']).toContain(results.join());
      expect(writeLines(child, line)).toBe('not-written');
    } finally {
      child.kill('SIGKILL');
    }
  });

  it('writes nothing where there is no channel', () => {
    const child = spawn(process.execPath, ['-e', ''], { stdio: 'ignore' });
    try {
      expect(writeLines(child, '{"id":1}\n')).toBe('not-written');
    } finally {
      child.kill('SIGKILL');
    }
  });
});
