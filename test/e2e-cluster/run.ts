/**
 * `make e2e-cluster KUBE_BIN_DIR=/dir`: probe-agent deployed on a real two-node cluster the way an
 * operator deploys it, from binaries the user gives (kube-apiserver, kube-controller-manager,
 * kube-scheduler, kubectl and kubelet of one Kubernetes version; nothing is built or fetched here)
 * and Debian's etcd. Two kubelets register, each a node with its own address (10.252.<slot>.1), root
 * directory, pod log directory, lab runtime (RUNTIME: containerd or CRI-O, test/lab/runtime-lab.ts; its
 * own slot, bridge and pod subnet 10.251.<slot>.0/24)
 * and own /run, /opt and /etc directories for what the manifests mount (overlay.ts); the image from
 * `make image` is imported into both. The open node runs the control plane's address and the webhook;
 * the other joins, gets the shim and is closed; the workloads go there. The steps, each a row:
 * 1. `kubectl apply -k` of the overlay (overlay.ts) brings the agent DaemonSet up Ready on both
 *    nodes and the webhook on the open one; with E2E_CLUSTER_INSTALL=helm, `helm install` of
 *    deploy/helm/probe-agent with the same choices (overlay.ts, helmValues) does.
 * 2. The shim installer installs the shim on each node; the run starts it on the closed node as its
 *    unit says (there is no systemd here) and switches that kubelet to it as docs/closing-the-hole.md
 *    does; the installer labels that node only. The webhook's certificates are made as docs/rewrite.md
 *    says without cert-manager. The closed node is tainted hole-closed and node->pod dropped for its
 *    pods only; a Deployment and a DaemonSet with HTTP, TCP and gRPC probes and an HTTP postStart are
 *    created: the API server applies the webhook's patch, the closed node's kubelet runs them through
 *    the shim and they become Ready; the DaemonSet's pod on the open node stays as written. A second
 *    webhook adds a container before and after ours (reinvocation).
 * 3. The installer's RBAC (its own node allowed, the other refused where the version can) and its
 *    refusal to unlabel while rewritten pods run.
 * 4. The closed-hole taint and the shim affinity, through the real scheduler, with both nodes.
 * 5. Faults: the webhook down under failurePolicy Ignore and Fail (a pod admitted meanwhile runs on
 *    the open node), the agent rolled to a new image under rewritten probes (with helm: `helm
 *    upgrade` to a new image tag and `helm rollback`), the rollback procedure of
 *    docs/closing-the-hole.md step by step on the closed node.
 * 6. Scale: SCALE_PODS (100) pods through the webhook; the API server's own admission latency.
 * Stand-ins, each because nothing real can run here: no kube-proxy (one nft DNAT for the
 * `kubernetes` Service, from the run's own pod subnets: service-dnat.ts; the API server reaches the
 * webhook by endpoint routing), no systemd (the run starts the installed shim), no NetworkPolicy
 * enforcement (the bridge CNI has none: the policy is applied, not enforced), the PodMonitor CRD
 * (overlay.ts), and one machine for both nodes (the node patches of overlay.ts). Root only; not
 * part of `make test`.
 */
import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readlinkSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { request as httpsRequest } from 'node:https';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { importBusyboxImage, BUSYBOX_IMAGE_REF } from '../lab/busybox-image.ts';
import type { RuntimeLab } from '../lab/containerd.ts';
import { createRuntimeLab, describeRuntime, runtimeChoice } from '../lab/runtime-lab.ts';
import { slotLayout } from '../lab/containerd-sweep.ts';
import { connectFromNode } from '../lab/net.ts';
import { keepKubeletSysctls, Kubelet, kubeletInfo } from '../e2e-kubelet/kubelet.ts';
import { check, checks, Cleanups, freePort, NODE_NAME, readdirSafe, runHarness, say, sayAs, skip, sleep, startLogged, stopChild, unmountUnder, waitFor } from '../e2e-kubelet/lib.ts';
import { SHIM_COMMAND_PATH } from '../../agent/contract/shim-command.ts';
import { CLOSED_HOLE_TAINT_KEY, SHIM_NODE_LABEL } from '../../agent/rewrite/placement.ts';
import { ORIGINAL_HANDLERS_ANNOTATION } from '../../agent/rewrite/pod-rewrite.ts';
import { KUBERNETES_SERVICE_IP, SERVICE_CIDR, startControlPlane, WEBHOOK_HOST, type ControlPlane } from './control-plane.ts';
import { gatesPhase } from './gates.ts';
import { Helm } from './helm.ts';
import { Kubectl, type KubectlResult } from './kubectl.ts';
import { agentMetric, failedCalls, histogram, minus, p50p99 } from './prom.ts';
import { components, helmValues, NODE_DIRS, POD_MONITOR_CRD, RUNTIME_SOCKET, writeOverlay, type Mode } from './overlay.ts';
import { secondWebhookConfig, startSecondWebhook } from './second-webhook.ts';
import { serviceDnatTable } from './service-dnat.ts';
import { APPS_NS, daemonSet, grpcDeployment, OTHER_NS, plainPod, retriedDeployment, scaleDeployment, webDeployment } from './workloads.ts';

sayAs('e2e-cluster');
const REPO = fileURLToPath(new URL('../..', import.meta.url));
const VERSION = (JSON.parse(readFileSync(path.join(REPO, 'package.json'), 'utf8')) as { version: string }).version;
const IMAGE = `probe-agent:${VERSION}`;
const IMAGE_TAR = path.join(REPO, 'build/probe-agent-image.tar');
const BINARIES = ['kube-apiserver', 'kube-controller-manager', 'kube-scheduler', 'kubectl', 'kubelet'];
/** The shim's socket, as a node names it (the run's nodes have their own /run: overlay.ts). */
const SHIM_SOCKET = '/run/probe-agent-shim/cri.sock';
/** The open node's name; the closed one is NODE_NAME. */
const OPEN_NODE = `${NODE_NAME}-open`;
const WEBHOOK = 'app.kubernetes.io/name=probe-agent-webhook';
const AGENT = 'app.kubernetes.io/name=probe-agent';
const KUBELET_PORT = 10250;
/** deploy/components/rewrite-webhook's container port. */
const WEBHOOK_PORT = 8443;
/** A node's address is 10.252.<its containerd's slot>.1. */
const NODE_IP_RANGE = '10.252.0.0/16';
const SCALE_PODS = Number(process.env['E2E_SCALE_PODS'] ?? 100);
/** How the run installs probe-agent: kustomize (`kubectl apply -k`) or helm (the chart, then an upgrade and a rollback). */
const INSTALL = process.env['E2E_CLUSTER_INSTALL'] || 'kustomize';
const CHART = path.join(REPO, 'deploy/helm/probe-agent');
/** shim (default): the shim phase above; gates: the gates phase of gates.ts instead (kubelets on containerd, no shim). */
const MODE = (process.env['E2E_CLUSTER_MODE'] || 'shim') as Mode;

const cleanups = new Cleanups('e2e-cluster');
let heading = '';

type Obj = Record<string, any>;

function usage(msg: string): never {
  console.error(`e2e-cluster: ${msg}\nusage: make e2e-cluster KUBE_BIN_DIR=/dir   (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet of one version)`);
  process.exit(2);
}

function binDirFromArgs(): string {
  const i = process.argv.indexOf('--kube-bin-dir');
  const d = i >= 0 ? process.argv[i + 1] : process.env['KUBE_BIN_DIR'];
  if (!d) usage('no KUBE_BIN_DIR given');
  const abs = path.resolve(d);
  const missing = BINARIES.filter((b) => spawnSync('test', ['-x', path.join(abs, b)]).status !== 0);
  if (missing.length) usage(`${abs} lacks ${missing.join(', ')}`);
  return abs;
}

/** Every container (init ones too) of a pod. */
const containersOf = (pod: Obj): Obj[] => [...(pod.spec?.initContainers ?? []), ...(pod.spec?.containers ?? [])];
const handlersOf = (c: Obj): Obj[] => [c.livenessProbe, c.readinessProbe, c.startupProbe, c.lifecycle?.postStart, c.lifecycle?.preStop].filter(Boolean);
const isRewrittenHandler = (h: Obj): boolean => h.exec?.command?.[0] === SHIM_COMMAND_PATH;
/** Rewritten: the record annotation, every handler is the shim command, the toleration, the shim affinity. */
function rewriteFacts(pod: Obj): { all: boolean; detail: string } {
  const hs = containersOf(pod).flatMap(handlersOf);
  const rewritten = hs.filter(isRewrittenHandler).length;
  const record = pod.metadata?.annotations?.[ORIGINAL_HANDLERS_ANNOTATION] !== undefined;
  const toleration = (pod.spec?.tolerations ?? []).some((t: Obj) => t.key === CLOSED_HOLE_TAINT_KEY);
  const affinity = JSON.stringify(pod.spec?.affinity?.nodeAffinity?.requiredDuringSchedulingIgnoredDuringExecution ?? {}).includes(SHIM_NODE_LABEL);
  return {
    all: hs.length > 0 && rewritten === hs.length && record && toleration && affinity,
    detail: `${rewritten}/${hs.length} handlers rewritten, record ${record ? 'yes' : 'no'}, toleration ${toleration ? 'yes' : 'no'}, shim affinity ${affinity ? 'yes' : 'no'}`,
  };
}
const isReady = (pod: Obj): boolean => (pod.status?.conditions ?? []).some((c: Obj) => c.type === 'Ready' && c.status === 'True');
const restartsOf = (pod: Obj): number => (pod.status?.containerStatuses ?? []).reduce((n: number, s: Obj) => n + (s.restartCount ?? 0), 0);
const containerIds = (pod: Obj): string => JSON.stringify((pod.status?.containerStatuses ?? []).map((s: Obj) => s.containerID).sort());

