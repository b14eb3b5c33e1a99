/**
 * Which runtime an end-to-end run uses, from its environment (the make targets pass them on):
 * RUNTIME=containerd (default) with CONTAINERD_BIN=/path/to/containerd (its containerd-shim-runc-v2
 * and ctr beside it; E2E_CONTAINERD_BIN, the older name, too; none: Debian's on PATH), or
 * RUNTIME=crio with CRIO_BIN=/path/to/crio (pinns beside it). Starts that runtime's lab.
 */
import { existsSync } from 'node:fs';
import path from 'node:path';
import { createContainerdLab, type RuntimeKind, type RuntimeLab } from './containerd.ts';
import { createCrioLab } from './crio.ts';

export interface RuntimeChoice {
  kind: RuntimeKind;
  /** The daemon's binary; undefined: Debian's containerd on PATH. */
  binary: string | undefined;
}

/** The run's runtime, or the reason the environment names none that can run. */
export function runtimeChoice(env: NodeJS.ProcessEnv = process.env): RuntimeChoice | { error: string } {
  const kind = env['RUNTIME'] || 'containerd';
  if (kind === 'containerd') {
    const bin = env['CONTAINERD_BIN'] || env['E2E_CONTAINERD_BIN'] || undefined;
    if (bin && !existsSync(path.join(path.dirname(bin), 'containerd-shim-runc-v2'))) return { error: `CONTAINERD_BIN=${bin}: no containerd-shim-runc-v2 beside it` };
    if (bin && !existsSync(bin)) return { error: `CONTAINERD_BIN=${bin} does not exist` };
    return { kind, binary: bin };
  }
  if (kind === 'crio') {
    const bin = env['CRIO_BIN'];
    if (!bin) return { error: 'RUNTIME=crio needs CRIO_BIN=/path/to/crio (pinns beside it)' };
    if (!existsSync(bin) || !existsSync(path.join(path.dirname(bin), 'pinns'))) return { error: `CRIO_BIN=${bin}: crio and pinns beside it must exist` };
    return { kind, binary: bin };
  }
  return { error: `RUNTIME=${kind}: containerd or crio` };
}

export interface RuntimeLabOptions {
  registryMirrors?: Record<string, string[]>;
  routes?: string[];
}

/** Starts the chosen runtime's lab. */
export function createRuntimeLab(choice: RuntimeChoice, opts: RuntimeLabOptions = {}): Promise<RuntimeLab> {
  if (choice.kind === 'crio') return createCrioLab({ ...opts, binary: choice.binary! });
  return createContainerdLab({ ...opts, ...(choice.binary ? { binary: choice.binary } : {}) });
}

/** "containerd 2.3.4 (/path)" / "cri-o 1.36.3 (/path)", from the runtime's own Version answer. */
export async function describeRuntime(lab: RuntimeLab, choice: RuntimeChoice): Promise<string> {
  const v = await lab.client.version().catch(() => undefined);
  return `${v ? `${v.runtimeName} ${v.runtimeVersion}` : lab.kind} (${choice.binary ?? 'Debian\'s, on PATH'})`;
}
