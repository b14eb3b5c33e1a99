/**
 * The node the scale curve and the profile run on: up to 256 lab pods over several labs (64 per
 * lab), served by one fleet process per lab (fleet.ts), optionally with sandbox processes in
 * kubelet-shaped pod cgroups (pause.ts, for the procfs resolver), and the test kubelet serving a
 * PodList of the first N pods with 3 probes each: HTTP liveness and gRPC readiness on the app
 * container, TCP readiness on a sidecar.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { createLab, type Lab, type LabPod } from '../lab/lab.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { makePod, uidFor } from '../support/pod-factory.ts';
import type { FleetPorts } from './fleet.ts';
import { startSandboxes, type Sandboxes } from './pause.ts';

const FLEET = fileURLToPath(new URL('./fleet.ts', import.meta.url));
const PODS_PER_LAB = 64;
/** Probes per pod in the PodList (the "× 3" of the curve). */
export const PROBES_PER_POD = 3;

/** One lab pod with its servers' ports and the UID the PodList gives it. */
export interface ScalePod {
  lab: LabPod;
  uid: string;
  name: string;
  ports: FleetPorts;
}

/** The built environment. */
export interface ScaleEnv {
  pods: ScalePod[];
  kubelet: FakeKubelet;
  /** Scratch dir for agent sockets and profiles. */
  dir: string;
  resolver: 'procfs' | 'address';
  /** v1.Pod objects for the first `count` pods, every probe at `periodSeconds`. */
  podList(count: number, periodSeconds: number): Record<string, unknown>[];
  destroy(): Promise<void>;
}

function startFleet(lab: Lab): Promise<{ child: ChildProcess; ports: FleetPorts[] }> {
  const child = spawn(process.execPath, [FLEET, JSON.stringify({ netns: lab.pods.map((p) => p.netns) })], { stdio: ['pipe', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr?.on('data', (d: Buffer) => { stderr = (stderr + d.toString()).slice(-4096); });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => { child.kill('SIGKILL'); reject(new Error(`fleet for lab ${lab.id} not ready in 60 s: ${stderr}`)); }, 60_000);
    createInterface({ input: child.stdout! }).once('line', (line) => {
      clearTimeout(timer);
      if (!line.startsWith('ready ')) return reject(new Error(`fleet for lab ${lab.id}: ${line} ${stderr}`));
      resolve({ child, ports: JSON.parse(line.slice(6)) as FleetPorts[] });
    });
    child.once('exit', (code) => { clearTimeout(timer); reject(new Error(`fleet for lab ${lab.id} exited ${code}: ${stderr}`)); });
  });
}

function podObject(p: ScalePod, periodSeconds: number): Record<string, unknown> {
  const timing = { timeoutSeconds: 1, periodSeconds, successThreshold: 1, failureThreshold: 3 };
  const pod = makePod({ name: p.name, namespace: 'bench', uid: p.uid, ips: p.lab.ips, probe: 'none', port: p.ports.http, sidecar: true });
  const spec = pod.spec as { containers: Record<string, unknown>[]; initContainers: Record<string, unknown>[] };
  const app = spec.containers[0] as Record<string, unknown>;
  app.ports = [{ name: 'http', containerPort: p.ports.http, protocol: 'TCP' }, { name: 'grpc', containerPort: p.ports.grpc, protocol: 'TCP' }];
  app.livenessProbe = { httpGet: { path: '/healthz', port: 'http', scheme: 'HTTP' }, ...timing };
  app.readinessProbe = { grpc: { port: p.ports.grpc }, ...timing };
  const proxy = spec.initContainers[0] as Record<string, unknown>;
  proxy.ports = [{ name: 'admin', containerPort: p.ports.tcp, protocol: 'TCP' }];
  proxy.readinessProbe = { tcpSocket: { port: 'admin' }, ...timing };
  return pod;
}

/** Builds labs, fleets (and sandboxes for procfs) for `maxPods` pods, and the test kubelet. */
export async function createScaleEnv(maxPods: number, resolver: 'procfs' | 'address', log: (l: string) => void): Promise<ScaleEnv> {
  const labs: Lab[] = [];
  const fleets: ChildProcess[] = [];
  let sandboxes: Sandboxes | undefined;
  let kubelet: FakeKubelet | undefined;
  const dir = mkdtempSync(join(tmpdir(), 'probe-agent-bench-scale-'));
  const destroy = async (): Promise<void> => {
    await kubelet?.stop().catch(() => {});
    await sandboxes?.stop().catch(() => {});
    for (const f of fleets) f.kill('SIGTERM');
    await Promise.all(labs.map((l) => l.destroy()));
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    const pods: ScalePod[] = [];
    for (let left = maxPods; left > 0; left -= PODS_PER_LAB) {
      // 'drop': the node cannot reach the pods at all, so every passing probe went in-netns.
      const lab = await createLab({ pods: Math.min(PODS_PER_LAB, left), policy: 'drop', tag: 'bench scale' });
      labs.push(lab);
      const fleet = await startFleet(lab);
      fleets.push(fleet.child);
      lab.pods.forEach((lp, i) => {
        const name = `bench-${pods.length}`;
        pods.push({ lab: lp, name, uid: uidFor(`bench/${name}/lab-${lab.id}`), ports: fleet.ports[i] as FleetPorts });
      });
      log(`scale: lab ${lab.id} with ${lab.pods.length} pods served by fleet pid ${fleet.child.pid}`);
    }
    if (resolver === 'procfs') {
      sandboxes = await startSandboxes(pods.map((p) => ({ netnsName: p.lab.name, uid: p.uid })));
      log(`scale: ${pods.length} sandbox processes in pod cgroups under ${sandboxes.cgroupRoot}`);
    }
    kubelet = await FakeKubelet.start({ pods: [] });
    return {
      pods,
      kubelet,
      dir,
      resolver,
      podList: (count, period) => pods.slice(0, count).map((p) => podObject(p, period)),
      destroy,
    };
  } catch (err) {
    await destroy();
    throw err;
  }
}
