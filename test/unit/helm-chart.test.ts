/**
 * deploy/helm/probe-agent: `helm lint`, `helm template` with several value sets, and the chart
 * against the kustomize manifests it stands for. For each choice an operator can make both ways, the
 * chart and a kustomize overlay of deploy/base + deploy/components are rendered and their objects
 * compared after a normalization that removes only what legitimately differs (Helm's own labels,
 * kustomize's ConfigMap name hashes and the checksum annotations that replace them, the Namespace,
 * which a chart leaves to `--create-namespace`, and the order of name-keyed lists that kustomize's
 * patches reorder). So neither drifts from the other. helm v4 and kubectl v1.33 come from
 * `make kube-tools` (.tools/bin).
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { isDeepStrictEqual } from 'node:util';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse, parseAllDocuments } from 'yaml';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const DEPLOY = path.join(ROOT, 'deploy');
const CHART = path.join(DEPLOY, 'helm/probe-agent');
const NS = 'probe-agent';

type Obj = Record<string, any>;

/** A tool from `make kube-tools`, or a failure saying how to get it. */
function tool(name: 'helm' | 'kubectl'): string {
  const p = path.join(ROOT, '.tools/bin', name);
  if (!existsSync(p)) throw new Error(`${p} is missing: run \`make kube-tools\` (make test does)`);
  return p;
}

/** Kubernetes reads manifests as YAML 1.1 (0444 is octal there). */
function parseDocs(text: string): Obj[] {
  return parseAllDocuments(text, { version: '1.1' }).map((d) => d.toJS() as Obj).filter((o) => o !== null && o !== undefined);
}

let scratch: string;

function helm(args: string[]): { ok: boolean; out: string; err: string } {
  const r = spawnSync(tool('helm'), args, { encoding: 'utf8', maxBuffer: 64 << 20 });
  if (r.error) throw r.error;
  return { ok: r.status === 0, out: r.stdout, err: r.stderr };
}

/** `helm template` of the chart with these values, as release probe-agent in namespace probe-agent. */
function template(values: Obj, kubeVersion = '1.33.0'): Obj[] {
  return parseDocs(templateText(values, kubeVersion));
}

function templateText(values: Obj, kubeVersion: string): string {
  const r = templateRaw(values, kubeVersion);
  if (!r.ok) throw new Error(`helm template failed: ${r.err}`);
  return r.out;
}

/**
 * The chart's output read and written by kustomize's own YAML library, as its overlays are: Go's
 * YAML and the JavaScript one disagree on some folded scalars (whitespace inside CEL expressions),
 * so both sides of a comparison go through the same reader.
 */
function templateThroughKustomize(values: Obj, kubeVersion: string): Obj[] {
  const dir = mkdtempSync(path.join(scratch, 'chart-'));
  writeFileSync(path.join(dir, 'chart.yaml'), templateText(values, kubeVersion));
  writeFileSync(path.join(dir, 'kustomization.yaml'), 'resources: [chart.yaml]\n');
  return kustomizeDir(dir);
}

function templateRaw(values: Obj, kubeVersion = '1.33.0'): { ok: boolean; out: string; err: string } {
  const file = path.join(mkdtempSync(path.join(scratch, 'values-')), 'values.json');
  writeFileSync(file, JSON.stringify(values));
  return helm(['template', 'probe-agent', CHART, '--namespace', NS, '--kube-version', kubeVersion, '-f', file]);
}

/** `kubectl kustomize` of deploy/base with these components and extra kustomization lines. */
function kustomize(components: string[], extra: string[] = []): Obj[] {
  const dir = mkdtempSync(path.join(scratch, 'overlay-'));
  const rel = (p: string) => path.relative(dir, path.join(DEPLOY, p));
  const lines = [`resources: [${rel('base')}]`, `components: [${components.map((c) => rel(`components/${c}`)).join(', ')}]`, ...extra];
  writeFileSync(path.join(dir, 'kustomization.yaml'), lines.join('\n') + '\n');
  return kustomizeDir(dir);
}

