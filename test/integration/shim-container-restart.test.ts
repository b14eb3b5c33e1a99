/**
 * A container restarted in place (KEP-5532, 1.35 alpha, 1.36 beta; and every ordinary restart): the
 * sandbox, its netns and IP stay, the container gets a new ID. Kubelet's next ExecSync names the
 * new ID while its /pods still shows the old one: the shim and the agent must find the new
 * container through the runtime at once, and must not answer for the removed one from memory.
 * Real containerd, the real agent, the shim in this process, kubelet's calls from grpc-js.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'nsenter', 'containerd', 'ctr', 'dpkg-deb']);

import * as grpc from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { encodeShimCommand } from '../../agent/contract/shim-command.ts';
import { BUSYBOX_IMAGE_REF } from '../lab/busybox-image.ts';
import type { ContainerdLab, LabContainer, LabSandbox } from '../lab/containerd.ts';
import type { FakeKubelet } from '../support/fake-kubelet.ts';
import { KubeletCri, type CriAnswer } from '../support/kubelet-cri.ts';
import { shimLogSink } from '../support/log-check.ts';
import { makePod } from '../support/pod-factory.ts';
import { ShimLab } from '../support/shim-lab.ts';
import { until } from '../soak/observe.ts';

const NS = 'restart-in-place';
const HTTP = 8080;

let lab: ShimLab;
let ctrd: ContainerdLab;
let kubelet: FakeKubelet;
let k: KubeletCri;
let pod: LabSandbox;
let first: LabContainer;
const shimLogs = shimLogSink('shim (shim-container-restart)');

const readiness = encodeShimCommand('readiness', { httpGet: { path: '/healthz', port: HTTP } });

function exitCode(a: CriAnswer<{ exitCode: number }>): number | string {
  return a.ok ? a.msg.exitCode : `gRPC ${grpc.status[a.code]}: ${a.details}`;
}

beforeAll(async () => {
  lab = await ShimLab.start('restart-in-place-');
  ctrd = lab.ctrd;
  let spec: Record<string, unknown>;
  ({ pod, app: first, spec } = await lab.appPod({ namespace: NS, server: { http: HTTP }, port: HTTP }));
  kubelet = await lab.startKubelet([spec]);
  await lab.startAgent();
  const shim = await lab.startShim({ log: shimLogs.log });
  k = lab.client(new KubeletCri(shim.config.listenPath));
}, 90_000);

afterAll(() => lab?.stop());

describe('a container restarted in place: same sandbox and netns, a new container ID', () => {
  it('the next ExecSync names the new ID and is answered from the same netns; the removed ID is not answered from memory', async () => {
    expect(exitCode(await k.execSync(first.id, readiness, 1))).toBe(0);
    // Twice, so the first ID is in the agent's caches (container and sandbox).
    expect(exitCode(await k.execSync(first.id, readiness, 1))).toBe(0);

    // What kubelet does on a restart: stop and remove the container, create and start one with the next attempt.
    for (const [method, req] of [['StopContainer', { containerId: first.id, timeout: 0 }], ['RemoveContainer', { containerId: first.id }]] as const) {
      const r = await k.call(method, req);
      expect(r.ok, `${method}: ${r.ok ? '' : r.details}`).toBe(true);
    }
    const second = await ctrd.runContainer(pod, { name: 'app', attempt: 1, image: BUSYBOX_IMAGE_REF, command: ['/bin/sleep', 'infinity'] });
    expect(second.id).not.toBe(first.id);
    expect(second.sandboxId).toBe(pod.id);

    // Kubelet's /pods still shows the first ID: the runtime alone says where the new one is.
    const t0 = performance.now();
    expect(exitCode(await k.execSync(second.id, readiness, 1))).toBe(0);
    const firstAnswerMs = performance.now() - t0;
    // A probe the app fails fails for the new container too: each answer is the app's, never a cached one.
    const failing = await k.execSync(second.id, encodeShimCommand('liveness', { httpGet: { path: '/status/500', port: HTTP } }), 1);
    expect(exitCode(failing)).toBe(1);

    // Kubelet's status catches up (new ID, restartCount 1): the replaced ID is no longer answered
    // from the agent's cache; the runtime, asked again, says it is gone, as its own ExecSync would.
    kubelet.setPods([makePod({ uid: pod.uid, name: pod.name, namespace: NS, ips: pod.ips, probe: 'none', port: HTTP, containerID: `containerd://${second.id}`, restartCount: 1 })]);
    shimLogs.expect({ level: 'warn', msg: 'rewritten handler not run', line: /"code":5,.*is not known on this node/, why: 'a probe of the replaced container, on purpose' });
    const gone = await until(async () => {
      const a = await k.execSync(first.id, readiness, 1);
      return a.ok ? undefined : a;
    }, 5000, 'the replaced container ID to be refused');
    expect(gone.code).toBe(grpc.status.NOT_FOUND);
    expect(gone.details).toContain('the runtime has no such container');
    // The new one is answered as before, and from the cache again after one runtime lookup.
    expect(exitCode(await k.execSync(second.id, readiness, 1))).toBe(0);
    console.log(`restart in place: new ID answered in ${firstAnswerMs.toFixed(0)} ms; replaced ID: ${exitCode(gone)}`);
  });

  it('a container that exited but is kept (as kubelet keeps the last one for its logs) is not probed', async () => {
    const third = await ctrd.runContainer(pod, { name: 'app', attempt: 2, image: BUSYBOX_IMAGE_REF, command: ['/bin/sleep', 'infinity'] });
    const stopped = await k.call('StopContainer', { containerId: third.id, timeout: 0 });
    expect(stopped.ok).toBe(true);
    shimLogs.expect({ level: 'warn', msg: 'rewritten handler not run', line: /"code":5,.*has exited: nothing is probed for it/, why: 'a probe of an exited container, on purpose' });
    const a = await k.execSync(third.id, readiness, 1);
    expect(a.ok).toBe(false);
    expect(a.ok ? '' : a.details).toContain('has exited: nothing is probed for it');
  });
});
