/**
 * The kubelet-shim installer (deploy/components/kubelet-shim/install-shim.sh) against a scratch
 * host root: it installs a self-sufficient shim (dist/, package.json and node; no node_modules)
 * and its unit, the unit passes `systemd-analyze verify` in that root, the installed shim runs,
 * and the node label follows reality: "ready" only while the shim answers AND kubelet's runtime
 * endpoint is the shim, removed otherwise and on uninstall; uninstall refuses while kubelet still
 * uses the shim. systemd is not PID 1 here: the host's systemctl is a recorder, and the API
 * server a recorder of the label patches (the only stand-ins; everything else is real).
 */
import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { chmodSync, cpSync, existsSync, lstatSync, mkdirSync, mkdtempSync, readFileSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const COMPONENT = path.join(ROOT, 'deploy/components/kubelet-shim');
const SCRIPT = path.join(COMPONENT, 'install-shim.sh');
const VERSION = (JSON.parse(readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;

let scratch: string;
let host: string;
let systemctlLog: string;
let api: http.Server;
let apiUrl: string;
const patches: { node: string; body: unknown }[] = [];
const running: ChildProcess[] = [];

/** Runs the installer (asynchronously: the recording API server lives in this process). */
async function runInstaller(cmd: 'install' | 'uninstall'): Promise<{ code: number; stderr: string }> {
  const child = spawn('bash', [SCRIPT, cmd], {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: {
      ...process.env,
      HOST_ROOT: host,
      SHIM_SRC: ROOT,
      NODE_BIN: process.execPath,
      SYSTEMCTL: path.join(scratch, 'systemctl'),
      NODE_NAME: 'node-a',
      KUBERNETES_API_URL: apiUrl,
      TOKEN_FILE: path.join(scratch, 'no-token'),
      ONESHOT: '1',
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
async function startInstalledShim(): Promise<ChildProcess> {
  const cur = path.join(host, 'opt/probe-agent-shim/current');
  const sock = path.join(host, 'run/probe-agent/cri.sock');
  const child = spawn(path.join(cur, 'node'), [path.join(cur, 'dist/shim/main.js'), '--listen', `unix://${sock}`,
    '--runtime-endpoint', `unix://${path.join(scratch, 'no-runtime.sock')}`, '--probe-socket', path.join(scratch, 'no-agent.sock')],
  { stdio: ['ignore', 'ignore', 'pipe'], cwd: '/' });
  running.push(child);
  await new Promise<void>((resolve, reject) => {
    child.stderr!.on('data', (d: Buffer) => {
      if (d.toString().includes('shim listening')) resolve();
    });
    child.once('exit', (c) => reject(new Error(`installed shim exited (${c})`)));
  });
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
}, 120_000);

afterAll(() => {
  for (const c of running) c.kill('SIGKILL');
  api?.close();
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
    for (const f of ['node', 'package.json', 'dist/shim/main.js', 'dist/shim/proxy.js', 'dist/rewrite/shim-command.js']) expect(existsSync(path.join(cur, f)), f).toBe(true);
    expect(existsSync(path.join(cur, 'node_modules'))).toBe(false);
    expect(readFileSync(path.join(host, 'etc/systemd/system/probe-agent-shim.service'), 'utf8')).toBe(readFileSync(path.join(COMPONENT, 'probe-agent-shim.service'), 'utf8'));
    expect(systemctlCalls()).toEqual(['daemon-reload', 'enable probe-agent-shim.service', 'restart probe-agent-shim.service']);
    expect(patches.at(-1)).toEqual({ node: 'node-a', body: { metadata: { labels: { 'probe-agent.io/shim': null } } } });
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

  it('the installed copy runs on its own, and the label becomes ready once kubelet points at the shim', async () => {
    const shim = await startInstalledShim();
    // The shim answers but kubelet still talks to the runtime: no label (rewritten pods would lose their probes).
    kubeletEndpoint('unix:///run/containerd/containerd.sock');
    const patchesBefore = patches.length;
    expect((await runInstaller('install')).code).toBe(0);
    expect(patches.length).toBeGreaterThan(patchesBefore);
    expect(patches.at(-1)?.body).toEqual({ metadata: { labels: { 'probe-agent.io/shim': null } } });
    kubeletEndpoint('unix:///run/probe-agent/cri.sock');
    expect((await runInstaller('install')).code).toBe(0);
    expect(patches.at(-1)).toEqual({ node: 'node-a', body: { metadata: { labels: { 'probe-agent.io/shim': 'ready' } } } });
    // The shim down: the label goes.
    shim.kill('SIGTERM');
    await new Promise((r) => shim.once('exit', r));
    expect((await runInstaller('install')).code).toBe(0);
    expect(patches.at(-1)?.body).toEqual({ metadata: { labels: { 'probe-agent.io/shim': null } } });
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

  it('uninstall refuses while kubelet still uses the shim (label removed, shim kept), and removes everything once it does not', async () => {
    kubeletEndpoint('unix:///run/probe-agent/cri.sock');
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
