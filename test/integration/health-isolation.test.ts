/**
 * Health that pods cannot take down (issue 18): the real agent serves metrics on an address pods
 * reach (here the lab bridge's node address, as the node IP with hostNetwork) and health on its
 * own loopback listener; the close-hole sidecar script (real nftables) checks the loopback one. A
 * lab netns pod floods the metrics port: the metrics listener saturates, yet the agent stays ready,
 * the table stays, and nothing fails open. With CLOSE_HOLE_METRICS_PORT the table refuses the pod's
 * connections to the metrics port (not the node's, not an allowed scraper's). A real fail open is
 * said in a log line and in the agent's metrics.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'bash', 'timeout']);

import { spawn, spawnSync, execFileSync, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createLab, type Lab, type LabPod } from '../lab/lab.ts';
import { startAgent, type AgentHandle } from '../support/agent-harness.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { sample, sleep, until } from '../soak/observe.ts';

const SCRIPT = fileURLToPath(new URL('../../deploy/components/nftables-close-hole/close-hole.sh', import.meta.url));

let lab: Lab;
let kubelet: FakeKubelet;
let agent: AgentHandle;
let dir: string;
let stateFile: string;
let table: string;
let healthUrl: string;
let metricsPort: number;
let script: ChildProcess | undefined;
let output = '';

const tablePresent = (): boolean => spawnSync('nft', ['list', 'table', 'inet', table], { stdio: 'ignore' }).status === 0;
// The sidecar's start-up `nft --check` shows the table to `nft list` while it runs (the packet path
// never sees it): a table counts as loaded once the sidecar also said so.
const tableLoaded = (): boolean => /table inet \S+ loaded/.test(output) && tablePresent();

async function status(url: string, timeoutMs = 2000): Promise<number | string> {
  try {
    return (await fetch(url, { signal: AbortSignal.timeout(timeoutMs) })).status;
  } catch (err) {
    return `failed: ${(err as Error).name}`;
  }
}

function startSidecar(extra: Record<string, string> = {}): void {
  output = '';
  script = spawn('bash', [SCRIPT], {
    env: {
      PATH: process.env.PATH,
      CLOSE_HOLE_TABLE: table,
      CLOSE_HOLE_POD_CIDRS: `${lab.subnetV4},${lab.subnetV6}`,
      CLOSE_HOLE_POD_INTERFACES: lab.bridge,
      CLOSE_HOLE_AGENT_ADDRESS: new URL(healthUrl).host,
      CLOSE_HOLE_INTERVAL: '0.1',
      CLOSE_HOLE_FAIL_OPEN_AFTER: '1',
      CLOSE_HOLE_CHECK_TIMEOUT: '1',
      CLOSE_HOLE_STATE_FILE: stateFile,
      ...extra,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  script.stdout!.on('data', (d: Buffer) => (output += d.toString()));
  script.stderr!.on('data', (d: Buffer) => (output += d.toString()));
}

async function stopSidecar(): Promise<void> {
  const child = script;
  script = undefined;
  if (!child || child.exitCode !== null) return;
  const exited = once(child, 'exit');
  child.kill('SIGTERM');
  await exited;
}

/** From `pod`: whether a TCP connect to the node's metrics port succeeds. */
async function podConnects(pod: LabPod): Promise<boolean> {
  const r = await lab.exec(pod, 'bash', ['-c', `exec 3<>"/dev/tcp/${lab.gatewayV4}/${metricsPort}"`], { timeoutMs: 5000 });
  return r.code === 0;
}

beforeAll(async () => {
  lab = await createLab({ pods: 2, policy: 'none', tag: 'health-isolation.test' });
  table = `probe_agent_close_hole_h${lab.id}`;
  dir = mkdtempSync(join(tmpdir(), 'health-isolation-'));
  stateFile = join(dir, 'state');
  kubelet = await FakeKubelet.start({ pods: [] });
  agent = await startAgent({
    kubeletUrl: kubelet.httpUrl,
    args: [`--metrics-address=${lab.gatewayV4}:0`, '--health-address=127.0.0.1:0', `--close-hole-state-file=${stateFile}`, '--kubelet-request-timeout=1s'],
  });
  const line = agent.logs.find((l) => l.msg === 'health listener started');
  expect(line, 'the health listener started').toBeDefined();
  healthUrl = `http://${String(line!.address)}`;
  metricsPort = Number(new URL(agent.metricsUrl).port);
  await until(async () => (await status(`${healthUrl}/readyz`)) === 200, 20_000, 'the agent ready on its health listener');
}, 60_000);

afterEach(async () => {
  await stopSidecar();
  if (tablePresent()) execFileSync('nft', ['delete', 'table', 'inet', table]);
});

