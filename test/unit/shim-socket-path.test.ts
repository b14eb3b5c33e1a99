/**
 * Kubelet's runtime endpoint (the shim's cri.sock) never lies in a directory the agent's pod can
 * write: the shim's default --listen (both entry points), the systemd unit's --listen, the
 * installer's socket and the kubelet configuration the docs give all name
 * /run/probe-agent-shim/cri.sock, in a root-only 0700 directory of the shim's own; the agent
 * DaemonSet (base and every component that patches it) mounts no host path holding it writable.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { SHIM_FLAGS } from '../../agent/shim/flags.ts';
import { builtEntry } from '../support/built-cli.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const COMPONENT = path.join(ROOT, 'deploy/components/kubelet-shim');
const SOCKET = '/run/probe-agent-shim/cri.sock';
type Obj = Record<string, any>;

let kubectlChecked = false;

function render(components: string[]): Obj[] {
  if (!kubectlChecked) {
    const r = spawnSync('kubectl', ['version', '--client', '-o', 'json'], { encoding: 'utf8' });
    if (r.error) throw new Error('kubectl not found: this test renders deploy/ with `kubectl kustomize` (kubectl >= 1.21)');
    kubectlChecked = true;
  }
  const dir = mkdtempSync(path.join(tmpdir(), 'shim-socket-'));
  try {
    const rel = (p: string): string => path.relative(dir, path.join(ROOT, 'deploy', p));
    writeFileSync(path.join(dir, 'kustomization.yaml'), `resources: [${rel('base')}]\ncomponents: [${components.map((c) => rel(`components/${c}`)).join(', ')}]\n`);
    return parseAllDocuments(execFileSync('kubectl', ['kustomize', dir], { encoding: 'utf8' })).map((d) => d.toJS() as Obj);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Host paths the agent DaemonSet's containers mount writable. */
function agentWritableHostPaths(objects: Obj[]): string[] {
  const ds = objects.find((o) => o.kind === 'DaemonSet' && o.metadata.name === 'probe-agent')!;
  const spec = ds.spec.template.spec;
  const hostPathOf = new Map<string, string>((spec.volumes as Obj[]).filter((v) => v.hostPath).map((v) => [v.name, v.hostPath.path]));
  return (spec.containers as Obj[]).flatMap((c) => (c.volumeMounts ?? []) as Obj[])
    .filter((m) => m.readOnly !== true && hostPathOf.has(m.name))
    .map((m) => path.posix.join(hostPathOf.get(m.name)!, m.subPath ?? ''));
}

const inside = (file: string, dir: string): boolean => file === dir || file.startsWith(`${dir.replace(/\/$/, '')}/`);

describe("the shim's socket", () => {
  const unit = readFileSync(path.join(COMPONENT, 'probe-agent-shim.service'), 'utf8');

  it('is /run/probe-agent-shim/cri.sock for the shim, the CLI, the unit, the installer and the docs', () => {
    expect(SHIM_FLAGS.listen.default).toBe(`unix://${SOCKET}`);
    const help = execFileSync(process.execPath, [builtEntry('cli.js'), 'shim', '--help'], { encoding: 'utf8' });
    expect(help.replace(/\s+/g, ' ')).toContain(`(default: "unix://${SOCKET}")`);
    expect(/--listen (\S+)/.exec(unit)?.[1]).toBe(`unix://${SOCKET}`);
    expect(readFileSync(path.join(COMPONENT, 'install-shim.sh'), 'utf8')).toMatch(new RegExp(`^SHIM_SOCKET=\\$\\{SHIM_SOCKET:-${SOCKET}\\}$`, 'm'));
    const docs = readFileSync(path.join(ROOT, 'docs/closing-the-hole.md'), 'utf8');
    expect(docs).toContain(`containerRuntimeEndpoint: unix://${SOCKET}`);
    expect(readFileSync(path.join(ROOT, 'README.md'), 'utf8')).toContain(`--listen unix://${SOCKET}`);
  });

  it('lives in a 0700 runtime directory of the shim alone, the only path the unit may write', () => {
    expect(unit).toMatch(/^RuntimeDirectory=probe-agent-shim$/m);
    expect(unit).toMatch(/^RuntimeDirectoryMode=0700$/m);
    expect(unit.match(/^ReadWritePaths=.*$/gm)).toEqual(['ReadWritePaths=/run/probe-agent-shim']);
  });

  it('is outside every host path the agent DaemonSet mounts writable, in every component that patches it', () => {
    // The paths as configured (the shim's default and the unit's flag), not the constant above.
    const sockets = [SHIM_FLAGS.listen.default.replace(/^unix:\/\//, ''), /--listen unix:\/\/(\S+)/.exec(unit)![1]!];
    const components = readdirSync(path.join(ROOT, 'deploy/components')).filter((c) => c !== 'rewrite-webhook');
    for (const c of components) {
      const writable = agentWritableHostPaths(render([c]));
      expect(writable.length, c).toBeGreaterThan(0);
      for (const p of writable) for (const s of sockets) expect(inside(s, p), `${c}: ${p} holds ${s}`).toBe(false);
    }
    // One kubectl kustomize per component: seconds each on a busy machine.
  }, 180_000);
});