function kustomizeDir(dir: string): Obj[] {
  return parseDocs(execFileSync(tool('kubectl'), ['kustomize', dir], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], maxBuffer: 64 << 20 }));
}

const API_SERVER_CIDR = '192.0.2.0/28';
const POD_CIDRS = ['10.244.0.0/16', 'fd00:10:244::/56'];
/** What an overlay with rewrite-webhook adds. */
const WEBHOOK_SETTINGS = [
  'configMapGenerator:',
  '  - name: probe-agent-webhook-network-policy',
  `    literals: [API_SERVER_CIDR=${API_SERVER_CIDR}]`,
  '    options: {disableNameSuffixHash: true, annotations: {config.kubernetes.io/local-config: "true"}}',
];
/** What an overlay with rewrite-webhook and nftables-close-hole adds (the example overlay shows both). */
const OVERLAY_SETTINGS = [
  ...WEBHOOK_SETTINGS,
  'patches:',
  '  - target: {kind: ConfigMap, name: probe-agent-close-hole}',
  '    patch: |-',
  '      - op: replace',
  '        path: /data/CLOSE_HOLE_POD_CIDRS',
  `        value: ${POD_CIDRS.join(',')}`,
];

const key = (o: Obj) => `${o.kind}/${o.metadata?.namespace ?? '-'}/${o.metadata?.name}`;
const HELM_LABELS = ['helm.sh/chart', 'app.kubernetes.io/managed-by', 'app.kubernetes.io/instance'];
/** Lists Kubernetes merges by name, whose order kustomize's strategic-merge patches change. */
const BY_NAME = new Set(['env', 'volumes', 'volumeMounts', 'containers', 'initContainers']);

function sortNamed(v: any): any {
  if (Array.isArray(v)) return v.map(sortNamed);
  if (v === null || typeof v !== 'object') return v;
  const out: Obj = {};
  for (const [k, x] of Object.entries(v)) {
    out[k] = BY_NAME.has(k) && Array.isArray(x) ? sortNamed([...x].sort((a, b) => String(a.name).localeCompare(String(b.name)))) : sortNamed(x);
  }
  return out;
}

function renameStrings(v: any, names: Map<string, string>): any {
  if (typeof v === 'string') return names.get(v) ?? v;
  if (Array.isArray(v)) return v.map((x) => renameStrings(x, names));
  if (v === null || typeof v !== 'object') return v;
  return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, renameStrings(x, names)]));
}

/** The chart's objects without Helm's own labels and checksum annotations, keyed and sorted. */
function normalizeChart(objs: Obj[]): Map<string, Obj> {
  const out = new Map<string, Obj>();
  for (const o of structuredClone(objs)) {
    for (const l of HELM_LABELS) delete o.metadata?.labels?.[l];
    if (o.metadata?.labels && Object.keys(o.metadata.labels).length === 0) delete o.metadata.labels;
    const ann = o.spec?.template?.metadata?.annotations;
    if (ann) for (const a of Object.keys(ann)) if (a.startsWith('checksum/')) delete ann[a];
    if (ann && Object.keys(ann).length === 0) delete o.spec.template.metadata.annotations;
    out.set(key(o), sortNamed(o));
  }
  return out;
}

/**
 * Kustomize's objects without the Namespace (the chart installs into a namespace made beforehand)
 * and with generated ConfigMaps under their plain names, wherever those names are used.
 */
function normalizeKustomize(objs: Obj[]): { objects: Map<string, Obj>; namespace: Obj | undefined } {
  const hashed = new Map<string, string>();
  for (const o of objs) {
    const m = /^(.+)-[a-z0-9]{10}$/.exec(o.metadata?.name ?? '');
    if (o.kind === 'ConfigMap' && m) hashed.set(o.metadata.name, m[1]!);
  }
  const out = new Map<string, Obj>();
  let namespace: Obj | undefined;
  for (const raw of objs) {
    if (raw.kind === 'Namespace') { namespace = raw; continue; }
    const o = renameStrings(raw, hashed) as Obj;
    out.set(key(o), sortNamed(o));
  }
  return { objects: out, namespace };
}