/** warn/error lines of the agent's, the webhook's and the shim's JSON logs, gathered before their pods go. */
class LogWatch {
  readonly lines: { who: string; line: string }[] = [];
  readonly #seen = new Set<string>();

  readonly k: Kubectl;

  constructor(k: Kubectl) {
    this.k = k;
  }

  take(who: string, text: string): void {
    for (const line of text.split('\n')) {
      const level = /"level":"(\w+)"/.exec(line)?.[1];
      if ((level === 'warn' || level === 'error') && !this.#seen.has(line)) {
        this.#seen.add(line);
        this.lines.push({ who, line });
      }
    }
  }

  /** The current pods' logs of a probe-agent workload. */
  pods(cluster: Cluster, selector: string): void {
    for (const p of cluster.pods('probe-agent', selector)) this.take(p.metadata.name, this.k.run(['-n', 'probe-agent', 'logs', p.metadata.name, '--all-containers']).stdout);
  }
}

class Cluster {
  readonly k: Kubectl;

  constructor(k: Kubectl) {
    this.k = k;
  }

  pods(ns: string, selector?: string): Obj[] {
    return this.k.json<{ items: Obj[] }>(['pods', '-n', ns, ...(selector ? ['-l', selector] : [])])?.items ?? [];
  }

  pod(ns: string, name: string): Obj | undefined {
    return this.k.json<Obj>(['pod', '-n', ns, name]);
  }

  /** Waits until `n` pods match and all are Ready. */
  async ready(ns: string, selector: string, n: number, timeoutMs: number): Promise<Obj[] | undefined> {
    return waitFor(`${n} Ready pods ${ns}/${selector}`, timeoutMs, () => {
      const ps = this.pods(ns, selector).filter((p) => !p.metadata.deletionTimestamp);
      return ps.length >= n && ps.every(isReady) ? ps : undefined;
    }, 1000);
  }

  /** The scheduler's reason a pending pod is not placed, from its PodScheduled condition. */
  unschedulable(ns: string, name: string): string | undefined {
    const c = (this.pod(ns, name)?.status?.conditions ?? []).find((x: Obj) => x.type === 'PodScheduled' && x.status === 'False');
    return c ? String(c.message ?? c.reason) : undefined;
  }
}

/**
 * containerd refuses a HostToContainer volume whose host path is not on a shared or slave mount,
 * and this machine's / is private (a node's systemd makes it shared). The run therefore goes on in a
 * mount namespace of its own with / made rshared there: the host's mounts stay as they were.
 */
async function inOwnMountNamespace(): Promise<void> {
  if (process.env['E2E_CLUSTER_MOUNT_NS'] !== String(process.ppid)) {
    const child = spawn('unshare', ['--mount', '--propagation', 'private', '--', process.execPath, ...process.execArgv, ...process.argv.slice(1)],
      { stdio: 'inherit', env: { ...process.env, E2E_CLUSTER_MOUNT_NS: String(process.pid) } });
    // The run and its cleanups are the child's: this process only passes signals on and waits.
    for (const sig of ['SIGINT', 'SIGTERM'] as const) {
      process.removeAllListeners(sig);
      process.on(sig, () => child.kill(sig));
    }
    const code = await new Promise<number>((resolve) => child.on('exit', (c, signal) => resolve(c ?? (signal ? 130 : 1))));
    process.exit(code);
  }
  execFileSync('mount', ['--make-rshared', '/']);
}

/** One of the two nodes: its kubelet, its lab containerd, its own directories. */
interface LabNode {
  name: string;
  role: 'open' | 'closed';
  /** 10.252.<its containerd's slot>.1, on lo. */
  ip: string;
  ctrd: RuntimeLab;
  /** Its own root for the directories the manifests mount (overlay.ts NODE_DIRS). */
  root: string;
  kubeletDir: string;
  kubelet: Kubelet;
  /** Writes kubeadm-flags.env naming `endpoint`, what the installer reads as kubelet's runtime endpoint. */
  flags(endpoint: string): void;
}

