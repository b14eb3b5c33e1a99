/**
 * test/lab/pod-server.ts inside a containerd-lab sandbox netns (`ip netns exec` cannot reach
 * containerd's state dir, so it runs under `nsenter --net=<path>`), plus the kubelet-shaped pod
 * that points at it. Shared by the control-plane fault, lifecycle and API-abuse tests.
 */
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { createInterface } from 'node:readline';
import type { LabSandbox } from '../lab/containerd.ts';
import type { ServerOptions } from '../lab/lab.ts';
import { POD_SERVER_PATH } from '../lab/server.ts';
import { makePod } from '../support/pod-factory.ts';

const READY_TIMEOUT_MS = 10_000;

/** A pod server running in a sandbox's netns. */
export class SandboxServer {
  readonly child: ChildProcessWithoutNullStreams;
  ports: Record<string, number> = {};
  #stderr = '';

  private constructor(netnsPath: string, opts: ServerOptions) {
    this.child = spawn('nsenter', [`--net=${netnsPath}`, '--', process.execPath, POD_SERVER_PATH, JSON.stringify(opts)]);
    this.child.stdin.on('error', () => {});
    this.child.stderr.on('data', (d: Buffer) => {
      this.#stderr = (this.#stderr + d.toString()).slice(-4000);
    });
  }

  /** Starts the server in `sb` and waits for its ready line. */
  static async start(sb: LabSandbox, opts: ServerOptions): Promise<SandboxServer> {
    const s = new SandboxServer(sb.netnsPath, opts);
    const lines = createInterface({ input: s.child.stdout });
    const line = await new Promise<string | undefined>((resolve) => {
      const timer = setTimeout(() => resolve(undefined), READY_TIMEOUT_MS);
      lines.on('line', (l) => {
        if (l.startsWith('ready ')) {
          clearTimeout(timer);
          resolve(l);
        }
      });
      s.child.once('close', () => {
        clearTimeout(timer);
        resolve(undefined);
      });
    });
    if (!line) {
      s.child.kill('SIGKILL');
      throw new Error(`sandbox pod server did not start: ${s.#stderr}`);
    }
    s.ports = JSON.parse(line.slice(6)) as Record<string, number>;
    return s;
  }

  /** Closing stdin makes the server exit; SIGKILL is the backstop. Idempotent. */
  async stop(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const closed = new Promise((r) => this.child.once('close', r));
    this.child.stdin.end();
    const timer = setTimeout(() => this.child.kill('SIGKILL'), 3000);
    await closed;
    clearTimeout(timer);
  }
}

/** Probes of a test pod's "app" container, as written in a pod spec. */
export interface PodProbes {
  readinessProbe?: Record<string, unknown>;
  livenessProbe?: Record<string, unknown>;
  startupProbe?: Record<string, unknown>;
}

/** A kubelet-shaped pod for `sb` (its UID, name, IPs) whose app container carries `probes` (replacing the factory's). */
export function podFor(sb: { uid: string; name: string; ips: string[] }, namespace: string, probes: PodProbes): Record<string, unknown> {
  const pod = makePod({ uid: sb.uid, name: sb.name, namespace, ips: sb.ips, probe: 'none', port: 8080 });
  const app = (pod.spec as { containers: Record<string, unknown>[] }).containers[0] as Record<string, unknown>;
  Object.assign(app, probes);
  return pod;
}
