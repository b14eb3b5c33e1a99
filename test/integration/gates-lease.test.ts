/**
 * Gates mode's fail-closed option, end to end between two real processes: the agent renews its node
 * Lease (`run --gates --node-lease-duration`), the webhook watches the Leases
 * (`webhook --gates-lease-controller`). Killed, the agent stops renewing, and the webhook sets
 * probe-agent.io/ready False on that node's gates pods whose condition was True, once, and on no
 * other pod. Two webhook replicas run the controller: only the holder of the leader Lease
 * (`gates-lease-controller`) writes, and when it is killed the other takes over. An API server
 * outage longer than a Lease expires no one (the controller restarts every Lease's clock after
 * its own failed polls). The API server is the stand-in (test/support/api-server-standin.ts: a real
 * kube-apiserver cannot run in CI; its `down` is the outage), which holds the Leases and Pods and
 * records every write, with the token of the replica that sent it.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { writeFileSync } from 'node:fs';
import { LEADER_LEASE_NAME } from '../../agent/gates/leader.ts';
import { GATES_CONDITION } from '../../agent/rewrite/gates-rewrite.ts';
import { startAgent, type AgentHandle } from '../support/agent-harness.ts';
import { startApiServerStandIn, type ApiServerStandIn } from '../support/api-server-standin.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { LogLines, trackLogs } from '../support/log-check.ts';

type Obj = Record<string, any>;

const ROOT = new URL('../..', import.meta.url).pathname;
const LEASE_NS = 'probe-agent';

let dir: string;
let api: ApiServerStandIn;
let kubelet: FakeKubelet;
let agent: AgentHandle;
/** The two webhook replicas, by leader identity. */
const webhooks = new Map<string, ChildProcess>();
let renewOther: NodeJS.Timeout;
/** node-b's agent renews (the test does it for it) while this is true. */
let nodeBAlive = true;
/** node-b's Lease lasts longer than the outage below, node-a's (the real agent's) less. */
const NODE_B_LEASE_SECONDS = 10;

function pod(name: string, node: string, gate: 'True' | 'False' | 'none' | 'not-gated'): Obj {
  const conditions: Obj[] = [{ type: 'Ready', status: gate === 'True' || gate === 'not-gated' ? 'True' : 'False' }];
  if (gate === 'True' || gate === 'False') conditions.push({ type: GATES_CONDITION, status: gate, reason: 'ProbesSucceeded' });
  return {
    apiVersion: 'v1', kind: 'Pod',
    metadata: { name, namespace: 'shop', uid: `uid-${name}` },
    spec: { nodeName: node, containers: [{ name: 'app', image: 'app' }], ...(gate === 'not-gated' ? {} : { readinessGates: [{ conditionType: GATES_CONDITION }] }) },
    status: { phase: 'Running', conditions },
  };
}

const statusPatches = (): string[] => api.requests.filter((r) => r.method === 'PATCH' && r.url.endsWith('/status')).map((r) => r.url);
/** Who sent each status patch (each replica has a token of its own). */
const patchers = (): string[] => api.requests.filter((r) => r.method === 'PATCH' && r.url.endsWith('/status')).map((r) => r.authorization ?? '');
const leaderLease = (): Obj | undefined => api.leases.get(`${LEASE_NS}/${LEADER_LEASE_NAME}`);
const gateOf = (name: string): Obj | undefined => api.pods.find((p) => p.metadata.name === name)!.status.conditions.find((c: Obj) => c.type === GATES_CONDITION);
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

async function until(what: string, pred: () => boolean, timeoutMs = 30_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!pred()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}; status patches ${JSON.stringify(statusPatches())}`);
    await sleep(50);
  }
}

beforeAll(async () => {
  dir = mkdtempSync(path.join(tmpdir(), 'pa-gates-lease-'));
  const key = path.join(dir, 'tls.key');
  const cert = path.join(dir, 'tls.crt');
  const ssl = spawnSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', key, '-out', cert, '-subj', '/CN=probe-agent-webhook', '-days', '1'], { encoding: 'utf8' });
  if (ssl.status !== 0) throw new Error(`openssl: ${ssl.stderr}`);
  api = await startApiServerStandIn();
  api.pods.push(pod('a-ready', 'node-a', 'True'), pod('a-not-ready', 'node-a', 'False'), pod('a-new', 'node-a', 'none'), pod('a-plain', 'node-a', 'not-gated'), pod('b-ready', 'node-b', 'True'));
  // node-b's agent is alive: its Lease is renewed all along.
  const renewB = (): void => {
    if (!nodeBAlive) return;
    api.leases.set(`${LEASE_NS}/probe-agent-node-b`, { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: 'probe-agent-node-b', namespace: LEASE_NS }, spec: { holderIdentity: 'node-b', leaseDurationSeconds: NODE_B_LEASE_SECONDS, renewTime: new Date().toISOString() } });
  };
  renewB();
  renewOther = setInterval(renewB, 500);
  kubelet = await FakeKubelet.start({ pods: [] });
  agent = await startAgent({ kubeletUrl: kubelet.httpUrl, args: ['--gates', `--api-server=${api.url}`, '--node-name=node-a', '--node-lease-duration=3s', `--node-lease-namespace=${LEASE_NS}`] });
  for (const id of ['webhook-a', 'webhook-b']) {
    const token = path.join(dir, `token-${id}`);
    writeFileSync(token, `token-of-${id}\n`);
    const proc = spawn(process.execPath, [path.join(ROOT, 'agent/cli.ts'), 'webhook', '--listen=127.0.0.1:0', `--tls-cert-file=${cert}`, `--tls-key-file=${key}`,
      `--api-server-url=${api.url}`, `--api-token-file=${token}`, '--gates-lease-controller', '--gates-lease-interval=1s', `--gates-lease-namespace=${LEASE_NS}`,
      '--gates-leader-lease-duration=12s', `--gates-leader-identity=${id}`, '--log-format=json'], { stdio: ['ignore', 'ignore', 'pipe'] });
    webhooks.set(id, proc);
    const lines = new LogLines();
    proc.stderr!.setEncoding('utf8');
    proc.stderr!.on('data', (c: string) => lines.push(c));
    trackLogs(`webhook ${id} pid ${proc.pid}`, lines.records, [
      { level: 'warn', msg: /^admission callers are not verified/, why: 'no client CA: this test sends the webhook no reviews, only its lease controller runs' },
      { level: 'warn', msg: 'node leases not read', line: /stand-in outage/, why: 'the API server outage the test makes' },
      { level: 'warn', msg: /^leader lease not (read|written)$/, line: /stand-in outage/, why: 'the API server outage the test makes' },
    ]);
    await until(`webhook ${id}'s lease controller`, () => lines.records.some((r) => r.msg === 'gates lease controller on'));
  }
  agent.expectLogs({ level: 'warn', msg: 'node lease not renewed', line: /stand-in outage/, why: 'the API server outage the test makes' });
}, 60_000);

