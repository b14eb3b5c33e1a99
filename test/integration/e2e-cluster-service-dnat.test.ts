/**
 * The `kubernetes` Service rule of test/e2e-cluster (service-dnat.ts), in real nftables: two runs'
 * tables in one node netns, as two e2e-cluster runs on one machine have them. Each run's pods reach
 * their own API server at 10.96.0.1:443, and a source of neither run is not redirected. Unscoped,
 * the rule registered first took both runs' pods: a CRI-O run's rollback then failed at
 * `install-shim.sh unlabel`, whose label patch went to the other run's API server.
 *
 * The node and the pods are private netns (unshare): node netns N holds the two API servers (on
 * addresses of its lo, as e2e-cluster puts node addresses on lo) and the rules; pod netns P has an
 * address in each run's pod subnet and one in neither, behind a veth into N. Root only.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { serviceDnatTable } from '../e2e-cluster/service-dnat.ts';

const SERVICE_IP = '10.96.0.1';
const RUNS = [
  { table: 'pa_e2e_cluster_1', api: { ip: '10.252.1.1', port: 38001 }, podSubnets: ['10.251.1.0/24', '10.251.2.0/24'], pod: '10.251.1.2' },
  { table: 'pa_e2e_cluster_3', api: { ip: '10.252.3.1', port: 38003 }, podSubnets: ['10.251.3.0/24', '10.251.4.0/24'], pod: '10.251.4.2' },
];
/** A pod address in no run's subnets. */
const STRANGER = '10.251.9.2';

const children: ChildProcess[] = [];
let node = 0;
let pod = 0;

function holder(): number {
  const c = spawn('unshare', ['--net', 'sleep', '600'], { stdio: 'ignore' });
  children.push(c);
  return c.pid!;
}

/** Runs a shell script in the netns of `pid`; throws with its stderr when it fails. */
function inNetns(pid: number, script: string, input?: string): string {
  const r = spawnSync('nsenter', [`--net=/proc/${pid}/ns/net`, 'sh', '-ec', script], { encoding: 'utf8', input, timeout: 30_000 });
  if (r.status !== 0) throw new Error(`in netns of ${pid}: ${script}: ${r.stderr}`);
  return r.stdout;
}

/** A TCP server in node netns N at `ip:port` that writes `name` to each connection and closes it. */
function server(ip: string, port: number, name: string): Promise<void> {
  const code = `require('node:net').createServer((s) => s.end(${JSON.stringify(name)})).listen(${port}, ${JSON.stringify(ip)}, () => console.log('up'))`;
  const c = spawn('nsenter', [`--net=/proc/${node}/ns/net`, process.execPath, '-e', code], { stdio: ['ignore', 'pipe', 'inherit'] });
  children.push(c);
  return new Promise((resolve, reject) => {
    c.stdout!.once('data', () => resolve());
    c.once('exit', (exit) => reject(new Error(`server ${name} exited ${exit}`)));
  });
}

/** Which server a connection from pod address `from` to the Service reaches ('' when none answers). */
function reach(from: string): string {
  const code = `const s = require('node:net').connect({ host: ${JSON.stringify(SERVICE_IP)}, port: 443, localAddress: ${JSON.stringify(from)} });
let got = ''; s.setTimeout(3000, () => s.destroy()); s.on('data', (d) => { got += d; }); s.on('close', () => console.log(got)); s.on('error', () => {});`;
  const r = spawnSync('nsenter', [`--net=/proc/${pod}/ns/net`, process.execPath, '-e', code], { encoding: 'utf8', timeout: 30_000 });
  return r.stdout.trim();
}

beforeAll(async () => {
  node = holder();
  pod = holder();
  await new Promise((r) => setTimeout(r, 200));
  // The pod netns: one address in each run's pod subnet and one in neither, all behind one veth.
  inNetns(node, `ip link set lo up
ip addr add ${RUNS[0]!.api.ip}/32 dev lo
ip addr add ${RUNS[1]!.api.ip}/32 dev lo
ip link add v0 type veth peer name v1 netns ${pod}
ip addr add 10.251.0.1/16 dev v0
ip link set v0 up`);
  inNetns(pod, `ip link set lo up
for a in ${RUNS[0]!.pod} ${RUNS[1]!.pod} ${STRANGER}; do ip addr add $a/16 dev v1; done
ip link set v1 up
ip route add default via 10.251.0.1`);
  for (const run of RUNS) {
    await server(run.api.ip, run.api.port, run.table);
    inNetns(node, 'nft -f -', serviceDnatTable(run.table, { serviceIp: SERVICE_IP, apiServer: run.api, podSubnets: run.podSubnets }));
  }
}, 60_000);

afterAll(() => {
  for (const c of children) c.kill('SIGKILL');
});

describe('e2e-cluster: the kubernetes Service rule of two runs on one machine', () => {
  it('each run\'s pods reach their own API server, whichever table came first; other sources are left alone', () => {
    expect(RUNS.map((run) => reach(run.pod))).toEqual(RUNS.map((run) => run.table));
    expect(reach(STRANGER)).toBe('');
  }, 60_000);

  it('refuses a run with no pod subnet (its rule would match nothing)', () => {
    expect(() => serviceDnatTable('t', { serviceIp: SERVICE_IP, apiServer: RUNS[0]!.api, podSubnets: [] })).toThrow(/no pod subnet/);
  });
});
