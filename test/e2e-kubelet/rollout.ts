/**
 * The rollout phase (issue 31): the agent restarted as a DaemonSet rollout restarts it (SIGTERM,
 * wait for the exit, start the new one), twice, while rewritten postStart hooks that take
 * SLOW_HOOK_SECONDS run and rewritten readiness/liveness probes go on. Each restart has hooks in
 * flight in the old agent (they must finish there while it drains) and a batch of pods placed at
 * the SIGTERM, whose hooks reach the shim while the agent drains or is gone (the shim must send them
 * again to the new agent, and only once). Judged from kubelet's view and the pods': no container
 * killed or restarted (kubelet's restart counts, containerd's containers and attempts, kubelet's
 * log), every hook ran once and finished (the pod's server logs each), no probe failed, every pod
 * Ready.
 */
import type { KubeletCri } from '../support/kubelet-cri.ts';
import type { ExpectedLog } from '../support/log-check.ts';
import {
  check, httpGet, metricValue, NODE_NAME, podLogFiles, podsOf, proberTotals, readFrom, safeRead, say, sizeOf, sleep, total, waitFor, warnLines,
  type Daemon, type DaemonExit, type PodView,
} from './lib.ts';
import { rolloutPod, SLOW_HOOK_SECONDS } from './pods.ts';
import { removePods, rewritePod, writeManifest, type PhaseContext } from './static-pods.ts';

export interface RolloutContext extends PhaseContext {
  agent: Daemon;
  agentMetricsPort: number;
  shimLog: string;
  /** The DaemonSet's terminationGracePeriodSeconds (deploy/base: 30 s), in ms. */
  agentGraceMs: number;
}

/** Pods per batch; two batches per restart (hooks in flight at the SIGTERM, pods placed at it). */
const BATCH = 3;
const RESTARTS = 2;
/**
 * A probe sent while no agent is there (between the old one's exit and the new one's socket) is
 * answered UNAVAILABLE and the shim says so (e3ca996); kubelet discards an errored probe, which the
 * "no probe failed" check sees. Hooks wait instead: their lines stay unexpected.
 */
const PROBE_IN_GAP: ExpectedLog = {
  level: 'warn', msg: 'rewritten handler not run', line: /did not run the (readiness|liveness|startup) probe.*(ENOENT|ECONNREFUSED|shutting down|GOAWAY|broke)/,
  why: 'a probe sent in the rollout\'s gap between the agents',
};

interface HookCount {
  /** GET /cgi-bin/slow seen by httpd (-vv logs each URL). */
  requests: number;
  starts: number;
  dones: number;
}

/** What a pod's server logged of its slow hook, over all its log files (one per container attempt). */
function hookCount(podLogsRoot: string, pod: PodView | undefined): HookCount {
  const text = pod ? podLogFiles(podLogsRoot, pod.uid, 'server').map(safeRead).join('') : '';
  const n = (re: RegExp): number => (text.match(re) ?? []).length;
  return { requests: n(/url:\/cgi-bin\/slow/g), starts: n(/hook-start/g), dones: n(/hook-done/g) };
}

interface CriContainer {
  pod: string;
  name: string;
  attempt: number;
  state: string;
}

async function containersOf(cri: KubeletCri, names: Set<string>): Promise<CriContainer[]> {
  const r = await cri.call<{ containers: { state: string; metadata: { name: string; attempt: number }; labels: Record<string, string> }[] }>(
    'ListContainers', { filter: { labelSelector: { 'io.kubernetes.pod.namespace': 'default' } } });
  if (!r.ok) throw new Error(`ListContainers: ${r.details}`);
  return r.msg.containers.map((c) => ({ pod: (c.labels['io.kubernetes.pod.name'] ?? '').replace(`-${NODE_NAME}`, ''), name: c.metadata.name, attempt: Number(c.metadata.attempt), state: c.state }))
    .filter((c) => names.has(c.pod));
}

