/**
 * Probe by CRI container ID (the kubelet shim's way of naming a pod) through the running daemon,
 * against a REAL containerd with real containers: a container kubelet's pod list shows, one the
 * list does not show yet (kubelet probes right after start; the poll lags), one whose whole pod the
 * poll has never seen, and IDs nobody knows. Then the locator in-process, to see that repeated
 * probes of one container cost one runtime round trip and that a sandbox gone is not answered from memory.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'nsenter', 'containerd', 'ctr']);

import { spawn, type ChildProcess } from 'node:child_process';
import * as grpc from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApiError } from '../../agent/api/client.ts';
import { CriResolver } from '../../agent/netns/cri-resolver.ts';
import { NetnsPathChecker } from '../../agent/netns/netns-path.ts';
import { ContainerLocator } from '../../agent/prober/container-lookup.ts';
import type { PodInfo } from '../../agent/pods/types.ts';
import type { ProbeHandler } from '../../agent/probe/types.ts';
import { createContainerdLab, type ContainerdLab, type LabContainer, type LabSandbox } from '../lab/containerd.ts';
import { startAgent, type AgentHandle } from '../support/agent-harness.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { makePod } from '../support/pod-factory.ts';

const NS = 'shim-cid';
const PORT = 8080;
const TCP: ProbeHandler = { kind: 'tcp', port: PORT };

let ctrd: ContainerdLab;
let kubelet: FakeKubelet;
let agent: AgentHandle;
const listeners: ChildProcess[] = [];
let listed: LabSandbox;
let unlisted: LabSandbox;
let listedApp: LabContainer;
let lateApp: LabContainer;
let unlistedApp: LabContainer;

/** A TCP listener on PORT inside the sandbox's netns (accepts and closes). */
async function listenIn(sb: LabSandbox): Promise<void> {
  const code = `require('net').createServer((s) => s.end()).listen(${PORT}, '::', () => console.log('ready'))`;
  const child = spawn('nsenter', [`--net=${sb.netnsPath}`, '--', process.execPath, '-e', code], { stdio: ['ignore', 'pipe', 'inherit'] });
  listeners.push(child);
  await new Promise<void>((resolve, reject) => {
    child.stdout!.once('data', () => resolve());
    child.once('exit', (c) => reject(new Error(`listener in ${sb.name} exited (${c})`)));
  });
}

/** The pod as kubelet lists it, with `app` carrying `containerID` (or no status at all). */
function podFor(sb: LabSandbox, containerID?: string): Record<string, unknown> {
  return makePod({
    uid: sb.uid, name: sb.name, namespace: NS, ips: sb.ips, probe: 'none', port: PORT,
    ...(containerID ? { containerID: `containerd://${containerID}` } : { noContainerStatuses: true }),
  });
}

async function probeError(p: Promise<unknown>): Promise<ApiError> {
  const err = await p.then(() => undefined, (e: unknown) => e);
  expect(err).toBeInstanceOf(ApiError);
  return err as ApiError;
}

beforeAll(async () => {
  ctrd = await createContainerdLab();
  [listed, unlisted] = await Promise.all([
    ctrd.runSandbox({ name: 'listed', namespace: NS }),
    ctrd.runSandbox({ name: 'unlisted', namespace: NS }),
  ]);
  [listedApp, lateApp, unlistedApp] = await Promise.all([
    ctrd.runContainer(listed, { name: 'app' }),
    ctrd.runContainer(listed, { name: 'late' }),
    ctrd.runContainer(unlisted, { name: 'app' }),
  ]);
  await Promise.all([listenIn(listed), listenIn(unlisted)]);
  const pod = podFor(listed, listedApp.id);
  // 'late' is in the spec but kubelet's status does not list it yet.
  (pod.spec as { containers: Record<string, unknown>[] }).containers.push({ name: 'late', image: 'x', ports: [{ name: 'late-port', containerPort: PORT }] });
  kubelet = await FakeKubelet.start({ pods: [pod] });
  agent = await startAgent({
    kubeletUrl: kubelet.httpUrl,
    resolvers: 'cri',
    // A slow poll: the runtime path, not a lucky poll, must find the new containers.
    pollInterval: '60s',
    args: [`--cri-endpoint=${ctrd.endpoint}`, `--netns-dir=${ctrd.netnsDir}`],
  });
  await agent.waitForStatuses(() => true);
}, 60_000);

afterAll(async () => {
  await agent?.stop('SIGKILL').catch(() => {});
  await kubelet?.stop();
  for (const l of listeners) l.kill('SIGKILL');
  await ctrd?.destroy();
});