async function main(): Promise<number> {
  if (process.getuid?.() !== 0) usage('must run as root (it starts kubelets, their runtimes and nftables rules)');
  const binDir = binDirFromArgs();
  const choice = runtimeChoice();
  if ('error' in choice) usage(choice.error);
  if (INSTALL !== 'kustomize' && INSTALL !== 'helm') usage(`E2E_CLUSTER_INSTALL=${INSTALL}: kustomize or helm`);
  if (MODE !== 'shim' && MODE !== 'gates') usage(`E2E_CLUSTER_MODE=${MODE}: shim or gates`);
  if (MODE === 'gates' && INSTALL !== 'kustomize') usage('E2E_CLUSTER_MODE=gates installs with kustomize');
  if (INSTALL === 'helm' && !Helm.available(REPO)) usage('.tools/bin/helm is missing: make kube-tools installs it');
  if (!existsSync(IMAGE_TAR)) usage(`${IMAGE_TAR} is missing: make e2e-cluster builds it with make image`);
  if (spawnSync('etcd', ['--version']).status !== 0) usage('etcd is not installed (make e2e-cluster installs Debian\'s etcd-server)');
  // Each kubelet listens on its own node address; one on every address would take them.
  const wildcard = spawnSync('ss', ['-Htln', `sport = :${KUBELET_PORT}`], { encoding: 'utf8' }).stdout.split('\n').find((l) => /\s(\*|0\.0\.0\.0|\[::\]):\d+\s/.test(l));
  if (wildcard) usage(`port ${KUBELET_PORT} is taken on every address: another kubelet runs here (${wildcard.trim()})`);
  const kinfo = kubeletInfo(path.join(binDir, 'kubelet'));
  // `kubectl version --short` is gone since 1.28; -o json works on every version.
  const kvJson = spawnSync(path.join(binDir, 'kubectl'), ['version', '--client', '-o', 'json'], { encoding: 'utf8' }).stdout;
  const kv = `kubectl ${(JSON.parse(kvJson || '{}') as { clientVersion?: { gitVersion?: string } }).clientVersion?.gitVersion ?? 'unknown'}`;
  heading = `Kubernetes ${kinfo.version} (${binDir}); ${kv}; etcd ${/etcd Version: (\S+)/.exec(spawnSync('etcd', ['--version'], { encoding: 'utf8' }).stdout)?.[1]}; two nodes; ${MODE} mode`;
  say(heading);

  const scratch = mkdtempSync('/run/probe-agent-e2e-cluster-');
  cleanups.push(() => {
    if (process.env['E2E_KEEP_LOGS'] === '1') {
      const keep = `/tmp/e2e-cluster-logs-${Date.now()}`;
      mkdirSync(keep);
      for (const f of readdirSafe(scratch).filter((x) => x.endsWith('.log'))) execFileSync('cp', [path.join(scratch, f), keep]);
      console.log(`logs kept in ${keep}`);
    }
    rmSync(scratch, { recursive: true, force: true });
  });
  // Pod logs of this run's pods: kubelet's podLogsDir is the node's own from 1.29 (under scratch), and
  // only /var/log/containers' links into it go at the end. Before 1.29 what this run adds under
  // /var/log goes. Never more: another run's pod log directories there are its containers' logs
  // (CRI-O's conmon exits when kubelet asks it to reopen a log whose directory went).
  const ownLogs = kinfo.minor === undefined || kinfo.minor >= 29;
  const logDirs = (d: string): Set<string> => new Set(readdirSafe(d));
  const before = { pods: logDirs('/var/log/pods'), containers: logDirs('/var/log/containers') };
  const intoScratch = (link: string): boolean => {
    try {
      return readlinkSync(link).startsWith(`${scratch}/`);
    } catch {
      return false;
    }
  };
  cleanups.push(() => {
    if (!ownLogs) for (const f of readdirSafe('/var/log/pods')) if (!before.pods.has(f)) rmSync(path.join('/var/log/pods', f), { recursive: true, force: true });
    for (const f of readdirSafe('/var/log/containers')) {
      const link = path.join('/var/log/containers', f);
      if (ownLogs ? intoScratch(link) : !before.containers.has(f)) rmSync(link, { force: true });
    }
  });
  cleanups.push(keepKubeletSysctls());
  // The nodes' own directories: short paths, the shim's sockets live there (108-byte limit).
  const nodesDir = path.join(scratch, 'n');

  say(`two lab ${choice.kind} runtimes (CNI bridge, pause and busybox images), each with the image from make image`);
  const makeNode = async (name: string, role: LabNode['role']): Promise<LabNode> => {
    // Pods reach the nodes' addresses and the Service range through their gateway, the host.
    const ctrd = await createRuntimeLab(choice, { routes: [NODE_IP_RANGE, SERVICE_CIDR] });
    cleanups.push(() => ctrd.destroy());
    importBusyboxImage(ctrd);
    ctrd.importImage(IMAGE_TAR, `docker.io/library/${IMAGE}`);
    const root = path.join(nodesDir, name);
    for (const d of NODE_DIRS) mkdirSync(path.join(root, d), { recursive: true, mode: d === 'run/probe-agent-shim' ? 0o700 : 0o755 });
    // The node's runtime socket (/run/containerd/containerd.sock, /var/run/crio/crio.sock) is its lab runtime's.
    symlinkSync(ctrd.socket, path.join(root, RUNTIME_SOCKET[choice.kind]));
    // Kubelet's root is not the node's /var/lib/kubelet seen by the installer (which holds only
    // kubeadm-flags.env here): mounted into the installer's pod by subPath, kubelet could never
    // unmount a bind of its own root, and the installer's old pods would not go on an update.
    const kubeletDir = path.join(scratch, `kubelet-${name}`);
    mkdirSync(kubeletDir);
    cleanups.push(() => unmountUnder(kubeletDir));
    // The node's address, on lo: pods reach it through their gateway, and kubelet checks that
    // --node-ip is one of the host's own.
    const ip = NODE_IP_RANGE.replace(/0\.0\/16$/, `${ctrd.slot}.1`);
    spawnSync('ip', ['addr', 'del', `${ip}/32`, 'dev', 'lo']);
    execFileSync('ip', ['addr', 'add', `${ip}/32`, 'dev', 'lo']);
    cleanups.push(() => void spawnSync('ip', ['addr', 'del', `${ip}/32`, 'dev', 'lo']));
    const node = { name, role, ip, ctrd, root, kubeletDir, kubelet: undefined as unknown as Kubelet, flags: (endpoint: string) => writeFileSync(path.join(root, 'var/lib/kubelet/kubeadm-flags.env'), `KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=${endpoint}"\n`) };
    return node;
  };
  const open = await makeNode(OPEN_NODE, 'open');
  const closed = await makeNode(NODE_NAME, 'closed');
  const nodes = [open, closed];
  heading += `; runtime ${await describeRuntime(open.ctrd, choice)}`;
  say(heading);

  // When the run restarts kubelet or deletes pods on purpose (the log check allows what that causes).
  const switchWindow = { from: 0, to: 0 };
  // The control plane runs on the open node's address.
  const cp = await startControlPlane({ binDir, scratch, nodeIp: open.ip });
  cleanups.push(() => cp.stop());
  const k = cp.admin;
  const cluster = new Cluster(k);

  // kube-proxy's one rule this run needs: its pods' `kubernetes` Service to its API server.
  const NFT = `pa_e2e_cluster_${closed.ctrd.slot}`;
  const nft = (rules: string): void => void execFileSync('nft', ['-f', '-'], { input: rules });
  spawnSync('nft', ['delete', 'table', 'inet', NFT]);
  nft(serviceDnatTable(NFT, { serviceIp: KUBERNETES_SERVICE_IP, apiServer: { ip: open.ip, port: cp.apiPort }, podSubnets: nodes.map((n) => slotLayout(n.ctrd.slot).subnet4) }));
  cleanups.push(() => void spawnSync('nft', ['delete', 'table', 'inet', NFT]));

  // The kubelets, registered; each first on its containerd directly, as a node is before the switch.
  for (const n of nodes) {
    const cred = cp.nodeCredentials(n.name, n.ip);
    n.kubelet = new Kubelet(kinfo, {
      scratch, manifests: path.join(scratch, `manifests-${n.role}`), rootDir: n.kubeletDir, port: KUBELET_PORT, roPort: 0, healthzPort: await freePort(),
      runtimeEndpoint: n.ctrd.endpoint, imageEndpoint: n.ctrd.endpoint, nodeName: n.name, podLogsDir: path.join(n.root, 'var/log/pods'),
      cluster: { kubeconfig: cred.kubeconfig, clientCaFile: cp.ca.cert, tlsCertFile: cred.serving.cert, tlsPrivateKeyFile: cred.serving.key, nodeIp: n.ip, maxPods: n.role === 'closed' ? SCALE_PODS + 40 : 40 },
    }, {});
    mkdirSync(n.kubelet.setup.manifests);
    cleanups.push(() => n.kubelet.stop());
    n.flags(n.ctrd.endpoint);
  }
  const nodeReady = async (n: LabNode, label: string): Promise<boolean> => (await n.kubelet.start(label)) && await waitFor(`${n.name} Ready`, 90_000, () => {
    const x = k.json<Obj>(['node', n.name]);
    return (x?.status?.conditions ?? []).some((c: Obj) => c.type === 'Ready' && c.status === 'True') || undefined;
  }, 1000) === true;
  // The open node first: the cluster runs before the node that will be closed joins it.
  const openUp = await nodeReady(open, 'open-containerd');
  if (!check('the open node\'s kubelet registers and its node is Ready', openUp, openUp ? `${open.name} at ${open.ip} (${choice.kind} slot ${open.ctrd.slot}, pods ${slotLayout(open.ctrd.slot).subnet4})` : `see ${open.kubelet.log}`)) return 1;

  // Step 1: the operator's apply.
  // The components follow the server's version, as an operator's overlay does (docs/deploy.md).
  const serverVersion = JSON.parse(k.raw('/version') || '{}') as { minor?: string; gitVersion?: string };
  const serverMinor = Number.parseInt(serverVersion.minor ?? '', 10);
  if (!Number.isInteger(serverMinor)) throw new Error(`the API server's /version has no minor: ${JSON.stringify(serverVersion)}`);
  if (MODE === 'gates' && serverMinor < 30) usage(`gates mode needs Kubernetes 1.30 or later (the API server is ${serverVersion.gitVersion})`);
  say(`API server ${serverVersion.gitVersion}: components ${components(serverMinor, MODE, choice.kind).join(', ')}`);
  const nodeOptions = {
    repo: REPO, dir: path.join(scratch, 'overlay'), version: VERSION, nodesDir,
    containerds: nodes.map((n) => ({ dir: n.ctrd.dir, netnsDir: n.ctrd.netnsDir })), runtime: choice.kind,
    // The API server reaches the webhook on the open node from that node's bridge address.
    apiServerCidr: `${slotLayout(open.ctrd.slot).subnet4.replace(/0\/24$/, '1')}/32`, serverMinor, mode: MODE,
  };
  k.apply([POD_MONITOR_CRD]);
  k.run(['wait', '--for=condition=established', '--timeout=30s', `crd/${POD_MONITOR_CRD.metadata.name}`]);
  // The webhook's certificates, as docs/rewrite.md "Without cert-manager" says.
  const webhookSecrets = (): void => {
    k.must(['-n', 'probe-agent', 'create', 'secret', 'tls', 'probe-agent-webhook-tls', `--cert=${cp.webhookServing.cert}`, `--key=${cp.webhookServing.key}`]);
    k.must(['-n', 'probe-agent', 'create', 'secret', 'generic', 'probe-agent-webhook-client-ca', `--from-file=ca.crt=${cp.admissionClientCa.cert}`]);
  };
  const caB64 = readFileSync(cp.webhookCa.cert).toString('base64');
  let helm: Helm | undefined;
  if (INSTALL === 'helm') {
    // The chart's README: the namespace with deploy/base's labels first, the Secrets, then the release.
    helm = new Helm(REPO, cp.admin.kubeconfig, scratch, path.join(binDir, 'kubectl'), nodeOptions);
    k.must(['apply', '-f', path.join(REPO, 'deploy/base/namespace.yaml')]);
    webhookSecrets();
    const release = helm.run(['install', 'probe-agent', CHART, '--namespace', 'probe-agent', '-f', helm.values('install', helmValues({ ...nodeOptions, tag: VERSION, caBundle: caB64 })), ...helm.postRender()]);
    const objects = release.ok ? helm.run(['get', 'manifest', 'probe-agent', '--namespace', 'probe-agent']).stdout.match(/^kind: /gm)?.length ?? 0 : 0;
    check('helm install: every object accepted', release.ok && objects > 0, release.ok ? `${objects} objects, release probe-agent revision 1` : release.stderr.trim().slice(0, 400));
    if (!release.ok) return 1;
  } else {
    const overlay = writeOverlay(nodeOptions);
    const applied = k.run(['apply', '-k', overlay], undefined, 120_000);
    check('kubectl apply -k: every object accepted', applied.ok, applied.ok ? `${applied.stdout.trim().split('\n').length} objects` : applied.stderr.trim().slice(0, 400));
    if (!applied.ok) return 1;
  }
  if (INSTALL === 'kustomize') {
    webhookSecrets();
    const unpatched = k.json<Obj>(['mutatingwebhookconfiguration', 'probe-agent-rewrite']);
    k.must(['patch', 'mutatingwebhookconfiguration', 'probe-agent-rewrite', '--type=json', '-p',
      JSON.stringify((unpatched?.webhooks ?? []).map((_: unknown, i: number) => ({ op: 'add', path: `/webhooks/${i}/clientConfig/caBundle`, value: caB64 })))]);
  }
  const mwc = k.json<Obj>(['mutatingwebhookconfiguration', 'probe-agent-rewrite']);
  const withCa = (mwc?.webhooks ?? []).filter((w: Obj) => w.clientConfig?.caBundle === caB64).length;
  const webhookPods = await cluster.ready('probe-agent', WEBHOOK, 2, 180_000);
  check('webhook Deployment Ready (2 replicas) on the open node, registered with its caBundle', webhookPods !== undefined && webhookPods.every((p) => p.spec.nodeName === open.name) && (mwc?.webhooks ?? []).length >= 1 && withCa === mwc?.webhooks.length,
    `${webhookPods?.length ?? 0} Ready on ${[...new Set((webhookPods ?? []).map((p) => p.spec.nodeName))].join(', ') || 'no node'}; ${(mwc?.webhooks ?? []).map((w: Obj) => w.name).join(', ')}; caBundle on ${withCa}`);

  // The node to close joins: the DaemonSets roll onto it.
  const closedUp = await nodeReady(closed, 'closed-containerd');
  if (!check('the second kubelet registers and its node is Ready', closedUp, closedUp ? `${closed.name} at ${closed.ip} (${choice.kind} slot ${closed.ctrd.slot}, pods ${slotLayout(closed.ctrd.slot).subnet4})` : `see ${closed.kubelet.log}`)) return 1;
  const agentPods = await cluster.ready('probe-agent', AGENT, 2, 180_000);
  const agentNodes = (agentPods ?? []).map((p) => `${p.spec.nodeName}: ${p.metadata.name}`).sort();
  check('agent DaemonSet Ready on both nodes', agentPods !== undefined && new Set(agentPods.map((p) => p.spec.nodeName)).size === 2,
    agentPods ? `${agentNodes.join(', ')}; image ${agentPods[0]!.spec.containers[0].image}` : podSummary(cluster, 'probe-agent'));
  if (MODE === 'gates') {
    if (!agentPods) return 1;
    await gatesPhase({ k, open: open.name, closed: closed.name, closedSubnet: slotLayout(closed.ctrd.slot).subnet4, nft, nftTable: NFT, image: `docker.io/library/${IMAGE}`, scalePods: SCALE_PODS, scratch,
      killContainer: (id) => closed.ctrd.killContainer(id), apiPort: cp.apiPort, apiserverSignal: cp.apiserverSignal });
    return checks.every((c) => c.outcome !== 'FAIL') ? 0 : 1;
  }

  // Step 2a: the installer installs the shim; the run starts it as its unit says; kubelet switches.
  const shimDir = (n: LabNode): string => path.join(n.root, 'opt/probe-agent-shim');
  const installed = await waitFor('the installer to install the shim release on both nodes', 120_000, () => nodes.every((n) => existsSync(path.join(shimDir(n), 'current/dist/shim/main.js'))) || undefined, 1000);
  const unit = path.join(closed.root, 'etc/systemd/system/probe-agent-shim.service');
  check('installer copies the shim release and its unit onto each node', installed === true && existsSync(unit), installed ? nodes.map((n) => `${n.name}: ${path.relative(scratch, shimDir(n))}/current`).join(', ') : podSummary(cluster, 'probe-agent'));
  if (!installed || !existsSync(unit)) return 1;
  const shim = startShimFromUnit(unit, closed.root, closed.ctrd.endpoint, path.join(scratch, 'shim.log'));
  cleanups.push(() => stopChild(shim));
  const shimSocket = path.join(closed.root, SHIM_SOCKET);
  if (!(await waitFor('the shim socket', 20_000, () => existsSync(shimSocket) || undefined))) {
    check('the installed shim starts', false, `see ${scratch}/shim.log`);
    return 1;
  }
  say('switching the closed node\'s kubelet to the shim (docs/closing-the-hole.md)');
  switchWindow.from = Date.now();
  await closed.kubelet.stop();
  closed.kubelet.setup.runtimeEndpoint = `unix://${shimSocket}`;
  // The installer reads the node's own path of it.
  closed.flags(`unix://${SHIM_SOCKET}`);
  const switched = await closed.kubelet.start('closed-shim');
  switchWindow.to = Date.now() + 10_000;
  const labelled = switched && await waitFor('the installer to label the node', 60_000, () => k.json<Obj>(['node', closed.name])?.metadata?.labels?.[SHIM_NODE_LABEL] === 'ready' || undefined, 1000);
  const agentAfter = cluster.pods('probe-agent', AGENT).find((p) => p.spec.nodeName === closed.name);
  const openLabel = k.json<Obj>(['node', open.name])?.metadata?.labels?.[SHIM_NODE_LABEL];
  check('kubelet through the shim; installer labels the closed node shim=ready, not the open one; no pod restarted', labelled === true && openLabel === undefined && restartsOf(agentAfter ?? {}) === 0,
    `${closed.name}: label ${labelled ? 'set by the installer' : 'missing'}; ${open.name} (kubelet on ${choice.kind}): label ${openLabel ?? 'none'}; agent restarts ${restartsOf(agentAfter ?? {})}`);
  if (!labelled) return 1;

  // Close the hole on the closed node: taint it, and drop node->pod connections to its pods only.
  const closedSubnet = slotLayout(closed.ctrd.slot).subnet4;
  nft(`table inet ${NFT} {\n  chain out {\n    ip daddr ${closedSubnet} ct state new counter drop\n  }\n}\n`);
  k.must(['taint', 'node', closed.name, `${CLOSED_HOLE_TAINT_KEY}=:NoSchedule`]);

  // Step 2b: workloads through the API server and the webhook.
  k.apply([
    { apiVersion: 'v1', kind: 'Namespace', metadata: { name: APPS_NS, labels: { 'probe-agent.io/rewrite': 'enabled' } } },
    { apiVersion: 'v1', kind: 'Namespace', metadata: { name: OTHER_NS } },
  ]);
  await waitFor('the namespaces\' default service accounts', 30_000, () => (k.run(['-n', APPS_NS, 'get', 'sa', 'default']).ok && k.run(['-n', OTHER_NS, 'get', 'sa', 'default']).ok) || undefined, 500);
  const created = k.apply([webDeployment(), grpcDeployment(`docker.io/library/${IMAGE}`), daemonSet('daemon', true), daemonSet('daemon-untolerated', false)]);
  check('workloads created', created.ok, created.ok ? 'web (2), grpc (1), daemon (DaemonSet, tolerates the taint), daemon-untolerated (DaemonSet)' : created.stderr.slice(0, 300));
  // The DaemonSet runs on both nodes: rewritten where the shim is, as written on the open node.
  const apps = { web: 2, grpc: 1, daemon: 2 };
  const readyApps: Record<string, Obj[] | undefined> = {};
  for (const [app, n] of Object.entries(apps)) readyApps[app] = await cluster.ready(APPS_NS, `app=${app}`, n, 180_000);
  for (const [app, n] of Object.entries(apps)) {
    const ps = readyApps[app] ?? cluster.pods(APPS_NS, `app=${app}`);
    const onClosed = ps.filter((p) => p.spec.nodeName === closed.name);
    const onOpen = ps.filter((p) => p.spec.nodeName !== closed.name);
    const facts = onClosed.map(rewriteFacts);
    const openPlain = onOpen.every((p) => p.spec.nodeName === open.name && !containersOf(p).flatMap(handlersOf).some(isRewrittenHandler));
    check(`${app}: stored pods rewritten by the API server's call${app === 'daemon' ? ' on the closed node, as written on the open one' : ''}`,
      ps.length >= n && onClosed.length === (app === 'daemon' ? 1 : n) && facts.every((f) => f.all) && openPlain,
      [...facts.map((f) => `${closed.name}: ${f.detail}`), ...onOpen.map((p) => `${p.spec.nodeName}: ${openPlain ? 'as written' : 'rewritten'}`)].join('; ') || 'no pod');
    check(`${app}: Ready${app === 'daemon' ? '; on the closed node' : ''} through the shim, node->pod dropped${app === 'daemon' ? '; on the open node reachable' : ''}`,
      readyApps[app] !== undefined && ps.every((p) => restartsOf(p) === 0) && (await nodeCannotReach(onClosed)) && (await nodeReaches(onOpen)),
      `${ps.filter(isReady).length}/${ps.length} Ready, restarts ${ps.map(restartsOf).join(',')}`);
  }
  // Without the toleration in its template the DaemonSet controller makes no pod for the closed node.
  const untolerated = k.json<Obj>(['daemonset', '-n', APPS_NS, 'daemon-untolerated']);
  const untoleratedPods = cluster.pods(APPS_NS, 'app=daemon-untolerated');
  check('a DaemonSet whose template lacks the toleration skips the closed node', untolerated?.status?.desiredNumberScheduled === 1 && untoleratedPods.length === 1 && untoleratedPods[0]!.spec.nodeName === open.name,
    `desiredNumberScheduled ${untolerated?.status?.desiredNumberScheduled}, pods on ${untoleratedPods.map((p) => p.spec.nodeName).join(', ') || 'no node'} (docs/closing-the-hole.md: add the toleration to daemons that must run there)`);
  k.run(['-n', APPS_NS, 'delete', 'daemonset', 'daemon-untolerated']);
  const web = readyApps['web'] ?? [];
  const postStart = web.every((p) => /url:\/poststart/.test(k.run(['-n', APPS_NS, 'logs', p.metadata.name, '-c', 'server']).stdout));
  check('web: postStart httpGet reached the pod', web.length > 0 && postStart, postStart ? 'each web pod\'s httpd logged GET /poststart' : 'missing in a pod\'s log');

  // Which agent runs the rewritten probes: the closed node's answers its shim's calls, the open node's has none.
  const execSyncs = new Map(cluster.pods('probe-agent', AGENT).map((p) => [p.spec.nodeName as string, agentMetric(k, p.metadata.name, 'probe_agent_exec_sync_commands_total')]));
  const results = new Map(cluster.pods('probe-agent', AGENT).map((p) => [p.spec.nodeName as string, agentMetric(k, p.metadata.name, 'probe_agent_probe_results_total')]));
  check('the closed node\'s agent runs the rewritten probes, the open node\'s none', (execSyncs.get(closed.name) ?? 0) > 0 && execSyncs.get(open.name) === 0,
    nodes.map((n) => `${n.name}: ${execSyncs.get(n.name) ?? 'no agent'} rewritten commands from the shim, ${results.get(n.name) ?? 'no agent'} probe runs`).join('; '));

  // Reinvocation beside a second webhook, in both orders.
  const second = await startSecondWebhook(open.ip, cp.pki.issue('second-webhook', cp.webhookCa, { subject: '/CN=second', server: true, sans: [`IP:${open.ip}`] }), BUSYBOX_IMAGE_REF);
  cleanups.push(() => second.close());
  for (const name of ['a-second', 'z-second']) {
    k.apply([secondWebhookConfig(name, second.url, cp.webhookCa.cert, APPS_NS)]);
    await sleep(2000);
    const podName = `reinvoked-${name}`;
    const made = await createReviewed(k, { ...plainPod(podName, APPS_NS), metadata: { name: podName, namespace: APPS_NS, labels: { app: podName, 'e2e-second': name } } });
    const p = made.ok ? await waitFor(`${podName} Ready`, 120_000, () => { const x = cluster.pod(APPS_NS, podName); return x && isReady(x) ? x : undefined; }, 1000) : undefined;
    const stored = p ?? cluster.pod(APPS_NS, podName) ?? {};
    const added = (stored.spec?.containers ?? []).find((c: Obj) => c.name === 'added');
    const f = rewriteFacts(stored);
    check(`reinvocation: ${name} ${name < 'probe-agent-rewrite' ? 'before' : 'after'} ours: the added container's probe rewritten`,
      added !== undefined && isRewrittenHandler(added.readinessProbe ?? {}) && f.all && p !== undefined,
      `${added ? 'container added' : made.ok ? 'no container added' : made.stderr.slice(0, 200)}; ${f.detail}; ${p ? `Ready on ${p.spec.nodeName}` : 'not Ready'}`);
    k.run(['delete', 'mutatingwebhookconfiguration', name]);
  }

  // Step 3: the installer's RBAC and its unlabel refusal.
  await installerChecks(k, cluster, scratch, cp.server, cp.ca.cert, closed.name, open.name);

  // Step 4: the taint and the affinity, through the real scheduler.
  const placed = await runsOpenStaysOffClosed(k, cluster, OTHER_NS, 'unrewritten', open.name, closed.name);
  check('taint: an unrewritten pod runs on the open node and stays off the closed one', placed.ok, placed.detail);
  await createReviewed(k, plainPod('pinned-open', APPS_NS, { nodeSelector: { 'kubernetes.io/hostname': open.name } }));
  await sleep(5000);
  const why2 = cluster.unschedulable(APPS_NS, 'pinned-open');
  const pinned = cluster.pod(APPS_NS, 'pinned-open') ?? {};
  check('affinity: a rewritten pod stays off the node without the shim', rewriteFacts(pinned).all && why2 !== undefined && /affinity|selector/i.test(why2),
    `pinned to ${open.name}: ${rewriteFacts(pinned).detail}; ${why2 ?? `scheduled on ${pinned.spec?.nodeName}`}`);
  k.run(['-n', APPS_NS, 'delete', 'pod', 'pinned-open', '--wait=false']);

  // Step 5's first faults, then step 6 (scale), then the rollback, which takes the closed node out.
  const logs = new LogWatch(k);
  logs.pods(cluster, WEBHOOK);
  await webhookDown(k, cluster, open.name, closed.name);
  logs.pods(cluster, AGENT);
  say('rolling the agent DaemonSet to a new image');
  const rolloutWindow = { from: Date.now(), to: 0 };
  const newTag = `probe-agent:${VERSION}-e2e-rollout`;
  for (const n of nodes) n.ctrd.tagImage(`docker.io/library/${IMAGE}`, `docker.io/library/${newTag}`);
  if (helm) {
    // An operator's upgrade to a new image and its rollback: every probe-agent workload rolls (one
    // image runs them all), the rewritten pods keep running. Their logs are read before they go.
    const everyPod = ['probe-agent', 'probe-agent-shim-installer', 'probe-agent-webhook'];
    const takeLogs = (): void => { for (const n of everyPod) logs.pods(cluster, `app.kubernetes.io/name=${n}`); };
    takeLogs();
    await agentRollout(k, cluster, 'helm upgrade to a new image tag', newTag, everyPod,
      () => helm.run(['upgrade', 'probe-agent', CHART, '--namespace', 'probe-agent', '--reuse-values', '--set', `image.tag=${newTag.split(':')[1]}`, ...helm.postRender()]));
    takeLogs();
    await agentRollout(k, cluster, 'helm rollback to revision 1', IMAGE, everyPod, () => helm.run(['rollback', 'probe-agent', '1', '--namespace', 'probe-agent']));
    const history = helm.run(['history', 'probe-agent', '--namespace', 'probe-agent', '-o', 'json']);
    say(`helm history: ${history.ok ? (JSON.parse(history.stdout) as Obj[]).map((r) => `${r.revision} ${r.status} ${r.description}`).join('; ') : history.stderr.trim()}`);
  } else {
    await agentRollout(k, cluster, 'agent rolled to a new image', newTag, ['probe-agent'],
      () => k.run(['-n', 'probe-agent', 'set', 'image', 'daemonset/probe-agent', `agent=${newTag}`]));
  }
  rolloutWindow.to = Date.now();
  say(`${SCALE_PODS} pods`);
  const scaleWindow = { from: Date.now(), to: 0 };
  await scaleStep(k, cluster, cp, open.name, closed.name);
  // The burst's pods are deleted at its end; their teardown keeps the node loaded for a while after.
  scaleWindow.to = Date.now() + 60_000;
  logs.pods(cluster, AGENT);
  logs.pods(cluster, WEBHOOK);
  logs.pods(cluster, 'app.kubernetes.io/name=probe-agent-shim-installer');
  await rollback(k, cluster, closed, NFT);
  logs.take('shim', readFileSync(path.join(scratch, 'shim.log'), 'utf8'));
  // What the run causes on purpose, each only in its own step: the agent's rollout leaves the shim
  // without an agent for a moment; 100 pods starting at once on this 2-core node (the control plane
  // on it too) starve the agent, whose probes then time out, wait for the netns helper or overrun
  // the watchdog (its stalled loop's timeouts are not counted, and said so), and the shim answers
  // kubelet's rewritten probes UNAVAILABLE (kubelet keeps their last result); the starved webhook
  // may cut the API server's TLS handshake (a failed review); the starved runtime's CRI calls time
  // out, and the agent probes in a pod's last known netns or, with none, reports it unresolved.
  const at = (line: string): number => Date.parse(/"(?:ts|time)":"([^"]+)"/.exec(line)?.[1] ?? '');
  const within = (w: { from: number; to: number }) => (line: string) => at(line) >= w.from && at(line) <= w.to;
  const expected = [
    { re: /kubelet pod list unavailable/, when: within(switchWindow), why: 'the kubelet restart onto the shim' },
    { re: /rewritten handler not run/, when: within(rolloutWindow), why: 'the agent rollout' },
    { re: /probe errored; result kept.*"reason":"(timeout|helper-error|netns-unresolved)"|netns resolver unavailable; probing in the last known netns|probe errored; result kept.*"prober did not return within|netns helper stderr.*agent is not reading|rewritten handler not run|slow admission clients cut|probe timeouts not counted: the agent's event loop was stalled/, when: within(scaleWindow), why: `the ${SCALE_PODS}-pod burst` },
  ];
  const unexpected = logs.lines.filter((l) => !expected.some((e) => e.re.test(l.line) && e.when(l.line)));
  const perRule = expected.map((e) => `${logs.lines.filter((l) => e.re.test(l.line) && e.when(l.line)).length} during ${e.why}`);
  const allowed = logs.lines.length - unexpected.length;
  writeFileSync(path.join(scratch, 'warnings.log'), logs.lines.map((l) => `${l.who}: ${l.line}`).join('\n'));
  const byMsg = new Map<string, number>();
  for (const l of unexpected) {
    const key = `${l.who.replace(/-[a-z0-9]{5}$/, '')}: ${/"msg":"([^"]*)"/.exec(l.line)?.[1] ?? l.line.slice(0, 80)}${/"reason":"([^"]*)"/.exec(l.line)?.[1] ? ` (${/"reason":"([^"]*)"/.exec(l.line)?.[1]})` : ''}`;
    byMsg.set(key, (byMsg.get(key) ?? 0) + 1);
  }
  check('no unexpected warn/error in the agent, webhook, installer and shim logs', unexpected.length === 0,
    `${allowed} expected (${perRule.join(', ')}); unexpected: ${[...byMsg].map(([k, n]) => `${n}x ${k}`).join('; ') || 'none'} (all lines: warnings.log)`);

  console.log(`\nlogs: E2E_KEEP_LOGS=1 keeps the control plane's, kubelet's and the shim's logs (${Object.keys(cp.logs).join(', ')}, kubelet, shim)`);
  return checks.every((c) => c.outcome !== 'FAIL') ? 0 : 1;
}

