/**
 * The kubelet-shim part of `make demo`: a real containerd pod (busybox) behind a rule that drops
 * every new connection from outside its netns (the hole closed), its manifest rewritten by
 * `probe-agent rewrite`, the agent and `probe-agent shim` as separate processes, and kubelet's
 * ExecSync for the rewritten readiness probe made exactly as kubelet makes it (the exec command
 * from the spec, timeout = timeoutSeconds, deadline = 2 min + timeout) through the shim. The same
 * probe from the node fails; the rewritten command sent to containerd without the shim gets the
 * gRPC error kubelet discards.
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { promisify } from 'node:util';
import * as grpc from '@grpc/grpc-js';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { KubeletCri } from '../support/kubelet-cri.ts';
import { makePod } from '../support/pod-factory.ts';
import { BUSYBOX_IMAGE_REF, importBusyboxImage } from './busybox-image.ts';
import { createContainerdLab, type ContainerdLab } from './containerd.ts';
import { POD_SERVER_PATH } from './server.ts';

const run = promisify(execFile);
const GUARD = 'probe_agent_demo_guard';

/** Runs the shim story; `cli` is bin/probe-agent, `scratch` a private dir. Cleans up after itself. */
export async function shimDemo(cli: string, scratch: string, bold: (s: string) => string): Promise<void> {
  const procs: ChildProcess[] = [];
  const clients: KubeletCri[] = [];
  let lab: ContainerdLab | undefined;
  let kubelet: FakeKubelet | undefined;
  try {
    console.log(bold('\n[5] the kubelet shim: a stock kubelet gets its network probes from probe-agent'));
    lab = await createContainerdLab();
    importBusyboxImage(lab.socket);
    const sb = await lab.runSandbox({ name: 'shop', namespace: 'demo' });
    const app = await lab.runContainer(sb, { name: 'app', image: BUSYBOX_IMAGE_REF, command: ['/bin/sleep', 'infinity'] });
    writeFileSync(join(scratch, 'guard.nft'), `table inet ${GUARD} {
  counter from_outside {}
  chain input {
    type filter hook input priority 0; policy accept;
    meta l4proto tcp ct state new iifname != "lo" counter name "from_outside" drop
  }
}
`);
    await lab.exec(sb, 'nft', ['-f', join(scratch, 'guard.nft')]);
    const server = spawn('nsenter', [`--net=${sb.netnsPath}`, '--', process.execPath, POD_SERVER_PATH, JSON.stringify({ http: 8080 })], { stdio: ['pipe', 'pipe', 'ignore'] });
    procs.push(server);
    await new Promise<void>((resolve) => createInterface({ input: server.stdout! }).on('line', (l) => { if (l.startsWith('ready')) resolve(); }));
    console.log(`  containerd pod "shop" (${sb.ips.join(', ')}), container app = busybox; in its netns, new TCP connections not from lo are dropped`);

    const manifest = `apiVersion: v1
kind: Pod
metadata: {name: shop, namespace: demo}
spec:
  containers:
  - name: app
    image: busybox
    ports: [{name: http, containerPort: 8080}]
    readinessProbe: {httpGet: {path: /healthz, port: http}, timeoutSeconds: 1, periodSeconds: 5}
`;
    writeFileSync(join(scratch, 'shop.yaml'), manifest);
    const { stdout: rewritten } = await run(cli, ['rewrite', '-f', join(scratch, 'shop.yaml'), '--output', 'json']);
    const pod = JSON.parse(rewritten) as { spec: { containers: { readinessProbe: { exec: { command: string[] }; timeoutSeconds: number } }[]; affinity: unknown } };
    const probe = pod.spec.containers[0]!.readinessProbe;
    console.log(`  probe-agent rewrite: readinessProbe.exec.command = ${JSON.stringify(probe.exec.command)}`);
    console.log(`                       + required node affinity ${JSON.stringify((pod.spec.affinity as any).nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0])}`);

    kubelet = await FakeKubelet.start({ pods: [makePod({ uid: sb.uid, name: 'shop', namespace: 'demo', ips: sb.ips, probe: 'none', port: 8080, containerID: `containerd://${app.id}` })] });
    const agentSock = join(scratch, 'shim-probe.sock');
    const agent = spawn(cli, ['run', `--kubelet-url=${kubelet.httpUrl}`, '--kubelet-token-file=', '--netns-resolvers=cri', `--cri-endpoint=${lab.endpoint}`,
      `--netns-dir=${lab.netnsDir}`, `--socket=${agentSock}`, '--metrics-address=127.0.0.1:0', '--log-format=json'], { stdio: ['ignore', 'ignore', 'ignore'] });
    procs.push(agent);
    const shimSock = join(scratch, 'cri.sock');
    const shim = spawn(cli, ['shim', '--listen', `unix://${shimSock}`, '--runtime-endpoint', lab.endpoint, '--probe-socket', agentSock], { stdio: ['ignore', 'ignore', 'pipe'] });
    procs.push(shim);
    await new Promise<void>((resolve) => createInterface({ input: shim.stderr! }).on('line', (l) => { if (l.includes('shim listening')) resolve(); }));
    console.log(`  probe-agent shim --listen unix://${shimSock} --runtime-endpoint ${lab.endpoint} --probe-socket ${agentSock}`);
    // Wait for the agent's socket.
    for (let i = 0; i < 100; i++) {
      try {
        await run(cli, ['status', `--socket=${agentSock}`], { timeout: 2000 });
        break;
      } catch {
        await new Promise((r) => setTimeout(r, 200));
      }
    }

    const viaShim = new KubeletCri(shimSock);
    const direct = new KubeletCri(lab.socket);
    clients.push(viaShim, direct);
    const list = await viaShim.call<{ containers: { id: string; metadata: { name: string } }[] }>('ListContainers', {});
    console.log(`  kubelet -> shim -> containerd, ListContainers: ${list.ok ? list.msg.containers.map((c) => c.metadata.name).join(', ') : list.details}`);
    const show = (a: Awaited<ReturnType<KubeletCri['execSync']>>): string =>
      a.ok ? `exit_code ${a.msg.exitCode}, stdout ${JSON.stringify(a.msg.stdout.toString())}` : `gRPC ${grpc.status[a.code]}: ${a.details.slice(0, 140)}`;
    const answer = await viaShim.execSync(app.id, probe.exec.command, probe.timeoutSeconds);
    console.log(`  kubelet's ExecSync (readiness, timeout ${probe.timeoutSeconds}s) through the shim: ${show(answer)}  => ${answer.ok && answer.msg.exitCode === 0 ? 'Success' : 'not Success'}`);
    const ordinary = await viaShim.execSync(app.id, ['/bin/echo', 'hello from busybox'], 1);
    console.log(`  an ordinary exec probe passes through to containerd: ${show(ordinary)}`);

    const fromNode = await run(cli, ['probe', '--from-node', '--pod-ip', sb.ipv4, '--spec', JSON.stringify({ httpGet: { path: '/healthz', port: 8080 }, timeoutSeconds: 1 })]).then(
      (r) => `${r.stdout.trim()} [exit 0]`, (e: { code?: number; stdout?: string }) => `${(e.stdout ?? '').trim()} [exit ${e.code}]`);
    console.log(`  the same probe from the node, as kubelet sends it without the rewrite: ${fromNode}`);
    const without = await direct.execSync(app.id, probe.exec.command, probe.timeoutSeconds);
    console.log(`  the rewritten command on a node without the shim (straight to containerd): ${show(without)}  => kubelet discards it`);
    const { stdout: counters } = await run('nsenter', [`--net=${sb.netnsPath}`, '--', 'nft', 'list', 'counter', 'inet', GUARD, 'from_outside']);
    const packets = /packets (\d+)/.exec(counters)?.[1] ?? '?';
    console.log(`  packets dropped at the pod from outside its netns: ${packets} (all from the node's attempt; the shim path never left the pod)`);
  } finally {
    for (const c of clients) c.close();
    for (const p of procs) p.kill('SIGTERM');
    await kubelet?.stop().catch(() => {});
    await lab?.destroy().catch(() => {});
  }
}
