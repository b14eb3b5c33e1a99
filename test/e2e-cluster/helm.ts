/**
 * The helm binary from `make kube-tools` (.tools/bin/helm, v4), as an operator runs it against the
 * run's cluster: every call is a process; its caches and config live in the run's scratch directory,
 * not the user's home.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { KubectlResult } from './kubectl.ts';

export class Helm {
  readonly bin: string;
  readonly #kubeconfig: string;
  readonly #dir: string;

  constructor(repo: string, kubeconfig: string, scratch: string) {
    this.bin = path.join(repo, '.tools/bin/helm');
    this.#kubeconfig = kubeconfig;
    this.#dir = path.join(scratch, 'helm');
    mkdirSync(this.#dir, { recursive: true });
  }

  static available(repo: string): boolean {
    return existsSync(path.join(repo, '.tools/bin/helm'));
  }

  run(args: string[], timeoutMs = 180_000): KubectlResult {
    const r = spawnSync(this.bin, ['--kubeconfig', this.#kubeconfig, ...args], {
      encoding: 'utf8', timeout: timeoutMs, maxBuffer: 64 << 20,
      env: { ...process.env, HELM_CACHE_HOME: path.join(this.#dir, 'cache'), HELM_CONFIG_HOME: path.join(this.#dir, 'config'), HELM_DATA_HOME: path.join(this.#dir, 'data') },
    });
    return { ok: r.status === 0, stdout: r.stdout ?? '', stderr: (r.stderr ?? '') + (r.error ? String(r.error) : '') };
  }

  /** A values file (JSON is YAML) for -f. */
  values(name: string, values: object): string {
    const file = path.join(this.#dir, `${name}.values.json`);
    writeFileSync(file, JSON.stringify(values, null, 2));
    return file;
  }
}