afterAll(async () => {
  clearInterval(renewOther);
  await agent?.stop('SIGKILL').catch(() => {});
  await Promise.all([...webhooks.values()].map(async (w) => {
    if (w.exitCode !== null || w.signalCode !== null) return;
    const gone = new Promise((r) => w.once('exit', r));
    w.kill('SIGTERM');
    await gone;
  }));
  await kubelet?.stop();
  await api?.close();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe('gates lease controller (webhook) and the agent node Lease', () => {
  it('leaves pods alone while the agent renews its Lease', async () => {
    await until("the agent's Lease", () => api.leases.has(`${LEASE_NS}/probe-agent-node-a`));
    expect(api.leases.get(`${LEASE_NS}/probe-agent-node-a`)!.spec).toMatchObject({ holderIdentity: 'node-a', leaseDurationSeconds: 3 });
    // Longer than the Lease's duration, several polls: nothing written.
    await sleep(5000);
    expect(statusPatches()).toEqual([]);
    // One replica holds the leader Lease.
    await until('a leader', () => webhooks.has(leaderLease()?.spec?.holderIdentity));
  });

  it('an API server outage longer than a Lease expires no one: every clock restarts after it', async () => {
    const leader = leaderLease()!.spec.holderIdentity;
    const token = `Bearer token-of-${leader}`;
    // Longer than both Leases; node-b's agent, cut off too, renews only after the leader acts again.
    nodeBAlive = false;
    api.down = true;
    await sleep((NODE_B_LEASE_SECONDS + 2) * 1000);
    const recovered = Date.now();
    api.down = false;
    // The leader renews its own Lease, then reads the node Leases as leader: the read that found
    // every Lease stale before the controller restarted their clocks.
    await until('the leader leading again and reading the node Leases', () => {
      const mine = api.requests.filter((r) => r.time >= recovered && r.authorization === token);
      const renewed = mine.find((r) => r.method === 'PUT' && r.url.endsWith(`/leases/${LEADER_LEASE_NAME}`))?.time;
      return renewed !== undefined && mine.some((r) => r.time > renewed && r.method === 'GET' && r.url.endsWith(`/namespaces/${LEASE_NS}/leases`));
    });
    nodeBAlive = true;
    // Several polls more: nothing written, on either node.
    await sleep(5000);
    expect(statusPatches()).toEqual([]);
    expect(gateOf('a-ready')?.status).toBe('True');
    expect(gateOf('b-ready')?.status).toBe('True');
    expect(leaderLease()!.spec.holderIdentity).toBe(leader);
  });

  it("sets the gate False on the dead agent's node, once, on the pods whose gate was True", async () => {
    expect(await agent.stop('SIGKILL')).toBe('SIGKILL');
    await until('the write for a-ready', () => gateOf('a-ready')?.status === 'False');
    expect(gateOf('a-ready')).toMatchObject({ status: 'False', reason: 'NodeLeaseExpired' });
    const patch = api.requests.find((r) => r.url.endsWith('/status'))!;
    expect(patch.body).toMatchObject({ metadata: { uid: 'uid-a-ready' } });
    // Several polls more: the node was swept, nothing else written; node-b (renewed) untouched.
    await sleep(4000);
    expect(statusPatches()).toEqual(['/api/v1/namespaces/shop/pods/a-ready/status']);
    expect(gateOf('b-ready')?.status).toBe('True');
    expect(gateOf('a-new')).toBeUndefined();
    // Written by the leader alone.
    expect(patchers()).toEqual([`Bearer token-of-${leaderLease()!.spec.holderIdentity}`]);
  });

  it('the leader killed, the other replica takes the leader Lease once it lapsed, and acts', async () => {
    const first = leaderLease()!.spec.holderIdentity as string;
    const second = [...webhooks.keys()].find((id) => id !== first)!;
    const w = webhooks.get(first)!;
    const gone = new Promise((r) => w.once('exit', r));
    w.kill('SIGKILL');
    await gone;
    // A pod of the dead node that went True meanwhile (the agent's last write, say).
    api.pods.push(pod('a-late', 'node-a', 'True'));
    await until('the other replica leads', () => leaderLease()?.spec?.holderIdentity === second, 60_000);
    await until('the write for a-late', () => gateOf('a-late')?.status === 'False', 30_000);
    expect(patchers()).toEqual([`Bearer token-of-${first}`, `Bearer token-of-${second}`]);
    expect(leaderLease()!.spec).toMatchObject({ holderIdentity: second, leaseTransitions: 1, leaseDurationSeconds: 12 });
  });
});
