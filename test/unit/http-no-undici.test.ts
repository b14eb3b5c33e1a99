/**
 * Issue 19 lever 3: the daemon's HTTP probe path (our own HTTP/1.1 client since issue 44) never loads undici
 * (18-28 MB of RSS for its WASM parser and module graph). A separate Node process loads the
 * daemon's module graph, runs HTTP, HTTPS and redirected HTTP probes through runProbe, and reports
 * every module it loaded from node_modules/undici: there must be none.
 */
import { execFile, execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const AGENT_DIR = fileURLToPath(new URL('../../agent', import.meta.url));
const SCRIPT = fileURLToPath(new URL('../support/http-probe-modules.ts', import.meta.url));
let certDir = '';

beforeAll(() => {
  certDir = mkdtempSync(join(tmpdir(), 'http-no-undici-'));
  execFileSync('openssl', [
    'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', '1',
    '-keyout', join(certDir, 'key.pem'), '-out', join(certDir, 'cert.pem'), '-subj', '/CN=http-no-undici',
  ], { stdio: 'ignore' });
});
afterAll(() => rmSync(certDir, { recursive: true, force: true }));

describe('HTTP probes without undici', () => {
  it('an agent process that ran HTTP, HTTPS and redirected probes has loaded no undici module', async () => {
    const stdout = await new Promise<string>((resolve, reject) => {
      execFile(process.execPath, [SCRIPT, AGENT_DIR, join(certDir, 'cert.pem'), join(certDir, 'key.pem'), '3'], { timeout: 60_000 }, (err, out, errOut) =>
        err ? reject(new Error(`${err.message}\n${errOut}`)) : resolve(out));
    });
    const report = JSON.parse(stdout.trim().split('\n').at(-1) ?? '') as { results: string[]; undiciModules: number; firstUndiciModule: string | null };
    // The probes really ran, over each path the daemon uses for HTTP.
    expect(report.results).toEqual(['HTTP/ok=success:ok', 'HTTPS/ok=success:ok', 'HTTP/moved=success:ok']);
    expect(report.firstUndiciModule).toBeNull();
    expect(report.undiciModules).toBe(0);
  });
});
