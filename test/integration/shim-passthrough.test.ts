/**
 * The kubelet shim in front of a real containerd (the lab's), driven by a kubelet-shaped CRI
 * client: every answer through the shim is byte-identical to the runtime's own (messages and
 * gRPC errors), ExecSync of ordinary commands runs in a real busybox container, streams pass
 * through, containerd stopping and coming back is seen and survived, and a rewritten command
 * sent to containerd without the shim gets the gRPC error kubelet discards (issue 11 item 4).
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'containerd', 'ctr', 'gcc', 'tar', 'dpkg-deb']);

import { statSync } from 'node:fs';
import path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { encodeShimCommand, SHIM_KINDS } from '../../agent/contract/shim-command.ts';
import { CriShim } from '../../agent/shim/proxy.ts';
import { BUSYBOX_IMAGE_REF } from '../lab/busybox-image.ts';
import type { ContainerdLab, LabSandbox } from '../lab/containerd.ts';
import { KubeletCri, readContainerEvents, RUNTIME_SERVICE, type CriAnswer } from '../support/kubelet-cri.ts';
import { shimLogSink } from '../support/log-check.ts';
import { ShimLab } from '../support/shim-lab.ts';

let lab: ShimLab;
let ctrd: ContainerdLab;
let scratch: string;
let shim: CriShim;
let viaShim: KubeletCri;
let direct: KubeletCri;
let sandbox: LabSandbox;
let containerId: string;

/** Byte-identical answers (or the same gRPC error). */
function same(a: CriAnswer, b: CriAnswer): void {
  if (a.ok && b.ok) expect(Buffer.compare(a.raw, b.raw)).toBe(0);
  else expect(a).toEqual(b);
}

/**
 * The same answer for a message with map fields: Go's protobuf marshals map entries in random
 * order, so two calls to containerd itself differ in bytes; same length, same decoded message.
 */
function sameMapped(a: CriAnswer, b: CriAnswer): void {
  if (a.ok && b.ok) {
    expect(a.raw.length).toBe(b.raw.length);
    expect(a.msg).toEqual(b.msg);
  } else expect(a).toEqual(b);
}

/** The shim's log lines, checked when the file ends; a test lists the warnings it provokes. */
const shimLogs = shimLogSink('shim (shim-passthrough)');

beforeAll(async () => {
  lab = await ShimLab.start('shim-test-');
  ({ ctrd, scratch } = lab);
  // No agent behind probe.sock: plain passthrough needs none.
  shim = await lab.startShim({ probeSocket: path.join(scratch, 'no-agent.sock'), log: shimLogs.log });
  direct = lab.client(new KubeletCri(ctrd.socket));
  viaShim = lab.client(new KubeletCri(shim.config.listenPath));
});

afterAll(() => lab?.stop());

/** One field of a protobuf message: its number, the whole record (tag and value) and, length-delimited, the value. */
interface WireField {
  num: number;
  record: Buffer;
  value: Buffer | undefined;
}

/** Splits a protobuf message into its top-level fields; throws on a malformed message. */
function wireFields(buf: Buffer): WireField[] {
  const out: WireField[] = [];
  let i = 0;
  const varint = (): number => {
    let v = 0;
    for (let shift = 0; ; shift += 7) {
      if (i >= buf.length || shift > 63) throw new Error(`malformed varint at ${i}`);
      const b = buf[i++]!;
      v += (b & 0x7f) * 2 ** shift;
      if ((b & 0x80) === 0) return v;
    }
  };
  while (i < buf.length) {
    const start = i;
    const tag = varint();
    const wire = tag % 8;
    let value: Buffer | undefined;
    if (wire === 0) varint();
    else if (wire === 1) i += 8;
    else if (wire === 2) {
      const len = varint();
      value = buf.subarray(i, i + len);
      i += len;
    } else if (wire === 5) i += 4;
    else throw new Error(`unsupported wire type ${wire} at ${start}`);
    if (i > buf.length) throw new Error(`field at ${start} runs past the end`);
    out.push({ num: Math.floor(tag / 8), record: buf.subarray(start, i), value });
  }
  return out;
}

