/**
 * `probe-agent audit` end to end: the built command (a real process) reads pods from the test
 * kubelet, resolves each pod's netns with the address resolver (lab netns live in /run/netns),
 * and runs every probe from the node and inside the netns through the real helper, against real
 * pod servers in lab netns. Each scenario is a different PodList; the lab policy is 'none' so the
 * node path works, except where the test closes the hole itself.
 *
 * "Passes from the node, fails in the netns" is made real with an nftables table INSIDE one pod's
 * netns that resets TCP connections to the app unless they come from the lab gateway (the node's
 * address on the pod network): an app or in-pod firewall that trusts only the kubelet's address.
 * From inside the netns the source is the pod's own IP, so the in-netns probe is refused.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'nsenter']);

import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, connect, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AuditReport, AuditedProbe } from '../../agent/audit/report.ts';
import { createLab, type Lab, type LabPod } from '../lab/lab.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { makePod, type PodTraits } from '../support/pod-factory.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const TOKEN = 'audit-test-token';
/** A port nothing listens on in a fresh netns, and (checked in beforeAll) not on the node's loopback either. */
const LOOPBACK_APP_PORT = 4;

let lab: Lab;
let kubelet: FakeKubelet;
let scratch: string;
let tokenFile: string;
let nodeLoopback: Server;
let nodeLoopbackPort: number;

const P = (i: number): LabPod => lab.pods[i] as LabPod;
const timing = { timeoutSeconds: 1, periodSeconds: 10, successThreshold: 1, failureThreshold: 3 };

/** A pod whose "app" container carries exactly `probes`, on the given IPs. */
function pod(name: string, ips: string[], probes: Record<string, unknown>, traits: PodTraits = {}): Record<string, unknown> {
  const p = makePod({ name, namespace: 'audit', ips, probe: 'none', port: 8080, ...traits });
  const app = (p['spec'] as { containers: Record<string, unknown>[] }).containers[0] as Record<string, unknown>;
  Object.assign(app, probes);
  return p;
}

const healthy = (): Record<string, unknown> => pod('healthy', P(0).ips, {
  livenessProbe: { httpGet: { path: '/healthz', port: 'http' }, ...timing },
  readinessProbe: { tcpSocket: { port: 8081 }, ...timing },
  startupProbe: { grpc: { port: 9090 }, ...timing },
});
const loopbackBound = (): Record<string, unknown> => pod('loopback-app', P(1).ips, {
  livenessProbe: { httpGet: { host: '127.0.0.1', path: '/healthz', port: LOOPBACK_APP_PORT }, ...timing },
  readinessProbe: { httpGet: { path: '/healthz', port: LOOPBACK_APP_PORT }, ...timing },
});
const execOnly = (): Record<string, unknown> => makePod({ name: 'exec-only', namespace: 'audit', probe: 'exec', ips: [`10.250.${lab.id}.240`] });
const hostNet = (): Record<string, unknown> => makePod({ name: 'host-net', namespace: 'audit', probe: 'http', hostNetwork: true, ips: [lab.gatewayV4] });
const sandboxed = (): Record<string, unknown> => makePod({ name: 'gvisor-app', namespace: 'audit', probe: 'tcp', runtimeClassName: 'gvisor', ips: [`10.250.${lab.id}.241`] });
const finishedJob = (): Record<string, unknown> => makePod({ name: 'job-done', namespace: 'audit', probe: 'tcp', phase: 'Succeeded', ips: [`10.250.${lab.id}.243`] });
const unreadable = (): Record<string, unknown> => {
  const p = makePod({ name: 'unreadable', namespace: 'audit', probe: 'tcp', ips: [`10.250.${lab.id}.244`] });
  (p['status'] as Record<string, unknown>)['podIPs'] = [{ ip: 'not-an-ip' }];
  return p;
};
const noProbes = (): Record<string, unknown> => makePod({ name: 'no-probes', namespace: 'audit', probe: 'none', ips: [`10.250.${lab.id}.242`] });
const nodeOnly = (): Record<string, unknown> => pod('trusts-node', P(2).ips, {
  livenessProbe: { httpGet: { path: '/healthz', port: 8080 }, ...timing },
});
const ssrf = (): Record<string, unknown> => pod('ssrf', P(3).ips, {
  readinessProbe: { tcpSocket: { host: P(0).ipv4, port: 8081 }, ...timing },
});
const nodeLoopbackProbe = (): Record<string, unknown> => pod('node-loopback', P(4).ips, {
  livenessProbe: { tcpSocket: { host: '127.0.0.1', port: nodeLoopbackPort }, ...timing },
});
const unresolvable = (): Record<string, unknown> => pod('no-netns', [`10.250.${lab.id}.250`], {
  livenessProbe: { tcpSocket: { port: 8081 }, ...timing },
});

