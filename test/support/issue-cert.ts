import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, expect } from 'vitest';
import { ConfigError } from '../../agent/errors.ts';

function openssl(args: string[]): void {
  execFileSync('openssl', args, { stdio: ['ignore', 'ignore', 'pipe'] });
}

/** A CA and a certificate it signed for `cn` with extension `ext`, in `dir`: `<name>-ca.crt`, `<name>.crt`, `<name>.key`. */
export function issueCert(dir: string, name: string, cn: string, ext: string): void {
  const f = (file: string): string => path.join(dir, file);
  openssl(['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', f(`${name}-ca.key`), '-out', f(`${name}-ca.crt`), '-days', '2', '-subj', `/CN=${name} CA`]);
  openssl(['req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', f(`${name}.key`), '-out', f(`${name}.csr`), '-subj', `/CN=${cn}`]);
  writeFileSync(f(`${name}.ext`), `${ext}\n`);
  openssl(['x509', '-req', '-in', f(`${name}.csr`), '-CA', f(`${name}-ca.crt`), '-CAkey', f(`${name}-ca.key`), '-CAcreateserial', '-out', f(`${name}.crt`), '-days', '2', '-extfile', f(`${name}.ext`)]);
}

/** A certificate for issueCert: its file name, common name and extension. */
export type CertSpec = readonly [name: string, cn: string, ext: string];

/**
 * A temp directory with `certs` issued into it before the calling file's tests, removed after them.
 * Returns the path of a file in it.
 */
export function useCertDir(prefix: string, certs: readonly CertSpec[]): (file: string) => string {
  let dir = '';
  beforeAll(() => {
    dir = mkdtempSync(path.join(tmpdir(), prefix));
    for (const [name, cn, ext] of certs) issueCert(dir, name, cn, ext);
  });
  afterAll(() => {
    if (dir) rmSync(dir, { recursive: true, force: true });
  });
  return (file) => {
    if (!dir) throw new Error('the certificate directory exists only while the tests run');
    return path.join(dir, file);
  };
}

/** The message of the ConfigError `fn` throws; fails the test when it throws nothing or something else. */
export function configRefusal(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    return (err as Error).message;
  }
  throw new Error('not refused');
}