/** Every $(VAR) in a container's env names a variable defined before it (the kubelet expands only those). */
function unresolvedEnvRefs(objs: Obj[]): string[] {
  const bad: string[] = [];
  for (const o of objs) {
    for (const c of o.spec?.template?.spec?.containers ?? []) {
      const seen = new Set<string>();
      for (const e of c.env ?? []) {
        for (const m of String(e.value ?? '').matchAll(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g)) if (!seen.has(m[1]!)) bad.push(`${o.metadata.name}/${c.name}: ${e.name} -> ${m[1]}`);
        seen.add(e.name);
      }
    }
  }
  return bad;
}

interface Equivalence { name: string; values: Obj; kubeVersion: string; kustomize: () => Obj[] }

const SHIM_VALUES: Obj = {
  mode: 'shim',
  runtime: 'containerd',
  webhook: { enabled: true, apiServerCIDRs: [API_SERVER_CIDR], rewriteOnUpdate: true },
  closeHole: { enabled: true, podCIDRs: POD_CIDRS },
  podMonitor: { enabled: true },
  alerts: { enabled: true },
};
const SHIM_COMPONENTS = ['containerd', 'pod-monitor', 'alerts', 'nftables-close-hole', 'kubelet-shim', 'rewrite-webhook', 'rewrite-on-update'];

const GATES_VALUES: Obj = { mode: 'gates', runtime: 'containerd', webhook: { enabled: true, apiServerCIDRs: [API_SERVER_CIDR] } };

const EQUIVALENCES: Equivalence[] = [
  { name: 'the agent alone (base)', values: { runtime: '' }, kubeVersion: '1.33.0', kustomize: () => kustomize([]) },
  {
    name: 'the example overlay',
    values: {
      image: { repository: 'registry.example.com/platform/probe-agent', tag: '0.1.0' },
      runtime: 'containerd',
      agent: { maxUnavailable: '10%' },
      podMonitor: { enabled: true, labels: { release: 'kube-prometheus-stack' } },
    },
    kubeVersion: '1.33.0',
    kustomize: () => kustomizeDir(path.join(DEPLOY, 'overlays/example')),
  },
  { name: 'shim mode, webhook, close-hole, pod monitor, alerts on 1.33', values: SHIM_VALUES, kubeVersion: '1.33.0', kustomize: () => kustomize(SHIM_COMPONENTS, OVERLAY_SETTINGS) },
  {
    name: 'the same on 1.29 (before-1.30)',
    values: SHIM_VALUES,
    kubeVersion: '1.29.0',
    kustomize: () => kustomize([...SHIM_COMPONENTS, 'before-1.30'], OVERLAY_SETTINGS),
  },
  {
    name: 'gates mode with the webhook',
    values: GATES_VALUES,
    kubeVersion: '1.33.0',
    kustomize: () => kustomize(['containerd', 'rewrite-webhook', 'gates'], WEBHOOK_SETTINGS),
  },
  {
    name: 'gates mode with the lease controller',
    values: { ...GATES_VALUES, gatesLease: { enabled: true, duration: '40s' } },
    kubeVersion: '1.33.0',
    kustomize: () => kustomize(['containerd', 'rewrite-webhook', 'gates', 'gates-lease'], WEBHOOK_SETTINGS),
  },
  {
    name: 'crio, service monitor and every agent option',
    values: {
      runtime: 'crio',
      serviceMonitor: { enabled: true },
      agent: { kubeletInsecureTLS: true, nodesProxyFallback: true, procfsResolver: true, hostNetwork: true, privileged: true },
    },
    kubeVersion: '1.33.0',
    kustomize: () => kustomize(['crio', 'service-monitor', 'kubelet-insecure-tls', 'nodes-proxy-fallback', 'procfs-resolver', 'host-network', 'privileged']),
  },
];

