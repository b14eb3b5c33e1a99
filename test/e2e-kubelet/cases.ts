/**
 * Issue 25's cases that a standalone kubelet can run: a sidecar (restartable init container) with
 * rewritten probes, a lifecycle sleep preStop next to a rewritten postStart, and rewritten probes
 * with the ExecProbeTimeout gate off (they must fail by exit code, never by DeadlineExceeded, which
 * kubelet then ignores).
 */
import type { KubeletCri } from '../support/kubelet-cri.ts';
import {
  check, criMs, httpGet, klogTime, metricValue, NODE_NAME, podLogFiles, podsOf, probeLines, proberTotals, safeRead, say, skip, sleep, total, waitFor,
} from './lib.ts';
import { CASE_PODS, casePods, PRESTOP_SLEEP_SECONDS } from './pods.ts';
import { placePod, removeManifest, removePods, type PhaseContext } from './static-pods.ts';

interface CriContainer {
  id: string;
  name: string;
  attempt: number;
  state: string;
  startedAt?: number;
  finishedAt?: number;
  exitCode: number;
}

/** A pod's containers as containerd has them (init containers included), with their times. */
async function containersOf(cri: KubeletCri, pod: string): Promise<CriContainer[]> {
  const r = await cri.call<{ containers: { id: string; metadata: { name: string; attempt: number } }[] }>('ListContainers',
    { filter: { labelSelector: { 'io.kubernetes.pod.name': `${pod}-${NODE_NAME}` } } });
  if (!r.ok) return [];
  const out: CriContainer[] = [];
  for (const c of r.msg.containers) {
    const st = await cri.call<{ status: { state: string; startedAt: string; finishedAt: string; exitCode: number } }>('ContainerStatus', { containerId: c.id });
    if (!st.ok) continue;
    const s = st.msg.status;
    out.push({ id: c.id, name: c.metadata.name, attempt: Number(c.metadata.attempt), state: s.state, startedAt: criMs(s.startedAt), finishedAt: criMs(s.finishedAt), exitCode: s.exitCode });
  }
  return out;
}

const MARKER = '/.probe-agent/v1';

const at = (ms: number | undefined): string => (ms === undefined ? '?' : new Date(ms).toISOString().slice(17, 23));

