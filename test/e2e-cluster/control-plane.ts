/**
 * A control plane from the binaries the user gives (KUBE_BIN_DIR): etcd (Debian's
 * etcd-server), kube-apiserver, kube-controller-manager and kube-scheduler, all on the node
 * address, with RBAC, the Node authorizer, NodeRestriction and the API server's admission client
 * certificate for the webhook configured as docs/deploy.md tells an operator to. Endpoint routing
 * (--enable-aggregator-routing) lets the API server call the webhook's pod IP: no kube-proxy is
 * built here.
 */
import { type ChildProcess } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Kubectl } from './kubectl.ts';
import { Pki, writeKubeconfig, type Pair } from './pki.ts';
import { freePort, httpGet, say, startLogged, stopChild, waitFor } from '../e2e-kubelet/lib.ts';

export const SERVICE_CIDR = '10.96.0.0/16';
/** The `kubernetes` Service's ClusterIP: the first address of SERVICE_CIDR. */
export const KUBERNETES_SERVICE_IP = '10.96.0.1';
export const WEBHOOK_HOST = 'probe-agent-webhook.probe-agent.svc';

export interface ControlPlaneOptions {
  binDir: string;
  scratch: string;
  /** The open node's address: the API server advertises and serves on it. */
  nodeIp: string;
  /** false: etcd and kube-apiserver only (pods are API objects, nothing schedules or runs them). Default true. */
  controllers?: boolean;
  /** More kube-apiserver flags (e.g. smaller in-flight limits). */
  apiserverArgs?: string[];
}

/** What one node's kubelet needs to register: its client kubeconfig and a serving pair for its address. */
export interface NodeCredentials {
  kubeconfig: string;
  serving: Pair;
}

export interface ControlPlane {
  server: string;
  apiPort: number;
  pki: Pki;
  ca: Pair;
  /** system:masters. */
  adminKubeconfig: string;
  /** A kubelet's credentials as system:node:<name>, its serving certificate for `ip`. */
  nodeCredentials(name: string, ip: string): NodeCredentials;
  /** The webhook's serving pair and its CA (the caBundle). */
  webhookServing: Pair;
  webhookCa: Pair;
  /** The CA whose `ca.crt` the webhook verifies the API server's admission client certificate with. */
  admissionClientCa: Pair;
  /** The API server's admission client certificate (the one caller the webhook answers). */
  admissionClient: Pair;
  logs: Record<string, string>;
  /** system:masters. */
  admin: Kubectl;
  stop(): Promise<void>;
  apiserverAlive(): boolean;
  /** Freezes (SIGSTOP) or resumes (SIGCONT) kube-apiserver: an API server that stops answering, its connections held. */
  apiserverSignal(signal: 'SIGSTOP' | 'SIGCONT'): void;
}

