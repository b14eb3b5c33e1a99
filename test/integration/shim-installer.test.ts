/**
 * The kubelet-shim installer (deploy/components/kubelet-shim/install-shim.sh) against a scratch
 * host root: it installs a self-sufficient shim (dist/, package.json and node; no node_modules)
 * and its unit, the unit passes `systemd-analyze verify` in that root, the installed shim runs,
 * and the node label follows reality: "ready" only once kubelet's runtime endpoint names the shim
 * AND the real shim counts a kubelet-shaped client's calls (grpc-go, relisting through the shim to
 * a real containerd), never on configuration alone; removed only on unlabel/uninstall, which read
 * the node's pods from its kubelet. systemd is not PID 1 here: the host's systemctl is a recorder,
 * the API server a recorder of the label patches and the kubelet's /pods a test kubelet (the only
 * stand-ins; everything else is real).
 */
import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { chmodSync, cpSync, existsSync, lstatSync, mkdirSync, mkdtempSync, readFileSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { nodeObject, startApiServerStandIn, type ApiServerStandIn } from '../support/api-server-standin.ts';
import { builtRepo } from '../support/built-cli.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { GrpcGoCri, relist } from '../support/grpc-go-cri.ts';
import { createContainerdLab, type ContainerdLab } from '../lab/containerd.ts';
import { ApiServerReader } from '../../agent/webhook/cluster-reader.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const COMPONENT = path.join(ROOT, 'deploy/components/kubelet-shim');
const SCRIPT = path.join(COMPONENT, 'install-shim.sh');
const VERSION = (JSON.parse(readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;
/** The proof's window in these tests: 2 intervals of 1 s, at least 2 calls in each (kubelet's relist makes ~2 a second). */
const PROOF_ENV = { KUBELET_CALLS_INTERVAL: '1', KUBELET_CALLS_ROUNDS: '2', KUBELET_CALLS_MIN: '2' };

let ctrd: ContainerdLab | undefined;
/** The runtime behind the shim: a real containerd, started once for the file. */
async function runtime(): Promise<ContainerdLab> {
  ctrd ??= await createContainerdLab();
  return ctrd;
}
afterAll(async () => {
  await ctrd?.destroy();
}, 60_000);

/**
 * Starts a shim (its node and dist/ from `cur`) on the host root's paths: kubelet's socket and the
 * metrics socket the installer reads, in front of the lab's containerd.
 */
async function startShimAt(hostRoot: string, cur = builtRepo(), nodeBin = process.execPath): Promise<ChildProcess & { socket: string }> {
  const ctr = await runtime();
  const sock = path.join(hostRoot, 'run/probe-agent-shim/cri.sock');
  const child = spawn(nodeBin, [path.join(cur, 'dist/shim/main.js'), '--listen', `unix://${sock}`,
    '--runtime-endpoint', ctr.endpoint, '--probe-socket', path.join(hostRoot, 'no-agent.sock'),
    '--metrics-socket', path.join(hostRoot, 'run/probe-agent-shim/metrics.sock')],
  { stdio: ['ignore', 'ignore', 'pipe'], cwd: '/' });
  await new Promise<void>((resolve, reject) => {
    child.stderr!.on('data', (d: Buffer) => {
      if (d.toString().includes('shim listening')) resolve();
    });
    child.once('exit', (c) => reject(new Error(`shim exited (${c})`)));
  });
  return Object.assign(child, { socket: sock });
}

async function stopShim(shim: ChildProcess): Promise<void> {
  if (shim.exitCode !== null || shim.signalCode !== null) return;
  shim.kill('SIGTERM');
  await new Promise((r) => shim.once('exit', r));
}

let scratch: string;
let host: string;
let systemctlLog: string;
let api: http.Server;
let apiUrl: string;
let kubeletPods: FakeKubelet;
const patches: { node: string; body: unknown }[] = [];
const running: ChildProcess[] = [];

/** Runs the installer (asynchronously: the recording API server lives in this process). */
async function runInstaller(cmd: 'install' | 'uninstall'): Promise<{ code: number; stderr: string }> {
  const child = spawn('bash', [SCRIPT, cmd], {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: {
      ...process.env,
      HOST_ROOT: host,
      // It copies this checkout's dist/: a build of the current sources, or the test fails here.
      SHIM_SRC: builtRepo(),
      NODE_BIN: process.execPath,
      SYSTEMCTL: path.join(scratch, 'systemctl'),
      NODE_NAME: 'node-a',
      KUBERNETES_API_URL: apiUrl,
      TOKEN_FILE: path.join(scratch, 'no-token'),
      ONESHOT: '1',
      UNLABEL_SETTLE: '0',
      KUBELET_URL: kubeletPods.httpsUrl,
      KUBELET_CA_FILE: kubeletPods.certs.caFile,
      ...PROOF_ENV,
    },
  });
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  const code = await new Promise<number>((resolve) => child.once('exit', (c) => resolve(c ?? -1)));
  return { code, stderr };
}

function systemctlCalls(): string[] {
  return existsSync(systemctlLog) ? readFileSync(systemctlLog, 'utf8').trim().split('\n').filter(Boolean) : [];
}

function kubeletEndpoint(endpoint: string): void {
  mkdirSync(path.join(host, 'var/lib/kubelet'), { recursive: true });
  writeFileSync(path.join(host, 'var/lib/kubelet/config.yaml'), `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: ${endpoint}
imageServiceEndpoint: unix:///run/containerd/containerd.sock
`);
}

/** Starts the shim the installer put on the host, with the host root's paths. */
async function startInstalledShim(): Promise<ChildProcess & { socket: string }> {
  const cur = path.join(host, 'opt/probe-agent-shim/current');
  const child = await startShimAt(host, cur, path.join(cur, 'node'));
  running.push(child);
  return child;
}

beforeAll(async () => {
  execFileSync('make', ['-s', 'build'], { cwd: ROOT, stdio: 'pipe' });
  scratch = mkdtempSync(path.join(tmpdir(), 'shim-installer-'));
  host = path.join(scratch, 'host');
  mkdirSync(path.join(host, 'etc/systemd/system'), { recursive: true });
  systemctlLog = path.join(scratch, 'systemctl.log');
  writeFileSync(path.join(scratch, 'systemctl'), `#!/bin/sh\necho "$*" >> ${systemctlLog}\n`);
  chmodSync(path.join(scratch, 'systemctl'), 0o755);
  api = http.createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      const m = /^\/api\/v1\/nodes\/([^/]+)$/.exec(req.url ?? '');
      if (req.method !== 'PATCH' || !m || req.headers['content-type'] !== 'application/merge-patch+json') {
        res.writeHead(400).end('unexpected request');
        return;
      }
      patches.push({ node: decodeURIComponent(m[1]!), body: JSON.parse(body) });
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
    });
  });
  await new Promise<void>((r) => api.listen(0, '127.0.0.1', r));
  apiUrl = `http://127.0.0.1:${(api.address() as { port: number }).port}`;
  kubeletPods = await FakeKubelet.start();
}, 120_000);

