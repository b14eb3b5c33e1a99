/**
 * A private CRI runtime for tests: containerd (Debian's 1.6, or a binary given: 2.x) here, CRI-O in
 * crio.ts, on the same slots. Config, root, state and socket in a per-slot scratch dir; CNI bridge
 * with a slot-unique name and dual-stack subnets (10.251.<slot>.0/24, fd00:10:251:<slot>::/64, no
 * masquerade); a locally built pause image imported (containerd: into k8s.io). Sandboxes are
 * created with kubelet's labels and a kubelet-shaped cgroup parent, so the agent's resolvers see
 * what they would see on a node. Root only.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { execFile, execFileSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { CriClient, type CriNamespaceMode } from '../../agent/netns/cri-client.ts';
import { KubeletCri } from '../support/kubelet-cri.ts';
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

/** The runtimes the lab runs. */
export type RuntimeKind = 'containerd' | 'crio';

/** A running private CRI runtime (containerd here, CRI-O from crio.ts). */
export interface RuntimeLab {
  kind: RuntimeKind;
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
  /** The runtime daemon's pid while it runs. */
  readonly pid: number | undefined;
  /** The daemon's log (stdout and stderr). */
  logFile: string;
  /** Puts an image archive (docker-archive or OCI) into the runtime's store under `ref`. */
  importImage(tar: string, ref: string): void;
  /** Gives image `from` the name `to` too. */
  tagImage(from: string, to: string): void;
  /** SIGKILLs container `id`'s process, as a crash would (the runtime sees it exit). */
  killContainer(id: string): Promise<void>;
  /** When the daemon's log (its text) says it was asked to stop container `id` (ms since the epoch). */
  stopRequestedAt(log: string, id: string): number | undefined;
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
  /** Stops the runtime daemon only (sandboxes keep running, as on a node during a runtime restart). */
  stopContainerd(): Promise<void>;
  /** Starts the daemon again on the same state. */
  startContainerd(): Promise<void>;
  destroy(): Promise<void>;
}

/** The containerd lab (the name most tests know it by). */
export type ContainerdLab = RuntimeLab;

/** What differs between the runtimes: how the daemon starts, where it listens, how images go in. */
export interface RuntimeDaemon {
  kind: RuntimeKind;
  socket: string;
  netnsDir: string;
  command: string;
  args: string[];
  env?: NodeJS.ProcessEnv;
  importImage(tar: string, ref: string): void;
  tagImage(from: string, to: string): void;
  /** The text of the daemon's log line saying it was asked to stop container `id`. */
  stopLine(id: string): string;
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
  return createLab((lay) => {
    writeConfig(lay, opts);
    const socket = path.join(lay.dir, 'containerd.sock');
    const bin = opts.binary;
    // Its own ctr beside it: ctr 1.6 does not know a 2.x daemon's every answer.
    const ctr = bin && existsSync(path.join(path.dirname(bin), 'ctr')) ? path.join(path.dirname(bin), 'ctr') : 'ctr';
    return {
      kind: 'containerd',
      socket,
      netnsDir: path.join(lay.dir, 'state', 'io.containerd.grpc.v1.cri', 'netns'),
      command: bin ?? 'containerd',
      args: ['--config', path.join(lay.dir, 'config.toml')],
      ...(bin ? { env: { ...process.env, PATH: `${path.dirname(bin)}:${process.env['PATH'] ?? ''}` } } : {}),
      // The archive names its image: `ref` is what the caller expects it to be.
      importImage: (tar) => {
        execFileSync(ctr, ['--address', socket, '-n', 'k8s.io', 'images', 'import', '--snapshotter', 'overlayfs', tar], { stdio: 'pipe', timeout: 300_000 });
      },
      tagImage: (from, to) => {
        execFileSync(ctr, ['--address', socket, '-n', 'k8s.io', 'images', 'tag', '--force', from, to], { stdio: 'pipe', timeout: 60_000 });
      },
      stopLine: (id) => `msg="StopContainer for \\"${id}\\"`,
    };
  }, (lab) => lab.importImage(ensurePauseImage(), PAUSE_IMAGE_REF));
}

