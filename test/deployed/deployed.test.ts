/**
 * The image as shipped, run the way a node runs the DaemonSet: deploy/base with the containerd,
 * host-network and nftables-close-hole components is rendered with kustomize, its pod template is
 * translated into kubelet's CRI requests (test/deployed/kubelet-translate.ts) and started on the
 * lab's real containerd from build/probe-agent-image.tar (make image). Next to it run real CRI pod
 * sandboxes with servers inside; the fake kubelet lists them. The agent must probe them from inside
 * their netns, serve its socket on the host path and its metrics, answer `probe-agent status` from
 * the host; the close-hole sidecar must program the node's nftables. The posture the runtime
 * applied (capabilities, seccomp, no_new_privs, read-only root, memory limit) is read back from
 * the kernel. Without SYS_ADMIN the agent must say so and stop, not hang. The kubelet-shim
 * installer DaemonSet runs from the same image against a scratch host root.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'nsenter', 'containerd', 'ctr', 'kubectl']);
import { requireGrpcGoPeer } from '../support/grpc-go-cri.ts';
requireGrpcGoPeer();

import { execFile, execFileSync, spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { chownSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readlinkSync, realpathSync, rmSync, statSync, writeFileSync } from 'node:fs';
import * as net from 'node:net';
import { connectFromNode } from '../lab/net.ts';
import { labScratch } from '../lab/slots.ts';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import * as http from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createContainerdLab, kubeletCgroupParent, type ContainerdLab, type LabSandbox } from '../lab/containerd.ts';
import { slotLayout } from '../lab/containerd-sweep.ts';
import { POD_SERVER_PATH } from '../lab/server.ts';
import { builtCli, builtEntry } from '../support/built-cli.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { relist, type Relist } from '../support/grpc-go-cri.ts';
import { makePod, makePods } from '../support/pod-factory.ts';
import { agentPatchHead, agentPid, agentPorts, freePort, memoryCgroup, renderDeploy, useAgentPorts, type AgentPorts } from './agent-pod.ts';
import { CriPodRunner, type ContainerState } from './cri-pod.ts';
import { containerConfig, execProbeRequests, quantity, sandboxConfig, unmountPodVolumes, type PodPlacement } from './kubelet-translate.ts';

const run = promisify(execFile);
const REPO = fileURLToPath(new URL('../..', import.meta.url));
const IMAGE_TAR = path.join(REPO, 'build/probe-agent-image.tar');
const VERSION = (JSON.parse(readFileSync(path.join(REPO, 'package.json'), 'utf8')) as { version: string }).version;
const NS = 'deployed';
const APP_PORT = 8080;
const TOKEN = `deployed-${randomUUID()}`;

type Obj = Record<string, unknown>;

let ctrd: ContainerdLab;
let runner: CriPodRunner;
let kubelet: FakeKubelet;
let scratch: string;
let rendered: Obj[];
let template: Obj;
let configMaps: Record<string, Record<string, string>>;
let ports: AgentPorts;
let metricsPort: number;
let table: string;
let socketDir: string;
let agentPod: { sandboxId: string; containerIds: string[]; place: PodPlacement } | undefined;
let apps: LabSandbox[] = [];
const servers: ChildProcessWithoutNullStreams[] = [];
const pods: string[] = [];

/** kustomize overlay: the shipped base and components plus what differs on this lab node. */
function renderOverlay(dir: string, lay: ReturnType<typeof slotLayout>, components = ['containerd', 'host-network', 'nftables-close-hole']): Obj[] {
  const closeHole = components.includes('nftables-close-hole');
  const closeHolePatch = closeHole ? `  # As docs/deploy.md tells operators: the pod CIDRs and the interface to this node's pods.
  - target:
      kind: ConfigMap
      name: probe-agent-close-hole
    patch: |-
      - {op: replace, path: /data/CLOSE_HOLE_POD_CIDRS, value: "${lay.subnet4},${lay.subnet6}"}
      - {op: replace, path: /data/CLOSE_HOLE_POD_INTERFACES, value: "${lay.bridge}"}
      - {op: replace, path: /data/CLOSE_HOLE_INTERVAL, value: "1"}
      - {op: add, path: /data/CLOSE_HOLE_TABLE, value: "${table}"}
      - {op: replace, path: /data/CLOSE_HOLE_METRICS_PORT, value: "${metricsPort}"}
` : '';
  // The lab node's containerd keeps its socket and state in a private dir, not /run/containerd
  // (pod netns paths then carry that dir: mount it at the same path, as the component says);
  // the kubelet listens on loopback; the host paths live in this test's scratch dir.
  return renderDeploy(dir, components, `${agentPatchHead(ports)}            - name: PROBE_AGENT_KUBELET_URL
              value: ${kubelet.httpsUrl}
            - name: PROBE_AGENT_NETNS_DIR
              value: ${ctrd.netnsDir}
          volumeMounts:
            - name: lab-containerd-state
              mountPath: ${path.join(ctrd.dir, 'state')}
              readOnly: true
              mountPropagation: HostToContainer
${closeHole ? `        - name: close-hole
          env:
            - name: POD_IP
              valueFrom:
                fieldRef:
                  fieldPath: status.podIP
            - name: CLOSE_HOLE_AGENT_ADDRESS
              value: "127.0.0.1:${ports.health}"
` : ''}      volumes:
        - name: probe-socket-dir
          hostPath:
            path: ${socketDir}
        - name: containerd-run
          hostPath:
            path: ${ctrd.dir}
        - name: lab-containerd-state
          hostPath:
            path: ${path.join(ctrd.dir, 'state')}
            type: Directory
`, closeHolePatch);
}

function placement(name: string, uid: string): PodPlacement {
  const podDir = path.join(scratch, 'pods', uid);
  return {
    nodeName: 'lab-node', hostIP: '127.0.0.1', podIP: '127.0.0.1', uid, name, namespace: 'probe-agent', podDir,
    logDir: path.join(scratch, 'logs', `probe-agent_${name}_${uid}`),
    cgroupParent: kubeletCgroupParent(ctrd.cgroupPrefix, uid, 'burstable'),
    imageRef: (image) => (image.includes('/') ? image : `docker.io/library/${image}`),
    // kubelet passes hostPath paths as written. containerd checks that a HostToContainer source
    // is on a shared mount without following symlinks: /var/run/netns is judged by "/", which a
    // node's systemd makes shared and this machine leaves private. The resolved path is the
    // same directory (/var/run -> /run) on a shared mount.
    hostPath: (p) => realpathSync(p),
    configMaps,
    serviceAccount: { token: TOKEN, caCrt: readFileSync(kubelet.certs.caFile, 'utf8') },
  };
}

