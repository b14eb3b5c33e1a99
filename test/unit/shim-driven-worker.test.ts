/**
 * On-demand mode in the scheduler: a shim-driven probe's worker never probes on its timers and takes
 * the results the kubelet shim brings through ProbeManager.deliver, with kubelet's thresholds, hold
 * and container-ID rules. Real manager, store and clock harness; a real server counts connections.
 */
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { ContainerProbe } from '../../agent/pods/types.ts';
import type { ProbeOutcome } from '../../agent/probe/types.ts';
import { Harness, ToggleServer, container, pod, running, tcpProbe } from '../support/scheduler-harness.ts';

let server: ToggleServer;
let h: Harness;

beforeEach(async () => {
  server = await ToggleServer.start();
  h = new Harness();
});

afterEach(async () => {
  await h.close();
  await server.down();
});

function shim(probe: ContainerProbe): ContainerProbe {
  return { ...(probe as { ok: true; spec: never }), shim: true };
}

const ok: ProbeOutcome = { result: 'success', message: '', durationSeconds: 0.001, phases: { total: 0.001 } };
const bad: ProbeOutcome = { result: 'failure', reason: 'refused', message: 'dial tcp: connection refused', durationSeconds: 0.001, phases: { total: 0.001 } };

describe('shim-driven workers', () => {
  it('never probe on their timers; an ordinary probe of the same pod does', async () => {
    await h.sync([pod('p', [
      container('app', { Readiness: shim(tcpProbe(server.port, { periodSeconds: 1 })) }, running('a', h.t0)),
      container('side', { Readiness: tcpProbe(server.port, { periodSeconds: 1 }) }, running('s', h.t0)),
    ])]);
    for (let i = 0; i < 5; i++) await h.step(1000);
    expect(h.observer.runs.filter((r) => r.meta.key.containerName === 'app')).toHaveLength(0);
    expect(h.observer.runs.filter((r) => r.meta.key.containerName === 'side').length).toBeGreaterThanOrEqual(5);
    expect(server.accepted).toBe(h.observer.runs.filter((r) => r.meta.key.containerName === 'side').length);
    expect(h.status('p', 'app', 'Readiness')).toMatchObject({ result: 'unknown', lastProbeTime: 0 });
  });

  it('take shim results with thresholds, hold, and the container-ID rules', async () => {
    await h.sync([pod('p', [container('app', {
      Readiness: shim(tcpProbe(server.port)),
      Liveness: shim(tcpProbe(server.port, { failureThreshold: 2 })),
    }, running('a', h.t0))])]);
    const readiness = { podUID: 'p', containerName: 'app', probeType: 'Readiness' as const };
    const liveness = { ...readiness, probeType: 'Liveness' as const };

    // The shim's bare ID is the pod list's "containerd://a": no reset, the list's spelling is kept.
    expect(h.manager.deliver(readiness, 'a', ok)).toBe(true);
    expect(h.status('p', 'app', 'Readiness')).toMatchObject({ result: 'success', ready: true, consecutive: 1, containerID: 'containerd://a' });
    expect(h.observer.runsOf('Readiness')).toBe(1);

    h.manager.deliver(liveness, 'a', bad);
    expect(h.status('p', 'app', 'Liveness')).toMatchObject({ result: 'success', consecutive: 1, onHold: false });
    h.manager.deliver(liveness, 'a', bad);
    expect(h.status('p', 'app', 'Liveness')).toMatchObject({ result: 'failure', onHold: true, lastReason: 'refused' });

    // Kubelet restarted the container: the shim names the new one before the pod list does.
    h.manager.deliver(liveness, 'b', ok);
    expect(h.status('p', 'app', 'Liveness')).toMatchObject({ result: 'success', onHold: false, consecutive: 1, containerID: 'b' });
    await h.sync([pod('p', [container('app', {
      Readiness: shim(tcpProbe(server.port)),
      Liveness: shim(tcpProbe(server.port, { failureThreshold: 2 })),
    }, running('b', h.now()))])]);
    h.manager.deliver(liveness, 'containerd://b', ok);
    expect(h.status('p', 'app', 'Liveness')).toMatchObject({ result: 'success', consecutive: 2, containerID: 'containerd://b' });
    expect(server.accepted).toBe(0);
  });

  it('refuse results for ordinary probes and unknown workers', async () => {
    await h.sync([pod('p', [container('app', { Readiness: tcpProbe(server.port) }, running('a', h.t0))])]);
    expect(h.manager.deliver({ podUID: 'p', containerName: 'app', probeType: 'Readiness' }, 'a', bad)).toBe(false);
    expect(h.manager.deliver({ podUID: 'nope', containerName: 'app', probeType: 'Readiness' }, 'a', ok)).toBe(false);
    expect(h.status('p', 'app', 'Readiness')?.lastReason).toBeUndefined();
  });
});
