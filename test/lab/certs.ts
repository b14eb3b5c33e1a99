/**
 * The lab's self-signed TLS certificate for the pod servers' HTTPS ports. Made once with the
 * openssl CLI and cached under /run/probe-agent-lab/certs; creation is atomic (build in a private
 * directory, rename into place) so parallel test processes never read a half-written key.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, renameSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { LAB_ROOT, LabError } from './slots.ts';

/** Where the cached certificate lives. */
export const CERT_DIR = join(LAB_ROOT, 'certs');

/** Paths of the lab certificate (PEM) and its private key (PEM). */
export interface LabCert {
  certPath: string;
  keyPath: string;
}

/** Returns the cached lab certificate, creating it first when missing. */
export function ensureLabCert(): LabCert {
  const cert: LabCert = { certPath: join(CERT_DIR, 'cert.pem'), keyPath: join(CERT_DIR, 'key.pem') };
  if (existsSync(cert.certPath) && existsSync(cert.keyPath)) return cert;
  mkdirSync(LAB_ROOT, { recursive: true });
  const tmp = mkdtempSync(join(LAB_ROOT, 'certs.tmp.'));
  try {
    execFileSync('openssl', [
      'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
      '-keyout', join(tmp, 'key.pem'), '-out', join(tmp, 'cert.pem'), '-days', '3650',
      '-subj', '/CN=probe-agent-lab',
      '-addext', 'subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1',
    ], { stdio: ['ignore', 'ignore', 'pipe'], timeout: 30_000 });
    try {
      renameSync(tmp, CERT_DIR);
    } catch (err) {
      // Another process won the race: its certificate is as good as ours.
      if (!['EEXIST', 'ENOTEMPTY'].includes((err as NodeJS.ErrnoException).code ?? '')) throw err;
    }
  } catch (err) {
    const stderr = (err as { stderr?: Buffer }).stderr?.toString().trim();
    if (!existsSync(cert.certPath)) {
      throw new LabError(`cannot create the lab certificate with openssl: ${stderr || String(err)}`, {}, { cause: err });
    }
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
  return cert;
}
