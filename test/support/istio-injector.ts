/**
 * Test-only stand-in for Istio's sidecar injector, as far as probes go: what istio/istio's
 * `pkg/kube/inject/app_probe.go` and the injection template
 * (`manifests/charts/istio-control/istio-discovery/files/injection-template.yaml`) do to a pod's
 * probes and hooks, re-implemented here from their documented shape (our code, not theirs):
 *
 * - the `istio-init` init container (no probes) and the `istio-proxy` container, a plain container
 *   or, in native-sidecar mode, an init container with `restartPolicy: Always`; its probes are
 *   `httpGet :15021 /healthz/ready` (readiness, plus a startup probe in native mode) and its hooks
 *   are exec (`pilot-agent request ... drain` in native mode);
 * - unless the pod says `sidecar.istio.io/rewriteAppHTTPProbers: "false"`, every httpGet,
 *   tcpSocket and grpc probe and every httpGet/tcpSocket hook of every other container (init
 *   containers included) becomes `httpGet` to pilot-agent's status port 15020 at
 *   `/app-health/<container>/<livez|readyz|startupz|prestopz|poststartz>`, scheme HTTPS turned
 *   into HTTP; exec probes and hooks are left alone;
 * - the originals, named ports resolved against the container's ports, go into the istio-proxy
 *   container's `ISTIO_KUBE_APP_PROBERS` env as JSON, keyed by those paths, with the probe's
 *   `timeoutSeconds`; no env when there is nothing to hand over;
 * - the `sidecar.istio.io/status` annotation naming what was injected; re-injection of a pod that
 *   has it first strips those containers (Istio's `stripPod`), so a re-run starts again from the
 *   pod as it is then.
 *
 * Pure: returns a new pod.
 */

type Obj = Record<string, any>;

export const ISTIO_STATUS_PORT = 15020;
export const ISTIO_PROXY = 'istio-proxy';
export const ISTIO_INIT = 'istio-init';
export const APP_PROBERS_ENV = 'ISTIO_KUBE_APP_PROBERS';
export const REWRITE_APP_PROBERS_ANNOTATION = 'sidecar.istio.io/rewriteAppHTTPProbers';
export const ISTIO_STATUS_ANNOTATION = 'sidecar.istio.io/status';

export interface IstioInjectOptions {
  /** Istio's native-sidecar mode (default since Istio 1.27 on Kubernetes >= 1.29). */
  native?: boolean;
}

const PROBE_PATHS: ReadonlyArray<readonly [field: string, suffix: string]> = [
  ['readinessProbe', 'readyz'],
  ['livenessProbe', 'livez'],
  ['startupProbe', 'startupz'],
];
const HOOK_PATHS: ReadonlyArray<readonly [field: string, suffix: string]> = [
  ['preStop', 'prestopz'],
  ['postStart', 'poststartz'],
];

/** `/app-health/<container>/<suffix>`, pilot-agent's URL for one of a container's probes. */
export const appHealthPath = (container: string, suffix: string): string => `/app-health/${container}/${suffix}`;

/** The handler pilot-agent is given for one original probe or hook (named port resolved), or null when it is not a network one. */
function proberFor(holder: Obj | undefined, container: Obj, withTimeout: boolean): Obj | null {
  if (!holder) return null;
  const resolve = (action: Obj): Obj => {
    if (typeof action.port !== 'string') return { ...action };
    const named = (container.ports ?? []).find((p: Obj) => p.name === action.port);
    return named ? { ...action, port: named.containerPort } : { ...action };
  };
  const timeout = withTimeout && holder.timeoutSeconds ? { timeoutSeconds: holder.timeoutSeconds } : {};
  if (holder.httpGet) return { httpGet: resolve(holder.httpGet), ...timeout };
  if (holder.tcpSocket) return { tcpSocket: resolve(holder.tcpSocket), ...timeout };
  if (holder.grpc) return { grpc: { ...holder.grpc }, ...timeout };
  return null;
}

/** A probe or hook turned into Istio's httpGet to pilot-agent (the rest of the probe kept). */
function toAppHealth(holder: Obj, path: string): Obj {
  const out: Obj = {};
  for (const [k, v] of Object.entries(holder)) {
    if (k === 'tcpSocket' || k === 'grpc') out.httpGet = { path, port: ISTIO_STATUS_PORT };
    else if (k === 'httpGet') {
      const next: Obj = { ...v, path, port: ISTIO_STATUS_PORT };
      if (next.scheme === 'HTTPS') next.scheme = 'HTTP';
      out.httpGet = next;
    } else out[k] = v;
  }
  return out;
}

/** The pod with the containers a previous injection added removed (Istio's re-injection). */
function stripped(pod: Obj): Obj {
  const status = pod.metadata?.annotations?.[ISTIO_STATUS_ANNOTATION];
  if (typeof status !== 'string') return pod;
  const injected = JSON.parse(status) as { containers: string[]; initContainers: string[] };
  const out = structuredClone(pod);
  out.spec.containers = out.spec.containers.filter((c: Obj) => !injected.containers.includes(c.name));
  if (out.spec.initContainers) {
    out.spec.initContainers = out.spec.initContainers.filter((c: Obj) => !injected.initContainers.includes(c.name));
    if (out.spec.initContainers.length === 0) delete out.spec.initContainers;
  }
  delete out.metadata.annotations[ISTIO_STATUS_ANNOTATION];
  return out;
}