/** Runs `probe-agent audit` as a process, through the CLI users run (agent/cli.ts). */
async function audit(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const argv = [join(ROOT, 'agent/cli.ts'), 'audit', ...args];
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, argv, { cwd: ROOT, env: { PATH: process.env['PATH'] ?? '/usr/sbin:/usr/bin:/sbin:/bin' } });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), 60_000);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code: code ?? -1, stdout, stderr });
    });
  });
}

const kubeletFlags = (): string[] => ['--kubelet-url', kubelet.httpUrl, '--kubelet-token-file', tokenFile, '--netns-resolvers', 'address'];

async function auditJson(pods: Record<string, unknown>[]): Promise<{ code: number; report: AuditReport; stderr: string }> {
  kubelet.setPods(pods);
  const r = await audit([...kubeletFlags(), '--output', 'json']);
  let report: AuditReport;
  try {
    report = JSON.parse(r.stdout) as AuditReport;
  } catch {
    throw new Error(`audit printed no JSON (exit ${r.code}): ${r.stdout}\n${r.stderr}`);
  }
  return { code: r.code, report, stderr: r.stderr };
}

function row(report: AuditReport, podName: string, type: string): AuditedProbe {
  const found = report.probes.find((p) => p.pod === podName && p.probeType === type);
  if (!found) throw new Error(`no row for ${podName} ${type}: ${JSON.stringify(report.probes.map((p) => `${p.pod}/${p.probeType}`))}`);
  return found;
}

function refusedOnNodeLoopback(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect({ host: '127.0.0.1', port });
    s.once('connect', () => { s.destroy(); resolve(false); });
    s.once('error', () => resolve(true));
  });
}

beforeAll(async () => {
  lab = await createLab({ pods: 5, policy: 'none', tag: 'audit.test' });
  scratch = mkdtempSync(join(tmpdir(), 'audit-test-'));
  tokenFile = join(scratch, 'token');
  writeFileSync(tokenFile, `${TOKEN}\n`);
  kubelet = await FakeKubelet.start({ token: TOKEN });
  nodeLoopback = createServer((s) => s.destroy());
  await new Promise<void>((r) => nodeLoopback.listen(0, '127.0.0.1', r));
  nodeLoopbackPort = (nodeLoopback.address() as { port: number }).port;
  if (!(await refusedOnNodeLoopback(LOOPBACK_APP_PORT))) {
    throw new Error(`something listens on the node's 127.0.0.1:${LOOPBACK_APP_PORT}: the loopback-bound case needs that port free`);
  }
  // The trusting app: anything but the node (the lab gateway) is reset, IPv4 and IPv6.
  const nft = [
    'table inet audit_trusts_node {',
    '  chain input {',
    '    type filter hook input priority filter; policy accept;',
    `    tcp dport 8080 ip saddr != ${lab.gatewayV4} counter reject with tcp reset`,
    `    tcp dport 8080 ip6 saddr != ${lab.gatewayV6} counter reject with tcp reset`,
    '  }',
    '}',
  ].join('\n');
  const applied = await lab.exec(P(2), 'nft', ['-f', '-'], { input: nft });
  if (applied.code !== 0) throw new Error(`nft in the pod netns failed: ${applied.stderr}`);
  await Promise.all([
    lab.startServer(P(0), { http: 8080, tcp: 8081, grpc: 9090 }),
    lab.startServer(P(1), { http: LOOPBACK_APP_PORT, bind: 'loopback' }),
    lab.startServer(P(2), { http: 8080 }),
  ]);
});

