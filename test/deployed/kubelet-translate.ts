/**
 * Turns a rendered pod template (deploy/ through kustomize) into the CRI RunPodSandbox and
 * CreateContainer requests kubelet would send for it, following pkg/kubelet/kuberuntime
 * (kuberuntime_sandbox.go, kuberuntime_container*.go, security_context*.go) and
 * pkg/kubelet/kubelet_pods.go (environment, mounts). Only what the agent's manifests use is
 * translated; anything else in the template is an error, so a manifest change cannot slip past.
 */
import { execFileSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { mountsUnder } from '../lab/containerd-sweep.ts';

type Obj = Record<string, unknown>;

/** Where kubelet's node-side state lives for this pod, and the node facts the downward API exposes. */
export interface PodPlacement {
  nodeName: string;
  hostIP: string;
  /** status.podIP: the node IP for host-network pods. */
  podIP: string;
  uid: string;
  name: string;
  namespace: string;
  /** kubelet's pod dir stand-in: emptyDir, configMap and projected volumes are made below it. */
  podDir: string;
  /** /var/log/pods/<ns>_<name>_<uid> stand-in. */
  logDir: string;
  cgroupParent: string;
  /** The image reference kubelet resolved (what CRI ImageStatus returned). */
  imageRef(image: string): string;
  /** The node path a hostPath volume names, as the runtime should be given it (kubelet passes it as written). */
  hostPath(p: string): string;
  /** ConfigMaps of the rendered manifest, by name: data. */
  configMaps: Record<string, Record<string, string>>;
  /** The service-account token volume the apiserver's admission adds (token, ca.crt, namespace). */
  serviceAccount: { token: string; caCrt: string };
}

/** Node memory the QoS oom_score_adj is computed against (kubelet uses the node's capacity). */
const NODE_MEMORY_BYTES = 8 * 1024 ** 3;
const CPU_PERIOD_US = 100_000;
// kubelet's securitycontext defaults for ProcMountType Default (pkg/securitycontext/util.go).
const DEFAULT_MASKED_PATHS = ['/proc/asound', '/proc/acpi', '/proc/kcore', '/proc/keys', '/proc/latency_stats', '/proc/timer_list',
  '/proc/timer_stats', '/proc/sched_debug', '/proc/scsi', '/sys/firmware', '/sys/devices/virtual/powercap'];
const DEFAULT_READONLY_PATHS = ['/proc/bus', '/proc/fs', '/proc/irq', '/proc/sys', '/proc/sysrq-trigger'];

const SA_MOUNT = '/var/run/secrets/kubernetes.io/serviceaccount';

/** A mount as CRI takes it. */
interface CriMount { containerPath: string; hostPath: string; readonly: boolean; propagation: string }

function fail(what: string): never {
  throw new Error(`kubelet-translate: ${what} is not translated (extend test/deployed/kubelet-translate.ts)`);
}

function asObj(v: unknown): Obj {
  return (v ?? {}) as Obj;
}

function nsMode(host: boolean | undefined, otherwise: 'POD' | 'CONTAINER'): string {
  return host ? 'NODE' : otherwise;
}

/** Pod-level seccomp (the container's own wins), as kubelet's getSeccompProfile. */
function seccompOf(podSc: Obj, sc: Obj): Obj {
  const profile = asObj(sc.seccompProfile ?? podSc.seccompProfile);
  switch (profile.type) {
    case 'RuntimeDefault': return { profileType: 'RuntimeDefault' };
    case undefined: case 'Unconfined': return { profileType: 'Unconfined' };
    default: return fail(`seccompProfile.type ${String(profile.type)}`);
  }
}

/** RunPodSandbox's config for the template's pod (generatePodSandboxConfig). */
export function sandboxConfig(template: Obj, p: PodPlacement): Obj {
  const spec = asObj(template.spec);
  const podSc = asObj(spec.securityContext);
  const containers = (spec.containers ?? []) as Obj[];
  const labels = Object.fromEntries(Object.entries(asObj(asObj(template.metadata).labels)).map(([k, v]) => [k, String(v)]));
  return {
    metadata: { name: p.name, uid: p.uid, namespace: p.namespace, attempt: 0 },
    // Host-network pods keep the node's hostname.
    hostname: spec.hostNetwork ? '' : p.name,
    logDirectory: p.logDir,
    labels: { ...labels, 'io.kubernetes.pod.name': p.name, 'io.kubernetes.pod.namespace': p.namespace, 'io.kubernetes.pod.uid': p.uid },
    annotations: { ...asObj(asObj(template.metadata).annotations), 'kubernetes.io/config.source': 'api' },
    linux: {
      cgroupParent: p.cgroupParent,
      securityContext: {
        namespaceOptions: {
          network: nsMode(spec.hostNetwork as boolean, 'POD'),
          pid: spec.shareProcessNamespace ? 'POD' : nsMode(spec.hostPID as boolean, 'CONTAINER'),
          ipc: nsMode(spec.hostIPC as boolean, 'POD'),
        },
        // The sandbox is privileged when any container is (kubelet's HasPrivilegedContainer).
        privileged: containers.some((c) => asObj(c.securityContext).privileged === true),
        seccomp: seccompOf(podSc, {}),
      },
    },
  };
}

/** Environment as kubelet builds it (makeEnvironmentVariables): envFrom, then env with $(VAR) expansion. */
export function containerEnv(c: Obj, p: PodPlacement): { key: string; value: string }[] {
  const env = new Map<string, string>();
  for (const from of (c.envFrom ?? []) as Obj[]) {
    const ref = asObj(from.configMapRef);
    const data = p.configMaps[String(ref.name)];
    if (!data) fail(`envFrom of ConfigMap ${String(ref.name)} (not in the rendered manifest)`);
    for (const [k, v] of Object.entries(data)) env.set(`${String(from.prefix ?? '')}${k}`, v);
  }
  const expand = (s: string): string => s.replace(/\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)/g, (m, name: string | undefined) =>
    m === '$$' ? '$' : env.has(name as string) ? (env.get(name as string) as string) : m);
  for (const e of (c.env ?? []) as Obj[]) {
    const name = String(e.name);
    if (e.value !== undefined) {
      env.set(name, expand(String(e.value)));
      continue;
    }
    const field = String(asObj(asObj(e.valueFrom).fieldRef).fieldPath ?? '');
    const fields: Record<string, string> = {
      'spec.nodeName': p.nodeName, 'status.hostIP': p.hostIP, 'status.podIP': p.podIP,
      'metadata.name': p.name, 'metadata.namespace': p.namespace, 'metadata.uid': p.uid,
    };
    if (!(field in fields)) fail(`env ${name} valueFrom ${JSON.stringify(e.valueFrom)}`);
    env.set(name, fields[field] as string);
  }
  return [...env].map(([key, value]) => ({ key, value }));
}

