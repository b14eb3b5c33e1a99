/**
 * KubeletClient against the real fake kubelet (HTTPS and HTTP on 127.0.0.1): TLS modes, bearer
 * tokens and their rotation, and every failure kind.
 */
import { mkdirSync, mkdtempSync, renameSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ConfigError } from '../../agent/errors.ts';
import { KubeletClient, KubeletError, type KubeletClientOptions, type KubeletErrorKind } from '../../agent/pods/kubelet-client.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { makePods } from '../support/pod-factory.ts';

let kubelet: FakeKubelet;
let dir: string;
const clients: KubeletClient[] = [];

beforeAll(async () => {
  kubelet = await FakeKubelet.start({ pods: makePods(3) });
  dir = mkdtempSync(join(tmpdir(), 'kubelet-client-test-'));
});
afterAll(async () => {
  await kubelet.stop();
  rmSync(dir, { recursive: true, force: true });
});
afterEach(async () => {
  await kubelet.setFault('none');
  kubelet.setToken(undefined);
  await Promise.all(clients.splice(0).map((c) => c.close()));
});

function client(opts: Partial<KubeletClientOptions> = {}): KubeletClient {
  const c = new KubeletClient({ url: kubelet.httpsUrl, caFile: kubelet.certs.caFile, timeoutMs: 2000, ...opts });
  clients.push(c);
  return c;
}

async function failure(p: Promise<unknown>): Promise<KubeletError> {
  const err = await p.then(() => undefined, (e: unknown) => e);
  expect(err).toBeInstanceOf(KubeletError);
  return err as KubeletError;
}

async function expectKind(p: Promise<unknown>, kind: KubeletErrorKind): Promise<KubeletError> {
  const err = await failure(p);
  expect(err.kind, err.message).toBe(kind);
  return err;
}

const itemCount = (json: unknown): number => ((json as { items: unknown[] }).items).length;

describe('TLS', () => {
  it('accepts the kubelet certificate with the right CA file', async () => {
    expect(itemCount(await client().getPods())).toBe(3);
    expect(kubelet.requests.at(-1)).toMatchObject({ transport: 'https', method: 'GET', url: '/pods' });
  });

  it('rejects a certificate signed by another CA, and says how to fix it', async () => {
    const err = await expectKind(client({ caFile: kubelet.certs.otherCaFile }).getPods(), 'unreachable');
    expect(err.message).toMatch(/TLS to the kubelet failed.*--kubelet-ca-file.*--kubelet-insecure-tls/);
  });

  it('rejects the self-signed chain with the system trust store (no CA file, no insecure flag)', async () => {
    await expectKind(client({ caFile: undefined }).getPods(), 'unreachable');
  });

  it('accepts any certificate with the explicit insecure flag', async () => {
    expect(itemCount(await client({ caFile: undefined, insecureTLS: true }).getPods())).toBe(3);
  });

  it('verifies against tlsServerName instead of the URL IP', async () => {
    expect(itemCount(await client({ tlsServerName: 'localhost' }).getPods())).toBe(3);
    const err = await expectKind(client({ tlsServerName: 'node-b.example' }).getPods(), 'unreachable');
    expect(err.message).toMatch(/TLS/);
  });

  it('speaks plain http to a read-only port', async () => {
    expect(itemCount(await client({ url: kubelet.httpUrl, caFile: undefined }).getPods())).toBe(3);
    expect(kubelet.requests.at(-1)?.transport).toBe('http');
  });
});

describe('bearer token', () => {
  it('sends no Authorization header without a token file', async () => {
    await client().getPods();
    expect(kubelet.lastHeaders()?.authorization).toBeUndefined();
    expect(kubelet.lastHeaders()?.accept).toBe('application/json');
  });

  it('401 without a token and 403 with a wrong one, both naming the RBAC needed', async () => {
    kubelet.setToken('right-token');
    const e401 = await expectKind(client().getPods(), 'unauthorized');
    expect(e401.status).toBe(401);
    expect(e401.message).toMatch(/get on nodes\/pods, or nodes\/proxy on clusters before 1\.33/);
    const file = join(dir, 'wrong-token');
    writeFileSync(file, 'wrong-token\n');
    const e403 = await expectKind(client({ tokenFile: file }).getPods(), 'unauthorized');
    expect(e403.status).toBe(403);
    expect(e403.message).toMatch(/HTTP 403 \(Forbidden \(user=.*subresource\(s\)=\[pods\]\)\).*nodes\/pods/);
  });

  it('picks up a rotated projected token (atomic ..data symlink swap)', async () => {
    const vol = join(dir, 'projected');
    mkdirSync(join(vol, '..2025_11_20_08_00_00.1'), { recursive: true });
    writeFileSync(join(vol, '..2025_11_20_08_00_00.1', 'token'), 'token-one');
    symlinkSync('..2025_11_20_08_00_00.1', join(vol, '..data'));
    symlinkSync('..data/token', join(vol, 'token'));
    kubelet.setToken('token-one');
    const c = client({ tokenFile: join(vol, 'token') });
    await c.getPods();
    expect(kubelet.lastHeaders()?.authorization).toBe('Bearer token-one');

    mkdirSync(join(vol, '..2025_11_20_09_00_00.2'));
    writeFileSync(join(vol, '..2025_11_20_09_00_00.2', 'token'), 'token-two');
    symlinkSync('..2025_11_20_09_00_00.2', join(vol, '..data_tmp'));
    renameSync(join(vol, '..data_tmp'), join(vol, '..data'));
    kubelet.setToken('token-two');
    await c.getPods();
    expect(kubelet.lastHeaders()?.authorization).toBe('Bearer token-two');
  });

  it('fails with a typed error when the token file cannot be read at all', async () => {
    const before = kubelet.requestCount;
    const err = await expectKind(client({ tokenFile: join(dir, 'missing-token') }).getPods(), 'unauthorized');
    expect(err.message).toMatch(/cannot read kubelet bearer token file .*missing-token/);
    // Sending the request anonymously instead would hide the misconfiguration behind a 401.
    expect(kubelet.requestCount).toBe(before);
  });

  it('keeps the last good token while the file is briefly missing', async () => {
    const file = join(dir, 'flappy-token');
    writeFileSync(file, 'stable');
    kubelet.setToken('stable');
    const c = client({ tokenFile: file });
    await c.getPods();
    rmSync(file);
    await c.getPods();
    expect(kubelet.lastHeaders()?.authorization).toBe('Bearer stable');
  });
});

