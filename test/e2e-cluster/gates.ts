/**
 * The gates phase of `make e2e-cluster` (E2E_CLUSTER_MODE=gates): probe-agent in gates mode
 * (docs/closing-the-hole.md, "Where kubelet cannot use the shim: gates mode") on the run's two real
 * nodes, both kubelets on their runtime (containerd or CRI-O) directly, no shim. The overlay takes the gates and gates-lease
 * components instead of kubelet-shim. The closed node's pods are unreachable from the node
 * (node->pod dropped) and the gates workloads are pinned there (nodeSelector); their kubelet-driven
 * twins run as written on the open node. Kubelet's own view is the evidence: pod conditions,
 * container statuses (restart counts, lastState, start and finish times), Events, EndpointSlices,
 * the API server's refusals and metrics. The checks:
 * - web (HTTP), gRPC and TCP readiness: Ready through the probe-agent.io/ready gate;
 * - a readiness failure: not Ready, the Service's endpoint not ready; back when the probe passes;
 * - a liveness failure, twice: one restart per failure under kubelet's back-off, compared field by
 *   field with a kubelet-driven twin on the open node (each difference printed);
 * - a startup probe holds liveness back until it passes, in both modes;
 * - the closed node's agent token (bound to its pod) writing a pod on the open node: refused;
 * - readiness latency (container start to Ready) against kubelet's probes, and the agent's API
 *   writes per pod per hour at steady state;
 * - SCALE_PODS pods at once: every one Ready through the gate, the webhook's admission latency;
 * - the agent gone from the closed node: nothing restarts, a new pod stays not Ready, the old pods
 *   go not Ready when its Lease expires; all Ready again when it is back;
 * - the closed node's agent cut off from the API server for 60 s, then the API server itself
 *   stopped (SIGSTOP) for 60 s: every gates pod Ready again soon after, none restarted (the agent
 *   converges on the condition the pod has now; the lease controller restarts every Lease's clock
 *   after its own failed polls).
 */
import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { connectFromNode } from '../lab/net.ts';
import { check, say, sleep, skip, waitFor } from '../e2e-kubelet/lib.ts';
import { fast, HTTP_PORT, server } from '../e2e-kubelet/pods.ts';
import { GATES_CONDITION } from '../../agent/rewrite/gates-rewrite.ts';
import { ORIGINAL_HANDLERS_ANNOTATION } from '../../agent/rewrite/pod-rewrite.ts';
import type { Kubectl } from './kubectl.ts';
import { agentMetric, failedCalls, histogram, minus, p50p99 } from './prom.ts';
import { deployment, GRPC_PORT, grpcDeployment, scaleDeployment } from './workloads.ts';

type Obj = Record<string, any>;

/** Gates pods (namespace labelled probe-agent.io/mode=gates) and their kubelet-driven twins. */
export const GATES_NS = 'e2e-gates';
export const TWINS_NS = 'e2e-twins';
const AGENT = 'app.kubernetes.io/name=probe-agent';
const WEBHOOK = 'app.kubernetes.io/name=probe-agent-webhook';
const GATES_HOOK = 'namespaces.gates.probe-agent.io';
const LATENCY_PODS = 10;
/** Liveness failures in a row: kubelet backs its own liveness restarts off from the third. */
const ROUNDS = 3;
/** Events of the lab, not of the probes: no cluster DNS here. */
const LAB_EVENTS = new Set(['MissingClusterDNS']);
/** How long the steady-state write count is watched. */
const STEADY_SECONDS = 120;

export interface GatesContext {
  k: Kubectl;
  open: string;
  closed: string;
  /** The closed node's pod subnet: node->pod dropped for it. */
  closedSubnet: string;
  nft(rules: string): void;
  nftTable: string;
  image: string;
  scalePods: number;
  /** Where warnings.log goes (E2E_KEEP_LOGS keeps it). */
  scratch: string;
  /** Kills a container of the closed node as a crash would (SIGKILL to its process). */
  killContainer(id: string): Promise<void>;
  /** The API server's port (on the open node's address): the agent's path to it is cut there. */
  apiPort: number;
  /** Freezes or resumes kube-apiserver (control-plane.ts). */
  apiserverSignal(signal: 'SIGSTOP' | 'SIGCONT'): void;
}

const isReady = (p: Obj): boolean => cond(p, 'Ready')?.status === 'True';
const cond = (p: Obj, type: string): Obj | undefined => (p.status?.conditions ?? []).find((c: Obj) => c.type === type);
const gate = (p: Obj): string => { const c = cond(p, GATES_CONDITION); return c ? `${c.status}${c.reason ? ` (${c.reason})` : ''}` : 'absent'; };
const restarts = (p: Obj): number => (p.status?.containerStatuses ?? []).reduce((n: number, s: Obj) => n + (s.restartCount ?? 0), 0);
const ids = (p: Obj): string => JSON.stringify((p.status?.containerStatuses ?? []).map((s: Obj) => s.containerID).sort());
const t = (s: string | undefined): number => (s ? Date.parse(s) : NaN);

/** Pinned to `node` by nodeSelector: a Deployment's template or a Pod. */
function pin(o: Obj, node: string): Obj {
  const spec = o.kind === 'Pod' ? o.spec : o.spec.template.spec;
  spec.nodeSelector = { 'kubernetes.io/hostname': node };
  return o;
}

function pod(name: string, ns: string, containers: Obj[]): Obj {
  return { apiVersion: 'v1', kind: 'Pod', metadata: { name, namespace: ns, labels: { app: name } }, spec: { containers, terminationGracePeriodSeconds: 2, enableServiceLinks: false } };
}

/** busybox httpd serving /www with `files` made first (each an HTTP 200; a removed one a 404). */
function httpd(name: string, files: string[], probes: Obj): Obj {
  const make = files.map((f) => `echo ok > /www/${f}`).join(' && ');
  return { ...server(name, probes), command: ['/bin/busybox', 'sh', '-c', `mkdir -p /www && ${make} && exec /bin/busybox httpd -f -vv -p ${HTTP_PORT} -h /www`] };
}

