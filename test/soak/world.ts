/**
 * The soak's world: lab netns running pod servers, the kubelet pods that point at them (several
 * pods share one netns and its IPs), and the churn the test drives: servers made unhealthy or not
 * serving, servers stopped and started (a container restart: new container IDs), pods added and
 * removed, and a whole lab's netns replaced by new ones (new sandboxes: new IPs and container IDs).
 * Every change is recorded with its time, so that the judge can tell what each probe should say.
 */
import { createHash } from 'node:crypto';
import { createLab, type Lab, type LabPod, type RunningServer } from '../lab/lab.ts';
import type { FakeKubelet } from '../support/fake-kubelet.ts';
import { makePod, uidFor } from '../support/pod-factory.ts';
import { PodCgroups } from './pod-cgroups.ts';

/** What the server in a netns does right now. */
export type NetnsState = 'up' | 'down' | 'unhealthy' | 'notserving';
/** The three probes every soak pod carries. */
export type ProbeKind = 'http-liveness' | 'grpc-readiness' | 'tcp-readiness';

export const PORTS = { http: 8080, grpc: 9090, tcp: 5432 } as const;
export const NAMESPACE = 'soak';
/**
 * Every probe every second. The 3 s timeout (kubelet's default is 1 s) keeps a CI machine's CPU
 * starvation from passing for a verdict: the states the soak drives fail fast (refused, 503,
 * NOT_SERVING), so the timeout does not slow any detection down.
 */
const PERIOD = { periodSeconds: 1, timeoutSeconds: 3, successThreshold: 1, failureThreshold: 2 };

/** One netns slot: a place pods point at, whose lab netns may be replaced. */
export interface NetnsSlot {
  key: string;
  labIndex: number;
  pod: LabPod;
  server: RunningServer | undefined;
  state: NetnsState;
  /** Busy with an episode (no second one at once). */
  busy: boolean;
  /** Its lab is about to be replaced: no new episode. */
  reserved?: boolean;
  /** [time, state] changes, oldest first; a replaced netns counts as a change. */
  history: [number, NetnsState][];
}

/** One kubelet pod of the soak. */
export interface SoakPod {
  uid: string;
  name: string;
  slot: NetnsSlot;
  /** Container generation: bumped when the containers restart or the sandbox is replaced. */
  epoch: number;
  /** When the agent's view of this pod last had to change (added, restarted, moved). */
  changedAt: number;
  startedAt: string;
}

/** Raw result each probe should have in each server state ('error': it cannot run). */
export function expected(kind: ProbeKind, state: NetnsState): 'success' | 'failure' {
  if (state === 'down') return 'failure';
  if (kind === 'http-liveness') return state === 'unhealthy' ? 'failure' : 'success';
  if (kind === 'grpc-readiness') return state === 'notserving' ? 'failure' : 'success';
  return 'success';
}

/** Which probe a status is, from its container and probe type. */
export function kindOf(containerName: string, probeType: string): ProbeKind | undefined {
  if (containerName === 'app' && probeType === 'Liveness') return 'http-liveness';
  if (containerName === 'app' && probeType === 'Readiness') return 'grpc-readiness';
  if (containerName === 'proxy' && probeType === 'Readiness') return 'tcp-readiness';
  return undefined;
}

/** Options of the world. */
export interface WorldOptions {
  pods: number;
  labs: number;
  netnsPerLab: number;
  kubelet: FakeKubelet;
  /** How the agent will find the pods' netns: 'procfs' gives each pod a pause process in a kubelet-shaped cgroup. */
  resolver: 'procfs' | 'address';
  tag: string;
  log: (line: string) => void;
}

/** The labs, servers and pods, and the churn actions on them. */
export class World {
  readonly labs: Lab[] = [];
  readonly slots: NetnsSlot[] = [];
  readonly pods = new Map<string, SoakPod>();
  /** uid -> when it left the kubelet list. */
  readonly removed = new Map<string, number>();
  readonly counts: Record<string, number> = {};
  readonly #o: WorldOptions;
  readonly #cgroups: PodCgroups | undefined;
  #nextPod = 0;

  constructor(opts: WorldOptions) {
    this.#o = opts;
    if (opts.resolver === 'procfs') {
      PodCgroups.sweep();
      this.#cgroups = new PodCgroups();
    }
  }