afterAll(async () => {
  for (const c of running) c.kill('SIGKILL');
  api?.close();
  await kubeletPods?.stop();
  if (scratch) rmSync(scratch, { recursive: true, force: true });
});

describe('install-shim.sh on a scratch host root', () => {
  it('installs the shim and its unit, enables and restarts it, and labels nothing while kubelet does not use the shim', async () => {
    kubeletEndpoint('unix:///run/containerd/containerd.sock');
    const r = await runInstaller('install');
    expect(r.code, r.stderr).toBe(0);
    const cur = path.join(host, 'opt/probe-agent-shim/current');
    expect(lstatSync(cur).isSymbolicLink()).toBe(true);
    expect(readlinkSync(cur)).toBe(`releases/${VERSION}`);
    for (const f of ['node', 'package.json', 'dist/shim/main.js', 'dist/shim/proxy.js', 'dist/contract/shim-command.js']) expect(existsSync(path.join(cur, f)), f).toBe(true);
    expect(existsSync(path.join(cur, 'node_modules'))).toBe(false);
    expect(readFileSync(path.join(host, 'etc/systemd/system/probe-agent-shim.service'), 'utf8')).toBe(readFileSync(path.join(COMPONENT, 'probe-agent-shim.service'), 'utf8'));
    expect(systemctlCalls()).toEqual(['daemon-reload', 'enable probe-agent-shim.service', 'restart probe-agent-shim.service']);
    // Kubelet does not use the shim: no label set, and none removed either (only unlabel removes it).
    expect(patches).toEqual([]);
  });

  it('the installed unit passes systemd-analyze verify in the host root (and a broken one does not)', () => {
    // verify needs the distribution's units (sysinit.target, ...) in the root it checks.
    cpSync('/lib/systemd/system', path.join(host, 'usr/lib/systemd/system'), { recursive: true, verbatimSymlinks: true });
    const unit = path.join(host, 'etc/systemd/system/probe-agent-shim.service');
    const ok = spawnSync('systemd-analyze', ['verify', `--root=${host}`, unit], { encoding: 'utf8' });
    expect(ok.status, ok.stderr).toBe(0);
    expect(ok.stderr.trim()).toBe('');
    const broken = path.join(host, 'etc/systemd/system/broken-shim.service');
    writeFileSync(broken, readFileSync(unit, 'utf8').replace('Restart=always', 'Restart=sometimes').replace('/current/node', '/current/nodejs'));
    const bad = spawnSync('systemd-analyze', ['verify', `--root=${host}`, broken], { encoding: 'utf8' });
    expect(bad.stderr).toMatch(/restart specifier/);
    expect(bad.stderr).toMatch(/is not executable/);
    rmSync(broken);
  });

  it('the installed copy runs on its own, and the label becomes ready once kubelet points at the shim and calls it', async () => {
    const shim = await startInstalledShim();
    // The shim answers but kubelet still talks to the runtime: no label (rewritten pods would lose their probes).
    kubeletEndpoint('unix:///run/containerd/containerd.sock');
    const patchesBefore = patches.length;
    expect((await runInstaller('install')).code).toBe(0);
    expect(patches.slice(patchesBefore).filter((p) => JSON.stringify(p.body).includes('"ready"'))).toEqual([]);
    kubeletEndpoint('unix:///run/probe-agent-shim/cri.sock');
    const kubelet = relist(shim.socket);
    try {
      const r = await runInstaller('install');
      expect(r.code, r.stderr).toBe(0);
      expect(r.stderr).toMatch(/label probe-agent\.io\/shim: ready \(kubelet's calls reach the shim: connection \d+ of the shim's socket made \+\d+ \+\d+ calls in 2 x 1s\)/);
    } finally {
      await kubelet.stop();
    }
    // The calls went through the installed shim to containerd and back.
    expect(kubelet.calls).toBeGreaterThan(4);
    expect(kubelet.failures).toBe(0);
    expect(patches.at(-1)).toEqual({ node: 'node-a', body: { metadata: { labels: { 'probe-agent.io/shim': 'ready' } } } });
    // The shim down: the label stays (kubelet is still configured with it; removing the label would
    // make kubelet kill every rewritten pod at its next restart).
    shim.kill('SIGTERM');
    await new Promise((r) => shim.once('exit', r));
    const before = patches.length;
    expect((await runInstaller('install')).code).toBe(0);
    expect(patches.length).toBe(before);
  });

  it('re-installing the same release keeps the files and the unit in place', async () => {
    const marker = path.join(host, 'opt/probe-agent-shim/current/.complete');
    const unit = path.join(host, 'etc/systemd/system/probe-agent-shim.service');
    const before = lstatSync(marker).mtimeMs;
    const unitBefore = lstatSync(unit).mtimeMs;
    const r = await runInstaller('install');
    expect(r.code).toBe(0);
    expect(lstatSync(marker).mtimeMs).toBe(before);
    expect(lstatSync(unit).mtimeMs).toBe(unitBefore);
    expect(readFileSync(unit, 'utf8')).toBe(readFileSync(path.join(COMPONENT, 'probe-agent-shim.service'), 'utf8'));
    expect(r.stderr).not.toMatch(/unit written/);
  });

  it('on a CRI-O node the unit forwards to CRI-O\'s socket, after crio.service, and keeps it once kubelet points at the shim', async () => {
    const unit = path.join(host, 'etc/systemd/system/probe-agent-shim.service');
    const src = readFileSync(path.join(COMPONENT, 'probe-agent-shim.service'), 'utf8');
    const crio = src.replace('--runtime-endpoint unix:///run/containerd/containerd.sock', '--runtime-endpoint unix:///var/run/crio/crio.sock')
      .replace('After=containerd.service', 'After=crio.service').replace('Wants=containerd.service', 'Wants=crio.service');
    expect(crio.split('\n').filter((l) => /crio/.test(l) && !l.startsWith('#'))).toEqual(['After=crio.service', 'Wants=crio.service', '  --runtime-endpoint unix:///var/run/crio/crio.sock \\']);
    const calls = systemctlCalls().length;
    kubeletEndpoint('unix:///var/run/crio/crio.sock');
    const r = await runInstaller('install');
    expect(r.code, r.stderr).toBe(0);
    expect(readFileSync(unit, 'utf8')).toBe(crio);
    expect(r.stderr).toContain("forwarding to unix:///var/run/crio/crio.sock, kubelet's runtime endpoint (containerRuntimeEndpoint in /var/lib/kubelet/config.yaml)");
    expect(systemctlCalls().slice(calls)).toContain('restart probe-agent-shim.service');
    // Switched: kubelet names the shim; the unit goes on forwarding to CRI-O, untouched, not restarted.
    kubeletEndpoint('unix:///run/probe-agent-shim/cri.sock');
    const switched = systemctlCalls().length;
    const again = await runInstaller('install');
    expect(again.code, again.stderr).toBe(0);
    expect(readFileSync(unit, 'utf8')).toBe(crio);
    expect(again.stderr).not.toMatch(/unit written/);
    expect(systemctlCalls().slice(switched)).not.toContain('restart probe-agent-shim.service');
    // This file's node is a containerd one again.
    kubeletEndpoint('unix:///run/containerd/containerd.sock');
    expect((await runInstaller('install')).code).toBe(0);
    expect(readFileSync(unit, 'utf8')).toBe(src);
  });

  it('keeps a kubelet configured with the old socket path working: a symlink to the new socket while it points there, gone once it does not', async () => {
    const legacy = path.join(host, 'run/probe-agent/cri.sock');
    // What the previous release left: kubelet pointing into the agent's directory, and its socket file there.
    mkdirSync(path.dirname(legacy), { recursive: true });
    const stale = net.createServer().listen(legacy);
    await new Promise((r) => stale.once('listening', r));
    stale.close();
    writeFileSync(path.join(host, 'var/lib/kubelet/kubeadm-flags.env'), 'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///run/probe-agent/cri.sock --pod-infra-container-image=registry.k8s.io/pause:3.10"\n');
    kubeletEndpoint('unix:///run/containerd/containerd.sock');
    const shim = await startInstalledShim();
    const kubelet = relist(shim.socket);
    try {
      const r = await runInstaller('install');
      expect(r.code, r.stderr).toBe(0);
      expect(lstatSync(legacy).isSymbolicLink()).toBe(true);
      expect(readlinkSync(legacy)).toBe('/run/probe-agent-shim/cri.sock');
      expect(r.stderr).toMatch(/kubelet still uses \/run\/probe-agent\/cri\.sock: linked it to \/run\/probe-agent-shim\/cri\.sock/);
      expect(patches.at(-1)?.body).toEqual({ metadata: { labels: { 'probe-agent.io/shim': 'ready' } } });
      // Migrated: kubelet points at the new path; the link in the agent's directory goes.
      writeFileSync(path.join(host, 'var/lib/kubelet/kubeadm-flags.env'), 'KUBELET_KUBEADM_ARGS="--pod-infra-container-image=registry.k8s.io/pause:3.10"\n');
      kubeletEndpoint('unix:///run/probe-agent-shim/cri.sock');
      const after = await runInstaller('install');
      expect(after.code, after.stderr).toBe(0);
      expect(existsSync(legacy) || (() => { try { lstatSync(legacy); return true; } catch { return false; } })()).toBe(false);
      expect(patches.at(-1)?.body).toEqual({ metadata: { labels: { 'probe-agent.io/shim': 'ready' } } });
    } finally {
      await kubelet.stop();
      await stopShim(shim);
      rmSync(path.join(host, 'var/lib/kubelet/kubeadm-flags.env'), { force: true });
    }
  });

  it('uninstall refuses while kubelet still uses the shim (label removed, shim kept), and removes everything once it does not', async () => {
    kubeletEndpoint('unix:///run/probe-agent-shim/cri.sock');
    const calls = systemctlCalls().length;
    const refused = await runInstaller('uninstall');
    expect(refused.code).toBe(3);
    expect(refused.stderr).toMatch(/switch it back to the runtime first/);
    expect(patches.at(-1)?.body).toEqual({ metadata: { labels: { 'probe-agent.io/shim': null } } });
    expect(existsSync(path.join(host, 'opt/probe-agent-shim/current/node'))).toBe(true);
    expect(systemctlCalls().length).toBe(calls);

    kubeletEndpoint('unix:///run/containerd/containerd.sock');
    const done = await runInstaller('uninstall');
    expect(done.code, done.stderr).toBe(0);
    expect(existsSync(path.join(host, 'opt/probe-agent-shim'))).toBe(false);
    expect(existsSync(path.join(host, 'etc/systemd/system/probe-agent-shim.service'))).toBe(false);
    expect(systemctlCalls().slice(calls)).toEqual(['disable --now probe-agent-shim.service', 'daemon-reload']);
  });
});