/** Readiness /ready and liveness /live, HTTP, every second; liveness acts at its second failure. */
const livenessPod = (name: string, ns: string): Obj => pod(name, ns, [httpd('server', ['ready', 'live'], {
  readinessProbe: { httpGet: { path: '/ready', port: HTTP_PORT }, ...fast },
  livenessProbe: { httpGet: { path: '/live', port: HTTP_PORT }, ...fast, failureThreshold: 2 },
})]);

/** A startup probe (/started, absent at first) in front of a liveness probe that fails (/live absent). */
const startupPod = (name: string, ns: string): Obj => pod(name, ns, [httpd('server', ['ready'], {
  startupProbe: { httpGet: { path: '/started', port: HTTP_PORT }, ...fast, failureThreshold: 600 },
  livenessProbe: { httpGet: { path: '/live', port: HTTP_PORT }, ...fast },
})]);

/**
 * Probed every second; a 5 s timeout and 3 failures in a row, so that a loaded machine's slow answer
 * is no transition: the steady-state count that follows must see none (the latency is that of a success).
 */
const latencyDeployment = (ns: string): Obj => deployment('lat', LATENCY_PODS, [server('app', { readinessProbe: { httpGet: { path: '/ready', port: HTTP_PORT }, ...fast, timeoutSeconds: 5, failureThreshold: 3 } })], ns);

