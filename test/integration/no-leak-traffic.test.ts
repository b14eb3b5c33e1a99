/**
 * No probe packet leaves the pod. The real daemon probes lab pods with every probe kind (HTTP,
 * HTTPS, TCP, gRPC, named ports, a host field naming another pod, redirects to another pod's
 * addresses) for several periods while nftables counts, in the node's netns, EVERY packet from the
 * node to the pods' addresses (any conntrack state) and every packet bridged or routed between
 * pods, and, inside each pod, every TCP/UDP packet leaving through eth0. All must stay at zero while
 * each pod's loopback counter climbs. Control runs prove the counters count: kubelet's way
 * (`probe --from-node`) increments the node->pod counter, and a probe told a wrong pod IP
 * increments the pod<->pod and eth0 counters.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft']);

import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ProbeStatus } from '../../agent/scheduler/types.ts';
import { createLab, type Lab, type LabPod, type RunningServer } from '../lab/lab.ts';
import { run } from '../lab/net.ts';
import { startAgent, type AgentHandle } from '../support/agent-harness.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { makePod } from '../support/pod-factory.ts';

const NS = 'noleak';
const CLI = new URL('../../agent/cli.ts', import.meta.url).pathname;
/** The per-pod counting table (its netns is ours alone, so the name cannot collide). */
const POD_TABLE = 'probe_agent_count';

let lab: Lab;
let web: LabPod;
let other: LabPod;
let webSrv: RunningServer;
let otherSrv: RunningServer;
let kubelet: FakeKubelet;
let agent: AgentHandle;
let nodeTable = '';

const sha = (s: string): string => createHash('sha256').update(s).digest('hex');

/** The lab's pod address ranges (the gateway, i.e. the node itself on the bridge, is outside them). */
function podRanges(): { v4: string; v6: string } {
  const first = lab.pods[0] as LabPod;
  return { v4: `${first.ipv4}-10.250.${lab.id}.254`, v6: `${first.ipv6}-fd00:10:250:${lab.id}:ffff:ffff:ffff:ffff` };
}

/** Node-netns counters: every packet to the pods, and every packet between pods (bridged or routed). */
function nodeCountersScript(): string {
  const { v4, v6 } = podRanges();
  const ports = `${(lab.pods[0] as LabPod).hostVeth.replace(/\d+$/, '')}*`;
  return [
    `table inet ${nodeTable} {`,
    // Before the lab's own filter (priority 0), so even a packet it rejects is counted here.
    '  chain node_to_pods { type filter hook output priority -10; policy accept;',
    `    ip daddr ${v4} counter`,
    `    ip6 daddr ${v6} counter`,
    '  }',
    '  chain routed_between_pods { type filter hook forward priority -10; policy accept;',
    `    ip saddr ${v4} ip daddr ${v4} counter`,
    `    ip6 saddr ${v6} ip6 daddr ${v6} counter`,
    '  }',
    '}',
    `table bridge ${nodeTable} {`,
    '  chain bridged_between_pods { type filter hook forward priority -10; policy accept;',
    // Only frames entering from this lab's own ports (its host veths).
    `    iifname "${ports}" ether type ip ip saddr ${v4} ip daddr ${v4} counter`,
    `    iifname "${ports}" ether type ip6 ip6 saddr ${v6} ip6 daddr ${v6} counter`,
    '  }',
    '}',
  ].join('\n') + '\n';
}

/** In-pod counters: TCP/UDP leaving through eth0 (must stay 0) and over loopback (where probes go). */
const POD_COUNTERS = [
  `table inet ${POD_TABLE} {`,
  '  chain via_eth0 { type filter hook output priority 0; policy accept; oifname "eth0" meta l4proto { tcp, udp } counter; }',
  '  chain via_lo { type filter hook output priority 0; policy accept; oifname "lo" meta l4proto tcp counter; }',
  '}',
].join('\n') + '\n';

/** Packets counted per chain, from `nft -j list table` output. */
function perChain(json: string): Record<string, number> {
  const doc = JSON.parse(json) as { nftables: { rule?: { chain: string; expr: { counter?: { packets: number } }[] } }[] };
  const out: Record<string, number> = {};
  for (const item of doc.nftables) {
    if (!item.rule) continue;
    for (const e of item.rule.expr) if (e.counter) out[item.rule.chain] = (out[item.rule.chain] ?? 0) + e.counter.packets;
  }
  return out;
}