describe('Probe by container_id', () => {
  it('finds a container kubelet lists, with or without the containerd:// prefix', async () => {
    for (const containerId of [listedApp.id, `containerd://${listedApp.id}`]) {
      const out = await agent.client.probe({ pod: { containerId }, handler: TCP });
      expect(out.result, out.message).toBe('success');
      expect(out.address).toContain(listed.ipv4);
    }
  });

  it('finds a container the pod list does not show yet through the runtime, and sets container_name from its label', async () => {
    const out = await agent.client.probe({ pod: { containerId: lateApp.id }, handler: { kind: 'tcp', port: 'late-port' } });
    expect(out.result, out.message).toBe('success');
    // A container_name that contradicts the ID is refused.
    const err = await probeError(agent.client.probe({ pod: { containerId: lateApp.id }, containerName: 'app', handler: TCP }));
    expect(err.grpcCode).toBe(grpc.status.INVALID_ARGUMENT);
    expect(err.message).toMatch(/container_id names container "late"/);
  });

  it('probes a container whose pod the poll has never seen, from the runtime\'s view of the pod', async () => {
    const out = await agent.client.probe({ pod: { containerId: unlistedApp.id }, handler: TCP });
    expect(out.result, out.message).toBe('success');
    expect(out.address).toContain(unlisted.ipv4);
  });

  it('answers NOT_FOUND for an unknown container and INVALID_ARGUMENT for a malformed ID or two ways of naming', async () => {
    const unknown = await probeError(agent.client.probe({ pod: { containerId: 'f'.repeat(64) }, handler: TCP }));
    expect(unknown.grpcCode).toBe(grpc.status.NOT_FOUND);
    expect(unknown.message).toMatch(/container fffffffffffff is not known on this node \(the runtime has no such container\)/);
    const bad = await probeError(agent.client.probe({ pod: { containerId: 'containerd://../etc' }, handler: TCP }));
    expect(bad.grpcCode).toBe(grpc.status.INVALID_ARGUMENT);
    // The agent is still fine afterwards.
    expect((await agent.client.probe({ pod: { containerId: listedApp.id }, handler: TCP })).result).toBe('success');
  });
});

