/**
 * agent/netns/helper-process.ts, the helper's supervisor, over real child processes: small Node
 * programs on the same IPC channel stand in for the C helper (which speaks it too), so each way a
 * helper can end (fail to start, exit, say something on stderr, go silent) is made on purpose.
 */
import { describe, expect, it } from 'vitest';
import { HelperError } from '../../agent/errors.ts';
import { createLogger } from '../../agent/log.ts';
import { HelperProcess, type HelperProcessEvents } from '../../agent/netns/helper-process.ts';

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
async function until(pred: () => boolean, what: string, ms = 30_000): Promise<void> {
  const end = Date.now() + ms;
  while (!pred()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(20);
  }
}

/** An echo helper: answers each message with {echo: msg}. */
const ECHO = "process.on('message', (m) => process.send({ echo: m }));";
/** A helper that says why on stderr and exits 3 at once. */
const DIES = "process.stderr.write('no CAP_SYS_ADMIN\\n'); process.exit(3);";
/** A helper that reads its channel and never answers. */
const MUTE = "process.on('message', () => {});";

function supervise(script: string, opts: { silenceMs?: number; backoff?: { initial: number; max: number } } = {}) {
  const log: string[] = [];
  const seen = { up: 0, down: [] as string[], messages: [] as unknown[], restarts: [] as string[] };
  const events: HelperProcessEvents = {
    onUp: () => seen.up++,
    onDown: (reason) => seen.down.push(reason),
    onMessage: (m) => seen.messages.push(m),
    onRestart: (reason) => seen.restarts.push(reason),
  };
  const p = new HelperProcess({
    path: process.execPath,
    args: ['-e', script],
    log: createLogger({ level: 'info', format: 'json', write: (l) => log.push(l) }),
    backoff: opts.backoff ?? { initial: 50, max: 200 },
    silenceMs: opts.silenceMs ?? 60_000,
  }, events);
  return { p, seen, log };
}

describe('HelperProcess', () => {
  it('starts a helper, carries messages both ways, and close() ends it without a restart', async () => {
    const { p, seen } = supervise(ECHO);
    await p.start();
    expect(p.ready).toBe(true);
    expect(p.pid).toBeGreaterThan(0);
    const errors: Error[] = [];
    p.send({ n: 1 }, (e) => errors.push(e));
    await until(() => seen.messages.length > 0, 'the echo');
    expect(seen.messages).toEqual([{ echo: { n: 1 } }]);
    await p.close();
    await sleep(300);
    expect(p.ready).toBe(false);
    expect(seen.restarts).toEqual([]);
    expect(errors).toEqual([]);
  }, 60_000);

  it('a path that does not exist: start rejects with a HelperError naming it', async () => {
    const p = new HelperProcess({ path: '/nonexistent/probe-agent-netns-helper', args: [], log: createLogger({ level: 'error', write: () => {} }), backoff: { initial: 50, max: 50 }, silenceMs: 1000 }, { onUp: () => {}, onDown: () => {}, onMessage: () => {} });
    const err = await p.start().then(() => undefined, (e: unknown) => e);
    expect(err).toBeInstanceOf(HelperError);
    expect((err as Error).message).toMatch(/^cannot start the netns helper "\/nonexistent\/probe-agent-netns-helper": .*ENOENT/);
    await p.close();
  }, 60_000);

  it('a helper that dies is restarted with growing delays; the reason carries its exit code and stderr', async () => {
    const { p, seen, log } = supervise(DIES, { backoff: { initial: 50, max: 100 } });
    await p.start().catch(() => {});
    await until(() => p.restarts >= 3, 'three restarts');
    await p.close();
    expect(seen.down[0]).toBe('netns helper exited (code 3): no CAP_SYS_ADMIN');
    expect(seen.restarts[0]).toBe(seen.down[0]);
    const delays = log.filter((l) => l.includes('netns helper died; restarting')).map((l) => (JSON.parse(l) as { delayMs: number }).delayMs);
    expect(delays.slice(0, 3)).toEqual([50, 100, 100]);
    const restarts = p.restarts;
    await sleep(500);
    expect(p.restarts).toBe(restarts);
  }, 60_000);

  it('a helper silent since a request is killed and replaced; one that answered is left alone', async () => {
    const mute = supervise(MUTE, { silenceMs: 300 });
    await mute.p.start();
    const first = mute.p.pid;
    const sentAt = performance.now();
    mute.p.send({ q: 1 }, () => {});
    mute.p.watchSilence(sentAt);
    await until(() => mute.seen.down.length > 0, 'the kill');
    expect(mute.seen.down[0]).toBe('netns helper exited (signal SIGKILL)');
    expect(mute.log.some((l) => l.includes('netns helper stopped answering; killing it'))).toBe(true);
    await until(() => mute.p.ready && mute.p.pid !== first, 'the replacement');
    await mute.p.close();

    // A request that may rightly keep the helper busy (a connect's or an exchange's timeout) gets that time on top.
    const busy = supervise(MUTE, { silenceMs: 300 });
    await busy.p.start();
    const busySent = performance.now();
    busy.p.send({ q: 1 }, () => {});
    busy.p.watchSilence(busySent, 1500);
    await sleep(1000);
    expect(busy.seen.down).toEqual([]);
    await until(() => busy.seen.down.length > 0, 'the kill after the wait and the silence');
    expect(performance.now() - busySent).toBeGreaterThanOrEqual(1800);
    await busy.p.close();

    // A long wait watched first does not hide a shorter one watched after it.
    const both = supervise(MUTE, { silenceMs: 300 });
    await both.p.start();
    const bothSent = performance.now();
    both.p.send({ q: 1 }, () => {});
    both.p.watchSilence(bothSent, 3_600_000);
    both.p.watchSilence(bothSent, 0);
    await until(() => both.seen.down.length > 0, 'the kill at the shorter check');
    await both.p.close();

    const echo = supervise(ECHO, { silenceMs: 20_000 }); // a Node program takes a while to start on a loaded machine
    await echo.p.start();
    const sent = performance.now();
    echo.p.send({ q: 1 }, () => {});
    echo.p.watchSilence(sent);
    await until(() => echo.seen.messages.length > 0, 'the answer');
    echo.p.killIfSilent(sent);
    await sleep(800);
    expect(echo.seen.down).toEqual([]);
    await echo.p.close();
  }, 60_000);
});
