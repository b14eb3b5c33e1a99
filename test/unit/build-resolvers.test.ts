/** buildResolvers: the --netns-resolvers names become resolvers in that order, with the CRI one's close. */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { createLogger } from '../../agent/log.ts';
import { buildResolvers } from '../../agent/netns/build-resolvers.ts';
import { CriResolver } from '../../agent/netns/cri-resolver.ts';

const noAddresses = { readAddresses: async () => [] };
const quiet = createLogger({ level: 'error', write: () => {} });

describe('buildResolvers', () => {
  it('builds the named resolvers in the order given', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'build-resolvers-'));
    try {
      const base = { criEndpoint: `unix://${path.join(dir, 'containerd.sock')}`, netnsDirs: [], procRoot: '/proc', sandboxedRuntimeHandlers: [] };
      const a = await buildResolvers({ ...base, netnsResolvers: ['procfs', 'address', 'cri'] }, quiet, noAddresses);
      expect(a.resolvers.map((r) => r.name)).toEqual(['procfs', 'address', 'cri']);
      a.close();
      const b = await buildResolvers({ ...base, netnsResolvers: ['address'] }, quiet, noAddresses);
      expect(b.resolvers.map((r) => r.name)).toEqual(['address']);
      b.close();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('an explicit --cri-endpoint is used as given even though nothing listens there yet, and close() closes its channel', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'build-resolvers-'));
    try {
      const endpoint = `unix://${path.join(dir, 'not-yet.sock')}`;
      const lines: string[] = [];
      const { resolvers, close } = await buildResolvers(
        { netnsResolvers: ['cri'], criEndpoint: endpoint, netnsDirs: [], procRoot: '/proc', sandboxedRuntimeHandlers: [] },
        createLogger({ level: 'warn', write: (l) => lines.push(l) }),
        noAddresses,
      );
      expect(resolvers).toHaveLength(1);
      expect(resolvers[0]).toBeInstanceOf(CriResolver);
      expect(lines).toEqual([]);
      close();
      close();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('none named, none built', async () => {
    const { resolvers } = await buildResolvers({ netnsResolvers: [], netnsDirs: [], procRoot: '/proc', sandboxedRuntimeHandlers: [] }, quiet, noAddresses);
    expect(resolvers).toEqual([]);
  });
});