export async function runSidecar(ctx: PhaseContext): Promise<void> {
  const name = CASE_PODS.sidecar;
  const P = `${name}: `;
  if (!ctx.kubelet.atLeast(29)) {
    const why = `kubelet ${ctx.kubelet.info.version} < 1.29: restartable init containers (SidecarContainers) are on by default only from 1.29`;
    skip(`${P}rewritten startup/readiness/liveness answered through the shim`, why);
    skip(`${P}kubelet's order (sidecar started, then the next init, then the app)`, why);
    return;
  }
  const metrics = async (): Promise<string> => (await httpGet(`http://127.0.0.1:${ctx.shimMetricsPort}/metrics`)).body;
  const startupBefore = metricValue(await metrics(), 'probe_agent_shim_intercepted_total{kind="startup",answer="success"}');
  const rewritten = placePod(ctx, casePods()[name]!);
  const sc = (rewritten.spec?.initContainers ?? []).find((c: any) => c.name === 'sidecar');
  const allExec = ['startupProbe', 'readinessProbe', 'livenessProbe'].every((k) => sc?.[k]?.exec?.command?.[0] === MARKER);
  const roPort = ctx.kubelet.setup.roPort;
  const ready = await waitFor(`${name} Ready`, 90_000, async () => (await podsOf(roPort)).find((p) => p.name === name && p.ready), 500);
  // A few more periods, so liveness (which kubelet runs only after startup succeeded) has run.
  await sleep(4000);
  const totals = await proberTotals(roPort);
  const k = (type: string, result: string): number => total(totals, `${name}/sidecar ${type} ${result}`);
  const startupNow = metricValue(await metrics(), 'probe_agent_shim_intercepted_total{kind="startup",answer="success"}');
  check(`${P}rewritten startup/readiness/liveness answered through the shim`,
    allExec && !!ready && k('Startup', 'successful') >= 1 && k('Readiness', 'successful') >= 1 && k('Liveness', 'successful') >= 1
    && k('Startup', 'failed') + k('Readiness', 'failed') + k('Liveness', 'failed') === 0 && startupNow - startupBefore >= 1,
    `rewritten to exec: ${allExec}; pod Ready: ${!!ready}; kubelet prober_probe_total startup ${k('Startup', 'successful')}/${k('Startup', 'failed')}, `
    + `readiness ${k('Readiness', 'successful')}/${k('Readiness', 'failed')}, liveness ${k('Liveness', 'successful')}/${k('Liveness', 'failed')} (successful/failed); `
    + `shim answered startup probes +${startupNow - startupBefore}`);

  const cs = await containersOf(ctx.cri, name);
  // Each container's first attempt that ran (an attempt whose StartContainer failed never did).
  const one = (n: string): CriContainer | undefined => cs.filter((c) => c.name === n && c.startedAt !== undefined).sort((a, b) => a.attempt - b.attempt)[0];
  const [side, after, app] = [one('sidecar'), one('after'), one('app')];
  const startedLine = probeLines(safeRead(ctx.kubelet.log), name, 'startup', 'started')[0];
  const startedAt = startedLine ? klogTime(startedLine) : undefined;
  const view = (await podsOf(roPort)).find((p) => p.name === name);
  const restarts = [...(view?.initContainers ?? []), ...(view?.containers ?? [])].reduce((n, c) => n + c.restartCount, 0);
  const ordered = side?.startedAt !== undefined && startedAt !== undefined && after?.startedAt !== undefined && after.finishedAt !== undefined && app?.startedAt !== undefined
    && side.startedAt <= startedAt && startedAt <= after.startedAt && after.finishedAt <= app.startedAt;
  check(`${P}kubelet's order (sidecar started, then the next init, then the app)`, ordered && after?.exitCode === 0 && restarts === 0 && side?.state === 'CONTAINER_RUNNING',
    `sidecar start ${at(side?.startedAt)}, its startup probe "started" ${at(startedAt)}, init "after" ${at(after?.startedAt)}-${at(after?.finishedAt)} exit ${after?.exitCode ?? '?'} `
    + `(it fetched the sidecar's /ready), app start ${at(app?.startedAt)} (s.ms); restarts ${restarts}; sidecar ${side?.state ?? 'missing'}`);
}