/** Starts the pod template (possibly edited) through CRI like kubelet; returns its ids. */
async function startAgentPod(tpl: Obj, name: string, maps?: PodPlacement['configMaps']): Promise<{ sandboxId: string; containerIds: string[]; place: PodPlacement }> {
  const uid = randomUUID();
  const place = { ...placement(name, uid), ...(maps ? { configMaps: maps } : {}) };
  mkdirSync(place.logDir, { recursive: true });
  const names = ((tpl.spec as Obj).containers as Obj[]).map((c) => String(c.name));
  const ids = await runner.runPod(sandboxConfig(tpl, place), names.map((n) => containerConfig(tpl, n, place)));
  pods.push(ids.sandboxId);
  return { ...ids, place };
}

/** The tail of a container's CRI log (what `kubectl logs` shows), for failure messages. */
async function logTail(pod: { containerIds: string[]; place: PodPlacement }, index: number, lines = 8): Promise<string> {
  try {
    const st = await runner.status(pod.containerIds[index] as string);
    const file = path.isAbsolute(st.logPath) ? st.logPath : path.join(pod.place.logDir, st.logPath);
    return `${st.state} exit ${st.exitCode}: ` + readFileSync(file, 'utf8').trim().split('\n').slice(-lines).join('\n');
  } catch (err) {
    return `(no log: ${(err as Error).message})`;
  }
}

function hex(status: string, field: string): string {
  return new RegExp(`^${field}:\\s*(\\S+)`, 'm').exec(status)?.[1] ?? '';
}

async function waitFor<T>(what: string, fn: () => Promise<T | undefined> | T | undefined, timeoutMs = 60_000): Promise<T> {
  const end = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await fn();
      if (v !== undefined && v !== false) return v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}${last ? `: ${(last as Error).message}` : ''}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

async function httpGet(p: string): Promise<{ status: number; body: string }> {
  const res = await fetch(`http://127.0.0.1:${metricsPort}${p}`, { signal: AbortSignal.timeout(5000) });
  return { status: res.status, body: await res.text() };
}


/** test/lab/pod-server.ts inside a sandbox's netns. */
async function startServer(sb: LabSandbox): Promise<void> {
  const child = spawn('nsenter', [`--net=${sb.netnsPath}`, '--', process.execPath, POD_SERVER_PATH, JSON.stringify({ http: APP_PORT })]);
  servers.push(child);
  child.stdin.on('error', () => {});
  const lines = createInterface({ input: child.stdout });
  const ok = await new Promise<boolean>((resolve) => {
    const t = setTimeout(() => resolve(false), 15_000);
    lines.on('line', (l) => { if (l.startsWith('ready ')) { clearTimeout(t); resolve(true); } });
  });
  if (!ok) throw new Error(`pod server in ${sb.name} did not start`);
}

function appPod(sb: LabSandbox): Obj {
  const pod = makePod({ uid: sb.uid, name: sb.name, namespace: NS, ips: sb.ips, probe: 'http', port: APP_PORT });
  const app = ((pod.spec as Obj).containers as Obj[])[0] as Obj;
  app.readinessProbe = { httpGet: { path: '/healthz', port: APP_PORT }, periodSeconds: 1, failureThreshold: 2 };
  app.livenessProbe = { tcpSocket: { port: APP_PORT }, periodSeconds: 1, failureThreshold: 3 };
  return pod;
}

beforeAll(async () => {
  if (!existsSync(IMAGE_TAR)) throw new Error(`${IMAGE_TAR} is missing: run \`make image\` first (make test-deployed does)`);
  const t0 = performance.now();
  scratch = labScratch('deployed-');
  socketDir = path.join(scratch, 'host-run-probe-agent');
  ctrd = await createContainerdLab();
  // HostToContainer (rslave) mounts need a shared or slave source: on a node systemd makes every
  // mount shared, here / is private. Share the lab containerd's dir as a node would (the lab's
  // sweep unmounts everything under it).
  execFileSync('mount', ['--bind', ctrd.dir, ctrd.dir]);
  execFileSync('mount', ['--make-rshared', ctrd.dir]);
  const lay = slotLayout(ctrd.slot);
  table = `pa_deployed_${ctrd.slot}`;
  runner = new CriPodRunner(ctrd.socket);
  const tImport = performance.now();
  await run('ctr', ['--address', ctrd.socket, '-n', 'k8s.io', 'images', 'import', '--snapshotter', 'overlayfs', IMAGE_TAR], { timeout: 120_000 });
  console.log(`image imported in ${(performance.now() - tImport).toFixed(0)} ms`);

  apps = await Promise.all([ctrd.runSandbox({ name: 'web-a', namespace: NS }), ctrd.runSandbox({ name: 'web-b', namespace: NS })]);
  await Promise.all(apps.map(startServer));
  kubelet = await FakeKubelet.start({ token: TOKEN, pods: apps.map(appPod) });
  ports = await agentPorts();
  metricsPort = ports.metrics;
  const overlay = path.join(scratch, 'overlay');
  mkdirSync(overlay);
  rendered = renderOverlay(overlay, lay);
  const ds = rendered.find((o) => o.kind === 'DaemonSet') as Obj;
  template = (ds.spec as Obj).template as Obj;
  configMaps = Object.fromEntries(rendered.filter((o) => o.kind === 'ConfigMap')
    .map((o) => [String((o.metadata as Obj).name), o.data as Record<string, string>]));
  agentPod = await startAgentPod(template, 'probe-agent-lab');
  console.log(`containerd lab, 2 app sandboxes and the agent pod started in ${(performance.now() - t0).toFixed(0)} ms`);
}, 180_000);

afterAll(async () => {
  for (const id of pods.reverse()) await runner?.removePod(id).catch(() => {});
  runner?.close();
  await kubelet?.stop();
  for (const s of servers) s.kill('SIGKILL');
  await ctrd?.destroy();
  // The sidecar removes its table on SIGTERM; a killed test must not leave it behind either.
  if (table) execFile('nft', ['delete', 'table', 'inet', table], () => {});
  // The pods' memory-backed emptyDirs (tmpfs), as kubelet unmounts them when it removes a pod.
  if (scratch) unmountPodVolumes(scratch);
  if (scratch) rmSync(scratch, { recursive: true, force: true });
}, 120_000);

