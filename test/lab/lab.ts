/**
 * The test lab: network namespaces standing in for pods on a bridge in the node netns, dual-stack,
 * with an nftables rule that blocks the node from opening connections to the pods (a NetworkPolicy
 * world without kubelet's hole). Each lab owns a slot (see slots.ts), so parallel test files never
 * collide, and is torn down on destroy(), on process exit and on SIGINT/SIGTERM.
 */
import { readdirSync } from 'node:fs';
import { deleteSlotObjects, claimSlot, LabError, releaseSlot, slotNames, type SlotNames } from './slots.ts';
import { nftScript, nodeBatch, podBatch, run, sumCounters, type LabPolicy, type RunResult } from './net.ts';
import { PodServerProcess, type ServerPorts } from './server.ts';

export { LabError } from './slots.ts';
export type { LabPolicy } from './net.ts';
export type { ServerPorts } from './server.ts';

const MAX_PODS = 64;
const MAX_TAG = 64;

/** Options of createLab(). */
export interface LabOptions {
  /** Number of pods, 1..64; default 3. */
  pods?: number;
  /** The node->pod rule; default 'drop'. */
  policy?: LabPolicy;
  /** Free text recorded in the slot's owner file, to tell whose leftovers are whose. */
  tag?: string;
}

/** One pod: a named netns with eth0 on the lab bridge. */
export interface LabPod {
  name: string;
  /** /run/netns/<name> */
  netns: string;
  ipv4: string;
  ipv6: string;
  /** [ipv4, ipv6], as in a pod's status.podIPs. */
  ips: string[];
  /** 1-based index within the lab. */
  index: number;
  /** The node-side veth peer of the pod's eth0. */
  hostVeth: string;
}

/** What pod-server.ts should serve; a port of 0 picks a free one (see RunningServer.ports). */
export interface ServerOptions {
  http?: number;
  https?: number;
  tcp?: number;
  grpc?: number;
  hang?: number;
  /** Initial grpc.health.v1 statuses; '' is the whole server (default SERVING). */
  grpcServices?: Record<string, 'SERVING' | 'NOT_SERVING' | 'UNKNOWN'>;
  /** 'all' (default): `::`, dual-stack; 'loopback': 127.0.0.1 and ::1 only. */
  bind?: 'all' | 'loopback';
}

/** A pod server running inside a pod's netns. */
export interface RunningServer {
  pid: number;
  pod: LabPod;
  /** The ports actually bound (useful with port 0). */
  ports: ServerPorts;
  /** Kills the server (SIGTERM, then SIGKILL) and waits for it. Idempotent. */
  stop(): Promise<void>;
  /** GET on the server's control endpoint from inside the netns; rejects unless the answer is 2xx. */
  control(path: string): Promise<void>;
}

/** Options of Lab.exec() beyond the contract's three arguments. */
export interface ExecOptions {
  /** Kill the command and reject after this long; default 30 s. */
  timeoutMs?: number;
  /** Text written to the command's stdin. */
  input?: string;
}

/** A built lab. */
export interface Lab {
  /** The slot number; also the third octet of the pods' IPv4 addresses. */
  id: number;
  pods: LabPod[];
  bridge: string;
  /** The nft table name (family inet), whether or not it currently exists. */
  nftTable: string;
  gatewayV4: string;
  gatewayV6: string;
  subnetV4: string;
  subnetV6: string;
  policy: LabPolicy;
  /** Runs pod-server.ts in the pod's netns and waits until it is ready. */
  startServer(pod: LabPod, opts: ServerOptions): Promise<RunningServer>;
  /** Packets counted by the node->pod rule (0 when the policy is 'none'). */
  nodeToPodDrops(): Promise<number>;
  /** Runs a command inside the pod's netns and collects its output (rejects on timeout only). */
  exec(pod: LabPod, cmd: string, args: string[], opts?: ExecOptions): Promise<RunResult>;
  /** Replaces the node->pod rule (counters restart at 0). */
  setPolicy(policy: LabPolicy): Promise<void>;
  /** Kills servers and deletes every kernel object of the lab, then frees its slot. Idempotent. */
  destroy(): Promise<void>;
}

/** Labs of this process still alive, for the exit/signal handlers. */
const live = new Set<LabImpl>();
let handlersInstalled = false;

class LabImpl implements Lab {
  readonly id: number;
  readonly pods: LabPod[];
  readonly bridge: string;
  readonly nftTable: string;
  readonly gatewayV4: string;
  readonly gatewayV6: string;
  readonly subnetV4: string;
  readonly subnetV6: string;
  policy: LabPolicy;
  readonly #names: SlotNames;
  readonly #servers = new Set<PodServerProcess>();
  #destroyed: Promise<void> | undefined;
  #torn = false;

  constructor(names: SlotNames, pods: number, policy: LabPolicy) {
    this.#names = names;
    this.id = names.slot;
    this.bridge = names.bridge;
    this.nftTable = names.nftTable;
    this.gatewayV4 = names.gatewayV4;
    this.gatewayV6 = names.gatewayV6;
    this.subnetV4 = names.subnetV4;
    this.subnetV6 = names.subnetV6;
    this.policy = policy;
    this.pods = Array.from({ length: pods }, (_, k) => {
      const i = k + 1;
      const name = names.netns(i);
      const ipv4 = names.podV4(i);
      const ipv6 = names.podV6(i);
      return { name, netns: `/run/netns/${name}`, ipv4, ipv6, ips: [ipv4, ipv6], index: i, hostVeth: names.hostVeth(i) };
    });
  }

