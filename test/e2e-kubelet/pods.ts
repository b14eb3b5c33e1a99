/**
 * The static pods of `make e2e-kubelet`, as a user writes them (network probes and hooks); the run
 * rewrites them with `probe-agent rewrite` before kubelet sees them. Every container runs the lab's
 * busybox image: `httpd -f -vv` serves /www and logs each request's URL and status to the
 * container log, which is how the run sees the hooks arrive.
 */
import { BUSYBOX_IMAGE_REF } from '../lab/busybox-image.ts';

/** The port every server listens on. */
export const HTTP_PORT = 8080;

const serve = ['/bin/busybox', 'sh', '-c', `mkdir -p /www && echo ok > /www/ready && exec /bin/busybox httpd -f -vv -p ${HTTP_PORT} -h /www`];
const fast = { periodSeconds: 1, timeoutSeconds: 1, successThreshold: 1, failureThreshold: 1 };

function server(name: string, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    name,
    image: BUSYBOX_IMAGE_REF,
    imagePullPolicy: 'Never',
    command: serve,
    ports: [{ name: 'http', containerPort: HTTP_PORT, protocol: 'TCP' }],
    ...extra,
  };
}

function pod(name: string, containers: Record<string, unknown>[], grace = 2): Record<string, unknown> {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name, namespace: 'default', labels: { app: 'probe-agent-e2e' } },
    spec: { containers, dnsPolicy: 'Default', restartPolicy: 'Always', terminationGracePeriodSeconds: grace },
  };
}

/** What each pod checks (the run's table names them). */
export const PODS = {
  /** HTTP readiness on a numeric port, TCP liveness: Ready at once, never restarted. */
  webNum: 'web-num',
  /** HTTP readiness on a named port. */
  webNamed: 'web-named',
  /** kubelet's own exec readiness (not rewritten, passed through): the pace kubelet sets itself. */
  webExec: 'web-exec',
  /** HTTP liveness answered 404: kubelet must restart it, running its preStop httpGet hook first. */
  crashy: 'crashy',
  /** A postStart httpGet hook of `app`, served by `server` (started before it). */
  hooks: 'hooks',
} as const;

/** The pods, before the rewrite. */
export function e2ePods(): Record<string, unknown>[] {
  return [
    pod(PODS.webNum, [server('app', {
      readinessProbe: { httpGet: { path: '/ready', port: HTTP_PORT }, ...fast },
      livenessProbe: { tcpSocket: { port: HTTP_PORT }, ...fast, failureThreshold: 3 },
    })]),
    pod(PODS.webNamed, [server('app', {
      readinessProbe: { httpGet: { path: '/ready', port: 'http', httpHeaders: [{ name: 'X-E2E', value: 'named' }] }, ...fast },
    })]),
    pod(PODS.webExec, [server('app', {
      readinessProbe: { exec: { command: ['/bin/cat', '/www/ready'] }, ...fast },
    })]),
    // Kubelet runs a container's preStop before every kill, a liveness kill included: its own
    // server (still up then) logs the hook's request.
    pod(PODS.crashy, [server('app', {
      livenessProbe: { httpGet: { path: '/no-such-page', port: HTTP_PORT }, ...fast },
      lifecycle: { preStop: { httpGet: { path: '/prestop', port: 'http', httpHeaders: [{ name: 'X-E2E', value: 'hook' }] } } },
    })], 5),
    pod(PODS.hooks, [
      server('server'),
      {
        name: 'app',
        image: BUSYBOX_IMAGE_REF,
        imagePullPolicy: 'Never',
        command: ['/bin/sleep', 'infinity'],
        lifecycle: { postStart: { httpGet: { path: '/poststart', port: HTTP_PORT, httpHeaders: [{ name: 'X-E2E', value: 'hook' }] } } },
      },
    ]),
  ];
}

/** A churn pod (issue 24): rewritten readiness on a named port and TCP liveness, every second. */
export function churnPod(name: string): Record<string, unknown> {
  return pod(name, [server('app', {
    readinessProbe: { httpGet: { path: '/ready', port: 'http' }, ...fast },
    livenessProbe: { tcpSocket: { port: HTTP_PORT }, ...fast, failureThreshold: 3 },
  })]);
}