async function nodeCounters(): Promise<Record<string, number>> {
  const inet = perChain((await run('nft', ['-j', 'list', 'table', 'inet', nodeTable])).stdout);
  const bridge = perChain((await run('nft', ['-j', 'list', 'table', 'bridge', nodeTable])).stdout);
  return { ...inet, ...bridge };
}

async function podCounters(pod: LabPod): Promise<Record<string, number>> {
  const r = await lab.exec(pod, 'nft', ['-j', 'list', 'table', 'inet', POD_TABLE]);
  expect(r.code, r.stderr).toBe(0);
  return perChain(r.stdout);
}

/** A kubelet pod with one container per probe (readiness, period 1 s), each declaring the server's ports by name. */
function podWithProbes(name: string, pod: LabPod, srv: RunningServer, probes: Record<string, Record<string, unknown>>): Record<string, unknown> {
  const p = makePod({ name, namespace: NS, ips: pod.ips, probe: 'none' });
  const spec = p['spec'] as { containers: Record<string, unknown>[] };
  const status = p['status'] as { containerStatuses: Record<string, unknown>[] };
  const ports = (['http', 'https', 'tcp', 'grpc'] as const).filter((k) => srv.ports[k] !== undefined).map((k) => ({ name: k, containerPort: srv.ports[k], protocol: 'TCP' }));
  spec.containers = Object.entries(probes).map(([c, handler]) => ({
    ...spec.containers[0], name: c, ports, readinessProbe: { periodSeconds: 1, timeoutSeconds: 1, failureThreshold: 1, ...handler },
  }));
  status.containerStatuses = Object.keys(probes).map((c) => ({ ...status.containerStatuses[0], name: c, containerID: `containerd://${sha(`${name}/${c}`)}` }));
  return p;
}

/** Runs `probe-agent probe` and resolves with its exit code and output. */
function cli(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [CLI, 'probe', '--output', 'json', ...args], { timeout: 20_000 }, (err, stdout, stderr) => {
      resolve({ code: err ? Number((err as { code?: number }).code ?? 99) : 0, stdout, stderr });
    });
  });
}

beforeAll(async () => {
  lab = await createLab({ pods: 2, policy: 'reject', tag: 'no-leak-traffic.test' });
  [web, other] = lab.pods as [LabPod, LabPod];
  nodeTable = `probe_agent_count_${lab.id}`;
  [webSrv, otherSrv] = await Promise.all([
    lab.startServer(web, { http: 0, https: 0, tcp: 0, grpc: 0 }),
    lab.startServer(other, { http: 0 }),
  ]);
  for (const pod of [web, other]) {
    const r = await lab.exec(pod, 'nft', ['-f', '-'], { input: POD_COUNTERS });
    expect(r.code, r.stderr).toBe(0);
  }
  await run('nft', ['-f', '-'], { input: nodeCountersScript() });
  const o = otherSrv.ports.http as number;
  const to = (url: string): string => `/redirect?to=${encodeURIComponent(url)}&code=302`;
  kubelet = await FakeKubelet.start({
    pods: [
      podWithProbes('web', web, webSrv, {
        http: { httpGet: { path: '/healthz', port: webSrv.ports.http } },
        named: { httpGet: { path: '/healthz', port: 'http' } },
        https: { httpGet: { path: '/healthz', port: 'https', scheme: 'HTTPS' } },
        tcp: { tcpSocket: { port: 'tcp' } },
        grpc: { grpc: { port: webSrv.ports.grpc } },
        loopback: { httpGet: { path: '/healthz', port: 'http', host: 'localhost' } },
        redirect4: { httpGet: { path: to(`http://${other.ipv4}:${o}/healthz`), port: 'http' } },
        redirect6: { httpGet: { path: to(`http://[${other.ipv6}]:${o}/healthz`), port: 'http' } },
        host4: { tcpSocket: { port: o, host: other.ipv4 } },
        host6: { httpGet: { path: '/healthz', port: o, host: other.ipv6 } },
      }),
      podWithProbes('other', other, otherSrv, { http: { httpGet: { path: '/healthz', port: 'http' } } }),
    ],
  });
});

afterAll(async () => {
  await agent?.stop('SIGKILL').catch(() => {});
  await kubelet?.stop();
  if (nodeTable) {
    await run('nft', ['delete', 'table', 'inet', nodeTable], { allowFailure: true });
    await run('nft', ['delete', 'table', 'bridge', nodeTable], { allowFailure: true });
  }
  await lab?.destroy();
});

const byContainer = (s: ProbeStatus[], pod: string, c: string): ProbeStatus | undefined => s.find((x) => x.podName === pod && x.key.containerName === c);