describe('the image run through containerd with the rendered DaemonSet posture', () => {
  it('probes the CRI sandboxes from inside their netns and reports them on the host socket and metrics', async () => {
    const t = performance.now();
    const status = await waitFor('probe-agent status from the host to list both pods ready', async () => {
      if ((await runner.status(agentPod!.containerIds[0] as string)).state !== 'CONTAINER_RUNNING') throw new Error(`agent not running: ${await logTail(agentPod!, 0)}`);
      const { stdout } = await run(builtCli(), ['status', '--socket', path.join(socketDir, 'probe.sock'), '--output', 'json'], { timeout: 10_000 });
      const list = JSON.parse(stdout) as { statuses: { pod: string; probeType?: string; result: string; ready?: boolean }[] };
      const ready = list.statuses.filter((s) => s.result === 'success');
      // Readiness and liveness of both pods.
      return apps.every((a) => ready.filter((s) => s.pod === a.name).length >= 2) ? list : undefined;
    }, 90_000).catch(async (err: Error) => { throw new Error(`${err.message}\nagent log: ${await logTail(agentPod!, 0)}`); });
    console.log(`both pods probed successfully ${(performance.now() - t).toFixed(0)} ms after the pod started`);
    expect(status.statuses.filter((s) => s.result === 'success').length).toBeGreaterThanOrEqual(4);
    // The socket is on the host path, owner-only.
    expect(statSync(path.join(socketDir, 'probe.sock')).mode & 0o777).toBe(0o600);
    const metrics = await httpGet('/metrics');
    expect(metrics.status).toBe(200);
    expect(metrics.body).toMatch(/probe_agent_netns_resolutions_total\{[^}]*resolver="cri"[^}]*outcome="ok"/);
    expect((await httpGet('/readyz')).status).toBe(200);
  }, 120_000);

  it('the close-hole sidecar programs the node nftables table: the node cannot reach the pods, the agent still probes', async () => {
    await waitFor(`nft table inet ${table}`, async () => (await run('nft', ['list', 'table', 'inet', table]).then(() => true, () => undefined)), 30_000)
      .catch(async (err: Error) => { throw new Error(`${err.message}\nsidecar log: ${await logTail(agentPod!, 1)}`); });
    for (const a of apps) expect((await connectFromNode(a.ipv4, APP_PORT)).result).toBe('ECONNREFUSED');
    const before = await httpGet('/metrics');
    const count = (body: string): number => [...body.matchAll(/^prober_probe_total\{[^}]*result="successful"[^}]*\} (\d+)/gm)].reduce((n, m) => n + Number(m[1]), 0);
    await waitFor('more successful probes with the hole closed', async () => (count((await httpGet('/metrics')).body) > count(before.body) + 2 ? true : undefined), 20_000);
    // The sidecar's state file reaches the agent through their shared emptyDir (medium Memory):
    // one tmpfs of the volume's sizeLimit on the node, bound into both containers.
    await waitFor('the agent to export the sidecar\'s state: table present', async () =>
      (/^probe_agent_close_hole_table_present(\{[^}]*\})? 1$/m.test((await httpGet('/metrics')).body) ? true : undefined), 20_000);
    const stateDir = path.join(agentPod!.place.podDir, 'volumes/kubernetes.io~empty-dir/close-hole-state');
    const fs = readFileSync('/proc/self/mountinfo', 'utf8').split('\n').map((l) => l.split(' ')).find((f) => f[4] === stateDir);
    expect(fs?.slice(fs.indexOf('-') + 1, fs.indexOf('-') + 2)).toEqual(['tmpfs']);
    expect(fs?.at(-1)).toMatch(/(^|,)size=1024k(,|$)/);
    expect(readFileSync(path.join(stateDir, 'state'), 'utf8')).toMatch(/^table_present 1$/m);
  }, 90_000);

  it('the close-hole table refuses pods\' new connections to the agent\'s metrics port on the node, and only that port', async () => {
    await waitFor(`nft table inet ${table}`, async () => (await run('nft', ['list', 'table', 'inet', table]).then(() => true, () => undefined)), 30_000);
    // In a cluster the agent binds the node IP; here listeners on the node's address on the pods'
    // bridge stand in for it (the lab agent binds loopback): one on the metrics port the table
    // guards, one on another port (the control: same pods, same address).
    const bridgeIp = /inet (\S+)\//.exec(execFileSync('ip', ['-4', '-o', 'addr', 'show', 'dev', slotLayout(ctrd.slot).bridge], { encoding: 'utf8' }))?.[1] as string;
    expect(bridgeIp).toBeTruthy();
    const other = await freePort();
    const stands = [metricsPort, other].map((port) => {
      const srv = net.createServer((c) => c.end());
      return { srv, up: new Promise<void>((r) => srv.listen(port, bridgeIp, r)) };
    });
    await Promise.all(stands.map((x) => x.up));
    try {
      const fromPod = (sb: LabSandbox, port: number): Promise<number> => new Promise((resolve) => {
        const child = spawn('nsenter', [`--net=${sb.netnsPath}`, '--', 'timeout', '5', 'bash', '-c', 'exec 3<>"/dev/tcp/$0/$1"', bridgeIp, String(port)], { stdio: 'ignore' });
        child.once('exit', (code) => resolve(code ?? -1));
      });
      for (const a of apps) {
        expect(await fromPod(a, other), `${a.name} -> ${bridgeIp}:${other}`).toBe(0);
        expect(await fromPod(a, metricsPort), `${a.name} -> ${bridgeIp}:${metricsPort}`).not.toBe(0);
      }
      const counted = /tcp dport \d+ ip saddr @pod_v4 counter packets (\d+)/.exec((await run('nft', ['list', 'chain', 'inet', table, 'input'])).stdout)?.[1];
      expect(Number(counted)).toBeGreaterThanOrEqual(apps.length);
    } finally {
      for (const x of stands) x.srv.close();
    }
  }, 60_000);

  it('runs with the manifest posture: only SYS_ADMIN, RuntimeDefault seccomp, read-only root, the memory limit', async () => {
    const st = await runner.status(agentPod!.containerIds[0] as string);
    expect(st.state).toBe('CONTAINER_RUNNING');
    const pid = agentPid(st.pid);
    expect(pid).toBeGreaterThan(0);
    const proc = readFileSync(`/proc/${pid}/status`, 'utf8');
    // CAP_SYS_ADMIN is bit 21: the bounding, effective and permitted sets hold it alone.
    expect(hex(proc, 'CapBnd')).toBe('0000000000200000');
    expect(hex(proc, 'CapEff')).toBe('0000000000200000');
    expect(hex(proc, 'Seccomp')).toBe('2');
    // allowPrivilegeEscalation is unset: kubelet sends no_new_privs=false.
    expect(hex(proc, 'NoNewPrivs')).toBe('0');
    expect(hex(proc, 'Uid')).toBe('0');
    const spec = st.spec as { root?: { readonly?: boolean }; linux?: { resources?: { memory?: { limit?: number } } } };
    expect(spec.root?.readonly).toBe(true);
    const agent = ((template.spec as Obj).containers as Obj[]).find((c) => c.name === 'agent') as Obj;
    const limit = quantity(((agent.resources as Obj).limits as Obj).memory);
    expect(Number(readFileSync(path.join(memoryCgroup(st), 'memory.limit_in_bytes'), 'utf8'))).toBe(limit);
    const rss = Number(hex(proc, 'VmRSS')) * 1024;
    console.log(`agent in container: VmRSS ${(rss / 2 ** 20).toFixed(1)} MiB, cgroup max usage ${(Number(readFileSync(path.join(memoryCgroup(st), 'memory.max_usage_in_bytes'), 'utf8')) / 2 ** 20).toFixed(1)} MiB of ${(limit / 2 ** 20).toFixed(0)} MiB`);
    expect(rss).toBeLessThan(limit * 0.75);
    // The sidecar: NET_ADMIN only, no_new_privs set (allowPrivilegeEscalation: false).
    const side = await runner.status(agentPod!.containerIds[1] as string);
    const sproc = readFileSync(`/proc/${side.pid}/status`, 'utf8');
    expect(hex(sproc, 'CapEff')).toBe('0000000000001000');
    expect(hex(sproc, 'NoNewPrivs')).toBe('1');
    expect(hex(sproc, 'Seccomp')).toBe('2');
  });
});

