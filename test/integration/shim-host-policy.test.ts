/**
 * A hand-written `/.probe-agent/v1` command cannot reach past its pod: with LegacyHostFieldProbes on,
 * a kubelet shim call (a Probe or RunLifecycleHandler call naming a container ID) whose handler's host
 * names another address is refused with INVALID_ARGUMENT (the shim passes it to kubelet as a gRPC
 * error, which kubelet's prober discards) and nothing is sent from the node; the same handler asked
 * for by pod UID (the operator's `probe --pod`) still follows the gate, and a shim call to the pod's
 * own IP or loopback runs in the pod's netns. Real lab netns, a real HTTP server on the node's side
 * of the lab bridge, the real PodProber and ContainerLocator; only the pod list is hand-made.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft']);

import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { statSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { grpcStatusFor } from '../../agent/api/probe-call.ts';
import { parseFeatureGates } from '../../agent/featuregates.ts';
import { ResidentHelper } from '../../agent/netns/helper.ts';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { NetnsResolverChain, type NetnsResolver } from '../../agent/netns/resolver.ts';
import { PodProber } from '../../agent/prober/pod-prober.ts';
import { ContainerLocator } from '../../agent/prober/container-lookup.ts';
import type { PodInfo } from '../../agent/pods/types.ts';
import { FairLimiter } from '../../agent/scheduler/limiter.ts';
import type { HttpGetHandler } from '../../agent/probe/types.ts';
import { createLab, type Lab, type LabPod, type RunningServer } from '../lab/lab.ts';

const CONTAINER_ID = 'a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90';
let lab: Lab;
let pod: LabPod;
let srv: RunningServer;
let helper: ResidentHelper;
let nodeServer: http.Server;
let nodePort = 0;
let nodeHits = 0;
let prober: PodProber;
let info: PodInfo;

beforeAll(async () => {
  lab = await createLab({ pods: 1, policy: 'drop', tag: 'shim-host-policy.test' });
  pod = lab.pods[0]!;
  helper = await ResidentHelper.start();
  srv = await lab.startServer(pod, { http: 0 });
  // What a hand-written command would aim at: something only the node can reach.
  nodeServer = http.createServer((_req, res) => {
    nodeHits++;
    res.end('node');
  });
  await new Promise<void>((r) => nodeServer.listen(0, lab.gatewayV4, r));
  nodePort = (nodeServer.address() as AddressInfo).port;
  info = {
    uid: '6a1f0c3e-9d2b-4c61-8f0e-1b2c3d4e5f60', namespace: 'tenant', name: 'sneaky', hostNetwork: false, podIPs: pod.ips,
    phase: 'Running', restartPolicy: 'Always', isStatic: false, podReady: true,
    containers: [{
      name: 'app', kind: 'regular', ports: [], probes: {},
      state: { containerID: `containerd://${CONTAINER_ID}`, running: true, startedAt: 0, terminated: false, ready: true, restartCount: 0 },
    }],
  };
  const pods = { get: (uid: string) => (uid === info.uid ? info : undefined), pods: () => [info] };
  const fixed: NetnsResolver = { name: 'cri', resolve: async () => ({ path: pod.netns, resolver: 'cri', inode: statSync(pod.netns).ino }) };
  prober = new PodProber({
    pods,
    resolver: new NetnsResolverChain([fixed]),
    limiter: new FairLimiter({ maxInFlight: 4, maxQueued: 16 }),
    sockets: helper,
    nodeSockets: new NodeSocketFactory(),
    gates: parseFeatureGates('LegacyHostFieldProbes=true'),
    kubeVersion: '1.34',
    classify: () => undefined,
    containers: new ContainerLocator({ pods }),
  });
});

afterAll(async () => {
  nodeServer?.closeAllConnections();
  nodeServer?.close();
  await helper?.close();
  await lab?.destroy();
});

const get = (host: string, port: number): HttpGetHandler => ({ kind: 'http', host, port, path: '/healthz', scheme: 'HTTP', headers: [] });

describe('LegacyHostFieldProbes never applies to kubelet shim calls', () => {
  it('refuses a shim Probe call whose host names the node side, with INVALID_ARGUMENT, sending nothing', async () => {
    const err = await prober.probe({ containerID: CONTAINER_ID, probeType: 'Liveness', handler: get(lab.gatewayV4, nodePort), timeoutSeconds: 2 }).then(
      (o) => new Error(`ran: ${JSON.stringify(o)}`), (e: unknown) => e as Error);
    expect(err.message).toMatch(new RegExp(`^the probe's host "${lab.gatewayV4.replace(/\./g, '\\.')}" is neither the pod's own IP nor loopback: a probe-agent exec command is only run inside the pod's netns \\(the LegacyHostFieldProbes gate never applies to kubelet shim calls\\)`));
    expect(grpcStatusFor(err).code).toBe(3); // INVALID_ARGUMENT: the shim answers kubelet with a gRPC error, kubelet discards the result
    expect(nodeHits).toBe(0);
  });

  it('refuses a shim RunLifecycleHandler call the same way, names included', async () => {
    for (const host of [lab.gatewayV4, 'metadata.google.internal']) {
      await expect(prober.runHook({ containerID: CONTAINER_ID, hook: 'postStart', handler: get(host, nodePort), timeoutSeconds: 2 }))
        .rejects.toThrow(/^the hook's host .* is neither the pod's own IP nor loopback/);
    }
    expect(nodeHits).toBe(0);
  });

  it('runs a shim call aimed at the pod itself (its IP, loopback) inside its netns', async () => {
    const own = await prober.probe({ containerID: CONTAINER_ID, probeType: 'Readiness', handler: get(pod.ipv4, srv.ports.http as number), timeoutSeconds: 2 });
    expect(own).toMatchObject({ result: 'success' });
    const hook = await prober.runHook({ containerID: CONTAINER_ID, hook: 'postStart', handler: get('', srv.ports.http as number), timeoutSeconds: 2 });
    expect(hook).toMatchObject({ result: 'success' });
  });

  it('still lets the gate run the same handler from the node when the call names the pod (not a shim call)', async () => {
    const out = await prober.probe({ podUID: info.uid, handler: get(lab.gatewayV4, nodePort), timeoutSeconds: 2 });
    expect(out).toMatchObject({ result: 'success', message: 'node' });
    expect(nodeHits).toBe(1);
  });
});
