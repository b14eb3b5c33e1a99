/**
 * The churn phase (issue 24): CHURN_PODS static pods, each with a rewritten readiness (httpGet on a
 * named port) and liveness (tcpSocket) probe every second; every REPLACE_EVERY_MS, REPLACE_COUNT of
 * them are replaced (file removed, a pod of a new name added) for E2E_CHURN_SECONDS. What an
 * operator needs before trusting the shim on a busy node: no CRI call failed by the shim, no
 * container restarted, every pod Ready with no probe failed or errored, the shim's and the agent's
 * RSS flat and kubelet's PLEG healthy throughout. The GOAWAYs containerd sends the shim are counted
 * by a frame tap (frame-tap.ts), since containerd does not log them.
 *
 * How soon a pod is Ready after its container starts is reported, not asserted (a loaded machine
 * moves it; make bench-kubelet measures speed), beside the same for CONTROL_PODS pods churned in
 * the same run whose readiness is kubelet's own exec probe: the rewritten probe's price next to
 * kubelet's on the same node at the same moment.
 */
import { availableParallelism } from 'node:os';
import type { KubeletCri } from '../support/kubelet-cri.ts';
import { goawaySummary, type FrameTap, type TapCounts } from './frame-tap.ts';
import type { Kubelet } from './kubelet.ts';
import {
  check, criMs, httpGet, klogTime, metricValue, NODE_NAME, podsOf, readFrom, safeRead, say, sizeOf, skip, sleep, vmRssBytes,
} from './lib.ts';
import { removeManifest, writeManifest } from './static-pods.ts';

export const CHURN_PODS = 16;
export const REPLACE_EVERY_MS = 15_000;
export const REPLACE_COUNT = 4;
/** Pods whose readiness is kubelet's own exec probe (not rewritten), one replaced each round. */
export const CONTROL_PODS = 4;
/**
 * "Flat": RSS growth over the second half of the churn below this. Issue 31 asks for <= 2 MB over a
 * 30-minute churn; a short churn (the default 4 minutes) is still warming up (Node's heap moves by a
 * few MB with GC), so it gets 5 MB.
 */
export function rssFlatBytes(seconds: number): number {
  return (seconds >= 1800 ? 2 : 5) * 1024 * 1024;
}
/** A progress line with both processes' memory this often. */
const PROGRESS_MS = 60_000;
/** After the last replacement: time for the last pods to start and be probed before counting. */
const SETTLE_MS = 15_000;

export interface ChurnContext {
  kubelet: Kubelet;
  manifests: string;
  /** A churn pod's manifest, already rewritten, under `name`. */
  manifest: (name: string) => string;
  /** A control pod's manifest (kubelet's own exec readiness) under `name`. */
  controlManifest: (name: string) => string;
  /** Straight to the runtime (the measurements must not add to the shim's load). */
  cri: KubeletCri;
  shimPid: number;
  /** The agent's pid now (a rollout phase before may have replaced it). */
  agentPid: () => number | undefined;
  /** The agent's /metrics (its Node heap: nodejs_heap_size_used_bytes). */
  agentMetricsPort: number;
  shimLog: string;
  shimMetricsPort: number;
  runtimeLog: string;
  /** The runtime's name in the checks ("containerd", "CRI-O"). */
  runtimeName: string;
  tap: FrameTap | undefined;
  seconds: number;
}

const mb = (b: number): string => `${(b / 1024 / 1024).toFixed(1)} MB`;

interface PodRecord {
  name: string;
  /** Rewritten probes (the agent's), or a control pod (kubelet's own exec readiness). */
  control: boolean;
  addedAt: number;
  removedAt?: number;
  /** The app container's first start (CRI started_at of its earliest started attempt). */
  startedAt?: number;
  /** First time kubelet said Ready (its log line, else /pods). */
  readyAt?: number;
  readyFrom?: 'log' | '/pods';
  maxRestartCount: number;
}

interface ContainerRecord {
  pod: string;
  attempt: number;
  startedAt?: number;
}