describe('the agent\'s own probes', () => {
  it('the shipped exec probes pass inside the running agent container through CRI ExecSync, as kubelet\'s prober runs them', async () => {
    const requests = execProbeRequests(template, 'agent');
    expect(requests.map((r) => r.kind)).toEqual(['startup', 'liveness', 'readiness']);
    const id = agentPod!.containerIds[0] as string;
    for (const r of requests) {
      const res = await runner.execSync(id, r.cmd, r.timeoutSeconds);
      expect(res.exitCode, `${r.kind} probe: ${res.stdout}${res.stderr}`).toBe(0);
    }
    // The same commands fail when nothing answers at the health address: they check, not just run.
    const closed = await freePort();
    for (const r of requests) {
      const res = await runner.execSync(id, ['env', `PROBE_AGENT_HEALTH_ADDRESS=127.0.0.1:${closed}`, ...r.cmd], r.timeoutSeconds);
      expect(res.exitCode, `${r.kind} probe against a closed port`).not.toBe(0);
    }
  }, 60_000);
});

describe('memory under the manifest limit', () => {
  it('the largest PodList the manifest accepts is parsed inside the container: no OOM kill, usage at most 75 % of the limit', async () => {
    const id = agentPod!.containerIds[0] as string;
    const st = await runner.status(id);
    // The pod's cgroup (the container's parent) outlives an OOM-killed container and counts it.
    const cg = path.dirname(memoryCgroup(st));
    const agent = ((template.spec as Obj).containers as Obj[]).find((c) => c.name === 'agent') as Obj;
    const limit = quantity(((agent.resources as Obj).limits as Obj).memory);
    const envMax = (agent.env as Obj[]).find((e) => e.name === 'PROBE_AGENT_KUBELET_MAX_RESPONSE_BYTES')?.value;
    const maxBytes = Number(process.env.DEPLOYED_PODLIST_BYTES ?? envMax ?? 64 * 1024 * 1024);
    // The agent accepts at most 5000 pods (agent/pods/pod-model.ts) and maxBytes of JSON: the
    // largest accepted list is 5000 pods padded (with an annotation) to just under maxBytes. The
    // filler pods carry no probes; their cost is the response and its parse, which a real list
    // pays too. The two real pods keep being probed.
    const real = apps.map(appPod);
    const count = 5000 - real.length;
    const bare = JSON.stringify(makePods(count, { probe: 'none', namespace: 'filler' })).length + JSON.stringify(real).length;
    const pad = Math.max(0, Math.floor((maxBytes * 0.98 - bare) / count) - 40);
    const filler = makePods(count, { probe: 'none', namespace: 'filler' });
    for (const f of filler) ((f.metadata as Obj).annotations as Obj | undefined ?? ((f.metadata as Obj).annotations = {}) as Obj)['lab.probe-agent.io/pad'] = 'x'.repeat(pad);
    const body = JSON.stringify({ kind: 'PodList', apiVersion: 'v1', metadata: {}, items: [...real, ...filler] });
    expect(Buffer.byteLength(body)).toBeLessThan(maxBytes);
    writeFileSync(path.join(cg, 'memory.max_usage_in_bytes'), '0');
    const oomBefore = Number(/oom_kill (\d+)/.exec(readFileSync(path.join(cg, 'memory.oom_control'), 'utf8'))?.[1] ?? 0);
    kubelet.setPods([...real, ...filler]);
    const seen = kubelet.requestCount;
    let errors: string[] = [];
    let ours = '';
    const outcome = await waitFor('five polls of the large PodList', async () => {
      if ((await runner.status(id)).state !== 'CONTAINER_RUNNING') return 'exited';
      return kubelet.requestCount >= seen + 5 ? 'polled' : undefined;
    }, 120_000).catch((err: Error) => err.message);
    const after = await runner.status(id);
    if (after.state === 'CONTAINER_RUNNING') {
      const metrics = (await httpGet('/metrics')).body;
      errors = metrics.split('\n').filter((l) => l.startsWith('probe_agent_kubelet_poll_errors_total{') && !l.endsWith(' 0'));
      ours = String([...metrics.matchAll(/^probe_agent_pods\{[^}]*\} (\d+)/gm)].reduce((n, m) => n + Number(m[1]), 0));
    }
    kubelet.setPods(real);
    const max = Number(readFileSync(path.join(cg, 'memory.max_usage_in_bytes'), 'utf8'));
    const oom = Number(/oom_kill (\d+)/.exec(readFileSync(path.join(cg, 'memory.oom_control'), 'utf8'))?.[1] ?? 0);
    // The agent's peak RSS also counts file-backed pages (Node's binary) that the kernel may charge
    // to another cgroup: the OOM killer goes by the cgroup's usage, but a node where those pages
    // were charged here would see the RSS. docs/deploy.md's rule keeps both at most 75 %, as the
    // in-container soak does.
    const hwm = after.state === 'CONTAINER_RUNNING' ? Number(hex(readFileSync(`/proc/${agentPid(after.pid)}/status`, 'utf8'), 'VmHWM')) * 1024 : 0;
    console.log(`PodList ${(Buffer.byteLength(body) / 2 ** 20).toFixed(1)} MiB (${real.length + filler.length} pods): ${outcome} ${after.reason}; pod cgroup max usage ${(max / 2 ** 20).toFixed(1)} MiB of ${(limit / 2 ** 20).toFixed(0)} MiB (${((100 * max) / limit).toFixed(0)} %), agent peak RSS ${(hwm / 2 ** 20).toFixed(1)} MiB, oom kills ${oom - oomBefore}`);
    expect(after.state, `${outcome}: ${await logTail(agentPod!, 0, 4)}`).toBe('CONTAINER_RUNNING');
    expect(oom - oomBefore).toBe(0);
    expect(after.reason).not.toBe('OOMKilled');
    expect(errors, await logTail(agentPod!, 0, 3)).toEqual([]);
    expect(ours).toBe('5000');
    expect(max).toBeLessThanOrEqual(limit * 0.75);
    expect(hwm).toBeGreaterThan(0);
    expect(hwm).toBeLessThanOrEqual(limit * 0.75);
  }, 240_000);
});