export async function runRollout(ctx: RolloutContext): Promise<void> {
  const P = 'rollout: ';
  const roPort = ctx.kubelet.setup.roPort;
  const shimMetrics = async (): Promise<string> => (await httpGet(`http://127.0.0.1:${ctx.shimMetricsPort}/metrics`)).body;
  const agentUp = async (): Promise<true | undefined> => (await httpGet(`http://127.0.0.1:${ctx.agentMetricsPort}/metrics`, 1500)).status === 200 || undefined;

  // One rewrite for all: the rewrite does not depend on the name.
  const template = rewritePod(ctx, rolloutPod('rollout-template'));
  const [srv, app] = template['spec'].containers as any[];
  const rewritten = [srv?.readinessProbe, srv?.livenessProbe, app?.lifecycle?.postStart].every((h) => h?.exec?.command?.[0] === '/.probe-agent/v1');
  const names: string[] = [];
  const place = (batch: string[]): void => {
    for (const name of batch) {
      writeManifest(ctx.manifests, name, JSON.stringify({ ...template, metadata: { ...template['metadata'], name } }));
      names.push(name);
    }
  };
  const batchNames = (b: number): string[] => Array.from({ length: BATCH }, (_, i) => `rollout-b${b}-${i}`);
  const counts = async (which: string[]): Promise<Map<string, HookCount>> => {
    const pods = await podsOf(roPort);
    return new Map(which.map((n) => [n, hookCount(ctx.kubelet.podLogsRoot, pods.find((p) => p.name === n))]));
  };

  if (!(await waitFor('the agent\'s /metrics', 30_000, agentUp, 500))) {
    check(`${P}agent serves /metrics before the rollout`, false, `nothing on 127.0.0.1:${ctx.agentMetricsPort}`);
    return;
  }
  const shimBefore = await shimMetrics();
  const kubeletLog = ctx.kubelet.log;
  const logFrom = { kubelet: sizeOf(kubeletLog), agent: sizeOf(ctx.agent.logFile), shim: sizeOf(ctx.shimLog) };
  const pidsBefore = ctx.agent.pid;

  const steps: { inFlight: number; placedAtSigterm: number; exit: DaemonExit | undefined; upMs: number | undefined; pid: number | undefined }[] = [];
  for (let r = 0; r < RESTARTS; r++) {
    // Pods whose hooks will be in flight in the old agent at its SIGTERM.
    const early = batchNames(2 * r);
    place(early);
    say(`rollout ${r + 1}: ${early.join(', ')} placed; waiting for their postStart hooks to start`);
    await waitFor(`the hooks of ${early.join(', ')} to start`, 120_000, async () => {
      const c = await counts(early);
      return early.every((n) => (c.get(n)?.starts ?? 0) >= 1) || undefined;
    }, 200);
    const c0 = await counts(early);
    const inFlight = early.filter((n) => (c0.get(n)?.starts ?? 0) > (c0.get(n)?.dones ?? 0)).length;
    // Pods placed at the SIGTERM: their hooks reach a draining or absent agent.
    const late = batchNames(2 * r + 1);
    say(`rollout ${r + 1}: ${inFlight} hooks in flight; SIGTERM to agent pid ${ctx.agent.pid}, ${late.join(', ')} placed`);
    place(late);
    const t0 = Date.now();
    const exit = await ctx.agent.restart(ctx.agentGraceMs);
    say(`rollout ${r + 1}: the old agent exited (code ${exit?.code}, signal ${exit?.signal}) after ${exit?.ms} ms; new agent pid ${ctx.agent.pid}`);
    const up = await waitFor('the new agent\'s /metrics', 60_000, agentUp, 200);
    steps.push({ inFlight, placedAtSigterm: late.length, exit, upMs: up ? Date.now() - t0 : undefined, pid: ctx.agent.pid });
    // The next restart comes once this one's hooks are all done.
    await waitFor(`every hook so far to finish (rollout ${r + 1})`, 120_000, async () => {
      const c = await counts(names);
      return names.every((n) => (c.get(n)?.dones ?? 0) >= 1) || undefined;
    }, 500);
  }

  const ready = await waitFor('every rollout pod Ready', 120_000, async () => {
    const pods = await podsOf(roPort);
    return names.every((n) => pods.find((p) => p.name === n)?.ready) || undefined;
  }, 500);
  // The probes go on a while with the last agent before the counts are read.
  await sleep(10_000);

  const pods = await podsOf(roPort);
  const hooks = await counts(names);
  const klog = readFrom(kubeletLog, logFrom.kubelet).split('\n');
  const ours = (l: string): boolean => names.some((n) => l.includes(`${n}-${NODE_NAME}`));

  check(`${P}the agent restarted ${RESTARTS} times as a DaemonSet rollout does (SIGTERM, exit, new one)`,
    rewritten && steps.length === RESTARTS && steps.every((s) => s.exit?.code === 0 && s.upMs !== undefined) && new Set([pidsBefore, ...steps.map((s) => s.pid)]).size === RESTARTS + 1,
    `${steps.map((s, i) => `restart ${i + 1}: ${s.inFlight} of ${BATCH} hooks in flight at SIGTERM and ${s.placedAtSigterm} pods placed then; old agent exited code ${s.exit?.code ?? '?'}`
      + `${s.exit?.signal ? ` signal ${s.exit.signal}` : ''} after ${s.exit?.ms ?? '?'} ms; new agent serving ${s.upMs ?? 'never'} ms after the SIGTERM`).join('; ')}`
    + `${rewritten ? '' : '; the pod was not rewritten to exec'}`);
  check(`${P}hooks were in flight at each SIGTERM`, steps.length === RESTARTS && steps.every((s) => s.inFlight >= 1),
    `hooks started and not done when the SIGTERM went: ${steps.map((s) => s.inFlight).join(', ')} (postStart takes ${SLOW_HOOK_SECONDS} s)`);

  const notOnce = names.filter((n) => { const h = hooks.get(n)!; return h.starts !== 1 || h.dones !== 1 || h.requests !== 1; });
  const hookFailed = klog.filter((l) => /Failed to execute PostStartHook|FailedPostStartHook/.test(l) && ours(l));
  check(`${P}every postStart ran once and finished (the pod's server counted it)`, notOnce.length === 0 && hookFailed.length === 0,
    `${names.length} pods: GET /cgi-bin/slow ${sum(hooks, 'requests')}, started ${sum(hooks, 'starts')}, done ${sum(hooks, 'dones')}`
    + `${notOnce.length ? ` (not exactly once: ${notOnce.map((n) => `${n} ${JSON.stringify(hooks.get(n))}`).join(', ')})` : ''}; `
    + `kubelet "Failed to execute PostStartHook" lines ${hookFailed.length}${hookFailed[0] ? `: ${hookFailed[0].slice(0, 240)}` : ''}`);

  const cs = await containersOf(ctx.cri, new Set(names)).catch(() => [] as CriContainer[]);
  const restartCounts = names.flatMap((n) => pods.find((p) => p.name === n)?.containers.map((c) => c.restartCount) ?? []);
  const notRunning = cs.filter((c) => c.state !== 'CONTAINER_RUNNING' || c.attempt !== 0);
  const killed = klog.filter((l) => /Killing container|Container .* failed (liveness|startup) probe|will be restarted/.test(l) && ours(l));
  check(`${P}no container killed or restarted`,
    restartCounts.length === 2 * names.length && restartCounts.every((x) => x === 0) && cs.length === 2 * names.length && notRunning.length === 0 && killed.length === 0,
    `kubelet restartCount sum ${restartCounts.reduce((a, b) => a + b, 0)} over ${restartCounts.length} containers; containerd: ${cs.length} containers of ${names.length} pods, `
    + `${cs.filter((c) => c.state === 'CONTAINER_RUNNING').length} running, attempts > 0: ${cs.filter((c) => c.attempt > 0).length}`
    + `${notRunning.length ? ` (${notRunning.slice(0, 4).map((c) => `${c.pod}/${c.name} ${c.state} attempt ${c.attempt}`).join(', ')})` : ''}; `
    + `kubelet "Killing container" lines ${killed.length}${killed[0] ? `: ${killed[0].slice(0, 200)}` : ''}`);

  const totals = await proberTotals(roPort).catch(() => new Map<string, number>());
  const failed = klog.filter((l) => l.includes('"Probe failed"') && ours(l));
  const errored = klog.filter((l) => l.includes('"Probe errored"') && ours(l));
  const series = (type: string, result: string): number => names.reduce((n, p) => n + total(totals, `${p}/server ${type} ${result}`), 0);
  const notReady = names.filter((n) => !pods.find((p) => p.name === n)?.ready);
  check(`${P}no probe failed, every pod Ready`,
    failed.length === 0 && series('Readiness', 'failed') + series('Liveness', 'failed') === 0 && series('Readiness', 'successful') > 0 && series('Liveness', 'successful') > 0
    && !!ready && notReady.length === 0,
    `kubelet prober_probe_total readiness ${series('Readiness', 'successful')}/${series('Readiness', 'failed')}, liveness ${series('Liveness', 'successful')}/${series('Liveness', 'failed')} `
    + `(successful/failed); "Probe failed" lines ${failed.length}${failed[0] ? ` (${failed[0].match(/output="(?:[^"\\]|\\.){0,160}/)?.[0] ?? ''})` : ''}; `
    + `"Probe errored" lines ${errored.length}; Ready ${names.length - notReady.length} of ${names.length}`);

  const shimAfter = await shimMetrics().catch(() => '');
  const d = (m: string): number => metricValue(shimAfter, m) - metricValue(shimBefore, m);
  const hookOk = d('probe_agent_shim_intercepted_total{kind="postStart",answer="success"}');
  const hookBad = d('probe_agent_shim_intercepted_total{kind="postStart",answer="failure"}') + d('probe_agent_shim_intercepted_total{kind="postStart",answer="error"}');
  const agentLogWarn = warnLines(readFrom(ctx.agent.logFile, logFrom.agent));
  const shimText = readFrom(ctx.shimLog, logFrom.shim);
  const shimLogWarn = warnLines(shimText, [PROBE_IN_GAP]);
  const inGap = warnLines(shimText).count - shimLogWarn.count;
  check(`${P}the shim answered every hook, waiting for the new agent where it had to`,
    hookOk === names.length && hookBad === 0 && d('probe_agent_shim_hook_waits_total{outcome="gave_up"}') === 0,
    `postStart answered success ${hookOk}, failure/error ${hookBad}; hooks that waited for an agent: ran ${d('probe_agent_shim_hook_waits_total{outcome="ran"}')}, `
    + `gave up ${d('probe_agent_shim_hook_waits_total{outcome="gave_up"}')}; probes answered UNAVAILABLE in the gap between the agents (warn lines) ${inGap}; agent errors ${d('probe_agent_shim_agent_errors_total')}`);
  check(`${P}the agent and the shim logged no warn/error line`, agentLogWarn.count === 0 && shimLogWarn.count === 0,
    `agent ${agentLogWarn.count}${agentLogWarn.top ? ` (${agentLogWarn.top})` : ''}; shim ${shimLogWarn.count}${shimLogWarn.top ? ` (${shimLogWarn.top})` : ''}`);

  console.log('\nrollout pods: restart counts and hooks (GET/started/done):');
  for (const n of names) {
    const p = pods.find((x) => x.name === n);
    const h = hooks.get(n)!;
    console.log(`  ${n}: ${p?.containers.map((c) => `${c.name}=${c.restartCount}`).join(' ') ?? 'not listed'} ready=${p?.ready} hook ${h.requests}/${h.starts}/${h.dones}`);
  }
  const gone = await removePods(ctx, names);
  if (!gone) say(`rollout: ${names.join(', ')} still listed or running 90 s after their removal`);
}

function sum(m: Map<string, HookCount>, k: keyof HookCount): number {
  return [...m.values()].reduce((n, h) => n + h[k], 0);
}