beforeAll(() => {
  tool('helm');
  tool('kubectl');
  scratch = mkdtempSync(path.join(tmpdir(), 'probe-agent-helm-'));
});

afterAll(() => {
  if (scratch) rmSync(scratch, { recursive: true, force: true });
});

describe('helm chart deploy/helm/probe-agent', () => {
  it('passes helm lint with its defaults and with every feature on', () => {
    const plain = helm(['lint', CHART, '--namespace', NS]);
    expect(plain.ok, plain.out + plain.err).toBe(true);
    const file = path.join(scratch, 'lint-values.json');
    writeFileSync(file, JSON.stringify(SHIM_VALUES));
    const full = helm(['lint', CHART, '--namespace', NS, '--kube-version', '1.33.0', '-f', file]);
    expect(full.ok, full.out + full.err).toBe(true);
    expect(full.out).toMatch(/1 chart\(s\) linted, 0 chart\(s\) failed/);
  });

  it('renders the agent alone by default: no shim, webhook, sidecar or monitoring objects', () => {
    const objs = template({});
    expect(objs.map(key).sort()).toEqual(['ClusterRole/-/probe-agent', 'ClusterRoleBinding/-/probe-agent', `DaemonSet/${NS}/probe-agent`, `ServiceAccount/${NS}/probe-agent`]);
    const pod = objs.find((o) => o.kind === 'DaemonSet')!.spec.template.spec;
    expect(pod.containers.map((c: Obj) => c.name)).toEqual(['agent']);
    expect(pod.hostNetwork).toBe(false);
    const env = Object.fromEntries(pod.containers[0].env.map((e: Obj) => [e.name, e.value]));
    expect(env.PROBE_AGENT_CRI_ENDPOINT).toBe('unix:///run/containerd/containerd.sock');
    expect(env.PROBE_AGENT_SHUTDOWN_GRACE_PERIOD).toBe('10s');
    expect(pod.containers[0].image).toBe('probe-agent:0.1.0');
    expect(unresolvedEnvRefs(objs)).toEqual([]);
  });

  it('renders shim mode with the webhook, close-hole, monitors and alerts, the webhook policy from values', () => {
    const objs = template({ ...SHIM_VALUES, webhook: { ...SHIM_VALUES.webhook, failurePolicy: 'Fail', timeoutSeconds: 7 } });
    const kinds = new Set(objs.map((o) => o.kind));
    for (const k of ['MutatingWebhookConfiguration', 'ValidatingAdmissionPolicy', 'ValidatingAdmissionPolicyBinding', 'Deployment', 'NetworkPolicy', 'Certificate', 'PodMonitor', 'PrometheusRule']) expect(kinds.has(k), k).toBe(true);
    const mwc = objs.find((o) => o.kind === 'MutatingWebhookConfiguration')!;
    expect(mwc.webhooks.map((w: Obj) => w.name)).toEqual(['namespaces.rewrite.probe-agent.io', 'pods.rewrite.probe-agent.io', 'updates.rewrite.probe-agent.io']);
    // The operator's policy on the CREATE entries; the UPDATE entry keeps Fail (components/rewrite-on-update).
    expect(mwc.webhooks.map((w: Obj) => [w.failurePolicy, w.timeoutSeconds])).toEqual([['Fail', 7], ['Fail', 7], ['Fail', 7]]);
    const ds = objs.find((o) => o.kind === 'DaemonSet' && o.metadata.name === 'probe-agent')!;
    expect(ds.spec.template.spec.containers.map((c: Obj) => c.name)).toEqual(['agent', 'close-hole']);
    expect(ds.spec.template.metadata.annotations['checksum/close-hole']).toMatch(/^[0-9a-f]{64}$/);
    const closeHole = objs.find((o) => o.kind === 'ConfigMap' && o.metadata.name === 'probe-agent-close-hole')!;
    expect(closeHole.data.CLOSE_HOLE_POD_CIDRS).toBe(POD_CIDRS.join(','));
    // The PrometheusRule carries the component's source rules file, group for group.
    const rules = parse(readFileSync(path.join(DEPLOY, 'components/alerts/probe-agent.rules.yaml'), 'utf8')) as Obj;
    expect(objs.find((o) => o.kind === 'PrometheusRule')!.spec.groups).toEqual(rules.groups);
    expect(unresolvedEnvRefs(objs)).toEqual([]);
  });

  it('leaves out what an API server before 1.30 refuses, from the cluster version', () => {
    const objs = template(SHIM_VALUES, '1.29.0');
    expect(objs.filter((o) => o.kind.startsWith('ValidatingAdmissionPolicy'))).toEqual([]);
    const mwc = objs.find((o) => o.kind === 'MutatingWebhookConfiguration')!;
    expect(mwc.webhooks.map((w: Obj) => w.name)).toEqual(['namespaces.rewrite.probe-agent.io', 'updates.rewrite.probe-agent.io']);
    // before130: false overrides the version (an operator who knows better).
    const forced = template({ ...SHIM_VALUES, before130: false }, '1.29.0');
    // The installer's node-label policy and the webhook's unreviewed-pod policy, each with its binding.
    expect(forced.filter((o) => o.kind.startsWith('ValidatingAdmissionPolicy')).map((o) => o.metadata.name).sort()).toEqual([
      'probe-agent-rewrite-reviewed', 'probe-agent-rewrite-reviewed', 'probe-agent-shim-installer-node-label', 'probe-agent-shim-installer-node-label',
    ]);
  });

  it('opts namespaces in by name with an entry of their own, kept out of the annotated entry', () => {
    const objs = template({ ...SHIM_VALUES, webhook: { ...SHIM_VALUES.webhook, namespaces: ['team-a', 'team-b'] } });
    const mwc = objs.find((o) => o.kind === 'MutatingWebhookConfiguration')!;
    const byName = mwc.webhooks.find((w: Obj) => w.name === 'names.rewrite.probe-agent.io');
    expect(byName.clientConfig.service.path).toBe('/mutate');
    expect(byName.namespaceSelector.matchExpressions).toContainEqual({ key: 'kubernetes.io/metadata.name', operator: 'In', values: ['team-a', 'team-b'] });
    const annotated = mwc.webhooks.find((w: Obj) => w.name === 'pods.rewrite.probe-agent.io');
    expect(annotated.namespaceSelector.matchExpressions).toContainEqual({ key: 'kubernetes.io/metadata.name', operator: 'NotIn', values: ['kube-system', NS, 'team-a', 'team-b'] });
  });

  it('serves the webhook without cert-manager or a client CA when told to', () => {
    const objs = template({ ...SHIM_VALUES, webhook: { ...SHIM_VALUES.webhook, certManager: false, caBundle: 'Q0E=', verifyAPIServer: false } });
    expect(objs.filter((o) => o.apiVersion.startsWith('cert-manager.io/'))).toEqual([]);
    const mwc = objs.find((o) => o.kind === 'MutatingWebhookConfiguration')!;
    expect(mwc.metadata.annotations).toBeUndefined();
    for (const w of mwc.webhooks) expect(w.clientConfig.caBundle).toBe('Q0E=');
    const c = objs.find((o) => o.kind === 'Deployment')!.spec.template.spec.containers[0];
    expect(c.args).toContain('--no-client-ca-file');
    expect(c.args.some((a: string) => a.startsWith('--client-ca-file'))).toBe(false);
    expect(c.volumeMounts.map((m: Obj) => m.name)).toEqual(['tls']);
  });

  it('adds the extra settings and volumes an operator gives, and the installer host directories', () => {
    const objs = template({
      mode: 'shim',
      runtime: '',
      agent: {
        extraEnv: [{ name: 'PROBE_AGENT_CRI_ENDPOINT', value: 'unix:///run/lab/containerd.sock' }],
        extraVolumes: [{ name: 'lab', hostPath: { path: '/run/lab', type: 'Directory' } }],
        extraVolumeMounts: [{ name: 'lab', mountPath: '/run/lab', readOnly: true }],
      },
      shimInstaller: { extraEnv: [{ name: 'SYSTEMCTL', value: 'none' }], hostPaths: { shimDir: '/lab/opt', systemdUnits: '/lab/units', kubeletDir: '/lab/kubelet' } },
    });
    const agentPod = objs.find((o) => o.kind === 'DaemonSet' && o.metadata.name === 'probe-agent')!.spec.template.spec;
    const agent = agentPod.containers[0];
    expect(agent.env.filter((e: Obj) => e.name === 'PROBE_AGENT_CRI_ENDPOINT')).toEqual([{ name: 'PROBE_AGENT_CRI_ENDPOINT', value: 'unix:///run/lab/containerd.sock' }]);
    expect(agent.volumeMounts).toContainEqual({ name: 'lab', mountPath: '/run/lab', readOnly: true });
    expect(agentPod.volumes).toContainEqual({ name: 'lab', hostPath: { path: '/run/lab', type: 'Directory' } });
    const installer = objs.find((o) => o.kind === 'DaemonSet' && o.metadata.name === 'probe-agent-shim-installer')!.spec.template.spec;
    expect(installer.containers[0].env).toContainEqual({ name: 'SYSTEMCTL', value: 'none' });
    const hostPath = (name: string) => installer.volumes.find((v: Obj) => v.name === name).hostPath.path;
    expect([hostPath('shim-dir'), hostPath('units'), hostPath('kubelet')]).toEqual(['/lab/opt', '/lab/units', '/lab/kubelet']);
  });

  it('warns where components/nodes-proxy-fallback warns: install notes and the rendered rule', () => {
    const notes = (values: Obj): string => {
      const file = path.join(mkdtempSync(path.join(scratch, 'notes-')), 'values.json');
      writeFileSync(file, JSON.stringify(values));
      const env = { ...process.env, HELM_CACHE_HOME: path.join(scratch, 'hc'), HELM_CONFIG_HOME: path.join(scratch, 'hcfg'), HELM_DATA_HOME: path.join(scratch, 'hd'), KUBECONFIG: path.join(scratch, 'none') };
      const r = spawnSync(tool('helm'), ['install', 'probe-agent', CHART, '--dry-run=client', '--namespace', NS, '-f', file], { encoding: 'utf8', env, maxBuffer: 64 << 20 });
      expect(r.status, r.stderr).toBe(0);
      return r.stdout.slice(r.stdout.indexOf('NOTES:'));
    };
    const component = readFileSync(path.join(DEPLOY, 'components/nodes-proxy-fallback/kustomization.yaml'), 'utf8').replace(/\n#\s*/g, ' ');
    expect(component).toMatch(/run commands in any pod on any node/);
    expect(notes({ agent: { nodesProxyFallback: true } })).toMatch(/WARNING: agent.nodesProxyFallback[\s\S]*run commands in any pod on any node/);
    expect(notes({})).not.toMatch(/WARNING/);
    expect(templateText({ agent: { nodesProxyFallback: true } }, '1.32.0')).toMatch(/# WARNING \(agent.nodesProxyFallback\)[^\n]*\n[^\n]*run commands in any pod on any node/);
  });

  it('renders gates mode: the agent writes the gate, the webhook rewrites for it; refused before 1.30', () => {
    const objs = template(GATES_VALUES);
    const agent = objs.find((o) => o.kind === 'DaemonSet' && o.metadata.name === 'probe-agent')!.spec.template.spec.containers[0];
    expect(agent.env).toContainEqual({ name: 'PROBE_AGENT_GATES', value: 'true' });
    expect(objs.some((o) => o.kind === 'DaemonSet' && o.metadata.name === 'probe-agent-shim-installer')).toBe(false);
    const mwc = objs.find((o) => o.kind === 'MutatingWebhookConfiguration')!;
    const gates = mwc.webhooks.find((w: Obj) => w.name === 'namespaces.gates.probe-agent.io');
    expect(gates.clientConfig.service.path).toBe('/mutate-gates');
    for (const k of ['ClusterRole/-/probe-agent-gates', 'ValidatingAdmissionPolicy/-/probe-agent-gates-pod-status', 'ValidatingAdmissionPolicy/-/probe-agent-gates-events', 'FlowSchema/-/probe-agent-gates']) expect(objs.map(key), k).toContain(k);
    // The Lease rights and their policy come only with gatesLease.enabled.
    expect(objs.map(key).filter((k) => /lease/i.test(k))).toEqual([]);
    const leased = template({ ...GATES_VALUES, gatesLease: { enabled: true } }).map(key);
    for (const k of [`Role/${NS}/probe-agent-gates-lease`, `RoleBinding/${NS}/probe-agent-gates-lease`, 'ValidatingAdmissionPolicy/-/probe-agent-gates-leases']) expect(leased, k).toContain(k);
    const r = templateRaw(GATES_VALUES, '1.29.0');
    expect(r.ok).toBe(false);
    expect(r.err).toMatch(/mode: gates needs Kubernetes >= 1.30/);
  });

  it.each([
    ['an unknown mode', { mode: 'mesh' }, /mode "mesh" is not available/],
    ['the webhook outside shim mode', { webhook: { enabled: true, apiServerCIDRs: [API_SERVER_CIDR] } }, /webhook.enabled needs mode: shim/],
    ['the webhook without API server CIDRs', { mode: 'shim', webhook: { enabled: true } }, /webhook.apiServerCIDRs is required/],
    ['close-hole without pod CIDRs', { closeHole: { enabled: true } }, /closeHole.podCIDRs is required/],
    ['an unknown close-hole setting', { closeHole: { enabled: true, podCIDRs: POD_CIDRS, env: { CLOSE_HOLE_TYPO: '1' } } }, /CLOSE_HOLE_TYPO is not a close-hole setting/],
    ['the lease controller without the gates webhook', { mode: 'gates', gatesLease: { enabled: true } }, /gatesLease.enabled needs mode: gates and webhook.enabled/],
    ['both monitors', { podMonitor: { enabled: true }, serviceMonitor: { enabled: true } }, /enable one/],
    ['kube-system opted in', { mode: 'shim', webhook: { enabled: true, apiServerCIDRs: [API_SERVER_CIDR], namespaces: ['kube-system'] } }, /may not list kube-system/],
  ])('refuses %s with a clear error', (_name, values, message) => {
    const r = templateRaw(values);
    expect(r.ok).toBe(false);
    expect(r.err).toMatch(message);
  });

  describe.each(EQUIVALENCES)('renders the same objects as kustomize: $name', (eq) => {
    it('object for object', () => {
      const chart = normalizeChart(templateThroughKustomize(eq.values, eq.kubeVersion));
      const { objects: kust, namespace } = normalizeKustomize(eq.kustomize());
      expect(namespace?.metadata.name).toBe(NS);
      expect([...chart.keys()].sort()).toEqual([...kust.keys()].sort());
      // Every differing object named at once, then the first one's difference in detail.
      const differing = [...kust].filter(([k, o]) => !isDeepStrictEqual(chart.get(k), o)).map(([k]) => k);
      for (const k of differing) expect(chart.get(k), `${k} (differing: ${differing.join(', ')})`).toEqual(kust.get(k));
    });
  });
});
