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
export const fast = { periodSeconds: 1, timeoutSeconds: 1, successThreshold: 1, failureThreshold: 1 };

export function server(name: string, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    name,
    image: BUSYBOX_IMAGE_REF,
    imagePullPolicy: 'Never',
    command: serve,
    ports: [{ name: 'http', containerPort: HTTP_PORT, protocol: 'TCP' }],
    ...extra,
  };
}

function pod(name: string, containers: Record<string, unknown>[], grace = 2, initContainers?: Record<string, unknown>[]): Record<string, unknown> {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name, namespace: 'default', labels: { app: 'probe-agent-e2e' } },
    spec: { ...(initContainers ? { initContainers } : {}), containers, dnsPolicy: 'Default', restartPolicy: 'Always', terminationGracePeriodSeconds: grace },
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

/** The churn's control pod: readiness by kubelet's own exec probe (passed through the shim, not rewritten). */
export function churnControlPod(name: string): Record<string, unknown> {
  return pod(name, [server('app', {
    readinessProbe: { exec: { command: ['/bin/cat', '/www/ready'] }, ...fast },
  })]);
}

/** The cases of issue 25 a standalone kubelet can run. */
export const CASE_PODS = {
  /** A restartable init container (kubelet >= 1.29) with rewritten startup/readiness/liveness probes. */
  sidecar: 'sidecar',
  /** A lifecycle sleep preStop next to a rewritten httpGet postStart. */
  sleepHook: 'sleep-hook',
  /** Rewritten liveness probes against a port that hangs and one that answers 500 (the ExecProbeTimeout gate off). */
  gateHang: 'gate-hang',
  gate500: 'gate-500',
} as const;

/** Seconds the sleep-hook pod's server container sleeps in its preStop. */
export const PRESTOP_SLEEP_SECONDS = 3;

// busybox httpd runs /www/cgi-bin/*: one never answers, one answers 500.
const cgi = [
  'mkdir -p /www/cgi-bin',
  'printf "#!/bin/sh\\nsleep 30\\n" > /www/cgi-bin/hang',
  // CRLF: busybox passes a CGI's header lines through as written, and a bare LF is not HTTP/1.1.
  'printf \'#!/bin/sh\\nprintf "Status: 500 Internal Server Error\\\\r\\\\n\\\\r\\\\nboom\\\\n"\\n\' > /www/cgi-bin/boom',
  'chmod +x /www/cgi-bin/hang /www/cgi-bin/boom',
].join(' && ');
const serveCgi = ['/bin/busybox', 'sh', '-c', `${cgi} && echo ok > /www/ready && exec /bin/busybox httpd -f -vv -p ${HTTP_PORT} -h /www`];
// PID 1 ignores SIGTERM without a handler: trap it so the container ends as soon as kubelet stops it
// (after the preStop), which is what the sleep-hook case times.
const serveTrapped = ['/bin/busybox', 'sh', '-c', `mkdir -p /www && echo ok > /www/ready && /bin/busybox httpd -f -vv -p ${HTTP_PORT} -h /www & trap "exit 0" TERM; wait`];

export function casePods(): Record<string, Record<string, unknown>> {
  return {
    [CASE_PODS.sidecar]: pod(CASE_PODS.sidecar, [{ name: 'app', image: BUSYBOX_IMAGE_REF, imagePullPolicy: 'Never', command: ['/bin/sleep', 'infinity'] }], 2, [
      server('sidecar', {
        restartPolicy: 'Always',
        startupProbe: { httpGet: { path: '/ready', port: 'http' }, ...fast, failureThreshold: 30 },
        readinessProbe: { httpGet: { path: '/ready', port: 'http' }, ...fast },
        livenessProbe: { tcpSocket: { port: HTTP_PORT }, ...fast, failureThreshold: 3 },
      }),
      // Runs only once the sidecar is started: it must find the sidecar serving.
      { name: 'after', image: BUSYBOX_IMAGE_REF, imagePullPolicy: 'Never', command: ['/bin/wget', '-q', '-O', '-', `http://127.0.0.1:${HTTP_PORT}/ready`] },
    ]),
    [CASE_PODS.sleepHook]: pod(CASE_PODS.sleepHook, [
      server('server', { command: serveTrapped, lifecycle: { preStop: { sleep: { seconds: PRESTOP_SLEEP_SECONDS } } } }),
      {
        name: 'app', image: BUSYBOX_IMAGE_REF, imagePullPolicy: 'Never', command: ['/bin/sleep', 'infinity'],
        lifecycle: {
          postStart: { httpGet: { path: '/poststart', port: HTTP_PORT, httpHeaders: [{ name: 'X-E2E', value: 'hook' }] } },
          preStop: { sleep: { seconds: 1 } },
        },
      },
    ], 10),
    [CASE_PODS.gateHang]: pod(CASE_PODS.gateHang, [server('app', {
      command: serveCgi,
      livenessProbe: { httpGet: { path: '/cgi-bin/hang', port: HTTP_PORT }, ...fast },
    })]),
    [CASE_PODS.gate500]: pod(CASE_PODS.gate500, [server('app', {
      command: serveCgi,
      livenessProbe: { httpGet: { path: '/cgi-bin/boom', port: 'http' }, ...fast },
    })]),
  };
}

/** How long the rollout pods' postStart hook runs: under the agent's 10 s shutdown grace, so a hook in flight at SIGTERM ends in the old agent. */
export const SLOW_HOOK_SECONDS = 6;

// /www/cgi-bin/slow, run by busybox httpd per request: it logs its start and end to the container log
// (a CGI's stderr is httpd's), so the run counts every hook that ran and every one that finished.
const slowHook = [
  'mkdir -p /www/cgi-bin',
  `printf '%s\\n' '#!/bin/sh' 'echo hook-start >&2' 'sleep ${SLOW_HOOK_SECONDS}' 'echo hook-done >&2' "printf 'Content-Type: text/plain\\r\\n\\r\\nok\\n'" > /www/cgi-bin/slow`,
  'chmod +x /www/cgi-bin/slow',
].join(' && ');
const serveSlowHook = ['/bin/busybox', 'sh', '-c', `${slowHook} && echo ok > /www/ready && exec /bin/busybox httpd -f -vv -p ${HTTP_PORT} -h /www`];

/**
 * A rollout pod: `server` serves a postStart that takes SLOW_HOOK_SECONDS and answers rewritten
 * readiness (httpGet on the named port, every second, one failure un-Readies it) and liveness
 * (tcpSocket); `app`'s postStart httpGet is that slow hook. The agent is restarted under both.
 */
export function rolloutPod(name: string): Record<string, unknown> {
  return pod(name, [
    server('server', {
      command: serveSlowHook,
      readinessProbe: { httpGet: { path: '/ready', port: 'http' }, ...fast },
      livenessProbe: { tcpSocket: { port: HTTP_PORT }, ...fast, failureThreshold: 3 },
    }),
    {
      name: 'app', image: BUSYBOX_IMAGE_REF, imagePullPolicy: 'Never', command: ['/bin/sleep', 'infinity'],
      lifecycle: { postStart: { httpGet: { path: '/cgi-bin/slow', port: HTTP_PORT, httpHeaders: [{ name: 'X-E2E', value: 'rollout' }] } } },
    },
  ]);
}
