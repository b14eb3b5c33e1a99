/**
 * The kubectl the user gave (KUBE_BIN_DIR/kubectl), as an operator runs it: every call is a
 * process, its output and exit status are what the checks read.
 */
import { spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { request } from 'node:https';
import path from 'node:path';

export interface KubectlResult {
  ok: boolean;
  stdout: string;
  stderr: string;
}

export class Kubectl {
  readonly bin: string;
  readonly kubeconfig: string;

  constructor(binDir: string, kubeconfig: string) {
    this.bin = path.join(binDir, 'kubectl');
    this.kubeconfig = kubeconfig;
  }

  run(args: string[], input?: string, timeoutMs = 60_000): KubectlResult {
    const r = spawnSync(this.bin, ['--kubeconfig', this.kubeconfig, ...args], { encoding: 'utf8', input, timeout: timeoutMs, maxBuffer: 64 << 20 });
    return { ok: r.status === 0, stdout: r.stdout ?? '', stderr: (r.stderr ?? '') + (r.error ? String(r.error) : '') };
  }

  /** Like run, but throws with kubectl's stderr when it fails. */
  must(args: string[], input?: string, timeoutMs?: number): string {
    const r = this.run(args, input, timeoutMs);
    if (!r.ok) throw new Error(`kubectl ${args.join(' ')}: ${r.stderr.trim().slice(0, 600)}`);
    return r.stdout;
  }

  /** `kubectl get ... -o json`, parsed; undefined when it fails. */
  json<T = any>(args: string[]): T | undefined {
    const r = this.run(['get', ...args, '-o', 'json']);
    return r.ok ? (JSON.parse(r.stdout) as T) : undefined;
  }

  /** `kubectl get --raw PATH`: the body, or '' on any failure. */
  raw(p: string): string {
    const r = this.run(['get', '--raw', p], undefined, 10_000);
    return r.ok ? r.stdout.trim() : '';
  }

  /** The same kubectl as a bearer token's holder (a kubeconfig with the token only, no client certificate). */
  withToken(token: string, file: string): Kubectl {
    const cfg = JSON.parse(readFileSync(this.kubeconfig, 'utf8')) as { clusters: unknown[] };
    writeFileSync(file, JSON.stringify({
      apiVersion: 'v1', kind: 'Config', clusters: cfg.clusters,
      users: [{ name: 'token', user: { token } }],
      contexts: [{ name: 'token', context: { cluster: 'e2e', user: 'token' } }],
      'current-context': 'token',
    }), { mode: 0o600 });
    return new Kubectl(path.dirname(this.bin), file);
  }

  /**
   * PATCH of an API path as this kubeconfig's token holder (withToken), sent as is: `kubectl patch`
   * reads the object first, which a writer granted patch and no get (the gates agent) may not.
   */
  patchRaw(p: string, body: object, type = 'application/strategic-merge-patch+json'): Promise<KubectlResult> {
    const cfg = JSON.parse(readFileSync(this.kubeconfig, 'utf8')) as { clusters: Array<{ cluster: { server: string; 'certificate-authority-data': string } }>; users: Array<{ user: { token?: string } }> };
    const { server, 'certificate-authority-data': ca } = cfg.clusters[0]!.cluster;
    const token = cfg.users[0]?.user.token;
    return new Promise((resolve) => {
      const req = request(new URL(p, server), {
        method: 'PATCH', ca: Buffer.from(ca, 'base64'), timeout: 30_000,
        headers: { 'content-type': type, accept: 'application/json', ...(token ? { authorization: `Bearer ${token}` } : {}) },
      }, (res) => {
        let text = '';
        res.on('data', (d: Buffer) => (text += d.toString()));
        res.on('end', () => {
          const ok = (res.statusCode ?? 0) >= 200 && (res.statusCode ?? 0) < 300;
          let message = text;
          try { message = String((JSON.parse(text) as { message?: unknown }).message ?? text); } catch { /* not JSON */ }
          resolve({ ok, stdout: ok ? text : '', stderr: ok ? '' : `HTTP ${res.statusCode}: ${message}` });
        });
      });
      req.on('error', (err) => resolve({ ok: false, stdout: '', stderr: String(err) }));
      req.on('timeout', () => req.destroy(new Error('timeout')));
      req.end(JSON.stringify(body));
    });
  }

  /** `kubectl apply -f -` of objects. */
  apply(objects: object[]): KubectlResult {
    return this.run(['apply', '-f', '-'], objects.map((o) => JSON.stringify(o)).join('\n'));
  }
}
