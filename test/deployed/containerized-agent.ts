/**
 * The agent as the DaemonSet runs it, for tests that drive it from outside (the churn soak):
 * deploy/base plus the given components rendered with kustomize, its agent container translated
 * into kubelet's CRI requests (kubelet-translate.ts) and started from the image on the lab's real
 * containerd, in a kubelet-shaped cgroup with the manifest's memory limit. The handle speaks to it
 * as a host process handle would (host PID, socket, metrics), and reads its memory cgroup.
 */
import { mkdirSync, readFileSync, readdirSync, realpathSync } from 'node:fs';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import { ProbeApiClient } from '../../agent/api/client.ts';
import type { ProbeStatus } from '../../agent/scheduler/types.ts';
import { kubeletCgroupParent, type ContainerdLab } from '../lab/containerd.ts';
import type { FakeKubelet } from '../support/fake-kubelet.ts';
import { pollStatuses } from '../support/agent-harness.ts';
import type { SoakAgent } from '../soak/soak.ts';
import { snapshot } from '../soak/observe.ts';
import { agentPatchHead, agentPid, agentPorts, memoryCgroup, renderDeploy, type AgentPorts } from './agent-pod.ts';
import type { CriPodRunner } from './cri-pod.ts';
import { containerConfig, quantity, sandboxConfig, unmountPodVolumes, type PodPlacement } from './kubelet-translate.ts';

type Obj = Record<string, unknown>;

/** The container's memory as the kernel accounted it (cgroup v1 memory controller). */
export interface ContainerMemory {
  limitBytes: number;
  /** memory.max_usage_in_bytes: the cgroup's peak (anonymous memory and page cache). */
  peakUsageBytes: number;
  oomKills: number;
  /** The agent process's peak RSS (VmHWM). */
  agentPeakRssBytes: number;
  /**
   * Its RSS now, split: anonymous memory is charged to this cgroup; file-backed pages (the Node
   * binary, the image's files) to whichever cgroup first read them, so RSS can exceed the cgroup's usage.
   */
  agentRssAnonBytes: number;
  agentRssFileBytes: number;
}

/** A running containerized agent: the soak's handle plus what only a container has. */
export interface ContainerizedAgent extends SoakAgent {
  containerId: string;
  /** The memory figures now (while running) or as read just before stop(). */
  memory(): ContainerMemory;
  /** The tail of the container's log, for failure messages. */
  logTail(lines?: number): string;
  /** Removes the pod sandbox (after stop, or to clean up). */
  remove(): Promise<void>;
}

/** What to run: the lab, where to put node-side files, which components, and agent settings. */
export interface ContainerizedAgentOptions {
  ctrd: ContainerdLab;
  runner: CriPodRunner;
  /** A scratch directory of the test (host paths, pod dirs, the overlay). */
  scratch: string;
  kubelet: FakeKubelet;
  /** Components on top of deploy/base (host-network: the fake kubelet listens on the node's loopback). */
  components: string[];
  /** PROBE_AGENT_* settings that differ on this lab node (they override the manifest's by name). */
  env: Record<string, string>;
  name?: string;
}

/** Renders deploy/base + components with this node's patch; returns the objects. */
function render(dir: string, components: string[], env: Record<string, string>, ports: AgentPorts, socketDir: string): Obj[] {
  const envYaml = Object.entries(env).map(([k, v]) => `            - name: ${k}\n              value: ${JSON.stringify(v)}\n`).join('');
  return renderDeploy(dir, components, `${agentPatchHead(ports)}${envYaml}      volumes:
        - name: probe-socket-dir
          hostPath:
            path: ${socketDir}
            type: DirectoryOrCreate
`);
}

