/**
 * A shim call needs nothing from kubelet's /pods: kubelet's ExecSync (grpc-js, through the shim)
 * names a container of a REAL containerd sandbox, and the agent takes the pod's IPs, netns, the
 * container's ports (kubelet's io.kubernetes.container.ports annotation) and the header values of a
 * rewritten handler (the pod's original-handlers annotation, which kubelet copies onto the sandbox)
 * from the runtime. The fake kubelet shows what kubelet's /pods shows right after a pod starts:
 * the pod without IPs or container statuses (its status round trip has not happened), or not at
 * all; its poll is slow (60 s), so a lucky poll cannot be what makes a probe pass.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'nsenter', 'containerd', 'ctr']);

import { spawn, type ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { createInterface } from 'node:readline';
import path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ORIGINAL_HANDLERS_ANNOTATION } from '../../agent/rewrite/pod-rewrite.ts';
import { encodeShimCommand, type ShimKind } from '../../agent/contract/shim-command.ts';
import type { ContainerdLab, LabContainer, LabSandbox } from '../lab/containerd.ts';
import type { FakeKubelet } from '../support/fake-kubelet.ts';
import { KubeletCri, type CriAnswer } from '../support/kubelet-cri.ts';
import { makePod } from '../support/pod-factory.ts';
import { shimLogSink } from '../support/log-check.ts';
import { ShimLab } from '../support/shim-lab.ts';

const NS = 'shim-rt';
const PORT = 8080;
const SECRET = 'Bearer s3cret-token';
/** kubelet's container annotation with the container's ports (pkg/kubelet/kuberuntime/labels.go). */
const PORTS = { 'io.kubernetes.container.ports': JSON.stringify([{ name: 'http', containerPort: PORT, protocol: 'TCP' }]) };

/** The pod /pods lists (without IPs): its UID is fixed before the agent's one and only poll. */
const LISTED_UID = randomUUID();

let lab: ShimLab;
let ctrd: ContainerdLab;
let kubelet: FakeKubelet;
let scratch: string;
let k: KubeletCri;
const servers: ChildProcess[] = [];
/** Authorization values the servers saw, per sandbox name. */
const seenAuth = new Map<string, string[]>();

/**
 * An HTTP server in the sandbox's netns: 200 when Authorization is SECRET or absent and the path is
 * not /auth, 401 on /auth without SECRET; every request's Authorization is reported on stdout.
 */
async function serveIn(sb: LabSandbox): Promise<void> {
  const code = `require('http').createServer((q, s) => {
    const a = q.headers.authorization ?? '';
    console.log('auth=' + JSON.stringify(a));
    s.statusCode = q.url === '/auth' && a !== ${JSON.stringify(SECRET)} ? 401 : 200;
    s.end('ok');
  }).listen(${PORT}, '::', () => console.log('ready'))`;
  const child = spawn('nsenter', [`--net=${sb.netnsPath}`, '--', process.execPath, '-e', code], { stdio: ['ignore', 'pipe', 'inherit'] });
  servers.push(child);
  const seen: string[] = [];
  seenAuth.set(sb.name, seen);
  await new Promise<void>((resolve, reject) => {
    createInterface({ input: child.stdout! }).on('line', (l) => {
      if (l === 'ready') resolve();
      else if (l.startsWith('auth=')) seen.push(JSON.parse(l.slice(5)) as string);
    });
    child.once('exit', (c) => reject(new Error(`server in ${sb.name} exited (${c})`)));
  });
}

function execAnswer(a: CriAnswer<{ stdout: Buffer; exitCode: number }>): { exitCode: number; stdout: string } {
  if (!a.ok) throw new Error(`expected an exit code, got gRPC ${grpc.status[a.code]}: ${a.details}`);
  return { exitCode: a.msg.exitCode, stdout: a.msg.stdout.toString() };
}

function grpcError(a: CriAnswer): { code: grpc.status; details: string } {
  if (a.ok) throw new Error(`expected a gRPC error, got an answer: ${JSON.stringify(a.msg)}`);
  return { code: a.code, details: a.details };
}

/** kubelet's ExecSync of a rewritten handler (timeout 1 for probes, 0 for hooks, as kubelet sends them). */
function run(c: LabContainer, kind: ShimKind, handler: Record<string, unknown>): Promise<CriAnswer<{ stdout: Buffer; stderr: Buffer; exitCode: number }>> {
  return k.execSync(c.id, encodeShimCommand(kind, handler), kind === 'postStart' || kind === 'preStop' ? 0 : 1);
}

