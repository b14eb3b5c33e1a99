/**
 * `make demo`: a throw-away demo node. Three network-namespace "pods" on a bridge (dual-stack)
 * with real HTTP, TCP and gRPC servers, an nftables rule that drops node->pod traffic (a
 * NetworkPolicy world without the kubelet hole), then: the pods' probes fail from the node,
 * pass through probe-agent, and the agent runs as a DaemonSet would against a test kubelet; then
 * the kubelet shim on a real containerd pod (demo-shim.ts): a pod rewritten, kubelet's ExecSync
 * answered through the shim from inside the netns, the same probe from the node failing.
 * Everything is removed at the end, and on Ctrl-C. DEMO_KEEP=1 keeps the agent running until Ctrl-C.
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { createLab, type Lab, type LabPod } from './lab.ts';
import { LAB_ROOT } from './slots.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { makePod } from '../support/pod-factory.ts';
import { shimDemo } from './demo-shim.ts';
import { builtCli } from '../support/built-cli.ts';

const run = promisify(execFile);
const cli = builtCli();
const bold = (s: string) => (process.stdout.isTTY ? `\x1b[1m${s}\x1b[0m` : s);

interface DemoPod {
  pod: LabPod;
  name: string;
  spec: Record<string, unknown>;
  kind: 'http' | 'tcp' | 'grpc';
  port: number;
}

let lab: Lab | undefined;
let kubelet: FakeKubelet | undefined;
let agent: ChildProcess | undefined;
const scratch = mkdtempSync(join(tmpdir(), 'probe-agent-demo-'));
/** The lab's state directory (slots, cached certificate, compile cache) is the demo's to remove only if the demo made it. */
const labRootExisted = existsSync(LAB_ROOT);

async function cleanup(): Promise<void> {
  if (agent && agent.exitCode === null) {
    agent.kill('SIGTERM');
    await new Promise((r) => agent?.once('exit', r));
  }
  await kubelet?.stop().catch(() => {});
  await lab?.destroy().catch(() => {});
  rmSync(scratch, { recursive: true, force: true });
  removeLabRoot();
}

/** Removes LAB_ROOT when the demo created it and no other lab holds a slot in it; otherwise says why it stays. */
function removeLabRoot(): void {
  if (!existsSync(LAB_ROOT)) return;
  const claimed = (dir: string): string[] => (existsSync(join(LAB_ROOT, dir)) ? readdirSync(join(LAB_ROOT, dir)) : []);
  const others = [...claimed('slots'), ...claimed('ctrd-slots')];
  if (!labRootExisted && others.length === 0) {
    rmSync(LAB_ROOT, { recursive: true, force: true });
    return;
  }
  const why = labRootExisted ? 'it was there before the demo' : `other labs hold slots in it (${others.join(', ')})`;
  console.log(`kept ${LAB_ROOT} (lab slots, cached test certificate, compile cache): ${why}`);
}

for (const sig of ['SIGINT', 'SIGTERM'] as const) {
  process.once(sig, () => {
    process.stdout.write('\ninterrupted: cleaning up\n');
    void cleanup().then(() => process.exit(130));
  });
}

