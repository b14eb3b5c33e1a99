/**
 * The resident netns helper on a plain socketpair (no Node IPC in the way): raw lines in, parsed
 * lines out, passed fds dropped by read(). Optionally started through a launcher (argv prefix)
 * and with extra inherited pipes, as a careless launcher would leave them.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import type { Duplex } from 'node:stream';
import { resolveHelperPath } from '../../agent/netns/helper-protocol.ts';

export class RawHelper {
  readonly child: ChildProcess;
  readonly chan: Duplex;
  readonly replies: Record<string, unknown>[] = [];
  stderr = '';
  #buf = '';

  constructor(args: string[], opts: { prefix?: string[]; extraPipes?: number } = {}) {
    const argv = [...(opts.prefix ?? []), resolveHelperPath(), '--resident', ...args];
    const extra = Array.from({ length: opts.extraPipes ?? 0 }, () => 'pipe' as const);
    this.child = spawn(argv[0] as string, argv.slice(1), {
      stdio: ['ignore', 'ignore', 'pipe', 'pipe', ...extra],
      env: { NODE_CHANNEL_FD: '3' },
    });
    this.chan = this.child.stdio[3] as Duplex;
    this.child.stderr?.on('data', (d: Buffer) => { this.stderr += d.toString(); });
    this.chan.on('data', (d: Buffer) => {
      const parts = (this.#buf + d.toString()).split('\n');
      this.#buf = parts.pop() ?? '';
      for (const p of parts) this.replies.push(JSON.parse(p) as Record<string, unknown>);
    });
  }

  get pid(): number {
    return this.child.pid as number;
  }

  /** The reply payloads for `id`: the msg of a NODE_HANDLE line, or the plain line. */
  answersFor(id: number): Record<string, unknown>[] {
    return this.replies.map((r) => (r.cmd === 'NODE_HANDLE' ? r.msg as Record<string, unknown> : r)).filter((r) => r.id === id);
  }

  async waitReplies(n: number, ms = 10_000): Promise<void> {
    const end = Date.now() + ms;
    while (this.replies.length < n && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
  }

  /** The single answer for `id`, waiting up to `ms` for it. */
  async answer(id: number, ms = 10_000): Promise<Record<string, unknown> | undefined> {
    const end = Date.now() + ms;
    while (this.answersFor(id).length === 0 && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
    return this.answersFor(id)[0];
  }

  async stop(): Promise<number | null> {
    this.chan.destroy();
    if (this.child.exitCode === null && this.child.signalCode === null) await once(this.child, 'exit');
    return this.child.exitCode;
  }
}
