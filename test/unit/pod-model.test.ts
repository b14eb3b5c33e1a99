import { readFileSync } from 'node:fs';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { KubeletError } from '../../agent/pods/kubelet-client.ts';
import { classifyPod, parsePodList } from '../../agent/pods/pod-model.ts';
import type { PodInfo } from '../../agent/pods/types.ts';
import { deepEqual } from '../../agent/pods/source.ts';
import { makePod, makePods } from '../support/pod-factory.ts';
import { podList } from '../support/fake-kubelet.ts';

const fixture = (name: string): Record<string, unknown> =>
  JSON.parse(readFileSync(new URL(`../fixtures/${name}`, import.meta.url), 'utf8')) as Record<string, unknown>;

const node = parsePodList(fixture('podlist-node.json'));
const byName = (name: string): PodInfo => {
  const pod = node.pods.find((p) => p.name === name);
  if (!pod) throw new Error(`fixture pod ${name} missing`);
  return pod;
};

describe('parsePodList on a realistic node list', () => {
  it('parses every pod of the list without errors', () => {
    expect(node.errors).toEqual([]);
    expect(node.pods).toHaveLength(12);
  });

  it('maps a Deployment pod: identity, IP, named port, probes with defaults, container state', () => {
    const web = byName('web-7d9f8b6c5d-x2k4p');
    expect(web).toMatchObject({
      uid: '3b8e6c1a-9f2d-4e7b-a5c3-2d1f0e9b8a71', namespace: 'default', hostNetwork: false,
      podIPs: ['10.244.1.17'], phase: 'Running', restartPolicy: 'Always', isStatic: false, podReady: true,
    });
    expect(web.deletionTimestamp).toBeUndefined();
    const c = web.containers[0]!;
    expect(c.name).toBe('web');
    expect(c.kind).toBe('regular');
    expect(c.ports).toEqual([
      { name: 'http', containerPort: 8080, protocol: 'TCP' },
      { name: 'metrics', containerPort: 9100, protocol: 'TCP' },
    ]);
    const live = c.probes.Liveness;
    expect(live?.ok).toBe(true);
    if (!live?.ok) return;
    expect(live.spec.handler).toMatchObject({ kind: 'http', port: 'http', path: '/healthz', scheme: 'HTTP' });
    expect(live.spec).toMatchObject({ initialDelaySeconds: 5, periodSeconds: 15, timeoutSeconds: 1, failureThreshold: 3 });
    const ready = c.probes.Readiness;
    expect(ready?.ok && ready.spec.handler).toMatchObject({ kind: 'http', port: 8080, headers: [{ name: 'X-Probe', value: 'readiness' }] });
    expect(c.probes.Startup).toBeUndefined();
    expect(c.state).toEqual({
      containerID: expect.stringMatching(/^containerd:\/\/[0-9a-f]{64}$/),
      running: true, startedAt: Date.parse('2025-11-20T08:00:03Z'), terminated: false, started: true, ready: true, restartCount: 0,
    });
  });

  it('keeps both families of a dual-stack pod, primary first, and reads restarts and gRPC probes', () => {
    const api = byName('api-0');
    expect(api.podIPs).toEqual(['10.244.1.23', 'fd00:10:244:1::17']);
    const c = api.containers[0]!;
    expect(c.state?.restartCount).toBe(2);
    expect(c.probes.Readiness?.ok && c.probes.Readiness.spec.handler).toEqual({ kind: 'grpc', port: 9090, service: 'payments.v1.Ledger' });
    expect(c.probes.Startup?.ok && c.probes.Startup.spec).toMatchObject({ handler: { kind: 'grpc', port: 9090 }, failureThreshold: 30, periodSeconds: 2 });
    expect(c.probes.Liveness?.ok && c.probes.Liveness.spec.handler).toEqual({ kind: 'tcp', port: 9000 });
  });

  it('recognises static pods (file source with mirror annotation) and keeps the host field', () => {
    const etcd = byName('etcd-node-a');
    expect(etcd.isStatic).toBe(true);
    expect(etcd.hostNetwork).toBe(true);
    expect(etcd.containers[0]!.probes.Liveness?.ok && etcd.containers[0]!.probes.Liveness.spec.handler).toMatchObject({ host: '127.0.0.1', port: 2381 });
    const staticWeb = byName('static-web-node-a');
    expect(staticWeb).toMatchObject({ isStatic: true, hostNetwork: false, podIPs: ['10.244.1.5'] });
    expect(classifyPod(staticWeb)).toBeUndefined();
  });

  it('treats a pod with only the mirror annotation as static, and an api pod as not', () => {
    const mirror = makePod({ name: 'mirror-only' });
    (mirror['metadata'] as Record<string, Record<string, string>>)['annotations'] = {
      'kubernetes.io/config.source': 'api', 'kubernetes.io/config.mirror': 'abc',
    };
    const plain = makePod({ name: 'plain' });
    const { pods } = parsePodList(podList([mirror, plain]));
    expect(pods.map((p) => [p.name, p.isStatic])).toEqual([['mirror-only', true], ['plain', false]]);
  });

  it('takes restartable init containers as sidecars with their init status, and skips ordinary init containers', () => {
    const shop = byName('shop-5f6c7d8b9-q7w2e');
    expect(shop.containers.map((c) => [c.name, c.kind])).toEqual([['shop', 'regular'], ['log-shipper', 'sidecar']]);
    const sidecar = shop.containers[1]!;
    expect(sidecar.ports).toEqual([{ name: 'metrics', containerPort: 2020, protocol: 'TCP' }]);
    expect(sidecar.probes.Readiness?.ok && sidecar.probes.Readiness.spec.handler).toMatchObject({ kind: 'http', port: 'metrics', path: '/api/v1/health' });
    expect(sidecar.probes.Startup?.ok).toBe(true);
    expect(sidecar.state).toMatchObject({ running: true, started: true, ready: true });
    expect(sidecar.state?.containerID).toMatch(/^containerd:\/\//);
  });

  it('keeps a pod whose status lags: no IPs, no container state, phase Pending', () => {
    const lag = byName('web-7d9f8b6c5d-n8v3m');
    expect(lag.podIPs).toEqual([]);
    expect(lag.phase).toBe('Pending');
    expect(lag.podReady).toBe(false);
    expect(lag.containers[0]!.state).toBeUndefined();
    expect(lag.containers[0]!.probes.Liveness?.ok).toBe(true);
    expect(classifyPod(lag)).toBeUndefined();
  });

  it('reads the deletion timestamp of a terminating pod', () => {
    expect(byName('web-7d9f8b6c5d-h5t6r').deletionTimestamp).toBe(Date.parse('2025-11-20T08:02:30Z'));
  });

  it('reads terminated containers and the restart policy of a finished Job pod', () => {
    const job = byName('report-29391840-7fjq5');
    expect(job).toMatchObject({ phase: 'Succeeded', restartPolicy: 'Never', podReady: false });
    expect(job.containers[0]!.state).toMatchObject({ running: false, terminated: true, ready: false, started: false });
    expect(job.containers[0]!.state?.startedAt).toBeUndefined();
  });

  it('reads a container whose startup probe has not passed yet as not started', () => {
    const search = byName('search-0');
    expect(search.containers[0]!.state).toMatchObject({ running: true, started: false, ready: false });
    expect(search.containers[0]!.probes.Readiness?.ok && search.containers[0]!.probes.Readiness.spec.handler).toMatchObject({ scheme: 'HTTPS', port: 'https' });
  });
});

describe('classifyPod', () => {
  const cases: [string, ReturnType<typeof classifyPod>][] = [
    ['web-7d9f8b6c5d-x2k4p', undefined],
    ['api-0', undefined],
    ['etcd-node-a', 'host-network'],
    ['kube-proxy-9xkq2', 'host-network'],
    ['redis-0', 'exec-only'],
    ['report-29391840-7fjq5', 'no-network-probes'],
    ['untrusted-build-6c4d9', 'sandboxed-runtime'],
    ['search-0', undefined],
    ['shop-5f6c7d8b9-q7w2e', undefined],
  ];
  it.each(cases)('%s -> %s', (name, want) => {
    expect(classifyPod(byName(name))).toBe(want);
  });

  it('uses the configured sandboxed runtime class list', () => {
    const pod = byName('untrusted-build-6c4d9');
    expect(classifyPod(pod, { sandboxedRuntimeClasses: ['kata'] })).toBeUndefined();
    const { pods } = parsePodList(podList([makePod({ runtimeClassName: 'kata' })]));
    expect(classifyPod(pods[0]!, { sandboxedRuntimeClasses: ['kata'] })).toBe('sandboxed-runtime');
    expect(classifyPod(pods[0]!, { sandboxedRuntimeClasses: [] })).toBeUndefined();
  });

  it('counts a sidecar-only network probe as ours', () => {
    const { pods } = parsePodList(podList([makePod({ probe: 'exec', sidecar: true })]));
    expect(classifyPod(pods[0]!)).toBeUndefined();
  });

  it('counts an invalid probe as ours, so that its error is reported', () => {
    const raw = makePod({ probe: 'none' });
    ((raw['spec'] as { containers: Record<string, unknown>[] }).containers[0]!)['readinessProbe'] = { httpGet: { port: 0 } };
    const { pods } = parsePodList(podList([raw]));
    expect(classifyPod(pods[0]!)).toBeUndefined();
  });
});

describe('parsePodList tolerance and strictness', () => {
  const mal = parsePodList(fixture('podlist-malformed.json'));

  it('keeps good pods next to malformed ones', () => {
    expect(mal.pods.map((p) => p.name).sort()).toEqual(['bad-probe-0', 'good-0']);
  });

  it('turns an invalid probe into an error on that container only', () => {
    const pod = mal.pods.find((p) => p.name === 'bad-probe-0')!;
    const probes = pod.containers[0]!.probes;
    expect(probes.Liveness).toEqual({ ok: false, error: expect.stringMatching(/livenessProbe\.httpGet\.port.*1\.\.65535/) });
    expect(probes.Startup).toEqual({ ok: false, error: expect.stringMatching(/startupProbe\.successThreshold/) });
    expect(probes.Readiness?.ok).toBe(true);
  });

  it('reports each malformed pod with its identity and the offending field', () => {
    const errs = mal.errors;
    expect(errs).toHaveLength(5);
    expect(errs.find((e) => e.name === 'no-uid-0')).toMatchObject({ namespace: 'default', error: expect.stringMatching(/metadata\.uid: required/) });
    expect(errs.find((e) => e.name === 'containers-object-0')).toMatchObject({
      uid: '33333333-4444-4555-8666-777777777777', error: expect.stringMatching(/spec\.containers: must be a list/),
    });
    expect(errs.find((e) => e.name === 'bad-ip-0')?.error).toMatch(/status\.podIPs\[0\]\.ip: not an IP address/);
    expect(errs.find((e) => e.name === 'bad-time-0')?.error).toMatch(/startedAt: not an RFC 3339 time/);
    expect(errs.find((e) => e.name === undefined)?.error).toMatch(/^items\[6\]: pod: must be an object, got string/);
  });

  it('rejects a duplicate UID and duplicate container names as pod errors', () => {
    const a = makePod({ name: 'a', uid: 'same' });
    const b = makePod({ name: 'b', uid: 'same' });
    const dup = makePod({ name: 'dup' });
    const spec = dup['spec'] as { containers: Record<string, unknown>[] };
    spec.containers.push({ ...spec.containers[0]! });
    const out = parsePodList(podList([a, b, dup]));
    expect(out.pods.map((p) => p.name)).toEqual(['a']);
    expect(out.errors.map((e) => e.error)).toEqual([
      expect.stringMatching(/duplicate uid same/),
      expect.stringMatching(/duplicate container name "app"/),
    ]);
  });

  it('falls back to status.podIP when podIPs is absent', () => {
    const raw = makePod({ ips: ['10.244.1.9'] });
    delete (raw['status'] as Record<string, unknown>)['podIPs'];
    expect(parsePodList(podList([raw])).pods[0]!.podIPs).toEqual(['10.244.1.9']);
  });

  it('refuses answers that are not a v1 PodList with a typed error', () => {
    const bad: unknown[] = [null, [], 'PodList', { kind: 'Pod' }, { kind: 'PodList', apiVersion: 'v2', items: [] }, { kind: 'PodList', items: {} }];
    for (const json of bad) {
      expect(() => parsePodList(json)).toThrow(KubeletError);
      try {
        parsePodList(json);
      } catch (err) {
        expect((err as KubeletError).kind).toBe('malformed');
      }
    }
    expect(parsePodList({ kind: 'PodList', apiVersion: 'v1', metadata: {} })).toEqual({ pods: [], errors: [] });
  });

  it('bounds the pod count, containers per pod and ports per container', () => {
    // Beyond the pod cap a pod is dropped alone (reported), the others kept: never the whole list.
    const over = parsePodList(podList(makePods(11)), { maxPods: 10 });
    expect(over.pods).toHaveLength(10);
    expect(over.errors).toEqual([expect.objectContaining({ reason: 'too-many', error: 'items[10]: pod beyond the cap of 10 pods per list' })]);
    const sidecar = parsePodList(podList([makePod({ sidecar: true })]), { maxContainersPerPod: 1 });
    expect(sidecar.errors[0]?.error).toMatch(/2 containers, more than the cap of 1/);
    const ports = parsePodList(podList([makePod()]), { maxPortsPerContainer: 0 });
    expect(ports.errors[0]?.error).toMatch(/ports: 1 ports, more than the cap of 0/);
  });

  it('never throws on arbitrary items: every item becomes a pod or an error', () => {
    fc.assert(fc.property(fc.array(fc.anything(), { maxLength: 8 }), (items) => {
      const out = parsePodList(podList(items));
      expect(out.pods.length + out.errors.length).toBe(items.length);
    }), { numRuns: 300 });
  });

  it('survives random corruption of one field of a real pod, never crashing and never losing its neighbour', () => {
    const base = fixture('podlist-node.json')['items'] as Record<string, unknown>[];
    const paths = collectPaths(base[0]);
    fc.assert(fc.property(fc.constantFrom(...paths), fc.anything(), (path, value) => {
      const victim = structuredClone(base[0]) as Record<string, unknown>;
      setPath(victim, path, value);
      const out = parsePodList(podList([victim, base[1]]));
      expect(out.pods.length + out.errors.length).toBe(2);
      expect(out.pods.some((p) => p.name === 'api-0')).toBe(true);
    }), { numRuns: 400 });
  });

  it('parses 5000 generated pods quickly and equal lists compare equal', () => {
    const raw = podList(makePods(5000, { sidecar: true }));
    const t0 = performance.now();
    const a = parsePodList(raw);
    const elapsed = performance.now() - t0;
    expect(a.errors).toEqual([]);
    expect(a.pods).toHaveLength(5000);
    expect(new Set(a.pods.map((p) => p.uid)).size).toBe(5000);
    // A liveness bound (no quadratic blow-up); parse speed is measured by make bench.
    expect(elapsed).toBeLessThan(30_000);
    const b = parsePodList(structuredClone(raw));
    expect(a.pods.every((p, i) => deepEqual(p, b.pods[i]))).toBe(true);
  });
});

function collectPaths(v: unknown, prefix: (string | number)[] = [], out: (string | number)[][] = []): (string | number)[][] {
  if (prefix.length > 0) out.push(prefix);
  if (typeof v === 'object' && v !== null && prefix.length < 7) {
    for (const [k, child] of Object.entries(v)) collectPaths(child, [...prefix, Array.isArray(v) ? Number(k) : k], out);
  }
  return out;
}

function setPath(root: Record<string, unknown>, path: (string | number)[], value: unknown): void {
  let cur: Record<string | number, unknown> = root;
  for (const key of path.slice(0, -1)) cur = cur[key] as Record<string | number, unknown>;
  cur[path.at(-1)!] = value;
}