export async function runSleepHook(ctx: PhaseContext): Promise<void> {
  const name = CASE_PODS.sleepHook;
  const P = `${name}: `;
  if (!ctx.kubelet.atLeast(29)) {
    const why = `kubelet ${ctx.kubelet.info.version} < 1.29: no lifecycle sleep action (PodLifecycleSleepAction: alpha 1.29, beta and on from 1.30)`;
    skip(`${P}rewrite keeps the sleep preStop, rewritten postStart runs`, why);
    skip(`${P}kubelet runs the sleep preStop before stopping`, why);
    return;
  }
  const original = casePods()[name]!;
  const rewritten = placePod(ctx, original);
  const origC = (original.spec as any).containers as any[];
  const kept = rewritten.spec.containers.every((c: any, i: number) => JSON.stringify(c.lifecycle?.preStop) === JSON.stringify(origC[i].lifecycle?.preStop));
  const appPost = rewritten.spec.containers.find((c: any) => c.name === 'app')?.lifecycle?.postStart;
  const roPort = ctx.kubelet.setup.roPort;
  const ready = await waitFor(`${name} Ready`, 60_000, async () => (await podsOf(roPort)).find((p) => p.name === name && p.ready), 500);
  const serverLog = ready ? podLogFiles(ctx.kubelet.podLogsRoot, ready.uid, 'server').map(safeRead).join('') : '';
  const hookFailed = safeRead(ctx.kubelet.log).split('\n').some((l) => /Failed to execute PostStartHook|FailedPostStartHook/.test(l) && l.includes(name));
  check(`${P}rewrite keeps the sleep preStop, rewritten postStart runs`,
    kept && appPost?.exec?.command?.[0] === MARKER && !!ready && /url:\/poststart/.test(serverLog) && !hookFailed,
    `preStop sleep kept byte for byte: ${kept}; postStart rewritten to exec: ${appPost?.exec?.command?.[0] === MARKER}; pod Ready: ${!!ready}; `
    + `${/url:\/poststart/.test(serverLog) ? 'server logged GET /poststart' : 'no /poststart in the server log'}; ${hookFailed ? 'kubelet: postStart failed' : 'no hook failure'}`);

  // Removing the pod: kubelet runs the server's preStop sleep, then asks the runtime to stop it
  // (containerd logs "StopContainer for <id>", CRI-O "Stopping container: <id>"; the container may
  // be gone before a poll sees it).
  const server = (await containersOf(ctx.cri, name)).find((c) => c.name === 'server' && c.state === 'CONTAINER_RUNNING');
  const removedAt = Date.now();
  removeManifest(ctx.manifests, name);
  const stopAt = server ? await waitFor('the runtime\'s StopContainer for the server', 30_000, () => ctx.runtime.stopRequestedAt(safeRead(ctx.runtimeLog), server.id), 200) : undefined;
  const took = stopAt !== undefined ? stopAt - removedAt : undefined;
  const preStopFailed = safeRead(ctx.kubelet.log).split('\n').some((l) => /PreStop hook failed|FailedPreStopHook/.test(l) && l.includes(name));
  check(`${P}kubelet runs the sleep preStop before stopping`, took !== undefined && took >= PRESTOP_SLEEP_SECONDS * 1000 && took < 10_000 && !preStopFailed,
    `manifest removed -> ${ctx.runtime.kind}'s StopContainer for the server: ${took === undefined ? (server ? 'not seen' : 'no running server container') : `${took} ms`} `
    + `(preStop sleep ${PRESTOP_SLEEP_SECONDS} s; grace 10 s)${preStopFailed ? '; kubelet: preStop failed' : ''}`);
  await removePods(ctx, [name]);
}

/**
 * Kubelet restarted with ExecProbeTimeout off (possible up to 1.34): its own exec probe that times
 * out then counts as nothing, so a rewritten probe must fail by its exit code. Kubelet is put back
 * with the run's gates afterwards.
 */