/**
 * The unit's ExecStart on the node whose own directories are under `nodeRoot` (overlay.ts), with its
 * lab containerd: what systemd would run there.
 */
function startShimFromUnit(unit: string, nodeRoot: string, runtimeEndpoint: string, log: string): ChildProcess {
  const text = readFileSync(unit, 'utf8').replace(/\\\n\s*/g, ' ');
  const exec = /^ExecStart=(.*)$/m.exec(text)?.[1]?.trim().split(/\s+/) ?? [];
  const own = NODE_DIRS.map((d) => `/${d}/`);
  const args = exec.map((a) => {
    const scheme = a.startsWith('unix://') ? 'unix://' : '';
    const p = a.slice(scheme.length);
    return own.some((d) => p.startsWith(d)) ? `${scheme}${path.join(nodeRoot, p)}` : a;
  });
  const i = args.indexOf('--runtime-endpoint');
  if (i >= 0) args[i + 1] = runtimeEndpoint;
  return startLogged(args[0]!, args.slice(1), log);
}

function podSummary(cluster: Cluster, ns: string): string {
  return cluster.pods(ns).map((p) => `${p.metadata.name} ${p.status?.phase} ${(p.status?.containerStatuses ?? []).map((s: Obj) => JSON.stringify(s.state)).join(' ')}`).join('; ').slice(0, 500) || 'no pods';
}

