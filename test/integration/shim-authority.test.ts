/**
 * Issue 17 item 1: the shim serves every `:authority` a real CRI client sends. Kubelet before
 * 1.31, crictl before 1.31 and grpc-java send the runtime socket's path, k8s.io/cri-client (1.31+)
 * sends `localhost`; a client may send other odd octets or none at all. Node's HTTP/2 server
 * resets a stream with a path, odd octets or no authority before the shim's code runs, so each
 * case here failed before the relay gave such a request `localhost` (agent/http2/authority.ts). Real containerd
 * (the lab's) behind the shim, a real agent answering a rewritten probe inside the pod's netns.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'nsenter', 'containerd', 'ctr', 'dpkg-deb']);

import * as grpc from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { encodeShimCommand } from '../../agent/contract/shim-command.ts';
import type { CriShim } from '../../agent/shim/proxy.ts';
import type { ContainerdLab, LabContainer } from '../lab/containerd.ts';
import { KubeletCri, readContainerEvents, RUNTIME_SERVICE, type CriAnswer } from '../support/kubelet-cri.ts';
import { grpcRequestHeaders, headerValue, rawUnary } from '../support/raw-h2.ts';
import { shimLogSink } from '../support/log-check.ts';
import { ShimLab } from '../support/shim-lab.ts';

const NS = 'shim-authority';
const HTTP = 8080;
/** What kubelet 1.26 sends with the default containerd endpoint. */
const SOCKET_PATH_AUTHORITY = '/run/containerd/containerd.sock';
/** Octets nghttp2 refuses (space, braces, '@', '|', '/'), as a client with a mangled target might send. */
const ODD_AUTHORITY = 'cri socket {x}@y|z/w';

let lab: ShimLab;
let ctrd: ContainerdLab;
let shim: CriShim;
let direct: KubeletCri;
let app: LabContainer;
const shimLog = shimLogSink('shim (shim-authority)');

function same(a: CriAnswer, b: CriAnswer): void {
  if (a.ok && b.ok) expect(Buffer.compare(a.raw, b.raw)).toBe(0);
  else expect(a).toEqual(b);
}

/** Same decoded message (containerd marshals map fields in random order, so bytes can differ). */
function sameMapped(a: CriAnswer, b: CriAnswer): void {
  if (a.ok && b.ok) expect(a.msg).toEqual(b.msg);
  else expect(a).toEqual(b);
}

function readiness(): string[] {
  return encodeShimCommand('readiness', { httpGet: { path: '/healthz', port: HTTP } });
}



beforeAll(async () => {
  lab = await ShimLab.start('shim-authority-');
  ctrd = lab.ctrd;
  let spec: Record<string, unknown>;
  ({ app, spec } = await lab.appPod({ namespace: NS, server: { http: HTTP }, port: HTTP }));
  const container = (spec.spec as { containers: Record<string, unknown>[] }).containers[0]!;
  container.readinessProbe = { exec: { command: readiness() }, periodSeconds: 1, timeoutSeconds: 1 };
  await lab.startKubelet([spec]);
  await lab.startAgent();
  shim = await lab.startShim({ log: shimLog.log });
  direct = lab.client(new KubeletCri(ctrd.socket));
}, 90_000);

afterAll(() => lab?.stop());

describe.each([
  ['the socket path (kubelet, crictl before 1.31; grpc-java)', SOCKET_PATH_AUTHORITY, true],
  ['localhost (k8s.io/cri-client, kubelet 1.31+)', 'localhost', false],
  ['odd octets nghttp2 refuses', ODD_AUTHORITY, true],
])('a grpc-js client sending :authority %s', (_name, authority, rewritten) => {
  let c: KubeletCri;
  beforeAll(() => {
    c = new KubeletCri(shim.config.listenPath, { 'grpc.default_authority': authority });
  });
  afterAll(() => c?.close());

  it('unary calls (Version, ListContainers, ContainerStatus) get containerd\'s own answers', async () => {
    const version = await c.call('Version', { version: 'v1' });
    expect(version.ok, JSON.stringify(version)).toBe(true);
    same(version, await direct.call('Version', { version: 'v1' }));
    const listed = await c.call<{ containers: { id: string }[] }>('ListContainers', {});
    expect(listed.ok && listed.msg.containers.some((x) => x.id === app.id)).toBe(true);
    sameMapped(listed, await direct.call('ListContainers', {}));
    sameMapped(await c.call('ContainerStatus', { containerId: app.id }), await direct.call('ContainerStatus', { containerId: app.id }));
    // A gRPC error passes unchanged too.
    same(await c.call('ContainerStatus', { containerId: 'no-such-container' }), await direct.call('ContainerStatus', { containerId: 'no-such-container' }));
  });

  it('a server stream (GetContainerEvents) ends as containerd ends it', async () => {
    const [a, b] = await Promise.all([readContainerEvents(c), readContainerEvents(direct)]);
    expect(a).toEqual(b);
  });

  it('an ordinary ExecSync runs in the container, a rewritten readiness probe is answered by the agent inside the pod', async () => {
    const echo = await c.execSync(app.id, ['/bin/echo', 'through the shim'], 5);
    expect(echo.ok && echo.msg.stdout.toString()).toBe('through the shim\n');
    same(echo, await direct.execSync(app.id, ['/bin/echo', 'through the shim'], 5));
    const probed = await c.execSync(app.id, readiness(), 1);
    expect(probed.ok, JSON.stringify(probed)).toBe(true);
    expect(probed.ok && probed.msg.exitCode).toBe(0);
    const failed = await c.execSync(app.id, encodeShimCommand('liveness', { httpGet: { path: '/status/500', port: HTTP } }), 1);
    expect(failed.ok && failed.msg.exitCode).not.toBe(0);
  });

  it(`the connection is ${rewritten ? 'rewritten (one info line naming the authority)' : 'carried natively (no rewrite)'}`, () => {
    const lines = shimLog.records.filter((l) => String(l['msg']).includes('rewriting') && l['authority'] === authority);
    expect(lines.length).toBe(rewritten ? 1 : 0);
  });
});

