/**
 * agent/api/lifecycle-call.ts: RunLifecycleHandler's gate, deadline and cancellation, over the
 * agent's real PodProber (pod list, container lookup, limiter, probers) against an HTTP server on
 * 127.0.0.1 in this process's own netns (no root). The call is an EventEmitter with a deadline, the
 * part of grpc-js's call object the module uses; the served RPC is covered by
 * test/integration/lifecycle-hooks.test.ts.
 */
import { EventEmitter } from 'node:events';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { statSync } from 'node:fs';
import * as grpc from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { handleLifecycleCall, hookOutcomeToWire, runLifecycleCall } from '../../agent/api/lifecycle-call.ts';
import { RpcError, type CallLike, type ProbeCallGate } from '../../agent/api/probe-call.ts';
import type { WireLifecycleRequest, WireLifecycleResponse } from '../../agent/api/proto.ts';
import { parseFeatureGates } from '../../agent/featuregates.ts';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { NetnsResolverChain, type NetnsResolver } from '../../agent/netns/resolver.ts';
import { PodProber } from '../../agent/prober/pod-prober.ts';
import { ContainerLocator } from '../../agent/prober/container-lookup.ts';
import type { PodInfo } from '../../agent/pods/types.ts';
import { FairLimiter } from '../../agent/scheduler/limiter.ts';
import type { OnDemandHookRequest } from '../../agent/scheduler/types.ts';

const UID = '0d7c1e2f-3a4b-4c5d-8e9f-00000000000a';

let web: Server;
let port: number;
let prober: PodProber;
const held: (() => void)[] = [];

beforeAll(async () => {
  web = createServer((req, res) => {
    if (req.url === '/hang') {
      held.push(() => res.end());
      return;
    }
    res.statusCode = req.url === '/fail' ? 500 : 200;
    res.end('x');
  });
  await new Promise<void>((r) => web.listen(0, '127.0.0.1', r));
  port = (web.address() as AddressInfo).port;
  const info: PodInfo = {
    uid: UID, namespace: 'tenant', name: 'web', hostNetwork: false, podIPs: ['127.0.0.1'],
    phase: 'Running', restartPolicy: 'Always', isStatic: false, podReady: true,
    containers: [{ name: 'app', kind: 'regular', ports: [], probes: {}, state: { containerID: `containerd://${'b2'.repeat(32)}`, running: true, startedAt: 0, terminated: false, ready: true, restartCount: 0 } }],
  };
  const pods = { get: (uid: string) => (uid === info.uid ? info : undefined), pods: () => [info] };
  const here: NetnsResolver = { name: 'cri', resolve: async () => ({ path: '/proc/self/ns/net', resolver: 'cri', inode: statSync('/proc/self/ns/net').ino }) };
  prober = new PodProber({
    pods, resolver: new NetnsResolverChain([here]), limiter: new FairLimiter({ maxInFlight: 4, maxQueued: 16 }),
    sockets: new NodeSocketFactory(), nodeSockets: new NodeSocketFactory(), gates: parseFeatureGates(''), kubeVersion: '1.34',
    classify: () => undefined, containers: new ContainerLocator({ pods }),
  });
});
afterAll(() => {
  for (const h of held.splice(0)) h();
  web?.close();
});

function callWith(deadline: Date | number): CallLike & EventEmitter {
  const c = new EventEmitter() as CallLike & EventEmitter;
  (c as unknown as { getDeadline: () => Date | number }).getDeadline = () => deadline;
  return c;
}
const hook = (path: string, timeoutSeconds = 0): OnDemandHookRequest => ({
  podUID: UID, hook: 'preStop', timeoutSeconds, handler: { kind: 'http', scheme: 'HTTP', port, path, headers: [] },
});
async function rpcError(p: Promise<unknown>): Promise<RpcError> {
  try {
    await p;
  } catch (err) {
    if (err instanceof RpcError) return err;
    throw err;
  }
  throw new Error('no RpcError');
}