export async function startControlPlane(o: ControlPlaneOptions): Promise<ControlPlane> {
  const pkiDir = path.join(o.scratch, 'pki-cluster');
  mkdirSync(pkiDir, { mode: 0o700 });
  const pki = new Pki(pkiDir);
  const ca = pki.ca('ca', 'probe-agent-e2e-cluster-ca');
  const apiPort = await freePort();
  const server = `https://${o.nodeIp}:${apiPort}`;
  const apiserverPair = pki.issue('apiserver', ca, {
    subject: '/CN=kube-apiserver', server: true,
    sans: [`IP:${o.nodeIp}`, 'IP:127.0.0.1', `IP:${KUBERNETES_SERVICE_IP}`, 'DNS:localhost', 'DNS:kubernetes', 'DNS:kubernetes.default', 'DNS:kubernetes.default.svc', 'DNS:kubernetes.default.svc.cluster.local'],
  });
  const sa = pki.serviceAccountKeys();
  const adminPair = pki.issue('admin', ca, { subject: '/CN=e2e-admin/O=system:masters', client: true });
  const cm = pki.issue('controller-manager', ca, { subject: '/CN=system:kube-controller-manager', client: true });
  const sched = pki.issue('scheduler', ca, { subject: '/CN=system:kube-scheduler', client: true });
  const apiToKubelet = pki.issue('apiserver-kubelet-client', ca, { subject: '/CN=kube-apiserver-kubelet-client/O=system:masters', client: true });
  // docs/rewrite.md "Without cert-manager" and docs/deploy.md "The API server's client certificate".
  const webhookCa = pki.ca('webhook-ca', 'probe-agent webhook serving CA');
  const webhookServing = pki.issue('webhook-serving', webhookCa, { subject: `/CN=${WEBHOOK_HOST}`, server: true, sans: [`DNS:${WEBHOOK_HOST}`, `DNS:${WEBHOOK_HOST}.cluster.local`] });
  const admissionClientCa = pki.ca('webhook-client-ca', 'probe-agent webhook client CA');
  const admissionClient = pki.issue('apiserver-admission', admissionClientCa, { subject: '/CN=kube-apiserver-admission', client: true });
  const admissionKubeconfig = path.join(pkiDir, 'admission-kubeconfig.json');
  writeFileSync(admissionKubeconfig, JSON.stringify({
    apiVersion: 'v1', kind: 'Config',
    users: [{ name: WEBHOOK_HOST, user: { 'client-certificate': admissionClient.cert, 'client-key': admissionClient.key } }],
  }));
  const admissionConfig = path.join(pkiDir, 'admission-config.json');
  writeFileSync(admissionConfig, JSON.stringify({
    apiVersion: 'apiserver.config.k8s.io/v1', kind: 'AdmissionConfiguration',
    plugins: [{ name: 'MutatingAdmissionWebhook', configuration: { apiVersion: 'apiserver.config.k8s.io/v1', kind: 'WebhookAdmissionConfiguration', kubeConfigFile: admissionKubeconfig } }],
  }));

  const adminKubeconfig = writeKubeconfig(path.join(pkiDir, 'admin.kubeconfig'), server, ca.cert, adminPair);
  const cmKubeconfig = writeKubeconfig(path.join(pkiDir, 'controller-manager.kubeconfig'), server, ca.cert, cm);
  const schedKubeconfig = writeKubeconfig(path.join(pkiDir, 'scheduler.kubeconfig'), server, ca.cert, sched);
  const nodeCredentials = (name: string, ip: string): NodeCredentials => ({
    kubeconfig: writeKubeconfig(path.join(pkiDir, `kubelet-${name}.kubeconfig`), server, ca.cert,
      pki.issue(`kubelet-client-${name}`, ca, { subject: `/CN=system:node:${name}/O=system:nodes`, client: true })),
    serving: pki.issue(`kubelet-serving-${name}`, ca, { subject: `/CN=${name}`, server: true, sans: [`IP:${ip}`, `DNS:${name}`] }),
  });
  const admin = new Kubectl(o.binDir, adminKubeconfig);

  const logs: Record<string, string> = {};
  const procs: ChildProcess[] = [];
  const start = (name: string, bin: string, args: string[]): ChildProcess => {
    logs[name] = path.join(o.scratch, `${name}.log`);
    const p = startLogged(bin, args, logs[name]);
    procs.push(p);
    return p;
  };
  const stop = async (): Promise<void> => {
    for (const p of procs.reverse()) await stopChild(p, 10_000);
  };

  try {
    const [etcdClient, etcdPeer] = [await freePort(), await freePort()];
    say(`etcd on 127.0.0.1:${etcdClient}`);
    start('etcd', 'etcd', ['--name', 'e2e', '--data-dir', path.join(o.scratch, 'etcd'), '--listen-client-urls', `http://127.0.0.1:${etcdClient}`,
      '--advertise-client-urls', `http://127.0.0.1:${etcdClient}`, '--listen-peer-urls', `http://127.0.0.1:${etcdPeer}`,
      '--initial-advertise-peer-urls', `http://127.0.0.1:${etcdPeer}`, '--initial-cluster', `e2e=http://127.0.0.1:${etcdPeer}`,
      '--log-level', 'warn', '--quota-backend-bytes', String(1 << 30)]);
    const etcdUp = await waitFor('etcd /health', 30_000, async () => (await httpGet(`http://127.0.0.1:${etcdClient}/health`, 1000)).status === 200 || undefined, 300);
    if (!etcdUp) throw new Error(`etcd did not become healthy (see ${logs['etcd']})`);

    say(`kube-apiserver on ${server}`);
    const apiserver = start('kube-apiserver', path.join(o.binDir, 'kube-apiserver'), [
      `--etcd-servers=http://127.0.0.1:${etcdClient}`,
      `--advertise-address=${o.nodeIp}`, `--bind-address=${o.nodeIp}`, `--secure-port=${apiPort}`,
      `--tls-cert-file=${apiserverPair.cert}`, `--tls-private-key-file=${apiserverPair.key}`,
      `--client-ca-file=${ca.cert}`,
      `--service-account-issuer=https://kubernetes.default.svc.cluster.local`, `--service-account-key-file=${sa.pub}`, `--service-account-signing-key-file=${sa.key}`,
      '--authorization-mode=Node,RBAC', '--enable-admission-plugins=NodeRestriction',
      `--admission-control-config-file=${admissionConfig}`,
      `--service-cluster-ip-range=${SERVICE_CIDR}`, '--allow-privileged=true',
      `--kubelet-client-certificate=${apiToKubelet.cert}`, `--kubelet-client-key=${apiToKubelet.key}`, `--kubelet-certificate-authority=${ca.cert}`,
      '--kubelet-preferred-address-types=InternalIP',
      '--enable-aggregator-routing=true',
      '--endpoint-reconciler-type=lease',
      '--v=1',
      ...(o.apiserverArgs ?? []),
    ]);
    const apiUp = await waitFor('kube-apiserver /readyz', 120_000, async () =>
      (apiserver.exitCode !== null ? false : admin.raw('/readyz') === 'ok' || undefined), 1000);
    if (!apiUp) throw new Error(`kube-apiserver not ready (see ${logs['kube-apiserver']})`);

    const done = {
      server, apiPort, pki, ca, admin, adminKubeconfig, nodeCredentials, webhookServing, webhookCa, admissionClientCa, admissionClient, logs, stop,
      apiserverAlive: () => apiserver.exitCode === null && apiserver.signalCode === null,
      apiserverSignal: (signal: NodeJS.Signals) => void apiserver.kill(signal),
    };
    if (o.controllers === false) return done;
    say('kube-controller-manager and kube-scheduler');
    start('kube-controller-manager', path.join(o.binDir, 'kube-controller-manager'), [
      `--kubeconfig=${cmKubeconfig}`, `--authentication-kubeconfig=${cmKubeconfig}`, `--authorization-kubeconfig=${cmKubeconfig}`,
      '--bind-address=127.0.0.1', `--secure-port=${await freePort()}`,
      `--service-account-private-key-file=${sa.key}`, `--root-ca-file=${ca.cert}`,
      `--cluster-signing-cert-file=${ca.cert}`, `--cluster-signing-key-file=${ca.key}`,
      '--use-service-account-credentials=true', '--controllers=*,-nodeipam,-cloud-node-lifecycle,-service,-route',
      `--service-cluster-ip-range=${SERVICE_CIDR}`, '--leader-elect=false', '--v=1',
    ]);
    start('kube-scheduler', path.join(o.binDir, 'kube-scheduler'), [
      `--kubeconfig=${schedKubeconfig}`, `--authentication-kubeconfig=${schedKubeconfig}`, `--authorization-kubeconfig=${schedKubeconfig}`,
      '--bind-address=127.0.0.1', `--secure-port=${await freePort()}`, '--leader-elect=false', '--v=1',
    ]);
    // The controller-manager's service-account controller makes `default` in each namespace; pods wait for it.
    const sa0 = await waitFor('the default service account', 60_000, async () =>
      admin.raw('/api/v1/namespaces/default/serviceaccounts/default').includes('"name":"default"') || undefined, 1000);
    if (!sa0) throw new Error(`the controller-manager made no default service account (see ${logs['kube-controller-manager']})`);
    return done;
  } catch (err) {
    await stop();
    throw err;
  }
}