/** Every pod IP on its first container port, from the node: none may connect. */
async function nodeCannotReach(pods: Obj[]): Promise<boolean> {
  for (const p of pods) {
    const port = p.spec.containers[0]?.ports?.[0]?.containerPort;
    if (!p.status?.podIP || !port) return false;
    if ((await connectFromNode(p.status.podIP, port, 1000)).result === 'connected') return false;
  }
  return pods.length > 0;
}

/**
 * Creates a bare pod in an opted-in namespace as its controller would: a refusal by
 * probe-agent-rewrite-reviewed (the review failed: the webhook slow or not Ready on this loaded
 * machine) is retried, up to 6 times 10 s apart; any other answer is returned.
 */
async function createReviewed(k: Kubectl, pod: object): Promise<KubectlResult> {
  let r = k.apply([pod]);
  for (let i = 0; i < 6 && !r.ok && /did not review this pod/.test(r.stderr); i++) {
    say(`${(pod as Obj).metadata.name}: the webhook did not review it; created again in 10 s, as a controller would`);
    await sleep(10_000);
    r = k.apply([pod]);
  }
  return r;
}

/** Every pod IP on its first container port, from the node: each connects (the open node's pods). */
async function nodeReaches(pods: Obj[]): Promise<boolean> {
  for (const p of pods) {
    const port = p.spec.containers[0]?.ports?.[0]?.containerPort;
    if (!p.status?.podIP || !port || (await connectFromNode(p.status.podIP, port, 3000)).result !== 'connected') return false;
  }
  return true;
}

