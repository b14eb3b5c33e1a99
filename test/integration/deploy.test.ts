/**
 * The nftables-close-hole sidecar script (deploy/components/nftables-close-hole/close-hole.sh)
 * against real nftables and a lab of network-namespace pods: it closes the node->pod path only
 * while the agent's real /readyz (the agent's own metrics/health listener) answers 200, reloads
 * a deleted table, fails open when the agent stays unready, honours its exemptions and interface
 * scope, and removes its table on SIGTERM. Its table is named after the lab slot, so parallel
 * test files never share one.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'bash', 'timeout']);

import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Registry } from 'prom-client';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { HealthRegistry } from '../../agent/metrics/health.ts';
import { startMetricsServer, type MetricsServer } from '../../agent/metrics/http-server.ts';
import { registerCloseHoleState } from '../../agent/metrics/close-hole-state.ts';
import { createLab, type Lab, type RunningServer } from '../lab/lab.ts';
import { connectFromNode } from '../lab/net.ts';

const SCRIPT = fileURLToPath(new URL('../../deploy/components/nftables-close-hole/close-hole.sh', import.meta.url));


async function waitFor(what: string, cond: () => boolean | Promise<boolean>, timeoutMs = 4000): Promise<number> {
  const start = Date.now();
  while (!(await cond())) {
    if (Date.now() - start > timeoutMs) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
  return Date.now() - start;
}

describe('close-hole sidecar script', () => {
  let lab: Lab;
  let server: RunningServer;
  let health: HealthRegistry;
  let metrics: MetricsServer;
  let metricsV6: MetricsServer;
  let table: string;
  let ready = false;
  let script: ChildProcess | undefined;
  let output = '';
  let stateDir: string;

  const tablePresent = (): boolean => spawnSync('nft', ['list', 'table', 'inet', table], { stdio: 'ignore' }).status === 0;
  // The script's start-up `nft --check` shows the table to `nft list` while it runs (the packet path
  // never sees it): a table counts as loaded once the script also said so.
  const tableLoaded = (): boolean => /table inet \S+ loaded/.test(output) && tablePresent();
  const httpPort = (): number => server.ports.http!;
  const tcpPort = (): number => server.ports.tcp!;

  function start(extra: Record<string, string> = {}): ChildProcess {
    output = '';
    script = spawn('bash', [SCRIPT], {
      env: {
        PATH: process.env.PATH,
        CLOSE_HOLE_TABLE: table,
        CLOSE_HOLE_POD_CIDRS: `${lab.subnetV4},${lab.subnetV6}`,
        CLOSE_HOLE_POD_INTERFACES: lab.bridge,
        CLOSE_HOLE_AGENT_ADDRESS: `127.0.0.1:${metrics.port}`,
        CLOSE_HOLE_INTERVAL: '0.1',
        CLOSE_HOLE_FAIL_OPEN_AFTER: '1',
        CLOSE_HOLE_CHECK_TIMEOUT: '1',
        ...extra,
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    script.stdout!.on('data', (d: Buffer) => (output += d.toString()));
    script.stderr!.on('data', (d: Buffer) => (output += d.toString()));
    return script;
  }

  /** SIGTERM, as kubelet stops the sidecar; a script still running 15 s later is killed and reported. */
  async function stop(): Promise<number | null> {
    const child = script;
    script = undefined;
    if (!child || child.exitCode !== null) return child?.exitCode ?? null;
    const exited = once(child, 'exit');
    child.kill('SIGTERM');
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<'late'>((r) => (timer = setTimeout(() => r('late'), 15_000)));
    const first = await Promise.race([exited, late]);
    clearTimeout(timer);
    if (first === 'late') {
      child.kill('SIGKILL');
      await exited;
      throw new Error(`close-hole.sh still ran 15 s after SIGTERM; its output:\n${output.slice(-2000)}`);
    }
    const [code] = first as [number | null];
    return code;
  }

  beforeAll(async () => {
    lab = await createLab({ pods: 2, policy: 'none', tag: 'deploy.test close-hole' });
    table = `probe_agent_close_hole_t${lab.id}`;
    stateDir = mkdtempSync(path.join(tmpdir(), 'probe-agent-close-hole-state-'));
    server = await lab.startServer(lab.pods[0]!, { http: 0, tcp: 0 });
    health = new HealthRegistry();
    health.addReadiness('agent-under-test', () => {
      if (!ready) throw new Error('test says not ready');
    });
    metrics = await startMetricsServer({ address: '127.0.0.1:0', registry: new Registry(), health });
    metricsV6 = await startMetricsServer({ address: '[::1]:0', registry: new Registry(), health });
  });

  afterEach(async () => {
    try {
      await stop();
    } finally {
      if (tablePresent()) execFileSync('nft', ['delete', 'table', 'inet', table]);
    }
  });

  afterAll(async () => {
    await metrics?.close();
    await metricsV6?.close();
    health?.close();
    await lab?.destroy();
    if (stateDir) rmSync(stateDir, { recursive: true, force: true });
  });

  it('closes the node->pod path while the agent is ready, reloads a deleted table, fails open, cleans up on SIGTERM', async () => {
    const [pod, peer] = [lab.pods[0]!, lab.pods[1]!];
    // The state file the agent exports as probe_agent_close_hole_table_present (its real reader).
    const stateFile = path.join(stateDir, 'state');
    const agentRegistry = new Registry();
    registerCloseHoleState(agentRegistry, stateFile);
    const tableGauge = async (): Promise<string | undefined> =>
      (await agentRegistry.metrics()).split('\n').find((l) => l.startsWith('probe_agent_close_hole_table_present '))?.split(' ')[1];
    ready = false;
    start({ CLOSE_HOLE_STATE_FILE: stateFile });
    await waitFor('the first unready check', () => output.includes('agent not ready'));
    expect(tablePresent()).toBe(false);
    await waitFor('the state file', async () => (await tableGauge()) === '0');
    expect((await connectFromNode(pod.ipv4, httpPort(), 1000)).result).toBe('connected');

    ready = true;
    await waitFor('the table', tableLoaded);
    await waitFor('the state file to say present', async () => (await tableGauge()) === '1');
    for (const ip of pod.ips) {
      const { result, ms } = await connectFromNode(ip, httpPort(), 1000);
      expect(result, ip).not.toBe('connected');
      expect(result, `${ip}: refused at once, not by timeout (${ms} ms)`).not.toBe('timeout');
    }
    // The pod itself and its peers are untouched: their packets never pass the node's output hook.
    for (const [from, to] of [[pod, pod.ipv4], [pod, '127.0.0.1'], [peer, pod.ipv4], [peer, pod.ipv6]] as const) {
      const r = await lab.exec(from, 'bash', ['-c', `exec 3<>"/dev/tcp/${to}/${httpPort()}"`], { timeoutMs: 3000 });
      expect(r.code, `${from.name} -> ${to}: ${r.stderr}`).toBe(0);
    }
    const counters = execFileSync('nft', ['-j', 'list', 'table', 'inet', table], { encoding: 'utf8' });
    expect(counters).toMatch(/"packets": [1-9]/);

    execFileSync('nft', ['delete', 'table', 'inet', table]);
    // The script logs before it reloads, but its stdout reaches this process on a later tick than
    // nft shows the table: wait for both.
    await waitFor('the table to be reloaded and the reload logged', () => tablePresent() && output.includes('disappeared'));
    expect(output).toContain('disappeared');

    ready = false;
    const unreadyAt = Date.now();
    await waitFor('fail open', () => !tablePresent(), 5000);
    await waitFor('the state file to say absent', async () => (await tableGauge()) === '0');
    const failOpens = (await agentRegistry.metrics()).split('\n').find((l) => l.startsWith('probe_agent_close_hole_fail_opens_total '));
    expect(failOpens).toBe('probe_agent_close_hole_fail_opens_total 1');
    expect(Date.now() - unreadyAt).toBeGreaterThanOrEqual(900);
    expect((await connectFromNode(pod.ipv4, httpPort(), 1000)).result).toBe('connected');

    ready = true;
    await waitFor('the table again', tablePresent);
    const stoppedAt = Date.now();
    expect(await stop()).toBe(0);
    expect(Date.now() - stoppedAt).toBeLessThan(10_000);
    expect(tablePresent()).toBe(false);
    // The last state written on the way out: no table, the one fail open above kept, with its time.
    expect(readFileSync(stateFile, 'utf8')).toMatch(/^table_present 0\nfail_open_total 1\nlast_fail_open_seconds [1-9]\d*\n$/);
    expect((await connectFromNode(pod.ipv6, httpPort(), 1000)).result).toBe('connected');
  });

  it('leaves exempt ports open, only guards the listed interfaces, watches an IPv6 agent address', async () => {
    const pod = lab.pods[0]!;
    ready = true;
    // Not a fail-open case: a readiness check slowed by the suite's load must not open the hole
    // between the table appearing and the connections below.
    start({ CLOSE_HOLE_EXEMPT_TCP_PORTS: String(tcpPort()), CLOSE_HOLE_AGENT_ADDRESS: `[::1]:${metricsV6.port}`, CLOSE_HOLE_FAIL_OPEN_AFTER: '60', CLOSE_HOLE_CHECK_TIMEOUT: '5' });
    await waitFor('the table', tableLoaded);
    expect((await connectFromNode(pod.ipv4, tcpPort(), 1000)).result).toBe('connected');
    expect((await connectFromNode(pod.ipv4, httpPort(), 1000)).result).not.toBe('connected');
    expect(await stop()).toBe(0);

    // Another interface pattern: the lab bridge is not a pod interface, so nothing is refused.
    start({ CLOSE_HOLE_POD_INTERFACES: `pa${lab.id}zz*` });
    await waitFor('the table', tableLoaded);
    expect((await connectFromNode(pod.ipv4, httpPort(), 1000)).result).toBe('connected');
  });

  it('refuses a relative state file before touching the ruleset', async () => {
    const child = start({ CLOSE_HOLE_STATE_FILE: 'state' });
    // 'close', not 'exit': the script's last words may still be in the pipe when it has exited.
    const [code] = (await once(child, 'close')) as [number | null];
    expect(code).toBe(2);
    expect(output).toMatch(/CLOSE_HOLE_STATE_FILE: want an absolute path/);
    expect(tablePresent()).toBe(false);
  });

  it('refuses settings nft rejects, before touching the ruleset', async () => {
    const child = start({ CLOSE_HOLE_POD_CIDRS: `${lab.subnetV4},fd00:10:250:${lab.id}::1::/64` });
    const [code] = (await once(child, 'close')) as [number | null];
    expect(code).toBe(2);
    expect(output).toMatch(/nft refused the table/);
    expect(tablePresent()).toBe(false);
  });
});