afterAll(async () => {
  await agent?.stop('SIGKILL').catch(() => {});
  await kubelet?.stop();
  await lab?.destroy();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe('health that pods cannot take down', () => {
  it('a pod flooding the metrics port saturates it, but changes neither the agent\'s health nor the table', async () => {
    startSidecar({ CLOSE_HOLE_METRICS_PORT: '' });
    await until(tableLoaded, 10_000, 'the table');
    const pod = lab.pods[0]!;
    // 150 connections held open (re-opened every second: the listener times idle ones out), for 8 s.
    const flood = lab.exec(pod, 'bash', ['-c', `
      end=$((SECONDS + 8))
      while ((SECONDS < end)); do
        fds=()
        for i in $(seq 1 150); do exec {fd}<>"/dev/tcp/${lab.gatewayV4}/${metricsPort}" 2>/dev/null && fds+=($fd); done
        sleep 1
        for fd in "\${fds[@]}"; do exec {fd}>&-; done
      done`], { timeoutMs: 30_000 });
    let saturated = 0;
    let healthBad: (number | string)[] = [];
    let tableGone = 0;
    const t0 = Date.now();
    await sleep(1000);
    while (Date.now() - t0 < 7000) {
      const [metrics, health] = await Promise.all([status(`http://${lab.gatewayV4}:${metricsPort}/readyz`, 1000), status(`${healthUrl}/readyz`, 3000)]);
      if (metrics !== 200) saturated++;
      if (health !== 200) healthBad.push(health);
      if (!tablePresent()) tableGone++;
      await sleep(200);
    }
    await flood;
    console.log(`metrics flood from ${pod.name}: metrics /readyz failed ${saturated} times, health /readyz failed ${healthBad.length} times, table missing ${tableGone} times`);
    // The flood was real: the metrics listener (where health used to be) could not answer.
    expect(saturated).toBeGreaterThan(0);
    expect(healthBad).toEqual([]);
    expect(tableGone).toBe(0);
    expect(output).not.toMatch(/FAIL OPEN|not ready/);
    expect(readFileSync(stateFile, 'utf8')).toMatch(/^fail_open_total 0$/m);
    await until(async () => (await status(`http://${lab.gatewayV4}:${metricsPort}/metrics`)) === 200, 10_000, 'the metrics listener back');
    const m = (await agent.http('/metrics')).body;
    expect(sample(m, 'probe_agent_close_hole_table_present')).toBe(1);
    expect(sample(m, 'probe_agent_close_hole_fail_opens_total')).toBe(0);
  }, 60_000);

  it('with CLOSE_HOLE_METRICS_PORT the table refuses pods\' connections to the metrics port, except allowed scrapers', async () => {
    const [pod, scraper] = [lab.pods[0]!, lab.pods[1]!];
    expect(await podConnects(pod)).toBe(true);
    startSidecar({ CLOSE_HOLE_METRICS_PORT: String(metricsPort), CLOSE_HOLE_METRICS_ALLOW_CIDRS: scraper.ipv4 });
    await until(tableLoaded, 10_000, 'the table');
    expect(await podConnects(pod)).toBe(false);
    expect(await podConnects(scraper)).toBe(true);
    // The node itself (Prometheus on the host network, or routed from another node) still scrapes.
    expect((await agent.http('/metrics')).status).toBe(200);
    expect(await status(`${healthUrl}/readyz`)).toBe(200);
  }, 60_000);

  it('a real fail open is said in a log line and in the agent\'s metrics', async () => {
    startSidecar();
    await until(tableLoaded, 10_000, 'the table');
    // The agent goes unready on its own: the kubelet stops answering.
    agent.expectLogs({ level: 'warn', msg: 'kubelet pod list unavailable; keeping the last known pods', line: /"kind":"unreachable"/, why: 'the kubelet is stopped on purpose' });
    await kubelet.stop();
    await until(() => !tablePresent(), 30_000, 'fail open');
    await until(() => /FAIL OPEN: /.test(output), 5000, 'the fail-open log line');
    expect(output).toMatch(/FAIL OPEN: agent not ready for 1s \(last check: answered "HTTP\/1\.1 500[^"]*"\): table inet \S+ removed.*fail open #1/);
    // The sidecar logs, then writes its state file (after every check): wait for the file too.
    await until(() => /^fail_open_total 1$/m.test(readFileSync(stateFile, 'utf8')), 5000, 'the fail open in the state file');
    expect(readFileSync(stateFile, 'utf8')).toMatch(/^table_present 0$/m);
    const m = (await agent.http('/metrics')).body;
    expect(sample(m, 'probe_agent_close_hole_fail_opens_total')).toBe(1);
    expect(sample(m, 'probe_agent_close_hole_table_present')).toBe(0);
    expect(sample(m, 'probe_agent_close_hole_last_fail_open_timestamp_seconds')).toBeGreaterThan(Date.now() / 1000 - 120);
  }, 60_000);
});
