/**
 * The shim integration tests' lab: the lab's real containerd with the busybox image, a scratch
 * directory, and as a test needs them a pod (a busybox app container and a pod server in its
 * netns), kubelet's /pods, the real agent (CRI resolvers) and the shim in this process. stop()
 * takes down what was started, in this order: clients (last first), the shim, the agent, kubelet,
 * the pod server, the test's own steps, containerd, the scratch directory. A test that replaces the agent or the server assigns
 * the new one to the field, so stop() ends that one.
 */
import { rmSync } from 'node:fs';
import path from 'node:path';
import { CriShim, type ShimConfig } from '../../agent/shim/proxy.ts';
import { BUSYBOX_IMAGE_REF, importBusyboxImage } from '../lab/busybox-image.ts';
import { createContainerdLab, type ContainerdLab, type LabContainer, type LabSandbox } from '../lab/containerd.ts';
import type { ServerOptions } from '../lab/lab.ts';
import { labScratch } from '../lab/slots.ts';
import { SandboxServer } from '../soak/sandbox-server.ts';
import { startAgent, type AgentHandle, type AgentOptions } from './agent-harness.ts';
import { FakeKubelet } from './fake-kubelet.ts';
import { makePod } from './pod-factory.ts';

/** A pod with a busybox app container (`sleep infinity`) and a pod server in its netns. */
export interface AppPod {
  pod: LabSandbox;
  app: LabContainer;
  server: SandboxServer;
  /** kubelet's view of it (pod-factory's makePod: no probe, the app's container ID), to edit before startKubelet. */
  spec: Record<string, unknown>;
}

export class ShimLab {
  readonly ctrd: ContainerdLab;
  readonly scratch: string;
  kubelet: FakeKubelet | undefined;
  agent: AgentHandle | undefined;
  shim: CriShim | undefined;
  server: SandboxServer | undefined;
  /** Closed first, the last one given first (kubelet's CRI clients, a shim process). */
  readonly #clients: { close(): unknown }[] = [];
  /** The test's own teardown steps, run after the pod server stops. */
  readonly #steps: (() => unknown)[] = [];

  private constructor(ctrd: ContainerdLab, scratch: string) {
    this.ctrd = ctrd;
    this.scratch = scratch;
  }

  /** containerd (with the busybox image unless `busybox` is false), and a scratch directory named `scratchPrefix...`. */
  static async start(scratchPrefix: string, opts: { busybox?: boolean } = {}): Promise<ShimLab> {
    const ctrd = await createContainerdLab();
    try {
      if (opts.busybox !== false) importBusyboxImage(ctrd.socket);
      return new ShimLab(ctrd, labScratch(scratchPrefix));
    } catch (err) {
      await ctrd.destroy();
      throw err;
    }
  }

  /** A sandbox `name` in `namespace`, its app container, and the pod server (`server` ports) in its netns. */
  async appPod(opts: { name?: string; namespace: string; server: ServerOptions; port: number; beforeServer?: (pod: LabSandbox) => Promise<void> }): Promise<AppPod> {
    const pod = await this.ctrd.runSandbox({ name: opts.name ?? 'web', namespace: opts.namespace });
    const app = await this.ctrd.runContainer(pod, { name: 'app', image: BUSYBOX_IMAGE_REF, command: ['/bin/sleep', 'infinity'] });
    await opts.beforeServer?.(pod);
    const server = await SandboxServer.start(pod, opts.server);
    this.server = server;
    const spec = makePod({ uid: pod.uid, name: pod.name, namespace: opts.namespace, ips: pod.ips, probe: 'none', port: opts.port, containerID: `containerd://${app.id}` });
    return { pod, app, server, spec };
  }

  async startKubelet(pods: Record<string, unknown>[]): Promise<FakeKubelet> {
    this.kubelet = await FakeKubelet.start({ pods });
    return this.kubelet;
  }

  /** Options of an agent on this lab's kubelet and containerd (CRI resolvers); `more.args` are added. */
  agentOptions(more: Partial<AgentOptions> = {}): AgentOptions {
    if (!this.kubelet) throw new Error('start kubelet first');
    return { kubeletUrl: this.kubelet.httpUrl, resolvers: 'cri', ...more, args: [`--cri-endpoint=${this.ctrd.endpoint}`, `--netns-dir=${this.ctrd.netnsDir}`, ...(more.args ?? [])] };
  }

  /** Starts an agent (agentOptions) and makes it the one stop() ends. */
  async startAgent(more: Partial<AgentOptions> = {}): Promise<AgentHandle> {
    this.agent = await startAgent(this.agentOptions(more));
    return this.agent;
  }

  /** The shim on `<scratch>/cri.sock` in front of containerd, to the agent's socket unless `config` says otherwise; listening. */
  async startShim(config: Partial<ShimConfig> = {}): Promise<CriShim> {
    const probeSocket = config.probeSocket ?? this.agent?.socket;
    if (probeSocket === undefined) throw new Error('start the agent first, or name probeSocket');
    this.shim = new CriShim({ listenPath: path.join(this.scratch, 'cri.sock'), runtimeSocket: this.ctrd.socket, ...config, probeSocket });
    await this.shim.listen();
    return this.shim;
  }

  /** Something stop() closes (and awaits) before the shim: the last one given first. */
  client<T extends { close(): unknown }>(c: T): T {
    this.#clients.push(c);
    return c;
  }

  /** A teardown step of the test's own, run after the pod server stops, before containerd goes. */
  onStop(step: () => unknown): void {
    this.#steps.push(step);
  }

  async stop(): Promise<void> {
    for (const c of [...this.#clients].reverse()) await c.close();
    await this.shim?.close(100);
    await this.agent?.stop('SIGKILL').catch(() => {});
    await this.kubelet?.stop();
    await this.server?.stop();
    for (const step of this.#steps) await step();
    await this.ctrd.destroy();
    rmSync(this.scratch, { recursive: true, force: true });
  }
}