/**
 * The size of a memory-backed emptyDir as kubelet's calculateEmptyDirMemorySize (SizeMemoryBackedVolumes,
 * GA in 1.32): node allocatable memory, lowered to the pod's memory limit (the sum of its containers'
 * limits, when every container declares one), lowered to the volume's sizeLimit.
 */
export function emptyDirMemoryBytes(emptyDir: Obj, spec: Obj): number {
  let size = NODE_MEMORY_BYTES;
  const limits = ((spec.containers ?? []) as Obj[]).map((c) => asObj(asObj(c.resources).limits).memory);
  if (limits.every((l) => l !== undefined)) {
    const pod = limits.reduce((n: number, l) => n + quantity(l), 0);
    if (pod > 0 && pod <= size) size = pod;
  }
  if (emptyDir.sizeLimit !== undefined) {
    const own = quantity(emptyDir.sizeLimit);
    if (own > 0 && own <= size) size = own;
  }
  return size;
}

/**
 * An emptyDir as kubelet's empty_dir plugin makes it: a directory per pod and volume
 * (pods/<uid>/volumes/kubernetes.io~empty-dir/<name>, mode 0777), with a tmpfs mounted on it for
 * medium Memory (size= from emptyDirMemoryBytes). Every container that mounts the volume gets a
 * bind of that one directory, so they share its files. Made once per pod: a second container
 * finds the tmpfs already there, as kubelet's setupTmpfs does. unmountPodVolumes undoes the mounts.
 */