async function probeCli(args: string[]): Promise<{ code: number; out: string }> {
  try {
    const { stdout } = await run(cli, ['probe', ...args], { timeout: 20_000 });
    return { code: 0, out: stdout.trim() };
  } catch (err) {
    const e = err as { code?: number; stdout?: string; stderr?: string };
    return { code: typeof e.code === 'number' ? e.code : 2, out: (e.stdout || e.stderr || String(err)).trim() };
  }
}

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) throw new Error('the demo needs root (network namespaces, nftables)');
  console.log(bold('probe-agent demo: probes inside pod network namespaces'));
  lab = await createLab({ pods: 3, policy: 'drop', tag: 'demo' });
  const [web, db, rpc] = lab.pods as [LabPod, LabPod, LabPod];
  await lab.startServer(web, { http: 8080 });
  await lab.startServer(db, { tcp: 5432 });
  await lab.startServer(rpc, { grpc: 50051, grpcServices: { '': 'SERVING' } });
  console.log(`lab: 3 pods on bridge ${lab.bridge}, node->pod rule "drop" in nft table ${lab.nftTable}`);
  for (const p of lab.pods) console.log(`  ${p.name}: ${p.ips.join(', ')}  (netns ${p.netns})`);

  const pods: DemoPod[] = [
    { pod: web, name: 'web', kind: 'http', port: 8080, spec: { httpGet: { path: '/healthz', port: 8080 }, timeoutSeconds: 1 } },
    { pod: db, name: 'db', kind: 'tcp', port: 5432, spec: { tcpSocket: { port: 5432 }, timeoutSeconds: 1 } },
    { pod: rpc, name: 'rpc', kind: 'grpc', port: 50051, spec: { grpc: { port: 50051 }, timeoutSeconds: 1 } },
  ];

  console.log(bold('\n[1] the probes from the node, as kubelet sends them today (the hole is closed):'));
  const fromNode = await Promise.all(
    pods.map((p) => probeCli(['--from-node', '--pod-ip', p.pod.ipv4, '--spec', JSON.stringify(p.spec)])),
  );
  pods.forEach((p, i) => console.log(`  ${p.name.padEnd(4)} ${fromNode[i]?.out}  [exit ${fromNode[i]?.code}]`));

  console.log(bold('\n[2] the same probes through probe-agent, inside each pod netns:'));
  const inside = await Promise.all(pods.map((p) => probeCli(['--netns', p.pod.netns, '--spec', JSON.stringify(p.spec)])));
  pods.forEach((p, i) => console.log(`  ${p.name.padEnd(4)} ${inside[i]?.out}  [exit ${inside[i]?.code}]`));

  console.log(bold('\n[3] probe-agent run, as the DaemonSet runs it, against a test kubelet serving these pods:'));
  const items = pods.map((p) => {
    const pod = makePod({ name: p.name, namespace: 'demo', ips: p.pod.ips, probe: p.kind, port: p.port });
    const app = ((pod.spec as { containers: Record<string, unknown>[] }).containers[0]) as Record<string, unknown>;
    if (p.kind === 'http') app.readinessProbe = { httpGet: { path: '/healthz', port: 'http' }, periodSeconds: 2 };
    return pod;
  });
  kubelet = await FakeKubelet.start({ pods: items });
  const socket = join(scratch, 'probe.sock');
  agent = spawn(
    cli,
    [
      'run',
      `--kubelet-url=${kubelet.httpUrl}`,
      '--kubelet-token-file=',
      '--kubelet-poll-interval=2s',
      '--netns-resolvers=address',
      `--socket=${socket}`,
      '--metrics-address=127.0.0.1:0',
      '--log-format=text',
      '--log-level=info',
    ],
    { stdio: ['ignore', 'inherit', process.env.DEMO_VERBOSE ? 'inherit' : 'ignore'] },
  );
  agent.once('exit', (code) => {
    if (code !== 0 && code !== null) console.log(`agent exited with ${code}`);
  });
  await waitFor(async () => {
    const { stdout } = await run(cli, ['status', `--socket=${socket}`, '--output=json'], { timeout: 5000 });
    const list = JSON.parse(stdout) as { statuses?: { lastProbeTime?: string | null }[] };
    return (list.statuses?.length ?? 0) >= 4 && list.statuses!.every((s) => Boolean(s.lastProbeTime));
  }, 20_000);
  const { stdout } = await run(cli, ['status', `--socket=${socket}`], { timeout: 5000 });
  console.log(stdout.replace(/^/gm, '  '));

  const dropped = await lab.nodeToPodDrops();
  console.log(bold('[4] the node->pod rule dropped ') + `${dropped} packets (all from step 1); the agent's probes never crossed it.`);
  // DEMO_SHIM=0 skips the kubelet-shim story (it needs containerd).
  if (process.env.DEMO_SHIM !== '0') await shimDemo(cli, scratch, bold);
  if (process.env.DEMO_KEEP) {
    console.log(`\nagent running (socket ${socket}); try: bin/probe-agent watch --socket=${socket}   Ctrl-C to clean up`);
    await new Promise(() => {});
  }
}

async function waitFor(check: () => Promise<boolean>, timeoutMs: number): Promise<void> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    try {
      if (await check()) return;
    } catch {
      // not up yet
    }
    if (Date.now() > end) throw new Error(`timed out after ${timeoutMs} ms waiting for the agent's first results`);
    await new Promise((r) => setTimeout(r, 300));
  }
}

try {
  await main();
  await cleanup();
  console.log('\ndemo finished; everything it created is gone.');
} catch (err) {
  console.error(`demo failed: ${err instanceof Error ? err.message : String(err)}`);
  await cleanup();
  process.exitCode = 1;
}
