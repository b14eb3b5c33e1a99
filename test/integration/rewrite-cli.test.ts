/**
 * `probe-agent rewrite` as users run it (bin/probe-agent on the built dist/): the round trip over
 * the manifest corpus (test/fixtures/rewrite/) gives every file back byte for byte, through a file
 * and through stdin; exit status 2 with file, document and field for bad input.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { builtCli, REPO } from '../support/built-cli.ts';

const CORPUS = path.join(REPO, 'test/fixtures/rewrite');
const FILES = readdirSync(CORPUS).sort();

function run(args: string[], input?: string): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync(cli, args, { input, encoding: 'utf8', maxBuffer: 64 * 1024 * 1024 });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

let cli: string;
let scratch: string;
beforeAll(() => {
  cli = builtCli();
  scratch = mkdtempSync(path.join(tmpdir(), 'probe-agent-rewrite-cli-'));
});
afterAll(() => {
  if (scratch) rmSync(scratch, { recursive: true, force: true });
});

describe('probe-agent rewrite (built CLI)', () => {
  it.each(FILES)('%s: rewrite then --undo gives the file back exactly', (file) => {
    const original = readFileSync(path.join(CORPUS, file), 'utf8');
    const rewritten = run(['rewrite', '-f', path.join(CORPUS, file)]);
    expect(rewritten.status).toBe(0);
    if (file === 'left-to-kubelet.yaml') {
      expect(rewritten.stderr).toMatch(/^probe-agent rewrite: .*left-to-kubelet\.yaml: document 1: spec\.template\.spec: left unchanged: hostNetwork pod/);
      expect(rewritten.stdout).toBe(original);
    } else if (file !== 'exec-only.yaml') {
      // DaemonSets are left as written by default, each with a note.
      for (const line of rewritten.stderr.split('\n').filter(Boolean)) expect(line).toMatch(/left unchanged: a DaemonSet's template with the shim node affinity/);
      expect(rewritten.stdout).not.toBe(original);
      expect(rewritten.stdout).toContain('/.probe-agent/v1');
      expect(rewritten.stdout).toContain('probe-agent.io/shim');
    } else {
      expect(rewritten.stderr).toBe('');
      expect(rewritten.stdout).toBe(original);
    }
    const again = run(['rewrite', '-f', '-'], rewritten.stdout);
    expect(again.stdout).toBe(rewritten.stdout);
    const undone = run(['rewrite', '--undo', '-f', '-'], rewritten.stdout);
    expect(undone.stderr).toBe('');
    expect(undone.status).toBe(0);
    expect(undone.stdout).toBe(original);
  });

  it('--daemonsets shim-nodes-only rewrites DaemonSets too, and the undo still gives the file back', () => {
    const file = path.join(CORPUS, 'multi-doc.yaml');
    const original = readFileSync(file, 'utf8');
    const plain = run(['rewrite', '-f', file]);
    expect(plain.stderr).toMatch(/document 4: spec\.template\.spec: left unchanged: a DaemonSet's template/);
    const all = run(['rewrite', '-f', file, '--daemonsets', 'shim-nodes-only']);
    expect(all.status).toBe(0);
    expect(all.stderr).toBe('');
    expect(all.stdout.split(/^---$/m).find((d) => d.includes('kind: DaemonSet'))).toContain('/.probe-agent/v1');
    expect(run(['rewrite', '--undo', '-f', '-'], all.stdout).stdout).toBe(original);
  });

  it('--runtime-class NAME=HANDLER leaves pods of a sandboxed handler to kubelet; a bad mapping exits 2', () => {
    const pod = 'apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  runtimeClassName: untrusted\n  containers:\n    - name: a\n      livenessProbe:\n        tcpSocket: {port: 80}\n';
    const byName = run(['rewrite', '-f', '-'], pod);
    expect(byName.stdout).toContain('/.probe-agent/v1');
    const byHandler = run(['rewrite', '-f', '-', '--runtime-class', 'fast=runc', '--runtime-class', 'untrusted=runsc'], pod);
    expect(byHandler.status).toBe(0);
    expect(byHandler.stdout).toBe(pod);
    expect(byHandler.stderr).toBe('probe-agent rewrite: <stdin>: document 1: spec: left unchanged: runtimeClassName "untrusted" (runtime handler "runsc") is sandboxed: the agent cannot probe inside it, its probes stay as written\n');
    const bad = run(['rewrite', '-f', '-', '--runtime-class', 'untrusted'], pod);
    expect(bad.status).toBe(2);
    expect(bad.stdout).toBe('');
    expect(bad.stderr).toMatch(/--runtime-class: want NAME=HANDLER/);
  });

  it('--loopback-host keep leaves pods probing a loopback host to kubelet', () => {
    const pod = 'kind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n    - name: a\n      readinessProbe:\n        httpGet: {host: 127.0.0.1, port: 80}\n';
    expect(run(['rewrite', '-f', '-'], pod).stdout).toContain('/.probe-agent/v1');
    const kept = run(['rewrite', '-f', '-', '--loopback-host', 'keep'], pod);
    expect(kept.stdout).toBe(pod);
    expect(kept.stderr).toMatch(/host is "127\.0\.0\.1" and loopback hosts are kept/);
  });

  it('writes the format asked for', () => {
    const json = run(['rewrite', '-f', path.join(CORPUS, 'list.yaml'), '--output', 'json']);
    expect(json.status).toBe(0);
    expect(JSON.parse(json.stdout).kind).toBe('List');
    const yaml = run(['rewrite', '-f', path.join(CORPUS, 'api-deployment.json'), '--output', 'yaml']);
    expect(yaml.status).toBe(0);
    expect(yaml.stdout).toMatch(/^apiVersion: apps\/v1\nkind: Deployment\n/);
    const bad = run(['rewrite', '-f', path.join(CORPUS, 'list.yaml'), '--output', 'xml']);
    expect(bad.status).toBe(2);
    expect(bad.stderr).toMatch(/--output.*xml/);
  });

  it('exits 2 naming the file, the document and the field for bad input, writing nothing to stdout', () => {
    const file = path.join(scratch, 'bad.yaml');
    writeFileSync(file, readFileSync(path.join(CORPUS, 'cleanup-cronjob.yaml'), 'utf8') + '---\napiVersion: apps/v1\nkind: Deployment\nspec:\n  template:\n    spec:\n      containers:\n        - name: a\n          readinessProbe:\n            httpGet: {port: 1}\n            grpc: {port: 2}\n');
    const r = run(['rewrite', '-f', file]);
    expect(r.status).toBe(2);
    expect(r.stdout).toBe('');
    expect(r.stderr).toBe(`probe-agent rewrite: ${file}: document 2: spec.template.spec.containers[0].readinessProbe: more than one handler (httpGet, grpc); the API allows exactly one\n`);
    const stdin = run(['rewrite', '-f', '-'], 'kind: Pod\nspec: {containers: [{name: a, livenessProbe: {exec: {command: [/.probe-agent/v1, liveness, "!!"]}}}]}\n');
    expect(stdin.status).toBe(2);
    expect(stdin.stderr).toMatch(/^probe-agent rewrite: <stdin>: document 1: spec\.containers\[0\]\.livenessProbe\.exec\.command: probe-agent exec command: handler is not base64url\n$/);
    const missing = run(['rewrite', '-f', path.join(scratch, 'nope.yaml')]);
    expect(missing.status).toBe(2);
    expect(missing.stderr).toMatch(/cannot read .*nope\.yaml: .*ENOENT/);
    const noFile = run(['rewrite']);
    expect(noFile.status).toBe(2);
    expect(noFile.stderr).toMatch(/--filename/);
  });
});
