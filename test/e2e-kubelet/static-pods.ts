/**
 * The run's static pods: rewritten by `probe-agent rewrite` as a user would, handed to kubelet
 * through its staticPodPath, and removed again.
 */
import { execFileSync } from 'node:child_process';
import { renameSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { RuntimeLab } from '../lab/containerd.ts';
import type { KubeletCri } from '../support/kubelet-cri.ts';
import type { Kubelet } from './kubelet.ts';
import { NODE_NAME, podsOf, waitFor } from './lib.ts';

export interface PhaseContext {
  kubelet: Kubelet;
  manifests: string;
  scratch: string;
  /** bin/probe-agent */
  cli: string;
  /** Straight to the runtime. */
  cri: KubeletCri;
  shimMetricsPort: number;
  /** The runtime's log file. */
  runtimeLog: string;
  /** The lab runtime (containerd or CRI-O). */
  runtime: RuntimeLab;
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
  writeManifest(ctx.manifests, out['metadata'].name, JSON.stringify(out));
  return out;
}

/**
 * Writes a static pod file whole: kubelet's inotify watch reads a file as it is being written
 * ("couldn't parse as pod"), and it ignores hidden files, so the file is renamed into place.
 */
export function writeManifest(dir: string, name: string, text: string): void {
  const tmp = path.join(dir, `.${name}.json.tmp`);
  writeFileSync(tmp, text);
  renameSync(tmp, path.join(dir, `${name}.json`));
}

/** Removes the manifest writeManifest wrote for `name` (gone already is fine). */
export function removeManifest(dir: string, name: string): void {
  rmSync(path.join(dir, `${name}.json`), { force: true });
}

/**
 * Removes pods' manifests and waits until kubelet no longer lists them and the runtime runs none of
 * their containers: a kubelet that has just started drops a removed static pod from /pods but skips
 * killing it until its sources are ready ("Failed to delete pod"), and then stops it as an orphan.
 */
export async function removePods(ctx: PhaseContext, names: string[], timeoutMs = 90_000): Promise<boolean> {
  for (const n of names) removeManifest(ctx.manifests, n);
  const full = new Set(names.map((n) => `${n}-${NODE_NAME}`));
  return (await waitFor(`${names.join(', ')} to go`, timeoutMs, async () => {
    const listed = (await podsOf(ctx.kubelet.setup.roPort)).filter((p) => names.includes(p.name));
    const r = await ctx.cri.call<{ containers: { labels: Record<string, string> }[] }>('ListContainers', { filter: { state: { state: 'CONTAINER_RUNNING' } } });
    const running = r.ok ? r.msg.containers.filter((c) => full.has(c.labels['io.kubernetes.pod.name'] ?? '')).length : 1;
    return (listed.length === 0 && running === 0) || undefined;
  }, 500)) === true;
}