describe('a client sending no :authority at all (raw HTTP/2: gRPC libraries always send one)', () => {
  const version = RUNTIME_SERVICE['Version']!;
  const execSync = RUNTIME_SERVICE['ExecSync']!;

  it('containerd itself answers such a request (the shim must not be the one to refuse it)', async () => {
    const a = await rawUnary(ctrd.socket, grpcRequestHeaders(version.path, undefined), version.requestSerialize({ version: 'v1' }));
    expect(headerValue(a.trailers, 'grpc-status')).toBe('0');
  });

  it('Version through the shim: the runtime\'s answer, byte for byte', async () => {
    const a = await rawUnary(shim.config.listenPath, grpcRequestHeaders(version.path, undefined), version.requestSerialize({ version: 'v1' }));
    expect(a.rstCode).toBeUndefined();
    expect(headerValue(a.trailers, 'grpc-status')).toBe('0');
    const d = await direct.call('Version', { version: 'v1' });
    expect(d.ok && Buffer.compare(a.messages[0]!, d.raw)).toBe(0);
  });

  it('a rewritten readiness probe through the shim: exit code 0 from the agent', async () => {
    const req = execSync.requestSerialize({ containerId: app.id, cmd: readiness(), timeout: 1 });
    const a = await rawUnary(shim.config.listenPath, grpcRequestHeaders(execSync.path, undefined), req);
    expect(a.rstCode).toBeUndefined();
    expect(headerValue(a.trailers, 'grpc-status')).toBe('0');
    const res = execSync.responseDeserialize(a.messages[0]!) as { exitCode: number };
    expect(res.exitCode).toBe(0);
  });

  it('an empty :authority is served too', async () => {
    const a = await rawUnary(shim.config.listenPath, grpcRequestHeaders(version.path, ''), version.requestSerialize({ version: 'v1' }));
    expect(a.rstCode).toBeUndefined();
    expect(headerValue(a.trailers, 'grpc-status')).toBe('0');
  });
});

/** A kubelet-like client still gets an answer after a bad one. */
async function expectShimServesNextClient(): Promise<void> {
  const c = new KubeletCri(shim.config.listenPath, { 'grpc.default_authority': SOCKET_PATH_AUTHORITY });
  try {
    const v = await c.call('Version', { version: 'v1' });
    expect(v.ok, JSON.stringify(v)).toBe(true);
  } finally {
    c.close();
  }
}

describe('a client that only connects (the installer\'s check)', () => {
  it('connect and reset: no warning, and the shim serves the next client', async () => {
    const net = await import('node:net');
    const before = shimLog.records.length;
    for (let i = 0; i < 3; i++) {
      await new Promise<void>((resolve) => {
        // As label-node.mjs probes: connect, close; the shim's SETTINGS left unread make the
        // shim's side see ECONNRESET.
        const s = net.connect(shim.config.listenPath, () => setTimeout(() => s.destroy(), 200));
        s.pause();
        s.on('error', () => {});
        s.on('close', () => resolve());
      });
    }
    await expectShimServesNextClient();
    const since = shimLog.records.slice(before);
    expect(since.filter((l) => l['level'] === 'warn' || l['level'] === 'error'), JSON.stringify(since)).toEqual([]);
  });
});

describe('malformed HTTP/2 from a client', () => {
  it('closes that connection with one warning; the shim serves the next client', async () => {
    shimLog.expect({ level: 'warn', msg: 'closing a connection that is not HTTP/2 the shim can carry', line: /not an HTTP\/2 client preface/, why: 'an HTTP/1.1 client, on purpose' });
    const net = await import('node:net');
    const closed = await new Promise<boolean>((resolve) => {
      const s = net.connect(shim.config.listenPath);
      s.on('connect', () => s.write('GET / HTTP/1.1\r\nHost: x\r\n\r\n'));
      s.on('error', () => {});
      s.resume(); // read the shim's SETTINGS, then the end of the connection
      s.on('close', () => resolve(true));
      setTimeout(() => resolve(false), 10_000);
    });
    expect(closed, JSON.stringify(shimLog.records)).toBe(true);
    expect(shimLog.records.some((l) => l['level'] === 'warn' && /not an HTTP\/2 client preface/.test(String(l['error']))), JSON.stringify(shimLog.records)).toBe(true);
    await expectShimServesNextClient();
  });
});