/**
 * The label needs proof that kubelet uses the shim: its configuration naming the shim is only a
 * hint (a commented line, a flag in kubeadm-flags.env that overrides config.yaml), and the shim's
 * own count of calls on kubelet's socket decides. A kubelet-shaped client (grpc-go) relists against
 * a real containerd, either directly or through the real shim.
 */
describe('install-shim.sh: the label only once kubelet\'s calls reach the shim', () => {
  let api: ApiServerStandIn;
  let kubeletPods: FakeKubelet;
  let root: string;
  let hostRoot: string;
  let shim: ChildProcess & { socket: string };
  const labelPatches = () => api.requests.filter((q) => q.method === 'PATCH').map((q) => (q.body as any).metadata.labels['probe-agent.io/shim']);
  async function install(): Promise<{ code: number; stderr: string }> {
    const child = spawn('bash', [SCRIPT, 'install'], { stdio: ['ignore', 'ignore', 'pipe'], env: {
      ...process.env, HOST_ROOT: hostRoot, SHIM_SRC: ROOT, NODE_BIN: process.execPath, SYSTEMCTL: path.join(root, 'systemctl'),
      NODE_NAME: 'node-k', KUBERNETES_API_URL: api.url, TOKEN_FILE: path.join(root, 'no-token'), ONESHOT: '1',
      KUBELET_URL: kubeletPods.httpsUrl, KUBELET_CA_FILE: kubeletPods.certs.caFile, ...PROOF_ENV } });
    let stderr = '';
    child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    return { code: await new Promise<number>((r) => child.once('exit', (c) => r(c ?? -1))), stderr };
  }
  /** install() while a kubelet-shaped client relists on `socket`; the relist's counts come back too. */
  async function installRelisting(socket: string): Promise<{ code: number; stderr: string; failures: number }> {
    const kubelet = relist(socket);
    let r: { code: number; stderr: string };
    try {
      r = await install();
    } finally {
      await kubelet.stop();
    }
    // Read after stop(): a call still in flight then counts too.
    return { ...r, failures: kubelet.failures };
  }
  function kubeletFiles(config: string, flags?: string): void {
    mkdirSync(path.join(hostRoot, 'var/lib/kubelet'), { recursive: true });
    writeFileSync(path.join(hostRoot, 'var/lib/kubelet/config.yaml'), `apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n${config}\n`);
    const f = path.join(hostRoot, 'var/lib/kubelet/kubeadm-flags.env');
    if (flags === undefined) rmSync(f, { force: true });
    else writeFileSync(f, `${flags}\n`);
  }

  beforeAll(async () => {
    api = await startApiServerStandIn();
    api.nodes.set('node-k', nodeObject('node-k'));
    kubeletPods = await FakeKubelet.start();
    root = mkdtempSync(path.join(tmpdir(), 'shim-proof-'));
    hostRoot = path.join(root, 'host');
    mkdirSync(path.join(hostRoot, 'etc/systemd/system'), { recursive: true });
    writeFileSync(path.join(root, 'systemctl'), '#!/bin/sh\nexit 0\n');
    chmodSync(path.join(root, 'systemctl'), 0o755);
    shim = await startShimAt(hostRoot);
  }, 120_000);
  afterAll(async () => {
    if (shim) await stopShim(shim);
    await api?.close();
    await kubeletPods?.stop();
    if (root) rmSync(root, { recursive: true, force: true });
  });

  it('a commented line naming the shim gets no label: kubelet relists on containerd, as its live line says', async () => {
    kubeletFiles('# containerRuntimeEndpoint: unix:///run/probe-agent-shim/cri.sock\ncontainerRuntimeEndpoint: unix:///run/containerd/containerd.sock');
    const r = await installRelisting((await runtime()).socket);
    expect(r.code, r.stderr).toBe(0);
    expect(labelPatches()).toEqual([]);
    expect(r.stderr).toContain("kubelet's runtime endpoint is unix:///run/containerd/containerd.sock (containerRuntimeEndpoint in /var/lib/kubelet/config.yaml), not unix:///run/probe-agent-shim/cri.sock");
    // Only commented out: kubelet's default, not the shim.
    kubeletFiles('#containerRuntimeEndpoint: unix:///run/probe-agent-shim/cri.sock');
    const alone = await install();
    expect(alone.stderr).toMatch(/runtime endpoint is unset \(set in neither .* kubelet's default\)/);
    expect(labelPatches()).toEqual([]);
  });

  it('a --container-runtime-endpoint flag in kubeadm-flags.env pointing elsewhere overrides config.yaml: no label', async () => {
    kubeletFiles('containerRuntimeEndpoint: unix:///run/probe-agent-shim/cri.sock',
      '# KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///run/probe-agent-shim/cri.sock"\nKUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///run/containerd/containerd.sock --pod-infra-container-image=registry.k8s.io/pause:3.10"');
    const r = await installRelisting((await runtime()).socket);
    expect(r.code, r.stderr).toBe(0);
    expect(labelPatches()).toEqual([]);
    expect(r.stderr).toContain("kubelet's runtime endpoint is unix:///run/containerd/containerd.sock (--container-runtime-endpoint in /var/lib/kubelet/kubeadm-flags.env, which overrides /var/lib/kubelet/config.yaml)");
    expect(labelPatches()).toEqual([]);
  });

  it('switched, but nothing calls the shim (kubelet not restarted), or a client that stays idle: no label within the proof\'s window, and the log says why', async () => {
    kubeletFiles('containerRuntimeEndpoint: unix:///run/probe-agent-shim/cri.sock');
    const idle = await install();
    expect(idle.code, idle.stderr).toBe(0);
    expect(labelPatches()).toEqual([]);
    expect(idle.stderr).toContain("kubelet's configuration names the shim (containerRuntimeEndpoint in /var/lib/kubelet/config.yaml) but its calls do not reach the shim: no connection to the shim's socket in 2 x 1s; label not set");
    // One call, then the connection sits idle (kubelet stuck, or a tool that called once).
    const once = new GrpcGoCri(shim.socket);
    try {
      expect((await once.call('Version', { version: 'v1' })).ok).toBe(true);
      const r = await install();
      expect(r.code, r.stderr).toBe(0);
      expect(labelPatches()).toEqual([]);
      expect(r.stderr).toMatch(/its calls do not reach the shim: no connection's calls rose by 2 in each interval of 2 x 1s \(busiest: connection \d+, \+0 \+0\); label not set/);
    } finally {
      await once.close();
    }
    expect(labelPatches()).toEqual([]);
  });

  it('kubelet relisting through the shim gets the label, with the count that proved it in the log', async () => {
    kubeletFiles('containerRuntimeEndpoint: unix:///run/containerd/containerd.sock', 'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///run/probe-agent-shim/cri.sock"');
    const r = await installRelisting(shim.socket);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toMatch(/label probe-agent\.io\/shim: ready \(kubelet's calls reach the shim: connection \d+ of the shim's socket made \+\d+ \+\d+ calls in 2 x 1s\)/);
    expect(r.failures).toBe(0);
    expect(labelPatches()).toEqual(['ready']);
    expect(api.nodes.get('node-k')!.metadata.labels['probe-agent.io/shim']).toBe('ready');
  });
});

/**
 * The guard's procedures (docs/closing-the-hole.md) step by step, against an API server stand-in
 * that holds the Node and the pods: the label survives a flapping shim; the shim restarts only for
 * a new release; unlabel and uninstall refuse while a rewritten pod is on the node.
 */
describe('install-shim.sh: the label that never kills a pod', () => {
  let api: ApiServerStandIn;
  let kubeletPods: FakeKubelet;
  let root: string;
  let hostRoot: string;
  let callsLog: string;
  /** The node's kubelet serves the pods bound to it. */
  const syncKubelet = () => kubeletPods.setPods(api.pods.filter((p) => p.spec?.nodeName === 'node-g'));
  const rewrittenPod = (name: string, node: string, phase = 'Running'): Record<string, any> => ({
    apiVersion: 'v1', kind: 'Pod', metadata: { namespace: 'shop', name, annotations: { 'probe-agent.io/original-handlers': '{"v":1,"handlers":{},"added":[]}' } },
    spec: { nodeName: node, containers: [{ name: 'a', readinessProbe: { exec: { command: ['/.probe-agent/v1', 'readiness', 'e30'] } } }] }, status: { phase },
  });
  const labelOf = () => api.nodes.get('node-g')!.metadata.labels['probe-agent.io/shim'];
  const labelPatches = () => api.requests.filter((q) => q.method === 'PATCH').map((q) => (q.body as any).metadata.labels['probe-agent.io/shim']);
  const env = (extra: Record<string, string> = {}) => ({
    ...process.env, HOST_ROOT: hostRoot, SHIM_SRC: ROOT, NODE_BIN: process.execPath, SYSTEMCTL: path.join(root, 'systemctl'),
    NODE_NAME: 'node-g', KUBERNETES_API_URL: api.url, TOKEN_FILE: path.join(root, 'no-token'), ONESHOT: '1', UNLABEL_SETTLE: '0',
    KUBELET_URL: kubeletPods.httpsUrl, KUBELET_CA_FILE: kubeletPods.certs.caFile, ...PROOF_ENV, ...extra,
  });
  async function run(cmd: string, extra: Record<string, string> = {}): Promise<{ code: number; stdout: string; stderr: string }> {
    syncKubelet();
    const child = spawn('bash', [SCRIPT, cmd], { stdio: ['ignore', 'pipe', 'pipe'], env: env(extra) });
    let stdout = '';
    let stderr = '';
    child.stdout!.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    const code = await new Promise<number>((resolve) => child.once('exit', (c) => resolve(c ?? -1)));
    return { code, stdout, stderr };
  }
  const calls = () => (existsSync(callsLog) ? readFileSync(callsLog, 'utf8').trim().split('\n').filter(Boolean) : []);
  function kubelet(endpoint: string): void {
    mkdirSync(path.join(hostRoot, 'var/lib/kubelet'), { recursive: true });
    writeFileSync(path.join(hostRoot, 'var/lib/kubelet/config.yaml'), `kind: KubeletConfiguration\ncontainerRuntimeEndpoint: ${endpoint}\n`);
  }
  /** A CRI socket that answers connections where the shim listens (the shim up); close() takes it down. */
  async function shimSocket(): Promise<net.Server> {
    const sock = path.join(hostRoot, 'run/probe-agent-shim/cri.sock');
    mkdirSync(path.dirname(sock), { recursive: true });
    rmSync(sock, { force: true });
    const srv = net.createServer((c) => c.destroy());
    await new Promise<void>((r) => srv.listen(sock, r));
    return srv;
  }

  beforeAll(async () => {
    api = await startApiServerStandIn();
    api.nodes.set('node-g', nodeObject('node-g'));
    kubeletPods = await FakeKubelet.start();
    root = mkdtempSync(path.join(tmpdir(), 'shim-guard-'));
    hostRoot = path.join(root, 'host');
    mkdirSync(path.join(hostRoot, 'etc/systemd/system'), { recursive: true });
    callsLog = path.join(root, 'systemctl.log');
    writeFileSync(path.join(root, 'systemctl'), `#!/bin/sh\necho "$*" >> ${callsLog}\n`);
    chmodSync(path.join(root, 'systemctl'), 0o755);
  });
  afterAll(async () => {
    await api?.close();
    await kubeletPods?.stop();
    if (root) rmSync(root, { recursive: true, force: true });
  });

  it('restarts the shim only when its release or unit changed; otherwise only makes sure it runs', async () => {
    kubelet('unix:///run/containerd/containerd.sock');
    expect((await run('install')).code).toBe(0);
    expect(calls()).toEqual(['daemon-reload', 'enable probe-agent-shim.service', 'restart probe-agent-shim.service']);
    expect((await run('install')).code).toBe(0);
    expect(calls().slice(3)).toEqual(['daemon-reload', 'enable probe-agent-shim.service', 'start probe-agent-shim.service']);
    // A changed unit on the host (an older release's) is replaced, and the shim restarted.
    writeFileSync(path.join(hostRoot, 'etc/systemd/system/probe-agent-shim.service'), '# old\n');
    expect((await run('install')).code).toBe(0);
    expect(calls().slice(6)).toEqual(['daemon-reload', 'enable probe-agent-shim.service', 'restart probe-agent-shim.service']);
    // Another release current (an upgrade): restart.
    const cur = path.join(hostRoot, 'opt/probe-agent-shim/current');
    rmSync(cur);
    execFileSync('ln', ['-s', 'releases/0.0.0-old', cur]);
    expect((await run('install')).code).toBe(0);
    expect(calls().at(-1)).toBe('restart probe-agent-shim.service');
  });

  it('sets the label once kubelet is configured with the shim and calls it, and keeps it through a flapping shim', async () => {
    kubelet('unix:///run/probe-agent-shim/cri.sock');
    // Configured, but the shim does not answer yet: no label.
    rmSync(path.join(hostRoot, 'run/probe-agent-shim/cri.sock'), { force: true });
    expect((await run('install')).code).toBe(0);
    expect(labelOf()).toBeUndefined();
    // The installer as the DaemonSet runs it (a loop), while the shim flaps under it.
    const loop = spawn('bash', [SCRIPT, 'install'], { stdio: ['ignore', 'ignore', 'pipe'], env: env({ ONESHOT: '', CHECK_INTERVAL: '0.2' }) });
    let log = '';
    loop.stderr!.on('data', (d: Buffer) => (log += d.toString()));
    try {
      // The shim comes up and kubelet's relist reaches it: labelled.
      const real = await startShimAt(hostRoot);
      const relisting = relist(real.socket);
      try {
        for (let i = 0; i < 600 && labelOf() !== 'ready'; i++) await new Promise((r) => setTimeout(r, 50));
      } finally {
        await relisting.stop();
        await stopShim(real);
      }
      expect(labelOf(), log).toBe('ready');
      let shim = await shimSocket();
      for (let flap = 0; flap < 4; flap++) {
        await new Promise<void>((r) => shim.close(() => r()));
        await new Promise((r) => setTimeout(r, 600)); // three checks with the shim down
        expect(labelOf(), `flap ${flap}, down`).toBe('ready');
        shim = await shimSocket();
        await new Promise((r) => setTimeout(r, 400));
      }
      await new Promise<void>((r) => shim.close(() => r()));
      // Kubelet switched away by hand: still never removed by the installer, only logged.
      kubelet('unix:///run/containerd/containerd.sock');
      for (let i = 0; i < 100 && !log.includes('never removed by it'); i++) await new Promise((r) => setTimeout(r, 50));
      expect(log).toContain('never removed by it');
      expect(labelOf()).toBe('ready');
    } finally {
      loop.kill('SIGTERM');
      await new Promise((r) => loop.once('exit', r));
    }
    expect(labelPatches()).toEqual(['ready']);
  });

  it('unlabel and uninstall refuse while a rewritten pod is on the node (label and shim kept), and go through once it is gone', async () => {
    expect(labelOf()).toBe('ready');
    kubelet('unix:///run/containerd/containerd.sock');
    api.pods.push(rewrittenPod('web-1', 'node-g'), rewrittenPod('web-2', 'other-node'), rewrittenPod('done', 'node-g', 'Succeeded'),
      { metadata: { namespace: 'shop', name: 'plain' }, spec: { nodeName: 'node-g', containers: [{ name: 'a', readinessProbe: { httpGet: { port: 80 } } }] }, status: { phase: 'Running' } });
    const listed = await run('rewritten-pods');
    expect(listed).toMatchObject({ code: 0, stdout: 'shop/web-1\n' });
    for (const cmd of ['unlabel', 'uninstall']) {
      const r = await run(cmd);
      expect(r.code, cmd).toBe(4);
      expect(r.stderr).toMatch(/rewritten pods are still on this node; label kept/);
      expect(r.stderr).toContain('shop/web-1');
      expect(labelOf()).toBe('ready');
      expect(existsSync(path.join(hostRoot, 'opt/probe-agent-shim/current/node'))).toBe(true);
    }
    expect(labelPatches()).toEqual(['ready']);
    // A pod only identified by its command (the record stripped) counts too.
    api.pods[0]!.metadata.annotations = {};
    expect((await run('unlabel')).code).toBe(4);
    // Gone: uninstall removes the label, then the shim (kubelet no longer points at it).
    api.pods.splice(0, 1);
    const done = await run('uninstall');
    expect(done.code, done.stderr).toBe(0);
    expect(labelOf()).toBeUndefined();
    expect(existsSync(path.join(hostRoot, 'opt/probe-agent-shim'))).toBe(false);
  });

  it('unlabel puts the label back when a rewritten pod lands on the node while it settles', async () => {
    api.nodes.get('node-g')!.metadata.labels['probe-agent.io/shim'] = 'ready';
    const pending = run('unlabel', { UNLABEL_SETTLE: '1' });
    // The scheduler binds a pod from its cache just after the label went; kubelet sees it.
    for (let i = 0; i < 100 && labelOf() === 'ready'; i++) await new Promise((r) => setTimeout(r, 20));
    expect(labelOf()).toBeUndefined();
    api.pods.push(rewrittenPod('late', 'node-g'));
    syncKubelet();
    const r = await pending;
    expect(r.code).toBe(4);
    expect(r.stderr).toMatch(/landed on this node meanwhile; label put back/);
    expect(labelOf()).toBe('ready');
  });

  it('unlabel refuses when the node\'s kubelet cannot list its pods (down, or refusing the installer), keeping the label', async () => {
    await kubeletPods.setFault('down');
    try {
      const r = await run('unlabel');
      expect(r.code).toBe(4);
      expect(r.stderr).toMatch(/cannot list this node's pods; label kept/);
      expect(r.stderr).toMatch(/GET https:\/\/127\.0\.0\.1:\d+\/pods \(this node's kubelet\)/);
    } finally {
      await kubeletPods.setFault('none');
    }
    // The kubelet refuses the account (no get on nodes/pods): the message says what to grant.
    kubeletPods.setToken('someone-else');
    try {
      const r = await run('unlabel');
      expect(r.code).toBe(4);
      expect(r.stderr).toMatch(/HTTP 401 .*needs get on nodes\/pods/);
    } finally {
      kubeletPods.setToken(undefined);
    }
    expect(labelOf()).toBe('ready');
    // The account never lists pods through the API server: the node's kubelet answers.
    expect(api.requests.filter((q) => q.method === 'GET' && q.url.startsWith('/api/v1/pods'))).toEqual([]);
  });
});

/**
 * docs/closing-the-hole.md's procedures in order, on one node, with the real installer script,
 * the real admission code (reading the API server stand-in) and the stand-in's objects. Kubelet
 * and the scheduler cannot run here; their two decisions that matter are modelled below from
 * their documented rules: the scheduler places a pod on a node only when its required node
 * affinity matches and it tolerates the node's NoSchedule/NoExecute taints; kubelet, when it
 * restarts, re-admits each running pod and rejects (kills) one whose required node affinity no
 * longer matches or that does not tolerate a NoExecute taint (finding 4).
 */
describe('closing-the-hole procedures, step by step (installer + webhook + API server stand-in)', () => {
  type Pod = Record<string, any>;
  let api: ApiServerStandIn;
  let kubeletPods: FakeKubelet;
  let root: string;
  let hostRoot: string;
  const NODE = 'node-p';
  const node = () => api.nodes.get(NODE)!;

  const matchesTerm = (term: Pod, n: Pod): boolean =>
    (term.matchExpressions ?? []).every((e: Pod) => {
      const v = n.metadata.labels?.[e.key];
      if (e.operator === 'In') return v !== undefined && e.values.includes(v);
      if (e.operator === 'NotIn') return v === undefined || !e.values.includes(v);
      if (e.operator === 'Exists') return v !== undefined;
      if (e.operator === 'DoesNotExist') return v === undefined;
      return false;
    }) && (term.matchFields ?? []).every((f: Pod) => f.key === 'metadata.name' && f.operator === 'In' && f.values.includes(n.metadata.name));
  const affinityMatches = (pod: Pod, n: Pod): boolean => {
    const terms = pod.spec.affinity?.nodeAffinity?.requiredDuringSchedulingIgnoredDuringExecution?.nodeSelectorTerms;
    return !terms || terms.some((t: Pod) => matchesTerm(t, n));
  };
  const tolerates = (pod: Pod, taint: Pod): boolean => (pod.spec.tolerations ?? []).some((t: Pod) =>
    (t.key === taint.key || (!t.key && t.operator === 'Exists')) && (!t.effect || t.effect === taint.effect) && (t.operator === 'Exists' || (t.value ?? '') === (taint.value ?? '')));
  const schedulerPlaces = (pod: Pod, n: Pod): boolean => affinityMatches(pod, n)
    && (n.spec.taints ?? []).filter((t: Pod) => t.effect !== 'PreferNoSchedule').every((t: Pod) => tolerates(pod, t));
  const kubeletReadmits = (pod: Pod, n: Pod): boolean => affinityMatches(pod, n)
    && (n.spec.taints ?? []).filter((t: Pod) => t.effect === 'NoExecute').every((t: Pod) => tolerates(pod, t));
  const onNode = () => api.pods.filter((p) => p.spec.nodeName === NODE);
  const isRewritten = (p: Pod) => JSON.stringify(p.spec).includes('/.probe-agent/v1');

  async function admitPod(pod: Pod, reader: ApiServerReader | undefined): Promise<Pod> {
    if (!reader) return pod; // the webhook is down: failurePolicy Ignore admits the pod as written
    const { admit } = await import('../../agent/webhook/admission.ts');
    const { applyJsonPatch } = await import('../support/json-patch-apply.ts');
    const r = await admit({ apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview', request: { uid: 'u', kind: { kind: 'Pod' }, resource: { resource: 'pods' }, operation: 'CREATE', object: pod } }, 'all', { cluster: reader });
    const patch = r.review.response.patch;
    return patch ? applyJsonPatch(pod, JSON.parse(Buffer.from(patch, 'base64').toString('utf8'))) : pod;
  }
  /** Creates a pod (through the webhook unless it is down) and binds it to the node when the scheduler would. */
  async function create(name: string, reader: ApiServerReader | undefined, daemon = false): Promise<Pod> {
    const pod: Pod = { apiVersion: 'v1', kind: 'Pod', metadata: { namespace: 'shop', name },
      spec: { containers: [{ name: 'a', image: 'i', ports: [{ name: 'http', containerPort: 80 }], readinessProbe: { httpGet: { port: 'http' } }, lifecycle: { postStart: { httpGet: { port: 80 } } } }] }, status: { phase: 'Pending' } };
    if (daemon) {
      // What the DaemonSet controller gives each daemon pod: the pin to its node and its default tolerations.
      pod.spec.affinity = { nodeAffinity: { requiredDuringSchedulingIgnoredDuringExecution: { nodeSelectorTerms: [{ matchFields: [{ key: 'metadata.name', operator: 'In', values: [NODE] }] }] } } };
      pod.spec.tolerations = [{ key: 'node.kubernetes.io/unschedulable', operator: 'Exists', effect: 'NoSchedule' }, { key: 'node.kubernetes.io/not-ready', operator: 'Exists', effect: 'NoExecute' }];
    }
    const admitted = await admitPod(pod, reader);
    if (schedulerPlaces(admitted, node())) {
      admitted.spec.nodeName = NODE;
      admitted.status.phase = 'Running';
      api.pods.push(admitted);
    }
    return admitted;
  }
  const kubeletRestartKills = () => onNode().filter((p) => !kubeletReadmits(p, node())).map((p) => p.metadata.name);
  async function installer(cmd: string): Promise<{ code: number; stderr: string }> {
    kubeletPods.setPods(onNode());
    const child = spawn('bash', [SCRIPT, cmd], { stdio: ['ignore', 'ignore', 'pipe'], env: {
      ...process.env, HOST_ROOT: hostRoot, SHIM_SRC: ROOT, NODE_BIN: process.execPath, SYSTEMCTL: path.join(root, 'systemctl'),
      NODE_NAME: NODE, KUBERNETES_API_URL: api.url, TOKEN_FILE: path.join(root, 'no-token'), ONESHOT: '1', UNLABEL_SETTLE: '0',
      KUBELET_URL: kubeletPods.httpsUrl, KUBELET_CA_FILE: kubeletPods.certs.caFile, ...PROOF_ENV } });
    let stderr = '';
    child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    return { code: await new Promise<number>((r) => child.once('exit', (c) => r(c ?? -1))), stderr };
  }
  function kubelet(endpoint: string): void {
    mkdirSync(path.join(hostRoot, 'var/lib/kubelet'), { recursive: true });
    writeFileSync(path.join(hostRoot, 'var/lib/kubelet/config.yaml'), `kind: KubeletConfiguration\ncontainerRuntimeEndpoint: ${endpoint}\n`);
  }

  beforeAll(async () => {
    api = await startApiServerStandIn();
    api.nodes.set(NODE, nodeObject(NODE));
    kubeletPods = await FakeKubelet.start();
    root = mkdtempSync(path.join(tmpdir(), 'shim-procedures-'));
    hostRoot = path.join(root, 'host');
    mkdirSync(path.join(hostRoot, 'etc/systemd/system'), { recursive: true });
    writeFileSync(path.join(root, 'systemctl'), '#!/bin/sh\nexit 0\n');
    chmodSync(path.join(root, 'systemctl'), 0o755);
  });
  afterAll(async () => {
    await api?.close();
    await kubeletPods?.stop();
    if (root) rmSync(root, { recursive: true, force: true });
  });

  it('install, rollout, close, shim down, kubelet restarts, webhook outage, rollback and uninstall never kill a running pod, and no rewritten pod runs without the shim', async () => {
    const reader = new ApiServerReader({ url: api.url, ttlMs: 0 });
    try {
      // Install: the component puts the shim on the node; kubelet still talks to containerd: no label.
      kubelet('unix:///run/containerd/containerd.sock');
      expect((await installer('install')).code).toBe(0);
      expect(node().metadata.labels['probe-agent.io/shim']).toBeUndefined();
      // A pod created now is rewritten, but no node takes it (Pending), and a daemon pod for this node stays as written.
      expect(isRewritten(await create('early', reader))).toBe(true);
      expect(onNode()).toEqual([]);
      expect(isRewritten(await create('daemon-early', reader, true))).toBe(false);
      expect(onNode().map((p) => p.metadata.name)).toEqual(['daemon-early']);

      // Switch kubelet to the shim (config + restart); its calls reach the shim; the installer labels the node.
      kubelet('unix:///run/probe-agent-shim/cri.sock');
      const shim = await startShimAt(hostRoot);
      const relisting = relist(shim.socket);
      expect(kubeletRestartKills()).toEqual([]);
      try {
        expect((await installer('install')).code).toBe(0);
      } finally {
        await relisting.stop();
      }
      expect(node().metadata.labels['probe-agent.io/shim']).toBe('ready');

      // Rollout: rewritten pods and daemon pods land on the node.
      expect(isRewritten(await create('web-1', reader))).toBe(true);
      expect(isRewritten(await create('daemon-1', reader, true))).toBe(true);
      expect(onNode().filter(isRewritten).map((p) => p.metadata.name)).toEqual(['web-1', 'daemon-1']);

      // Close the hole: taint first. Unrewritten pods already running stay (NoSchedule evicts nothing).
      node().spec.taints = [{ key: 'probe-agent.io/hole-closed', effect: 'NoSchedule' }];
      expect(kubeletRestartKills()).toEqual([]);
      // Webhook outage: a pod created now keeps its network probes and is not placed on the closed node.
      const during = await create('during-outage', undefined);
      expect(isRewritten(during)).toBe(false);
      expect(onNode().map((p) => p.metadata.name)).not.toContain('during-outage');
      // With the webhook back, a new pod is rewritten and tolerated there.
      expect(isRewritten(await create('web-2', reader))).toBe(true);
      expect(onNode().map((p) => p.metadata.name)).toContain('web-2');

      // The shim goes down (and the installer checks meanwhile), kubelet restarts: nothing is killed.
      await stopShim(shim);
      expect((await installer('install')).code).toBe(0);
      expect(node().metadata.labels['probe-agent.io/shim']).toBe('ready');
      expect(kubeletRestartKills()).toEqual([]);

      // Roll back, in the documented order. A premature unlabel/uninstall is refused.
      expect((await installer('unlabel')).code).toBe(4);
      expect((await installer('uninstall')).code).toBe(4);
      // 1. Open the hole on this node again (close-hole off there, then the taint goes): kubelet's own probes work again.
      node().spec.taints = node().spec.taints.filter((t: Pod) => t.key !== 'probe-agent.io/hole-closed');
      // 2. Mark the rollback and cordon.
      node().metadata.annotations['probe-agent.io/shim-rollback'] = 'true';
      node().spec.unschedulable = true;
      node().spec.taints.push({ key: 'node.kubernetes.io/unschedulable', effect: 'NoSchedule' });
      expect(kubeletRestartKills()).toEqual([]);
      // 3. drain --ignore-daemonsets: the non-daemon pods go (rescheduled elsewhere).
      api.pods = api.pods.filter((p) => p.spec.nodeName !== NODE || p.metadata.name.startsWith('daemon'));
      // 4. Delete the rewritten daemon pods: the controller recreates them (they tolerate unschedulable),
      //    and the webhook leaves them as written for a node being rolled back.
      const daemons = onNode().filter(isRewritten).map((p) => p.metadata.name);
      expect(daemons).toEqual(['daemon-1']);
      for (const name of daemons) {
        api.pods.splice(api.pods.findIndex((p) => p.metadata.name === name), 1);
        expect(isRewritten(await create(name, reader, true)), name).toBe(false);
      }
      expect(onNode().map((p) => p.metadata.name).sort()).toEqual(['daemon-1', 'daemon-early']);
      expect(onNode().filter(isRewritten)).toEqual([]);
      // 5. unlabel proves it and removes the label.
      const unlabel = await installer('unlabel');
      expect(unlabel.code, unlabel.stderr).toBe(0);
      expect(node().metadata.labels['probe-agent.io/shim']).toBeUndefined();
      // 6. Switch kubelet back and restart it: nothing left on the node needs the label.
      kubelet('unix:///run/containerd/containerd.sock');
      expect(kubeletRestartKills()).toEqual([]);
      // 7. Uninstall; 8. uncordon and drop the mark: new pods are created as written, kubelet probes them.
      const uninstall = await installer('uninstall');
      expect(uninstall.code, uninstall.stderr).toBe(0);
      expect(existsSync(path.join(hostRoot, 'opt/probe-agent-shim'))).toBe(false);
      node().spec.unschedulable = false;
      node().spec.taints = [];
      delete node().metadata.annotations['probe-agent.io/shim-rollback'];
      // A pod the webhook rewrites now cannot land here; one made for this node by a DaemonSet is left as written.
      expect(isRewritten(await create('after', reader))).toBe(true);
      expect(onNode().map((p) => p.metadata.name)).not.toContain('after');
      expect(isRewritten(await create('daemon-after', reader, true))).toBe(false);
      expect(kubeletRestartKills()).toEqual([]);
    } finally {
      await reader.close();
    }
  });
});
