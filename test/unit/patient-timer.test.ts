/**
 * patientTimeout: fires once after its time, never after cancel, and gives back time the event loop
 * was stalled (here: a real synchronous stall). No latency is asserted, only order and counts.
 */
import { connect, createServer, type AddressInfo, type Socket } from 'node:net';
import { describe, expect, it } from 'vitest';
import { patientTimeout } from '../../agent/webhook/patient-timer.ts';

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
const busy = (ms: number): void => {
  const end = performance.now() + ms;
  while (performance.now() < end) { /* stall the loop */ }
};

describe('patientTimeout', () => {
  it('fires exactly once, no earlier than its time', async () => {
    const started = performance.now();
    let fired = 0;
    let at = 0;
    patientTimeout(30, () => {
      fired++;
      at = performance.now();
    });
    while (fired === 0) await sleep(10);
    await sleep(100);
    expect(fired).toBe(1);
    expect(at - started).toBeGreaterThanOrEqual(29);
  });

  it('never fires once cancelled, before or after its time has come', async () => {
    let fired = 0;
    const cancelEarly = patientTimeout(20, () => fired++);
    cancelEarly();
    const cancelLate = patientTimeout(20, () => fired++);
    busy(60); // the timer is due; cancel before the loop gets to it
    cancelLate();
    cancelLate();
    await sleep(200);
    expect(fired).toBe(0);
  });

  it('bytes a client sent while the process was stalled are read before the verdict', async () => {
    const server = createServer();
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const accepted = new Promise<Socket>((r) => server.once('connection', r));
    const client = connect((server.address() as AddressInfo).port, '127.0.0.1');
    await new Promise((r) => client.once('connect', r));
    const conn = await accepted;
    try {
      const order: string[] = [];
      conn.on('data', () => order.push('client data'));
      patientTimeout(20, () => order.push('fired'));
      busy(100);
      client.write('x'); // in the kernel's buffer while the loop is still stalled
      busy(200);
      while (!order.includes('fired')) await sleep(10);
      expect(order).toEqual(['client data', 'fired']);
    } finally {
      client.destroy();
      conn.destroy();
      await new Promise((r) => server.close(r));
    }
  });

  it('fires in the end even when every wait is stalled (capped at 4 x its time)', async () => {
    let fired = 0;
    patientTimeout(20, () => fired++);
    const until = Date.now() + 30_000;
    while (fired === 0 && Date.now() < until) {
      busy(120);
      await sleep(1);
    }
    expect(fired).toBe(1);
  });
});
