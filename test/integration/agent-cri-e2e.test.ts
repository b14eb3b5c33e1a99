/**
 * The node agent end to end through a REAL containerd (the containerd lab: CRI, CNI bridge, pause
 * sandboxes): `probe-agent run --netns-resolvers cri` finds the pods a test kubelet lists, resolves
 * their sandbox netns over CRI and probes servers running inside those sandboxes, whose own nftables
 * rule rejects everything from outside (the kubelet hole is closed). Then the runtime goes away:
 * probes keep running from the cached netns, a new pod reports netns-unresolved, and once containerd
 * is back the new pod is probed. Host-network pods and pods in a sandboxed runtime are never probed.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'nsenter', 'containerd', 'ctr']);

import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmdirSync, rmSync, writeFileSync } from 'node:fs';
import { connectFromNode } from '../lab/net.ts';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CriClient } from '../../agent/netns/cri-client.ts';
import { CriResolver } from '../../agent/netns/cri-resolver.ts';
import { NetnsPathChecker } from '../../agent/netns/netns-path.ts';
import { NetnsResolverChain, outcomeOf } from '../../agent/netns/resolver.ts';
import type { ProbeStatus } from '../../agent/scheduler/types.ts';
import { createContainerdLab, type ContainerdLab, type LabSandbox } from '../lab/containerd.ts';
import { POD_SERVER_PATH } from '../lab/server.ts';
import { startAgent, type AgentHandle } from '../support/agent-harness.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { makePod } from '../support/pod-factory.ts';

const NS = 'e2e-cri';
const PORT = 8080;
/** nft table each guarded sandbox gets: in-netns traffic (lo) is counted and let through, the rest rejected. */
const GUARD = 'pa_e2e_guard';

/** test/lab/pod-server.ts inside a sandbox netns (`ip netns exec` cannot reach containerd's state dir). */
class SandboxServer {
  readonly child: ChildProcessWithoutNullStreams;
  #stderr = '';