/** A sandbox with a server in its netns; the container is started by the test (so it can time from the start). */
async function podWithServer(name: string, annotations?: Record<string, string>, uid?: string): Promise<LabSandbox> {
  const sb = await ctrd.runSandbox({ name, namespace: NS, ...(annotations ? { annotations } : {}), ...(uid ? { uid } : {}) });
  await serveIn(sb);
  return sb;
}

/** The shim's log lines, checked when the file ends; a test lists the warnings it provokes. */
const shimLogs = shimLogSink('shim (shim-runtime-lookup)');

beforeAll(async () => {
  lab = await ShimLab.start('shim-rt-', { busybox: false });
  ({ ctrd, scratch } = lab);
  lab.onStop(() => servers.forEach((s) => s.kill('SIGKILL')));
  // What kubelet's /pods shows before the status round trip: the pod, no podIPs, no containerStatuses.
  kubelet = await lab.startKubelet([makePod({ uid: LISTED_UID, name: 'listed', namespace: NS, ips: [], probe: 'none', port: PORT, noContainerStatuses: true })]);
  await lab.startAgent({ pollInterval: '60s' });
  // The agent's first (and, at 60 s, only) poll of the test.
  for (let i = 0; i < 200 && kubelet.requests.length === 0; i++) await new Promise((r) => setTimeout(r, 50));
  await new Promise((r) => setTimeout(r, 200));
  const shim = await lab.startShim({ agentGraceMs: 1000, hookAgentWaitMs: 1500, log: shimLogs.log });
  k = lab.client(new KubeletCri(shim.config.listenPath));
}, 90_000);

afterAll(() => lab?.stop());

describe('the first probe after a container starts, before /pods has the pod', () => {
  it('passes on a numeric port for a pod /pods lists without IPs, and on a named port for a pod /pods never lists; no /pods request is made', async () => {
    const listed = await podWithServer('listed', undefined, LISTED_UID);
    const unlisted = await podWithServer('unlisted');
    expect(kubelet.requests.length).toBeGreaterThan(0);
    const polls = kubelet.requests.length;
    const latency: Record<string, number> = {};
    for (const [label, sb, port] of [['numeric port, pod listed without IPs', listed, PORT], ['named port, pod never listed', unlisted, 'http']] as const) {
      const c = await ctrd.runContainer(sb, { name: 'app', annotations: PORTS });
      const started = performance.now();
      const first = execAnswer(await run(c, 'readiness', { httpGet: { path: '/', port } }));
      latency[label] = performance.now() - started;
      expect(first.exitCode, `${label}: ${first.stdout}`).toBe(0);
    }
    // Nothing was asked of /pods for these probes.
    expect(kubelet.requests.length).toBe(polls);
    console.log(`container start -> first Ready-worthy success through the shim: ${Object.entries(latency).map(([l, ms]) => `${l} ${ms.toFixed(1)} ms`).join('; ')}`);
  }, 60_000);
});