function emptyDirPath(name: string, emptyDir: Obj, spec: Obj, p: PodPlacement): string {
  const dir = path.join(p.podDir, 'volumes/kubernetes.io~empty-dir', name);
  mkdirSync(dir, { recursive: true, mode: 0o777 });
  switch (emptyDir.medium ?? '') {
    case '':
      return dir;
    case 'Memory':
      if (!mountsUnder(dir).includes(dir)) {
        execFileSync('mount', ['-t', 'tmpfs', '-o', `size=${emptyDirMemoryBytes(emptyDir, spec)}`, 'tmpfs', dir]);
      }
      return dir;
    default:
      return fail(`emptyDir medium ${String(emptyDir.medium)} of ${name}`);
  }
}

/** What kubelet does when it tears a pod's volumes down: unmounts the tmpfs emptyDirs below its pod dir. */
export function unmountPodVolumes(podDir: string): void {
  for (const m of mountsUnder(podDir).reverse()) execFileSync('umount', ['-l', m]);
}

/** The node-side directory behind a volume (kubelet's volume plugins), made on demand. */
function volumeHostPath(vol: Obj, spec: Obj, p: PodPlacement): string {
  const name = String(vol.name);
  if (vol.hostPath) {
    const hp = asObj(vol.hostPath);
    if (hp.type === 'DirectoryOrCreate') mkdirSync(String(hp.path), { recursive: true, mode: 0o755 });
    return p.hostPath(String(hp.path));
  }
  if (vol.emptyDir) return emptyDirPath(name, asObj(vol.emptyDir), spec, p);
  if (vol.configMap) {
    const cm = asObj(vol.configMap);
    const data = p.configMaps[String(cm.name)];
    if (!data) fail(`configMap volume ${name} of ConfigMap ${String(cm.name)} (not in the rendered manifest)`);
    const dir = path.join(p.podDir, 'volumes/kubernetes.io~configmap', name);
    mkdirSync(dir, { recursive: true });
    for (const [k, v] of Object.entries(data)) writeFileSync(path.join(dir, k), v, { mode: Number(cm.defaultMode ?? 0o644) });
    return dir;
  }
  return fail(`volume ${name} of kind ${Object.keys(vol).filter((k) => k !== 'name').join(',')}`);
}

const PROPAGATION: Record<string, string> = {
  None: 'PROPAGATION_PRIVATE', HostToContainer: 'PROPAGATION_HOST_TO_CONTAINER', Bidirectional: 'PROPAGATION_BIDIRECTIONAL',
};

/** Mounts as kubelet's makeMounts: the volumeMounts, the SA token, /etc/hosts and the termination log. */
function containerMounts(c: Obj, spec: Obj, p: PodPlacement): CriMount[] {
  const volumes = new Map(((spec.volumes ?? []) as Obj[]).map((v) => [String(v.name), v]));
  const mounts: CriMount[] = [];
  for (const m of (c.volumeMounts ?? []) as Obj[]) {
    const vol = volumes.get(String(m.name)) ?? fail(`volumeMount ${String(m.name)} without a volume`);
    if (m.subPath) fail(`subPath of ${String(m.name)}`);
    const propagation = PROPAGATION[String(m.mountPropagation ?? 'None')] ?? fail(`mountPropagation ${String(m.mountPropagation)}`);
    mounts.push({ containerPath: String(m.mountPath), hostPath: volumeHostPath(vol, spec, p), readonly: m.readOnly === true, propagation });
  }
  // The ServiceAccount admission plugin adds the kube-api-access projected volume to every pod
  // (automountServiceAccountToken defaults to true): token, ca.crt and namespace, read-only.
  if (spec.automountServiceAccountToken !== false) {
    const dir = path.join(p.podDir, 'volumes/kubernetes.io~projected/kube-api-access');
    mkdirSync(dir, { recursive: true });
    writeFileSync(path.join(dir, 'token'), p.serviceAccount.token, { mode: 0o644 });
    writeFileSync(path.join(dir, 'ca.crt'), p.serviceAccount.caCrt, { mode: 0o644 });
    writeFileSync(path.join(dir, 'namespace'), p.namespace, { mode: 0o644 });
    mounts.push({ containerPath: SA_MOUNT, hostPath: dir, readonly: true, propagation: 'PROPAGATION_PRIVATE' });
  }
  // kubelet manages /etc/hosts for every pod with an IP (a copy of the node's for host network).
  const hosts = path.join(p.podDir, 'etc-hosts');
  writeFileSync(hosts, spec.hostNetwork ? '127.0.0.1\tlocalhost\n' : `127.0.0.1\tlocalhost\n${p.podIP}\t${p.name}\n`);
  mounts.push({ containerPath: '/etc/hosts', hostPath: hosts, readonly: false, propagation: 'PROPAGATION_PRIVATE' });
  const term = path.join(p.podDir, 'containers', String(c.name), 'termination-log');
  mkdirSync(path.dirname(term), { recursive: true });
  writeFileSync(term, '');
  mounts.push({ containerPath: String(c.terminationMessagePath ?? '/dev/termination-log'), hostPath: term, readonly: false, propagation: 'PROPAGATION_PRIVATE' });
  return mounts;
}

