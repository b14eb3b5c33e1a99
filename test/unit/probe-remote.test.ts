/**
 * `probe-agent probe --pod`: the pod reference's parsing, and probeThroughAgent (through the built
 * CLI) against a real agent API server whose pod is this process's own netns and an HTTP server
 * on 127.0.0.1.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parsePodRef, probeThroughAgent } from '../../agent/cli/probe-remote.ts';
import { InvalidProbeError } from '../../agent/errors.ts';
import { parseProbeText } from '../../agent/probe/spec.ts';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { LabProber, startApiFixture, type ApiFixture } from '../support/api-harness.ts';
import { runCli } from '../support/run-cli.ts';

describe('parsePodRef', () => {
  it.each([
    ['ns/web', { namespace: 'ns', name: 'web' }],
    [' ns/web ', { namespace: 'ns', name: 'web' }],
    ['0d7c1e2f-3a4b-4c5d-8e9f-000000000001', { uid: '0d7c1e2f-3a4b-4c5d-8e9f-000000000001' }],
  ])('%j', (text, want) => {
    expect(parsePodRef(text)).toEqual(want);
  });

  it.each([
    ['ns/', '--pod: want namespace/name or a pod UID, got "ns/"'],
    ['/web', '--pod: want namespace/name or a pod UID, got "/web"'],
    ['a/b/c', '--pod: want namespace/name or a pod UID, got "a/b/c"'],
    ['web', '--pod: "web" is neither namespace/name nor a pod UID'],
    ['', '--pod: "" is neither namespace/name nor a pod UID'],
    ['a'.repeat(65), `--pod: "${'a'.repeat(65)}" is neither namespace/name nor a pod UID`],
  ])('refuses %j', (text, message) => {
    expect(() => parsePodRef(text)).toThrow(InvalidProbeError);
    expect(() => parsePodRef(text)).toThrow(message);
  });
});

describe('probe through the agent', () => {
  const UID = '0d7c1e2f-3a4b-4c5d-8e9f-000000000001';
  let fx: ApiFixture;
  let dir: string;
  let web: Server;
  let port: number;
  beforeAll(async () => {
    web = createServer((req, res) => {
      res.statusCode = req.url === '/fail' ? 503 : 200;
      res.end(req.url === '/fail' ? 'down' : 'ok');
    });
    await new Promise<void>((r) => web.listen(0, '127.0.0.1', r));
    port = (web.address() as AddressInfo).port;
    dir = mkdtempSync(path.join(tmpdir(), 'probe-remote-'));
    const pod = { uid: UID, namespace: 'tenant', name: 'web', sandboxId: 's1', netns: '/proc/self/ns/net', podIPs: ['127.0.0.1'], containers: [{ name: 'app', ports: [{ name: 'http', containerPort: 0 }] }] };
    fx = await startApiFixture({ prober: new LabProber({ pods: [pod], sockets: new NodeSocketFactory() }), dir });
  });
  afterAll(async () => {
    await fx?.close();
    web?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('probeThroughAgent resolves the outcome of a passing and a failing probe, by name or by UID', async () => {
    const spec = (p: string) => parseProbeText(JSON.stringify({ httpGet: { port, path: p }, timeoutSeconds: 5 }), { allowHandlerOnly: true });
    const ok = await probeThroughAgent({ socket: fx.socket, pod: 'tenant/web', spec: spec('/') });
    expect(ok.result).toBe('success');
    const fail = await probeThroughAgent({ socket: fx.socket, pod: UID, spec: spec('/fail') });
    expect(fail.result).toBe('failure');
    expect(fail.message).toContain('503');
  });

  it('the built CLI: exit 0, 1 and 2, with the agent\'s reason for an unknown pod', async () => {
    const spec = (p: string): string => JSON.stringify({ httpGet: { port, path: p }, timeoutSeconds: 5 });
    const ok = await runCli(['probe', '--socket', fx.socket, '--pod', 'tenant/web', '--spec', spec('/')]);
    expect(ok.code).toBe(0);
    expect(ok.stdout).toMatch(/^success/);
    const fail = await runCli(['probe', '--socket', fx.socket, '--pod', UID, '--spec', spec('/fail')]);
    expect(fail.code).toBe(1);
    expect(fail.stdout).toMatch(/^failure.*503/);
    const unknown = await runCli(['probe', '--socket', fx.socket, '--pod', 'tenant/gone', '--spec', spec('/')]);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toContain('pod tenant/gone is not known on this node');
    const bad = await runCli(['probe', '--socket', fx.socket, '--pod', 'a/b/c', '--spec', spec('/')]);
    expect(bad).toMatchObject({ code: 2, stderr: 'probe-agent probe: --pod: want namespace/name or a pod UID, got "a/b/c"\n' });
  }, 240_000);
});
