/**
 * agent/metrics/shim-relay.ts: the agent reads the kubelet shim's counters from its metrics socket
 * (for /metrics/shim). Against the shim's own metrics server (agent/shim/metrics-server.ts) it gets
 * the exposition as the shim renders it; a shim that is away, answers an error, answers too much or
 * never answers is a ShimMetricsUnavailableError saying which, never a hang.
 */
import { createServer, type Server } from 'node:http';
import { mkdtempSync, rmSync } from 'node:fs';
import type { Socket } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readShimMetrics, ShimMetricsUnavailableError } from '../../agent/metrics/shim-relay.ts';
import { ShimMetrics } from '../../agent/shim/metrics.ts';
import { startShimMetricsServer } from '../../agent/shim/metrics-server.ts';

let dir: string;
const servers: Server[] = [];
const held: Socket[] = [];

/** A plain HTTP server on a unix socket answering every request with `handler`. */
function serve(name: string, handler: Parameters<typeof createServer>[1]): Promise<string> {
  const sock = path.join(dir, name);
  const s = createServer(handler);
  s.on('connection', (c) => held.push(c));
  servers.push(s);
  return new Promise((resolve) => s.listen(sock, () => resolve(sock)));
}

async function failure(p: Promise<unknown>): Promise<ShimMetricsUnavailableError> {
  const err = await p.then(() => undefined, (e: unknown) => e);
  expect(err).toBeInstanceOf(ShimMetricsUnavailableError);
  return err as ShimMetricsUnavailableError;
}

beforeAll(() => {
  dir = mkdtempSync(path.join(tmpdir(), 'shim-metrics-relay-'));
});

afterAll(async () => {
  for (const c of held) c.destroy();
  await Promise.all(servers.map((s) => new Promise((r) => s.close(r))));
  rmSync(dir, { recursive: true, force: true });
});

describe("reading the shim's counters", () => {
  it("returns the shim's exposition and content type as its metrics server serves them", async () => {
    const metrics = new ShimMetrics();
    metrics.forwarded('/runtime.v1.RuntimeService/Version');
    metrics.forwarded('/runtime.v1.RuntimeService/Version');
    const sock = path.join(dir, 'shim', 'metrics.sock');
    const server = await startShimMetricsServer({ metrics, socketPath: sock });
    try {
      const got = await readShimMetrics(sock);
      // The same exposition, but for the memory gauges, which move between two reads.
      const settled = (text: string): string => text.replace(/^(probe_agent_shim_(?:resident|heap|external)\S*) \d+$/gm, '$1');
      expect(settled(got.body)).toBe(settled(metrics.render()));
      expect(got.body).toMatch(/^probe_agent_shim_resident_memory_bytes [1-9]\d+$/m);
      expect(got.body).toMatch(/^probe_agent_shim_forwarded_total\{method="Version"\} 2$/m);
      expect(got.contentType).toMatch(/^text\/plain/);
    } finally {
      await server.close();
    }
  });

  it('a socket nobody listens on: unavailable, naming the socket and the errno', async () => {
    const sock = path.join(dir, 'nobody.sock');
    const err = await failure(readShimMetrics(sock));
    expect(err.message).toBe(`kubelet shim metrics unavailable on ${sock}: ENOENT`);
  });

  it('an HTTP error status: unavailable, naming the status', async () => {
    const sock = await serve('500.sock', (_req, res) => res.writeHead(500).end('broken'));
    expect((await failure(readShimMetrics(sock))).message).toMatch(/: HTTP 500$/);
  });

  it('an answer past the size bound: unavailable, not buffered whole', async () => {
    const sock = await serve('big.sock', (_req, res) => {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.end('x'.repeat(64 * 1024));
    });
    expect((await failure(readShimMetrics(sock, { maxBytes: 1024 }))).message).toMatch(/: answer larger than 1024 bytes$/);
    // Within the bound the same answer is read whole.
    expect((await readShimMetrics(sock, { maxBytes: 64 * 1024 })).body).toHaveLength(64 * 1024);
  });

  it('a shim that accepts and never answers: unavailable after the timeout, not a hang', async () => {
    const sock = await serve('hung.sock', () => {
      // never answers
    });
    expect((await failure(readShimMetrics(sock, { timeoutMs: 300 }))).message).toMatch(/: no answer within 300 ms$/);
  });
});
