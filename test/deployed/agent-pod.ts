/**
 * What the deployed tests share to run the shipped manifests on the lab node: kustomize over
 * deploy/ with a node patch, a free node port, and finding the agent inside its started container.
 */
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import * as net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseAllDocuments } from 'yaml';
import type { ContainerState } from './cri-pod.ts';

const REPO = fileURLToPath(new URL('../..', import.meta.url));
type Obj = Record<string, unknown>;

/** A free TCP port on the node (the agent pod shares the node's netns). */
export async function freePort(): Promise<number> {
  return (await freePorts(1))[0] as number;
}

/** `n` distinct free TCP ports on the node (all held open while they are picked). */
export async function freePorts(n: number): Promise<number[]> {
  const servers = Array.from({ length: n }, () => net.createServer());
  await Promise.all(servers.map((s) => new Promise<void>((r) => s.listen(0, '127.0.0.1', r))));
  const ports = servers.map((s) => (s.address() as net.AddressInfo).port);
  await Promise.all(servers.map((s) => new Promise((r) => s.close(r))));
  return ports;
}

/** The agent's listeners on this lab node: metrics on the pod IP, health on loopback. */
export interface AgentPorts {
  metrics: number;
  health: number;
}

/** Free ports for one agent pod: every agent here shares the node's netns (host network). */
export async function agentPorts(): Promise<AgentPorts> {
  const [metrics, health] = await freePorts(2);
  return { metrics: metrics as number, health: health as number };
}

/**
 * Points an agent container of a rendered template (and the close-hole sidecar's check, if the pod
 * has one) at its own ports, so that a second agent pod on this node does not collide with the first.
 */
export function useAgentPorts(spec: Obj, ports: AgentPorts): void {
  for (const c of (spec.containers ?? []) as Obj[]) {
    c.env = ((c.env ?? []) as Obj[]).map((e) => {
      if (c.name === 'agent' && e.name === 'PROBE_AGENT_METRICS_ADDRESS') return { ...e, value: `$(POD_IP):${ports.metrics}` };
      if (c.name === 'agent' && e.name === 'PROBE_AGENT_HEALTH_ADDRESS') return { ...e, value: `127.0.0.1:${ports.health}` };
      if (c.name === 'close-hole' && e.name === 'CLOSE_HOLE_AGENT_ADDRESS') return { ...e, value: `127.0.0.1:${ports.health}` };
      return e;
    });
  }
}

/**
 * Renders deploy/base + components in `dir` with `nodePatch` (node.yaml) and any further
 * `extraPatches` entries (kustomization.yaml `patches:` items, already indented); returns the objects.
 */
export function renderDeploy(dir: string, components: string[], nodePatch: string, extraPatches = ''): Obj[] {
  const rel = (p: string): string => path.relative(dir, path.join(REPO, 'deploy', p));
  writeFileSync(path.join(dir, 'kustomization.yaml'), `resources: [${rel('base')}]
components: [${components.map((c) => rel(`components/${c}`)).join(', ')}]
patches:
  - path: node.yaml
${extraPatches}`);
  writeFileSync(path.join(dir, 'node.yaml'), nodePatch);
  const out = execFileSync('kubectl', ['kustomize', dir], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  return parseAllDocuments(out).map((d) => d.toJS() as Obj).filter(Boolean);
}

/**
 * The head of a node patch (node.yaml) of the probe-agent DaemonSet, up to the agent container's
 * env list: POD_IP, then the metrics address on it, then the loopback health address. A
 * strategic-merge patch puts the entries it names first: POD_IP must come before the value that
 * expands $(POD_IP), or kubelet leaves it unexpanded (see docs/deploy.md). Callers append further
 * env entries at the same indentation.
 */
export function agentPatchHead(ports: AgentPorts): string {
  return `apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: probe-agent
spec:
  template:
    spec:
      containers:
        - name: agent
          env:
            - name: POD_IP
              valueFrom:
                fieldRef:
                  fieldPath: status.podIP
            - name: PROBE_AGENT_METRICS_ADDRESS
              value: "$(POD_IP):${ports.metrics}"
            - name: PROBE_AGENT_HEALTH_ADDRESS
              value: "127.0.0.1:${ports.health}"
`;
}

/** The agent: tini's child in the container's main process. */
export function agentPid(tiniPid: number): number {
  const children = readFileSync(`/proc/${tiniPid}/task/${tiniPid}/children`, 'utf8').trim().split(/\s+/).map(Number);
  return children.find((p) => readFileSync(`/proc/${p}/cmdline`, 'utf8').includes('probe-agent')) ?? 0;
}

/** The container's memory cgroup (v1) directory, from the OCI spec the runtime handed runc. */
export function memoryCgroup(st: ContainerState): string {
  return path.join('/sys/fs/cgroup/memory', String((st.spec.linux as Obj).cgroupsPath));
}