afterAll(async () => {
  await kubelet?.stop();
  await new Promise<void>((r) => (nodeLoopback ? nodeLoopback.close(() => r()) : r()));
  await lab?.destroy();
  if (scratch) rmSync(scratch, { recursive: true, force: true });
});

describe('probe-agent audit', () => {
  it('exits 0 for a node where nothing would break: same, a loopback app newly passing, and probes left to kubelet', async () => {
    const { code, report, stderr } = await auditJson([healthy(), loopbackBound(), execOnly(), hostNet(), sandboxed(), noProbes(), finishedJob()]);
    expect(stderr).toBe('');
    for (const type of ['Liveness', 'Readiness', 'Startup']) {
      const r = row(report, 'healthy', type);
      expect(r.verdict, `${type}: ${r.note}`).toBe('same');
      expect(r.fromNode?.result).toBe('success');
      expect(r.inNetns?.result).toBe('success');
      expect(r.netns).toBe(P(0).netns);
    }
    expect(row(report, 'healthy', 'Liveness').handler).toBe('httpGet :http/healthz');

    const lo = row(report, 'loopback-app', 'Liveness');
    expect(lo).toMatchObject({ verdict: 'netns-only', hostField: 'loopback', host: '127.0.0.1', blocking: false });
    expect(lo.fromNode).toMatchObject({ result: 'failure', reason: 'refused' });
    expect(lo.inNetns?.result).toBe('success');
    expect(lo.note).toMatch(/loopback-bound app newly passes/);
    // Without the host field the pod IP is probed both ways, and a loopback-bound app answers neither.
    expect(row(report, 'loopback-app', 'Readiness')).toMatchObject({ verdict: 'same', fromNode: { result: 'failure' }, inNetns: { result: 'failure' } });

    expect(row(report, 'exec-only', 'Liveness')).toMatchObject({ verdict: 'kubelet', handlerKind: 'exec', fromNode: null, inNetns: null });
    expect(row(report, 'host-net', 'Liveness')).toMatchObject({ verdict: 'kubelet', fromNode: null });
    expect(row(report, 'host-net', 'Liveness').note).toMatch(/hostNetwork/);
    expect(row(report, 'gvisor-app', 'Liveness').note).toMatch(/gvisor/);
    expect(report.probes.some((p) => p.pod === 'no-probes' || p.pod === 'job-done')).toBe(false);

    expect(report.summary).toMatchObject({
      pods: 7, podsWithoutProbes: 1, podsFinished: 1, probes: 9, blocking: 0, safeToSwitch: true, exitCode: 0,
      verdicts: { same: 4, 'node-only': 0, 'netns-only': 1, 'host-field': 0, kubelet: 4, error: 0 },
    });
    expect(code).toBe(0);
  });

  it('exits 1 and names the cause when a probe passes only from the node, uses another host, or the node loopback', async () => {
    const { code, report } = await auditJson([healthy(), nodeOnly(), ssrf(), nodeLoopbackProbe()]);

    const trusting = row(report, 'trusts-node', 'Liveness');
    expect(trusting).toMatchObject({ verdict: 'node-only', blocking: true, fromNode: { result: 'success' } });
    expect(trusting.inNetns).toMatchObject({ result: 'failure', reason: 'refused' });
    expect(trusting.note).toMatch(/accepts only the node's source address/);

    const other = row(report, 'ssrf', 'Readiness');
    expect(other).toMatchObject({ verdict: 'host-field', hostField: 'other', host: P(0).ipv4, blocking: true });
    // Kubelet really reaches the other pod from the node; the agent refuses to.
    expect(other.fromNode?.result).toBe('success');
    expect(other.inNetns).toMatchObject({ result: 'error', reason: 'host-refused' });
    expect(other.note).toMatch(/SSRF/);

    const nodeLo = row(report, 'node-loopback', 'Liveness');
    expect(nodeLo).toMatchObject({ verdict: 'node-only', hostField: 'loopback', blocking: true, fromNode: { result: 'success' } });
    expect(nodeLo.inNetns).toMatchObject({ result: 'failure', reason: 'refused' });
    expect(nodeLo.note).toMatch(/node's loopback/);

    expect(report.summary).toMatchObject({ blocking: 3, safeToSwitch: false, exitCode: 1 });
    expect(code).toBe(1);
  });

  it('prints an aligned table with the summary line by default', async () => {
    kubelet.setPods([healthy(), nodeOnly()]);
    const r = await audit(kubeletFlags());
    expect(r.code).toBe(1);
    const lines = r.stdout.trimEnd().split('\n');
    expect(lines[0]).toMatch(/^NAMESPACE\/POD\s+CONTAINER\s+TYPE\s+HANDLER\s+FROM NODE\s+IN NETNS\s+VERDICT\s+NOTE$/);
    const verdictCol = (lines[0] as string).indexOf('VERDICT');
    const body = lines.slice(1, -1);
    expect(body).toHaveLength(4);
    for (const line of body) expect(line.slice(verdictCol)).toMatch(/^(same|node-only)\s/);
    const trusting = body.find((l) => l.startsWith('audit/trusts-node'));
    expect(trusting).toMatch(/httpGet :8080\/healthz\s+success\s+failure \(refused\)\s+node-only/);
    expect(lines.at(-1)).toMatch(/^4 probes in 2 pods: 3 same, 1 node-only, .* — NOT safe to switch: 1 probe would break/);
  });

  it('reports probes the node can no longer reach as netns-only (the hole is already closed) and exits 0', async () => {
    await lab.setPolicy('reject');
    try {
      const { code, report } = await auditJson([healthy()]);
      for (const type of ['Liveness', 'Readiness', 'Startup']) {
        const r = row(report, 'healthy', type);
        expect(r.verdict, r.note).toBe('netns-only');
        expect(r.fromNode?.result).toBe('failure');
        expect(r.inNetns?.result).toBe('success');
        expect(r.note).toMatch(/node cannot reach the pod/);
      }
      expect(await lab.nodeToPodDrops()).toBeGreaterThan(0);
      expect(code).toBe(0);
    } finally {
      await lab.setPolicy('none');
    }
  });

  it('exits 2 when a pod netns cannot be resolved or a pod cannot be read, and still says what the node sees', async () => {
    const { code, report } = await auditJson([healthy(), unresolvable(), unreadable()]);
    const r = row(report, 'no-netns', 'Liveness');
    expect(r).toMatchObject({ verdict: 'error', netns: null, inNetns: null, blocking: false });
    expect(r.fromNode?.result).toBe('failure');
    expect(r.note).toMatch(/netns not resolvable/);
    const broken = report.probes.find((p) => p.pod === 'unreadable');
    expect(broken).toMatchObject({ verdict: 'error', probeType: null, fromNode: null, inNetns: null });
    expect(broken?.note).toMatch(/cannot be read.*status\.podIPs\[0\]\.ip: not an IP address/);
    expect(row(report, 'healthy', 'Liveness').verdict).toBe('same');
    expect(report.summary).toMatchObject({ pods: 3, exitCode: 2, safeToSwitch: false, verdicts: { error: 2 } });
    expect(code).toBe(2);
  });

  it('exits 2 with a message when the kubelet is down or a flag is bad', async () => {
    await kubelet.setFault('down');
    try {
      const down = await audit(kubeletFlags());
      expect(down.code).toBe(2);
      expect(down.stdout).toBe('');
      expect(down.stderr).toMatch(/cannot list the node's pods: kubelet \/pods unreachable/);
    } finally {
      await kubelet.setFault('none');
    }
    const badToken = await audit(['--kubelet-url', kubelet.httpUrl, '--kubelet-token-file', join(scratch, 'missing'), '--netns-resolvers', 'address']);
    expect(badToken.code).toBe(2);
    expect(badToken.stderr).toMatch(/token file/);

    const badResolver = await audit([...kubeletFlags(), '--netns-resolvers', 'guess']);
    expect(badResolver.code).toBe(2);
    expect(badResolver.stderr).toMatch(/--netns-resolvers: unknown resolver "guess"/);

    const badOutput = await audit([...kubeletFlags(), '--output', 'xml']);
    expect(badOutput.code).toBe(2);
    expect(badOutput.stderr).toMatch(/--output/);

    const badConcurrency = await audit([...kubeletFlags(), '--concurrency', '0']);
    expect(badConcurrency.code).toBe(2);
    expect(badConcurrency.stderr).toMatch(/--concurrency/);
  });
});
