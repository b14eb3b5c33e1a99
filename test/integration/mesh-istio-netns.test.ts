/**
 * What docs/rewrite.md ("Service meshes (Istio)") says about the path of the agent's probes in an
 * Istio pod, checked in a real kernel: lab pods get the traffic-capture rules Istio installs in a
 * pod's netns (written here by hand, reduced to the rules that decide these paths: the sidecar's
 * istio-iptables `nat` chains, and ambient's in-pod `nat` chains from istio-cni), stand-ins for
 * Envoy / ztunnel listen on the capture ports 15001 and 15006 and answer their own names, and the
 * agent's HTTP prober runs through the resident netns helper as it does in production.
 *
 * - sidecar: traffic from another pod is captured (it lands on 15006), and so is a uid-1337
 *   process's connection to its own pod IP; the agent's probe of the pod's own IP (a socket owned
 *   by uid 0, leaving on lo) reaches the app itself;
 * - ambient: the same with the in-pod rules of current istio-cni; with the older rule set that has
 *   no `-o lo -j ACCEPT`, the probe goes to ztunnel's outbound port instead (the caveat the doc
 *   gives).
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'iptables-restore', 'iptables', 'setpriv', 'bash']);

import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ResidentHelper } from '../../agent/netns/helper.ts';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { runProbe } from '../../agent/probe/run.ts';
import type { ProbeContext, ProbeOutcome } from '../../agent/probe/types.ts';
import { createLab, type Lab, type LabPod, type RunningServer } from '../lab/lab.ts';

const ENVOY_OUTBOUND = 15001;
const ENVOY_INBOUND = 15006;
const PROXY_UID = 1337;

let lab: Lab;
let helper: ResidentHelper;
const nodeSockets = new NodeSocketFactory();
/** A: sidecar rules. B: a plain client pod. C: ambient rules. */
let podA: LabPod;
let podB: LabPod;
let podC: LabPod;
let appA: RunningServer;
let appC: RunningServer;
const standIns: ChildProcessWithoutNullStreams[] = [];

/** The sidecar's capture rules (istio-iptables, REDIRECT mode, inbound ports `*`, status ports excluded). */
const SIDECAR_RULES = `*nat
:ISTIO_INBOUND - [0:0]
:ISTIO_IN_REDIRECT - [0:0]
:ISTIO_OUTPUT - [0:0]
:ISTIO_REDIRECT - [0:0]
-A PREROUTING -p tcp -j ISTIO_INBOUND
-A OUTPUT -p tcp -j ISTIO_OUTPUT
-A ISTIO_INBOUND -p tcp --dport 15008 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15090 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15021 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15020 -j RETURN
-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT
-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports ${ENVOY_INBOUND}
-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports ${ENVOY_OUTBOUND}
-A ISTIO_OUTPUT -s 127.0.0.6/32 -o lo -j RETURN
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -p tcp ! --dport 15008 -m owner --uid-owner ${PROXY_UID} -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --uid-owner ${PROXY_UID} -j RETURN
-A ISTIO_OUTPUT -m owner --uid-owner ${PROXY_UID} -j RETURN
-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN
-A ISTIO_OUTPUT -j ISTIO_REDIRECT
COMMIT
`;

/** The rule of current istio-cni that keeps a pod's connections to itself away from ztunnel. */
const AMBIENT_LO_ACCEPT = '! -d 127.0.0.1/32 -o lo -j ACCEPT';
/** Ambient's in-pod capture rules (istio-cni, `nat` part). */
const AMBIENT_RULES = `*nat
:ISTIO_PRERT - [0:0]
:ISTIO_OUTPUT - [0:0]
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_PRERT -s 169.254.7.127/32 -p tcp -m tcp -j ACCEPT
-A ISTIO_PRERT ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports ${ENVOY_INBOUND}
-A ISTIO_OUTPUT -d 169.254.7.127/32 -p tcp -m tcp -j ACCEPT
-A ISTIO_OUTPUT -p tcp -m mark --mark 0x111/0xfff -j ACCEPT
-A ISTIO_OUTPUT ${AMBIENT_LO_ACCEPT}
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports ${ENVOY_OUTBOUND}
COMMIT
`;

/** An HTTP server inside `pod` on `port` (all addresses) that answers every request with `name`. */
async function startStandIn(pod: LabPod, port: number, name: string): Promise<void> {
  const script = `const s=require('node:http').createServer((q,r)=>r.end(${JSON.stringify(name)}));
s.listen({port:${port},host:'::'},()=>console.log('ready'));
process.stdin.on('end',()=>process.exit(0));process.stdin.resume();`;
  const child = spawn('ip', ['netns', 'exec', pod.name, process.execPath, '-e', script]);
  standIns.push(child);
  await new Promise<void>((resolve, reject) => {
    createInterface({ input: child.stdout }).once('line', () => resolve());
    child.once('exit', (code) => reject(new Error(`stand-in ${name} exited with ${code}`)));
  });
}

