/**
 * A private containerd (1.6, CRI) for tests: config, root, state and socket in a per-slot scratch
 * dir; CNI bridge with a slot-unique name and dual-stack subnets (10.251.<slot>.0/24,
 * fd00:10:251:<slot>::/64, no masquerade); a locally built pause image imported into k8s.io.
 * Sandboxes are created with kubelet's labels and a kubelet-shaped cgroup parent, so the agent's
 * resolvers see what they would see on a node. Root only.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { closeSync, mkdirSync, openSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { CriClient, type CriNamespaceMode } from '../../agent/netns/cri-client.ts';
import { ensurePauseImage, PAUSE_IMAGE_REF } from './containerd-image.ts';
import {
  allocateSlot, pidAlive, recordContainerdPid, releaseSlot, removeSharedLeftovers, slotLayout, sweepSlot, waitGone,
  type SlotLayout,
} from './containerd-sweep.ts';

const run = promisify(execFile);

/** Pod QoS class, for the kubelet-shaped cgroup parent. */
export type QosClass = 'guaranteed' | 'burstable' | 'besteffort';

/** What to create. Everything is optional; names and the UID default to unique values. */
export interface SandboxOptions {
  uid?: string;
  name?: string;
  namespace?: string;
  attempt?: number;
  /** Extra labels (kubelet's io.kubernetes.pod.* labels are always set, from uid/name/namespace). */
  labels?: Record<string, string>;
  /** Cgroup parent; default kubelet's cgroupfs shape under the lab's prefix: /<prefix>/kubepods/<qos>/pod<uid>. */
  cgroupParent?: string;
  qos?: QosClass;
  /** Share the node's network namespace (NamespaceMode NODE). */
  hostNetwork?: boolean;
  /** CRI runtime handler; the lab config knows '' (runc) and 'runsc' (runc under a sandboxed runtime's name). */
  runtimeHandler?: string;
  /** Extra sandbox annotations (kubelet copies the pod's annotations onto its sandbox). */
  annotations?: Record<string, string>;
}

/** A running sandbox. */
export interface LabSandbox {
  id: string;
  uid: string;
  name: string;
  namespace: string;
  attempt: number;
  /** The pause process. */
  pid: number;
  /** The netns path containerd reports (under the lab's state dir); '' for host network. */
  netnsPath: string;
  ipv4: string;
  ipv6: string;
  ips: string[];
  cgroupParent: string;
}

/** A container to create in a lab sandbox. */
export interface ContainerOptions {
  name: string;
  /** Default the pause image (it only sleeps). */
  image?: string;
  command?: string[];
  attempt?: number;
  /** Container annotations (kubelet writes e.g. io.kubernetes.container.ports). */
  annotations?: Record<string, string>;
}

/** A running container. */
export interface LabContainer {
  /** The runtime's ID (no "containerd://" prefix). */
  id: string;
  name: string;
  sandboxId: string;
}

/** A running private containerd. */
export interface ContainerdLab {
  slot: number;
  dir: string;
  socket: string;
  /** unix://<socket>, for CriClient / CriResolver. */
  endpoint: string;
  /** Where containerd mounts sandbox netns files (allow it in NetnsPathChecker.extraDirs). */
  netnsDir: string;
  bridge: string;
  /** Top-level cgroup dir name (in every v1 hierarchy) that holds this lab's pods. */
  cgroupPrefix: string;
  client: CriClient;
  /** containerd's pid while it runs. */
  readonly pid: number | undefined;
  runSandbox(opts?: SandboxOptions): Promise<LabSandbox>;
  stopSandbox(id: string): Promise<void>;
  /**
   * Creates and starts a container in the sandbox, labelled as kubelet labels its containers
   * (io.kubernetes.pod.*, io.kubernetes.container.name). Default image: the lab's pause image.
   */
  runContainer(sb: LabSandbox, opts: ContainerOptions): Promise<LabContainer>;
  removeSandbox(id: string): Promise<void>;
  /** Runs a command inside the sandbox's netns (nsenter --net=<path>; `ip netns exec` cannot reach the state dir). */
  exec(sb: LabSandbox, cmd: string, args: string[], timeoutMs?: number): Promise<{ code: number; stdout: string; stderr: string }>;
  /** Stops containerd only (sandboxes keep running, as on a node during a runtime restart). */
  stopContainerd(): Promise<void>;
  /** Starts containerd again on the same state. */
  startContainerd(): Promise<void>;
  destroy(): Promise<void>;
}