/** Renders, translates and starts the agent pod; resolves once its socket answers. */
export async function startContainerizedAgent(o: ContainerizedAgentOptions): Promise<ContainerizedAgent> {
  const name = o.name ?? 'probe-agent-soak';
  const uid = randomUUID();
  const base = path.join(o.scratch, name);
  const overlay = path.join(base, 'overlay');
  const socketDir = path.join(base, 'host-run-probe-agent');
  mkdirSync(overlay, { recursive: true });
  const ports = await agentPorts();
  const metricsPort = ports.metrics;
  const objs = render(overlay, o.components, o.env, ports, socketDir);
  const ds = objs.find((x) => x.kind === 'DaemonSet' && (x.metadata as Obj).name === 'probe-agent') as Obj;
  const template = (ds.spec as Obj).template as Obj;
  const agentSpec = ((template.spec as Obj).containers as Obj[]).find((c) => c.name === 'agent') as Obj;
  const limitBytes = quantity(((agentSpec.resources as Obj).limits as Obj).memory);
  const place: PodPlacement = {
    nodeName: 'lab-node', hostIP: '127.0.0.1', podIP: '127.0.0.1', uid, name, namespace: 'probe-agent',
    podDir: path.join(base, 'pod'), logDir: path.join(base, 'logs'),
    cgroupParent: kubeletCgroupParent(o.ctrd.cgroupPrefix, uid, 'burstable'),
    imageRef: (image) => (image.includes('/') ? image : `docker.io/library/${image}`),
    // See deployed.test.ts: HostToContainer sources must be given as their real path.
    hostPath: (p) => realpathSync(p),
    configMaps: Object.fromEntries(objs.filter((x) => x.kind === 'ConfigMap').map((x) => [String((x.metadata as Obj).name), x.data as Record<string, string>])),
    serviceAccount: { token: `soak-${uid}`, caCrt: readFileSync(o.kubelet.certs.caFile, 'utf8') },
  };
  mkdirSync(place.logDir, { recursive: true });
  // Only the agent: the soak measures its container, and no sidecar shares its cgroup limit.
  const { sandboxId, containerIds } = await o.runner.runPod(sandboxConfig(template, place), [containerConfig(template, 'agent', place)]);
  const id = containerIds[0] as string;
  const socket = path.join(socketDir, 'probe.sock');
  const client = new ProbeApiClient(socket);
  let cgroup = '';
  let pid = 0;
  let final: ContainerMemory | undefined;

  const logTail = (lines = 8): string => {
    try {
      const dir = path.join(place.logDir, 'agent');
      return readdirSync(dir).map((f) => readFileSync(path.join(dir, f), 'utf8')).join('').trim().split('\n').slice(-lines).join('\n');
    } catch (err) {
      return `(no log: ${(err as Error).message})`;
    }
  };
  const memory = (): ContainerMemory => {
    if (final) return final;
    const read = (f: string): string => readFileSync(path.join(cgroup, f), 'utf8');
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    const kb = (key: string): number => 1024 * Number(new RegExp(`^${key}:\\s+(\\d+)`, 'm').exec(status)?.[1] ?? 0);
    return {
      agentRssAnonBytes: kb('RssAnon'),
      agentRssFileBytes: kb('RssFile') + kb('RssShmem'),
      limitBytes,
      peakUsageBytes: Number(read('memory.max_usage_in_bytes')),
      oomKills: Number(/oom_kill (\d+)/.exec(read('memory.oom_control'))?.[1] ?? 0),
      agentPeakRssBytes: snapshot(pid).peakMB * 2 ** 20,
    };
  };

  const deadline = Date.now() + 60_000;
  for (;;) {
    const st = await o.runner.status(id);
    if (st.state === 'CONTAINER_EXITED') throw new Error(`the containerized agent exited during start (${st.exitCode} ${st.reason}): ${logTail()}`);
    if (st.state === 'CONTAINER_RUNNING' && !pid) {
      cgroup = memoryCgroup(st);
      pid = agentPid(st.pid);
    }
    if (pid) {
      try {
        await client.version(1000);
        break;
      } catch {
        // socket not up yet
      }
    }
    if (Date.now() > deadline) throw new Error(`the containerized agent did not answer on ${socket} in 60 s: ${logTail()}`);
    await new Promise((r) => setTimeout(r, 200));
  }
  const limitSet = Number(readFileSync(path.join(cgroup, 'memory.limit_in_bytes'), 'utf8'));
  if (limitSet !== limitBytes) throw new Error(`memory cgroup limit ${limitSet} is not the manifest's ${limitBytes}`);

  return {
    pid,
    client,
    containerId: id,
    memory,
    logTail,
    waitForStatuses: (pred: (s: ProbeStatus[]) => boolean, timeoutMs = 15_000): Promise<ProbeStatus[]> =>
      pollStatuses(client, pred, timeoutMs, 200, (last) => `${last.length} statuses; log: ${logTail(3)}`),
    async http(p: string) {
      const res = await fetch(`http://127.0.0.1:${metricsPort}${p}`, { signal: AbortSignal.timeout(10_000) });
      return { status: res.status, body: await res.text() };
    },
    /** kubelet's StopContainer with the manifest's grace period; the exit code, or the runtime's reason (OOMKilled). */
    async stop() {
      client.close();
      final = memory();
      const grace = Number((template.spec as Obj).terminationGracePeriodSeconds ?? 30);
      await o.runner.stopContainer(id, grace);
      const st = await o.runner.status(id);
      return st.reason === 'OOMKilled' ? 'OOMKilled' : st.exitCode;
    },
    async remove() {
      client.close();
      await o.runner.removePod(sandboxId);
      unmountPodVolumes(place.podDir);
    },
  };
}