  /** Builds the labs, starts a server per netns and lists the pods. */
  async start(): Promise<void> {
    for (let l = 0; l < this.#o.labs; l++) {
      const lab = await createLab({ pods: this.#o.netnsPerLab, policy: 'drop', tag: `${this.#o.tag}-${l}` });
      this.labs.push(lab);
      const servers = await Promise.all(lab.pods.map((p) => startServer(lab, p)));
      lab.pods.forEach((p, i) => {
        this.slots.push({ key: `${l}/${i}`, labIndex: l, pod: p, server: servers[i], state: 'up', busy: false, history: [[Date.now(), 'up']] });
      });
    }
    for (let i = 0; i < this.#o.pods; i++) await this.#addPod(this.slots[i % this.slots.length] as NetnsSlot);
    this.publish();
  }

  /** Serves the current pods on the test kubelet. */
  publish(): void {
    this.#o.kubelet.setPods([...this.pods.values()].map(podJson));
  }

  /** The state of `slot` at time `t`, and since when it has held. */
  stateAt(slot: NetnsSlot, t: number): { state: NetnsState; since: number } {
    let found: [number, NetnsState] = slot.history[0] as [number, NetnsState];
    for (const h of slot.history) {
      if (h[0] > t) break;
      found = h;
    }
    return { state: found[1], since: found[0] };
  }

  /** A random idle slot, or undefined. */
  idleSlot(rand: () => number): NetnsSlot | undefined {
    const idle = this.slots.filter((s) => !s.busy && !s.reserved);
    return idle.length ? idle[Math.floor(rand() * idle.length)] : undefined;
  }

  /** An episode on one netns: make it unhealthy, not serving, or stop it; after `ms`, back to up. */
  async episode(slot: NetnsSlot, state: Exclude<NetnsState, 'up'>, ms: number): Promise<void> {
    slot.busy = true;
    this.#count(`episode-${state}`);
    try {
      // Marked before acting: probes may see the change as soon as it starts.
      this.#touch(slot);
      if (state === 'unhealthy') await slot.server?.control('/control/health?ok=0');
      else if (state === 'notserving') await slot.server?.control('/control/grpc?service=&status=NOT_SERVING');
      else await slot.server?.stop();
      this.#set(slot, state);
      await new Promise((r) => setTimeout(r, ms));
      this.#touch(slot);
      if (state === 'down') {
        slot.server = await startServer(this.#lab(slot), slot.pod);
      } else if (state === 'unhealthy') {
        await slot.server?.control('/control/health?ok=1');
      } else {
        await slot.server?.control('/control/grpc?service=&status=SERVING');
      }
      // kubelet restarts a container whose liveness failed; a stopped server is a crashed container.
      if (state !== 'notserving') this.#restartPods(slot);
      this.#set(slot, 'up');
      this.publish();
    } finally {
      slot.busy = false;
    }
  }

  /** Removes one pod and adds a new one (new UID) on a random slot. */
  async churnPod(rand: () => number): Promise<void> {
    const all = [...this.pods.values()];
    const victim = all[Math.floor(rand() * all.length)];
    await this.#addPod(this.slots[Math.floor(rand() * this.slots.length)] as NetnsSlot);
    if (victim) {
      this.pods.delete(victim.uid);
      this.removed.set(victim.uid, Date.now());
      this.#count('pod-removed');
    }
    this.publish();
    // kubelet tears the sandbox down once the pod is gone from its list.
    if (victim) await this.#cgroups?.stop(victim.uid);
  }

  /** Replaces every netns of lab `l` by a fresh lab (new sandboxes: new IPs, new container IDs), then deletes the old one. */
  async recreateLab(l: number): Promise<void> {
    const mine = this.slots.filter((s) => s.labIndex === l);
    // Reserve the slots (no new episode starts there), then wait for the running ones to end.
    for (const s of mine) s.reserved = true;
    while (mine.some((s) => s.busy)) await new Promise((r) => setTimeout(r, 200));
    for (const s of mine) s.busy = true;
    this.#count('lab-recreated');
    try {
      const old = this.labs[l] as Lab;
      // The new lab first: the old slot (and its addresses) is never free while pods still point at it.
      const lab = await createLab({ pods: mine.length, policy: 'drop', tag: `${this.#o.tag}-${l}` });
      const servers = await Promise.all(lab.pods.map((p) => startServer(lab, p)));
      this.labs[l] = lab;
      mine.forEach((s, i) => {
        s.pod = lab.pods[i] as LabPod;
        s.server = servers[i];
      });
      // New sandboxes: the pods' pause processes move to the new netns.
      const moved = [...this.pods.values()].filter((p) => mine.includes(p.slot));
      await Promise.all(moved.map((p) => this.#cgroups?.start(p.uid, p.slot.pod.name)));
      for (const s of mine) {
        this.#set(s, 'up');
        this.#restartPods(s);
      }
      this.publish();
      // Let one poll carry the new IPs before the old netns disappear under the agent.
      await new Promise((r) => setTimeout(r, 1500));
      await old.destroy();
    } finally {
      for (const s of mine) {
        s.busy = false;
        s.reserved = false;
      }
    }
  }

  /** Stops every pause process and server, and deletes every lab. */
  async destroy(): Promise<void> {
    await this.#cgroups?.destroy();
    await Promise.allSettled(this.labs.map((l) => l.destroy()));
  }

  #lab(slot: NetnsSlot): Lab {
    return this.labs[slot.labIndex] as Lab;
  }

  async #addPod(slot: NetnsSlot): Promise<void> {
    const name = `soak-${this.#nextPod++}`;
    // The run's pid in the seed: two soaks on one machine (a developer's and a test's) must never
    // share pod UIDs, or the procfs resolver rightly finds each pod in two netns and refuses it.
    const uid = uidFor(`${process.pid}/${NAMESPACE}/${name}`);
    await this.#cgroups?.start(uid, slot.pod.name);
    this.pods.set(uid, { uid, name, slot, epoch: 0, changedAt: Date.now(), startedAt: '2025-11-20T08:00:05Z' });
    this.#count('pod-added');
  }

  #restartPods(slot: NetnsSlot): void {
    const now = Date.now();
    for (const p of this.pods.values()) {
      if (p.slot !== slot) continue;
      p.epoch++;
      p.changedAt = now;
      p.startedAt = new Date(now).toISOString();
    }
  }

  /** Records "changing now" without a new state: the judge waits for things to settle again. */
  #touch(slot: NetnsSlot): void {
    slot.history.push([Date.now(), slot.state]);
  }

  #set(slot: NetnsSlot, state: NetnsState): void {
    slot.state = state;
    slot.history.push([Date.now(), state]);
  }

  #count(what: string): void {
    this.counts[what] = (this.counts[what] ?? 0) + 1;
    this.#o.log(`churn: ${what}`);
  }
}