describe('runLifecycleCall', () => {
  it('runs the hook: any HTTP status is a success, as kubelet counts a hook; the gate is released', async () => {
    const gate: ProbeCallGate = { inFlight: 0, max: 2 };
    const ok = await runLifecycleCall(hook('/fail'), callWith(Infinity), prober, gate);
    expect(ok.result).toBe('success');
    expect(gate.inFlight).toBe(0);
  });

  it('refuses at the gate with RESOURCE_EXHAUSTED, and a deadline already passed with DEADLINE_EXCEEDED', async () => {
    const full = await rpcError(runLifecycleCall(hook('/'), callWith(Infinity), prober, { inFlight: 3, max: 3 }));
    expect([full.code, full.message]).toEqual([grpc.status.RESOURCE_EXHAUSTED, 'too many RunLifecycleHandler calls in flight (limit 3)']);
    const late = await rpcError(runLifecycleCall(hook('/'), callWith(new Date(Date.now() - 1)), prober, { inFlight: 0, max: 3 }));
    expect([late.code, late.message]).toEqual([grpc.status.DEADLINE_EXCEEDED, 'call deadline already passed']);
  });

  it('the call deadline caps a hook with no timeout of its own: DEADLINE_EXCEEDED naming it, gate released', async () => {
    const gate: ProbeCallGate = { inFlight: 0, max: 2 };
    const req = hook('/hang');
    const err = await rpcError(runLifecycleCall(req, callWith(Date.now() + 1500), prober, gate));
    expect(err.code).toBe(grpc.status.DEADLINE_EXCEEDED);
    expect(err.message).toMatch(/^hook did not complete within the call deadline \(\d+ ms\)$/);
    expect(req.timeoutSeconds).toBeGreaterThan(0);
    expect(req.timeoutSeconds).toBeLessThanOrEqual(1.5);
    expect(req.deadlineAt).toBeDefined();
    expect(gate.inFlight).toBe(0);
  }, 60_000);

  it('a hook whose own timeout is shorter than the call keeps it, and its timeout is a failure, not a call error', async () => {
    const req = hook('/hang', 1);
    const outcome = await runLifecycleCall(req, callWith(Date.now() + 60_000), prober, { inFlight: 0, max: 2 });
    expect(req.timeoutSeconds).toBe(1);
    expect(outcome.result).not.toBe('success');
    expect(outcome.reason).toBe('timeout');
  }, 60_000);

  it('a cancelled call aborts the hook and ends DEADLINE_EXCEEDED; the listener is removed', async () => {
    const c = callWith(Infinity);
    const gate: ProbeCallGate = { inFlight: 0, max: 2 };
    const p = runLifecycleCall(hook('/hang'), c, prober, gate);
    while (held.length === 0) await new Promise((r) => setTimeout(r, 10));
    c.emit('cancelled');
    const err = await rpcError(p);
    expect(err.code).toBe(grpc.status.DEADLINE_EXCEEDED);
    expect(c.listenerCount('cancelled')).toBe(0);
    expect(gate.inFlight).toBe(0);
  }, 60_000);
});

describe('handleLifecycleCall', () => {
  const call = (request: WireLifecycleRequest) => Object.assign(callWith(Infinity), { request }) as unknown as grpc.ServerUnaryCall<WireLifecycleRequest, WireLifecycleResponse>;

  it('answers on the wire, and refuses a prober without hooks with UNIMPLEMENTED', async () => {
    const wire = await handleLifecycleCall(call({ pod_uid: UID, hook: 'LIFECYCLE_HOOK_POST_START', handler: { http_get: { port: { int_val: port, value: 'int_val' }, path: '/' } } } as WireLifecycleRequest), prober, { inFlight: 0, max: 2 });
    expect(wire.result).toBe('PROBE_RESULT_SUCCESS');
    const noHooks = { probe: prober.probe.bind(prober) };
    const err = await rpcError(handleLifecycleCall(call({} as WireLifecycleRequest), noHooks, { inFlight: 0, max: 2 }));
    expect([err.code, err.message]).toEqual([grpc.status.UNIMPLEMENTED, 'this agent does not run lifecycle hooks']);
  });

  it('hookOutcomeToWire maps each result and bounds the message', () => {
    const phases = {} as never;
    expect(hookOutcomeToWire({ result: 'failure', message: 'm', durationSeconds: 0.5, phases })).toEqual({ result: 'PROBE_RESULT_FAILURE', message: 'm', duration_seconds: 0.5 });
    expect(hookOutcomeToWire({ result: 'error', message: 'x'.repeat(100_000), durationSeconds: 0, phases }).message.length).toBeLessThan(100_000);
  });
});