export async function gatesPhase(c: GatesContext): Promise<void> {
  const { k, open, closed } = c;
  const pods = (ns: string, selector?: string): Obj[] => k.json<{ items: Obj[] }>(['pods', '-n', ns, ...(selector ? ['-l', selector] : [])])?.items ?? [];
  const get = (ns: string, name: string): Obj | undefined => k.json<Obj>(['pod', '-n', ns, name]);
  const exec = (ns: string, name: string, sh: string) => k.run(['-n', ns, 'exec', name, '-c', 'server', '--', '/bin/busybox', 'sh', '-c', sh]);
  const ready = (ns: string, selector: string, n: number, ms: number) => waitFor(`${n} Ready ${ns}/${selector}`, ms, () => {
    const ps = pods(ns, selector).filter((p) => !p.metadata.deletionTimestamp);
    return ps.length >= n && ps.every(isReady) ? ps : undefined;
  }, 1000);
  const summary = (ps: Obj[]): string => ps.map((p) => `${p.metadata.name}: Ready ${cond(p, 'Ready')?.status ?? '?'}, gate ${gate(p)}, restarts ${restarts(p)}`).join('; ');

  // Close the hole on the closed node: node->pod dropped for its pods.
  c.nft(`table inet ${c.nftTable} {\n  chain out {\n    ip daddr ${c.closedSubnet} ct state new counter drop\n  }\n}\n`);
  k.apply([
    { apiVersion: 'v1', kind: 'Namespace', metadata: { name: GATES_NS, labels: { 'probe-agent.io/mode': 'gates' } } },
    { apiVersion: 'v1', kind: 'Namespace', metadata: { name: TWINS_NS } },
  ]);
  await waitFor('the namespaces\' default service accounts', 30_000, () => (k.run(['-n', GATES_NS, 'get', 'sa', 'default']).ok && k.run(['-n', TWINS_NS, 'get', 'sa', 'default']).ok) || undefined, 500);

  // 1. Web (HTTP readiness, TCP liveness), gRPC and TCP readiness, through the gate.
  const web = deployment('web', 2, [server('server', {
    readinessProbe: { httpGet: { path: '/ready', port: 'http' }, ...fast },
    livenessProbe: { tcpSocket: { port: HTTP_PORT }, ...fast, failureThreshold: 3 },
  })], GATES_NS);
  const grpc = grpcDeployment(c.image) as Obj;
  grpc.metadata.namespace = GATES_NS;
  const tcp = deployment('tcp', 1, [server('server', { readinessProbe: { tcpSocket: { port: HTTP_PORT }, ...fast } })], GATES_NS);
  const svc = { apiVersion: 'v1', kind: 'Service', metadata: { name: 'web', namespace: GATES_NS }, spec: { selector: { app: 'web' }, ports: [{ port: HTTP_PORT, targetPort: HTTP_PORT }] } };
  const made = k.apply([pin(web, closed), pin(grpc, closed), pin(tcp, closed), svc]);
  check('gates: workloads created (web, grpc, tcp on the closed node; Service web)', made.ok, made.ok ? 'web (2), grpc (1), tcp (1)' : made.stderr.slice(0, 300));
  for (const [app, n, kind] of [['web', 2, 'HTTP'], ['grpc', 1, 'gRPC'], ['tcp', 1, 'TCP']] as const) {
    const ps = (await ready(GATES_NS, `app=${app}`, n, 180_000)) ?? pods(GATES_NS, `app=${app}`);
    const shaped = ps.map((p) => {
      const spec = JSON.stringify(p.spec.containers.map((x: Obj) => [x.readinessProbe, x.livenessProbe, x.startupProbe]));
      const record = String(p.metadata.annotations?.[ORIGINAL_HANDLERS_ANNOTATION] ?? '');
      return (p.spec.readinessGates ?? []).some((g: Obj) => g.conditionType === GATES_CONDITION) && !/httpGet|tcpSocket|grpc/.test(spec) && record.includes('"gates"');
    });
    const unreachable = await nodeCannotReach(ps, app === 'grpc' ? GRPC_PORT : HTTP_PORT);
    check(`gates: ${app} (${kind} readiness) Ready through the ${GATES_CONDITION} gate, on the closed node, node->pod dropped`,
      ps.length === n && ps.every(isReady) && ps.every((p) => cond(p, GATES_CONDITION)?.status === 'True' && p.spec.nodeName === closed && restarts(p) === 0) && shaped.every(Boolean) && unreachable,
      `${summary(ps)}; spec: readiness gate and no network probe ${shaped.every(Boolean) ? 'in each' : 'MISSING'}, original handlers recorded (mode gates); from the node: ${unreachable ? 'unreachable' : 'REACHABLE'}`);
  }

  // 2. A readiness failure: not Ready, out of the Service's EndpointSlice; back when it passes again.
  const webPods = pods(GATES_NS, 'app=web');
  const victim = webPods[0];
  if (victim) {
    const ip = victim.status?.podIP as string;
    const endpoint = (): Obj | undefined => (k.json<{ items: Obj[] }>(['endpointslices', '-n', GATES_NS, '-l', 'kubernetes.io/service-name=web'])?.items ?? [])
      .flatMap((s) => s.endpoints ?? []).find((e: Obj) => (e.addresses ?? []).includes(ip));
    const before = endpoint();
    exec(GATES_NS, victim.metadata.name, 'rm /www/ready');
    const down = await waitFor('the web pod not Ready', 60_000, () => { const p = get(GATES_NS, victim.metadata.name); return p && !isReady(p) && endpoint()?.conditions?.ready !== true ? p : undefined; }, 500);
    const epDown = endpoint();
    exec(GATES_NS, victim.metadata.name, 'echo ok > /www/ready');
    const up = await waitFor('the web pod Ready again', 60_000, () => { const p = get(GATES_NS, victim.metadata.name); return p && isReady(p) && endpoint()?.conditions?.ready === true ? p : undefined; }, 500);
    const ep = (e: Obj | undefined): string => (e ? `ready ${e.conditions?.ready}` : 'absent');
    check('gates: readiness failure: the pod not Ready and its Service endpoint not ready; back when the probe passes, no restart',
      before?.conditions?.ready === true && down !== undefined && up !== undefined && restarts(up) === 0,
      `${victim.metadata.name} (${ip}): EndpointSlice before ${ep(before)}; /ready removed: Ready ${down ? cond(down, 'Ready')?.status : 'still True'}, gate ${down ? gate(down) : '?'} "${(down ? cond(down, GATES_CONDITION)?.message : '') ?? ''}", endpoint ${ep(epDown)}; restored: Ready ${up ? 'True' : 'not back'}, endpoint ${ep(endpoint())}, restarts ${up ? restarts(up) : '?'}`);
  }

  // 2b. A container that dies by itself (killed by the runtime, not for a probe): kubelet restarts it;
  // the new container must not be Ready on the verdict the old one had (kubelet's own readiness of a
  // new container starts False). A sample is "ready on the old verdict" when the pod is Ready with the
  // new container while the gate's last transition predates that container's start.
  const crashed = pods(GATES_NS, 'app=tcp')[0];
  if (crashed) {
    const oldId = String(crashed.status.containerStatuses[0].containerID);
    const killedAt = Date.now();
    await c.killContainer(oldId.replace(/^[\w-]+:\/\//, ''));
    let stale = 0;
    let samples = 0;
    let firstStale = NaN;
    let lastStale = NaN;
    const back = await waitFor('the crashed tcp pod Ready on its new container', 120_000, () => {
      const p = get(GATES_NS, crashed.metadata.name);
      const cs = p?.status?.containerStatuses?.[0];
      if (!p || !cs || cs.containerID === oldId || !cs.state?.running) return undefined;
      samples++;
      const g = cond(p, GATES_CONDITION);
      const onOld = isReady(p) && g?.status === 'True' && t(g.lastTransitionTime) < t(cs.state.running.startedAt);
      if (onOld) {
        stale++;
        if (Number.isNaN(firstStale)) firstStale = Date.now();
        lastStale = Date.now();
      }
      return isReady(p) && !onOld ? p : undefined;
    }, 200);
    const p = back ?? get(GATES_NS, crashed.metadata.name) ?? {};
    check('gates: a container that crashes restarts not Ready: never Ready on the old container\'s verdict',
      back !== undefined && stale === 0 && restarts(p) === 1,
      `${crashed.metadata.name}: SIGKILL by the runtime; restarts ${restarts(p)}; Ready again ${back ? `${((Date.now() - killedAt) / 1000).toFixed(1)} s after the kill` : 'no'}; samples (every 200 ms) with the new container Ready on the old verdict: ${stale}/${samples}${stale ? ` over ${((lastStale - firstStale) / 1000).toFixed(1)} s` : ''}`);
  }

  // 3. Liveness: the same pod in both modes, /live removed twice; kubelet restarts each time.
  const lg = { ns: GATES_NS, name: 'live-gates', node: closed };
  const lk = { ns: TWINS_NS, name: 'live-kubelet', node: open };
  k.apply([pin(livenessPod(lg.name, lg.ns), closed), pin(livenessPod(lk.name, lk.ns), open)]);
  const both = [lg, lk];
  const bothReady = async (): Promise<Obj[] | undefined> => waitFor('the liveness pods Ready', 120_000, () => {
    const ps = both.map((x) => get(x.ns, x.name));
    return ps.every((p) => p && isReady(p)) ? (ps as Obj[]) : undefined;
  }, 500);
  await bothReady();
  // Each pod on its own: /live removed, and removed again as soon as the restarted container has it,
  // so that the second failure falls inside kubelet's back-off (10 s from the first restart).
  const twice = async (x: { ns: string; name: string }): Promise<Obj[]> => {
    const seen: Obj[] = [];
    for (let round = 1; round <= ROUNDS; round++) {
      await waitFor(`${x.name}: /live removed`, 30_000, () => exec(x.ns, x.name, 'rm /www/live').ok || undefined, 200);
      const p = await waitFor(`${x.name}: restart ${round}`, 180_000, () => {
        const q = get(x.ns, x.name);
        return q && restarts(q) >= round && q.status.containerStatuses[0].state?.running ? q : undefined;
      }, 250);
      seen.push(p ?? get(x.ns, x.name) ?? {});
    }
    return seen;
  };
  const byPod = await Promise.all(both.map(twice));
  const rounds: Obj[][] = Array.from({ length: ROUNDS }, (_, r) => byPod.map((ps) => ps[r]!));
  await bothReady();
  await sleep(20_000);
  const settled = both.map((x) => get(x.ns, x.name) ?? {});
  const view = (p: Obj): Obj => {
    const s = p.status?.containerStatuses?.[0] ?? {};
    const term = s.lastState?.terminated ?? {};
    return { restarts: s.restartCount, reason: term.reason, exitCode: term.exitCode, backoff: Math.round((t(s.state?.running?.startedAt) - t(term.finishedAt)) / 1000), started: t(s.state?.running?.startedAt) };
  };
  const events = (ns: string, name: string): Obj[] => (k.json<{ items: Obj[] }>(['events', '-n', ns, '--field-selector', `involvedObject.name=${name}`])?.items ?? []);
  const evSummary = (evs: Obj[]): Map<string, number> => {
    const m = new Map<string, number>();
    for (const e of evs) {
      if (LAB_EVENTS.has(e.reason)) continue;
      const key = `${e.reason}/${e.source?.component || e.reportingComponent || '?'}`;
      m.set(key, (m.get(key) ?? 0) + (e.count ?? e.series?.count ?? 1));
    }
    return new Map([...m].sort());
  };
  const evG = events(lg.ns, lg.name);
  const evK = events(lk.ns, lk.name);
  const sumG = evSummary(evG);
  const sumK = evSummary(evK);
  const per = both.map((_, i) => rounds.map((r) => view(r[i]!)));
  const diffs: string[] = [];
  for (let ri = 0; ri < ROUNDS; ri++) {
    const label = `restart ${ri + 1}`;
    for (const f of ['restarts', 'reason', 'exitCode'] as const) if (per[0]![ri]![f] !== per[1]![ri]![f]) diffs.push(`${label} ${f}: gates ${per[0]![ri]![f]}, kubelet ${per[1]![ri]![f]}`);
    if (ri > 0) {
      const [g, kk] = per.map((r) => Math.round((r[ri]!.started - r[ri - 1]!.started) / 1000));
      if (Math.abs(g! - kk!) >= 5) diffs.push(`${label} ${g} s after the one before with gates, ${kk} s with kubelet`);
    }
  }
  for (const key of new Set([...sumG.keys(), ...sumK.keys()].map((x) => x.split('/')[0]!))) {
    const g = [...sumG].filter(([x]) => x.startsWith(`${key}/`)).map(([x, n]) => `${n}x ${x.split('/')[1]}`).join('+') || 'none';
    const kk = [...sumK].filter(([x]) => x.startsWith(`${key}/`)).map(([x, n]) => `${n}x ${x.split('/')[1]}`).join('+') || 'none';
    if (g !== kk) diffs.push(`event ${key}: gates ${g}, kubelet ${kk}`);
  }
  const msg = (evs: Obj[], reason: string): string => JSON.stringify(evs.find((e) => e.reason === reason)?.message ?? '').slice(0, 120);
  const killingG = evG.filter((e) => e.reason === 'Killing' && /liveness/.test(e.message)).reduce((n, e) => n + (e.count ?? 1), 0);
  // Kubelet's restart back-off (10 s, doubled each time) holds a container that exited within it.
  // The agent's stop is such an exit, so each restart after the first waits; kubelet's own liveness
  // kill restarts in the same sync, and its back-off holds only from the third restart on.
  const gaps = per.map((r) => r.slice(1).map((v, i) => Math.round((v.started - r[i]!.started) / 1000)));
  const backoffOk = per[0]!.slice(1).every((v, i) => v.backoff >= 10 * 2 ** i - 1) && gaps[1]![ROUNDS - 2]! >= 9;
  const line = (r: Obj[], g: number[], what: string): string => r.map((v, i) => `restart ${v.restarts} ${v.backoff} s after the ${what}${i ? ` (${g[i - 1]} s after restart ${i})` : ''}, lastState ${v.reason}/${v.exitCode}`).join(', ');
  check(`gates: liveness failure ${ROUNDS} times: one restart per failure, under kubelet's back-off, against a kubelet-driven twin`,
    per.every((r) => r.every((v, i) => v.restarts === i + 1)) && settled.every((p) => restarts(p) === ROUNDS) && killingG === ROUNDS && backoffOk,
    `gates (closed node): ${line(per[0]!, gaps[0]!, 'stop')}; kubelet twin (open node): ${line(per[1]!, gaps[1]!, 'kill')}; 20 s later restarts ${settled.map(restarts).join('/')}; events gates ${[...sumG].map(([x, n]) => `${x} ${n}`).join(', ')}; kubelet ${[...sumK].map(([x, n]) => `${x} ${n}`).join(', ')}; Unhealthy message gates ${msg(evG, 'Unhealthy')}, kubelet ${msg(evK, 'Unhealthy')}; Killing gates ${msg(evG, 'Killing')}, kubelet ${msg(evK, 'Killing')}; differences: ${diffs.join('; ') || 'none'}`);
  k.run(['-n', lg.ns, 'delete', 'pod', lg.name, '--wait=false']);
  k.run(['-n', lk.ns, 'delete', 'pod', lk.name, '--wait=false']);

  // 4. A startup probe holds liveness back until it passes, in both modes.
  const sg = { ns: GATES_NS, name: 'startup-gates' };
  const sk = { ns: TWINS_NS, name: 'startup-kubelet' };
  k.apply([pin(startupPod(sg.name, sg.ns), closed), pin(startupPod(sk.name, sk.ns), open)]);
  const sboth = [sg, sk];
  await waitFor('the startup pods running', 120_000, () => sboth.every((x) => get(x.ns, x.name)?.status?.containerStatuses?.[0]?.state?.running) || undefined, 500);
  await sleep(15_000);
  const held = sboth.map((x) => get(x.ns, x.name) ?? {});
  for (const x of sboth) exec(x.ns, x.name, 'echo ok > /www/started');
  const killed = await waitFor('liveness acting after startup', 120_000, () => {
    const ps = sboth.map((x) => get(x.ns, x.name) ?? {});
    return ps.every((p) => restarts(p) >= 1) ? ps : undefined;
  }, 500);
  const sEvents = sboth.map((x) => (k.json<{ items: Obj[] }>(['events', '-n', x.ns, '--field-selector', `involvedObject.name=${x.name}`])?.items ?? []).filter((e) => e.reason === 'Unhealthy').map((e) => `${e.count ?? 1}x "${String(e.message).slice(0, 60)}"`).join(', '));
  check('gates: a startup probe gates liveness (failing /live left alone until /started passes, then one restart), as kubelet',
    held.every((p) => restarts(p) === 0 && !isReady(p)) && cond(held[0]!, GATES_CONDITION)?.reason !== 'ProbesSucceeded' && killed !== undefined && killed.every((p) => restarts(p) === 1),
    `15 s unstarted: ${held.map((p) => `${p.metadata?.name} restarts ${restarts(p)}, Ready ${cond(p, 'Ready')?.status}${p.metadata?.namespace === GATES_NS ? `, gate ${gate(p)}` : ''}`).join('; ')}; after /started: restarts ${killed ? killed.map(restarts).join('/') : 'none in 120 s'}; Unhealthy events: gates ${sEvents[0] || 'none'}; kubelet ${sEvents[1] || 'none'}`);
  for (const x of sboth) k.run(['-n', x.ns, 'delete', 'pod', x.name, '--wait=false']);

  // 5. The closed node's agent writing a pod on the open node, with its pod-bound token.
  const closedAgent = pods('probe-agent', AGENT).find((p) => p.spec.nodeName === closed);
  const twin = pin(pod('twin-open', TWINS_NS, [server('app', { readinessProbe: { httpGet: { path: '/ready', port: HTTP_PORT }, ...fast } })]), open);
  k.apply([twin]);
  await waitFor('twin-open Ready', 120_000, () => { const p = get(TWINS_NS, 'twin-open'); return p && isReady(p) ? p : undefined; }, 1000);
  const ownPod = pods(GATES_NS, 'app=tcp')[0];
  if (closedAgent && ownPod) {
    const token = k.must(['-n', 'probe-agent', 'create', 'token', 'probe-agent', '--bound-object-kind', 'Pod', '--bound-object-name', closedAgent.metadata.name]).trim();
    const as = k.withToken(token, `${k.kubeconfig}.gates-agent`);
    // As the agent writes it: a patch, no read first (the agent has no get on pods/status).
    const write = (ns: string, name: string, status: string) => as.patchRaw(`/api/v1/namespaces/${ns}/pods/${name}/status`, { status: { conditions: [{ type: GATES_CONDITION, status }] } });
    const other = await write(TWINS_NS, 'twin-open', 'True');
    const own = await write(GATES_NS, ownPod.metadata.name, cond(ownPod, GATES_CONDITION)?.status ?? 'True');
    const otherPod = get(TWINS_NS, 'twin-open');
    check('gates: the closed node\'s agent token writing a pod on the open node: refused by the API server; its own node\'s pod: allowed',
      !other.ok && /own node/.test(other.stderr) && cond(otherPod ?? {}, GATES_CONDITION) === undefined && own.ok,
      `token bound to ${closedAgent.metadata.name} (${closed}); twin-open on ${open}: ${other.ok ? 'WRITTEN' : other.stderr.trim().replace(/\s+/g, ' ').slice(0, 240)}; ${ownPod.metadata.name} on ${closed}: ${own.ok ? 'allowed' : own.stderr.trim().slice(0, 200)}`);
  } else {
    check('gates: the closed node\'s agent token writing a pod on the open node: refused by the API server; its own node\'s pod: allowed', false, `no agent pod on ${closed} or no tcp pod`);
  }
  k.run(['-n', TWINS_NS, 'delete', 'pod', 'twin-open', '--wait=false']);

  // 6. Readiness latency, container start to Ready: the gate against kubelet's own probe.
  k.apply([pin(latencyDeployment(GATES_NS), closed), pin(latencyDeployment(TWINS_NS), open)]);
  const latG = await ready(GATES_NS, 'app=lat', LATENCY_PODS, 300_000);
  const latK = await ready(TWINS_NS, 'app=lat', LATENCY_PODS, 300_000);
  const lat = (ps: Obj[] | undefined): number[] => (ps ?? []).map((p) => (t(cond(p, 'Ready')?.lastTransitionTime) - t(p.status.containerStatuses[0]?.state?.running?.startedAt)) / 1000).sort((a, b) => a - b);
  const [lg1, lk1] = [lat(latG), lat(latK)];
  // Where the gates pods' time goes: the agent's condition (start to the gate True), then kubelet's Ready (the gate to Ready).
  const toGate = (ps: Obj[] | undefined): number[] => (ps ?? []).map((p) => (t(cond(p, GATES_CONDITION)?.lastTransitionTime) - t(p.status.containerStatuses[0]?.state?.running?.startedAt)) / 1000).sort((a, b) => a - b);
  const gateToReady = (ps: Obj[] | undefined): number[] => (ps ?? []).map((p) => (t(cond(p, 'Ready')?.lastTransitionTime) - t(cond(p, GATES_CONDITION)?.lastTransitionTime)) / 1000).sort((a, b) => a - b);
  const med = (xs: number[]): string => (xs.length ? `p50 ${xs[Math.floor(xs.length / 2)]!.toFixed(0)} s, max ${xs[xs.length - 1]!.toFixed(0)} s` : 'none');
  check(`gates: readiness latency, container start to Ready (${LATENCY_PODS} pods each, period 1 s; API timestamps, 1 s resolution)`,
    lg1.length === LATENCY_PODS && lk1.length === LATENCY_PODS,
    `gates (agent, ${GATES_CONDITION}): ${med(lg1)} (start to the gate True ${med(toGate(latG))}, the gate to Ready ${med(gateToReady(latG))}); kubelet's own probe: ${med(lk1)}; per pod gates [${lg1.join(',')}], kubelet [${lk1.join(',')}]`);

  // 7. Steady state: the agent's API writes while nothing changes.
  await sleep(10_000);
  const agentPod = pods('probe-agent', AGENT).find((p) => p.spec.nodeName === closed)?.metadata.name as string;
  const condWrites = (): number | undefined => agentMetric(k, agentPod, 'probe_agent_gates_operations_total', (l) => /op="(condition|event)"/.test(l));
  const flow = (): number => k.raw('/metrics').split('\n').filter((l) => l.startsWith('apiserver_flowcontrol_dispatched_requests_total{') && l.includes('flow_schema="probe-agent-gates"'))
    .reduce((n, l) => n + Number(l.slice(l.lastIndexOf(' ') + 1)), 0);
  const gatesPods = pods(GATES_NS).filter((p) => p.spec.nodeName === closed && !p.metadata.deletionTimestamp).length;
  const [w0, f0] = [condWrites(), flow()];
  await sleep(STEADY_SECONDS * 1000);
  const [w1, f1] = [condWrites(), flow()];
  const perPodHour = w0 !== undefined && w1 !== undefined && gatesPods > 0 ? ((w1 - w0) / gatesPods) * (3600 / STEADY_SECONDS) : undefined;
  check(`gates: API writes per pod per hour at steady state (${gatesPods} Ready gates pods, ${STEADY_SECONDS} s)`, perPodHour === 0,
    `condition and event writes by the closed node's agent: ${w0 === undefined || w1 === undefined ? 'unreadable' : `${w1 - w0}`} -> ${perPodHour ?? '?'} per pod per hour; the agents' FlowSchema probe-agent-gates, API server: ${f1 - f0} requests in ${STEADY_SECONDS} s (the two nodes' Lease renewals)`);
  k.run(['-n', GATES_NS, 'delete', 'deployment', 'lat']);
  k.run(['-n', TWINS_NS, 'delete', 'deployment', 'lat']);

  // 8. The burst, through the gates webhook.
  const logs = new Map<string, string>();
  const takeLogs = (): void => { for (const l of gatesLogLines(k)) logs.set(l.line, l.who); };
  const burstWindow = { from: Date.now(), to: 0 };
  await burst(c, pods);
  burstWindow.to = Date.now() + 60_000;

  // 9. The agent gone from the closed node.
  takeLogs();
  await agentGone(c, pods, get);
  takeLogs();

  // 10. Outages: the agent's API path cut, then the API server stopped; 60 s each.
  const outageWindows: Array<{ from: number; to: number }> = [];
  await outages(c, pods, outageWindows);
  takeLogs();

  // What the run causes on purpose: SCALE_PODS pods starting at once on this 2-core machine starve
  // the agent (its probes time out or wait for the netns helper, its loop stalls) and the API server
  // (the webhook's Lease reads time out, its slow admission clients are cut).
  const at = (line: string): number => Date.parse(/"(?:ts|time)":"([^"]+)"/.exec(line)?.[1] ?? '');
  const burstRe = /probe errored; result kept.*"reason":"(timeout|helper-error|netns-unresolved)"|netns resolver unavailable; probing in the last known netns|probe errored; result kept.*"prober did not return within|netns helper stderr.*agent is not reading|slow admission clients cut|probe timeouts not counted: the agent's event loop was stalled|runtime container list not read|node leases not read/;
  const lines = [...logs].map(([line, who]) => ({ line, who }));
  // The outages: every API call of the agent and of the webhook fails meanwhile, and just after.
  const outageRe = /node lease not renewed|pod condition not written|event not recorded|node leases not read|leader lease not (read|written)|pods of an expired node not read|pod condition not written for an expired node lease/;
  const inOutage = (l: { line: string }): boolean => outageRe.test(l.line) && outageWindows.some((w) => at(l.line) >= w.from && at(l.line) <= w.to);
  const unexpected = lines.filter((l) => !(burstRe.test(l.line) && at(l.line) >= burstWindow.from && at(l.line) <= burstWindow.to) && !inOutage(l));
  writeFileSync(path.join(c.scratch, 'warnings.log'), lines.map((l) => `${l.who}: ${l.line}`).join('\n'));
  const byMsg = new Map<string, number>();
  const firstErr = new Map<string, string>();
  for (const l of unexpected) {
    const key = `${l.who.replace(/-[a-z0-9]{5,10}(-[a-z0-9]{5})?$/, '')}: ${/"msg":"([^"]*)"/.exec(l.line)?.[1] ?? l.line.slice(0, 80)}`;
    byMsg.set(key, (byMsg.get(key) ?? 0) + 1);
    if (!firstErr.has(key)) firstErr.set(key, /"err":"([^"]{0,160})/.exec(l.line)?.[1] ?? '');
  }
  check('gates: no unexpected warn/error in the agents\' and the webhook\'s logs', unexpected.length === 0,
    `${lines.length - unexpected.length} expected (the ${c.scalePods}-pod burst); unexpected: ${[...byMsg].map(([m, n]) => `${n}x ${m}${firstErr.get(m) ? ` (first: ${firstErr.get(m)})` : ''}`).join('; ').slice(0, 800) || 'none'} (all lines: warnings.log)`);
}

