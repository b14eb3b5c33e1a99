/**
 * The ProbeService socket's directory is 0700 even when something else created it first: a
 * hostPath DirectoryOrCreate volume (kubelet makes it 0755) or an older shim unit
 * (RuntimeDirectoryMode=0755). The real ProbeApiServer on a real unix socket, checked as root and
 * as uid 65534; a directory shared with other software is left as it is.
 */
import { requireRoot } from '../support/root.ts';
requireRoot([]);

import { chmod, mkdir, mkdtemp, rm, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ProbeApiServer } from '../../agent/api/server.ts';
import { ResultsStore } from '../../agent/scheduler/results-store.ts';
import { portableNode, runNodeAs, tmpdirOthersReach, type PortableNode } from '../support/other-user.ts';

let scratch: string;
// uid 65534 cannot run the checkout's node when the clone sits in a 0700 directory.
let nodeForOthers: PortableNode;
const prober = { probe: async (): Promise<never> => { throw new Error('not used by this test'); } };

beforeAll(async () => {
  nodeForOthers = portableNode();
  scratch = await mkdtemp(join(tmpdirOthersReach(), 'pa-socket-dir-'));
  await chmod(scratch, 0o755);
});

afterAll(async () => {
  if (scratch) await rm(scratch, { recursive: true, force: true });
  nodeForOthers?.remove();
});

/** What uid 65534 gets from listing `dir`. */
function listAsNobody(dir: string): Promise<string> {
  return runNodeAs(nodeForOthers.node, 65534, `try{require('fs').readdirSync(${JSON.stringify(dir)});console.log('listed')}catch(e){console.log(e.code)}`);
}

describe('the socket directory', () => {
  it('an existing probe-agent directory created 0755 (hostPath DirectoryOrCreate) is tightened to 0700', async () => {
    const dir = join(scratch, 'probe-agent');
    await mkdir(dir, { mode: 0o755 });
    await chmod(dir, 0o755);
    expect(await listAsNobody(dir)).toBe('listed');
    const server = await ProbeApiServer.start({ results: new ResultsStore(), prober, socketPath: join(dir, 'probe.sock') });
    try {
      expect((await stat(dir)).mode & 0o777).toBe(0o700);
      expect(await listAsNobody(dir)).toBe('EACCES');
    } finally {
      await server.stop();
    }
  });

  it('with a socket group the same directory becomes 0750', async () => {
    const dir = join(scratch, 'probe-agent-grp');
    await mkdir(dir, { mode: 0o755 });
    await chmod(dir, 0o777);
    const server = await ProbeApiServer.start({ results: new ResultsStore(), prober, socketPath: join(dir, 'probe.sock'), socketGroup: 'nogroup' });
    try {
      expect((await stat(dir)).mode & 0o777).toBe(0o750);
    } finally {
      await server.stop();
    }
  });

  it('a directory shared with other software keeps its mode (the socket itself is 0600)', async () => {
    const dir = join(scratch, 'shared');
    await mkdir(dir);
    await chmod(dir, 0o755);
    const server = await ProbeApiServer.start({ results: new ResultsStore(), prober, socketPath: join(dir, 'probe.sock') });
    try {
      expect((await stat(dir)).mode & 0o777).toBe(0o755);
      expect((await stat(join(dir, 'probe.sock'))).mode & 0o777).toBe(0o600);
    } finally {
      await server.stop();
    }
  });
});