/** How to set up the lab's containerd beyond its defaults. */
export interface ContainerdLabOptions {
  /**
   * CRI registry mirrors: registry host -> endpoints (e.g. `{ 'registry.k8s.io': ['http://127.0.0.1:5000'] }`),
   * so a test can pull images under their public names from a registry on loopback.
   */
  registryMirrors?: Record<string, string[]>;
  /** IPv4 destinations pods route through the bridge's gateway (the host), besides their own subnet. */
  routes?: string[];
  /**
   * Another containerd binary than the one on PATH (e.g. a 1.7 for its container event stream). Its
   * directory goes first on the daemon's PATH, so that it starts its own containerd-shim-runc-v2.
   */
  binary?: string;
}

/** Starts a private containerd with CNI and the pause image. */
export async function createContainerdLab(opts: ContainerdLabOptions = {}): Promise<ContainerdLab> {
  const slot = allocateSlot();
  const lay = slotLayout(slot);
  // A previous owner of this slot may have died without a sweep.
  sweepSlot(slot);
  const lab = new Lab(lay, opts.binary);
  registerExitCleanup(lab);
  try {
    writeConfig(lay, opts);
    const image = ensurePauseImage();
    await lab.startContainerd();
    await run('ctr', ['--address', lab.socket, '-n', 'k8s.io', 'images', 'import', '--snapshotter', 'overlayfs', image], { timeout: 20_000 });
    return lab;
  } catch (err) {
    await lab.destroy();
    throw err;
  }
}

class Lab implements ContainerdLab {
  readonly slot: number;
  readonly dir: string;
  readonly socket: string;
  readonly endpoint: string;
  readonly netnsDir: string;
  readonly bridge: string;
  readonly cgroupPrefix: string;
  readonly client: CriClient;
  readonly #lay: SlotLayout;
  readonly #binary: string | undefined;
  #child: ChildProcess | undefined;
  #destroyed = false;

  constructor(lay: SlotLayout, binary?: string) {
    this.#lay = lay;
    this.#binary = binary;
    this.slot = lay.slot;
    this.dir = lay.dir;
    this.socket = path.join(lay.dir, 'containerd.sock');
    this.endpoint = `unix://${this.socket}`;
    this.netnsDir = path.join(lay.dir, 'state', 'io.containerd.grpc.v1.cri', 'netns');
    this.bridge = lay.bridge;
    this.cgroupPrefix = lay.cgroupPrefix;
    this.client = new CriClient(this.endpoint, { deadlineMs: 10_000 });
  }

  get pid(): number | undefined {
    return this.#child?.pid !== undefined && pidAlive(this.#child.pid) ? this.#child.pid : undefined;
  }