async function burst(c: GatesContext, pods: (ns: string, selector?: string) => Obj[]): Promise<void> {
  const { k, closed } = c;
  if (!(c.scalePods > 0)) {
    skip('gates: scale', `E2E_SCALE_PODS=${c.scalePods}`);
    return;
  }
  say(`gates: ${c.scalePods} pods`);
  const latency = (text: string) => histogram(text, 'apiserver_admission_webhook_admission_duration_seconds', (l) => l.includes(`name="${GATES_HOOK}"`) && l.includes('operation="CREATE"'));
  const before = k.raw('/metrics');
  const t0 = Date.now();
  const d = scaleDeployment(c.scalePods);
  (d as Obj).metadata.namespace = GATES_NS;
  k.apply([pin(d as Obj, closed)]);
  const done = await waitFor(`${c.scalePods} gates pods Ready`, 900_000, () => {
    const ps = pods(GATES_NS, 'app=scale');
    return ps.length >= c.scalePods && ps.every(isReady) ? ps : undefined;
  }, 2000);
  const secs = ((Date.now() - t0) / 1000).toFixed(0);
  const after = k.raw('/metrics');
  const all = done ?? pods(GATES_NS, 'app=scale');
  const viaGate = all.filter((p) => isReady(p) && cond(p, GATES_CONDITION)?.status === 'True' && (p.spec.readinessGates ?? []).length > 0 && p.spec.nodeName === closed).length;
  const stuck = all.filter((p) => !isReady(p)).map((p) => `${p.metadata.name} ${p.status?.phase} gate ${gate(p)}`);
  const fb = failedCalls(before, GATES_HOOK);
  const failed = [...failedCalls(after, GATES_HOOK)].map(([key, n]) => [key, n - (fb.get(key) ?? 0)] as const).filter(([, n]) => n > 0);
  check(`gates: ${c.scalePods} pods at once: every one Ready through the gate on the closed node, none stuck`,
    done !== undefined && viaGate === c.scalePods,
    `${viaGate}/${all.length} Ready through the gate in ${secs} s; stuck: ${stuck.slice(0, 5).join(', ') || 'none'}; admission latency measured by the API server (${GATES_HOOK}): ${p50p99(minus(latency(after), latency(before)))}; failed calls: ${failed.map(([key, n]) => `${key}: ${n}`).join('; ') || 'none'}`);
  k.run(['-n', GATES_NS, 'delete', 'deployment', 'scale'], undefined, 120_000);
  await waitFor('the scale pods gone', 300_000, () => pods(GATES_NS, 'app=scale').length === 0 || undefined, 2000);
}