describe('a missing privilege', () => {
  it('without SYS_ADMIN the agent says so at start and exits, instead of hanging or looping silently', async () => {
    const tpl = structuredClone(template);
    const spec = tpl.spec as Obj;
    // Just the agent container: the sidecar is not what is under test here.
    spec.containers = (spec.containers as Obj[]).filter((c) => c.name === 'agent');
    const agent = (spec.containers as Obj[])[0] as Obj;
    ((agent.securityContext as Obj).capabilities as Obj).add = [];
    // Its own socket dir and ports, so the running agent is not disturbed.
    const other = path.join(scratch, 'host-run-probe-agent-nocap');
    const own = await agentPorts();
    spec.volumes = (spec.volumes as Obj[]).map((v) => (v.name === 'probe-socket-dir' ? { name: v.name, hostPath: { path: other, type: 'DirectoryOrCreate' } } : v));
    useAgentPorts(spec, own);
    const pod = await startAgentPod(tpl, 'probe-agent-nocap');
    const id = pod.containerIds[0] as string;
    const st = await waitFor('the agent without SYS_ADMIN to exit', async () => {
      const s = await runner.status(id);
      return s.state === 'CONTAINER_EXITED' ? s : undefined;
    }, 60_000);
    const log = readFileSync(path.join(pod.place.logDir, st.logPath.startsWith('/') ? path.relative(pod.place.logDir, st.logPath) : st.logPath), 'utf8');
    console.log(`without SYS_ADMIN: exit ${st.exitCode}; log tail: ${log.trim().split('\n').slice(-3).join(' | ').slice(0, 600)}`);
    expect(st.exitCode).not.toBe(0);
    expect(log).toMatch(/SYS_ADMIN|setns|Operation not permitted|EPERM/i);
  }, 90_000);
});