describe('the daemon probing every kind of probe for several periods', () => {
  it('sends nothing from the node to any pod and nothing between pods: only each pod\'s own loopback carries probes', async () => {
    const zero = { ...(await nodeCounters()), drops: await lab.nodeToPodDrops() };
    expect(zero).toEqual({ node_to_pods: 0, routed_between_pods: 0, bridged_between_pods: 0, drops: 0 });
    const loBefore = (await podCounters(web)).via_lo ?? 0;

    agent = await startAgent({ kubeletUrl: kubelet.httpUrl, pollInterval: '300ms', expectedLogs: [{ level: 'warn', msg: 'probe errored; result kept', line: /"containerName":"host[46]".*"reason":"host-refused"/, why: 'probes with a host field naming another address are refused on purpose (they would leak traffic)' }] });
    const started = Date.now();
    const ok = (s: ProbeStatus[], pod: string, c: string): boolean => byContainer(s, pod, c)?.result === 'success';
    await agent.waitForStatuses((s) => s.length === 11 && s.every((x) => x.lastProbeTime > 0), 30_000);
    // Several periods of every probe.
    const statuses = await agent.waitForStatuses((s) => s.length === 11 && s.every((x) => x.lastProbeTime > started + 3500), 30_000);

    expect(await nodeCounters()).toEqual({ node_to_pods: 0, routed_between_pods: 0, bridged_between_pods: 0 });
    expect(await lab.nodeToPodDrops()).toBe(0);
    const inWeb = await podCounters(web);
    const inOther = await podCounters(other);
    expect(inWeb.via_eth0).toBe(0);
    expect(inOther.via_eth0).toBe(0);
    // Each probe is a handshake at least (3+ packets), each period: the loopback counter shows them.
    expect((inWeb.via_lo ?? 0) - loBefore).toBeGreaterThan(8 * 3 * 3);
    expect(inOther.via_lo ?? 0).toBeGreaterThan(3 * 3);

    for (const c of ['http', 'named', 'https', 'tcp', 'grpc', 'loopback']) expect(ok(statuses, 'web', c), c).toBe(true);
    expect(ok(statuses, 'other', 'http')).toBe(true);
    // kubelet does not follow a redirect to another host: the probe stops there, a warning.
    for (const c of ['redirect4', 'redirect6']) {
      expect(byContainer(statuses, 'web', c), c).toMatchObject({ result: 'success', lastMessage: expect.stringMatching(/^Probe terminated redirects, Response body: redirect to http:\/\//) });
    }
    // A refused host is a prober error: reported, thrown away (the decision keeps its initial value, never a failure).
    for (const c of ['host4', 'host6']) {
      expect(byContainer(statuses, 'web', c), c).toMatchObject({ lastReason: 'host-refused', onHold: false });
      expect(byContainer(statuses, 'web', c)?.result, c).not.toBe('failure');
    }
  }, 60_000);
});

describe('the counters count', () => {
  it('kubelet\'s path (--from-node) shows up on the node->pod counter and the lab\'s rule', async () => {
    const before = await nodeCounters();
    const r = await cli(['--from-node', '--pod-ip', web.ipv4, '--spec', JSON.stringify({ tcpSocket: { port: webSrv.ports.tcp } })]);
    expect(r.code, r.stderr).toBe(1);
    // The lab's rule answers the node's SYN with a reset: refused, at once.
    expect(JSON.parse(r.stdout)).toMatchObject({ result: 'failure', reason: 'refused' });
    const after = await nodeCounters();
    expect((after.node_to_pods ?? 0) - (before.node_to_pods ?? 0)).toBeGreaterThan(0);
    expect(await lab.nodeToPodDrops()).toBeGreaterThan(0);
  });

  it('a probe from one pod to another shows up on the bridge counter and on eth0 inside the pod', async () => {
    const before = await nodeCounters();
    const eth0 = (await podCounters(web)).via_eth0 ?? 0;
    // Told a wrong pod IP, the probe goes from web's netns to the other pod, across the bridge.
    const r = await cli(['--netns', web.netns, '--pod-ip', other.ipv4, '--spec', JSON.stringify({ tcpSocket: { port: otherSrv.ports.http } })]);
    expect(r.code, r.stderr).toBe(0);
    const after = await nodeCounters();
    expect((after.bridged_between_pods ?? 0) - (before.bridged_between_pods ?? 0)).toBeGreaterThan(0);
    expect(after.node_to_pods).toBe(before.node_to_pods);
    expect(((await podCounters(web)).via_eth0 ?? 0) - eth0).toBeGreaterThan(0);
  });
});
