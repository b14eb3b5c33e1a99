/**
 * `probe-agent probe --netns` (agent/cli/probe-command.ts), built, as root: the probe runs through
 * the resident helper inside a netns (this test process's own, where an HTTP server listens on
 * 127.0.0.1). new-user.test.ts covers the first-run mistakes; this covers exit codes, named ports,
 * @file specs, the JSON shape and the flag conflicts.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli } from '../support/run-cli.ts';

const NETNS = `/proc/${process.pid}/ns/net`;
let web: Server;
let port: number;
let dir: string;
beforeAll(async () => {
  web = createServer((req, res) => {
    res.statusCode = req.url === '/fail' ? 503 : 200;
    res.end(req.url === '/fail' ? 'down' : `ua=${req.headers['user-agent']}`);
  });
  await new Promise<void>((r) => web.listen(0, '127.0.0.1', r));
  port = (web.address() as AddressInfo).port;
  dir = mkdtempSync(path.join(tmpdir(), 'probe-cmd-'));
});
afterAll(() => {
  web?.close();
  rmSync(dir, { recursive: true, force: true });
});

const probe = (spec: unknown, ...extra: string[]) => runCli(['probe', '--netns', NETNS, '--pod-ip', '127.0.0.1', '--spec', JSON.stringify(spec), ...extra]);

describe('probe-agent probe --netns (built)', () => {
  it('exit 0 on success (body with -v), 1 on failure, 1 for a refused TCP connect', async () => {
    const ok = await probe({ httpGet: { port, path: '/' } }, '-v', '--kube-probe-version', '1.31');
    expect(ok.code).toBe(0);
    expect(ok.stdout).toMatch(/^success \([\d.]+ ms via 127\.0\.0\.1:\d+\)\nua=kube-probe\/1\.31\n$/);
    const fail = await probe({ httpGet: { port, path: '/fail' } });
    expect(fail.code).toBe(1);
    expect(fail.stdout).toMatch(/^failure: HTTP probe failed with statuscode: 503/);
    const closed = await probe({ tcpSocket: { port: 1 } });
    expect(closed.code).toBe(1);
  }, 240_000);

  it('a named port from --container-port, a spec from @file, JSON output', async () => {
    const file = path.join(dir, 'spec.yaml');
    writeFileSync(file, `httpGet:\n  port: web\n  path: /\n`);
    const r = await runCli(['probe', '--netns', NETNS, '--pod-ip', '127.0.0.1', '--spec', `@${file}`, '--container-port', `web=${port}`, '--output', 'json']);
    expect(r.code).toBe(0);
    const out = JSON.parse(r.stdout) as { result: string; address: string; durationSeconds: number; phases: Record<string, number> };
    expect(out.result).toBe('success');
    expect(out.address).toBe(`127.0.0.1:${port}`);
    expect(out.durationSeconds).toBeGreaterThan(0);
  }, 240_000);

  it.each([
    [['--container-port', 'WEB=80'], '--container-port: want name=port, got "WEB=80"'],
    [['--container', 'app'], '--container goes with --pod'],
    [['--from-node'], '--from-node probes from the node: drop --netns'],
  ])('exit 2 for %j', async (extra, message) => {
    const r = await probe({ tcpSocket: { port } }, ...extra);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(message);
    expect(r.stdout).toBe('');
  }, 240_000);

  it('exit 2 for a spec file that is not there, naming it', async () => {
    const r = await runCli(['probe', '--netns', NETNS, '--spec', `@${path.join(dir, 'none.yaml')}`]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(path.join(dir, 'none.yaml'));
  }, 240_000);
});
