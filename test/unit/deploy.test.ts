/**
 * deploy/: every kustomize variant is rendered offline with `kubectl kustomize` and checked
 * against the agent's real contracts: the run command's flags and env twins (parsed by the
 * agent's own commander definition and parseRunConfig), the socket path, the netns path rules
 * of the built helper binary, the CRI endpoints the agent knows, and the invariants the
 * manifests promise (no privileged, hostPID only with procfs, minimal RBAC, ...). The
 * Dockerfile's runtime layout is checked against the files the agent loads at run time.
 */
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { isIP } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Command, type Option } from 'commander';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { registerRunCommand } from '../../agent/cli/run-command.ts';
import { DEFAULT_SOCKET, parseRunConfig, type RunConfig } from '../../agent/config/run-config.ts';
import { DEFAULT_CRI_ENDPOINTS } from '../../agent/netns/cri-endpoint.ts';
import { registerWebhookCommand } from '../../agent/cli/webhook-command.ts';
import { MUTATE_ANNOTATED_PATH, MUTATE_PATH, OPT_IN_ANNOTATION, OPT_IN_NAMESPACE_LABEL, OPT_IN_VALUE } from '../../agent/webhook/admission.ts';
import { ORIGINAL_HANDLERS_ANNOTATION } from '../../agent/rewrite/pod-rewrite.ts';
import { Registry } from 'prom-client';
import { HealthRegistry } from '../../agent/metrics/health.ts';
import { startMetricsServer } from '../../agent/metrics/http-server.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const DEPLOY = path.join(ROOT, 'deploy');
const HELPER = path.join(ROOT, 'netns-helper/build/probe-agent-netns-helper');
const VERSION = (JSON.parse(readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;
const COMPONENTS = readdirSync(path.join(DEPLOY, 'components')).sort();
/** Downward-API values a real node would fill in. */
const NODE = { NODE_NAME: 'node-a', HOST_IP: '192.0.2.10', POD_IP: '10.244.3.7' };

type Obj = Record<string, any>;
interface Variant { name: string; components: string[]; namespace?: string; overlay?: string; withoutApiServerCidr?: boolean }

/** What an overlay with the rewrite-webhook component must add (the example overlay shows it). */
const API_SERVER_CIDR = '192.0.2.0/28';
const API_SERVER_CIDR_GENERATOR = [
  'configMapGenerator:',
  '  - name: probe-agent-webhook-network-policy',
  `    literals: [API_SERVER_CIDR=${API_SERVER_CIDR}]`,
  '    options: {disableNameSuffixHash: true, annotations: {config.kubernetes.io/local-config: "true"}}',
];

/** The object a lookup found, or a failure naming what is missing (rather than a TypeError on undefined). */
function found(o: Obj | undefined, what: string): Obj {
  if (o === undefined) throw new Error(`${what}: not in the rendered manifests`);
  return o;
}

const VARIANTS: Variant[] = [
  { name: 'base', components: [] },
  ...COMPONENTS.map((c) => ({ name: c, components: [c] })),
  { name: 'containerd-full', components: ['containerd', 'procfs-resolver', 'nftables-close-hole', 'kubelet-insecure-tls', 'pod-monitor', 'nodes-proxy-fallback'] },
  { name: 'crio-privileged', components: ['crio', 'service-monitor', 'privileged'] },
  { name: 'rewrite-webhook-on-update', components: ['rewrite-webhook', 'rewrite-on-update'] },
  { name: 'shim-webhook', components: ['kubelet-shim', 'rewrite-webhook'] },
  { name: 'gates-webhook-lease', components: ['rewrite-webhook', 'gates', 'gates-lease'] },
  { name: 'shim-webhook-before-1.30', components: ['kubelet-shim', 'rewrite-webhook', 'before-1.30'] },
  { name: 'shim-self-signed-kubelet-before-1.33', components: ['containerd', 'kubelet-shim', 'kubelet-insecure-tls', 'nodes-proxy-fallback'] },
  { name: 'other-namespace', components: ['nodes-proxy-fallback', 'pod-monitor', 'alerts'], namespace: 'other-ns' },
  { name: 'example-overlay', components: ['containerd', 'pod-monitor'], overlay: 'overlays/example' },
];

let scratch: string;
const rendered = new Map<string, Obj[]>();

/** kubectl with an embedded kustomize that knows components (v4+, kubectl 1.21+), or a loud failure. */
function requireKubectl(): void {
  const r = spawnSync('kubectl', ['version', '--client', '-o', 'json'], { encoding: 'utf8' });
  const hint = "install kubectl >= 1.21 (https://pkgs.k8s.io); Debian's kubernetes-client package is 1.20, whose kustomize v2 has no components";
  if (r.error) throw new Error(`kubectl not found: these tests render deploy/ with \`kubectl kustomize\`; ${hint}`);
  const kustomize = (JSON.parse(r.stdout || '{}') as { kustomizeVersion?: string }).kustomizeVersion ?? '';
  const major = Number(/^v?(\d+)/.exec(kustomize)?.[1] ?? 0);
  if (major < 4) throw new Error(`kubectl's kustomize is "${kustomize || 'unknown'}", components need v4+; ${hint}`);
}

/** Objects of the kubelet-shim component's installer (its own workload, role and account). */
function isShimInstaller(o: Obj): boolean {
  // The shim installer and the rewrite webhook are separate workloads with their own roles, checked with their components.
  return String(o.metadata?.name ?? '').startsWith('probe-agent-shim-installer') || String(o.metadata?.name ?? '').startsWith('probe-agent-webhook');
}

function render(v: Variant): Obj[] {
  let dir: string;
  if (v.overlay) {
    dir = path.join(DEPLOY, v.overlay);
  } else {
    dir = mkdtempSync(path.join(scratch, `${v.name}-`));
    const rel = (p: string) => path.relative(dir, path.join(DEPLOY, p));
    const lines = [`resources: [${rel('base')}]`, `components: [${v.components.map((c) => rel(`components/${c}`)).join(', ')}]`];
    if (v.namespace) lines.push(`namespace: ${v.namespace}`);
    if (v.components.includes('rewrite-webhook') && !v.withoutApiServerCidr) lines.push(...API_SERVER_CIDR_GENERATOR);
    writeFileSync(path.join(dir, 'kustomization.yaml'), lines.join('\n') + '\n');
  }
  const out = execFileSync('kubectl', ['kustomize', dir], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  return parseAllDocuments(out).map((d) => d.toJS() as Obj).filter((o) => o !== null);
}

/** The run command's options, straight from the agent's commander definition. */
function runOptions(): Option[] {
  const program = new Command();
  registerRunCommand(program);
  return program.commands.find((c) => c.name() === 'run')!.options as Option[];
}

/** Expands $(VAR) the way the kubelet does: only variables defined earlier (envFrom first). */
function containerEnv(c: Obj, all: Obj[], downward: Record<string, string>): { env: Record<string, string>; unresolved: string[] } {
  const env: Record<string, string> = {};
  const unresolved: string[] = [];
  for (const from of c.envFrom ?? []) {
    const cm = all.find((o) => o.kind === 'ConfigMap' && o.metadata.name === from.configMapRef?.name);
    if (!cm) throw new Error(`envFrom names ConfigMap ${from.configMapRef?.name}, which is not rendered`);
    Object.assign(env, cm.data);
  }
  for (const e of c.env ?? []) {
    if (e.valueFrom?.fieldRef) {
      const field = e.valueFrom.fieldRef.fieldPath as string;
      env[e.name] = field === 'spec.nodeName' ? downward.NODE_NAME! : field === 'status.hostIP' ? downward.HOST_IP! : field === 'status.podIP' ? downward.POD_IP! : `<${field}>`;
      continue;
    }
    env[e.name] = String(e.value ?? '').replace(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (whole, name: string) => {
      if (name in env) return env[name]!;
      unresolved.push(`${e.name} -> ${name}`);
      return whole;
    });
  }
  return { env, unresolved };
}

/** Runs the agent's own flag/env parsing on a rendered container, as `probe-agent run` would. */
async function agentConfig(args: string[], env: Record<string, string>): Promise<RunConfig> {
  const program = new Command().exitOverride();
  registerRunCommand(program);
  let raw: Record<string, any> | undefined;
  program.commands.find((c) => c.name() === 'run')!.action((opts: Record<string, any>) => { raw = opts; });
  const saved = process.env;
  process.env = { ...env };
  try {
    await program.parseAsync(args, { from: 'user' });
  } finally {
    process.env = saved;
  }
  return parseRunConfig(raw!, env);
}

/** The helper's verdict on each path ("proc", "dir" or "invalid\t<why>"). */
function helperVerdicts(paths: string[]): string[] {
  if (!existsSync(HELPER)) throw new Error(`${HELPER} is missing: build it with \`make helper\` (make test does)`);
  return execFileSync(HELPER, ['--check-paths'], { input: paths.join('\n') + '\n', encoding: 'utf8' }).trim().split('\n');
}

const mib = (q: string): number => {
  const m = /^(\d+)(Mi|Gi)$/.exec(q);
  if (!m) throw new Error(`unexpected quantity ${q}`);
  return Number(m[1]) * (m[2] === 'Gi' ? 1024 : 1);
};

beforeAll(() => {
  requireKubectl();
  scratch = mkdtempSync(path.join(tmpdir(), 'probe-agent-deploy-'));
  for (const v of VARIANTS) rendered.set(v.name, render(v));
});

afterAll(() => {
  if (scratch) rmSync(scratch, { recursive: true, force: true });
});

describe.each(VARIANTS)('deploy variant $name', (v) => {
  const has = (c: string) => v.components.includes(c);
  const ns = v.namespace ?? 'probe-agent';
  const docs = () => rendered.get(v.name)!;
  const ds = () => docs().find((o) => o.kind === 'DaemonSet' && o.metadata.name === 'probe-agent')!;
  const pod = () => ds().spec.template.spec;
  const agent = () => pod().containers.find((c: Obj) => c.name === 'agent');
  const downward = () => (pod().hostNetwork ? { ...NODE, POD_IP: NODE.HOST_IP } : NODE);

  it('renders objects with apiVersion, kind, name, and the right namespace', () => {
    const clusterScoped = new Set(['Namespace', 'ClusterRole', 'ClusterRoleBinding', 'MutatingWebhookConfiguration', 'ValidatingAdmissionPolicy', 'ValidatingAdmissionPolicyBinding', 'FlowSchema', 'PriorityLevelConfiguration']);
    expect(docs().length).toBeGreaterThan(4);
    for (const o of docs()) {
      expect(typeof o.apiVersion, JSON.stringify(o).slice(0, 80)).toBe('string');
      expect(typeof o.kind).toBe('string');
      expect(o.metadata?.name).toMatch(/^[a-z0-9][a-z0-9.-]*$/);
      if (clusterScoped.has(o.kind)) expect(o.metadata.namespace).toBeUndefined();
      else expect(o.metadata.namespace, `${o.kind}/${o.metadata.name}`).toBe(ns);
    }
    const namespace = docs().find((o) => o.kind === 'Namespace');
    expect(namespace?.metadata.name).toBe(ns);
    // SYS_ADMIN and hostPath fail the baseline standard: the namespace must admit them explicitly.
    expect(namespace?.metadata.labels['pod-security.kubernetes.io/enforce']).toBe('privileged');
  });

  it('keeps the pod-level invariants: no host network/PID unless asked, node-critical, everywhere', () => {
    const spec = pod();
    expect(spec.hostNetwork === true).toBe(has('nftables-close-hole') || has('host-network'));
    if (spec.hostNetwork) expect(spec.dnsPolicy).toBe('ClusterFirstWithHostNet');
    expect(spec.hostPID === true).toBe(has('procfs-resolver'));
    expect(spec.hostIPC === true).toBe(false);
    expect(spec.priorityClassName).toBe('system-node-critical');
    expect(spec.tolerations).toContainEqual({ operator: 'Exists' });
    expect(spec.securityContext.seccompProfile).toEqual({ type: 'RuntimeDefault' });
    const strategy = ds().spec.updateStrategy;
    expect(strategy.type).toBe('RollingUpdate');
    expect(String(strategy.rollingUpdate.maxSurge)).toMatch(/^0%?$/);
    expect(String(strategy.rollingUpdate.maxUnavailable)).toMatch(/^([1-9]\d*|[1-9]\d?%)$/);
    expect(ds().spec.selector.matchLabels).toEqual({ 'app.kubernetes.io/name': 'probe-agent' });
    for (const [k, val] of Object.entries(ds().spec.selector.matchLabels)) expect(ds().spec.template.metadata.labels[k]).toBe(val);
  });

  it('grants each container only its capabilities, privileged only with the privileged component', () => {
    for (const c of pod().containers as Obj[]) {
      const sc = c.securityContext;
      expect(sc.capabilities.drop).toEqual(['ALL']);
      expect(sc.readOnlyRootFilesystem).toBe(true);
      expect(sc.runAsUser).toBe(0);
      expect(sc.seccompProfile?.type ?? 'RuntimeDefault').toBe('RuntimeDefault');
      if (c.name === 'agent') {
        expect(sc.privileged === true).toBe(has('privileged'));
        expect([...sc.capabilities.add].sort()).toEqual(has('procfs-resolver') ? ['SYS_ADMIN', 'SYS_PTRACE'] : ['SYS_ADMIN']);
        // The API refuses allowPrivilegeEscalation=false with CAP_SYS_ADMIN; never dodge that by spelling.
        expect(sc.allowPrivilegeEscalation).not.toBe(false);
      } else {
        expect(c.name).toBe('close-hole');
        expect(sc.privileged).toBe(false);
        expect(sc.capabilities.add).toEqual(['NET_ADMIN']);
        expect(sc.allowPrivilegeEscalation).toBe(false);
      }
    }
  });

  it('configures the agent only through flags and env twins that `probe-agent run` has', async () => {
    const options = runOptions();
    const longs = new Set(options.map((o) => o.long));
    const twins = new Map(options.map((o) => [o.envVar, o]));
    const c = agent();
    expect(c.args?.[0] ?? c.command?.at(-1)).toBe('run');
    for (const a of (c.args ?? []).slice(1)) {
      if (a.startsWith('--')) expect(longs.has(a.split('=')[0]), `unknown flag ${a}`).toBe(true);
    }
    const names = (c.env as Obj[]).map((e) => e.name);
    expect(new Set(names).size).toBe(names.length);
    for (const e of c.env as Obj[]) {
      if (!e.name.startsWith('PROBE_AGENT_')) continue;
      const opt = twins.get(e.name);
      expect(opt, `${e.name} is no flag's env twin`).toBeDefined();
      // commander turns a boolean flag on when its twin is present, even as "false".
      if (opt!.isBoolean()) expect(e.value, `${e.name}: delete it instead of "false"`).toBe('true');
    }
    for (const container of pod().containers as Obj[]) {
      expect(containerEnv(container, docs(), downward()).unresolved, container.name).toEqual([]);
    }
    const { env } = containerEnv(c, docs(), downward());
    const config = await agentConfig(c.args ?? ['run'], env);
    expect(config.nodeName).toBe(NODE.NODE_NAME);
    expect(config.kubeletUrl).toBe(`https://${NODE.HOST_IP}:10250`);
    expect(config.kubeletInsecureTls).toBe(has('kubelet-insecure-tls'));
    if (!config.kubeletInsecureTls) expect(config.kubeletCaFile).toBe('/var/run/secrets/kubernetes.io/serviceaccount/ca.crt');
    // Prometheus scrapes the pod IP; kubelet and the close-hole sidecar check health on loopback.
    expect(config.metricsAddress).toEqual({ host: downward().POD_IP, port: 9809 });
    expect(config.healthAddress).toEqual({ host: '127.0.0.1', port: 9810 });
    expect(config.shutdownGracePeriodMs + 2000).toBeLessThan(pod().terminationGracePeriodSeconds * 1000);
  });

  it('mounts the socket directory, the netns directories and the CRI socket where the agent looks', async () => {
    const c = agent();
    const { env } = containerEnv(c, docs(), downward());
    const config = await agentConfig(c.args ?? ['run'], env);
    const volumes = new Map((pod().volumes as Obj[]).map((vol) => [vol.name, vol]));
    const mountOf = (dir: string) => (c.volumeMounts as Obj[]).find((m) => m.mountPath === dir);
    const hostPathOf = (m: Obj | undefined) => volumes.get(m?.name)?.hostPath;

    expect(config.socket).toBe(DEFAULT_SOCKET);
    const socketMount = mountOf(path.dirname(config.socket));
    expect(hostPathOf(socketMount)).toEqual({ path: path.dirname(config.socket), type: 'DirectoryOrCreate' });
    expect(socketMount?.readOnly).not.toBe(true);

    const netnsDirs = ['/run/netns', '/var/run/netns', ...config.netnsDirs];
    for (const dir of netnsDirs) {
      const m = mountOf(dir);
      expect(hostPathOf(m)?.path, dir).toBe(dir);
      expect(m?.readOnly).toBe(true);
      expect(m?.mountPropagation).toBe('HostToContainer');
    }
    expect(helperVerdicts(netnsDirs.map((d) => `${d}/cni-0c7e3f2a`))).toEqual(netnsDirs.map(() => 'dir'));

    const usesProcfs = config.netnsResolvers.includes('procfs');
    expect(usesProcfs).toBe(has('procfs-resolver'));
    expect(pod().hostPID === true).toBe(usesProcfs);
    if (usesProcfs) expect(helperVerdicts([`${config.procRoot}/4242/ns/net`])).toEqual(['proc']);

    const runtime = ['containerd', 'crio'].find(has);
    if (!runtime) {
      expect(config.criEndpoint).toBeUndefined();
    } else {
      expect(DEFAULT_CRI_ENDPOINTS).toContain(config.criEndpoint);
      const dir = path.dirname(new URL(config.criEndpoint!).pathname);
      const m = mountOf(dir);
      expect(hostPathOf(m)).toEqual({ path: dir, type: 'Directory' });
      expect(m?.readOnly).toBe(true);
      expect(m?.mountPropagation).toBe('HostToContainer');
    }
  });

  it('probes the agent on its loopback health listener (no pod can load it) with the agreed resources', async () => {
    const c = agent();
    const port = (c.ports as Obj[]).find((p) => p.name === 'metrics');
    expect(port?.containerPort).toBe(9809);
    // Exec probes from inside the container: kubelet cannot reach the pod's loopback over HTTP.
    const health = new HealthRegistry();
    let ready = false;
    health.addReadiness('test', () => {
      if (!ready) throw new Error('not ready');
    });
    const server = await startMetricsServer({ address: '127.0.0.1:0', registry: new Registry(), health, healthOnly: true });
    try {
      const { env } = containerEnv(c, docs(), downward());
      expect(env.PROBE_AGENT_HEALTH_ADDRESS).toBe('127.0.0.1:9810');
      // Asynchronously: the health server answers from this very process.
      const run = (probe: Obj): Promise<number | null> => {
        expect(probe.httpGet).toBeUndefined();
        const [cmd, ...args] = probe.exec.command as string[];
        const child = spawn(cmd as string, args, { env: { PATH: process.env.PATH, PROBE_AGENT_HEALTH_ADDRESS: `127.0.0.1:${server.port}` }, stdio: 'ignore', timeout: 10_000 });
        return new Promise((resolve) => child.once('exit', (code) => resolve(code)));
      };
      const all = (): Promise<(number | null)[]> => Promise.all([run(c.startupProbe), run(c.livenessProbe), run(c.readinessProbe)]);
      expect(await all()).toEqual([0, 0, 1]);
      ready = true;
      expect(await run(c.readinessProbe)).toBe(0);
      // Nothing listening: every probe fails.
      await server.close();
      expect((await all()).every((code) => code !== 0)).toBe(true);
    } finally {
      await server.close();
      health.close();
    }
    expect(c.resources).toEqual({ requests: { cpu: '150m', memory: '160Mi' }, limits: { memory: '320Mi' } });
    const heap = /--max-old-space-size=(\d+)/.exec((c.env as Obj[]).find((e) => e.name === 'NODE_OPTIONS')?.value ?? '');
    expect(Number(heap?.[1])).toBeLessThan(mib(c.resources.limits.memory) * 0.75);
    for (const container of pod().containers as Obj[]) {
      expect(container.image).toBe(v.overlay ? `registry.example.com/platform/probe-agent:${VERSION}` : `probe-agent:${VERSION}`);
    }
  });

  it('grants get on nodes/pods only (nodes/proxy only with the fallback), to its own service account', () => {
    // The shim installer (kubelet-shim component) is a separate workload with its own role, checked below.
    const roles = docs().filter((o) => (o.kind === 'ClusterRole' || o.kind === 'Role') && !isShimInstaller(o));
    const rules = roles.flatMap((r) => r.rules as Obj[]);
    const expected = [{ apiGroups: [''], resources: ['nodes/pods'], verbs: ['get'] }];
    if (has('nodes-proxy-fallback')) expected.push({ apiGroups: [''], resources: ['nodes/proxy'], verbs: ['get'] });
    // Gates mode: its own condition and events (narrowed by the pod-status and events policies), no
    // get (api-writer.ts reads nothing); its node Lease only with gates-lease, in its own namespace.
    if (has('gates')) {
      expected.push(
        { apiGroups: [''], resources: ['pods/status'], verbs: ['patch'] },
        { apiGroups: [''], resources: ['events'], verbs: ['create'] },
      );
    }
    if (has('gates-lease')) expected.push({ apiGroups: ['coordination.k8s.io'], resources: ['leases'], verbs: ['create', 'patch'] });
    const byText = (list: Obj[]) => list.map((r) => JSON.stringify(r)).sort();
    expect(byText(rules)).toEqual(byText(expected));
    const leaseRoles = roles.filter((r) => r.rules.some((x: Obj) => x.resources.includes('leases')));
    expect(leaseRoles.map((r) => [r.kind, r.metadata.namespace])).toEqual(has('gates-lease') ? [['Role', v.namespace ?? 'probe-agent']] : []);
    const sa = docs().find((o) => o.kind === 'ServiceAccount');
    expect(pod().serviceAccountName).toBe(sa?.metadata.name);
    for (const b of docs().filter((o) => (o.kind === 'ClusterRoleBinding' || o.kind === 'RoleBinding') && !isShimInstaller(o))) {
      expect(roles.filter((r) => r.kind === b.roleRef.kind).map((r) => r.metadata.name)).toContain(b.roleRef.name);
      expect(b.subjects).toEqual([{ kind: 'ServiceAccount', name: sa?.metadata.name, namespace: sa?.metadata.namespace }]);
    }
  });

  it('ships monitors only when asked, selecting the agent pods and their metrics port', () => {
    const podLabels = ds().spec.template.metadata.labels;
    const matches = (sel: Obj, labels: Obj) => Object.keys(sel.matchLabels ?? {}).length > 0 && Object.entries(sel.matchLabels).every(([k, val]) => labels?.[k] === val);
    const pm = docs().filter((o) => o.kind === 'PodMonitor');
    const sm = docs().filter((o) => o.kind === 'ServiceMonitor');
    expect(pm.length).toBe(has('pod-monitor') ? 1 : 0);
    expect(sm.length).toBe(has('service-monitor') ? 1 : 0);
    for (const m of pm) {
      expect(matches(m.spec.selector, podLabels)).toBe(true);
      expect(m.spec.podMetricsEndpoints.map((e: Obj) => e.port)).toEqual(['metrics', 'metrics']);
    }
    for (const m of sm) {
      const svc = docs().find((o) => o.kind === 'Service' && matches(m.spec.selector, o.metadata.labels));
      expect(svc?.spec.clusterIP).toBe('None');
      expect(matches({ matchLabels: svc?.spec.selector }, podLabels)).toBe(true);
      expect(svc?.spec.ports.map((p: Obj) => p.targetPort)).toEqual(['metrics']);
      expect(m.spec.endpoints.map((e: Obj) => e.port)).toEqual(svc?.spec.ports.flatMap((p: Obj) => [p.name, p.name]));
    }
  });

  it('scrapes the agent and its shim relay as the alert rules read them: /metrics unlabelled, /metrics/shim with metrics_path', () => {
    const rules = readFileSync(path.join(ROOT, 'deploy/components/alerts/probe-agent.rules.yaml'), 'utf8');
    const shimPaths = [...new Set([...rules.matchAll(/metrics_path!?="([^"]+)"/g)].map((x) => x[1]))];
    // The rules name exactly one relay path; the monitors must scrape that very path.
    expect(shimPaths).toEqual(['/metrics/shim']);
    const monitors = docs().filter((o) => o.kind === 'PodMonitor' || o.kind === 'ServiceMonitor');
    expect(monitors.length).toBe(Number(has('pod-monitor')) + Number(has('service-monitor')));
    const byNode = { sourceLabels: ['__meta_kubernetes_pod_node_name'], targetLabel: 'node' };
    const pathLabel = { sourceLabels: ['__metrics_path__'], targetLabel: 'metrics_path' };
    for (const m of monitors) {
      const endpoints: Obj[] = m.kind === 'PodMonitor' ? m.spec.podMetricsEndpoints : m.spec.endpoints;
      expect(endpoints.map((e) => e.path), m.kind).toEqual(['/metrics', shimPaths[0]]);
      const [own, relay] = endpoints as [Obj, Obj];
      // Both carry the node label the rules group by; only the relay carries metrics_path (the
      // agent's own `up` is selected by metrics_path!="/metrics/shim", which an absent label matches).
      for (const e of endpoints) expect(e.relabelings, `${m.kind} ${e.path}`).toContainEqual(byNode);
      expect(own.relabelings, m.kind).not.toContainEqual(pathLabel);
      expect(relay.relabelings, m.kind).toContainEqual(pathLabel);
      expect(relay.interval).toBe(own.interval);
    }
  });

  if (has('gates')) it("gives the agent's writes one flow per namespace, for exactly the verbs its roles grant", () => {
    const fs = found(docs().find((o) => o.kind === 'FlowSchema' && o.metadata.name === 'probe-agent-gates'), 'FlowSchema probe-agent-gates');
    // ByUser would make every node's agent (one service account) a single flow: one tenant's flaps would queue all others.
    expect(fs.spec.distinguisherMethod).toEqual({ type: 'ByNamespace' });
    const plc = found(docs().find((o) => o.kind === 'PriorityLevelConfiguration' && o.metadata.name === fs.spec.priorityLevelConfiguration.name), 'its PriorityLevelConfiguration');
    expect(plc.spec.limited.limitResponse.type).toBe('Queue');
    const granted = docs().filter((o) => (o.kind === 'ClusterRole' || o.kind === 'Role') && !isShimInstaller(o)).flatMap((r) => r.rules as Obj[])
      .filter((r) => !String(r.resources[0]).startsWith('nodes/'));
    const inFlow = (fs.spec.rules as Obj[]).flatMap((r) => r.resourceRules as Obj[]);
    for (const g of granted) {
      expect(inFlow.some((f) => f.resources.includes(g.resources[0]) && g.verbs.every((v: string) => f.verbs.includes(v))), JSON.stringify(g)).toBe(true);
    }
    // And nothing the agent may not do (no read it does not make).
    for (const f of inFlow) expect(f.verbs).not.toContain('get');
  });

  if (has('kubelet-shim')) it('installs the shim with patch on nodes and its kubelet\'s /pods only (no pod list: unlabel asks the node\'s kubelet), its own service account, and the installer files it runs', () => {
    const own = docs().filter((o) => String(o.metadata?.name ?? '').startsWith('probe-agent-shim-installer'));
    const role = own.find((o) => o.kind === 'ClusterRole')!;
    const expected = [{ apiGroups: [''], resources: ['nodes'], verbs: ['patch'] }, { apiGroups: [''], resources: ['nodes/pods'], verbs: ['get'] }];
    // Before 1.33 the kubelet authorizes GET /pods as nodes/proxy, for the installer as for the agent.
    if (has('nodes-proxy-fallback')) expected.push({ apiGroups: [''], resources: ['nodes/proxy'], verbs: ['get'] });
    expect(role.rules).toEqual(expected);
    expect(role.rules.some((r: Obj) => r.resources.includes('pods'))).toBe(false);
    const binding = own.find((o) => o.kind === 'ClusterRoleBinding')!;
    expect(binding.subjects).toEqual([{ kind: 'ServiceAccount', name: 'probe-agent-shim-installer', namespace: v.namespace ?? 'probe-agent' }]);
    const ds = own.find((o) => o.kind === 'DaemonSet')!;
    const spec = ds.spec.template.spec as Obj;
    expect(spec.serviceAccountName).toBe('probe-agent-shim-installer');
    const cm = docs().find((o) => o.kind === 'ConfigMap' && String(o.metadata.name).startsWith('probe-agent-shim-installer'))!;
    expect(Object.keys(cm.data).sort()).toEqual(['install-shim.sh', 'label-node.mjs', 'probe-agent-shim.service']);
    expect(spec.volumes.find((vol: Obj) => vol.name === 'installer').configMap.name).toBe(cm.metadata.name);
    expect(spec.containers[0].command).toEqual(['/bin/bash', '/installer/install-shim.sh', 'install']);
    // It reaches its node's kubelet at the host IP, verifying it as the agent does.
    const env = Object.fromEntries((spec.containers[0].env as Obj[]).map((e) => [e.name, e.value ?? e.valueFrom?.fieldRef?.fieldPath]));
    expect(env.HOST_IP).toBe('status.hostIP');
    expect(env.KUBELET_INSECURE_TLS).toBe(has('kubelet-insecure-tls') ? 'true' : undefined);
    // The shim's metrics socket (its count of kubelet's calls) is in the directory it mounts read-only.
    const shimRun = (spec.containers[0].volumeMounts as Obj[]).find((m) => m.mountPath === '/host/run/probe-agent-shim')!;
    expect(shimRun.readOnly).toBe(true);
    expect(readFileSync(path.join(DEPLOY, 'components/kubelet-shim/probe-agent-shim.service'), 'utf8')).toContain('--metrics-socket /run/probe-agent-shim/metrics.sock');
  });

  if (has('nftables-close-hole')) it('wires the close-hole sidecar to the agent and to its script', () => {
    const sidecar = (pod().containers as Obj[]).find((c) => c.name === 'close-hole')!;
    const agentEnv = containerEnv(agent(), docs(), downward()).env;
    const { env } = containerEnv(sidecar, docs(), downward());
    // The sidecar checks the agent's loopback health listener, never the metrics port pods may reach.
    expect(env.CLOSE_HOLE_AGENT_ADDRESS).toBe(agentEnv.PROBE_AGENT_HEALTH_ADDRESS);
    expect(env.CLOSE_HOLE_METRICS_PORT).toBe('9809');
    // The sidecar writes its state where the agent reads it (probe_agent_close_hole_*), in ONE volume both mount.
    expect(env.CLOSE_HOLE_STATE_FILE).toMatch(/^\//);
    expect(agentEnv.PROBE_AGENT_CLOSE_HOLE_STATE_FILE).toBe(env.CLOSE_HOLE_STATE_FILE);
    const stateDir = path.dirname(env.CLOSE_HOLE_STATE_FILE!);
    const sidecarMount = (sidecar.volumeMounts as Obj[]).find((m) => m.mountPath === stateDir);
    const agentMount = (agent().volumeMounts as Obj[]).find((m) => m.mountPath === stateDir);
    expect(sidecarMount?.readOnly).not.toBe(true);
    expect(agentMount?.readOnly).toBe(true);
    expect(agentMount?.name).toBe(sidecarMount?.name);
    const stateVolumes = (pod().volumes as Obj[]).filter((vol) => vol.name === sidecarMount?.name);
    expect(stateVolumes).toHaveLength(1);
    expect(stateVolumes[0]?.emptyDir).toBeDefined();
    const volume = (pod().volumes as Obj[]).find((vol) => vol.name === 'close-hole-script');
    const cm = docs().find((o) => o.kind === 'ConfigMap' && o.metadata.name === volume?.configMap?.name);
    const scriptPath = path.join(DEPLOY, 'components/nftables-close-hole/close-hole.sh');
    expect(cm?.data['close-hole.sh']).toBe(readFileSync(scriptPath, 'utf8'));
    const mount = (sidecar.volumeMounts as Obj[]).find((m) => m.name === 'close-hole-script');
    expect(sidecar.command).toEqual(['bash', `${mount?.mountPath}/close-hole.sh`]);
    // The shipped settings leave the CIDRs to the operator: the sidecar refuses to start without them.
    const unset = spawnSync('bash', [scriptPath, '--print'], { env: { ...env, PATH: process.env.PATH }, encoding: 'utf8' });
    expect(unset.status).toBe(2);
    expect(unset.stderr).toMatch(/CLOSE_HOLE_POD_CIDRS is empty/);
    const set = spawnSync('bash', [scriptPath, '--print'], { env: { ...env, PATH: process.env.PATH, CLOSE_HOLE_POD_CIDRS: '10.244.0.0/16,fd00:10:244::/56' }, encoding: 'utf8' });
    expect(set.stderr).toBe('');
    expect(set.stdout).toContain('ip daddr @pod_v4 meta l4proto tcp counter reject with tcp reset');
    expect(set.stdout).toContain('ct state new oifname "cali*" jump guard');
  });
});

describe('alerts component', () => {
  const ALERTS = path.join(DEPLOY, 'components/alerts');
  const variants = ['alerts', 'other-namespace'];

  it('renders the PrometheusRule and the plain rules file from the same rules, and the dashboard for Grafana', () => {
    const rulesText = readFileSync(path.join(ALERTS, 'probe-agent.rules.yaml'), 'utf8');
    const dashboardText = readFileSync(path.join(ALERTS, 'probe-agent-dashboard.json'), 'utf8');
    for (const name of variants) {
      const docs = rendered.get(name)!;
      const ns = name === 'other-namespace' ? 'other-ns' : 'probe-agent';
      const rules = docs.filter((o) => o.kind === 'PrometheusRule');
      expect(rules, name).toHaveLength(1);
      expect(rules[0]!.metadata.namespace).toBe(ns);
      expect(rules[0]!.spec).toEqual(parseAllDocuments(rulesText)[0]!.toJS());
      const cm = (n: string) => docs.find((o) => o.kind === 'ConfigMap' && o.metadata.name === n);
      // Stable names (no hash suffix): a Prometheus or Grafana elsewhere mounts them by name.
      expect(cm('probe-agent-alert-rules')?.data).toEqual({ 'probe-agent.rules.yaml': rulesText });
      expect(cm('probe-agent-dashboard')?.data).toEqual({ 'probe-agent-dashboard.json': dashboardText });
      expect(cm('probe-agent-dashboard')?.metadata.labels.grafana_dashboard).toBe('1');
      expect(JSON.parse(dashboardText).uid).toBe('probe-agent');
    }
    for (const name of ['base', 'pod-monitor']) expect(rendered.get(name)!.some((o) => o.kind === 'PrometheusRule'), name).toBe(false);
  });

  it('rewrite-on-update adds one UPDATE webhook, for pods rewritten at creation only, failing closed; nothing else changes', () => {
    const isConfig = (o: Obj) => o.kind === 'MutatingWebhookConfiguration';
    const before = found(rendered.get('rewrite-webhook')!.find(isConfig), 'rewrite-webhook config');
    const after = found(rendered.get('rewrite-webhook-on-update')!.find(isConfig), 'rewrite-on-update config');
    expect(after.webhooks.slice(0, 2)).toEqual(before.webhooks);
    expect(after.webhooks).toHaveLength(3);
    const u = after.webhooks[2] as Obj;
    expect(u.rules).toEqual([{ operations: ['UPDATE'], apiGroups: [''], apiVersions: ['v1'], resources: ['pods'], scope: 'Namespaced' }]);
    expect(u.clientConfig).toEqual(before.webhooks[0].clientConfig);
    expect(u.clientConfig.service.path).toBe(MUTATE_PATH);
    // A probe changed while the webhook is down would run from the node and fail: refuse the UPDATE instead.
    expect(u.failurePolicy).toBe('Fail');
    expect(u.sideEffects).toBe('None');
    expect(u.timeoutSeconds).toBeLessThanOrEqual(5);
    expect(u.matchConditions).toEqual([{ name: 'rewritten-at-creation', expression: `has(oldObject.metadata.annotations) && '${ORIGINAL_HANDLERS_ANNOTATION}' in oldObject.metadata.annotations` }]);
    expect(u.namespaceSelector.matchExpressions).toContainEqual({ key: 'kubernetes.io/metadata.name', operator: 'NotIn', values: ['kube-system', 'probe-agent'] });
    const rest = (name: string) => rendered.get(name)!.filter((o) => !isConfig(o));
    expect(rest('rewrite-webhook-on-update')).toEqual(rest('rewrite-webhook'));
    // Alone it patches nothing: the base renders unchanged.
    expect(rendered.get('rewrite-on-update')).toEqual(rendered.get('base'));
  });

  it('before-1.30 removes the 1.30-only objects (the installer policy, the matchCondition webhook entry) and nothing else', () => {
    const key = (o: Obj) => `${o.kind}/${o.metadata.name}`;
    const full = rendered.get('shim-webhook')!;
    const old = rendered.get('shim-webhook-before-1.30')!;
    const removed = full.map(key).filter((k) => !old.map(key).includes(k));
    expect(removed.sort()).toEqual(['ValidatingAdmissionPolicy/probe-agent-rewrite-reviewed', 'ValidatingAdmissionPolicy/probe-agent-shim-installer-node-label', 'ValidatingAdmissionPolicyBinding/probe-agent-rewrite-reviewed', 'ValidatingAdmissionPolicyBinding/probe-agent-shim-installer-node-label']);
    const cfg = (objs: Obj[]) => found(objs.find((o) => o.kind === 'MutatingWebhookConfiguration'), 'webhook config');
    // No CEL left for a 1.24 API server to refuse; the namespace entry stays as it was.
    expect(JSON.stringify(old)).not.toContain('matchConditions');
    expect(cfg(old).webhooks).toEqual([cfg(full).webhooks[0]]);
    const rest = (objs: Obj[]) => objs.filter((o) => o.kind !== 'MutatingWebhookConfiguration' && !removed.includes(key(o)));
    expect(rest(old)).toEqual(rest(full));
    // Alone it patches nothing: the base renders unchanged.
    expect(rendered.get('before-1.30')).toEqual(rendered.get('base'));
  });

  it('leaves the agent DaemonSet exactly as the base renders it', () => {
    const ds = (name: string) => rendered.get(name)!.find((o) => o.kind === 'DaemonSet');
    expect(ds('alerts')).toEqual(ds('base'));
  });
});

describe('rewrite-webhook component', () => {
  const docs = () => rendered.get('rewrite-webhook')!;
  const one = (kind: string) => {
    const found = docs().filter((o) => o.kind === kind);
    expect(found, kind).toHaveLength(1);
    return found[0]!;
  };
  const deployment = () => one('Deployment');
  const container = () => deployment().spec.template.spec.containers[0];
  /** The container's args parsed by the real `webhook` command definition. */
  function webhookFlags(): Record<string, string> {
    const program = new Command().exitOverride();
    registerWebhookCommand(program);
    let raw: Record<string, string> | undefined;
    program.commands.find((c) => c.name() === 'webhook')!.action((opts: Record<string, string>) => { raw = opts; });
    program.parse(container().args, { from: 'user' });
    return raw!;
  }

  it('runs `probe-agent webhook` with flags it has, unprivileged, with the agent image', () => {
    const c = container();
    expect(c.args[0]).toBe('webhook');
    const flags = webhookFlags();
    expect(flags.listen).toBe(':8443');
    const agentImage = found(rendered.get('base')!.find((o) => o.kind === 'DaemonSet'), 'the base DaemonSet').spec.template.spec.containers[0].image;
    expect(c.image).toBe(agentImage);
    const spec = deployment().spec.template.spec;
    expect(spec.hostNetwork ?? false).toBe(false);
    // It reads one Node or RuntimeClass by name (DaemonSet pods, sandboxed classes), nothing else.
    expect(spec.automountServiceAccountToken).toBe(true);
    expect(spec.serviceAccountName).toBe('probe-agent-webhook');
    const role = found(docs().find((o) => o.kind === 'ClusterRole' && o.metadata.name === 'probe-agent-webhook'), 'ClusterRole probe-agent-webhook');
    expect(role.rules).toEqual([{ apiGroups: [''], resources: ['nodes'], verbs: ['get'] }, { apiGroups: ['node.k8s.io'], resources: ['runtimeclasses'], verbs: ['get'] }]);
    // The gates lease controller's rights and flag come only with components/gates-lease.
    expect(docs().filter((o) => o.metadata.name === 'probe-agent-webhook-gates-leases')).toEqual([]);
    expect(c.args).not.toContain('--gates-lease-controller');
    expect(spec.securityContext.runAsNonRoot).toBe(true);
    expect(c.securityContext).toEqual({ allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: { drop: ['ALL'] } });
    expect((spec.volumes as Obj[]).every((vol) => !vol.hostPath)).toBe(true);
    expect(deployment().spec.replicas).toBeGreaterThanOrEqual(2);
    const pdb = one('PodDisruptionBudget');
    expect(pdb.spec.minAvailable).toBe(1);
    for (const [k, val] of Object.entries(pdb.spec.selector.matchLabels)) expect(deployment().spec.template.metadata.labels[k]).toBe(val);
    const heap = /--max-old-space-size=(\d+)/.exec((c.env as Obj[]).find((e) => e.name === 'NODE_OPTIONS')?.value ?? '');
    expect(Number(heap?.[1])).toBeLessThan(mib(c.resources.limits.memory) * 0.75);
  });

  it('with gates-lease: the lease controller flag, the agent Lease, and the rights they need', () => {
    const objs = rendered.get('gates-webhook-lease')!;
    const web = found(objs.find((o) => o.kind === 'Deployment' && o.metadata.name === 'probe-agent-webhook'), 'the webhook Deployment').spec.template.spec.containers[0];
    expect(web.args).toContain('--gates-lease-controller');
    const agentEnv = found(objs.find((o) => o.kind === 'DaemonSet' && o.metadata.name === 'probe-agent'), 'the agent DaemonSet').spec.template.spec.containers[0].env as Obj[];
    expect(agentEnv).toContainEqual({ name: 'PROBE_AGENT_NODE_LEASE_DURATION', value: '40s' });
    const roles = objs.filter((o) => (o.kind === 'ClusterRole' || o.kind === 'Role') && o.metadata.name === 'probe-agent-webhook-gates-leases');
    // Leader election through its own Lease (agent/gates/leader.ts: get and update by name; create cannot be limited by name: lease-policy.yaml does).
    expect(roles.map((r) => [r.kind, r.metadata.namespace, r.rules])).toEqual([
      ['Role', 'probe-agent', [
        { apiGroups: ['coordination.k8s.io'], resources: ['leases'], verbs: ['list'] },
        { apiGroups: ['coordination.k8s.io'], resources: ['leases'], resourceNames: ['gates-lease-controller'], verbs: ['get', 'update'] },
        { apiGroups: ['coordination.k8s.io'], resources: ['leases'], verbs: ['create'] },
      ]],
      ['ClusterRole', undefined, [{ apiGroups: [''], resources: ['pods'], verbs: ['list'] }, { apiGroups: [''], resources: ['pods/status'], verbs: ['patch'] }]],
    ]);
    for (const b of objs.filter((o) => (o.kind === 'ClusterRoleBinding' || o.kind === 'RoleBinding') && o.metadata.name === 'probe-agent-webhook-gates-leases')) {
      expect(b.subjects).toEqual([{ kind: 'ServiceAccount', name: 'probe-agent-webhook', namespace: 'probe-agent' }]);
    }
  });

  it('reads its certificate from the Secret cert-manager renews, and cert-manager injects the CA for that Service name', () => {
    const flags = webhookFlags();
    const c = container();
    const mount = (c.volumeMounts as Obj[]).find((m) => flags.tlsCertFile!.startsWith(`${m.mountPath}/`));
    expect(mount?.readOnly).toBe(true);
    expect(path.dirname(flags.tlsKeyFile!)).toBe(mount!.mountPath);
    expect(path.basename(flags.tlsCertFile!)).toBe('tls.crt');
    expect(path.basename(flags.tlsKeyFile!)).toBe('tls.key');
    const volume = (deployment().spec.template.spec.volumes as Obj[]).find((vol) => vol.name === mount!.name);
    const cert = found(docs().find((o) => o.kind === 'Certificate' && o.spec.secretName === volume?.secret?.secretName), 'the serving Certificate');
    expect(cert.spec.isCA ?? false).toBe(false);
    const svc = one('Service');
    expect(cert.spec.dnsNames).toContain(`${svc.metadata.name}.${svc.metadata.namespace}.svc`);
    expect(docs().find((o) => o.kind === 'Issuer' && o.metadata.name === cert.spec.issuerRef.name)).toBeDefined();
    expect(one('MutatingWebhookConfiguration').metadata.annotations['cert-manager.io/inject-ca-from']).toBe(`${cert.metadata.namespace}/${cert.metadata.name}`);
  });

  it('routes both webhooks to the server paths through the Service, failing open, pods CREATE only', () => {
    const svc = one('Service');
    const labels = deployment().spec.template.metadata.labels;
    for (const [k, val] of Object.entries(svc.spec.selector)) expect(labels[k]).toBe(val);
    const port = (container().ports as Obj[]).find((p) => p.name === svc.spec.ports[0].targetPort);
    expect(`:${port?.containerPort}`).toBe(webhookFlags().listen);
    const config = one('MutatingWebhookConfiguration');
    expect(config.webhooks.map((w: Obj) => w.clientConfig.service.path)).toEqual([MUTATE_PATH, MUTATE_ANNOTATED_PATH]);
    for (const w of config.webhooks as Obj[]) {
      expect(w.clientConfig.service).toMatchObject({ name: svc.metadata.name, namespace: svc.metadata.namespace, port: svc.spec.ports[0].port });
      expect(w.failurePolicy).toBe('Ignore');
      expect(w.sideEffects).toBe('None');
      expect(w.timeoutSeconds).toBeLessThanOrEqual(5);
      expect(w.admissionReviewVersions).toEqual(['v1']);
      expect(w.rules).toEqual([{ operations: ['CREATE'], apiGroups: [''], apiVersions: ['v1'], resources: ['pods'], scope: 'Namespaced' }]);
      // Never its own namespace: a rewritten webhook pod would wait for a shim-labelled node for itself.
      expect(w.namespaceSelector.matchExpressions).toContainEqual({ key: 'kubernetes.io/metadata.name', operator: 'NotIn', values: ['kube-system', deployment().metadata.namespace] });
    }
    const [byNamespace, byAnnotation] = config.webhooks as Obj[];
    expect(byNamespace!.namespaceSelector.matchExpressions).toContainEqual({ key: OPT_IN_NAMESPACE_LABEL, operator: 'In', values: [OPT_IN_VALUE] });
    expect(byAnnotation!.namespaceSelector.matchExpressions).toContainEqual({ key: OPT_IN_NAMESPACE_LABEL, operator: 'NotIn', values: [OPT_IN_VALUE] });
    const cel = byAnnotation!.matchConditions[0].expression as string;
    expect(cel).toContain(`object.metadata.annotations['${OPT_IN_ANNOTATION}'] == '${OPT_IN_VALUE}'`);
    expect(cel).toContain(`'${OPT_IN_ANNOTATION}' in object.metadata.annotations`);
  });

  it('leaves the agent DaemonSet exactly as the base renders it', () => {
    const ds = (name: string) => rendered.get(name)!.find((o) => o.kind === 'DaemonSet');
    expect(ds('rewrite-webhook')).toEqual(ds('base'));
  });

  it("verifies its callers by default, against the CA that issues the API server's client certificate", () => {
    const flags = webhookFlags();
    expect(typeof flags.clientCaFile).toBe('string');
    const c = container();
    const mount = (c.volumeMounts as Obj[]).find((m) => path.dirname(flags.clientCaFile!) === m.mountPath);
    expect(mount?.readOnly).toBe(true);
    const volume = found((deployment().spec.template.spec.volumes as Obj[]).find((vol) => vol.name === mount!.name), 'the client CA volume');
    // The CA's certificate only, never its key.
    expect(volume.secret.items).toEqual([{ key: 'ca.crt', path: path.basename(flags.clientCaFile!) }]);
    const certs = docs().filter((o) => o.kind === 'Certificate');
    const ca = found(certs.find((o) => o.spec.secretName === volume.secret.secretName), 'the client CA Certificate');
    expect(ca.spec.isCA).toBe(true);
    const caIssuer = found(docs().find((o) => o.kind === 'Issuer' && o.spec.ca?.secretName === ca.spec.secretName), 'the client CA Issuer');
    const client = certs.find((o) => o.spec.issuerRef.name === caIssuer.metadata.name);
    expect(client?.spec.usages).toContain('client auth');
    expect(client?.spec.usages).not.toContain('server auth');
    expect(client?.spec.isCA ?? false).toBe(false);
    // What docs/deploy.md tells the operator to copy to the API servers.
    expect(client?.spec.secretName).toBe('probe-agent-apiserver-admission');
    const deployDoc = readFileSync(path.join(ROOT, 'docs/deploy.md'), 'utf8');
    expect(deployDoc).toContain(`secret ${client?.spec.secretName}`);
    // The serving certificate is not from that CA: a client certificate cannot serve, nor the reverse.
    const serving = certs.find((o) => !o.spec.isCA && o !== client);
    expect(serving?.spec.issuerRef.name).not.toBe(caIssuer.metadata.name);
  });

  it('turns verification off only when told, with --no-client-ca-file after it', () => {
    const parse = (args: string[]): Record<string, unknown> => {
      const program = new Command().exitOverride();
      registerWebhookCommand(program);
      let raw: Record<string, unknown> = {};
      program.commands.find((c) => c.name() === 'webhook')!.action((opts: Record<string, unknown>) => { raw = opts; });
      program.parse(args, { from: 'user' });
      return raw;
    };
    expect(parse(container().args as string[]).clientCaFile).toBe('/etc/probe-agent/webhook-client-ca/ca.crt');
    expect(parse([...container().args as string[], '--no-client-ca-file']).clientCaFile).toBe(false);
    // The flag's older meaning is kept: absent, callers are not verified (and the server says so).
    expect(parse(['webhook']).clientCaFile).toBeUndefined();
  });

  it("admits only the overlay's API_SERVER_CIDR to the webhook's port, and applies nothing else of that setting", () => {
    const policy = one('NetworkPolicy');
    const labels = deployment().spec.template.metadata.labels;
    for (const [k, val] of Object.entries(policy.spec.podSelector.matchLabels)) expect(labels[k]).toBe(val);
    expect(Object.keys(policy.spec.podSelector.matchLabels).length).toBeGreaterThan(0);
    // Ingress only (the webhook's own calls to the API server stay open), one rule, one source.
    expect(policy.spec.policyTypes).toEqual(['Ingress']);
    expect(policy.spec.ingress).toHaveLength(1);
    const [rule] = policy.spec.ingress as Obj[];
    expect(rule!.from).toEqual([{ ipBlock: { cidr: API_SERVER_CIDR } }]);
    expect(validCidr(rule!.from[0].ipBlock.cidr)).toBe(true);
    const listen = Number(webhookFlags().listen!.split(':').at(-1));
    expect(rule!.ports).toEqual([{ protocol: 'TCP', port: listen }]);
    expect((container().ports as Obj[]).map((p) => p.containerPort)).toEqual([listen]);
    expect(docs().filter((o) => o.kind === 'ConfigMap' && o.metadata.name === 'probe-agent-webhook-network-policy')).toEqual([]);
  });

  it('refuses to render without API_SERVER_CIDR, naming what to set', () => {
    const dir = mkdtempSync(path.join(scratch, 'webhook-no-cidr-'));
    const rel = (p: string) => path.relative(dir, path.join(DEPLOY, p));
    writeFileSync(path.join(dir, 'kustomization.yaml'), `resources: [${rel('base')}]\ncomponents: [${rel('components/rewrite-webhook')}]\n`);
    const r = spawnSync('kubectl', ['kustomize', dir], { encoding: 'utf8' });
    expect(r.status).not.toBe(0);
    expect(r.stdout).toBe('');
    expect(r.stderr).toMatch(/nothing selected by ConfigMap.*probe-agent-webhook-network-policy.*data\.API_SERVER_CIDR/);
  });

  it("the example overlay's commented webhook lines, uncommented, render the webhook behind its NetworkPolicy", () => {
    const example = readFileSync(path.join(DEPLOY, 'overlays/example/kustomization.yaml'), 'utf8').split('\n');
    const start = example.indexOf('# configMapGenerator:');
    expect(start).toBeGreaterThan(0);
    const out: string[] = [];
    let inBlock = false;
    for (const [i, line] of example.entries()) {
      if (i === start) inBlock = true;
      if (inBlock && !line.startsWith('#')) inBlock = false;
      if (inBlock) out.push(line.replace(/^# ?/, ''));
      else out.push(line.replace(/^  # (- \.\.\/\.\.\/components\/(kubelet-shim|rewrite-webhook))$/, '  $1'));
    }
    const dir = mkdtempSync(path.join(scratch, 'example-webhook-'));
    writeFileSync(path.join(dir, 'kustomization.yaml'), out.join('\n').replaceAll('../../', `${path.relative(dir, DEPLOY)}/`));
    const objs = parseAllDocuments(execFileSync('kubectl', ['kustomize', dir], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] })).map((d) => d.toJS() as Obj);
    const policy = objs.find((o) => o.kind === 'NetworkPolicy' && o.metadata.name === 'probe-agent-webhook');
    expect(policy?.spec.ingress[0].from[0].ipBlock.cidr).toMatch(/^\d+\.\d+\.\d+\.\d+\/\d+$/);
    expect(validCidr(policy!.spec.ingress[0].from[0].ipBlock.cidr)).toBe(true);
    expect(objs.some((o) => o.kind === 'DaemonSet' && o.metadata.name === 'probe-agent-shim-installer')).toBe(true);
    expect(objs.some((o) => o.kind === 'Deployment' && o.metadata.name === 'probe-agent-webhook')).toBe(true);
    expect(objs.some((o) => o.kind === 'ConfigMap' && o.metadata.name === 'probe-agent-webhook-network-policy')).toBe(false);
  });
});

/** What the API server's validation accepts for an ipBlock cidr: an address with a prefix length in range. */
function validCidr(cidr: string): boolean {
  const m = /^(.+)\/(\d{1,3})$/.exec(cidr);
  if (!m) return false;
  const family = isIP(m[1]!);
  return family !== 0 && Number(m[2]) <= (family === 4 ? 32 : 128);
}

describe('Dockerfile', () => {
  const dockerfile = readFileSync(path.join(ROOT, 'Dockerfile'), 'utf8').replace(/\\\n/g, ' ');
  const lines = dockerfile.split('\n').map((l) => l.trim()).filter((l) => l && !l.startsWith('#'));
  const stages = lines.filter((l) => /^FROM /i.test(l));
  const runtimeStart = lines.lastIndexOf(stages.at(-1)!);
  const runtime = lines.slice(runtimeStart);
  const workdir = runtime.find((l) => l.startsWith('WORKDIR '))!.split(/\s+/)[1]!;
  /** Image path -> where its content comes from in the repository (build outputs named by their source path). */
  const layout = new Map<string, string>();
  for (const l of runtime.filter((x) => x.startsWith('COPY '))) {
    const parts = l.split(/\s+/).slice(1);
    const from = parts[0]!.startsWith('--from=') ? parts.shift() : undefined;
    const [src, dst] = parts as [string, string];
    layout.set(path.posix.resolve(workdir, dst), from ? path.posix.relative('/src', src) : src.replace(/^\.\//, ''));
  }

  it('is multi-stage: a node:24 build stage, a runtime root from node:24-slim cut to what runs, as root, under tini', () => {
    // build, runtime-packages, node-stripped, runtime-root, and the final stage from scratch.
    expect(stages).toEqual(['FROM ${BUILD_IMAGE} AS build', 'FROM ${RUNTIME_IMAGE} AS runtime-packages', 'FROM ${BUILD_IMAGE} AS node-stripped',
      'FROM runtime-packages AS runtime-root', 'FROM scratch']);
    expect(lines).toContain('ARG BUILD_IMAGE=node:24');
    expect(lines).toContain('ARG RUNTIME_IMAGE=node:24-slim');
    expect(lines.some((l) => l.includes('npm ci'))).toBe(true);
    expect(lines.some((l) => l.includes('npx tsc -p tsconfig.json'))).toBe(true);
    expect(lines.some((l) => l.includes('make -C netns-helper'))).toBe(true);
    expect(lines.some((l) => l.includes('npm prune --omit=dev'))).toBe(true);
    expect(lines.some((l) => l.includes('strip --strip-all /node'))).toBe(true);
    expect(readFileSync(path.join(ROOT, 'netns-helper/Makefile'), 'utf8')).toMatch(/-static/);
    // The agent runs no ip or nsenter itself (addresses come from the helper over netlink): only
    // the sidecar's nft, tini, and the shim installer's nsenter.
    const apt = lines.find((l) => l.includes('apt-get install'))!.split(/\s+/);
    for (const pkg of ['util-linux', 'nftables', 'tini']) expect(apt).toContain(pkg);
    expect(apt).not.toContain('iproute2');
    const root = lines.find((l) => l.includes('progs='))!;
    for (const prog of ['/usr/local/bin/node', 'tini', 'nft', 'nsenter', 'bash', 'sed', 'grep', 'coreutils']) expect(root).toContain(prog);
    expect(runtime[1]).toBe('COPY --from=runtime-root /runtime /');
    expect(runtime).toContain('USER 0:0');
    expect(runtime).toContain('ENTRYPOINT ["/usr/bin/tini", "--", "/opt/probe-agent/bin/probe-agent"]');
    expect(layout.get('/opt/probe-agent/bin')).toBe('bin');
    expect(existsSync(path.join(ROOT, 'bin/probe-agent'))).toBe(true);
  });

  it('ships every file the agent loads relative to its own modules', () => {
    // Each `new URL('<rel>', import.meta.url)` in agent/x/y.ts runs as dist/x/y.js in the image.
    const lookups: string[] = [];
    const walk = (dir: string): void => {
      for (const e of readdirSync(dir, { withFileTypes: true })) {
        const p = path.join(dir, e.name);
        if (e.isDirectory()) walk(p);
        else if (p.endsWith('.ts')) {
          for (const m of readFileSync(p, 'utf8').matchAll(/new URL\('([^']+)', import\.meta\.url\)/g)) {
            const distDir = path.posix.join(workdir, 'dist', path.relative(path.join(ROOT, 'agent'), path.dirname(p)));
            lookups.push(path.posix.resolve(distDir, m[1]!));
          }
        }
      }
    };
    walk(path.join(ROOT, 'agent'));
    expect(lookups.length).toBeGreaterThanOrEqual(3);
    for (const target of lookups) {
      const covering = [...layout.keys()].find((dst) => target === dst || target.startsWith(`${dst}/`));
      expect(covering, `${target} is not in the image`).toBeDefined();
      const repoPath = path.join(layout.get(covering!)!, path.posix.relative(covering!, target));
      if (!['dist', 'node_modules', 'netns-helper/build'].some((built) => repoPath.startsWith(built))) {
        expect(existsSync(path.join(ROOT, repoPath)), repoPath).toBe(true);
      }
    }
  });

  it('copies only sources the build context keeps', () => {
    const ignored = readFileSync(path.join(ROOT, '.dockerignore'), 'utf8').split('\n').map((l) => l.trim()).filter((l) => l && !l.startsWith('#'));
    const contextCopies = lines.filter((l) => l.startsWith('COPY ') && !l.includes('--from=')).flatMap((l) => l.split(/\s+/).slice(1, -1));
    expect(contextCopies).toEqual(expect.arrayContaining(['package.json', 'package-lock.json', 'agent', 'netns-helper', 'proto', 'bin']));
    for (const src of contextCopies) {
      expect(existsSync(path.join(ROOT, src)), src).toBe(true);
      expect(ignored.filter((pat) => src === pat || src.startsWith(`${pat}/`)), src).toEqual([]);
    }
    for (const built of ['node_modules', 'dist', 'netns-helper/build']) expect(ignored).toContain(built);
  });
});

describe('docs', () => {
  it('deploy.md names every component; closing-the-hole.md every close-hole setting', () => {
    const deployDoc = readFileSync(path.join(ROOT, 'docs/deploy.md'), 'utf8');
    for (const c of COMPONENTS) expect(deployDoc, c).toContain(`components/${c}`);
    const holeDoc = readFileSync(path.join(ROOT, 'docs/closing-the-hole.md'), 'utf8');
    const settings = readFileSync(path.join(DEPLOY, 'components/nftables-close-hole/close-hole.env'), 'utf8').match(/^CLOSE_HOLE_[A-Z_]+/gm)!;
    expect(settings.length).toBeGreaterThan(5);
    for (const s of settings) expect(holeDoc, s).toContain(s);
  });
});