describe('container_id while the runtime is down', () => {
  it('still finds containers it knows, and answers UNAVAILABLE (not NOT_FOUND) for one it cannot ask about', async () => {
    await ctrd.stopContainerd();
    try {
      // Listed in the pod list, and learnt from the runtime earlier: no runtime call needed.
      expect((await agent.client.probe({ pod: { containerId: listedApp.id }, handler: TCP })).result).toBe('success');
      expect((await agent.client.probe({ pod: { containerId: lateApp.id }, handler: TCP })).result).toBe('success');
      const err = await probeError(agent.client.probe({ pod: { containerId: '1'.repeat(64) }, handler: TCP }));
      expect(err.grpcCode).toBe(grpc.status.UNAVAILABLE);
      expect(err.message).toMatch(/not in kubelet's pod list yet and the runtime cannot be asked/);
    } finally {
      await ctrd.startContainerd();
    }
    const back = await probeError(agent.client.probe({ pod: { containerId: '2'.repeat(64) }, handler: TCP }));
    expect(back.grpcCode).toBe(grpc.status.NOT_FOUND);
  }, 30_000);
});

describe('RunLifecycleHandler by container_id', () => {
  it('runs a hook for a container the poll has not shown, and answers NOT_FOUND for an unknown one', async () => {
    // The listener accepts and closes: an HTTP hook reaches it (so the pod was found) and fails on the EOF.
    const out = await agent.client.runLifecycleHandler({ pod: { containerId: `containerd://${unlistedApp.id}` }, hook: 'postStart', handler: { kind: 'http', port: PORT, path: '/', scheme: 'HTTP', headers: [] }, timeoutSeconds: 5 });
    expect(out.result, out.message).toBe('failure');
    expect(out.message).toMatch(new RegExp(`HTTP lifecycle hook \\(/\\) failed - error: Get "http://${unlisted.ipv4.replace(/\./g, '\\.')}:${PORT}/"`));
    const err = await probeError(agent.client.runLifecycleHandler({ pod: { containerId: 'e'.repeat(64) }, hook: 'preStop', handler: { kind: 'tcp', port: PORT } }));
    expect(err.grpcCode).toBe(grpc.status.NOT_FOUND);
  });
});

describe('ContainerLocator against the runtime', () => {
  const cri = (): CriResolver => new CriResolver({ client: ctrd.client, pathChecker: new NetnsPathChecker({ extraDirs: [ctrd.netnsDir] }) });
  const locatorOf = (pods: Map<string, PodInfo>, extra: Partial<ConstructorParameters<typeof ContainerLocator>[0]> = {}): ContainerLocator => {
    const r = cri();
    return new ContainerLocator({
      pods: { get: (u) => pods.get(u), pods: () => [...pods.values()] },
      runtime: ctrd.client,
      sandboxNetns: (res, id, who, uid) => r.netnsOfStatus(res, id, who, uid),
      ...extra,
    });
  };

  it('asks the runtime once per container and once per sandbox, then answers from memory; IPs and netns come from the runtime, not the pod list', async () => {
    // The pod list has the pod, but (as kubelet's /pods right after a start) without IPs.
    const listedPod = { uid: listed.uid, namespace: NS, name: listed.name, podIPs: [], containers: [
      { name: 'app', kind: 'regular', ports: [], probes: {}, state: { containerID: `containerd://${listedApp.id}`, running: true, terminated: false, ready: true, restartCount: 0 } },
    ] } as unknown as PodInfo;
    const locator = locatorOf(new Map([[listed.uid, listedPod]]));
    for (let i = 0; i < 5; i++) {
      const app = await locator.locate(listedApp.id);
      expect(app).toMatchObject({ from: 'runtime', containerName: 'app', pod: { uid: listed.uid, podIPs: listed.ips }, sandbox: { id: listed.id, netns: listed.netnsPath } });
      // What only the pod list knows (the container's state) is kept.
      expect(app.container.state?.containerID).toBe(`containerd://${listedApp.id}`);
      const late = await locator.locate(lateApp.id);
      expect(late).toMatchObject({ containerName: 'late', pod: { uid: listed.uid } });
      const other = await locator.locate(`containerd://${unlistedApp.id}`);
      expect(other.pod).toMatchObject({ uid: unlisted.uid, name: 'unlisted', namespace: NS, podIPs: unlisted.ips, hostNetwork: false });
    }
    expect(locator.runtimeLookups).toBe(3);
    expect(locator.sandboxLookups).toBe(2);
    await expect(locator.locate('0'.repeat(64))).rejects.toThrow(/not known on this node/);
    await expect(locator.locate('0'.repeat(64))).rejects.toThrow(/not known on this node/);
    expect(locator.runtimeLookups).toBe(4);
  });

  it('holds at most maxEntries containers and sandboxes', async () => {
    const locator = locatorOf(new Map(), { maxEntries: 1 });
    for (const id of [listedApp.id, lateApp.id, unlistedApp.id, listedApp.id]) await locator.locate(id);
    expect(locator.size).toBe(1);
    expect(locator.sandboxCount).toBe(1);
  });

  it('does not answer from memory for a sandbox that went away, nor for a pod that left the pod list', async () => {
    const sb = await ctrd.runSandbox({ name: 'going', namespace: NS });
    const c = await ctrd.runContainer(sb, { name: 'app' });
    const locator = locatorOf(new Map());
    expect((await locator.locate(c.id)).sandbox?.netns).toBe(sb.netnsPath);
    await ctrd.stopSandbox(sb.id);
    // The cached netns is unmounted: the runtime is asked, and says the sandbox is not ready.
    await expect(locator.locate(c.id)).rejects.toThrow(/SANDBOX_NOTREADY/);
    expect(locator.runtimeLookups).toBe(2);
    // forgetPod drops what was cached about a pod.
    await locator.locate(unlistedApp.id);
    locator.forgetPod(unlisted.uid);
    await locator.locate(unlistedApp.id);
    expect(locator.runtimeLookups).toBe(4);
    await ctrd.removeSandbox(sb.id);
  }, 30_000);

  it('drops what it cached about pods a later pod list no longer has, and keeps what it read after that list was asked for', async () => {
    const gone: string[] = [];
    const locator = locatorOf(new Map(), { onContainerGone: (id) => gone.push(id) });
    const before = Date.now();
    for (const id of [listedApp.id, lateApp.id, unlistedApp.id]) await locator.locate(id);
    expect(locator.size).toBe(3);
    expect(locator.sandboxCount).toBe(2);
    // A list asked for before the reads proves nothing about the pods read after it.
    locator.retainPods(new Set([listed.uid]), before - 1);
    expect([locator.size, locator.sandboxCount, gone]).toEqual([3, 2, []]);
    // One asked for after them, without `unlisted`: its sandbox and container go, and others are told.
    locator.retainPods(new Set([listed.uid]), Date.now() + 1);
    expect([locator.size, locator.sandboxCount, gone]).toEqual([2, 1, [unlistedApp.id]]);
    const lookups = locator.runtimeLookups;
    await locator.locate(listedApp.id);
    expect(locator.runtimeLookups).toBe(lookups);
    await locator.locate(unlistedApp.id);
    expect(locator.runtimeLookups).toBe(lookups + 1);
  });
});

describe('container lookup metrics', () => {
  it('counts lookups by how they ended: cached, pod list, runtime, not found, runtime unavailable', async () => {
    const body = (await agent.http('/metrics')).body;
    const value = (source: string): number => {
      const m = new RegExp(`^probe_agent_container_lookups_total\\{source="${source}"\\} (\\S+)$`, 'm').exec(body);
      return m ? Number(m[1]) : 0;
    };
    // Every container is asked of the runtime (the pod list is only the fallback while the runtime is down).
    expect(value('runtime')).toBeGreaterThanOrEqual(3);
    expect(value('cache')).toBeGreaterThanOrEqual(3);
    expect(value('not-found')).toBeGreaterThanOrEqual(2);
    expect(value('unavailable')).toBe(1);
  });
});