/** Kubernetes quantity → number (bytes or cores). */
export function quantity(q: unknown): number {
  const m = /^([0-9.]+)([a-zA-Z]*)$/.exec(String(q));
  if (!m) return fail(`quantity ${String(q)}`);
  const mult: Record<string, number> = { '': 1, m: 1e-3, k: 1e3, M: 1e6, G: 1e9, Ki: 1024, Mi: 1024 ** 2, Gi: 1024 ** 3 };
  const f = mult[m[2] as string] ?? fail(`quantity suffix ${m[2]}`);
  return Number(m[1]) * f;
}

/** The container's cgroup limits as generateLinuxContainerResources, and its QoS oom_score_adj. */
export function containerResources(c: Obj, critical: boolean): Obj {
  const res = asObj(c.resources);
  const req = asObj(res.requests);
  const lim = asObj(res.limits);
  const out: Obj = { cpuPeriod: CPU_PERIOD_US };
  const cpuReq = req.cpu !== undefined ? quantity(req.cpu) : lim.cpu !== undefined ? quantity(lim.cpu) : 0;
  // milliCPUToShares: 1024 shares per core, at least 2.
  out.cpuShares = Math.max(2, Math.floor((Math.round(cpuReq * 1000) * 1024) / 1000));
  if (lim.cpu !== undefined) out.cpuQuota = Math.max(1000, Math.floor((Math.round(quantity(lim.cpu) * 1000) * CPU_PERIOD_US) / 1000));
  if (lim.memory !== undefined) out.memoryLimitInBytes = quantity(lim.memory);
  // GetContainerOOMScoreAdjust: node-critical pods -997; burstable scaled by the memory request.
  const memReq = req.memory !== undefined ? quantity(req.memory) : 0;
  out.oomScoreAdj = critical ? -997 : memReq === 0 && lim.memory === undefined ? 1000
    : Math.min(999, Math.max(2, Math.floor(1000 - (1000 * memReq) / NODE_MEMORY_BYTES)));
  return out;
}

