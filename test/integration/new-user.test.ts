/**
 * What a new user meets, through the real command line (`node agent/cli.ts`, the program
 * bin/probe-agent runs compiled): clear one-line errors for a broken spec, a missing netns, a bad
 * or missing pod IP and flags that do not go together; JSON durations without float noise; a
 * success as one line (the body only with -v); help with one default per flag and `audit --help`
 * with only audit's flags; `run` against a plain-http kubelet without a service-account token;
 * and a SIGTERM to the agent's whole process group that stops the helper without a
 * "died; restarting".
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nsenter']);

import { execFileSync, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createServer as createHttpServer, type Server } from 'node:http';
import { createServer as createTcpServer, type AddressInfo } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DEFAULT_SA_TOKEN_FILE } from '../../agent/config/run-config.ts';
import { startAgent, type AgentHandle } from '../support/agent-harness.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { makePod } from '../support/pod-factory.ts';

const ROOT = new URL('../..', import.meta.url).pathname;
const CLI = join(ROOT, 'agent/cli.ts');
/** A netns with only loopback (no global address), made for this file and removed after it. */
const EMPTY_NETNS = `probe-agent-newuser-${process.pid}`;

interface Ran {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs the CLI as a process and collects what it printed. */
function cli(args: string[], timeoutMs = 30_000): Promise<Ran> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [CLI, ...args], { cwd: ROOT, env: { PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin' } });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code: code ?? -1, stdout, stderr });
    });
  });
}

const lines = (text: string): string[] => text.split('\n').filter((l) => l !== '');

let http: Server;
let httpPort = 0;
let tcp: ReturnType<typeof createTcpServer>;
let tcpPort = 0;

beforeAll(async () => {
  http = createHttpServer((_req, res) => {
    res.writeHead(200, { 'content-type': 'text/plain' });
    res.end('all good\nsecond line of the body\n');
  });
  await new Promise<void>((r) => http.listen(0, '127.0.0.1', r));
  httpPort = (http.address() as AddressInfo).port;
  tcp = createTcpServer((s) => s.destroy());
  await new Promise<void>((r) => tcp.listen(0, '127.0.0.1', r));
  tcpPort = (tcp.address() as AddressInfo).port;
  execFileSync('ip', ['netns', 'add', EMPTY_NETNS]);
});

afterAll(async () => {
  await new Promise((r) => http?.close(r));
  await new Promise((r) => tcp?.close(r));
  try {
    execFileSync('ip', ['netns', 'del', EMPTY_NETNS], { stdio: 'ignore' });
  } catch {
    // not created
  }
});