  /** Builds the topology; on any failure deletes what was built and frees the slot. */
  async build(): Promise<void> {
    try {
      await run('ip', ['-batch', '-'], { input: nodeBatch(this.#names, this.pods.length) });
      await Promise.all(this.pods.map((p) => run('ip', ['-n', p.name, '-batch', '-'], { input: podBatch(this.#names, p.index) })));
      if (this.policy !== 'none') await run('nft', ['-f', '-'], { input: nftScript(this.#names, this.policy) });
    } catch (err) {
      this.destroySync();
      throw err;
    }
  }

  #own(pod: LabPod): void {
    if (!this.pods.some((p) => p.name === pod?.name)) {
      throw new LabError(`pod ${JSON.stringify(pod?.name)} does not belong to lab ${this.id}`, { lab: this.id });
    }
    if (this.#destroyed || this.#torn) throw new LabError(`lab ${this.id} is destroyed`, { lab: this.id });
  }

  async startServer(pod: LabPod, opts: ServerOptions): Promise<RunningServer> {
    this.#own(pod);
    if (typeof opts !== 'object' || opts === null) throw new LabError('startServer needs an options object');
    const proc = new PodServerProcess(pod.name, JSON.stringify(opts));
    this.#servers.add(proc);
    try {
      await proc.ready();
    } catch (err) {
      this.#servers.delete(proc);
      throw err;
    }
    return {
      pid: proc.pid,
      pod,
      ports: proc.ports,
      stop: async () => {
        await proc.stop();
        this.#servers.delete(proc);
      },
      control: (path) => proc.control(path),
    };
  }

  async nodeToPodDrops(): Promise<number> {
    if (this.policy === 'none') return 0;
    const r = await run('nft', ['-j', 'list', 'table', 'inet', this.nftTable]);
    return sumCounters(r.stdout);
  }

  async exec(pod: LabPod, cmd: string, args: string[], opts: ExecOptions = {}): Promise<RunResult> {
    this.#own(pod);
    if (typeof cmd !== 'string' || cmd === '' || !Array.isArray(args)) throw new LabError('exec needs a command and an argument array');
    return run('ip', ['netns', 'exec', pod.name, cmd, ...args], { ...opts, allowFailure: true });
  }

  async setPolicy(policy: LabPolicy): Promise<void> {
    checkPolicy(policy);
    if (this.#destroyed) throw new LabError(`lab ${this.id} is destroyed`, { lab: this.id });
    if (policy === 'none') await run('nft', ['delete', 'table', 'inet', this.nftTable], { allowFailure: true });
    else await run('nft', ['-f', '-'], { input: nftScript(this.#names, policy) });
    this.policy = policy;
  }

  destroy(): Promise<void> {
    this.#destroyed ??= (async () => {
      await Promise.all([...this.#servers].map((s) => s.stop()));
      this.destroySync();
    })();
    return this.#destroyed;
  }

  /** Synchronous teardown, also used from the exit handler: kills, deletes, frees the slot. */
  destroySync(): void {
    // Strictly once: a second run could delete a slot that someone claimed after our release.
    if (this.#torn) return;
    this.#torn = true;
    for (const s of this.#servers) s.child.kill('SIGKILL');
    this.#servers.clear();
    deleteSlotObjects(this.id, this.pods.map((p) => p.name));
    releaseSlot(this.id);
    live.delete(this);
  }
}

function checkPolicy(policy: unknown): asserts policy is LabPolicy {
  if (policy !== 'drop' && policy !== 'reject' && policy !== 'none') {
    throw new LabError("policy must be 'drop', 'reject' or 'none'", { policy });
  }
}

/** Tears down every live lab synchronously; best effort, for exit and signal handlers. */
function destroyAllSync(): void {
  for (const lab of [...live]) {
    try {
      lab.destroySync();
    } catch {
      // keep going: the other labs still deserve a cleanup
    }
  }
}

function installHandlers(): void {
  if (handlersInstalled) return;
  handlersInstalled = true;
  process.on('exit', destroyAllSync);
  for (const sig of ['SIGINT', 'SIGTERM'] as const) {
    const onSignal = (): void => {
      destroyAllSync();
      // Without other listeners, re-raise so the process dies with the signal's usual status.
      process.removeListener(sig, onSignal);
      if (process.listenerCount(sig) === 0) process.kill(process.pid, sig);
    };
    process.on(sig, onSignal);
  }
}

/** Builds a lab (root only). Typically under 0.3 s for 3 pods. */
export async function createLab(opts: LabOptions = {}): Promise<Lab> {
  const pods = opts.pods ?? 3;
  const policy = opts.policy ?? 'drop';
  const tag = opts.tag ?? '';
  if (!Number.isInteger(pods) || pods < 1 || pods > MAX_PODS) throw new LabError(`pods must be an integer 1..${MAX_PODS}`, { pods });
  checkPolicy(policy);
  if (typeof tag !== 'string' || tag.length > MAX_TAG) throw new LabError(`tag must be a string of at most ${MAX_TAG} chars`);
  if (process.getuid?.() !== 0) throw new LabError('createLab needs root (network namespaces, nftables)');
  installHandlers();
  const lab = new LabImpl(slotNames(claimSlot(tag)), pods, policy);
  live.add(lab);
  await lab.build();
  return lab;
}

/** Names of the netns that exist right now (from /run/netns); handy for leak checks in tests. */
export function listNetns(): string[] {
  try {
    return readdirSync('/run/netns');
  } catch {
    return [];
  }
}