/** Injects Istio's sidecar into `input` and rewrites its probes as Istio's injector does. */
export function istioInject(input: Obj, options: IstioInjectOptions = {}): Obj {
  const pod = structuredClone(stripped(input));
  const annotations: Obj = (pod.metadata.annotations ??= {});
  const rewrite = annotations[REWRITE_APP_PROBERS_ANNOTATION] !== 'false';
  const apps: Obj[] = [...(pod.spec.initContainers ?? []), ...pod.spec.containers];

  const probers: Obj = {};
  for (const c of apps) {
    for (const [field, suffix] of PROBE_PATHS) {
      const p = proberFor(c[field], c, true);
      if (p) probers[appHealthPath(c.name, suffix)] = p;
    }
    for (const [field, suffix] of HOOK_PATHS) {
      const p = proberFor(c.lifecycle?.[field], c, false);
      if (p) probers[appHealthPath(c.name, suffix)] = p;
    }
  }
  if (rewrite) {
    for (const c of apps) {
      for (const [field, suffix] of PROBE_PATHS) {
        if (proberFor(c[field], c, true)) c[field] = toAppHealth(c[field], appHealthPath(c.name, suffix));
      }
      for (const [field, suffix] of HOOK_PATHS) {
        if (proberFor(c.lifecycle?.[field], c, false)) c.lifecycle[field] = toAppHealth(c.lifecycle[field], appHealthPath(c.name, suffix));
      }
    }
  }

  const env: Obj[] = [
    { name: 'POD_NAME', valueFrom: { fieldRef: { fieldPath: 'metadata.name' } } },
    { name: 'INSTANCE_IP', valueFrom: { fieldRef: { fieldPath: 'status.podIP' } } },
    { name: 'ISTIO_META_APP_CONTAINERS', value: pod.spec.containers.map((c: Obj) => c.name).join(',') },
  ];
  if (rewrite && Object.keys(probers).length > 0) env.push({ name: APP_PROBERS_ENV, value: JSON.stringify(probers) });
  const readiness = { httpGet: { path: '/healthz/ready', port: 15021 }, initialDelaySeconds: 0, periodSeconds: 15, timeoutSeconds: 3, failureThreshold: 4 };
  const proxy: Obj = {
    name: ISTIO_PROXY,
    image: 'docker.io/istio/proxyv2:1.28.0',
    ...(options.native ? { restartPolicy: 'Always' } : {}),
    args: ['proxy', 'sidecar', '--domain', '$(POD_NAMESPACE).svc.cluster.local'],
    ports: [{ containerPort: 15090, name: 'http-envoy-prom', protocol: 'TCP' }],
    env,
    ...(options.native
      ? {
          lifecycle: { preStop: { exec: { command: ['pilot-agent', 'request', '--debug-port=15020', 'POST', 'drain'] } } },
          startupProbe: { httpGet: { path: '/healthz/ready', port: 15021 }, initialDelaySeconds: 0, periodSeconds: 1, timeoutSeconds: 3, failureThreshold: 600 },
        }
      : {}),
    readinessProbe: readiness,
    securityContext: { runAsUser: 1337, runAsGroup: 1337, runAsNonRoot: true },
  };
  const init: Obj = {
    name: ISTIO_INIT,
    image: 'docker.io/istio/proxyv2:1.28.0',
    args: ['istio-iptables', '-p', '15001', '-z', '15006', '-u', '1337', '-m', 'REDIRECT', '-i', '*', '-x', '', '-b', '*', '-d', '15090,15021,15020'],
    securityContext: { capabilities: { add: ['NET_ADMIN', 'NET_RAW'], drop: ['ALL'] }, runAsUser: 0, runAsNonRoot: false },
  };
  pod.spec.initContainers = [init, ...(options.native ? [proxy] : []), ...(pod.spec.initContainers ?? [])];
  if (!options.native) pod.spec.containers.push(proxy);
  annotations[ISTIO_STATUS_ANNOTATION] = JSON.stringify({
    initContainers: options.native ? [ISTIO_INIT, ISTIO_PROXY] : [ISTIO_INIT],
    containers: options.native ? [] : [ISTIO_PROXY],
    volumes: [],
    imagePullSecrets: null,
    revision: 'default',
  });
  return pod;
}

/** The container named `name` among the pod's init containers and containers. */
export function containerOf(pod: Obj, name: string): Obj | undefined {
  return [...(pod.spec.initContainers ?? []), ...pod.spec.containers].find((c: Obj) => c.name === name);
}

/** The parsed ISTIO_KUBE_APP_PROBERS of the pod's istio-proxy container, or undefined when it has none. */
export function appProbers(pod: Obj): Obj | undefined {
  const value = containerOf(pod, ISTIO_PROXY)?.env?.find((e: Obj) => e.name === APP_PROBERS_ENV)?.value;
  return typeof value === 'string' ? JSON.parse(value) : undefined;
}