/**
 * A pod with an HTTP readiness probe, created as `name` in `ns` (unless `exists`), and its twin
 * pinned to the closed node by nodeSelector: the first is scheduled on the open node and becomes
 * Ready by kubelet's own probe there, the twin stays Pending on the closed node's taint. Both go.
 */
async function runsOpenStaysOffClosed(k: Kubectl, cluster: Cluster, ns: string, name: string, open: string, closed: string, exists = false): Promise<{ ok: boolean; detail: string }> {
  const pinnedName = `${name}-pinned`;
  const made = [...(exists ? [] : [k.apply([plainPod(name, ns)])]), k.apply([plainPod(pinnedName, ns, { nodeSelector: { 'kubernetes.io/hostname': closed } })])];
  const failed = made.find((r) => !r.ok);
  if (failed) return { ok: false, detail: `not admitted: ${failed.stderr.trim().slice(0, 200)}` };
  const p = await waitFor(`${ns}/${name} Ready`, 120_000, () => { const x = cluster.pod(ns, name); return x && isReady(x) ? x : undefined; }, 1000) ?? cluster.pod(ns, name);
  const why = cluster.unschedulable(ns, pinnedName);
  const twin = cluster.pod(ns, pinnedName);
  const f = p ? rewriteFacts(p) : undefined;
  const ok = p !== undefined && isReady(p) && p.spec.nodeName === open && f?.all === false && !JSON.stringify(p.spec.tolerations ?? []).includes(CLOSED_HOLE_TAINT_KEY)
    && twin !== undefined && !twin.spec.nodeName && why !== undefined && /taint/i.test(why);
  k.run(['-n', ns, 'delete', 'pod', name, pinnedName, '--wait=false']);
  return { ok, detail: `${name}: ${p ? `${f?.detail}; ${isReady(p) ? 'Ready' : 'not Ready'} on ${p.spec.nodeName ?? 'no node'}` : 'gone'}; ${pinnedName} (nodeSelector ${closed}): ${twin?.spec?.nodeName ? `scheduled on ${twin.spec.nodeName}` : why ?? 'no reason'}` };
}

/**
 * The installer's token as its pod holds it: bound to the installer pod, so from 1.30 it carries the
 * pod's node (the authentication.kubernetes.io/node-name extra the node-label policy reads). Both sides:
 * its own node's label allowed, another node's refused (where the policy exists); and an unbound token
 * of the same account, which names no node, refused for its own node too.
 */
async function installerChecks(k: Kubectl, cluster: Cluster, scratch: string, server: string, caFile: string, own: string, other: string): Promise<void> {
  const pod = cluster.pods('probe-agent', 'app.kubernetes.io/name=probe-agent-shim-installer').find((p) => p.spec.nodeName === own);
  if (pod === undefined) {
    check('installer RBAC: the protection this version has (a token bound to the installer pod)', false, `no installer pod to bind a token to: ${podSummary(cluster, 'probe-agent')}`);
    check('installer refuses to unlabel while rewritten pods run', false, 'no installer pod');
    return;
  }
  const mint = (bound: boolean): string => k.must(['-n', 'probe-agent', 'create', 'token', 'probe-agent-shim-installer',
    ...(bound ? ['--bound-object-kind', 'Pod', '--bound-object-name', pod.metadata.name] : [])]).trim();
  const token = mint(true);
  const tokenFile = path.join(scratch, 'installer.token');
  writeFileSync(tokenFile, token, { mode: 0o600 });
  const unboundFile = path.join(scratch, 'installer-unbound.token');
  writeFileSync(unboundFile, mint(false), { mode: 0o600 });
  const as = (args: string[]) => k.withToken(token, path.join(scratch, 'installer.kubeconfig')).run(args);
  // The installer's own code (label-node.mjs) with an installer token, for a node it names.
  const labelAs = (node: string, state: 'ready' | 'absent', file = tokenFile) => spawnSync(process.execPath, [path.join(REPO, 'deploy/components/kubelet-shim/label-node.mjs'), 'label', state], {
    encoding: 'utf8', timeout: 30_000, env: { ...process.env, NODE_NAME: node, KUBERNETES_API_URL: server, TOKEN_FILE: file, NODE_EXTRA_CA_CERTS: caFile },
  });
  const ownRun = labelAs(own, 'ready');
  const otherRun = labelAs(other, 'ready');
  // Where nothing refuses it (before 1.30), the open node must not keep a shim label it has no shim for.
  if (otherRun.status === 0) k.run(['label', 'node', other, `${SHIM_NODE_LABEL}-`]);
  const unboundRun = labelAs(own, 'ready', unboundFile);
  const ownR = { ok: ownRun.status === 0, stderr: ownRun.stderr ?? '' };
  const otherR = { ok: otherRun.status === 0, stderr: otherRun.stderr ?? '' };
  const unbound = { ok: unboundRun.status === 0 };
  const vap = k.run(['api-resources', '--api-group=admissionregistration.k8s.io']).stdout.includes('validatingadmissionpolicies');
  const listAll = as(['get', 'pods', '-A', '-o', 'name']);
  check('installer RBAC: the protection this version has (a token bound to the installer pod)',
    ownR.ok && (vap ? !otherR.ok && !unbound.ok : otherR.ok),
    `own node (${own}) label: ${ownR.ok ? 'allowed' : ownR.stderr.trim().slice(0, 300)}; the other node's (${other}) shim label: ${otherR.ok ? 'allowed' : 'denied'} (${vap ? 'ValidatingAdmissionPolicy present: must be denied' : 'no ValidatingAdmissionPolicy before 1.30: RBAC cannot narrow it, documented'}); an unbound token, own node: ${unbound.ok ? 'allowed' : 'denied'}${vap ? ' (no node-name: must be denied)' : ''}; list pods in every namespace: ${listAll.ok ? `${listAll.stdout.trim().split('\n').length} pods readable` : 'denied'}`);
  const unlabel = k.run(['-n', 'probe-agent', 'exec', pod.metadata.name, '--', '/bin/bash', '/installer/install-shim.sh', 'unlabel']);
  const still = k.json<Obj>(['node', own])?.metadata?.labels?.[SHIM_NODE_LABEL];
  check('installer refuses to unlabel while rewritten pods run', !unlabel.ok && still === 'ready' && /web-|daemon-|grpc-/.test(unlabel.stderr),
    `exit ${unlabel.ok ? 0 : 'non-zero'}; label ${still}; ${unlabel.stderr.trim().split('\n').slice(-3).join(' | ').slice(0, 200)}`);
}