function tapSnapshot(c: TapCounts): TapCounts {
  return { connections: c.connections, pingsToRuntime: c.pingsToRuntime, pingsFromRuntime: c.pingsFromRuntime, goaways: new Map(c.goaways) };
}

export async function runChurn(ctx: ChurnContext): Promise<void> {
  const { kubelet } = ctx;
  const roPort = kubelet.setup.roPort;
  const P = 'churn: ';
  // Slots 0..CHURN_PODS-1 run rewritten pods, the next CONTROL_PODS control pods.
  const gen = new Array<number>(CHURN_PODS + CONTROL_PODS).fill(0);
  const isControl = (slot: number): boolean => slot >= CHURN_PODS;
  const podName = (slot: number): string => isControl(slot)
    ? `churn-ctl-${String(slot - CHURN_PODS).padStart(2, '0')}-g${gen[slot]}`
    : `churn-${String(slot).padStart(2, '0')}-g${gen[slot]}`;
  const pods = new Map<string, PodRecord>();
  const containers = new Map<string, ContainerRecord>();
  const add = (slot: number): void => {
    const name = podName(slot);
    writeManifest(ctx.manifests, name, isControl(slot) ? ctx.controlManifest(name) : ctx.manifest(name));
    pods.set(name, { name, control: isControl(slot), addedAt: Date.now(), maxRestartCount: 0 });
  };
  const remove = (slot: number): void => {
    const name = podName(slot);
    removeManifest(ctx.manifests, name);
    const rec = pods.get(name);
    if (rec) rec.removedAt = Date.now();
  };
  const replace = (slot: number): void => {
    remove(slot);
    gen[slot]!++;
    add(slot);
  };

  const metrics = async (): Promise<string> => (await httpGet(`http://127.0.0.1:${ctx.shimMetricsPort}/metrics`, 3000)).body;
  const kubeletLogFrom = sizeOf(kubelet.log);
  const kubeletLogFile = kubelet.log;
  const shimLogFrom = sizeOf(ctx.shimLog);
  const runtimeLogFrom = sizeOf(ctx.runtimeLog);
  const errorsBefore = metricValue(await metrics(), 'probe_agent_shim_runtime_errors_total');
  const interceptedBefore = metricValue(await metrics(), 'probe_agent_shim_intercepted_total');
  const tapBefore = ctx.tap ? tapSnapshot(ctx.tap.counts) : undefined;

  // Observers, until `done`.
  let done = false;
  const rss: { at: number; bytes: number }[] = [];
  const agentRss: { at: number; bytes: number }[] = [];
  const agentHeap: { at: number; bytes: number }[] = [];
  const agentPidAtStart = ctx.agentPid();
  const health = { polls: 0, healthzFailed: 0, roFailed: 0, firstFailure: '' };
  const loops: Promise<void>[] = [];
  const every = (ms: number, fn: () => Promise<void> | void): void => {
    loops.push((async () => {
      while (!done) {
        const t = Date.now();
        try {
          await fn();
        } catch {
          // the next round
        }
        await sleep(Math.max(0, ms - (Date.now() - t)));
      }
    })());
  };
  every(500, async () => {
    for (const p of await podsOf(roPort)) {
      const rec = pods.get(p.name);
      if (!rec) continue;
      if (p.ready && rec.readyAt === undefined) {
        rec.readyAt = Date.now();
        rec.readyFrom = '/pods';
      }
      for (const c of p.containers) rec.maxRestartCount = Math.max(rec.maxRestartCount, c.restartCount);
    }
  });
  every(1000, async () => {
    const r = await ctx.cri.call<{ containers: { id: string; state: string; metadata: { name: string; attempt: number }; labels: Record<string, string> }[] }>(
      'ListContainers', { filter: { labelSelector: { 'io.kubernetes.pod.namespace': 'default' } } });
    if (!r.ok) return;
    for (const c of r.msg.containers) {
      const pod = (c.labels['io.kubernetes.pod.name'] ?? '').replace(`-${NODE_NAME}`, '');
      if (!pods.has(pod)) continue;
      let rec = containers.get(c.id);
      if (!rec) {
        rec = { pod, attempt: Number(c.metadata.attempt) };
        containers.set(c.id, rec);
      }
      if (rec.startedAt === undefined && c.state !== 'CONTAINER_CREATED') {
        const st = await ctx.cri.call<{ status: { startedAt: string } }>('ContainerStatus', { containerId: c.id });
        if (st.ok) rec.startedAt = criMs(st.msg.status.startedAt);
      }
    }
  });
  // The machine's 1-minute load average, for the readiness row: the cores are shared.
  const load: number[] = [];
  every(5000, async () => {
    const b = vmRssBytes(ctx.shimPid);
    if (b !== undefined) rss.push({ at: Date.now(), bytes: b });
    const a = vmRssBytes(ctx.agentPid());
    if (a !== undefined) agentRss.push({ at: Date.now(), bytes: a });
    const l = Number(safeRead('/proc/loadavg').split(' ')[0]);
    if (Number.isFinite(l)) load.push(l);
    const h = metricValue((await httpGet(`http://127.0.0.1:${ctx.agentMetricsPort}/metrics`, 3000)).body, 'nodejs_heap_size_used_bytes');
    if (h > 0) agentHeap.push({ at: Date.now(), bytes: h });
  });
  const last = (xs: { bytes: number }[]): string => (xs.length ? mb(xs[xs.length - 1]!.bytes) : 'n/a');
  // RssAnon vs RssFile says whether a growth is the process's own memory or mapped files.
  const parts = (pid: number | undefined): string => {
    const st = safeRead(`/proc/${pid}/status`);
    const kb = (k: string): string => { const m = new RegExp(`${k}:\\s+(\\d+) kB`).exec(st); return m ? mb(Number(m[1]) * 1024) : '?'; };
    return `anon ${kb('RssAnon')}, file ${kb('RssFile')}`;
  };
  every(PROGRESS_MS, () => {
    if (rss.length) say(`churn memory: agent RSS ${last(agentRss)} (${parts(ctx.agentPid())}; heap used ${last(agentHeap)}), shim RSS ${last(rss)} (${parts(ctx.shimPid)})`);
  });
  every(2000, async () => {
    health.polls++;
    const probe = async (url: string): Promise<string | undefined> => {
      try {
        const r = await httpGet(url, 1500);
        return r.status === 200 ? undefined : `${r.status} ${r.body.slice(0, 200)}`;
      } catch (err) {
        return (err as Error).message;
      }
    };
    const a = await probe(`http://127.0.0.1:${kubelet.setup.healthzPort}/healthz`);
    const b = await probe(`http://127.0.0.1:${roPort}/healthz`);
    if (a) health.healthzFailed++;
    if (b) health.roFailed++;
    if ((a || b) && !health.firstFailure) health.firstFailure = `${new Date().toISOString().slice(11, 19)} ${a ?? b}`;
  });

  say(`churn: ${CHURN_PODS} pods, ${REPLACE_COUNT} replaced every ${REPLACE_EVERY_MS / 1000} s, for ${ctx.seconds} s; beside them ${CONTROL_PODS} control pods (kubelet's own exec readiness), one replaced each round`);
  const start = Date.now();
  for (let s = 0; s < CHURN_PODS + CONTROL_PODS; s++) add(s);
  let tick = 0;
  while (Date.now() - start + REPLACE_EVERY_MS <= ctx.seconds * 1000) {
    await sleep(start + (tick + 1) * REPLACE_EVERY_MS - Date.now());
    for (let i = 0; i < REPLACE_COUNT; i++) replace((tick * REPLACE_COUNT + i) % CHURN_PODS);
    replace(CHURN_PODS + (tick % CONTROL_PODS));
    tick++;
    if (tick % 4 === 0) say(`churn: ${Math.round((Date.now() - start) / 1000)} s, ${pods.size} pods so far`);
  }
  await sleep(Math.max(0, start + ctx.seconds * 1000 - Date.now()) + SETTLE_MS);
  // The end of the samples, before the observers' last sleeps (the progress line's is a minute) run out.
  const end = Date.now();
  done = true;
  await Promise.all(loops);

  const klog = readFrom(kubeletLogFile, kubeletLogFrom);
  const shimLog = readFrom(ctx.shimLog, shimLogFrom);
  const ctrdLog = readFrom(ctx.runtimeLog, runtimeLogFrom);

  // Kubelet's own readiness lines time the Ready (ms); /pods polls are the fallback (500 ms). Its
  // PLEG lines say when it saw each container start: what the probe worker waits for.
  const plegSeen = new Map<string, number>();
  // Probes of churn pods that failed or errored while the pod was wanted (before its manifest went:
  // kubelet keeps a terminating pod's readiness probe running, and its container is being killed).
  const probeTrouble = { failed: [] as string[], errored: [] as string[], whileRemoved: 0 };
  for (const line of klog.split('\n')) {
    const trouble = /"Probe (failed|errored)".*pod="default\/(churn-(?:ctl-)?\d+-g\d+)-/.exec(line);
    if (trouble) {
      const rec = pods.get(trouble[2]!);
      const at = klogTime(line);
      if (rec && at !== undefined && rec.removedAt !== undefined && at >= rec.removedAt) probeTrouble.whileRemoved++;
      else if (rec) probeTrouble[trouble[1] === 'failed' ? 'failed' : 'errored'].push(`${rec.name}: ${/probeType="(\w+)"/.exec(line)?.[1] ?? '?'} ${(/(?:output|err)="([^"]{0,100})/.exec(line)?.[1] ?? '').trim()}`);
      continue;
    }
    // 1.26 prints event=&{ID:... Type:ContainerStarted Data:<id>}, 1.27+ JSON: "Type":"ContainerStarted","Data":"<id>".
    const started = /Type\W+ContainerStarted\W+Data\W+([0-9a-f]{64})/.exec(line);
    if (started) {
      const at = klogTime(line);
      if (at !== undefined && !plegSeen.has(started[1]!)) plegSeen.set(started[1]!, at);
      continue;
    }
    if (!line.includes('"SyncLoop (probe)"') || !line.includes('probe="readiness"') || !line.includes('status="ready"')) continue;
    const m = /pod="default\/(churn-(?:ctl-)?\d+-g\d+)-/.exec(line);
    const rec = m ? pods.get(m[1]!) : undefined;
    const at = klogTime(line);
    if (rec && at !== undefined && (rec.readyFrom !== 'log' || at < rec.readyAt!)) {
      rec.readyAt = at;
      rec.readyFrom = 'log';
    }
  }
  for (const c of containers.values()) {
    const rec = pods.get(c.pod);
    // The first start of any attempt: a pod whose first container never ran is timed from its retry.
    if (rec && c.startedAt !== undefined) rec.startedAt = Math.min(rec.startedAt ?? Infinity, c.startedAt);
  }

  // 1. CRI calls the shim failed.
  const m = await metrics().catch(() => '');
  const runtimeErrors = m ? metricValue(m, 'probe_agent_shim_runtime_errors_total') - errorsBefore : NaN;
  const intercepted = m ? metricValue(m, 'probe_agent_shim_intercepted_total') - interceptedBefore : NaN;
  const shimLines = shimLog.split('\n').filter((l) => l.startsWith('{')).map((l) => {
    try {
      return JSON.parse(l) as { level?: string; msg?: string; error?: string; suppressed?: number };
    } catch {
      return {};
    }
  });
  const unavailable = shimLines.filter((l) => l.msg === 'runtime unavailable').reduce((n, l) => n + 1 + (l.suppressed ?? 0), 0);
  const kubeletSaw = klog.split('\n').filter((l) => l.includes('probe-agent shim: runtime')).length;
  const ctrdErrors = ctrdLog.split('\n').filter((l) => l.includes('level=error'));
  const topCtrd = topMessages(ctrdErrors.map((l) => /msg="([^"]{0,80})/.exec(l)?.[1] ?? l.slice(0, 80)));
  check(`${P}no CRI call failed by the shim`, runtimeErrors === 0 && unavailable === 0 && kubeletSaw === 0,
    `shim runtime_errors_total +${runtimeErrors}; shim "runtime unavailable" warnings (with suppressed) ${unavailable}; kubelet log lines with "probe-agent shim: runtime" ${kubeletSaw}; `
    + `${ctx.runtimeName} level=error lines ${ctrdErrors.length}${topCtrd ? ` (${topCtrd})` : ''}; rewritten probes answered by the shim ${intercepted}`);

  // 2. GOAWAYs: the cause of (1) on today's relay.
  const ctrdPings = ctrdLog.split('\n').filter((l) => /too_many_pings|too many pings|ENHANCE_YOUR_CALM|goaway/i.test(l));
  if (ctx.tap && tapBefore) {
    const now = ctx.tap.counts;
    const goaways = new Map([...now.goaways].map(([k, v]) => [k, v - (tapBefore.goaways.get(k) ?? 0)] as const).filter(([, v]) => v > 0));
    const tooMany = [...goaways].filter(([k]) => k.includes('too_many_pings')).reduce((n, [, v]) => n + v, 0);
    check(`${P}${ctx.runtimeName} sent no GOAWAY too_many_pings`, tooMany === 0 && ctrdPings.length === 0,
      `frame tap: GOAWAYs from ${ctx.runtimeName} ${goawaySummary(goaways)}; shim->runtime connections ${now.connections - tapBefore.connections}, `
      + `PINGs shim->runtime ${now.pingsToRuntime - tapBefore.pingsToRuntime}, runtime->shim ${now.pingsFromRuntime - tapBefore.pingsFromRuntime}; `
      + `${ctx.runtimeName} log lines mentioning it ${ctrdPings.length}${ctrdPings[0] ? `: ${ctrdPings[0].slice(0, 200)}` : ''}`);
  } else {
    skip(`${P}${ctx.runtimeName} sent no GOAWAY too_many_pings`, `E2E_FRAME_TAP=0: no frame tap (${ctx.runtimeName} log lines mentioning it: ${ctrdPings.length})`);
  }

  // 3. Restarts.
  const restarted = [...containers.values()].filter((c) => c.attempt > 0);
  const byStatus = [...pods.values()].reduce((n, p) => n + p.maxRestartCount, 0);
  check(`${P}no container restarted`, restarted.length === 0 && byStatus === 0,
    `containers with attempt > 0 seen in CRI ${restarted.length}${restarted.length ? ` (${[...new Set(restarted.map((c) => c.pod))].slice(0, 6).join(', ')})` : ''}; `
    + `sum of kubelet's restartCount ${byStatus}`);

  // 4. Every pod Ready, no probe failed: an outcome. How soon is reported beside kubelet's own probe.
  const all = [...pods.values()];
  const neverStarted = all.filter((p) => p.startedAt === undefined);
  const started = all.filter((p) => p.startedAt !== undefined);
  const neverReady = started.filter((p) => p.readyAt === undefined);
  const lat = started.filter((p) => p.readyAt !== undefined).map((p) => ({ p, ms: p.readyAt! - p.startedAt! }));
  const plegLag = [...containers].filter(([id, c]) => c.startedAt !== undefined && plegSeen.has(id)).map(([id, c]) => plegSeen.get(id)! - c.startedAt!).sort((a, b) => a - b);
  const pct = (xs: number[], q: number): string => (xs.length ? `${Math.round(xs[Math.min(xs.length - 1, Math.floor(q * xs.length))]!)} ms` : 'n/a');
  const latencyOf = (control: boolean): string => {
    const xs = lat.filter((x) => x.p.control === control).map((x) => x.ms).sort((a, b) => a - b);
    return `p50 ${pct(xs, 0.5)}, p90 ${pct(xs, 0.9)}, max ${pct(xs, 1)} (${xs.length} pods)`;
  };
  const p50Of = (control: boolean): number => {
    const xs = lat.filter((x) => x.p.control === control).map((x) => x.ms).sort((a, b) => a - b);
    return xs.length ? xs[Math.floor(xs.length / 2)]! : NaN;
  };
  const latency = `start->Ready, rewritten ${latencyOf(false)}; control (kubelet's own exec probe) ${latencyOf(true)}; p50 ratio ${(p50Of(false) / p50Of(true)).toFixed(2)}`
    + ` (${lat.filter((x) => x.p.readyFrom === 'log').length} of ${lat.length} timed by kubelet's log, the rest by /pods polls); start->kubelet's PLEG saw it p50 ${pct(plegLag, 0.5)}, max ${pct(plegLag, 1)}; `
    + `load average ${load.length ? `${Math.min(...load).toFixed(1)}-${Math.max(...load).toFixed(1)}` : 'n/a'} on ${availableParallelism()} cores`;
  say(`churn readiness (reported, not asserted): ${latency}`);
  const controls = all.filter((p) => p.control).length;
  check(`${P}every pod Ready after its container started, no probe failed or errored (${CHURN_PODS} rewritten, ${CONTROL_PODS} with kubelet's own exec readiness)`,
    all.length > 0 && controls > 0 && neverStarted.length === 0 && neverReady.length === 0 && probeTrouble.failed.length === 0 && probeTrouble.errored.length === 0,
    `${lat.length} of ${all.length} pods Ready (${controls} control); container never started ${neverStarted.length}${neverStarted.length ? ` (${neverStarted.slice(0, 4).map((p) => p.name).join(', ')})` : ''}; `
    + `started but never Ready ${neverReady.length}${neverReady.length ? ` (${neverReady.slice(0, 4).map((p) => p.name).join(', ')})` : ''}; `
    + `probes failed ${probeTrouble.failed.length}, errored ${probeTrouble.errored.length}${[...probeTrouble.failed, ...probeTrouble.errored].slice(0, 3).map((t) => `; ${t}`).join('')} `
    + `(after the pod's removal, not counted: ${probeTrouble.whileRemoved}); ${latency}`);

  // 5. The shim's and the agent's RSS (and the agent's heap, for what grows).
  const mid = start + ((end - start) / 2);
  const flat = rssFlatBytes(ctx.seconds);
  const avg = (xs: { bytes: number }[]): number => xs.reduce((n, x) => n + x.bytes, 0) / Math.max(1, xs.length);
  // 20 s windows, at the middle and at the end: a GC cycle moves one sample, not four.
  const growthOf = (xs: { at: number; bytes: number }[]): { atMid: number; atEnd: number; growth: number; text: string } => {
    const atMid = avg(xs.filter((x) => Math.abs(x.at - mid) <= 10_000));
    const atEnd = avg(xs.filter((x) => x.at >= end - 20_000));
    return {
      atMid, atEnd, growth: atEnd - atMid,
      text: `first ${mb(xs[0]?.bytes ?? 0)}, middle ${mb(atMid)}, end ${mb(atEnd)}, max ${mb(Math.max(...xs.map((x) => x.bytes)))}; second-half growth ${mb(atEnd - atMid)} (${xs.length} samples, 5 s apart)`,
    };
  };
  const windowsFilled = (xs: { at: number }[]): boolean => xs.some((x) => Math.abs(x.at - mid) <= 10_000) && xs.some((x) => x.at >= end - 20_000);
  if (rss.length >= 4 && windowsFilled(rss)) {
    const g = growthOf(rss);
    check(`${P}shim RSS flat (growth over the second half < ${mb(flat)})`, g.growth < flat, `VmRSS ${g.text}`);
  } else {
    check(`${P}shim RSS flat`, false, `only ${rss.length} VmRSS samples of pid ${ctx.shimPid} (did the shim exit?)`);
  }
  const agentPidNow = ctx.agentPid();
  if (agentRss.length >= 4 && windowsFilled(agentRss) && agentPidNow === agentPidAtStart) {
    const g = growthOf(agentRss);
    const h = agentHeap.length >= 4 ? growthOf(agentHeap) : undefined;
    check(`${P}agent RSS flat (growth over the second half < ${mb(flat)})`, g.growth < flat,
      `VmRSS ${g.text}; Node heap used ${h ? h.text : `only ${agentHeap.length} samples of its /metrics`}`);
  } else {
    check(`${P}agent RSS flat`, false, `${agentRss.length} VmRSS samples; agent pid ${agentPidAtStart} at the start, ${agentPidNow} at the end (did the agent exit?)`);
  }

  // 6. PLEG.
  // "Skipping pod synchronization" is the sync loop stopped by a runtime error (PLEG included).
  const pleg = klog.split('\n').filter((l) => l.includes('PLEG is not healthy'));
  const skipped = klog.split('\n').filter((l) => l.includes('Skipping pod synchronization')).length;
  check(`${P}kubelet's PLEG healthy throughout`, pleg.length === 0 && skipped === 0 && health.healthzFailed === 0 && health.roFailed === 0 && health.polls > 0 && !kubelet.exited,
    `"PLEG is not healthy" lines ${pleg.length}; "Skipping pod synchronization" ${skipped}; /healthz failed ${health.healthzFailed} on the healthz port (ping) and `
    + `${health.roFailed} on the read-only port (with syncloop) of ${health.polls} polls 2 s apart${health.firstFailure ? `, first: ${health.firstFailure}` : ''}`);

  // 7. The shim's own log: a healthy run has nothing to warn about.
  const noisy = shimLines.filter((l) => l.level === 'warn' || l.level === 'error');
  check(`${P}the shim logged no warn/error line`, noisy.length === 0,
    noisy.length ? `${noisy.length} lines: ${topMessages(noisy.map((l) => `${l.level} ${l.msg}${l.error ? `: ${l.error.slice(0, 110)}` : ''}`))}` : 'none');

  // 8. Removed pods go. A kubelet whose pod sources never become ready (a standalone one that
  // starts on an empty manifest dir, as seen on the v1.26 and v1.32 builds) answers every removal
  // "Failed to delete pod ... sources aren't ready yet" and keeps probing the pod: the node then
  // gains 16 pods a minute, and every number above measures that, not a churn.
  const notDeleted = klog.split('\n').filter((l) => l.includes('"Failed to delete pod"') && /churn-(?:ctl-)?\d+-g\d+/.test(l)).length;
  const listed = await ctx.cri.call<{ containers: { state: string; labels: Record<string, string> }[] }>(
    'ListContainers', { filter: { labelSelector: { 'io.kubernetes.pod.namespace': 'default' } } });
  const removedLongAgo = new Set([...pods.values()].filter((p) => p.removedAt !== undefined && end - p.removedAt > 60_000).map((p) => p.name));
  const lingering = listed.ok
    ? listed.msg.containers.filter((c) => c.state === 'CONTAINER_RUNNING' && removedLongAgo.has((c.labels['io.kubernetes.pod.name'] ?? '').replace(`-${NODE_NAME}`, ''))).length
    : NaN;
  check(`${P}removed pods go`, notDeleted === 0 && lingering === 0,
    `kubelet "Failed to delete pod" lines for churn pods ${notDeleted}; containers still running of the ${removedLongAgo.size} pods removed over a minute before the end ${lingering}`);

  // The pods go; the next phase (or the cleanup) starts from an empty node.
  for (let s = 0; s < CHURN_PODS + CONTROL_PODS; s++) remove(s);
}

function topMessages(msgs: string[]): string {
  const n = new Map<string, number>();
  for (const m of msgs) n.set(m, (n.get(m) ?? 0) + 1);
  return [...n].sort((a, b) => b[1] - a[1]).slice(0, 3).map(([k, v]) => `${v}x ${k}`).join('; ');
}