/**
 * An ImageService answer as comparable text: its top-level fields (hex), sorted, so a runtime may list
 * images in any order but any changed byte shows. ImageFsInfo's FilesystemUsage entries carry the time
 * of the call (field 1): that field alone is left out of each entry.
 */
function imageAnswer(method: string, buf: Buffer): string[] {
  return wireFields(buf).map((f) => {
    if (method !== 'ImageFsInfo' || f.value === undefined) return f.record.toString('hex');
    return `${f.num}:${wireFields(f.value).filter((g) => g.num !== 1).map((g) => g.record.toString('hex')).join('.')}`;
  }).sort();
}

describe('kubelet-shaped calls through the shim', () => {
  it('listens on a 0600 socket', () => {
    expect(statSync(shim.config.listenPath).mode & 0o777).toBe(0o600);
  });

  it('creates a pod and a busybox container through the shim, and reads them back byte-identical to the runtime', async () => {
    const uid = 'a1b2c3d4-0000-4000-8000-00000000shim';
    const sandboxConfig = {
      metadata: { name: 'shim-pod', uid, namespace: 'lab', attempt: 0 },
      hostname: 'shim-pod',
      labels: { 'io.kubernetes.pod.uid': uid, 'io.kubernetes.pod.name': 'shim-pod', 'io.kubernetes.pod.namespace': 'lab' },
      linux: { cgroupParent: `/${ctrd.cgroupPrefix}/kubepods/besteffort/pod${uid}`, securityContext: { namespaceOptions: { network: 'POD', pid: 'CONTAINER', ipc: 'POD' } } },
    };
    const run = await viaShim.call<{ podSandboxId: string }>('RunPodSandbox', { config: sandboxConfig }, 60_000);
    expect(run.ok).toBe(true);
    if (!run.ok) return;
    const sandboxId = run.msg.podSandboxId;
    const created = await viaShim.call<{ containerId: string }>('CreateContainer', {
      podSandboxId: sandboxId,
      config: {
        metadata: { name: 'app', attempt: 0 },
        image: { image: BUSYBOX_IMAGE_REF },
        command: ['/bin/sleep', 'infinity'],
        labels: { ...sandboxConfig.labels, 'io.kubernetes.container.name': 'app' },
      },
      sandboxConfig,
    }, 60_000);
    expect(created.ok).toBe(true);
    if (!created.ok) return;
    containerId = created.msg.containerId;
    expect((await viaShim.call('StartContainer', { containerId }, 60_000)).ok).toBe(true);
    const st = await direct.call<{ status: { network: { ip: string } } }>('PodSandboxStatus', { podSandboxId: sandboxId });
    sandbox = { id: sandboxId, uid, name: 'shim-pod', namespace: 'lab', attempt: 0, pid: 0, netnsPath: '', ipv4: st.ok ? st.msg.status.network.ip : '', ipv6: '', ips: [], cgroupParent: '' };

    same(await viaShim.call('Version', { version: 'v1' }), await direct.call('Version', { version: 'v1' }));
    sameMapped(await viaShim.call('ListContainers', {}), await direct.call('ListContainers', {}));
    sameMapped(await viaShim.call('ListContainers', { filter: { podSandboxId: sandboxId } }), await direct.call('ListContainers', { filter: { podSandboxId: sandboxId } }));
    sameMapped(await viaShim.call('ContainerStatus', { containerId }), await direct.call('ContainerStatus', { containerId }));
    sameMapped(await viaShim.call('ListPodSandbox', {}), await direct.call('ListPodSandbox', {}));
    sameMapped(await viaShim.call('PodSandboxStatus', { podSandboxId: sandboxId }), await direct.call('PodSandboxStatus', { podSandboxId: sandboxId }));
    const listed = await viaShim.call<{ containers: { id: string; state: string }[] }>('ListContainers', {});
    expect(listed.ok && listed.msg.containers.find((c) => c.id === containerId)?.state).toBe('CONTAINER_RUNNING');
  });

  it('passes ImageService calls (not in our proto subset) through as raw bytes, byte-identical', async () => {
    const raw = (c: KubeletCri, method: string): Promise<{ ok: boolean; bytes?: Buffer; code?: number; details?: string }> => new Promise((resolve) => {
      c.client.makeUnaryRequest(`/runtime.v1.ImageService/${method}`, (b: Buffer) => b, (b: Buffer) => b, Buffer.alloc(0), { deadline: Date.now() + 10_000 },
        (err, res) => resolve(err ? { ok: false, code: err.code, details: err.details } : { ok: true, bytes: res as Buffer }));
    });
    for (const method of ['ListImages', 'ImageFsInfo']) {
      // Compared field by field (imageAnswer). ImageFsInfo's usage figures are the runtime's last
      // sample: ask again when a new sample fell between the two calls.
      let diff = '';
      for (let attempt = 0; attempt < 5; attempt++) {
        const [a, b] = [await raw(viaShim, method), await raw(direct, method)];
        expect(a.ok, `${method}: ${a.details}`).toBe(true);
        expect(b.ok, `${method} direct: ${b.details}`).toBe(true);
        const [fa, fb] = [imageAnswer(method, a.bytes!), imageAnswer(method, b.bytes!)];
        expect(fa.length, method).toBeGreaterThan(0);
        diff = JSON.stringify(fa) === JSON.stringify(fb) ? '' : `via the shim ${JSON.stringify(fa).slice(0, 300)}, direct ${JSON.stringify(fb).slice(0, 300)}`;
        if (diff === '') break;
      }
      expect(diff, method).toBe('');
    }
    // ListImages holds the busybox image.
    expect((await raw(viaShim, 'ListImages')).bytes!.includes(Buffer.from(BUSYBOX_IMAGE_REF))).toBe(true);
  });

  it('passes gRPC errors through unchanged (unknown container, malformed request)', async () => {
    same(await viaShim.call('ContainerStatus', { containerId: 'no-such-container' }), await direct.call('ContainerStatus', { containerId: 'no-such-container' }));
    const a = await viaShim.call('ContainerStatus', { containerId: '' });
    expect(a.ok).toBe(false);
    same(a, await direct.call('ContainerStatus', { containerId: '' }));
  });

  it('runs an ordinary ExecSync in the busybox container, byte-identical to the runtime (stdout, stderr, exit code)', async () => {
    const cmd = ['/bin/sh', '-c', 'echo hello from $(cat /etc/passwd | head -1 | cut -d: -f1 2>/dev/null || echo busybox); echo oops >&2; exit 3'];
    const a = await viaShim.execSync(containerId, cmd, 5);
    const b = await direct.execSync(containerId, cmd, 5);
    same(a, b);
    expect(a.ok).toBe(true);
    if (a.ok) {
      expect(a.msg.exitCode).toBe(3);
      expect(a.msg.stdout.toString()).toMatch(/^hello from/);
      expect(a.msg.stderr.toString()).toBe('oops\n');
    }
    const ok = await viaShim.execSync(containerId, ['/bin/true'], 1);
    expect(ok.ok && ok.msg.exitCode).toBe(0);
  });

  it('an ExecSync that runs past its timeout gets the runtime\'s own DEADLINE_EXCEEDED through the shim', async () => {
    const a = await viaShim.execSync(containerId, ['/bin/sleep', '5'], 1);
    expect(a.ok).toBe(false);
    if (!a.ok) {
      expect(a.code).toBe(grpc.status.DEADLINE_EXCEEDED);
      expect(a.details).toMatch(/timeout 1s exceeded/);
    }
  });

  it('a large ordinary ExecSync (over the 64 KiB read limit) streams through unread', async () => {
    const big = 'x'.repeat(100 * 1024);
    const cmd = ['/bin/sh', '-c', `printf %s "$1" | wc -c`, 'sh', big];
    const a = await viaShim.execSync(containerId, cmd, 5);
    same(a, await direct.execSync(containerId, cmd, 5));
  });

  it('GetContainerEvents (a server stream) passes through as the runtime answers it', async () => {
    // containerd 1.6 has no evented PLEG: both ways the same answer (UNIMPLEMENTED), or the same cancelled stream on 1.7+.
    const [a, b] = await Promise.all([readContainerEvents(viaShim), readContainerEvents(direct)]);
    expect(a).toEqual(b);
  });
});