async function agentGone(c: GatesContext, pods: (ns: string, selector?: string) => Obj[], get: (ns: string, name: string) => Obj | undefined): Promise<void> {
  const { k, closed } = c;
  const old = (): Obj[] => pods(GATES_NS).filter((p) => p.spec.nodeName === closed && !p.metadata.deletionTimestamp && /^(web|grpc|tcp)-/.test(p.metadata.name));
  const before = old();
  // The agent's DaemonSet no longer runs on the closed node: its pod goes, as a removed or crashed-out agent.
  const away = { spec: { template: { spec: { affinity: { nodeAffinity: { requiredDuringSchedulingIgnoredDuringExecution: { nodeSelectorTerms: [{ matchExpressions: [{ key: 'kubernetes.io/hostname', operator: 'NotIn', values: [closed] }] }] } } } } } } };
  k.must(['-n', 'probe-agent', 'patch', 'daemonset', 'probe-agent', '--type=strategic', '-p', JSON.stringify(away)]);
  const gone = await waitFor('the closed node\'s agent gone', 180_000, () => pods('probe-agent', AGENT).every((p) => p.spec.nodeName !== closed) || undefined, 1000);
  const goneAt = Date.now();
  k.apply([pin(pod('new-while-down', GATES_NS, [server('app', { readinessProbe: { httpGet: { path: '/ready', port: HTTP_PORT }, ...fast } })]), closed)]);
  const expired = await waitFor('the old gates pods not Ready (Lease expired)', 180_000, () => {
    const ps = old();
    return ps.length === before.length && ps.every((p) => !isReady(p) && cond(p, GATES_CONDITION)?.reason === 'NodeLeaseExpired') ? ps : undefined;
  }, 1000);
  const secs = ((Date.now() - goneAt) / 1000).toFixed(0);
  const fresh = get(GATES_NS, 'new-while-down') ?? {};
  const now = old();
  const changed = before.filter((b) => { const a = now.find((x) => x.metadata.name === b.metadata.name); return !a || ids(a) !== ids(b) || restarts(a) !== restarts(b); });
  const slice = (k.json<{ items: Obj[] }>(['endpointslices', '-n', GATES_NS, '-l', 'kubernetes.io/service-name=web'])?.items ?? []).flatMap((s) => s.endpoints ?? []);
  check('gates: the agent gone: nothing restarts, a new pod stays not Ready, the old pods go not Ready when its Lease expires (gates-lease)',
    gone === true && expired !== undefined && changed.length === 0 && fresh.status?.containerStatuses?.[0]?.state?.running !== undefined && !isReady(fresh) && slice.every((e) => e.conditions?.ready !== true),
    `agent ${gone ? 'gone' : 'still there'}; ${before.length} old pods: ${expired ? `not Ready ${secs} s after the agent went, gate ${gate(expired[0]!)}` : `not all not Ready: ${now.map((p) => `${p.metadata.name} gate ${gate(p)}`).join(', ')}`}; changed (restart or new container): ${changed.map((p) => p.metadata.name).join(', ') || 'none'}; new-while-down: ${fresh.status?.phase}, Ready ${cond(fresh, 'Ready')?.status}, gate ${gate(fresh)}; web EndpointSlice ready endpoints: ${slice.filter((e) => e.conditions?.ready === true).length}/${slice.length}`);
  k.must(['-n', 'probe-agent', 'patch', 'daemonset', 'probe-agent', '--type=json', '-p', JSON.stringify([{ op: 'remove', path: '/spec/template/spec/affinity' }])]);
  const back = await waitFor('the agent back and every gates pod Ready', 300_000, () => {
    const agentBack = pods('probe-agent', AGENT).some((p) => p.spec.nodeName === closed && isReady(p));
    const ps = [...old(), get(GATES_NS, 'new-while-down') ?? {}];
    return agentBack && ps.every(isReady) ? ps : undefined;
  }, 1000);
  const after = old();
  const changed2 = before.filter((b) => { const a = after.find((x) => x.metadata.name === b.metadata.name); return !a || ids(a) !== ids(b) || restarts(a) !== restarts(b); });
  check('gates: the agent back: every gates pod Ready again (new-while-down too), none restarted',
    back !== undefined && changed2.length === 0,
    `${back ? summarize(back) : `not all Ready: ${[...after, get(GATES_NS, 'new-while-down') ?? {}].map((p) => `${p.metadata?.name} gate ${gate(p)}`).join(', ')}`}; changed: ${changed2.map((p) => p.metadata.name).join(', ') || 'none'}`);
  k.run(['-n', GATES_NS, 'delete', 'pod', 'new-while-down', '--wait=false']);
}

