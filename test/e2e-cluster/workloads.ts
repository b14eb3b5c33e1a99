/**
 * What users create in an opted-in namespace: a Deployment with HTTP readiness, TCP liveness and an
 * HTTP postStart (busybox httpd logs each request), a Deployment with a gRPC readiness probe (a
 * grpc.health.v1 server run by the probe-agent image's Node and grpc-js), and a DaemonSet with HTTP
 * readiness. None is rewritten by the run: the API server sends them to the webhook.
 */
import { BUSYBOX_IMAGE_REF } from '../lab/busybox-image.ts';
import { fast, HTTP_PORT, server } from '../e2e-kubelet/pods.ts';
import { CLOSED_HOLE_TAINT_KEY } from '../../agent/rewrite/placement.ts';

export const APPS_NS = 'e2e-apps';
export const OTHER_NS = 'e2e-plain';
export const GRPC_PORT = 9090;

/** A grpc.health.v1.Health/Check that answers SERVING (field 1 = 1), without a .proto file. */
const GRPC_SERVER = [
  "const g=require('/opt/probe-agent/node_modules/@grpc/grpc-js');const id=(x)=>x;const s=new g.Server();",
  "s.addService({Check:{path:'/grpc.health.v1.Health/Check',requestStream:false,responseStream:false,requestSerialize:id,requestDeserialize:id,responseSerialize:id,responseDeserialize:id}},",
  "{Check:(c,cb)=>cb(null,Buffer.from([8,1]))});",
  `s.bindAsync('0.0.0.0:${GRPC_PORT}',g.ServerCredentials.createInsecure(),(e)=>{if(e)throw e;console.log('serving');});`,
].join('');

const podMeta = (app: string): Record<string, unknown> => ({ labels: { app } });

export function deployment(name: string, replicas: number, containers: Record<string, unknown>[], ns = APPS_NS): Record<string, unknown> {
  return {
    apiVersion: 'apps/v1', kind: 'Deployment', metadata: { name, namespace: ns },
    spec: {
      replicas, selector: { matchLabels: { app: name } },
      template: { metadata: podMeta(name), spec: { containers, terminationGracePeriodSeconds: 2, enableServiceLinks: false } },
    },
  };
}

/**
 * HTTP readiness on a named port and TCP liveness on `server`, and an HTTP postStart on `app` that
 * reaches `server`: kubelet starts containers in order and runs a postStart right after its
 * container starts, so the hook's target is already up (as in e2e-kubelet's hooks pod).
 */
export function webDeployment(replicas = 2): Record<string, unknown> {
  return deployment('web', replicas, [
    server('server', {
      readinessProbe: { httpGet: { path: '/ready', port: 'http' }, ...fast },
      livenessProbe: { tcpSocket: { port: HTTP_PORT }, ...fast, failureThreshold: 3 },
    }),
    {
      name: 'app', image: BUSYBOX_IMAGE_REF, imagePullPolicy: 'Never', command: ['/bin/sleep', 'infinity'],
      lifecycle: { postStart: { httpGet: { path: '/poststart', port: HTTP_PORT } } },
    },
  ]);
}

export function grpcDeployment(image: string): Record<string, unknown> {
  return deployment('grpc', 1, [{
    name: 'app', image, imagePullPolicy: 'Never', command: ['node', '-e', GRPC_SERVER],
    ports: [{ name: 'grpc', containerPort: GRPC_PORT }],
    readinessProbe: { grpc: { port: GRPC_PORT }, ...fast },
    securityContext: { readOnlyRootFilesystem: true },
  }]);
}

/**
 * A daemon with HTTP readiness. The DaemonSet controller matches the template's tolerations against
 * the node's taints, before any webhook: `tolerateClosedHole` is what docs/closing-the-hole.md tells
 * users to add for daemons that must run on closed-hole nodes.
 */
export function daemonSet(name: string, tolerateClosedHole: boolean): Record<string, unknown> {
  return {
    apiVersion: 'apps/v1', kind: 'DaemonSet', metadata: { name, namespace: APPS_NS },
    spec: {
      selector: { matchLabels: { app: name } },
      template: {
        metadata: podMeta(name),
        spec: {
          containers: [server('app', { readinessProbe: { httpGet: { path: '/ready', port: HTTP_PORT }, ...fast } })], terminationGracePeriodSeconds: 2, enableServiceLinks: false,
          ...(tolerateClosedHole ? { tolerations: [{ key: CLOSED_HOLE_TAINT_KEY, operator: 'Exists', effect: 'NoSchedule' }] } : {}),
        },
      },
    },
  };
}

/** Many small pods with one HTTP readiness probe each (the scale step). */
export function scaleDeployment(replicas: number): Record<string, unknown> {
  return deployment('scale', replicas, [server('app', { readinessProbe: { httpGet: { path: '/ready', port: HTTP_PORT }, periodSeconds: 10 }, resources: { requests: { cpu: '1m', memory: '4Mi' } } })]);
}

/** One replica with an HTTP readiness probe: a controller's pod, created while the webhook is down. */
export function retriedDeployment(name: string): Record<string, unknown> {
  return deployment(name, 1, [server('app', { readinessProbe: { httpGet: { path: '/ready', port: HTTP_PORT }, ...fast } })]);
}

/** A bare pod with an HTTP readiness probe, in `ns`, with `extra` spec fields. */
export function plainPod(name: string, ns: string, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    apiVersion: 'v1', kind: 'Pod', metadata: { name, namespace: ns, labels: { app: name } },
    spec: { containers: [server('app', { readinessProbe: { httpGet: { path: '/ready', port: HTTP_PORT }, ...fast } })], terminationGracePeriodSeconds: 2, enableServiceLinks: false, ...extra },
  };
}

export { BUSYBOX_IMAGE_REF };