describe('failures', () => {
  it('times out on a slow kubelet within the request timeout', async () => {
    await kubelet.setFault('slow', { delayMs: 3000 });
    const t0 = performance.now();
    const err = await expectKind(client({ timeoutMs: 200 }).getPods(), 'timeout');
    // Ended by the 200 ms timeout, not by the kubelet's answer at 3 s.
    expect(performance.now() - t0).toBeLessThan(2500);
    expect(err.message).toMatch(/200 ms/);
  });

  it('reports HTTP 500 as http-status with the status', async () => {
    await kubelet.setFault('status-500');
    const err = await expectKind(client().getPods(), 'http-status');
    expect(err.status).toBe(500);
    expect(err.message).toMatch(/HTTP 500 \(Internal Server Error: pod manager not ready\)/);
  });

  it('reports truncated and non-JSON bodies as malformed', async () => {
    await kubelet.setFault('truncated');
    await expectKind(client().getPods(), 'malformed');
    await kubelet.setFault('malformed');
    const err = await expectKind(client().getPods(), 'malformed');
    expect(err.message).toMatch(/invalid JSON/);
  });

  it('reports a connection dropped mid-body as unreachable', async () => {
    await kubelet.setFault('cut');
    await expectKind(client().getPods(), 'unreachable');
  });

  it('stops reading a streamed answer over the cap and drops the connection', async () => {
    await kubelet.setFault('huge', { hugeBytes: 32 * 1024 * 1024 });
    const before = kubelet.abortedResponses;
    const t0 = performance.now();
    await expectKind(client({ maxResponseBytes: 1024 * 1024 }).getPods(), 'too-large');
    expect(performance.now() - t0).toBeLessThan(10_000);
    await expect.poll(() => kubelet.abortedResponses, { timeout: 2000 }).toBe(before + 1);
  });

  it('refuses a declared Content-Length over the cap before reading the body', async () => {
    await kubelet.setFault('huge', { hugeBytes: 32 * 1024 * 1024, contentLength: true });
    const before = kubelet.abortedResponses;
    const err = await expectKind(client({ maxResponseBytes: 1024 * 1024 }).getPods(), 'too-large');
    expect(err.message).toMatch(/1048576-byte cap/);
    await expect.poll(() => kubelet.abortedResponses, { timeout: 2000 }).toBe(before + 1);
  });

  it('reads an answer just under the cap', async () => {
    await kubelet.setFault('huge', { hugeBytes: 512 * 1024 });
    expect(itemCount(await client({ maxResponseBytes: 1024 * 1024 }).getPods())).toBe(0);
  });

  it('reports a closed port and a reset connection as unreachable', async () => {
    await kubelet.setFault('reset');
    await expectKind(client().getPods(), 'unreachable');
    await kubelet.setFault('down');
    const err = await expectKind(client().getPods(), 'unreachable');
    expect(err.message).toMatch(/ECONNREFUSED/);
  });

  it("rejects with the caller's abort reason, not a kubelet error", async () => {
    await kubelet.setFault('slow', { delayMs: 3000 });
    const ctl = new AbortController();
    const p = client().getPods(ctl.signal);
    setTimeout(() => ctl.abort(new Error('agent shutting down')), 50);
    await expect(p).rejects.toThrow('agent shutting down');
  });
});

describe('configuration errors', () => {
  const bad: [string, KubeletClientOptions][] = [
    ['not a URL', { url: 'node-a:10250' }],
    ['a non-http scheme', { url: 'ftp://127.0.0.1/' }],
    ['credentials in the URL', { url: 'https://user:pw@127.0.0.1:10250' }],
    ['a query', { url: 'https://127.0.0.1:10250/?x=1' }],
    ['TLS options on http', { url: 'http://127.0.0.1:10255', insecureTLS: true }],
    ['CA file plus insecure', { url: 'https://127.0.0.1:10250', insecureTLS: true, caFile: '/etc/hostname' }],
    ['a missing CA file', { url: 'https://127.0.0.1:10250', caFile: '/nonexistent/ca.crt' }],
    ['a CA file without PEM', { url: 'https://127.0.0.1:10250', caFile: '/etc/hostname' }],
    ['a zero timeout', { url: 'https://127.0.0.1:10250', timeoutMs: 0 }],
    ['a fractional size cap', { url: 'https://127.0.0.1:10250', maxResponseBytes: 1.5 }],
  ];
  it.each(bad)('refuses %s with ConfigError', (_what, opts) => {
    expect(() => new KubeletClient(opts)).toThrow(ConfigError);
  });

  it('appends /pods to a base path (apiserver node proxy style)', async () => {
    const c = client({ url: `${kubelet.httpsUrl}/api/v1/nodes/node-a/proxy/` });
    await expectKind(c.getPods(), 'http-status');
    expect(kubelet.requests.at(-1)?.url).toBe('/api/v1/nodes/node-a/proxy/pods');
  });
});