/** The webhook pods' own request-duration histogram, read with the API server's admission client certificate. */
async function webhookServerView(cluster: Cluster, cp: ControlPlane): Promise<[number, number][]> {
  const sum = new Map<number, number>();
  for (const p of cluster.pods('probe-agent', 'app.kubernetes.io/name=probe-agent-webhook')) {
    const text = await new Promise<string>((resolve) => {
      const req = httpsRequest({ host: p.status.podIP, port: WEBHOOK_PORT, path: '/metrics', cert: readFileSync(cp.admissionClient.cert), key: readFileSync(cp.admissionClient.key), ca: readFileSync(cp.webhookCa.cert), servername: WEBHOOK_HOST, timeout: 5000 }, (res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => { body += c; });
        res.on('end', () => resolve(body));
      });
      req.on('error', () => resolve(''));
      req.end();
    });
    for (const [le, n] of histogram(text, 'probe_agent_webhook_request_duration_seconds', (l) => l.includes('path="/mutate"'))) sum.set(le, (sum.get(le) ?? 0) + n);
  }
  return [...sum].sort((a, b) => a[0] - b[0]);
}

async function scaleStep(k: Kubectl, cluster: Cluster, cp: ControlPlane, open: string, closed: string): Promise<void> {
  if (!(SCALE_PODS > 0)) {
    skip('scale', `E2E_SCALE_PODS=${process.env['E2E_SCALE_PODS']}`);
    return;
  }
  const hook = 'namespaces.rewrite.probe-agent.io';
  const latency = (text: string) => histogram(text, 'apiserver_admission_webhook_admission_duration_seconds', (l) => l.includes(`name="${hook}"`) && l.includes('operation="CREATE"'));
  const metricsBefore = k.raw('/metrics');
  const serverBefore = await webhookServerView(cluster, cp);
  const t0 = Date.now();
  k.apply([scaleDeployment(SCALE_PODS)]);
  // Each pod ends rewritten and Ready on the closed node, or (its review failed, failurePolicy Ignore,
  // and no policy refused it: before 1.30) as written on the open node, where such a pod is safe.
  const settled = (p: Obj): 'rewritten' | 'open' | undefined =>
    (rewriteFacts(p).all && isReady(p) && p.spec.nodeName === closed ? 'rewritten' : !rewriteFacts(p).all && isReady(p) && p.spec.nodeName === open ? 'open' : undefined);
  const ps = await waitFor(`${SCALE_PODS} scale pods settled`, 900_000, () => {
    const all = cluster.pods(APPS_NS, 'app=scale');
    return all.length >= SCALE_PODS && all.every((p) => settled(p) !== undefined) ? all : undefined;
  }, 2000);
  const secs = ((Date.now() - t0) / 1000).toFixed(0);
  const metricsAfter = k.raw('/metrics');
  const apiView = minus(latency(metricsAfter), latency(metricsBefore));
  const serverView = minus(await webhookServerView(cluster, cp), serverBefore);
  const failedBefore = failedCalls(metricsBefore, hook);
  const failed = [...failedCalls(metricsAfter, hook)].map(([key, n]) => [key, n - (failedBefore.get(key) ?? 0)] as const).filter(([, n]) => n > 0);
  const all = ps ?? cluster.pods(APPS_NS, 'app=scale');
  const rewritten = all.filter((p) => settled(p) === 'rewritten').length;
  const held = all.filter((p) => settled(p) === 'open').length;
  check(`scale: ${SCALE_PODS} pods through the scheduler and the webhook, each rewritten on the closed node or left safe`, ps !== undefined && rewritten + held === SCALE_PODS && rewritten > 0,
    `${rewritten} rewritten and Ready on the closed node, ${held} admitted as written after a failed review and run on the open node, in ${secs} s; admission latency measured by the API server (${hook}): ${p50p99(apiView)}; by the webhook: ${p50p99(serverView)}; failed calls: ${failed.map(([key, n]) => `${key}: ${n}`).join('; ') || 'none'}`);
  k.run(['-n', APPS_NS, 'delete', 'deployment', 'scale'], undefined, 120_000);
  await waitFor('the scale pods gone', 300_000, () => cluster.pods(APPS_NS, 'app=scale').length === 0 || undefined, 2000);
}

/**
 * The webhook down. Under failurePolicy Ignore the API server admits an opted-in pod unreviewed; from
 * 1.30 the policy probe-agent-rewrite-reviewed (docs/deploy.md, "When a review fails") refuses it
 * instead, so a bare pod is refused with its message and a controller's pod is created through the
 * webhook once it is back; what is admitted meanwhile are pods of namespaces not opted in. Before 1.30
 * the unreviewed opted-in pod is admitted as written. Either way the pod admitted while the webhook
 * is down runs on the open node, and the taint keeps it off the closed one. Under Fail the pod is
 * refused either way.
 */
async function webhookDown(k: Kubectl, cluster: Cluster, open: string, closed: string): Promise<void> {
  const reviewedPolicy = k.run(['get', 'validatingadmissionpolicy', 'probe-agent-rewrite-reviewed']).ok;
  k.must(['-n', 'probe-agent', 'scale', 'deployment', 'probe-agent-webhook', '--replicas=0']);
  await waitFor('the webhook pods gone', 60_000, () => cluster.pods('probe-agent', WEBHOOK).length === 0 || undefined, 1000);
  const bare = k.apply([plainPod('while-down-ignore', APPS_NS)]);
  if (reviewedPolicy) {
    k.apply([retriedDeployment('while-down')]);
    await sleep(5000);
    const refusedBare = !bare.ok && /did not review this pod/.test(bare.stderr) && cluster.pod(APPS_NS, 'while-down-ignore') === undefined;
    const rs = cluster.k.json<{ items: Obj[] }>(['replicasets', '-n', APPS_NS, '-l', 'app=while-down'])?.items ?? [];
    const failedCreate = rs.flatMap((r) => r.status?.conditions ?? []).find((c: Obj) => c.type === 'ReplicaFailure');
    const held = cluster.pods(APPS_NS, 'app=while-down').length;
    check('webhook down, failurePolicy Ignore: opted-in pods refused unreviewed (probe-agent-rewrite-reviewed), none created',
      refusedBare && held === 0 && failedCreate !== undefined,
      `bare pod: ${bare.ok ? 'admitted' : bare.stderr.replace(/\s+/g, ' ').trim().slice(0, 240)}; a Deployment's pods: ${held}, its ReplicaSet: ${failedCreate ? `${failedCreate.reason} (retries)` : 'no ReplicaFailure'}`);
    const placed = await runsOpenStaysOffClosed(k, cluster, OTHER_NS, 'while-down-plain', open, closed);
    check('webhook down: a pod admitted meanwhile (namespace not opted in) runs on the open node, stays off the closed one', placed.ok, placed.detail);
  } else {
    const placed = bare.ok ? await runsOpenStaysOffClosed(k, cluster, APPS_NS, 'while-down-ignore', open, closed, true) : { ok: false, detail: `not admitted: ${bare.stderr.trim().slice(0, 200)}` };
    check('webhook down, failurePolicy Ignore: admitted as written, runs on the open node, stays off the closed one', placed.ok, placed.detail);
  }
  const mwc = k.json<Obj>(['mutatingwebhookconfiguration', 'probe-agent-rewrite']);
  const policy = (v: string) => JSON.stringify((mwc?.webhooks ?? []).map((_: unknown, i: number) => ({ op: 'replace', path: `/webhooks/${i}/failurePolicy`, value: v })));
  k.must(['patch', 'mutatingwebhookconfiguration', 'probe-agent-rewrite', '--type=json', '-p', policy('Fail')]);
  const refused = k.apply([plainPod('while-down-fail', APPS_NS)]);
  check('webhook down, failurePolicy Fail: the pod is refused', !refused.ok && cluster.pod(APPS_NS, 'while-down-fail') === undefined, refused.ok ? 'admitted' : refused.stderr.trim().split('\n')[0]!.slice(0, 200));
  k.must(['patch', 'mutatingwebhookconfiguration', 'probe-agent-rewrite', '--type=json', '-p', policy('Ignore')]);
  k.must(['-n', 'probe-agent', 'scale', 'deployment', 'probe-agent-webhook', '--replicas=2']);
  const back = await cluster.ready('probe-agent', WEBHOOK, 2, 120_000);
  check('webhook back: 2 replicas Ready on the open node', back !== undefined && back.every((p) => p.spec.nodeName === open),
    back ? back.map((p) => `${p.metadata.name} on ${p.spec.nodeName}`).join(', ') : podSummary(cluster, 'probe-agent'));
  if (reviewedPolicy) {
    // The ReplicaSet's retries back off exponentially: its next one may come well after the webhook is back.
    const retried = await cluster.ready(APPS_NS, 'app=while-down', 1, 300_000);
    const f = retried ? rewriteFacts(retried[0]!) : undefined;
    check('webhook back: the refused Deployment\'s pod created through the webhook, rewritten and Ready', f?.all === true,
      f ? f.detail : `not Ready: ${cluster.pods(APPS_NS, 'app=while-down').map((p) => `${p.metadata.name} ${p.status?.phase}`).join(', ') || 'no pod'}`);
    k.run(['-n', APPS_NS, 'delete', 'deployment', 'while-down', '--wait=false']);
  }
}

