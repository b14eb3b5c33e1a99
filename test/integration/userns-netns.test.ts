/**
 * User-namespaced pods (`hostUsers: false`, GA in 1.36): the runtime makes the pod's netns inside
 * the pod's own user namespace. The agent, root in the node's user namespace, enters it by the
 * kernel's rule (setns(CLONE_NEWNET) needs CAP_SYS_ADMIN over the netns's owning user namespace,
 * which root of an ancestor namespace has). containerd 1.6 cannot make such pods, so the netns
 * here is made as the runtime makes it: `unshare --user --map-root-user --net`, a server inside,
 * and the agent's own helper and prober entering it from outside.
 */
import { requireRoot } from '../support/root.ts';
requireRoot();

import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { readlinkSync } from 'node:fs';
import { connect } from 'node:net';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ResidentHelper } from '../../agent/netns/helper.ts';
import { builtCli } from '../support/built-cli.ts';

const run = promisify(execFile);
const PORT = 18_000 + Math.floor(Math.random() * 2000);
// Inside its own user and network namespace: loopback up, then an HTTP server on it.
const SERVER = `require('node:http').createServer((q, s) => s.end('inside ' + q.url)).listen(${PORT}, '127.0.0.1', () => console.log('listening'));`;

let pod: ChildProcess;
let netns = '';

beforeAll(async () => {
  pod = spawn('unshare', ['--user', '--map-root-user', '--net', '--', 'sh', '-c', `ip link set lo up && exec "$0" -e "$1"`, process.execPath, SERVER], { stdio: ['ignore', 'pipe', 'pipe'] });
  let err = '';
  pod.stderr!.on('data', (d: Buffer) => (err += d.toString()));
  await new Promise<void>((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`the user-namespaced server did not start: ${err}`)), 10_000);
    pod.stdout!.once('data', () => {
      clearTimeout(t);
      resolve();
    });
    pod.once('exit', (code) => reject(new Error(`unshare exited ${code}: ${err}`)));
  });
  // The process unshare exec'd into is the server: its netns is the pod's.
  netns = `/proc/${pod.pid}/ns/net`;
}, 20_000);

afterAll(() => {
  pod?.kill('SIGKILL');
});

describe('a pod netns owned by the pod\'s own user namespace (hostUsers: false)', () => {
  it('is another user and network namespace, where root is mapped and the node cannot reach the server', async () => {
    expect(readlinkSync(`/proc/${pod.pid}/ns/user`)).not.toBe(readlinkSync('/proc/self/ns/user'));
    expect(readlinkSync(netns)).not.toBe(readlinkSync('/proc/self/ns/net'));
    const uidMap = (await run('cat', [`/proc/${pod.pid}/uid_map`])).stdout.trim().split(/\s+/);
    expect(uidMap).toEqual(['0', '0', '1']);
    const fromNode = await new Promise<string>((resolve) => {
      const s = connect(PORT, '127.0.0.1');
      s.once('connect', () => {
        s.destroy();
        resolve('connected');
      });
      s.once('error', (e: NodeJS.ErrnoException) => resolve(e.code ?? e.message));
    });
    expect(fromNode).toBe('ECONNREFUSED');
  });

  it('the resident helper hands over a socket made inside it, which reaches the server', async () => {
    const h = await ResidentHelper.start();
    try {
      const socket = await h.createSocket(netns, 4);
      const answer = await new Promise<string>((resolve, reject) => {
        let got = '';
        socket.on('data', (d: Buffer) => (got += d.toString()));
        socket.once('end', () => resolve(got));
        socket.once('error', reject);
        socket.connect(PORT, '127.0.0.1', () => socket.end(`GET /helper HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`));
      });
      expect(answer).toMatch(/^HTTP\/1\.1 200 OK\r\n/);
      expect(answer.endsWith('inside /helper')).toBe(true);
    } finally {
      await h.close();
    }
  });

  it('`probe-agent probe --netns` runs kubelet\'s HTTP probe inside it: success, and a failure for a closed port', async () => {
    const cli = builtCli();
    const ok = await run(cli, ['probe', '--netns', netns, '--pod-ip', '127.0.0.1', '--output', 'json', '--spec', JSON.stringify({ httpGet: { port: PORT, path: '/probe' } })]);
    expect(JSON.parse(ok.stdout)).toMatchObject({ result: 'success', address: `127.0.0.1:${PORT}` });
    const closed = await run(cli, ['probe', '--netns', netns, '--pod-ip', '127.0.0.1', '--output', 'json', '--spec', JSON.stringify({ tcpSocket: { port: PORT + 1 } })]).then(
      () => undefined,
      (e: { code: number; stdout: string }) => e,
    );
    expect(closed?.code).toBe(1);
    expect(JSON.parse(closed!.stdout)).toMatchObject({ result: 'failure', message: `dial tcp 127.0.0.1:${PORT + 1}: connect: connection refused` });
  });
});
