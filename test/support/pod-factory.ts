/**
 * Builds kubelet-shaped v1.Pod JSON for tests: one pod with chosen traits, or N distinct pods for
 * scale tests. The shape follows what GET /pods returns (see test/fixtures/podlist-node.json).
 */
import { createHash } from 'node:crypto';

/** Traits of a generated pod; everything else gets realistic defaults. */
export interface PodTraits {
  name?: string;
  namespace?: string;
  uid?: string;
  /** Pod IPs, primary first; [] = status has not caught up yet (no podIP). */
  ips?: string[];
  hostNetwork?: boolean;
  runtimeClassName?: string;
  /** Which probe the "app" container carries. */
  probe?: 'http' | 'tcp' | 'grpc' | 'exec' | 'none';
  /** Container port of the app (named "http"). */
  port?: number;
  containerID?: string;
  restartCount?: number;
  ready?: boolean;
  phase?: string;
  /** Drop status.containerStatuses (the apiserver copy lags). */
  noContainerStatuses?: boolean;
  deletionTimestamp?: string;
  /** Add a restartable init container "proxy" with a TCP readiness probe. */
  sidecar?: boolean;
}

const CREATED = '2025-11-20T08:00:00Z';
const STARTED = '2025-11-20T08:00:05Z';

/** A deterministic UUID-shaped UID from a seed (stable across runs, distinct per seed). */
export function uidFor(seed: string): string {
  const h = createHash('sha256').update(seed).digest('hex');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-4${h.slice(13, 16)}-8${h.slice(17, 20)}-${h.slice(20, 32)}`;
}

/** One v1.Pod as the kubelet lists it. */
export function makePod(t: PodTraits = {}): Record<string, unknown> {
  const name = t.name ?? 'app-0';
  const namespace = t.namespace ?? 'default';
  const uid = t.uid ?? uidFor(`${namespace}/${name}`);
  const port = t.port ?? 8080;
  const ips = t.ips ?? ['10.244.1.10'];
  const ready = t.ready ?? true;
  const containerID = t.containerID ?? `containerd://${createHash('sha256').update(`${uid}/app/${t.restartCount ?? 0}`).digest('hex')}`;
  const app: Record<string, unknown> = {
    name: 'app',
    image: 'registry.example/app:1.4.2',
    ports: [{ name: 'http', containerPort: port, protocol: 'TCP' }],
    resources: { requests: { cpu: '50m', memory: '64Mi' } },
    terminationMessagePath: '/dev/termination-log',
    terminationMessagePolicy: 'File',
    imagePullPolicy: 'IfNotPresent',
    ...probeFields(t.probe ?? 'http', port),
  };
  const spec: Record<string, unknown> = {
    containers: [app],
    restartPolicy: 'Always',
    terminationGracePeriodSeconds: 30,
    dnsPolicy: 'ClusterFirst',
    serviceAccountName: 'default',
    nodeName: 'node-a',
    schedulerName: 'default-scheduler',
    enableServiceLinks: true,
  };
  if (t.hostNetwork) spec['hostNetwork'] = true;
  if (t.runtimeClassName) spec['runtimeClassName'] = t.runtimeClassName;
  const initStatuses: unknown[] = [];
  if (t.sidecar) {
    spec['initContainers'] = [{
      name: 'proxy', image: 'registry.example/proxy:2.0', restartPolicy: 'Always',
      ports: [{ name: 'admin', containerPort: 15000, protocol: 'TCP' }],
      readinessProbe: { tcpSocket: { port: 'admin' }, timeoutSeconds: 1, periodSeconds: 10, successThreshold: 1, failureThreshold: 3 },
    }];
    initStatuses.push(containerStatus('proxy', `containerd://${createHash('sha256').update(`${uid}/proxy`).digest('hex')}`, 0, ready));
  }
  const status: Record<string, unknown> = {
    phase: t.phase ?? (ips.length ? 'Running' : 'Pending'),
    conditions: [
      { type: 'PodScheduled', status: 'True', lastProbeTime: null, lastTransitionTime: CREATED },
      { type: 'Ready', status: ready ? 'True' : 'False', lastProbeTime: null, lastTransitionTime: STARTED },
    ],
    hostIP: '192.168.56.11',
    hostIPs: [{ ip: '192.168.56.11' }],
    qosClass: 'Burstable',
    startTime: CREATED,
  };
  if (ips.length) {
    status['podIP'] = ips[0];
    status['podIPs'] = ips.map((ip) => ({ ip }));
  }
  if (!t.noContainerStatuses && ips.length) {
    status['containerStatuses'] = [containerStatus('app', containerID, t.restartCount ?? 0, ready)];
    if (initStatuses.length) status['initContainerStatuses'] = initStatuses;
  }
  const metadata: Record<string, unknown> = {
    name,
    namespace,
    uid,
    resourceVersion: '4711',
    creationTimestamp: CREATED,
    labels: { app: name.replace(/-\d+$/, '') },
    annotations: { 'kubernetes.io/config.seen': CREATED, 'kubernetes.io/config.source': 'api' },
  };
  if (t.deletionTimestamp) {
    metadata['deletionTimestamp'] = t.deletionTimestamp;
    metadata['deletionGracePeriodSeconds'] = 30;
  }
  return { metadata, spec, status };
}

/** `n` distinct pods (app-0..app-n-1) with IPs from 10.244.0.0/16; `traits` apply to every pod. */
export function makePods(n: number, traits: Omit<PodTraits, 'name' | 'uid' | 'ips'> = {}): Record<string, unknown>[] {
  return Array.from({ length: n }, (_, i) => makePod({
    ...traits,
    name: `app-${i}`,
    ips: [`10.244.${Math.floor(i / 250) % 256}.${(i % 250) + 2}`],
  }));
}

function probeFields(kind: NonNullable<PodTraits['probe']>, port: number): Record<string, unknown> {
  const timing = { timeoutSeconds: 1, periodSeconds: 10, successThreshold: 1, failureThreshold: 3 };
  switch (kind) {
    case 'http':
      return {
        livenessProbe: { httpGet: { path: '/healthz', port: 'http', scheme: 'HTTP' }, ...timing },
        readinessProbe: { httpGet: { path: '/ready', port, scheme: 'HTTP' }, ...timing },
      };
    case 'tcp':
      return { livenessProbe: { tcpSocket: { port }, ...timing } };
    case 'grpc':
      return { readinessProbe: { grpc: { port, service: '' }, ...timing } };
    case 'exec':
      return { livenessProbe: { exec: { command: ['cat', '/tmp/healthy'] }, ...timing } };
    case 'none':
      return {};
  }
}

function containerStatus(name: string, containerID: string, restartCount: number, ready: boolean): Record<string, unknown> {
  return {
    name,
    state: { running: { startedAt: STARTED } },
    lastState: {},
    ready,
    restartCount,
    image: `registry.example/${name}:1.4.2`,
    imageID: `registry.example/${name}@sha256:${createHash('sha256').update(name).digest('hex')}`,
    containerID,
    started: true,
  };
}