export async function runExecTimeoutGate(ctx: PhaseContext): Promise<void> {
  const P = 'ExecProbeTimeout off: ';
  const minor = ctx.kubelet.info.minor;
  if (minor !== undefined && minor >= 35) {
    const why = `kubelet ${ctx.kubelet.info.version}: ExecProbeTimeout is locked to true from 1.35`;
    skip(`${P}the gate is off (kubelet's own timed-out exec probe ignored)`, why);
    skip(`${P}rewritten liveness on a port that hangs fails`, why);
    skip(`${P}rewritten liveness answered 500 fails`, why);
    return;
  }
  say('restarting kubelet with ExecProbeTimeout: false');
  await ctx.kubelet.stop();
  const up = await ctx.kubelet.start('gate-off', { ExecProbeTimeout: false });
  if (!up) {
    check(`${P}kubelet starts with the gate off`, false, `kubelet ${ctx.kubelet.exited ? 'exited' : 'not healthy'}`);
    return;
  }
  const pods = casePods();
  const hang = pods[CASE_PODS.gateHang]!;
  // The control: kubelet's own exec liveness that always times out. Gate off: never restarted.
  (hang.spec as any).containers.push({
    name: 'control', image: (hang.spec as any).containers[0].image, imagePullPolicy: 'Never', command: ['/bin/sleep', 'infinity'],
    livenessProbe: { exec: { command: ['/bin/sleep', '5'] }, periodSeconds: 2, timeoutSeconds: 1, failureThreshold: 1 },
  });
  placePod(ctx, hang);
  placePod(ctx, pods[CASE_PODS.gate500]!);
  const roPort = ctx.kubelet.setup.roPort;
  const restartsOf = async (pod: string, c: string): Promise<number> =>
    (await podsOf(roPort)).find((p) => p.name === pod)?.containers.find((x) => x.name === c)?.restartCount ?? 0;
  await waitFor('both rewritten livenesses to restart their containers', 60_000, async () =>
    ((await restartsOf(CASE_PODS.gateHang, 'app')) >= 1 && (await restartsOf(CASE_PODS.gate500, 'app')) >= 1) || undefined, 1000);
  // The control has had several timed-out probes by now.
  await sleep(6000);
  const log = safeRead(ctx.kubelet.log);
  const totals = await proberTotals(roPort);
  const ignored = log.split('\n').filter((l) => l.includes('ExecProbeTimeout feature gate was disabled')).length;
  const control = await restartsOf(CASE_PODS.gateHang, 'control');
  const gate = /^kubernetes_feature_enabled\{name="ExecProbeTimeout"[^}]*\} (\d)$/m.exec((await httpGet(`http://127.0.0.1:${roPort}/metrics`)).body)?.[1] ?? 'absent';
  if (ctx.runtime.kind === 'crio') {
    // CRI-O ends a timed-out exec itself (conmon -T) and answers exit code -1: kubelet fails its own
    // probe whatever the gate. The gate's state is kubelet's own metric.
    check(`${P}the gate is off (kubelet's metric; CRI-O times kubelet's own exec probe out itself)`, gate === '0' && ignored === 0 && control >= 1,
      `kubernetes_feature_enabled{name="ExecProbeTimeout"} ${gate}; kubelet "...gate was disabled" lines ${ignored}; control container (exec liveness "sleep 5", timeout 1 s) restarts ${control}`);
  } else {
    check(`${P}the gate is off (kubelet's own timed-out exec probe ignored)`, gate !== '1' && ignored >= 1 && control === 0,
      `kubernetes_feature_enabled{name="ExecProbeTimeout"} ${gate}; kubelet "...but ExecProbeTimeout feature gate was disabled" lines ${ignored}; control container (exec liveness "sleep 5", timeout 1 s) restarts ${control}`);
  }
  const failedLine = (pod: string): string => log.split('\n').find((l) => l.includes('"Probe failed"') && l.includes(`${pod}-${NODE_NAME}`) && l.includes('containerName="app"'))
    ?.match(/output="(?:[^"\\]|\\.){0,200}/)?.[0] ?? 'no "Probe failed" line';
  for (const [pod, label] of [[CASE_PODS.gateHang, 'rewritten liveness on a port that hangs fails'], [CASE_PODS.gate500, 'rewritten liveness answered 500 fails']] as const) {
    const r = await restartsOf(pod, 'app');
    const failed = total(totals, `${pod}/app Liveness failed`);
    // An errored probe (a gRPC error, e.g. DeadlineExceeded with the gate off) is discarded by kubelet: none may show.
    const errored = log.split('\n').filter((l) => l.includes('"Probe errored"') && l.includes(`${pod}-${NODE_NAME}`) && l.includes('containerName="app"')).length;
    check(`${P}${label}`, r >= 1 && failed >= 1 && errored === 0,
      `restarts ${r}; kubelet prober_probe_total liveness failed ${failed}; "Probe errored" lines ${errored}; kubelet: ${failedLine(pod)}`);
  }
  await removePods(ctx, [CASE_PODS.gateHang, CASE_PODS.gate500]);
  say('restarting kubelet with the run\'s feature gates');
  await ctx.kubelet.stop();
  if (!(await ctx.kubelet.start('gate-restored'))) check('kubelet starts again after the gate case', false, `kubelet ${ctx.kubelet.exited ? 'exited' : 'not healthy'}`);
}