/** CreateContainer's config for one container of the template (generateContainerConfig). */
export function containerConfig(template: Obj, containerName: string, p: PodPlacement): Obj {
  const spec = asObj(template.spec);
  const c = ((spec.containers ?? []) as Obj[]).find((x) => x.name === containerName) ?? fail(`container ${containerName}`);
  const sc = asObj(c.securityContext);
  const podSc = asObj(spec.securityContext);
  const env = containerEnv(c, p);
  const vars = new Map(env.map((e) => [e.key, e.value]));
  const expand = (s: string): string => s.replace(/\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)/g, (m, n: string | undefined) =>
    m === '$$' ? '$' : vars.has(n as string) ? (vars.get(n as string) as string) : m);
  const caps = asObj(sc.capabilities);
  const privileged = sc.privileged === true;
  const runAsUser = sc.runAsUser ?? podSc.runAsUser;
  const runAsGroup = sc.runAsGroup ?? podSc.runAsGroup;
  const critical = spec.priorityClassName === 'system-node-critical' || spec.priorityClassName === 'system-cluster-critical';
  return {
    metadata: { name: containerName, attempt: 0 },
    image: { image: p.imageRef(String(c.image)), userSpecifiedImage: String(c.image) },
    command: ((c.command ?? []) as string[]).map(expand),
    args: ((c.args ?? []) as string[]).map(expand),
    workingDir: String(c.workingDir ?? ''),
    envs: env,
    mounts: containerMounts(c, spec, p),
    labels: {
      'io.kubernetes.container.name': containerName, 'io.kubernetes.pod.name': p.name,
      'io.kubernetes.pod.namespace': p.namespace, 'io.kubernetes.pod.uid': p.uid,
    },
    annotations: { 'io.kubernetes.container.restartCount': '0', 'io.kubernetes.container.terminationMessagePath': String(c.terminationMessagePath ?? '/dev/termination-log') },
    logPath: `${containerName}/0.log`,
    stdin: false, stdinOnce: false, tty: false,
    linux: {
      resources: containerResources(c, critical),
      securityContext: {
        // convertToRuntimeCapabilities: the names as written; the runtime adds CAP_ and expands ALL.
        capabilities: { addCapabilities: (caps.add ?? []) as string[], dropCapabilities: (caps.drop ?? []) as string[] },
        privileged,
        namespaceOptions: {
          network: nsMode(spec.hostNetwork as boolean, 'POD'),
          pid: spec.shareProcessNamespace ? 'POD' : nsMode(spec.hostPID as boolean, 'CONTAINER'),
          ipc: nsMode(spec.hostIPC as boolean, 'POD'),
        },
        ...(runAsUser !== undefined ? { runAsUser: { value: Number(runAsUser) } } : {}),
        ...(runAsGroup !== undefined ? { runAsGroup: { value: Number(runAsGroup) } } : {}),
        readonlyRootfs: sc.readOnlyRootFilesystem === true,
        // AddNoNewPrivileges: only an explicit allowPrivilegeEscalation: false sets no_new_privs.
        noNewPrivs: !privileged && sc.allowPrivilegeEscalation === false,
        maskedPaths: privileged ? [] : DEFAULT_MASKED_PATHS,
        readonlyPaths: privileged ? [] : DEFAULT_READONLY_PATHS,
        seccomp: seccompOf(podSc, sc),
      },
    },
  };
}

/** One of a container's probes as kubelet's prober runs an exec handler: CRI ExecSync(container, cmd, timeout). */
export interface ExecProbeRequest {
  kind: 'startup' | 'liveness' | 'readiness';
  cmd: string[];
  /** ExecSync's timeout: the probe's timeoutSeconds (kubelet's default 1). */
  timeoutSeconds: number;
}

/**
 * The exec probes of a container as kubelet's prober.runProbe sends them: the command with $(VAR)
 * expanded from the container's literal env values only (ExpandContainerCommandOnlyStatic; not
 * valueFrom, not envFrom), and the probe's timeout. HTTP, TCP and gRPC probes kubelet runs itself
 * over the network, not through CRI: they yield no request. Any other handler is an error.
 */
export function execProbeRequests(template: Obj, containerName: string): ExecProbeRequest[] {
  const spec = asObj(template.spec);
  const c = ((spec.containers ?? []) as Obj[]).find((x) => x.name === containerName) ?? fail(`container ${containerName}`);
  const statics = new Map(((c.env ?? []) as Obj[]).filter((e) => e.value !== undefined).map((e) => [String(e.name), String(e.value)]));
  const expand = (s: string): string => s.replace(/\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)/g, (m, n: string | undefined) =>
    m === '$$' ? '$' : statics.has(n as string) ? (statics.get(n as string) as string) : m);
  const out: ExecProbeRequest[] = [];
  for (const kind of ['startup', 'liveness', 'readiness'] as const) {
    const probe = c[`${kind}Probe`] as Obj | undefined;
    if (!probe) continue;
    const handlers = Object.keys(probe).filter((k) => ['exec', 'httpGet', 'tcpSocket', 'grpc'].includes(k));
    const unknown = Object.keys(probe).filter((k) => !['exec', 'httpGet', 'tcpSocket', 'grpc', 'initialDelaySeconds', 'periodSeconds',
      'timeoutSeconds', 'successThreshold', 'failureThreshold', 'terminationGracePeriodSeconds'].includes(k));
    if (handlers.length !== 1 || unknown.length > 0) fail(`${kind}Probe of ${containerName} with ${Object.keys(probe).join(',')}`);
    if (!probe.exec) continue;
    const cmd = (asObj(probe.exec).command ?? []) as string[];
    if (cmd.length === 0) fail(`${kind}Probe of ${containerName}: exec without a command`);
    out.push({ kind, cmd: cmd.map(expand), timeoutSeconds: Number(probe.timeoutSeconds ?? 1) });
  }
  return out;
}