  constructor(sb: LabSandbox) {
    this.child = spawn('nsenter', [`--net=${sb.netnsPath}`, '--', process.execPath, POD_SERVER_PATH, JSON.stringify({ http: PORT })]);
    this.child.stdin.on('error', () => {});
    this.child.stderr.on('data', (d: Buffer) => { this.#stderr = (this.#stderr + d.toString()).slice(-4000); });
  }

  /** Waits for the server's ready line. */
  async ready(): Promise<void> {
    const lines = createInterface({ input: this.child.stdout });
    const line = await new Promise<string | undefined>((resolve) => {
      const timer = setTimeout(() => resolve(undefined), 10_000);
      lines.on('line', (l) => { if (l.startsWith('ready ')) { clearTimeout(timer); resolve(l); } });
      this.child.once('close', () => { clearTimeout(timer); resolve(undefined); });
    });
    if (!line) throw new Error(`sandbox pod server did not start: ${this.#stderr}`);
  }

  /** Closing stdin makes the server exit; SIGKILL is the backstop. */
  async stop(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const closed = new Promise((r) => this.child.once('close', r));
    this.child.stdin.end();
    const timer = setTimeout(() => this.child.kill('SIGKILL'), 3000);
    await closed;
    clearTimeout(timer);
  }
}

let ctrd: ContainerdLab;
let kubelet: FakeKubelet;
let agent: AgentHandle;
let scratch: string;
const servers: SandboxServer[] = [];
let web: LabSandbox;
let secure: LabSandbox;
let hostnet: LabSandbox;

/** Installs the guard table in the sandbox's netns (a netns this test created through containerd). */
async function guard(sb: LabSandbox): Promise<void> {
  const file = join(scratch, `${sb.id}.nft`);
  writeFileSync(file, `table inet ${GUARD} {
  counter inside {}
  counter outside {}
  chain input {
    type filter hook input priority 0; policy accept;
    tcp dport ${PORT} iifname "lo" counter name "inside" accept
    tcp dport ${PORT} counter name "outside" reject with tcp reset
  }
}
`);
  const r = await ctrd.exec(sb, 'nft', ['-f', file]);
  if (r.code !== 0) throw new Error(`nft in sandbox ${sb.name}: ${r.stderr}`);
}

/** Packets the guard counted for `name` ('inside': from the pod's own netns; 'outside': rejected). */
async function counted(sb: LabSandbox, name: 'inside' | 'outside'): Promise<number> {
  const r = await ctrd.exec(sb, 'nft', ['-j', 'list', 'counter', 'inet', GUARD, name]);
  const items = (JSON.parse(r.stdout) as { nftables: { counter?: { packets: number } }[] }).nftables;
  return items.find((i) => i.counter)?.counter?.packets ?? -1;
}

async function startSandboxServer(sb: LabSandbox): Promise<void> {
  const s = new SandboxServer(sb);
  servers.push(s);
  await s.ready();
}

/** A kubelet-shaped pod for a sandbox: HTTP readiness on /healthz and TCP liveness, both every second. */
function podFor(sb: { uid: string; name: string; ips: string[] }, extra: { runtimeClassName?: string; hostNetwork?: boolean } = {}): Record<string, unknown> {
  const pod = makePod({ uid: sb.uid, name: sb.name, namespace: NS, ips: sb.ips, probe: 'http', port: PORT, ...extra });
  const app = (pod.spec as { containers: Record<string, unknown>[] }).containers[0] as Record<string, unknown>;
  app.readinessProbe = { httpGet: { path: '/healthz', port: PORT }, periodSeconds: 1, failureThreshold: 2 };
  app.livenessProbe = { tcpSocket: { port: 'http' }, periodSeconds: 1, failureThreshold: 3 };
  return pod;
}

function find(statuses: ProbeStatus[], pod: string, type: ProbeStatus['key']['probeType']): ProbeStatus | undefined {
  return statuses.find((s) => s.podName === pod && s.key.probeType === type);
}

/** The value of the series `name` whose labels include `want` in a Prometheus text scrape (undefined when absent). */
function sample(body: string, name: string, want: Record<string, string>): number | undefined {
  for (const line of body.split('\n')) {
    const m = /^([a-zA-Z_:][\w:]*)\{(.*)\} (\S+)$/.exec(line);
    if (!m || m[1] !== name) continue;
    const labels = Object.fromEntries([...(m[2] as string).matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)].map((l) => [l[1], l[2]]));
    if (Object.entries(want).every(([k, v]) => labels[k] === v)) return Number(m[3]);
  }
  return undefined;
}


beforeAll(async () => {
  const t = performance.now();
  scratch = mkdtempSync(join(tmpdir(), 'pa-cri-e2e-'));
  ctrd = await createContainerdLab();
  [web, secure, hostnet] = await Promise.all([
    ctrd.runSandbox({ name: 'web', namespace: NS }),
    // A RuntimeClass whose name says nothing ("secure-rc") but whose handler is sandboxed: only CRI knows.
    ctrd.runSandbox({ name: 'secure', namespace: NS, runtimeHandler: 'runsc' }),
    ctrd.runSandbox({ name: 'hostnet', namespace: NS, hostNetwork: true }),
  ]);
  await Promise.all([guard(web), guard(secure), startSandboxServer(web), startSandboxServer(secure)]);
  kubelet = await FakeKubelet.start({
    pods: [
      podFor(web),
      podFor(secure, { runtimeClassName: 'secure-rc' }),
      podFor({ ...hostnet, ips: ['127.0.0.1'] }, { hostNetwork: true }),
      // Its RuntimeClass is on the sandboxed list: left to kubelet without asking the runtime.
      podFor({ uid: randomUUID(), name: 'gvisor', ips: ['10.251.255.9'] }, { runtimeClassName: 'runsc' }),
    ],
  });
  agent = await startAgent({
    kubeletUrl: kubelet.httpUrl,
    resolvers: 'cri',
    args: [`--cri-endpoint=${ctrd.endpoint}`, `--netns-dir=${ctrd.netnsDir}`],
    expectedLogs: [{ level: 'warn', msg: 'probe errored; result kept', line: /"podUID":"[^"]+","containerName":"app","probeType":"(Liveness|Readiness)",.*"reason":"unsupported-pod","message":"pod \S+\/secure .*runtime handler \\"runsc\\" \(sandboxed\)/, why: 'pod "secure" runs under runsc on purpose: left to kubelet, and the agent says why' }],
  });
  console.log(`containerd lab, 3 sandboxes, servers and agent up in ${(performance.now() - t).toFixed(0)} ms`);
}, 45_000);