/**
 * A lab on a fresh slot: `prepare` writes the runtime's config there and says how to run it; the
 * daemon starts, then `after` (images in). Torn down on failure and at exit.
 */
export async function createLab(prepare: (lay: SlotLayout) => RuntimeDaemon, after?: (lab: RuntimeLab) => void | Promise<void>): Promise<RuntimeLab> {
  const slot = allocateSlot();
  const lay = slotLayout(slot);
  // A previous owner of this slot may have died without a sweep.
  sweepSlot(slot);
  let lab: Lab | undefined;
  try {
    lab = new Lab(lay, prepare(lay));
    registerExitCleanup(lab);
    await lab.startContainerd();
    await after?.(lab);
    return lab;
  } catch (err) {
    if (lab) await lab.destroy();
    else {
      sweepSlot(slot);
      releaseSlot(slot);
    }
    throw err;
  }
}

class Lab implements RuntimeLab {
  readonly kind: RuntimeKind;
  readonly slot: number;
  readonly dir: string;
  readonly socket: string;
  readonly endpoint: string;
  readonly netnsDir: string;
  readonly bridge: string;
  readonly cgroupPrefix: string;
  readonly client: CriClient;
  readonly logFile: string;
  readonly #daemon: RuntimeDaemon;
  #child: ChildProcess | undefined;
  #destroyed = false;

  constructor(lay: SlotLayout, daemon: RuntimeDaemon) {
    this.#daemon = daemon;
    this.kind = daemon.kind;
    this.slot = lay.slot;
    this.dir = lay.dir;
    this.socket = daemon.socket;
    this.endpoint = `unix://${this.socket}`;
    this.netnsDir = daemon.netnsDir;
    this.logFile = path.join(lay.dir, `${daemon.kind}.log`);
    this.bridge = lay.bridge;
    this.cgroupPrefix = lay.cgroupPrefix;
    this.client = new CriClient(this.endpoint, { deadlineMs: 10_000 });
  }

  get pid(): number | undefined {
    return this.#child?.pid !== undefined && pidAlive(this.#child.pid) ? this.#child.pid : undefined;
  }

  importImage(tar: string, ref: string): void {
    this.#daemon.importImage(tar, ref);
  }

  tagImage(from: string, to: string): void {
    this.#daemon.tagImage(from, to);
  }

  async killContainer(id: string): Promise<void> {
    // Both runtimes' verbose ContainerStatus carries the process in info["info"].pid.
    const cri = new KubeletCri(this.socket);
    try {
      const r = await cri.call<{ info: Record<string, string> }>('ContainerStatus', { containerId: id, verbose: true });
      if (!r.ok) throw new Error(`ContainerStatus ${id}: ${r.details}`);
      const pid = (JSON.parse(r.msg.info['info'] ?? '{}') as { pid?: number }).pid;
      if (!pid) throw new Error(`ContainerStatus ${id}: no pid in its verbose info`);
      process.kill(pid, 'SIGKILL');
    } finally {
      cri.close();
    }
  }

  stopRequestedAt(log: string, id: string): number | undefined {
    const want = this.#daemon.stopLine(id);
    const line = log.split('\n').find((l) => l.includes(want));
    return line ? logrusTime(line) : undefined;
  }

