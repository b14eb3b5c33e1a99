/**
 * The webhook's API reads (agent/webhook/cluster-reader.ts) against the API server stand-in: one
 * GET by name, the bearer token re-read per request, answers cached, failures typed and never
 * cached, names checked before any request.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApiServerReader, ClusterReadError } from '../../agent/webhook/cluster-reader.ts';
import { nodeObject, startApiServerStandIn, type ApiServerStandIn } from '../support/api-server-standin.ts';

let api: ApiServerStandIn;
let dir: string;
beforeAll(async () => {
  api = await startApiServerStandIn();
  dir = mkdtempSync(path.join(tmpdir(), 'cluster-reader-'));
});
afterAll(async () => {
  await api?.close();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe('ApiServerReader', () => {
  it('reads a node by name with the current token, caches it, and caches a missing node too', async () => {
    const token = path.join(dir, 'token');
    writeFileSync(token, 'first\n');
    api.nodes.set('n1', nodeObject('n1', { 'probe-agent.io/shim': 'ready' }, { a: 'b' }));
    const r = new ApiServerReader({ url: api.url, tokenFile: token, ttlMs: 60_000 });
    try {
      expect(await r.node('n1')).toEqual({ labels: { 'kubernetes.io/hostname': 'n1', 'probe-agent.io/shim': 'ready' }, annotations: { a: 'b' } });
      expect(await r.node('n1')).toMatchObject({ annotations: { a: 'b' } });
      writeFileSync(token, 'rotated\n');
      expect(await r.node('missing')).toBeNull();
      expect(await r.node('missing')).toBeNull();
      expect(api.requests.map((q) => [q.method, q.url, q.authorization])).toEqual([
        ['GET', '/api/v1/nodes/n1', 'Bearer first'], ['GET', '/api/v1/nodes/missing', 'Bearer rotated'],
      ]);
    } finally {
      await r.close();
    }
  });

  it('types failures, never caches them, and refuses a bad name before asking', async () => {
    const r = new ApiServerReader({ url: api.url, ttlMs: 60_000 });
    const before = api.requests.length;
    try {
      api.down = true;
      await expect(r.node('n1')).rejects.toThrow(ClusterReadError);
      await expect(r.runtimeHandler('x')).rejects.toThrow(/runtimeclass x: HTTP 503/);
      api.down = false;
      api.runtimeClasses.set('x', { metadata: { name: 'x' }, handler: 'kata' });
      expect(await r.runtimeHandler('x')).toBe('kata');
      api.runtimeClasses.set('empty', { metadata: { name: 'empty' } });
      await expect(r.runtimeHandler('empty')).rejects.toThrow(/has no handler/);
      await expect(r.node('../secrets')).rejects.toThrow(/not a valid object name/);
      expect(api.requests.slice(before).map((q) => q.url)).toEqual(['/api/v1/nodes/n1', '/apis/node.k8s.io/v1/runtimeclasses/x', '/apis/node.k8s.io/v1/runtimeclasses/x', '/apis/node.k8s.io/v1/runtimeclasses/empty']);
      const dead = new ApiServerReader({ url: 'http://127.0.0.1:1', timeoutMs: 500 });
      await expect(dead.node('n1')).rejects.toThrow(/API server unreachable/);
      await dead.close();
    } finally {
      api.down = false;
      await r.close();
    }
  });
});