/**
 * `roll` moves the probe-agent workloads named in `names` (app.kubernetes.io/name) to `image` while
 * rewritten probes run: each rolls to it and is Ready, and no workload pod restarts (restart counts
 * and container ids unchanged).
 */
async function agentRollout(k: Kubectl, cluster: Cluster, what: string, image: string, names: string[], roll: () => KubectlResult): Promise<void> {
  const title = `${what}: ${names.length > 1 ? 'every probe-agent workload' : 'the agent DaemonSet'} rolled to ${image}, under rewritten probes nothing restarts`;
  const workloads = (): Obj[] => cluster.pods(APPS_NS).filter((p) => /^(web|grpc|daemon)-/.test(p.metadata.name));
  const before = workloads();
  let notReady = 0;
  let polls = 0;
  const rolled = roll();
  if (!rolled.ok) {
    check(title, false, rolled.stderr.trim().slice(0, 400));
    return;
  }
  // The DaemonSets on both nodes, the webhook's two replicas on the open one.
  const want: Record<string, number> = { 'probe-agent': 2, 'probe-agent-shim-installer': 2, 'probe-agent-webhook': 2 };
  const done = await waitFor(`${names.join(', ')} on ${image}`, 300_000, () => {
    polls++;
    notReady += workloads().some((p) => !isReady(p)) ? 1 : 0;
    return names.every((n) => {
      const ps = cluster.pods('probe-agent', `app.kubernetes.io/name=${n}`);
      return ps.length === want[n] && ps.every((p) => !p.metadata.deletionTimestamp && p.spec.containers.every((c: Obj) => c.image === image) && isReady(p));
    }) || undefined;
  }, 1000);
  await sleep(10_000);
  const after = workloads();
  const changed = before.filter((b) => { const a = after.find((x) => x.metadata.name === b.metadata.name); return !a || containerIds(a) !== containerIds(b) || restartsOf(a) !== restartsOf(b); });
  const ds = k.json<Obj>(['daemonset', '-n', 'probe-agent', 'probe-agent']);
  check(title, done === true && changed.length === 0 && after.length === before.length && after.every(isReady),
    `rollout ${done ? 'done' : 'not done'} on ${[...new Set(names.flatMap((n) => cluster.pods('probe-agent', `app.kubernetes.io/name=${n}`).map((p) => p.spec.nodeName)))].sort().join(' and ')} (DaemonSet image ${ds?.spec?.template?.spec?.containers?.[0]?.image}, ${ds?.status?.updatedNumberScheduled}/${ds?.status?.desiredNumberScheduled} updated); ${before.length} workload pods, changed ${changed.map((p) => p.metadata.name).join(', ') || 'none'}; polls with a workload pod not Ready: ${notReady}/${polls}`);
}

/** docs/closing-the-hole.md, "Roll back", step by step on the closed node: no pod killed. */
async function rollback(k: Kubectl, cluster: Cluster, node: LabNode, nftTable: string): Promise<void> {
  const name = node.name;
  const daemons = (): Obj[] => [...cluster.pods('probe-agent'), ...cluster.pods(APPS_NS, 'app=daemon')]
    .filter((p) => p.metadata.ownerReferences?.[0]?.kind === 'DaemonSet' && p.spec.nodeName === name);
  // 1. Open the hole.
  execFileSync('nft', ['flush', 'chain', 'inet', nftTable, 'out']);
  k.must(['taint', 'node', name, `${CLOSED_HOLE_TAINT_KEY}:NoSchedule-`]);
  // 2. Mark and cordon.
  k.must(['annotate', 'node', name, 'probe-agent.io/shim-rollback=true', '--overwrite']);
  k.must(['cordon', name]);
  // 3. Drain the rewritten pods (their controllers recreate them: Pending, no other shim node here).
  const drain = k.run(['drain', name, '--ignore-daemonsets', '--delete-emptydir-data', '--force', '--timeout=120s'], undefined, 180_000);
  // 4. Un-rewrite the daemon pods: delete each; the webhook leaves the new one as written (its 10 s cache first).
  await sleep(11_000);
  for (const p of cluster.pods(APPS_NS, 'app=daemon').filter((x) => x.spec.nodeName === name)) k.run(['-n', APPS_NS, 'delete', 'pod', p.metadata.name]);
  const daemonBack = (await cluster.ready(APPS_NS, 'app=daemon', 2, 120_000))?.filter((p) => p.spec.nodeName === name);
  const plain = daemonBack?.length === 1 && daemonBack.every((p) => !containersOf(p).flatMap(handlersOf).some(isRewrittenHandler));
  check('rollback 1-4: hole open, cordoned, drained; daemon pod recreated as written and Ready', drain.ok && plain,
    `drain ${drain.ok ? 'ok' : drain.stderr.trim().slice(0, 160)}; daemon pod ${daemonBack?.length ? (plain ? 'unrewritten, Ready' : 'still rewritten') : 'not Ready'}`);
  // 5. Remove the label.
  const installer = cluster.pods('probe-agent', 'app.kubernetes.io/name=probe-agent-shim-installer').find((p) => p.spec.nodeName === name);
  const unlabel = installer ? k.run(['-n', 'probe-agent', 'exec', installer.metadata.name, '--', '/bin/bash', '/installer/install-shim.sh', 'unlabel'], undefined, 120_000) : undefined;
  const label = k.json<Obj>(['node', name])?.metadata?.labels?.[SHIM_NODE_LABEL];
  // The installer's own lines say why it refused (kubectl's last line only gives its exit code).
  check('rollback 5: install-shim.sh unlabel removes the label', unlabel?.ok === true && label === undefined, `exit ${unlabel?.ok ? 0 : 'non-zero'}; label ${label ?? 'gone'}; ${unlabel?.stderr.trim().split('\n').slice(-6).join(' | ').slice(0, 600)}`);
  // 6. Kubelet back to the runtime, restarted: the running pods survive.
  const before = daemons();
  await node.kubelet.stop();
  node.kubelet.setup.runtimeEndpoint = node.ctrd.endpoint;
  node.flags(node.ctrd.endpoint);
  const back = await node.kubelet.start('closed-rolled-back');
  await sleep(20_000);
  const after = daemons();
  const killed = before.filter((b) => { const a = after.find((x) => x.metadata.name === b.metadata.name); return !a || containerIds(a) !== containerIds(b) || restartsOf(a) !== restartsOf(b); });
  check('rollback 6: kubelet on the runtime again; no pod killed', back && killed.length === 0 && after.every(isReady),
    `kubelet ${back ? 'up' : 'down'}; ${before.length} daemon pods, changed: ${killed.map((p) => p.metadata.name).join(', ') || 'none'}`);
  k.run(['uncordon', name]);
}


await runHarness('e2e-cluster', async () => {
  if (process.getuid?.() === 0) await inOwnMountNamespace();
  return main();
}, cleanups, () => heading || 'e2e-cluster: not started', 70);
