import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import path from 'node:path';

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
