/**
 * CRI calls and fields newer than the runtime (issue 25): kubelets from 1.28 on call RPCs that
 * containerd 1.6 does not know (RuntimeConfig at start, UpdatePodSandboxResources, the metrics
 * calls, 1.36's streaming lists) and fall back only on exactly `Unimplemented`; kubelets from 1.33
 * on send fields this runtime's schema lacks (`Mount.image`, and more). Through the shim each call
 * must end as it ends straight at the runtime, and a request must reach the runtime byte for byte.
 * Driven by the kubelet-shaped grpc-go client (test/grpc-go-peer), the requests encoded here by
 * field number, so no schema of ours filters anything.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['containerd', 'ctr']);
import { requireGrpcGoPeer } from '../support/grpc-go-cri.ts';
requireGrpcGoPeer();

import { rmSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { encodeFrame } from '../../agent/grpc/frame.ts';
import { encodeLiteralBlock, HpackDecoder } from '../../agent/http2/hpack.ts';
import { WireWriter } from '../../agent/grpc/protowire.ts';
import { CriShim } from '../../agent/shim/proxy.ts';
import { createContainerdLab, type ContainerdLab } from '../lab/containerd.ts';
import { labScratch } from '../lab/slots.ts';
import { GrpcGoCri } from '../support/grpc-go-cri.ts';
import { H2Tap } from '../support/h2-tap.ts';

const RS = '/runtime.v1.RuntimeService/';

let ctrd: ContainerdLab;
let scratch: string;
let tap: H2Tap;
/** Between the grpc-go client and the shim: what the shim sent kubelet. */
let front: H2Tap;
let shim: CriShim;
let direct: GrpcGoCri;
let viaShim: GrpcGoCri;
const shimLog: string[] = [];

beforeAll(async () => {
  ctrd = await createContainerdLab();
  scratch = labScratch('shim-cri-newer-');
  tap = await H2Tap.start(path.join(scratch, 'runtime-tap.sock'), ctrd.socket, true, true);
  // No agent: none of these calls is a probe-agent command.
  shim = new CriShim({
    listenPath: path.join(scratch, 'cri.sock'), runtimeSocket: tap.listenPath, probeSocket: path.join(scratch, 'no-agent.sock'),
    log: (level, msg, fields) => {
      if (level !== 'info') shimLog.push(`${level} ${msg} ${JSON.stringify(fields ?? {})}`);
    },
  });
  await shim.listen();
  front = await H2Tap.start(path.join(scratch, 'front-tap.sock'), path.join(scratch, 'cri.sock'), false, true);
  direct = new GrpcGoCri(ctrd.socket, { authority: 'localhost' });
  viaShim = new GrpcGoCri(front.listenPath, { authority: 'localhost' });
}, 90_000);

afterAll(async () => {
  await direct?.close();
  await viaShim?.close();
  await shim?.close(100);
  await tap?.close();
  await front?.close();
  await ctrd?.destroy();
  if (scratch) rmSync(scratch, { recursive: true, force: true });
});

/** The same request straight to containerd and through the shim: the two answers. */
async function both(method: string, body: Buffer): Promise<[unknown, unknown]> {
  const a = await direct.callRaw(RS + method, body);
  const b = await viaShim.callRaw(RS + method, body);
  const show = (x: Awaited<ReturnType<GrpcGoCri['callRaw']>>): unknown => (x.ok ? { ok: true, raw: x.raw.toString('hex') } : x);
  return [show(a), show(b)];
}

