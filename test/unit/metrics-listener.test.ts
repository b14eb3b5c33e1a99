/** The webhook's plain-HTTP metrics listener: what it serves, what it refuses, its bounds. */
import { request } from 'node:http';
import { connect, createServer as createTcpServer, type AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger } from '../../agent/log.ts';
import { startWebhookMetricsListener, type WebhookMetricsListener } from '../../agent/webhook/metrics-listener.ts';
import { WebhookMetrics } from '../../agent/webhook/metrics.ts';

let listener: WebhookMetricsListener;
const lines: string[] = [];
beforeAll(async () => {
  listener = await startWebhookMetricsListener({ host: '127.0.0.1', port: 0 }, new WebhookMetrics(), createLogger({ level: 'info', format: 'json', write: (l) => lines.push(l) }));
});
afterAll(() => listener?.close());

function ask(method: string, path: string, body?: string): Promise<{ status: number; type: string; text: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port: listener.port, method, path, agent: false }, (res) => {
      let text = '';
      res.on('data', (d: Buffer) => (text += d.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, type: String(res.headers['content-type']), text }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

describe('the webhook metrics listener', () => {
  it('serves GET /metrics in the Prometheus text format, query string ignored; says where it listens', async () => {
    const r = await ask('GET', '/metrics?x=1');
    expect(r.status).toBe(200);
    expect(r.type).toMatch(/^text\/plain; version=0\.0\.4/);
    expect(r.text).toContain('# TYPE probe_agent_webhook_');
    expect(listener.host).toBe('127.0.0.1');
    expect(lines.some((l) => l.includes('webhook metrics listening') && l.includes(String(listener.port)))).toBe(true);
  });

  it('HEAD answers with headers only', async () => {
    const r = await ask('HEAD', '/metrics');
    expect([r.status, r.text]).toEqual([200, '']);
  });

  it('anything else is 404, and a body sent to /metrics is 405 (never read)', async () => {
    expect(await ask('GET', '/healthz')).toMatchObject({ status: 404, text: 'this listener serves GET /metrics only\n' });
    expect(await ask('POST', '/metrics', 'x'.repeat(100_000))).toMatchObject({ status: 405, text: '/metrics takes GET\n' });
  });

  it('an address in use is a rejection, not a crash', async () => {
    const taken = createTcpServer();
    await new Promise<void>((r) => taken.listen(0, '127.0.0.1', r));
    try {
      await expect(startWebhookMetricsListener({ host: '127.0.0.1', port: (taken.address() as AddressInfo).port }, new WebhookMetrics(), createLogger({ level: 'error', write: () => {} }))).rejects.toThrow(/EADDRINUSE/);
    } finally {
      taken.close();
    }
  });

  it('at most 16 connections are held; the rest are closed at once', async () => {
    const sockets = await Promise.all(Array.from({ length: 20 }, () => new Promise<ReturnType<typeof connect>>((resolve) => {
      const s = connect(listener.port, '127.0.0.1', () => resolve(s));
      s.on('error', () => {});
    })));
    try {
      const closed = await Promise.all(sockets.map((s) => new Promise<boolean>((resolve) => {
        const t = setTimeout(() => resolve(false), 3000);
        s.once('close', () => (clearTimeout(t), resolve(true)));
      })));
      expect(closed.filter(Boolean).length).toBeGreaterThanOrEqual(4);
      expect(closed.filter((c) => !c).length).toBeLessThanOrEqual(16);
    } finally {
      for (const s of sockets) s.destroy();
    }
    // The listener still serves once they are gone.
    await new Promise((r) => setTimeout(r, 200));
    expect((await ask('GET', '/metrics')).status).toBe(200);
  });

  it('close stops it: a new connection is refused', async () => {
    const l = await startWebhookMetricsListener({ host: '127.0.0.1', port: 0 }, new WebhookMetrics(), createLogger({ level: 'error', write: () => {} }));
    await l.close();
    await expect(new Promise((resolve, reject) => {
      const s = connect(l.port, '127.0.0.1', () => resolve(s));
      s.on('error', reject);
    })).rejects.toThrow(/ECONNREFUSED/);
  });
});
