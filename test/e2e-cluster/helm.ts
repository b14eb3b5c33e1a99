/**
 * The helm binary from `make kube-tools` (.tools/bin/helm, v4), as an operator runs it against the
 * run's cluster: every call is a process; its caches and config live in the run's scratch directory,
 * not the user's home. postRender() names a post-renderer plugin (helm 4 takes plugins only) that
 * applies the machine's node patches (overlay.ts nodePatches) with the user's kubectl's kustomize.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { KubectlResult } from './kubectl.ts';
import { nodePatches, type OverlayOptions } from './overlay.ts';

const POST_RENDERER = 'e2e-cluster-nodes';

export class Helm {
  readonly bin: string;
  readonly #kubeconfig: string;
  readonly #dir: string;

  constructor(repo: string, kubeconfig: string, scratch: string, kubectl: string, nodes: Pick<OverlayOptions, 'containerds' | 'nodesDir'>) {
    this.bin = path.join(repo, '.tools/bin/helm');
    this.#kubeconfig = kubeconfig;
    this.#dir = path.join(scratch, 'helm');
    const plugin = path.join(this.#dir, 'data/plugins', POST_RENDERER);
    const kustomization = path.join(this.#dir, 'post-render');
    mkdirSync(plugin, { recursive: true });
    mkdirSync(kustomization, { recursive: true });
    writeFileSync(path.join(kustomization, 'kustomization.yaml'), JSON.stringify({
      apiVersion: 'kustomize.config.k8s.io/v1beta1', kind: 'Kustomization', resources: ['rendered.yaml'],
      patches: nodePatches(nodes).map((p) => ({ patch: JSON.stringify(p) })),
    }));
    writeFileSync(path.join(plugin, 'plugin.yaml'), JSON.stringify({
      apiVersion: 'v1', type: 'postrenderer/v1', name: POST_RENDERER, version: '0.1.0', runtime: 'subprocess',
      runtimeConfig: { platformCommand: [{ command: path.join(plugin, 'render.sh') }] },
    }));
    writeFileSync(path.join(plugin, 'render.sh'), `#!/bin/sh\nset -e\ncat > '${kustomization}/rendered.yaml'\nexec '${kubectl}' kustomize '${kustomization}'\n`, { mode: 0o755 });
  }

  /** The flags that run the node patches over an install's or upgrade's manifests. */
  postRender(): string[] {
    return ['--post-renderer', POST_RENDERER];
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