describe('least privilege: a non-root agent', () => {
  /** The DaemonSet's agent alone, as `uid`, on a fresh socket dir and port; returns its exit and log once it stops or after 20 s. */
  async function runAs(label: string, edit: (agent: Obj) => void, image?: string, socketOwner?: number, waitMs = 20_000): Promise<{ state: string; exitCode: number; log: string }> {
    const tpl = structuredClone(template);
    const spec = tpl.spec as Obj;
    spec.containers = (spec.containers as Obj[]).filter((c) => c.name === 'agent');
    const agent = (spec.containers as Obj[])[0] as Obj;
    if (image) agent.image = image;
    edit(agent);
    const own = await agentPorts();
    const sockDir = path.join(scratch, `sock-${label}`);
    if (socketOwner !== undefined) {
      // What an init container (or a node-prepared directory) would do for a non-root agent.
      mkdirSync(sockDir, { recursive: true });
      chownSync(sockDir, socketOwner, socketOwner);
    }
    spec.volumes = (spec.volumes as Obj[]).map((v) => (v.name === 'probe-socket-dir' ? { name: v.name, hostPath: { path: sockDir, type: 'DirectoryOrCreate' } } : v));
    useAgentPorts(spec, own);
    const pod = await startAgentPod(tpl, `probe-agent-${label}`);
    const id = pod.containerIds[0] as string;
    const st = await waitFor(`${label} to exit`, async () => {
      const s2 = await runner.status(id);
      return s2.state === 'CONTAINER_EXITED' ? s2 : undefined;
    }, waitMs).catch(() => runner.status(id));
    const log = await logTail(pod, 0, 4);
    console.log(`${label}: ${st.state} exit ${st.exitCode}: ${log.split('\n').filter((l) => /"level":"(error|warn)"/.test(l)).join(' | ').slice(0, 900)}`);
    return { state: st.state, exitCode: st.exitCode, log };
  }

  /** The agent's start-up error when the netns helper may not setns (agent/netns/helper-protocol.ts). */
  const HELPER_DENIED = /netns helper self-test failed: cannot enter netns .{1,300}?: permission denied \(E[A-Z]+; needs CAP_SYS_ADMIN\)/;

  const nonRoot = (agent: Obj): void => {
    Object.assign(agent.securityContext as Obj, { runAsUser: 65534, runAsGroup: 65534, runAsNonRoot: true });
  };

  it('as uid 65534 with SYS_ADMIN in the bounding set: the capability is not effective, the helper cannot enter a netns', async () => {
    const r = await runAs('nonroot', nonRoot);
    expect(r.state).toBe('CONTAINER_EXITED');
    expect(r.exitCode).not.toBe(0);
    // The helper's own refusal, at start, before the agent gets as far as its socket (whose EACCES would also say "permission denied").
    expect(r.log).toMatch(HELPER_DENIED);
    expect(r.log).not.toMatch(/listen EACCES/);
  }, 60_000);

  it('as uid 65534 with file capabilities on the helper: what still needs root', async () => {
    // The shipped image with cap_sys_admin+ep set on the helper (a derived image: the Dockerfile
    // does not do this).
    const ref = `localhost/probe-agent:${VERSION}-filecaps`;
    const tar = path.join(scratch, 'filecaps.tar');
    // From the archive under test: buildah's localhost/ tag is shared by every checkout here.
    const ctr = execFileSync('buildah', ['from', '--quiet', `oci-archive:${IMAGE_TAR}`], { encoding: 'utf8' }).trim();
    try {
      const mnt = execFileSync('buildah', ['mount', ctr], { encoding: 'utf8' }).trim();
      execFileSync('setcap', ['cap_sys_admin+ep', path.join(mnt, 'opt/probe-agent/netns-helper/build/probe-agent-netns-helper')]);
      execFileSync('buildah', ['commit', '--quiet', ctr, ref]);
    } finally {
      execFileSync('buildah', ['rm', ctr], { stdio: 'ignore' });
    }
    execFileSync('buildah', ['push', '--quiet', ref, `oci-archive:${tar}:docker.io/library/probe-agent:${VERSION}-filecaps`]);
    await run('ctr', ['--address', ctrd.socket, '-n', 'k8s.io', 'images', 'import', '--snapshotter', 'overlayfs', tar], { timeout: 120_000 });
    // The helper now enters netns; the agent's own files come next: the host socket directory
    // (root's, as kubelet creates a DirectoryOrCreate hostPath) ...
    const withCaps = await runAs('filecaps', nonRoot, `probe-agent:${VERSION}-filecaps`);
    expect(withCaps.log).toMatch(/listen EACCES: permission denied \/run\/probe-agent\/probe\.sock/);
    // ... and with that directory handed to the agent's uid, the runtime's CRI socket (root:root 0660).
    // It stays up (the status check below is what matters), so do not wait long for an exit.
    const withDir = await runAs('filecaps-dir', nonRoot, `probe-agent:${VERSION}-filecaps`, 65534, 2000);
    // allowPrivilegeEscalation: false sets no_new_privs, and the kernel then ignores file capabilities.
    const nnp = await runAs('filecaps-nnp', (agent) => {
      nonRoot(agent);
      (agent.securityContext as Obj).allowPrivilegeEscalation = false;
    }, `probe-agent:${VERSION}-filecaps`);
    expect(nnp.state).toBe('CONTAINER_EXITED');
    expect(nnp.log).toMatch(HELPER_DENIED);
    expect(nnp.log).not.toMatch(/listen EACCES/);
    expect(withDir.state).toBe('CONTAINER_RUNNING');
    const sock = path.join(scratch, 'sock-filecaps-dir', 'probe.sock');
    const statuses = await waitFor('the non-root agent to report both pods', async () => {
      const { stdout } = await run(builtCli(), ['status', '--socket', sock, '--output', 'json'], { timeout: 10_000 });
      const list = (JSON.parse(stdout) as { statuses: { pod: string; result: string; lastReason: string | null; lastMessage: string }[] }).statuses;
      const reported = (pod: string): boolean => {
        const mine = list.filter((s) => s.pod === pod);
        return mine.length > 0 && mine.every((s) => (s.lastReason ?? '') !== '');
      };
      return apps.every((a) => reported(a.name)) ? list : undefined;
    }, 30_000);
    console.log(`non-root with file capabilities: ${JSON.stringify(statuses.map((s) => [s.pod, s.result, s.lastReason, s.lastMessage.slice(0, 160)]))}`);
    // containerd's socket is root:root 0660 (as on a node): a non-root agent cannot ask CRI, so
    // no pod's netns resolves. That, not setns, is what keeps the agent root.
    expect(execFileSync('stat', ['-c', '%U:%G %a', ctrd.socket], { encoding: 'utf8' }).trim()).toBe('root:root 660');
    for (const a of apps) {
      const mine = statuses.filter((s) => s.pod === a.name);
      expect(mine.length).toBeGreaterThan(0);
      // A probe that cannot run is thrown away, as kubelet does: the result stays unknown, the reason shows.
      for (const s of mine) expect(s).toMatchObject({ result: 'unknown', lastReason: 'netns-unresolved' });
      expect(mine.map((s) => s.lastMessage).join(' ')).toMatch(/CRI endpoint unix:\/\/\/run\/containerd\/containerd\.sock unavailable/);
    }
  }, 180_000);
});

