/**
 * WatchProbeEvents against the real server on a real unix socket: snapshot and ordered events,
 * resume within and beyond the retained window, filters, snapshot chunking, the watcher cap, a
 * watcher that stops reading, and end to end: the real probe manager probing a lab pod through the
 * netns helper feeds the watch, and a reconnecting client sees what it missed.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft']);

import { once } from 'node:events';
import * as grpc from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ProbeApiClient, type WatchMessage } from '../../agent/api/client.ts';
import { loadProbeApi } from '../../agent/api/proto.ts';
import { ResidentHelper } from '../../agent/netns/helper.ts';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { classifyPod } from '../../agent/pods/pod-model.ts';
import type { PodInfo } from '../../agent/pods/types.ts';
import { runProbe } from '../../agent/probe/run.ts';
import { ProbeManager } from '../../agent/scheduler/manager.ts';
import { ResultsStore } from '../../agent/scheduler/results-store.ts';
import type { ProbeStatus } from '../../agent/scheduler/types.ts';
import { createLab, type Lab } from '../lab/lab.ts';
import { collect, LabProber, startApiFixture, status, until } from '../support/api-harness.ts';

let lab: Lab;
let helper: ResidentHelper;
let prober: LabProber;

beforeAll(async () => {
  [lab, helper] = await Promise.all([createLab({ pods: 1, policy: 'drop', tag: 'api-watch.test' }), ResidentHelper.start()]);
  prober = new LabProber({ pods: [], sockets: helper });
});

afterAll(async () => {
  await helper?.close();
  await lab?.destroy();
});

describe('WatchProbeEvents', () => {
  it('sends a snapshot, then every change in order; resumes without a snapshot while retained', async () => {
    const store = new ResultsStore({ ringSize: 8 });
    const f = await startApiFixture({ prober, store });
    const c = new ProbeApiClient(f.socket);
    const ac = new AbortController();
    try {
      store.upsert(status('w1', 'ns', 'Readiness', 'unknown'));
      const w = collect(c.watch({ signal: ac.signal }));
      await until(() => w.items.length === 1, 2000, 'snapshot');
      expect(w.items[0]).toMatchObject({ kind: 'snapshot', revision: 1, resynced: false, complete: true, instanceId: f.server.instanceId });
      store.upsert(status('w1', 'ns', 'Readiness', 'success'));
      store.upsert(status('w1', 'ns', 'Readiness', 'success', { consecutive: 9 })); // not significant: no event
      store.upsert(status('w2', 'ns', 'Liveness', 'success'));
      store.remove({ podUID: 'w1', containerName: 'app', probeType: 'Readiness' });
      await until(() => w.items.length === 4, 2000, 'three events');
      const events = w.items.slice(1).map((m) => (m.kind === 'event' ? [m.event.revision, m.event.type, m.event.previous, m.event.status.result] : m.kind));
      expect(events).toEqual([[2, 'changed', 'unknown', 'success'], [3, 'added', 'unknown', 'success'], [4, 'removed', 'success', 'success']]);
      ac.abort();
      await w.done;
      expect(w.error).toBeUndefined();

      const resumed = collect(c.watch({ fromRevision: 2, instanceId: f.server.instanceId }));
      await until(() => resumed.items.length === 2, 2000, 'replay');
      expect(resumed.items.map((m) => (m.kind === 'event' ? m.event.revision : m.kind))).toEqual([3, 4]);
      store.upsert(status('w3', 'ns', 'Startup', 'unknown'));
      await until(() => resumed.items.length === 3, 2000, 'live event after replay');
      expect(resumed.items[2]).toMatchObject({ kind: 'event', event: { revision: 5, type: 'added' } });

      // Beyond the ring, another instance, or a revision from the future: a resynced snapshot.
      for (let i = 0; i < 10; i++) store.upsert(status('w3', 'ns', 'Startup', i % 2 ? 'success' : 'failure'));
      for (const from of [{ fromRevision: 1 }, { fromRevision: 14, instanceId: 'another-agent' }, { fromRevision: 999 }]) {
        const r = collect(c.watch(from));
        await until(() => r.items.length === 1, 2000, 'resync snapshot');
        expect(r.items[0], JSON.stringify(from)).toMatchObject({ kind: 'snapshot', resynced: true, revision: store.revision() });
      }
    } finally {
      c.close();
      await f.close();
    }
  });

  it('splits large snapshots, filters, and caps the number of watchers', async () => {
    const f = await startApiFixture({ prober, snapshotChunk: 2, maxWatchers: 2 });
    const c = new ProbeApiClient(f.socket);
    try {
      for (const uid of ['s1', 's2', 's3', 's4', 's5']) f.store.upsert(status(uid, uid === 's5' ? 'other' : 'ns', 'Liveness', 'success'));
      const a = collect(c.watch());
      const b = collect(c.watch({ filter: { namespace: 'other' } }));
      await until(() => a.items.length === 3 && b.items.length === 1, 2000, 'snapshots');
      expect(a.items.map((m) => (m.kind === 'snapshot' ? [m.statuses.length, m.complete, m.revision] : m.kind))).toEqual([[2, false, 5], [2, false, 5], [1, true, 5]]);
      expect(b.items[0]).toMatchObject({ kind: 'snapshot', complete: true, statuses: [{ namespace: 'other' }] });
      const third = collect(c.watch());
      await third.done;
      expect(third.error?.grpcCode).toBe(grpc.status.RESOURCE_EXHAUSTED);
      f.store.upsert(status('s1', 'ns', 'Liveness', 'failure'));
      f.store.upsert(status('s5', 'other', 'Liveness', 'failure'));
      await until(() => a.items.length === 5 && b.items.length === 2, 2000, 'events');
      expect(b.items[1]).toMatchObject({ kind: 'event', event: { revision: 7, status: { namespace: 'other' } } });
    } finally {
      c.close();
      await f.close();
    }
  });

  it('cuts a watcher that stops reading with ABORTED and its resume point; the agent carries on', async () => {
    const f = await startApiFixture({ prober, watcherBufferMessages: 64 });
    const def = loadProbeApi().service['WatchProbeEvents'] as grpc.MethodDefinition<object, { event?: { revision: string } }>;
    const raw = new grpc.Client(`unix:${f.socket}`, grpc.credentials.createInsecure());
    const c = new ProbeApiClient(f.socket);
    try {
      const healthy = collect(c.watch());
      const slow = raw.makeServerStreamRequest(def.path, def.requestSerialize, def.responseDeserialize, {}, new grpc.Metadata());
      const received: number[] = [];
      slow.on('data', (m: { event?: { revision: string } }) => {
        if (m.event) received.push(Number(m.event.revision));
        else slow.pause();
      });
      const ended = once(slow, 'error');
      await until(() => f.server.stats().watchers === 2 && healthy.items.length === 1, 2000, 'two watchers');
      const body = 'x'.repeat(1000);
      for (let i = 0; f.server.stats().watchers === 2 && i < 5000; i++) {
        f.store.upsert(status('slow', 'ns', 'Readiness', i % 2 ? 'success' : 'failure', { lastMessage: body }));
        if (i % 10 === 9) await new Promise((r) => setTimeout(r, 1));
      }
      expect(f.server.stats().watchers).toBe(1);
      const sent = f.store.revision();
      await until(() => healthy.items.length === sent + 1, 5000, 'the healthy watcher to get every event');
      expect((await c.version()).instanceId).toBe(f.server.instanceId);
      slow.resume();
      const [err] = (await ended) as [grpc.ServiceError];
      expect(err.code).toBe(grpc.status.ABORTED);
      const resumeFrom = Number(/resume from revision (\d+)/.exec(err.details)?.[1]);
      expect(received.length).toBeGreaterThan(0);
      expect(received).toEqual(Array.from({ length: received.length }, (_, i) => i + 1));
      expect(resumeFrom).toBe(received.at(-1));
      expect(resumeFrom).toBeLessThan(sent);
    } finally {
      raw.close();
      c.close();
      await f.close();
    }
  });
});

describe('end to end: the probe manager feeds the watch', () => {
  it('sees a transition when a server inside a test pod stops answering, and sees it again after reconnecting with its resume point', async () => {
    const pod1 = lab.pods[0]!;
    const PORT = 7070;
    let server = await lab.startServer(pod1, { tcp: PORT });
    const store = new ResultsStore();
    const nodeSockets = new NodeSocketFactory();
    const manager = new ProbeManager({
      store,
      classify: (p) => classifyPod(p),
      runProbe: (p, container, spec, signal) =>
        runProbe(spec.handler, {
          netns: pod1.netns,
          podIPs: p.podIPs,
          containerPorts: container.ports,
          timeoutSeconds: spec.timeoutSeconds,
          sockets: helper,
          nodeSockets,
          kubeVersion: '1.34',
          hostFieldPolicy: 'refuse',
          happyEyeballs: true,
          signal,
        }),
    });
    const podInfo: PodInfo = {
      uid: 'uid-e2e', namespace: 'e2e', name: 'watched', hostNetwork: false, podIPs: pod1.ips, phase: 'Running',
      restartPolicy: 'Always', isStatic: false, podReady: false,
      containers: [{
        name: 'app', kind: 'regular', ports: [],
        probes: { Readiness: { ok: true, spec: { handler: { kind: 'tcp', port: PORT }, timeoutSeconds: 1, periodSeconds: 1, successThreshold: 1, failureThreshold: 1, initialDelaySeconds: 0 } } },
        state: { containerID: 'containerd://e2e', running: true, startedAt: Date.now() - 60_000, terminated: false, ready: false, restartCount: 0 },
      }],
    };
    const f = await startApiFixture({ prober, store });
    const c = new ProbeApiClient(f.socket);
    const readiness = (m: WatchMessage): ProbeStatus | undefined =>
      m.kind === 'event' ? m.event.status : m.kind === 'snapshot' ? m.statuses[0] : undefined;
    try {
      const ac = new AbortController();
      const w = collect(c.watch({ signal: ac.signal }));
      manager.sync([podInfo]);
      await until(() => w.items.some((m) => readiness(m)?.ready === true), 5000, 'ready');
      await server.stop();
      await until(() => w.items.some((m) => m.kind === 'event' && m.event.status.result === 'failure'), 5000, 'the failure event');
      const failIdx = w.items.findIndex((m) => m.kind === 'event' && m.event.status.result === 'failure');
      const failure = w.items[failIdx] as Extract<WatchMessage, { kind: 'event' }>;
      expect(failure.event).toMatchObject({ type: 'changed', previous: 'success', status: { ready: false, key: { probeType: 'Readiness' } } });
      const before = w.items[failIdx - 1]!;
      const resumeFrom = before.kind === 'event' ? before.event.revision : (before as { revision: number }).revision;
      ac.abort();
      await w.done;

      // While nobody watches, the server comes back and readiness recovers.
      server = await lab.startServer(pod1, { tcp: PORT });
      await until(() => store.list()[0]?.ready === true, 5000, 'recovery in the store');

      const again = collect(c.watch({ fromRevision: resumeFrom, instanceId: f.server.instanceId }));
      await until(() => again.items.length >= 2, 5000, 'the replay');
      expect(again.items.every((m) => m.kind === 'event')).toBe(true);
      expect(again.items[0]).toEqual(failure);
      expect(again.items[1]).toMatchObject({ kind: 'event', event: { type: 'changed', previous: 'failure', status: { result: 'success', ready: true } } });
    } finally {
      await manager.stop();
      await server.stop();
      c.close();
      await f.close();
    }
  });
});
