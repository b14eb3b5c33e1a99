/**
 * The gRPC probe against a real grpc-go health server (test/grpc-go-peer -health-server, Debian's
 * grpc-go) in a lab pod's netns, as pods run it, through the resident helper with the node cut
 * off: on the exchange route (the client's first octets sent with the helper's connect, before the
 * server's SETTINGS came) and on the plain route (a timeout over 10 s). kubelet's results either
 * way, on both families.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft']);

import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ResidentHelper } from '../../agent/netns/helper.ts';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { runProbe } from '../../agent/probe/run.ts';
import type { GrpcHandler, ProbeContext, SocketFactory } from '../../agent/probe/types.ts';
import { createLab, type Lab, type LabPod } from '../lab/lab.ts';
import { GRPC_GO_PEER, requireGrpcGoPeer } from '../support/grpc-go-cri.ts';

let lab: Lab;
let pod: LabPod;
let helper: ResidentHelper;
let server: ChildProcessWithoutNullStreams | undefined;
let port = 0;
const nodeSockets = new NodeSocketFactory();

beforeAll(async () => {
  requireGrpcGoPeer();
  lab = await createLab({ pods: 1, policy: 'drop', tag: 'grpc-probe-grpc-go.test' });
  pod = lab.pods[0] as LabPod;
  helper = await ResidentHelper.start();
  server = spawn('ip', ['netns', 'exec', pod.name, GRPC_GO_PEER, '-health-server', ':0']);
  let stderr = '';
  server.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const line = await new Promise<string>((resolve, reject) => {
    createInterface({ input: server!.stdout }).once('line', resolve);
    server!.once('exit', (code) => reject(new Error(`grpc-go health server exited with ${code}: ${stderr}`)));
  });
  port = (JSON.parse(line) as { listening: number }).listening;
  expect(port).toBeGreaterThan(0);
});

afterAll(async () => {
  server?.stdin.end();
  server?.kill('SIGKILL');
  await helper?.close();
  await lab?.destroy();
});

/** The helper, counting what its exchanges did. */
function counting(): SocketFactory & { exchanges: { send: number; sent: number; read: number }[]; plain: number } {
  const f = {
    mode: 'resident', exchanges: [] as { send: number; sent: number; read: number }[], plain: 0,
    createSocket: () => Promise.reject(new Error('the socket route was taken')),
    connectSocket: (netns: string, target: Parameters<ResidentHelper['connectSocket']>[1], signal?: AbortSignal) => {
      f.plain++;
      return helper.connectSocket(netns, target, signal);
    },
    connectExchange: async (netns: string, target: Parameters<ResidentHelper['connectExchange']>[1], send: Buffer, signal?: AbortSignal) => {
      const out = await helper.connectExchange(netns, target, send, signal);
      if (out?.outcome === 'connected' && out.exchange) f.exchanges.push({ send: send.length, sent: out.exchange.sent, read: out.exchange.data.length });
      return out;
    },
  };
  return f;
}

function ctx(sockets: SocketFactory, over: Partial<ProbeContext> = {}): ProbeContext {
  return {
    netns: pod.netns, podIPs: pod.ips, timeoutSeconds: 1, sockets, nodeSockets,
    kubeVersion: '1.34', hostFieldPolicy: 'refuse', happyEyeballs: false, ...over,
  };
}

const check = (service?: string): GrpcHandler => ({ kind: 'grpc', port, ...(service === undefined ? {} : { service }) });

describe('gRPC probe against grpc-go\'s health server in the pod\'s netns', () => {
  it.each([
    ['the exchange route (timeout 1 s)', 1],
    ['the plain route (timeout 11 s)', 11],
  ])('%s: SERVING, NOT_SERVING and an unknown service in kubelet\'s words, on both families', async (_label, timeoutSeconds) => {
    const sockets = counting();
    const c = ctx(sockets, { timeoutSeconds });
    expect(await runProbe(check(), c)).toMatchObject({ result: 'success', message: 'service healthy', address: `${pod.ipv4}:${port}` });
    expect(await runProbe(check('db'), c)).toMatchObject({ result: 'failure', reason: 'grpc-not-serving', message: 'service unhealthy (responded with "NOT_SERVING")' });
    const unknown = await runProbe(check('nope'), c);
    expect(unknown).toMatchObject({ result: 'failure', message: 'error: health rpc probe failed: rpc error: code = NotFound desc = unknown service' });
    const v6 = await runProbe(check(), ctx(sockets, { timeoutSeconds, podIPs: [pod.ipv6, pod.ipv4] }));
    expect(v6).toMatchObject({ result: 'success', message: 'service healthy', address: `[${pod.ipv6}]:${port}` });
    if (timeoutSeconds > 10) {
      expect(sockets.plain).toBe(4);
      expect(sockets.exchanges).toHaveLength(0);
    } else {
      // All four sent whole with the connect; grpc-go's server had said something by the handover (its SETTINGS at least).
      expect(sockets.plain).toBe(0);
      expect(sockets.exchanges).toHaveLength(4);
      for (const x of sockets.exchanges) {
        expect(x.sent).toBe(x.send);
        expect(x.read).toBeGreaterThan(0);
      }
    }
  });
});