describe('the other components that change privileges or mounts', () => {
  /** Renders base + components (plus this node's overlay), starts the agent alone, waits for both pods probed. */
  async function runVariant(label: string, components: string[], whileRunning?: (tpl: Obj, st: ContainerState, port: number) => Promise<void>, edit?: (tpl: Obj) => void): Promise<{ proc: string; hostPid: boolean }> {
    const dir = path.join(scratch, `overlay-${label}`);
    mkdirSync(dir);
    const objs = renderOverlay(dir, slotLayout(ctrd.slot), components);
    const tpl = ((objs.find((o) => o.kind === 'DaemonSet' && (o.metadata as Obj).name === 'probe-agent') as Obj).spec as Obj).template as Obj;
    const spec = tpl.spec as Obj;
    const own = await agentPorts();
    const port = own.metrics;
    const sockDir = path.join(scratch, `sock-${label}`);
    spec.volumes = (spec.volumes as Obj[]).map((v) => (v.name === 'probe-socket-dir' ? { name: v.name, hostPath: { path: sockDir, type: 'DirectoryOrCreate' } } : v));
    const agent = (spec.containers as Obj[])[0] as Obj;
    useAgentPorts(spec, own);
    edit?.(tpl);
    const pod = await startAgentPod(tpl, `probe-agent-${label}`);
    await waitFor(`${label}: both pods probed`, async () => {
      if ((await runner.status(pod.containerIds[0] as string)).state !== 'CONTAINER_RUNNING') throw new Error(await logTail(pod, 0));
      const { stdout } = await run(builtCli(), ['status', '--socket', path.join(sockDir, 'probe.sock'), '--output', 'json'], { timeout: 10_000 });
      const list = (JSON.parse(stdout) as { statuses: { pod: string; result: string }[] }).statuses;
      return apps.every((a) => list.filter((x) => x.pod === a.name && x.result === 'success').length >= 2) ? true : undefined;
    }, 60_000);
    const st = await runner.status(pod.containerIds[0] as string);
    const proc = readFileSync(`/proc/${agentPid(st.pid)}/status`, 'utf8');
    const hostPid = readlinkSync(`/proc/${st.pid}/ns/pid`) === readlinkSync('/proc/self/ns/pid');
    await whileRunning?.(tpl, st, port);
    await runner.removePod(pod.sandboxId);
    pods.splice(pods.indexOf(pod.sandboxId), 1);
    return { proc, hostPid };
  }

  it('procfs-resolver: host PID namespace, SYS_ADMIN and SYS_PTRACE only, and it probes', async () => {
    const r = await runVariant('procfs', ['containerd', 'host-network', 'procfs-resolver']);
    expect(r.hostPid).toBe(true);
    // CAP_SYS_ADMIN (21) and CAP_SYS_PTRACE (19).
    expect(hex(r.proc, 'CapBnd')).toBe('0000000000280000');
    expect(hex(r.proc, 'Seccomp')).toBe('2');
  }, 120_000);

  it('privileged: every capability, no seccomp filter, and it probes', async () => {
    const r = await runVariant('privileged', ['containerd', 'host-network', 'privileged']);
    expect(r.hostPid).toBe(false);
    expect(hex(r.proc, 'CapEff')).toBe(hex(readFileSync('/proc/self/status', 'utf8'), 'CapBnd'));
    expect(hex(r.proc, 'Seccomp')).toBe('0');
  }, 120_000);

  it('kubelet-shim: the agent mounts the shim\'s 0700 directory read-only, relays the host shim\'s counters at /metrics/shim, drains for 45 s of a 60 s grace', async () => {
    // The host shim as its unit runs it, in a scratch copy of /run/probe-agent-shim (0700, as
    // systemd's RuntimeDirectoryMode makes it); the agent pod's shim-run volume points there.
    const shimRun = path.join(scratch, 'host-run-probe-agent-shim');
    mkdirSync(shimRun, { mode: 0o700 });
    const shim = spawn(process.execPath, [builtEntry('shim/main.js'), '--listen', `unix://${path.join(shimRun, 'cri.sock')}`,
      '--runtime-endpoint', ctrd.endpoint, '--probe-socket', path.join(scratch, 'sock-kubelet-shim', 'probe.sock'),
      '--hook-agent-wait', '60s', '--metrics-socket', path.join(shimRun, 'metrics.sock')], { stdio: ['ignore', 'ignore', 'pipe'], cwd: '/' });
    try {
      await new Promise<void>((resolve, reject) => {
        shim.stderr.on('data', (d: Buffer) => { if (d.toString().includes('shim listening')) resolve(); });
        shim.once('exit', (c) => reject(new Error(`host shim exited (${c})`)));
      });
      expect(statSync(shimRun).mode & 0o777).toBe(0o700);
      await runVariant('kubelet-shim', ['containerd', 'host-network', 'kubelet-shim'], async (tpl, st, port) => {
        const spec = tpl.spec as Obj;
        expect(spec.terminationGracePeriodSeconds).toBe(60);
        const agent = (spec.containers as Obj[]).find((c) => c.name === 'agent') as Obj;
        expect((agent.env as Obj[]).find((e) => e.name === 'PROBE_AGENT_SHUTDOWN_GRACE_PERIOD')?.value).toBe('45s');
        // What the runtime mounted: the shim's directory, read-only.
        const mount = ((st.spec.mounts ?? []) as { destination: string; source: string; options?: string[] }[]).find((m) => m.destination === '/run/probe-agent-shim');
        expect(mount?.source).toBe(realpathSync(shimRun));
        expect(mount?.options).toContain('ro');
        // Root with only SYS_ADMIN (no DAC_OVERRIDE) reaches the 0700 dir's 0600 socket as its owner.
        const res = await fetch(`http://127.0.0.1:${port}/metrics/shim`, { signal: AbortSignal.timeout(10_000) });
        const body = await res.text();
        expect(res.status, body.slice(0, 300)).toBe(200);
        expect(body).toMatch(/^# (HELP|TYPE) probe_agent_shim_/m);
      }, (tpl) => {
        const spec = tpl.spec as Obj;
        spec.volumes = (spec.volumes as Obj[]).map((v) => (v.name === 'shim-run' ? { name: v.name, hostPath: { path: shimRun, type: 'DirectoryOrCreate' } } : v));
      });
    } finally {
      shim.kill('SIGKILL');
    }
  }, 120_000);

  it('base alone and crio: the rendered template translates into CRI requests (not run: the agent pod network cannot reach the loopback kubelet; no CRI-O here)', () => {
    for (const components of [[], ['crio'], ['crio', 'procfs-resolver', 'privileged']]) {
      const dir = mkdtempSync(path.join(scratch, 'overlay-x-'));
      const objs = renderOverlay(dir, slotLayout(ctrd.slot), components);
      const tpl = ((objs.find((o) => o.kind === 'DaemonSet') as Obj).spec as Obj).template as Obj;
      // Not run, so the paths stay as written (/var/run/crio does not exist here).
      const place = { ...placement('probe-agent-x', randomUUID()), hostPath: (p: string) => p };
      const sb = sandboxConfig(tpl, place);
      const c = containerConfig(tpl, 'agent', place);
      const ns = ((sb.linux as Obj).securityContext as Obj).namespaceOptions as Obj;
      expect(ns.network).toBe('POD');
      const mounts = (c.mounts as { containerPath: string; propagation: string }[]);
      expect(mounts.find((m) => m.containerPath === '/run/netns')?.propagation).toBe('PROPAGATION_HOST_TO_CONTAINER');
      if (components.includes('crio')) expect(mounts.find((m) => m.containerPath === '/var/run/crio')?.propagation).toBe('PROPAGATION_HOST_TO_CONTAINER');
    }
  });
});

describe('the kubelet-shim installer from the same image', () => {
  it('installs the shim release and its unit into the host root the manifest mounts, reaches the host systemctl through nsenter, and labels the node', async () => {
    const dir = path.join(scratch, 'overlay-shim');
    mkdirSync(dir);
    const objs = renderOverlay(dir, slotLayout(ctrd.slot), ['kubelet-shim']);
    const ds = objs.find((o) => o.kind === 'DaemonSet' && (o.metadata as Obj).name === 'probe-agent-shim-installer') as Obj;
    const tpl = structuredClone((ds.spec as Obj).template as Obj);
    const spec = tpl.spec as Obj;
    const maps = Object.fromEntries(objs.filter((o) => o.kind === 'ConfigMap').map((o) => [String((o.metadata as Obj).name), o.data as Record<string, string>]));
    // The node's root is a scratch directory: every hostPath volume points below it, mounted
    // where the manifest mounts the host (/host/...).
    const hostRoot = path.join(scratch, 'shim-host');
    mkdirSync(path.join(hostRoot, 'etc/systemd/system'), { recursive: true });
    spec.volumes = (spec.volumes as Obj[]).map((v) => (v.hostPath ? { ...v, hostPath: { ...(v.hostPath as Obj), path: path.join(hostRoot, String((v.hostPath as Obj).path)) } } : v));
    // systemd is not PID 1 here, and this machine's PID 1 cannot be entered (its /proc/1/ns
    // deny even root): the installer's own nsenter goes into the namespaces of this test's
    // process instead (a host process, seen through hostPID) and runs a recorder there in
    // place of systemctl. The API server is a recorder of the label
    // patches, on the lab bridge's address (the installer pod is on the pod network).
    const stubs = path.join(scratch, 'shim-stubs');
    mkdirSync(stubs);
    const calls = path.join(stubs, 'systemctl.log');
    writeFileSync(path.join(stubs, 'systemctl'), `#!/bin/sh\necho "$*" >> ${calls}\n`, { mode: 0o755 });
    const bridgeIp = /inet (\S+)\//.exec(execFileSync('ip', ['-4', '-o', 'addr', 'show', 'dev', slotLayout(ctrd.slot).bridge], { encoding: 'utf8' }))?.[1];
    expect(bridgeIp).toBeTruthy();
    const patches: { node: string; body: unknown; auth: string }[] = [];
    const api = http.createServer((req, res) => {
      let body = '';
      req.on('data', (c: Buffer) => (body += c.toString()));
      req.on('end', () => {
        const m = /^\/api\/v1\/nodes\/([^/]+)$/.exec(req.url ?? '');
        if (req.method !== 'PATCH' || !m || req.headers['content-type'] !== 'application/merge-patch+json') return void res.writeHead(400).end('unexpected request');
        patches.push({ node: decodeURIComponent(m[1] as string), body: JSON.parse(body), auth: String(req.headers.authorization ?? '') });
        res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
      });
    });
    await new Promise<void>((r) => api.listen(0, bridgeIp, r));
    const installer = ((spec.containers as Obj[])[0]) as Obj;
    installer.env = [...(installer.env as Obj[]),
      { name: 'SYSTEMCTL', value: `nsenter --target ${process.pid} --mount --uts --ipc --net --pid -- ${path.join(stubs, 'systemctl')}` },
      { name: 'KUBERNETES_API_URL', value: `http://${bridgeIp}:${(api.address() as net.AddressInfo).port}` },
      // One pass of the label loop, then exit: the test reads the outcome from the exit code.
      { name: 'ONESHOT', value: '1' },
      // The proof that kubelet calls the shim, shortened: 2 intervals of 1 s, 2 calls in each.
      { name: 'KUBELET_CALLS_INTERVAL', value: '1' }, { name: 'KUBELET_CALLS_ROUNDS', value: '2' }, { name: 'KUBELET_CALLS_MIN', value: '2' }];
    const runInstaller = async (name: string): Promise<void> => {
      const pod = await startAgentPod(tpl, name, maps);
      const id = pod.containerIds[0] as string;
      const st = await waitFor(`${name} to finish`, async () => {
        const s = await runner.status(id);
        return s.state === 'CONTAINER_EXITED' ? s : undefined;
      }, 60_000);
      console.log(`${name}: exit ${st.exitCode}: ${(await logTail(pod, 0, 6)).replace(/\n/g, ' | ').slice(0, 700)}`);
      expect(st.exitCode, await logTail(pod, 0)).toBe(0);
    };
    try {
      const kubeletConfig = path.join(hostRoot, 'var/lib/kubelet/config.yaml');
      mkdirSync(path.dirname(kubeletConfig), { recursive: true });
      writeFileSync(kubeletConfig, 'apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncontainerRuntimeEndpoint: unix:///run/probe-agent-shim/cri.sock\n');
      await runInstaller('shim-installer');
      const cur = path.join(hostRoot, 'opt/probe-agent-shim/current');
      expect(readlinkSync(cur)).toBe(`releases/${VERSION}`);
      for (const f of ['node', 'package.json', 'dist/shim/main.js', 'dist/shim/proxy.js', 'dist/contract/shim-command.js']) expect(existsSync(path.join(cur, f)), f).toBe(true);
      expect(existsSync(path.join(cur, 'node_modules'))).toBe(false);
      expect(readFileSync(path.join(hostRoot, 'etc/systemd/system/probe-agent-shim.service'), 'utf8'))
        .toBe(readFileSync(path.join(REPO, 'deploy/components/kubelet-shim/probe-agent-shim.service'), 'utf8'));
      // The recorder ran in the host's namespaces: only hostPID (to see the host process) and
      // privileged (setns into its namespaces) make its path, on the host's filesystem, reachable.
      expect(readFileSync(calls, 'utf8').trim().split('\n')).toEqual(['daemon-reload', 'enable probe-agent-shim.service', 'restart probe-agent-shim.service']);
      // kubelet points at the shim, but the shim is not up (nothing started the unit): the label
      // is not set, and a failed check never removes it either (kubelet would kill rewritten
      // pods at its next restart): no request to the API server at all.
      expect(patches).toEqual([]);
      // The copied Node (the image's own) runs the installed shim on the host, as the unit would.
      const shimSock = path.join(hostRoot, 'run/probe-agent-shim/cri.sock');
      const shim = spawn(path.join(cur, 'node'), [path.join(cur, 'dist/shim/main.js'), '--listen', `unix://${shimSock}`,
        '--runtime-endpoint', ctrd.endpoint, '--probe-socket', path.join(scratch, 'shim-no-agent.sock'),
        '--metrics-socket', path.join(hostRoot, 'run/probe-agent-shim/metrics.sock')], { stdio: ['ignore', 'ignore', 'pipe'], cwd: '/' });
      let kubelet: Relist | undefined;
      try {
        await new Promise<void>((resolve, reject) => {
          shim.stderr.on('data', (d: Buffer) => { if (d.toString().includes('shim listening')) resolve(); });
          shim.once('exit', (c) => reject(new Error(`installed shim exited (${c})`)));
        });
        // The label needs proof that kubelet calls the shim: a kubelet-shaped client (grpc-go) relists through it.
        kubelet = relist(shimSock);
        await runInstaller('shim-installer-2');
        expect(kubelet.failures).toBe(0);
        expect(patches).toEqual([{ node: 'lab-node', body: { metadata: { labels: { 'probe-agent.io/shim': 'ready' } } }, auth: `Bearer ${TOKEN}` }]);
        // Same release and unit: the shim is started if down, not restarted under kubelet.
        expect(readFileSync(calls, 'utf8').trim().split('\n').slice(3)).toEqual(['daemon-reload', 'enable probe-agent-shim.service', 'start probe-agent-shim.service']);
      } finally {
        await kubelet?.stop();
        shim.kill('SIGKILL');
      }
    } finally {
      api.close();
    }
  }, 120_000);
});