  async startContainerd(): Promise<void> {
    if (this.pid) return;
    const log = openSync(path.join(this.dir, 'containerd.log'), 'a');
    try {
      const bin = this.#binary;
      this.#child = spawn(bin ?? 'containerd', ['--config', path.join(this.dir, 'config.toml')], {
        stdio: ['ignore', log, log],
        detached: true,
        ...(bin ? { env: { ...process.env, PATH: `${path.dirname(bin)}:${process.env['PATH'] ?? ''}` } } : {}),
      });
    } finally {
      closeSync(log);
    }
    this.#child.unref();
    const child = this.#child;
    recordContainerdPid(this.slot, child.pid);
    const deadline = Date.now() + 15_000;
    const probe = new CriClient(this.endpoint, { deadlineMs: 500 });
    try {
      for (;;) {
        if (child.exitCode !== null || child.signalCode !== null) {
          throw new Error(`containerd exited during start (${child.exitCode ?? child.signalCode}): ${this.#logTail()}`);
        }
        try {
          await probe.version();
          return;
        } catch (err) {
          if (Date.now() > deadline) throw new Error(`containerd did not answer on ${this.endpoint}: ${(err as Error).message}; ${this.#logTail()}`);
          await new Promise((r) => setTimeout(r, 25));
        }
      }
    } finally {
      probe.close();
    }
  }

  async stopContainerd(): Promise<void> {
    const child = this.#child;
    if (!child?.pid) return;
    const pid = child.pid;
    if (pidAlive(pid)) process.kill(pid, 'SIGTERM');
    const end = Date.now() + 5000;
    while (pidAlive(pid) && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
    if (pidAlive(pid)) process.kill(pid, 'SIGKILL');
    this.#child = undefined;
    recordContainerdPid(this.slot, undefined);
  }

  async runSandbox(opts: SandboxOptions = {}): Promise<LabSandbox> {
    const uid = opts.uid ?? randomUUID();
    const name = opts.name ?? `pod-${uid.slice(0, 8)}`;
    const namespace = opts.namespace ?? 'lab';
    const attempt = opts.attempt ?? 0;
    const cgroupParent = opts.cgroupParent ?? kubeletCgroupParent(this.cgroupPrefix, uid, opts.qos ?? 'besteffort');
    const network: CriNamespaceMode = opts.hostNetwork ? 'NODE' : 'POD';
    const id = await this.client.runPodSandbox({
      metadata: { name, uid, namespace, attempt },
      hostname: opts.hostNetwork ? '' : name,
      labels: {
        ...opts.labels,
        'io.kubernetes.pod.uid': uid,
        'io.kubernetes.pod.name': name,
        'io.kubernetes.pod.namespace': namespace,
      },
      annotations: { ...opts.annotations, 'kubernetes.io/config.source': 'api' },
      linux: { cgroupParent, securityContext: { namespaceOptions: { network, pid: 'CONTAINER', ipc: 'POD' } } },
    }, opts.runtimeHandler ?? '', 30_000);
    const st = await this.client.podSandboxStatus(id, true);
    const info = JSON.parse(st.info['info'] ?? '{}') as { pid?: number; runtimeSpec?: { linux?: { namespaces?: { type: string; path?: string }[] } } };
    const netnsPath = info.runtimeSpec?.linux?.namespaces?.find((n) => n.type === 'network')?.path ?? '';
    const ips = [st.status?.network?.ip ?? '', ...(st.status?.network?.additionalIps ?? []).map((a) => a.ip)].filter(Boolean);
    return {
      id, uid, name, namespace, attempt, cgroupParent, netnsPath, ips,
      pid: info.pid ?? 0,
      ipv4: ips.find((ip) => !ip.includes(':')) ?? '',
      ipv6: ips.find((ip) => ip.includes(':')) ?? '',
    };
  }

  async runContainer(sb: LabSandbox, opts: ContainerOptions): Promise<LabContainer> {
    const podLabels = {
      'io.kubernetes.pod.uid': sb.uid,
      'io.kubernetes.pod.name': sb.name,
      'io.kubernetes.pod.namespace': sb.namespace,
    };
    const id = await this.client.createContainer(sb.id, {
      metadata: { name: opts.name, attempt: opts.attempt ?? 0 },
      image: { image: opts.image ?? PAUSE_IMAGE_REF },
      ...(opts.command ? { command: opts.command } : {}),
      labels: { ...podLabels, 'io.kubernetes.container.name': opts.name },
      ...(opts.annotations ? { annotations: opts.annotations } : {}),
    }, {
      metadata: { name: sb.name, uid: sb.uid, namespace: sb.namespace, attempt: sb.attempt },
      labels: podLabels,
      linux: { cgroupParent: sb.cgroupParent },
    }, 30_000);
    await this.client.startContainer(id, 30_000);
    return { id, name: opts.name, sandboxId: sb.id };
  }

  async stopSandbox(id: string): Promise<void> {
    await this.client.stopPodSandbox(id, 30_000);
  }

  async removeSandbox(id: string): Promise<void> {
    await this.client.removePodSandbox(id, 30_000);
  }

  async exec(sb: LabSandbox, cmd: string, args: string[], timeoutMs = 30_000): Promise<{ code: number; stdout: string; stderr: string }> {
    if (!sb.netnsPath) throw new Error(`sandbox ${sb.id} has no own netns (host network)`);
    try {
      const { stdout, stderr } = await run('nsenter', [`--net=${sb.netnsPath}`, '--', cmd, ...args], { timeout: timeoutMs });
      return { code: 0, stdout, stderr };
    } catch (err) {
      const e = err as { code?: unknown; stdout?: string; stderr?: string; killed?: boolean };
      if (typeof e.code !== 'number' || e.killed) throw err;
      return { code: e.code, stdout: e.stdout ?? '', stderr: e.stderr ?? '' };
    }
  }

  async destroy(): Promise<void> {
    if (this.#destroyed) return;
    this.#destroyed = true;
    unregisterExitCleanup(this);
    try {
      if (this.pid) {
        // Stop/Remove through CRI so CNI DEL runs and containerd unmounts what it mounted.
        const all = await this.client.listPodSandbox({}).catch(() => []);
        await Promise.all(all.map(async (s) => {
          await this.client.stopPodSandbox(s.id, 30_000).catch(() => {});
          await this.client.removePodSandbox(s.id, 30_000).catch(() => {});
        }));
        await this.stopContainerd();
      }
    } finally {
      this.client.close();
      this.syncCleanup();
    }
  }

  /** Synchronous part of teardown; also what the exit handler runs. */
  syncCleanup(): void {
    const pid = this.#child?.pid;
    if (pid && pidAlive(pid)) {
      process.kill(pid, 'SIGKILL');
      waitGone([pid], 2000);
    }
    sweepSlot(this.slot);
    removeSharedLeftovers(this.slot);
    releaseSlot(this.slot);
  }

  #logTail(): string {
    try {
      return readFileSync(path.join(this.dir, 'containerd.log'), 'utf8').split('\n').filter((l) => /level=(error|fatal)/.test(l)).slice(-5).join(' | ');
    } catch {
      return '(no log)';
    }
  }
}