describe('a rewritten command without the shim (issue 11 item 4)', () => {
  it.each(SHIM_KINDS)('containerd answers a %s handler with a gRPC UNKNOWN error, not an exit code', async (kind) => {
    const cmd = encodeShimCommand(kind, { httpGet: { path: '/healthz', port: 8080 } });
    const a = await direct.execSync(containerId, cmd, 1);
    expect(a.ok).toBe(false);
    if (!a.ok) {
      expect(a.code).toBe(grpc.status.UNKNOWN);
      expect(a.details).toMatch(/\/\.probe-agent\/v1.*no such file or directory/);
    }
  });
});

describe('the runtime down and back', () => {
  it('calls fail fast with UNAVAILABLE while containerd is down, and work again through the same shim once it is back', async () => {
    shimLogs.expect({ level: 'warn', msg: 'runtime unavailable', line: /"error":"connection refused\b/, why: 'containerd is stopped on purpose' });
    await ctrd.stopContainerd();
    const down = await viaShim.call('Version', { version: 'v1' }, 5000);
    expect(down.ok).toBe(false);
    if (!down.ok) {
      expect(down.code).toBe(grpc.status.UNAVAILABLE);
      expect(down.details).toMatch(/runtime .* unavailable/);
    }
    await ctrd.startContainerd();
    const up = await viaShim.call('ListContainers', {});
    expect(up.ok).toBe(true);
    sameMapped(up, await direct.call('ListContainers', {}));
    expect(shim.stats.runtimeErrors).toBeGreaterThan(0);
  });
});

describe('streams through the shim', () => {
  it('a server stream delivers every message in order, and kubelet cancelling it cancels it at the runtime', async () => {
    // A RuntimeService that streams events: containerd 1.6 does not implement GetContainerEvents.
    const server = new grpc.Server();
    let cancelledAtRuntime = false;
    const def = RUNTIME_SERVICE['GetContainerEvents'] as grpc.MethodDefinition<object, object>;
    server.register(def.path, (call: grpc.ServerWritableStream<object, object>) => {
      let i = 0;
      const t = setInterval(() => call.write({ containerId: `c${i++}`, containerEventType: 'CONTAINER_STARTED_EVENT', createdAt: String(i) }), 20);
      call.on('cancelled', () => {
        cancelledAtRuntime = true;
        clearInterval(t);
      });
    }, def.responseSerialize, def.requestDeserialize, 'serverStream');
    const sock = path.join(scratch, 'stream-runtime.sock');
    await new Promise<void>((resolve, reject) => server.bindAsync(`unix:${sock}`, grpc.ServerCredentials.createInsecure(), (err) => (err ? reject(err) : resolve())));
    const s2 = new CriShim({ listenPath: path.join(scratch, 'cri2.sock'), runtimeSocket: sock, probeSocket: path.join(scratch, 'none.sock'), log: shimLogSink('shim over a streaming runtime (shim-passthrough)').log });
    await s2.listen();
    const k = new KubeletCri(s2.config.listenPath);
    try {
      const call = k.containerEvents();
      const ids: string[] = [];
      await new Promise<void>((resolve) => {
        call.on('data', (raw: Buffer) => {
          ids.push(KubeletCri.decodeEvent(raw)['containerId'] as string);
          if (ids.length === 10) {
            call.cancel();
            resolve();
          }
        });
        call.on('error', () => {});
      });
      expect(ids).toEqual(Array.from({ length: 10 }, (_, i) => `c${i}`));
      for (let i = 0; i < 100 && !cancelledAtRuntime; i++) await new Promise((r) => setTimeout(r, 20));
      expect(cancelledAtRuntime).toBe(true);
    } finally {
      k.close();
      await s2.close(100);
      server.forceShutdown();
    }
  });
});
