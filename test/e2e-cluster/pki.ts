/**
 * The one-node cluster's certificates, made with the openssl CLI in the run's scratch directory:
 * the cluster CA and what it signs (API server, controller-manager, scheduler, admin, the kubelet's
 * client and serving pairs, the API server's kubelet client), the service-account key pair, and the
 * two CAs docs/rewrite.md has an operator make without cert-manager (the webhook's serving CA and
 * the CA of the API server's admission client certificate).
 */
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';

export interface Pair {
  cert: string;
  key: string;
}

export interface IssueOptions {
  /** openssl -subj, e.g. "/CN=system:node:n/O=system:nodes". */
  subject: string;
  /** subjectAltName entries, e.g. ["IP:10.0.0.1", "DNS:kubernetes"]. */
  sans?: string[];
  client?: boolean;
  server?: boolean;
}

export class Pki {
  readonly dir: string;

  constructor(dir: string) {
    this.dir = dir;
  }

  #openssl(args: string[]): void {
    execFileSync('openssl', args, { stdio: ['ignore', 'ignore', 'pipe'], timeout: 30_000 });
  }

  /** A self-signed CA named `name`. */
  ca(name: string, cn: string): Pair {
    const p = this.#paths(name);
    this.#openssl(['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-keyout', p.key, '-out', p.cert,
      '-days', '30', '-subj', `/CN=${cn}`, '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign,digitalSignature']);
    return p;
  }

  /** A leaf pair signed by `ca`. */
  issue(name: string, ca: Pair, o: IssueOptions): Pair {
    const p = this.#paths(name);
    const csr = path.join(this.dir, `${name}.csr`);
    this.#openssl(['req', '-new', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-keyout', p.key, '-out', csr, '-subj', o.subject]);
    const usages = [...(o.server ? ['serverAuth'] : []), ...(o.client ? ['clientAuth'] : [])];
    const ext = path.join(this.dir, `${name}.ext`);
    writeFileSync(ext, [
      'basicConstraints=critical,CA:FALSE',
      'keyUsage=critical,digitalSignature,keyEncipherment',
      `extendedKeyUsage=${usages.join(',')}`,
      ...(o.sans?.length ? [`subjectAltName=${o.sans.join(',')}`] : []),
    ].join('\n'));
    this.#openssl(['x509', '-req', '-in', csr, '-CA', ca.cert, '-CAkey', ca.key, '-CAcreateserial', '-out', p.cert, '-days', '30', '-extfile', ext]);
    return p;
  }

  /** The service-account token signing pair (RSA: what every Kubernetes version accepts). */
  serviceAccountKeys(): { pub: string; key: string } {
    const key = path.join(this.dir, 'sa.key');
    const pub = path.join(this.dir, 'sa.pub');
    this.#openssl(['genrsa', '-out', key, '2048']);
    this.#openssl(['rsa', '-in', key, '-pubout', '-out', pub]);
    return { pub, key };
  }

  #paths(name: string): Pair {
    return { cert: path.join(this.dir, `${name}.crt`), key: path.join(this.dir, `${name}.key`) };
  }
}

/** A kubeconfig file for `user` (a client certificate) against `server`, trusting `ca`. */
export function writeKubeconfig(file: string, server: string, ca: string, user: Pair): string {
  const b64 = (f: string): string => readFileSync(f).toString('base64');
  writeFileSync(file, JSON.stringify({
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [{ name: 'e2e', cluster: { server, 'certificate-authority-data': b64(ca) } }],
    users: [{ name: 'e2e', user: { 'client-certificate-data': b64(user.cert), 'client-key-data': b64(user.key) } }],
    contexts: [{ name: 'e2e', context: { cluster: 'e2e', user: 'e2e' } }],
    'current-context': 'e2e',
  }, null, 2), { mode: 0o600 });
  return file;
}