  async startContainerd(): Promise<void> {
    if (this.pid) return;
    const log = openSync(this.logFile, 'a');
    try {
      const d = this.#daemon;
      this.#child = spawn(d.command, d.args, { stdio: ['ignore', log, log], detached: true, ...(d.env ? { env: d.env } : {}) });
    } finally {
      closeSync(log);
    }
    this.#child.unref();
    const child = this.#child;
    recordContainerdPid(this.slot, child.pid);
    // CRI-O loads its storage and CNI first: slower on a busy machine than containerd.
    const deadline = Date.now() + 60_000;
    const probe = new CriClient(this.endpoint, { deadlineMs: 500 });
    try {
      for (;;) {
        if (child.exitCode !== null || child.signalCode !== null) {
          throw new Error(`${this.kind} exited during start (${child.exitCode ?? child.signalCode}): ${this.#logTail()}`);
        }
        try {
          await probe.version();
          return;
        } catch (err) {
          if (Date.now() > deadline) throw new Error(`${this.kind} did not answer on ${this.endpoint}: ${(err as Error).message}; ${this.#logTail()}`);
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
      // CRI-O checks signatures against the name the pod asked for (kubelet sends both).
      image: { image: opts.image ?? PAUSE_IMAGE_REF, userSpecifiedImage: opts.image ?? PAUSE_IMAGE_REF },
      ...(opts.command ? { command: opts.command } : {}),
      labels: { ...podLabels, 'io.kubernetes.container.name': opts.name },
      ...(opts.annotations ? { annotations: opts.annotations } : {}),
      // The sandbox's namespaces, as kubelet repeats them: CRI-O refuses a mismatch. Not to
      // containerd: 1.6 then runs an exec preStop's network calls outside the pod's netns
      // (gates-agent.test.ts), and it takes them from the sandbox anyway.
      ...(this.kind === 'crio' ? { linux: { securityContext: { namespaceOptions: { network: sb.netnsPath ? 'POD' as const : 'NODE' as const, pid: 'CONTAINER' as const, ipc: 'POD' as const } } } } : {}),
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
      return readFileSync(this.logFile, 'utf8').split('\n').filter((l) => /level=(error|fatal)/.test(l)).slice(-5).join(' | ');
    } catch {
      return '(no log)';
    }
  }
}

/**
 * The time of a logrus text line (`time="..."`), both runtimes' format: containerd's RFC 3339,
 * CRI-O's "2006-01-02 15:04:05.000000000Z07:00"; nanoseconds cut to what Date.parse takes.
 */
export function logrusTime(line: string): number | undefined {
  const t = /^time="([^"]+)"/.exec(line)?.[1];
  if (!t) return undefined;
  const ms = Date.parse(t.replace(' ', 'T').replace(/(\.\d{3})\d+/, '$1'));
  return Number.isNaN(ms) ? undefined : ms;
}

/** kubelet's cgroupfs layout: guaranteed pods sit directly under kubepods. */
export function kubeletCgroupParent(prefix: string, uid: string, qos: QosClass): string {
  return qos === 'guaranteed' ? `/${prefix}/kubepods/pod${uid}` : `/${prefix}/kubepods/${qos}/pod${uid}`;
}

function writeConfig(lay: SlotLayout, opts: ContainerdLabOptions): void {
  const d = lay.dir;
  for (const sub of ['root', 'state', 'net.d', 'ipam', 'runc', 'opt']) mkdirSync(path.join(d, sub), { recursive: true });
  const cri = 'plugins."io.containerd.grpc.v1.cri"';
  // Mirrors as hosts.toml under config_path (1.5 on; registry.mirrors goes in 2.4); an http:// host is pulled over plain HTTP.
  for (const [host, endpoints] of Object.entries(opts.registryMirrors ?? {})) {
    mkdirSync(path.join(d, 'certs.d', host), { recursive: true });
    writeFileSync(path.join(d, 'certs.d', host, 'hosts.toml'), `server = "https://${host}"\n${endpoints.map((e) =>
      `[host.${JSON.stringify(e)}]\n  capabilities = ["pull", "resolve"]\n`).join('')}`);
  }
  const mirrors = opts.registryMirrors ? `[${cri}.registry]\n  config_path = "${d}/certs.d"\n` : '';
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
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing", "io.containerd.nri.v1.nri"]

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
  writeLabCni(lay, opts.routes);
}

/** The lab's CNI: a bridge on the slot's subnets, in <dir>/net.d, addresses kept in <dir>/ipam. */
export function writeLabCni(lay: SlotLayout, routes: string[] | undefined): void {
  const d = lay.dir;
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
        // Via the gateway, named: CRI-O runs CNI CHECK, which looks for the route as the result says it.
        ...(routes?.length ? { routes: routes.map((dst) => ({ dst, gw: lay.subnet4.replace(/0\/24$/, '1') })) } : {}),
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