afterAll(async () => {
  await agent?.stop('SIGKILL').catch(() => {});
  await kubelet?.stop();
  await Promise.all(servers.map((s) => s.stop()));
  await ctrd?.destroy();
  if (scratch) rmSync(scratch, { recursive: true, force: true });
});

describe('probe-agent run with the CRI resolver against containerd', () => {
  it('resolves each sandbox netns through CRI and probes inside it, where the node cannot reach', async () => {
    const t = performance.now();
    const statuses = await agent.waitForStatuses((s) =>
      find(s, 'web', 'Readiness')?.result === 'success' && find(s, 'web', 'Liveness')?.result === 'success');
    console.log(`web ready through CRI ${(performance.now() - t).toFixed(0)} ms after the agent was up`);
    expect(find(statuses, 'web', 'Readiness')).toMatchObject({ ready: true, started: true, namespace: NS });
    // The probes arrived from inside the sandbox (on lo); from the node the port is closed.
    expect(await counted(web, 'inside')).toBeGreaterThan(0);
    expect(await counted(web, 'outside')).toBe(0);
    expect((await connectFromNode(web.ipv4, PORT)).result).toBe('ECONNREFUSED');
    expect(await counted(web, 'outside')).toBeGreaterThan(0);

    const metrics = (await agent.http('/metrics')).body;
    expect(sample(metrics, 'probe_agent_netns_resolutions_total', { resolver: 'cri', outcome: 'ok' })).toBeGreaterThanOrEqual(1);
    expect(sample(metrics, 'probe_agent_netns_resolutions_total', { resolver: 'procfs' }) ?? 0).toBe(0);
  });

  it('leaves host-network and sandboxed-runtime pods to kubelet, and never probes a runsc sandbox', async () => {
    const statuses = await agent.waitForStatuses((s) => find(s, 'secure', 'Readiness')?.lastReason === 'unsupported-pod');
    expect(statuses.filter((s) => s.podName === 'hostnet' || s.podName === 'gvisor')).toEqual([]);
    const sec = find(statuses, 'secure', 'Readiness');
    expect(sec).toMatchObject({ onHold: false, consecutive: 0 });
    expect(sec?.lastMessage).toMatch(/runtime handler "runsc" \(sandboxed\)/);
    // Not a packet reached the server in the runsc sandbox, from inside or out.
    expect(await counted(secure, 'inside')).toBe(0);
    expect(await counted(secure, 'outside')).toBe(0);

    const metrics = (await agent.http('/metrics')).body;
    expect(sample(metrics, 'probe_agent_pods', { state: 'host-network' })).toBe(1);
    expect(sample(metrics, 'probe_agent_pods', { state: 'sandboxed-runtime' })).toBe(1);
    expect(sample(metrics, 'probe_agent_pods', { state: 'ours' })).toBe(2);
    expect(sample(metrics, 'probe_agent_netns_resolutions_total', { resolver: 'cri', outcome: 'unsupported' })).toBeGreaterThanOrEqual(1);
    const probes = (await agent.http('/metrics/probes')).body;
    expect(probes).not.toMatch(/pod="(secure|hostnet|gvisor)"/);
  });

  it('survives a CRI outage: cached pods keep being probed, a new pod is netns-unresolved until containerd is back', async () => {
    const late = await ctrd.runSandbox({ name: 'late', namespace: NS });
    await Promise.all([guard(late), startSandboxServer(late)]);
    const before = find(await agent.waitForStatuses(() => true), 'web', 'Readiness') as ProbeStatus;
    const insideBefore = await counted(web, 'inside');

    agent.expectLogs({ level: 'warn', msg: 'probe errored; result kept', line: /"reason":"netns-unresolved","message":"netns of pod \S+\/(late|secure) .*CRI endpoint \S+ unavailable/, why: 'containerd is stopped on purpose: pods not yet resolved cannot be' });
    await ctrd.stopContainerd();
    const down = performance.now();
    try {
      kubelet.setPods([podFor(web), podFor(secure, { runtimeClassName: 'secure-rc' }), podFor(late)]);
      const during = await agent.waitForStatuses((s) => {
        const l = find(s, 'late', 'Readiness');
        const w = find(s, 'web', 'Readiness');
        return l?.lastReason === 'netns-unresolved' && (w?.lastProbeTime ?? 0) > before.lastProbeTime + 2000;
      });
      expect(find(during, 'late', 'Readiness')).toMatchObject({ onHold: false, consecutive: 0 });
      expect(find(during, 'late', 'Readiness')?.lastMessage).toContain(`CRI endpoint ${ctrd.endpoint} unavailable`);
      expect(find(during, 'late', 'Liveness')).toMatchObject({ onHold: false, consecutive: 0, lastReason: 'netns-unresolved' });
      // The runtime is down, the pods are not: web is still probed inside its netns, and still ready.
      expect(find(during, 'web', 'Readiness')).toMatchObject({ result: 'success', ready: true });
      expect(find(during, 'web', 'Liveness')?.result).toBe('success');
      expect(await counted(web, 'inside')).toBeGreaterThan(insideBefore);
      const metrics = (await agent.http('/metrics')).body;
      expect(sample(metrics, 'probe_agent_netns_resolutions_total', { resolver: 'cri', outcome: 'unavailable' })).toBeGreaterThanOrEqual(1);
      expect(await counted(late, 'inside')).toBe(0);
    } finally {
      await ctrd.startContainerd();
    }
    const up = performance.now();
    const after = await agent.waitForStatuses((s) =>
      find(s, 'late', 'Readiness')?.result === 'success' && find(s, 'late', 'Liveness')?.result === 'success', 20_000);
    console.log(`outage ${(up - down).toFixed(0)} ms; new pod probed ${(performance.now() - up).toFixed(0)} ms after containerd was back`);
    expect(find(after, 'late', 'Readiness')).toMatchObject({ ready: true });
    expect(await counted(late, 'inside')).toBeGreaterThan(0);
    expect(await counted(late, 'outside')).toBe(0);
  }, 45_000);

  it('a pod whose sandbox the runtime removed before the pod list shows it: netns-gone, logged at info as churn', async () => {
    const going = await ctrd.runSandbox({ name: 'going', namespace: NS });
    await startSandboxServer(going);
    kubelet.setPods([podFor(web), podFor(secure, { runtimeClassName: 'secure-rc' }), podFor(going)]);
    await agent.waitForStatuses((s) => find(s, 'going', 'Readiness')?.result === 'success', 20_000);
    await ctrd.stopSandbox(going.id);
    await ctrd.removeSandbox(going.id);
    // The pod list still shows it (kubelet's /pods lags the runtime): its workers keep asking.
    const after = await agent.waitForStatuses((s) => /no longer has a READY sandbox/.test(find(s, 'going', 'Readiness')?.lastMessage ?? ''), 20_000);
    // An error keeps the last result, as kubelet does.
    expect(find(after, 'going', 'Readiness')).toMatchObject({ lastReason: 'netns-gone', result: 'success', ready: true });
    const errored = agent.logs.filter((r) => r['msg'] === 'probe errored; result kept' && r['podUID'] === going.uid);
    expect(errored.length).toBeGreaterThan(0);
    expect(errored.map((r) => `${String(r['level'])} ${String(r['reason'])}`)).toEqual(errored.map(() => 'info netns-gone'));
  }, 45_000);

  it('exits 0 on SIGTERM', async () => {
    expect(await agent.stop('SIGTERM')).toBe(0);
  });
});

describe('probe-agent run with the host procfs mounted elsewhere (--proc-root)', () => {
  it('resolves the sandbox by its processes under the proc root, and the helper enters <proc root>/<pid>/ns/net', async () => {
    // As a DaemonSet without hostPID sees it: the host's procfs at another path.
    const hostProc = mkdtempSync(join(tmpdir(), 'pa-cri-e2e-proc-'));
    execFileSync('mount', ['--bind', '/proc', hostProc]);
    let procAgent: AgentHandle | undefined;
    try {
      kubelet.setPods([podFor(web)]);
      procAgent = await startAgent({ kubeletUrl: kubelet.httpUrl, resolvers: 'procfs', args: [`--proc-root=${hostProc}`, '--log-level=debug'] });
      const inside = await counted(web, 'inside');
      const statuses = await procAgent.waitForStatuses((s) =>
        find(s, 'web', 'Readiness')?.result === 'success' && find(s, 'web', 'Liveness')?.result === 'success');
      expect(find(statuses, 'web', 'Readiness')?.ready).toBe(true);
      expect(await counted(web, 'inside')).toBeGreaterThan(inside);
      // The netns the probes ran in was named under the proc root (a bind of /proc: /proc would work as well).
      const resolved = procAgent.logs.filter((l) => l.msg === 'netns resolved').map((l) => String(l.path));
      expect(resolved.length).toBeGreaterThan(0);
      for (const p of resolved) expect(p).toMatch(new RegExp(`^${hostProc}/\\d+/ns/net$`));
      const metrics = (await procAgent.http('/metrics')).body;
      expect(sample(metrics, 'probe_agent_netns_resolutions_total', { resolver: 'procfs', outcome: 'ok' })).toBeGreaterThanOrEqual(1);
      expect(sample(metrics, 'probe_agent_helper_spawns_total', { mode: 'pool', result: 'failure' }) ?? 0).toBe(0);
      expect(sample(metrics, 'probe_agent_helper_spawns_total', { mode: 'pool', result: 'success' })).toBeGreaterThanOrEqual(2);
      expect((await procAgent.http('/readyz?verbose')).body).toContain('[+]helper ok');
      expect(await procAgent.stop('SIGTERM')).toBe(0);
    } finally {
      await procAgent?.stop('SIGKILL').catch(() => {});
      execFileSync('umount', [hostProc]);
      // Never a recursive rm: it would walk the real /proc if the umount had not happened.
      rmdirSync(hostProc);
    }
  }, 30_000);
});

describe('the resolver chain during a runtime outage', () => {
  it('keeps using a pod\'s last netns past its TTL while CRI is unreachable, never for a pod it never resolved', async () => {
    const sb = await ctrd.runSandbox({ name: 'stale', namespace: NS });
    const other = await ctrd.runSandbox({ name: 'never', namespace: NS });
    const cri = new CriResolver({ client: new CriClient(ctrd.endpoint, { deadlineMs: 1000 }), pathChecker: new NetnsPathChecker({ extraDirs: [ctrd.netnsDir] }) });
    const outcomes: string[] = [];
    const chain = new NetnsResolverChain([cri], { cacheTtlMs: 100, onResolve: (_r, o) => outcomes.push(o) });
    const ref = (s: LabSandbox) => ({ uid: s.uid, namespace: NS, name: s.name, podIPs: s.ips });
    try {
      const first = await chain.resolve(ref(sb));
      await ctrd.stopContainerd();
      await new Promise((r) => setTimeout(r, 150));
      // Expired, and the runtime cannot be asked: the same netns (same inode) is still the pod's.
      expect(await chain.resolve(ref(sb))).toEqual(first);
      const err = await chain.resolve(ref(other)).then(() => undefined, (e: unknown) => e);
      expect(outcomeOf(err)).toBe('unavailable');
      // New pod IPs mean a new sandbox: the old netns is not reused for them.
      const moved = await chain.resolve({ ...ref(sb), podIPs: ['10.251.255.7'] }).then(() => undefined, (e: unknown) => e);
      expect(outcomeOf(moved)).toBe('unavailable');
      expect(outcomes).toEqual(['ok', 'unavailable', 'unavailable', 'unavailable']);
    } finally {
      await ctrd.startContainerd();
      cri.client.close();
    }
  }, 20_000);
});