async function startServer(lab: Lab, pod: LabPod): Promise<RunningServer> {
  return lab.startServer(pod, { http: PORTS.http, grpc: PORTS.grpc, tcp: PORTS.tcp });
}

/** The container ID kubelet reports for `container` of pod `uid` in generation `epoch`. */
export function containerID(uid: string, container: string, epoch: number): string {
  return `containerd://${createHash('sha256').update(`${uid}/${container}/${epoch}`).digest('hex')}`;
}

/** The kubelet's v1.Pod for a soak pod: "app" (HTTP liveness, gRPC readiness) and a sidecar "proxy" (TCP readiness). */
export function podJson(p: SoakPod): Record<string, unknown> {
  const pod = makePod({
    uid: p.uid, name: p.name, namespace: NAMESPACE, ips: p.slot.pod.ips, probe: 'none', port: PORTS.http,
    containerID: containerID(p.uid, 'app', p.epoch), restartCount: p.epoch, sidecar: true,
  });
  const spec = pod.spec as { containers: Record<string, unknown>[]; initContainers: Record<string, unknown>[] };
  Object.assign(spec.containers[0] as Record<string, unknown>, {
    livenessProbe: { httpGet: { path: '/healthz', port: PORTS.http }, ...PERIOD },
    readinessProbe: { grpc: { port: PORTS.grpc }, ...PERIOD },
  });
  (spec.initContainers[0] as Record<string, unknown>).readinessProbe = { tcpSocket: { port: PORTS.tcp }, ...PERIOD };
  const status = pod.status as { containerStatuses: Record<string, unknown>[]; initContainerStatuses: Record<string, unknown>[] };
  for (const [list, name] of [[status.containerStatuses, 'app'], [status.initContainerStatuses, 'proxy']] as const) {
    const cs = list[0] as Record<string, unknown>;
    cs['containerID'] = containerID(p.uid, name, p.epoch);
    cs['restartCount'] = p.epoch;
    cs['state'] = { running: { startedAt: p.startedAt } };
  }
  return pod;
}