/** The body a plain HTTP/1.0 GET from inside `from`'s netns gets, as uid `uid` (bash's /dev/tcp: no extra binary). */
async function getFrom(from: LabPod, ip: string, port: number, uid = 0): Promise<string> {
  const script = `exec 3<>/dev/tcp/${ip}/${port} && printf 'GET /echo HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n' >&3 && cat <&3`;
  const args = uid === 0 ? ['-c', script] : [];
  const r = uid === 0
    ? await lab.exec(from, 'bash', args)
    : await lab.exec(from, 'setpriv', [`--reuid=${uid}`, `--regid=${uid}`, '--clear-groups', 'bash', '-c', script]);
  expect(r.code, r.stderr).toBe(0);
  return r.stdout.split('\r\n\r\n').slice(1).join('\r\n\r\n');
}

async function iptables(pod: LabPod, rules: string): Promise<void> {
  const r = await lab.exec(pod, 'iptables-restore', ['--noflush'], { input: rules });
  expect(r.code, r.stderr).toBe(0);
}

/** The agent's HTTP probe of `path` on the pod's own address, through the netns helper. */
function agentProbe(pod: LabPod, port: number): Promise<ProbeOutcome> {
  const ctx: ProbeContext = {
    netns: pod.netns, podIPs: [pod.ipv4], timeoutSeconds: 2, sockets: helper, nodeSockets,
    kubeVersion: '1.34', hostFieldPolicy: 'refuse', happyEyeballs: false,
  };
  return runProbe({ kind: 'http', port, path: '/echo', scheme: 'HTTP', headers: [] }, ctx);
}

beforeAll(async () => {
  lab = await createLab({ pods: 3, policy: 'drop', tag: 'mesh-istio-netns.test' });
  [podA, podB, podC] = lab.pods as [LabPod, LabPod, LabPod];
  helper = await ResidentHelper.start();
  [appA, appC] = await Promise.all([lab.startServer(podA, { http: 0 }), lab.startServer(podC, { http: 0 })]);
  for (const pod of [podA, podC]) {
    await startStandIn(pod, ENVOY_OUTBOUND, 'captured-outbound');
    await startStandIn(pod, ENVOY_INBOUND, 'captured-inbound');
  }
  await iptables(podA, SIDECAR_RULES);
  await iptables(podC, AMBIENT_RULES);
});

afterAll(async () => {
  for (const c of standIns) {
    c.stdin.end();
    c.kill('SIGKILL');
  }
  await helper?.close();
  await lab?.destroy();
});

describe('Istio sidecar capture rules in the pod netns', () => {
  it('capture is live: another pod\'s connection and a uid-1337 connection to the pod\'s own IP land on Envoy\'s inbound port', async () => {
    const port = appA.ports.http as number;
    expect(await getFrom(podB, podA.ipv4, port)).toBe('captured-inbound');
    expect(await getFrom(podA, podA.ipv4, port, PROXY_UID)).toBe('captured-inbound');
    // Outbound capture too: the pod's connection to another pod goes to Envoy's outbound port.
    expect(await getFrom(podA, podB.ipv4, port)).toBe('captured-outbound');
  });

  it('the agent\'s probe of the pod\'s own IP (uid 0, over lo) reaches the app, not Envoy', async () => {
    const port = appA.ports.http as number;
    const out = await agentProbe(podA, port);
    expect(out.result).toBe('success');
    expect(JSON.parse(out.message)).toMatchObject({ url: '/echo', localAddress: `::ffff:${podA.ipv4}`, remoteAddress: `::ffff:${podA.ipv4}` });
  });
});

describe('Istio ambient in-pod capture rules', () => {
  it('capture is live: another pod\'s connection lands on ztunnel\'s inbound port', async () => {
    expect(await getFrom(podB, podC.ipv4, appC.ports.http as number)).toBe('captured-inbound');
  });

  it('the agent\'s probe reaches the app; without the in-pod `-o lo -j ACCEPT` rule (older istio-cni) it goes to ztunnel\'s outbound port', async () => {
    const port = appC.ports.http as number;
    const out = await agentProbe(podC, port);
    expect(out.result).toBe('success');
    expect(JSON.parse(out.message)).toMatchObject({ url: '/echo', localAddress: `::ffff:${podC.ipv4}` });
    const del = await lab.exec(podC, 'iptables', ['-t', 'nat', '-D', 'ISTIO_OUTPUT', ...AMBIENT_LO_ACCEPT.split(' ')]);
    expect(del.code, del.stderr).toBe(0);
    const older = await agentProbe(podC, port);
    expect(older).toMatchObject({ result: 'success', message: 'captured-outbound' });
  });
});
