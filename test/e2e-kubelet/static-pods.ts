/**
 * The run's static pods: rewritten by `probe-agent rewrite` as a user would, handed to kubelet
 * through its staticPodPath, and removed again.
 */
import { execFileSync } from 'node:child_process';
import { rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { KubeletCri } from '../support/kubelet-cri.ts';
import type { Kubelet } from './kubelet.ts';
import { podsOf, waitFor } from './lib.ts';

export interface PhaseContext {
  kubelet: Kubelet;
  manifests: string;
  scratch: string;
  /** bin/probe-agent */
  cli: string;
  /** Straight to containerd. */
  cri: KubeletCri;
  shimMetricsPort: number;
}

/** A pod as `probe-agent rewrite` rewrites it (as a user would; the original is kept in the scratch dir). */
export function rewritePod(ctx: PhaseContext, pod: Record<string, unknown>): Record<string, any> {
  const name = (pod.metadata as { name: string }).name;
  const src = path.join(ctx.scratch, `${name}.json`);
  writeFileSync(src, JSON.stringify(pod));
  return JSON.parse(execFileSync(ctx.cli, ['rewrite', '-f', src, '--output', 'json'], { encoding: 'utf8' })) as Record<string, any>;
}

/** Rewrites a pod and hands it to kubelet; returns the rewritten pod. */
export function placePod(ctx: PhaseContext, pod: Record<string, unknown>): Record<string, any> {
  const out = rewritePod(ctx, pod);
  writeFileSync(path.join(ctx.manifests, `${out['metadata'].name}.json`), JSON.stringify(out));
  return out;
}

/** Removes pods' manifests and waits until kubelet no longer lists them. */
export async function removePods(ctx: PhaseContext, names: string[], timeoutMs = 60_000): Promise<boolean> {
  for (const n of names) rmSync(path.join(ctx.manifests, `${n}.json`), { force: true });
  return (await waitFor(`${names.join(', ')} to go`, timeoutMs, async () => {
    const left = (await podsOf(ctx.kubelet.setup.roPort)).filter((p) => names.includes(p.name));
    return left.length === 0 || undefined;
  }, 500)) === true;
}