describe('CRI calls newer than containerd 1.6, through the shim (grpc-go client)', () => {
  // RuntimeConfig (1.28; required from 1.38), UpdatePodSandboxResources (1.33: anything but
  // Unimplemented blocks pod-level resizes), the metrics calls, 1.36's streaming lists and checkpoints.
  const calls: Array<[string, Buffer]> = [
    ['RuntimeConfig', Buffer.alloc(0)],
    ['UpdatePodSandboxResources', new WireWriter().bytes(1, 'no-such-sandbox').finish()],
    ['ListMetricDescriptors', Buffer.alloc(0)],
    ['ListPodSandboxMetrics', Buffer.alloc(0)],
    ['StreamPodSandboxes', Buffer.alloc(0)],
    ['StreamContainers', Buffer.alloc(0)],
    ['CheckpointContainer', new WireWriter().bytes(1, 'no-such-container').finish()],
  ];
  it.each(calls)('%s ends as it ends at the runtime', async (method, body) => {
    const [d, s] = await both(method, body);
    expect(d, 'straight to containerd').toMatchObject({ ok: false, code: 12 }); // Unimplemented: kubelet's fallbacks need exactly this
    expect(s).toEqual(d);
  });

  it('calls the runtime knows answer the same octets (Version, Status)', async () => {
    for (const [method, body] of [['Version', Buffer.alloc(0)], ['Status', Buffer.alloc(0)]] as const) {
      const [d, s] = await both(method, body);
      expect(d, method).toMatchObject({ ok: true });
      expect(s, method).toEqual(d);
    }
  });

  it('a request with fields newer than the runtime reaches it byte for byte, and ends as it ends there', async () => {
    // CreateContainerRequest{pod_sandbox_id=1, config=2{metadata=1{name=1}, image=2{image=1}, mounts=7[{container_path=1,
    // host_path=2, image=9 (Mount.image, 1.33+){image=1}}]}, sandbox_config=3} plus an unknown top-level field 99.
    const mount = new WireWriter().bytes(1, '/data').bytes(2, '').bytes(9, new WireWriter().bytes(1, 'example.com/data:1').finish()).finish();
    const config = new WireWriter()
      .bytes(1, new WireWriter().bytes(1, 'c').finish())
      .bytes(2, new WireWriter().bytes(1, 'busybox').finish())
      .bytes(7, mount)
      .finish();
    const body = new WireWriter().bytes(1, 'no-such-sandbox').bytes(2, config).bytes(99, 'a field of a later CRI').finish();
    const [d, s] = await both('CreateContainer', body);
    expect(d, 'straight to containerd').toMatchObject({ ok: false });
    expect(s).toEqual(d);
    const reached = Buffer.concat(tap.counts.dataToTarget);
    expect(reached.indexOf(encodeFrame(body)), 'the gRPC message as the client framed it, in what the runtime received').toBeGreaterThanOrEqual(0);
    expect(shimLog).toEqual([]);
  });

  it("passes the runtime's header blocks to kubelet as they came (Huffman and all), re-encoding only the one that sets the table size", async () => {
    // By now every test above went through the shim: responses, and Unimplemented trailers with a grpc-message.
    const fromRuntime = tap.counts.headersFromTarget;
    const toKubelet = front.counts.headersFromTarget.map((b) => b.toString('hex'));
    expect(fromRuntime.length, 'header blocks containerd sent the shim').toBeGreaterThanOrEqual(calls.length + 3);
    // The shim's SETTINGS_HEADER_TABLE_SIZE 0: grpc-go opens with a size update (0x20-0x3f), and then never reads its table.
    expect(fromRuntime[0]![0]! & 0xe0, 'the first block opens with a table size update').toBe(0x20);
    const later = fromRuntime.slice(1);
    for (const b of later) expect(b[0]! & 0xe0, `a later block updates the table size: ${b.toString('hex')}`).not.toBe(0x20);
    // grpc-go Huffman-codes strings where shorter; the shim's own encoder never does, so a match is the runtime's octets.
    const huffman = later.filter((b) => b.toString('hex') !== encodeLiteralBlock(new HpackDecoder({ maxTableSize: 0, maxHeaderListSize: 1 << 16 }).decode(b)).toString('hex'));
    expect(huffman.length, 'blocks that differ from the shim\'s own literal encoding').toBeGreaterThan(0);
    for (const b of later) expect(toKubelet, `a runtime block kubelet never saw as it was: ${b.toString('hex')}`).toContain(b.toString('hex'));
  });
});