/** kubelet's cgroupfs layout: guaranteed pods sit directly under kubepods. */
export function kubeletCgroupParent(prefix: string, uid: string, qos: QosClass): string {
  return qos === 'guaranteed' ? `/${prefix}/kubepods/pod${uid}` : `/${prefix}/kubepods/${qos}/pod${uid}`;
}

function writeConfig(lay: SlotLayout, opts: ContainerdLabOptions): void {
  const d = lay.dir;
  for (const sub of ['root', 'state', 'net.d', 'ipam', 'runc', 'opt']) mkdirSync(path.join(d, sub), { recursive: true });
  const cri = 'plugins."io.containerd.grpc.v1.cri"';
  // containerd 1.6 still reads registry.mirrors (config_path is the newer form); an http:// endpoint is pulled over plain HTTP.
  const mirrors = Object.entries(opts.registryMirrors ?? {}).map(([host, endpoints]) =>
    `[${cri}.registry.mirrors.${JSON.stringify(host)}]\n  endpoint = ${JSON.stringify(endpoints)}\n`).join('');
  const runtime = (name: string): string => `
[${cri}.containerd.runtimes.${name}]
  runtime_type = "io.containerd.runc.v2"
[${cri}.containerd.runtimes.${name}.options]
  SystemdCgroup = false
  Root = "${d}/runc"
`;
  writeFileSync(path.join(d, 'config.toml'), `version = 2
root = "${d}/root"
state = "${d}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "${d}/containerd.sock"
[ttrpc]
  address = "${d}/containerd.sock.ttrpc"
[debug]
  level = "info"

[plugins."io.containerd.internal.v1.opt"]
  path = "${d}/opt"

[${cri}]
  sandbox_image = "${PAUSE_IMAGE_REF}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  netns_mounts_under_state_dir = true
  # root here lacks CAP_SYS_RESOURCE: CRI's -998 for the sandbox would fail in runc.
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
[${cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
${runtime('runc')}${runtime('runsc')}
[${cri}.cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "${d}/net.d"
  max_conf_num = 1
${mirrors}`);
  writeFileSync(path.join(d, 'net.d', '10-probe-agent-lab.conflist'), JSON.stringify({
    cniVersion: '1.0.0',
    name: lay.network,
    plugins: [{
      type: 'bridge',
      bridge: lay.bridge,
      isGateway: true,
      // No NAT: the host's nftables/iptables stay untouched.
      ipMasq: false,
      hairpinMode: true,
      ipam: {
        type: 'host-local',
        dataDir: path.join(d, 'ipam'),
        ranges: [[{ subnet: lay.subnet4 }], [{ subnet: lay.subnet6 }]],
        ...(opts.routes?.length ? { routes: opts.routes.map((dst) => ({ dst })) } : {}),
      },
    }],
  }, null, 2));
}

const live = new Set<Lab>();
let handlersInstalled = false;

function registerExitCleanup(lab: Lab): void {
  live.add(lab);
  if (handlersInstalled) return;
  handlersInstalled = true;
  process.on('exit', cleanupAll);
  for (const sig of ['SIGINT', 'SIGTERM'] as const) {
    const onSignal = (): void => {
      cleanupAll();
      process.off(sig, onSignal);
      // Nobody else handles it: let the default action (exit) happen.
      if (process.listenerCount(sig) === 0) process.kill(process.pid, sig);
    };
    process.on(sig, onSignal);
  }
}

function unregisterExitCleanup(lab: Lab): void {
  live.delete(lab);
}

function cleanupAll(): void {
  for (const lab of [...live]) {
    live.delete(lab);
    try {
      lab.syncCleanup();
    } catch {
      // best effort at exit
    }
  }
}