describe('header values from the pod\'s original-handlers annotation on the sandbox', () => {
  let app: LabContainer;
  let bare: LabContainer;
  const record = {
    v: 1,
    handlers: {
      'app/readinessProbe': { httpGet: { path: '/auth', port: 'http', httpHeaders: [{ name: 'X-Trace', value: 'plain' }, { name: 'Authorization', value: SECRET }] } },
      'app/lifecycle/postStart': { httpGet: { path: '/started', port: PORT, httpHeaders: [{ name: 'Authorization', value: SECRET }] } },
      'app/livenessProbe': { httpGet: { path: '/auth', port: PORT, httpHeaders: [{ name: 'X-Other', value: 'x' }] } },
    },
    added: ['/spec/affinity'],
  };
  const rewritten = (p: string, port: number | string, headers: Record<string, unknown>[]): Record<string, unknown> => ({ httpGet: { path: p, port, httpHeaders: headers } });

  beforeAll(async () => {
    const sb = await podWithServer('annotated', { [ORIGINAL_HANDLERS_ANNOTATION]: JSON.stringify(record) });
    app = await ctrd.runContainer(sb, { name: 'app', annotations: PORTS });
    const plain = await podWithServer('plain');
    bare = await ctrd.runContainer(plain, { name: 'app', annotations: PORTS });
  }, 60_000);

  it('a probe and a hook get the value the annotation records, and the exec command never holds it', async () => {
    const probeHandler = rewritten('/auth', 'http', [{ name: 'X-Trace', value: 'plain' }, { name: 'Authorization', valueFrom: 'annotation' }]);
    expect(encodeShimCommand('readiness', probeHandler).join(' ')).not.toContain('s3cret');
    const ok = execAnswer(await run(app, 'readiness', probeHandler));
    expect(ok.exitCode, ok.stdout).toBe(0);
    const hook = execAnswer(await run(app, 'postStart', rewritten('/started', PORT, [{ name: 'Authorization', valueFrom: 'annotation' }])));
    expect(hook.exitCode, hook.stdout).toBe(0);
    expect(seenAuth.get('annotated')!.filter((a) => a === SECRET).length).toBe(2);
  });

  it('an inline value (an older rewrite) still works, and the server tells a wrong value apart', async () => {
    const inline = execAnswer(await run(app, 'readiness', rewritten('/auth', PORT, [{ name: 'Authorization', value: SECRET }])));
    expect(inline.exitCode).toBe(0);
    const wrong = execAnswer(await run(app, 'readiness', rewritten('/auth', PORT, [{ name: 'Authorization', value: 'Bearer wrong' }])));
    expect(wrong.exitCode).not.toBe(0);
    expect(wrong.stdout).toMatch(/statuscode: 401/);
  });

  it.each([
    ['no entry for the probe type', 'startup', [{ name: 'Authorization', valueFrom: 'annotation' }], /"app\/startupProbe"\): no httpGet handler with headers is recorded/],
    ['the recorded header at that index has another name', 'liveness', [{ name: 'Authorization', valueFrom: 'annotation' }], /recorded header at index 0 is "X-Other", not "Authorization"/],
    ['no recorded header at that index', 'readiness', [{ name: 'X-Trace', value: 'plain' }, { name: 'Authorization', value: SECRET }, { name: 'Authorization', valueFrom: 'annotation' }], /no recorded header at index 2/],
  ] as const)('%s: a gRPC error kubelet discards, naming the cause', async (_name, kind, headers, message) => {
    shimLogs.expect({ level: 'warn', msg: 'rewritten handler not run', line: /"code":3,"error":"probe-agent refused the (startup|liveness|readiness) probe: handler\.http_get\.http_headers\[\d\]: value from annotation /, why: 'header records that do not fit the command, on purpose' });
    const before = seenAuth.get('annotated')!.length;
    const e = grpcError(await run(app, kind, rewritten('/auth', PORT, [...headers])));
    expect(e.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(e.details).toMatch(message);
    // Nothing was sent to the pod.
    expect(seenAuth.get('annotated')!.length).toBe(before);
  });

  it('a pod without the annotation: a gRPC error for the probe, a failed hook for kubelet', async () => {
    shimLogs.expect({ level: 'warn', msg: 'rewritten handler not run', line: /"code":3,"error":"probe-agent refused the (readiness probe|preStop hook): .*the pod has no such annotation/, why: 'a pod without the annotation, on purpose' });
    const e = grpcError(await run(bare, 'readiness', rewritten('/auth', PORT, [{ name: 'Authorization', valueFrom: 'annotation' }])));
    expect(e.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(e.details).toMatch(/the pod has no such annotation/);
    const hook = grpcError(await run(bare, 'preStop', rewritten('/stop', PORT, [{ name: 'Authorization', valueFrom: 'annotation' }])));
    expect(hook.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(seenAuth.get('plain')).toEqual([]);
  });
});

describe('a sandbox that goes away', () => {
  it('once stopped, its container\'s probe through the shim is a gRPC error kubelet discards, not a success', async () => {
    shimLogs.expect({ level: 'warn', msg: 'rewritten handler not run', line: /"error":"probe-agent refused the readiness probe: .*(READY sandbox|SANDBOX_NOTREADY|not known on this node)/, why: 'the sandbox is stopped on purpose' });
    const sb = await podWithServer('going');
    const c = await ctrd.runContainer(sb, { name: 'app', annotations: PORTS });
    expect(execAnswer(await run(c, 'readiness', { tcpSocket: { port: PORT } })).exitCode).toBe(0);
    await ctrd.stopSandbox(sb.id);
    const e = grpcError(await run(c, 'readiness', { tcpSocket: { port: PORT } }));
    expect(e.code).not.toBe(grpc.status.DEADLINE_EXCEEDED);
    expect(e.details).toMatch(/SANDBOX_NOTREADY|gone|not known|not found/i);
  }, 60_000);
});