describe('probe: errors a new user meets', () => {
  const tcpSpec = (port = 80): string => JSON.stringify({ tcpSocket: { port } });

  it('malformed JSON --spec: a JSON error with its position, no YAML parser message', async () => {
    const r = await cli(['probe', '--netns', `/run/netns/${EMPTY_NETNS}`, '--spec', '{"tcpSocket":{"port":80}']);
    expect(r.code).toBe(2);
    expect(lines(r.stderr)).toEqual([
      "probe-agent probe: probe document is not valid JSON: Expected ',' or '}' after property value in JSON at position 24 (line 1 column 25)",
    ]);
  });

  it('missing --netns: one line naming the path, the same with and without --pod-ip', async () => {
    const path = `/run/netns/probe-agent-missing-${process.pid}`;
    const want = [`probe-agent probe: --netns: "${path}" does not exist`];
    const without = await cli(['probe', '--netns', path, '--spec', tcpSpec()]);
    const withIP = await cli(['probe', '--netns', path, '--pod-ip', '10.0.0.1', '--spec', tcpSpec()]);
    for (const r of [without, withIP]) {
      expect(r.code).toBe(2);
      expect(r.stdout).toBe('');
      expect(lines(r.stderr)).toEqual(want);
    }
  });

  it('--pod-ip 999.1.1.1 is an invalid IP', async () => {
    const r = await cli(['probe', '--netns', `/run/netns/${EMPTY_NETNS}`, '--pod-ip', '999.1.1.1', '--spec', tcpSpec()]);
    expect(r.code).toBe(2);
    expect(lines(r.stderr)).toEqual(['probe-agent probe: --pod-ip: "999.1.1.1" is not a valid IP address']);
  });

  it('a netns without an address, or --from-node without an IP, suggests --pod-ip', async () => {
    const inside = await cli(['probe', '--netns', `/run/netns/${EMPTY_NETNS}`, '--spec', tcpSpec()]);
    expect(inside.code).toBe(2);
    expect(lines(inside.stderr)).toEqual([`probe-agent probe: netns "/run/netns/${EMPTY_NETNS}" has no global address to probe: give the pod's IP with --pod-ip`]);
    const fromNode = await cli(['probe', '--from-node', '--spec', tcpSpec()]);
    expect(fromNode.code).toBe(2);
    expect(lines(fromNode.stderr)).toEqual(["probe-agent probe: --from-node needs the pod's IP: give --pod-ip"]);
  });

  it('--pod with --netns is an error, not silently ignored', async () => {
    const r = await cli(['probe', '--pod', 'default/web', '--netns', `/run/netns/${EMPTY_NETNS}`, '--spec', tcpSpec()]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("option '--pod <pod>' cannot be used with option '--netns <path>'");
    expect(r.stderr).not.toMatch(/UNAVAILABLE|cannot reach probe-agent/);
  });
});

describe('probe: output', () => {
  it('JSON durations are rounded to microseconds', async () => {
    const r = await cli(['probe', '--from-node', '--pod-ip', '127.0.0.1', '--spec', JSON.stringify({ tcpSocket: { port: tcpPort } }), '--output', 'json']);
    expect(r.code).toBe(0);
    const out = JSON.parse(r.stdout) as { result: string; durationSeconds: number; phases: Record<string, number> };
    expect(out.result).toBe('success');
    const numbers = [out.durationSeconds, ...Object.values(out.phases)];
    expect(numbers.length).toBeGreaterThan(1);
    for (const n of numbers) {
      // At most 6 decimals as printed: what a reader and a JSON consumer see.
      expect(String(n), r.stdout).toMatch(/^\d+(\.\d{1,6})?$/);
    }
  });

  it('a success is one line of text; the body only with -v', async () => {
    const spec = JSON.stringify({ httpGet: { path: '/healthz', port: httpPort } });
    const plain = await cli(['probe', '--from-node', '--pod-ip', '127.0.0.1', '--spec', spec]);
    expect(plain.code).toBe(0);
    expect(plain.stdout).toMatch(new RegExp(`^success \\(\\d+\\.\\d ms via 127\\.0\\.0\\.1:${httpPort}\\)\\n$`));
    const verbose = await cli(['probe', '--from-node', '--pod-ip', '127.0.0.1', '--spec', spec, '-v']);
    expect(verbose.code).toBe(0);
    const [first, ...body] = lines(verbose.stdout);
    expect(first).toMatch(/^success \(/);
    expect(body.join('\n')).toContain('all good\nsecond line of the body');
  });
});

describe('help', () => {
  /** Option entries of `<command> --help`: each entry with its wrapped continuation lines joined. */
  async function helpEntries(command: string): Promise<Map<string, string>> {
    const r = await cli([command, '--help']);
    expect(r.code).toBe(0);
    const entries = new Map<string, string>();
    let current = '';
    for (const line of r.stdout.split('\n').slice(r.stdout.split('\n').indexOf('Options:') + 1)) {
      const m = /^ {2}(?:-\w, )?(--[a-z0-9-]+)/.exec(line);
      if (m) {
        current = m[1] as string;
        entries.set(current, line);
      } else if (current && line.startsWith('   ')) {
        entries.set(current, `${entries.get(current)} ${line.trim()}`);
      }
    }
    return entries;
  }

  it.each(['run', 'probe', 'status', 'watch', 'audit'])('%s --help shows at most one default per flag', async (command) => {
    const entries = await helpEntries(command);
    expect(entries.size).toBeGreaterThan(3);
    const twice = [...entries].filter(([, text]) => (text.match(/default/gi) ?? []).length > 1).map(([flag, text]) => `${flag}: ${text}`);
    expect(twice).toEqual([]);
  });

  it('audit --help lists only the flags audit uses', async () => {
    const flags = [...(await helpEntries('audit')).keys()].sort();
    expect(flags).toEqual([
      '--concurrency', '--cri-endpoint', '--feature-gates', '--help', '--helper-path', '--kube-probe-version',
      '--kubelet-ca-file', '--kubelet-insecure-tls', '--kubelet-max-pod-bytes', '--kubelet-max-response-bytes', '--kubelet-request-timeout',
      '--kubelet-tls-server-name', '--kubelet-token-file', '--kubelet-url', '--log-format', '--log-level',
      '--netns-dir', '--netns-resolvers', '--output', '--proc-root', '--sandboxed-runtime-handlers', '--verbosity',
    ]);
  });
});

describe('run', () => {
  let kubelet: FakeKubelet;
  let agent: AgentHandle | undefined;

  beforeAll(async () => {
    kubelet = await FakeKubelet.start({ pods: [makePod({ name: 'web', namespace: 'newuser', probe: 'tcp', ips: ['10.254.77.10'] })] });
  });

  afterAll(async () => {
    await agent?.stop('SIGKILL').catch(() => {});
    await kubelet?.stop();
  });

  it('lists pods from a plain-http kubelet without a service-account token, and says so once at start', async () => {
    // The precondition of the case: this machine has no default token (a pod would).
    expect(existsSync(DEFAULT_SA_TOKEN_FILE), `${DEFAULT_SA_TOKEN_FILE} exists on this machine`).toBe(false);
    agent = await startAgent({ kubeletUrl: kubelet.httpUrl, detached: true });
    const statuses = await agent.waitForStatuses((s) => s.some((x) => x.podName === 'web'));
    expect(statuses.map((s) => s.podName)).toContain('web');
    const said = agent.logs.filter((l) => String(l.msg).startsWith('no kubelet bearer token'));
    expect(said).toHaveLength(1);
    expect(agent.logs.filter((l) => /unauthorized|bearer token file/.test(JSON.stringify(l)))).toEqual([]);
  });

  it('a SIGTERM to the whole process group stops the helper without "died; restarting"', async () => {
    expect(agent, 'the previous case started the agent').toBeDefined();
    const a = agent as AgentHandle;
    const exited = new Promise<number | string | null>((resolve) => a.proc.once('exit', (code, signal) => resolve(code ?? signal)));
    process.kill(-a.pid, 'SIGTERM');
    expect(await exited).toBe(0);
    // Every log line has arrived once stderr closed.
    await new Promise<void>((r) => (a.proc.stderr?.readableEnded ? r() : a.proc.stderr?.once('end', () => r())));
    const msgs = a.logs.map((l) => String(l.msg));
    expect(msgs).toContain('probe-agent stopped');
    expect(msgs.filter((m) => /helper died|restarting/.test(m))).toEqual([]);
  });
});