/** How long each outage lasts. */
const OUTAGE_MS = 60_000;

/**
 * The agent's API path cut (its pod IP's packets to the API server dropped on the way in), then
 * kube-apiserver frozen, 60 s each. After each, every gates pod of the closed node must be Ready
 * again through the gate, with the same containers: the agent writes True over whatever False it
 * finds (the lease controller's, after the cut expired its Lease), and an outage of the whole API
 * server expires no node at all.
 */
async function outages(c: GatesContext, pods: (ns: string, selector?: string) => Obj[], windows: Array<{ from: number; to: number }>): Promise<void> {
  const { k, closed } = c;
  const old = (): Obj[] => pods(GATES_NS).filter((p) => p.spec.nodeName === closed && !p.metadata.deletionTimestamp && /^(web|grpc|tcp)-/.test(p.metadata.name));
  const settled = await waitFor('every gates pod Ready before the outages', 300_000, () => { const ps = old(); return ps.length > 0 && ps.every(isReady) ? ps : undefined; }, 1000);
  if (!settled) {
    check('gates: outages (agent cut off 60 s, API server stopped 60 s): every gates pod Ready again, none restarted', false, `not all Ready before: ${old().map((p) => `${p.metadata.name} gate ${gate(p)}`).join(', ')}`);
    return;
  }
  const agentIP = pods('probe-agent', AGENT).find((p) => p.spec.nodeName === closed)?.status?.podIP as string | undefined;
  const back = async (what: string, t0: number, before: Obj[], extra: (ps: Obj[]) => string): Promise<void> => {
    const ps = await waitFor(`every gates pod Ready after ${what}`, 300_000, () => { const x = old(); return x.length === before.length && x.every((p) => isReady(p) && cond(p, GATES_CONDITION)?.status === 'True') ? x : undefined; }, 1000);
    const secs = ((Date.now() - t0) / 1000).toFixed(0);
    const now = old();
    const changed = before.filter((b) => { const a = now.find((x) => x.metadata.name === b.metadata.name); return !a || ids(a) !== ids(b) || restarts(a) !== restarts(b); });
    check(`gates: ${what} for ${OUTAGE_MS / 1000} s: every gates pod Ready again through the gate, none restarted`, ps !== undefined && changed.length === 0,
      `${ps ? `${summarize(ps)} ${secs} s after the outage ended` : `not all Ready: ${now.map((p) => `${p.metadata.name} gate ${gate(p)}`).join(', ')}`}; changed: ${changed.map((p) => p.metadata.name).join(', ') || 'none'}; ${extra(now)}`);
  };

  // The agent's path: its packets to the API server dropped (it is not hostNetwork: its own pod IP).
  if (!agentIP) {
    check('gates: the agent cut off from the API server', false, 'no agent pod IP on the closed node');
  } else {
    say(`gates: the closed node's agent (${agentIP}) cut off from the API server for ${OUTAGE_MS / 1000} s`);
    const before = old();
    const from = Date.now();
    c.nft(`table inet ${c.nftTable} {\n  chain cut {\n    type filter hook input priority 0; policy accept;\n    ip saddr ${agentIP} tcp dport ${c.apiPort} counter drop\n  }\n}\n`);
    let expiredSeen = false;
    const end = Date.now() + OUTAGE_MS;
    while (Date.now() < end) {
      await sleep(5000);
      expiredSeen ||= old().some((p) => cond(p, GATES_CONDITION)?.reason === 'NodeLeaseExpired');
    }
    execFileSync('nft', ['flush', 'chain', 'inet', c.nftTable, 'cut']);
    execFileSync('nft', ['delete', 'chain', 'inet', c.nftTable, 'cut']);
    const t0 = Date.now();
    windows.push({ from, to: t0 + 30_000 });
    await back('the agent cut off from the API server', t0, before, () => `the lease controller set the gate False meanwhile (the Lease expired): ${expiredSeen ? 'yes' : 'no'}`);
  }

  // The whole API server stopped: nothing can renew or write; no Lease may expire for it.
  say(`gates: kube-apiserver stopped for ${OUTAGE_MS / 1000} s`);
  const before = old();
  const from = Date.now();
  c.apiserverSignal('SIGSTOP');
  try {
    await sleep(OUTAGE_MS);
  } finally {
    c.apiserverSignal('SIGCONT');
  }
  const t0 = Date.now();
  windows.push({ from, to: t0 + 60_000 });
  let expired = 0;
  const watchExpired = setInterval(() => { expired = Math.max(expired, old().filter((p) => cond(p, GATES_CONDITION)?.reason === 'NodeLeaseExpired').length); }, 2000);
  try {
    await back('kube-apiserver stopped', t0, before, () => `pods whose gate the lease controller set False after it: ${expired}`);
  } finally {
    clearInterval(watchExpired);
  }
}

const summarize = (ps: Obj[]): string => `${ps.filter(isReady).length}/${ps.length} Ready, gate ${[...new Set(ps.map(gate))].join('/')}`;

/** Each pod IP on `port`, from the node: none may connect. */
async function nodeCannotReach(pods: Obj[], port: number): Promise<boolean> {
  for (const p of pods) {
    if (!p.status?.podIP) return false;
    if ((await connectFromNode(p.status.podIP, port, 1000)).result === 'connected') return false;
  }
  return pods.length > 0;
}

/** The webhook's and agents' warn/error lines, for the run's log check. */
function gatesLogLines(k: Kubectl): { who: string; line: string }[] {
  const out: { who: string; line: string }[] = [];
  for (const sel of [AGENT, WEBHOOK]) {
    for (const p of k.json<{ items: Obj[] }>(['pods', '-n', 'probe-agent', '-l', sel])?.items ?? []) {
      for (const line of k.run(['-n', 'probe-agent', 'logs', p.metadata.name, '--all-containers']).stdout.split('\n')) {
        if (/"level":"(warn|error)"/.test(line)) out.push({ who: p.metadata.name, line });
      }
    }
  }
  return out;
}
