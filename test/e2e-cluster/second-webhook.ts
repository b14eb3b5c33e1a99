/**
 * A second mutating webhook beside probe-agent's, as clusters have them (a service mesh's sidecar
 * injector): it adds a container with its own HTTP readiness probe to pods labelled
 * `e2e-second=<its name>`. Registered twice, under a name that sorts before probe-agent-rewrite and
 * one that sorts after, so both orders are tried: after ours, the API server must reinvoke ours
 * (reinvocationPolicy IfNeeded) to rewrite the added probe.
 */
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:https';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { stopChild } from '../e2e-kubelet/lib.ts';
import type { Pair } from './pki.ts';

export const SECOND_PORT = 8081;

/**
 * Serves in a child process: the run's own process blocks in kubectl calls, and the API server
 * calls this webhook during them.
 */
export async function startSecondWebhook(host: string, pair: Pair, image: string): Promise<{ url: string; close: () => Promise<void> }> {
  const child = spawn(process.execPath, [fileURLToPath(import.meta.url), 'serve', host, pair.cert, pair.key, image], { stdio: ['ignore', 'pipe', 'inherit'] });
  const port = await new Promise<number>((resolve, reject) => {
    child.once('exit', (code) => reject(new Error(`second webhook exited (${code})`)));
    createInterface({ input: child.stdout! }).once('line', (l) => resolve(Number(l)));
  });
  return { url: `https://${host}:${port}/mutate`, close: () => stopChild(child) };
}

function serve(host: string, certFile: string, keyFile: string, image: string): void {
  const server = createServer({ cert: readFileSync(certFile), key: readFileSync(keyFile) }, (req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const review = JSON.parse(Buffer.concat(chunks).toString('utf8')) as { request: { uid: string; object: { spec: { containers: { name: string }[] } } } };
      const has = review.request.object.spec.containers.some((c) => c.name === 'added');
      const patch = has ? [] : [{
        op: 'add', path: '/spec/containers/-',
        value: {
          name: 'added', image, imagePullPolicy: 'Never',
          command: ['/bin/busybox', 'sh', '-c', `mkdir -p /www && echo ok > /www/ready && exec /bin/busybox httpd -f -p ${SECOND_PORT} -h /www`],
          readinessProbe: { httpGet: { path: '/ready', port: SECOND_PORT }, periodSeconds: 1, failureThreshold: 1 },
        },
      }];
      res.setHeader('Content-Type', 'application/json');
      res.end(JSON.stringify({
        apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview',
        response: { uid: review.request.uid, allowed: true, ...(patch.length ? { patchType: 'JSONPatch', patch: Buffer.from(JSON.stringify(patch)).toString('base64') } : {}) },
      }));
    });
  });
  server.listen(0, host, () => console.log(String((server.address() as { port: number }).port)));
  process.on('SIGTERM', () => server.close(() => process.exit(0)));
}

/** Its MutatingWebhookConfiguration named `name`, for pods labelled e2e-second=<name> in `ns`. */
export function secondWebhookConfig(name: string, url: string, caFile: string, ns: string): Record<string, unknown> {
  return {
    apiVersion: 'admissionregistration.k8s.io/v1', kind: 'MutatingWebhookConfiguration', metadata: { name },
    webhooks: [{
      name: `${name}.e2e.probe-agent.io`, admissionReviewVersions: ['v1'],
      clientConfig: { url, caBundle: readFileSync(caFile).toString('base64') },
      rules: [{ operations: ['CREATE'], apiGroups: [''], apiVersions: ['v1'], resources: ['pods'], scope: 'Namespaced' }],
      namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': ns } },
      objectSelector: { matchLabels: { 'e2e-second': name } },
      reinvocationPolicy: 'Never', failurePolicy: 'Fail', sideEffects: 'None', timeoutSeconds: 5,
    }],
  };
}

if (process.argv[1] === fileURLToPath(import.meta.url) && process.argv[2] === 'serve') {
  const [host, cert, key, image] = process.argv.slice(3) as [string, string, string, string];
  serve(host, cert, key, image);
}
