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
  const s = net.createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const port = (s.address() as net.AddressInfo).port;
  await new Promise((r) => s.close(r));
  return port;
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
 * env list: POD_IP, then the metrics address on it. A strategic-merge patch puts the entries it
 * names first: POD_IP must come before the value that expands $(POD_IP), or kubelet leaves it
 * unexpanded (see docs/deploy.md). Callers append further env entries at the same indentation.
 */
export function agentPatchHead(metricsPort: number): string {
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
              value: "$(POD_IP):${metricsPort}"
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
