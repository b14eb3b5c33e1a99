/**
 * `probe-agent hook` (agent/cli/hook-command.ts), built, as root: one lifecycle hook through the
 * resident helper inside a netns (this process's own, an HTTP server on 127.0.0.1).
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli } from '../support/run-cli.ts';

const NETNS = `/proc/${process.pid}/ns/net`;
let web: Server;
let port: number;
const seen: string[] = [];
beforeAll(async () => {
  web = createServer((req, res) => {
    seen.push(`${req.method} ${req.url} ${req.headers['user-agent']}`);
    res.statusCode = req.url === '/fail' ? 500 : 200;
    res.end();
  });
  await new Promise<void>((r) => web.listen(0, '127.0.0.1', r));
  port = (web.address() as AddressInfo).port;
});
afterAll(() => web?.close());

const hook = (spec: unknown, ...extra: string[]) => runCli(['hook', '--netns', NETNS, '--pod-ip', '127.0.0.1', '--spec', JSON.stringify(spec), ...extra]);

describe('probe-agent hook (built)', () => {
  it('runs the hook with kubelet\'s lifecycle User-Agent and says which hook, exit 0', async () => {
    const r = await hook({ httpGet: { port, path: '/stop' } }, '--hook', 'preStop', '--kube-probe-version', '1.30');
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^preStop success \(HTTP 200\) \([\d.]+ ms via 127\.0\.0\.1:\d+\)\n$/);
    expect(seen).toContain('GET /stop kube-lifecycle/1.30');
  }, 240_000);

  it('JSON output carries the hook, the result and the status', async () => {
    const r = await hook({ httpGet: { port, path: '/fail' } }, '--output', 'json');
    const out = JSON.parse(r.stdout) as { hook: string; result: string; status: number };
    expect(out.hook).toBe('postStart');
    expect(out.status).toBe(500);
    expect(r.code).toBe(out.result === 'success' ? 0 : 1);
  }, 240_000);

  it('a hook that cannot connect is a failure, exit 1', async () => {
    const r = await hook({ tcpSocket: { port: 1 } });
    expect(r.code).toBe(1);
    expect(r.stdout).toMatch(/^postStart failure/);
  }, 240_000);

  it.each([
    [{ exec: { command: ['true'] } }, [], 'a lifecycle hook here is httpGet or tcpSocket, got exec'],
    [{ httpGet: { port: 80 } }, ['--timeout', 'soon'], '--timeout'],
    [{ httpGet: { port: 80 } }, ['--hook', 'preStart'], "argument 'preStart' is invalid"],
  ])('exit 2 for %j %j', async (spec, extra, message) => {
    const r = await hook(spec, ...extra);
    expect(r.code).not.toBe(0);
    expect(r.code).not.toBe(1);
    expect(r.stderr).toContain(message);
  }, 240_000);
});
