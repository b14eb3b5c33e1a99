/**
 * A kubelet's CRI traffic under pod churn, made on ONE client connection (a CriCaller: grpc-go's
 * GrpcGoCri or grpc-js's KubeletCri) to a CRI endpoint (the shim, or the runtime directly):
 *
 * - pods: RunPodSandbox, PodSandboxStatus, CreateContainer, StartContainer for each (busybox httpd);
 *   every `replaceEverySeconds` the oldest `replacePods` are replaced: StopContainer,
 *   StopPodSandbox, RemoveContainer, RemovePodSandbox, then a new pod;
 * - a startup gate per pod: its startup probe until it succeeds (a refused target while httpd
 *   starts is a probe failure, as for kubelet);
 * - per pod a readiness (httpGet) and a liveness (tcpSocket) probe every second (every 4th pod's
 *   readiness path is missing: its right answer is a failure);
 * - per pod a plain ExecSync every 8 s (kubelet's ordinary exec probe; an exit code, or stdout;
 *   each costs a runc exec, so fewer than the probes);
 * - ListPodSandbox and ListContainers every second (kubelet's PLEG relist).
 *
 * `probes` says who runs the probes: 'shim' (they are rewritten: kubelet sends each as a marker
 * ExecSync and the agent's answer comes back as its exit code) or 'kubelet' (a node without the
 * shim: kubelet connects to the pod itself, so probes put nothing on the CRI connection; running
 * the markers on the runtime instead would cost a failed runc exec each, 32 a second). Every call
 * and every probe is judged; nothing throws for a wrong answer (see `wrong`, `byMethod`), so a
 * broken connection is counted, not hidden.
 */
import type * as grpc from '@grpc/grpc-js';
import { randomUUID } from 'node:crypto';
import * as http from 'node:http';
import * as net from 'node:net';
import { encodeShimCommand } from '../../agent/contract/shim-command.ts';
import { FAILURE_EXIT_CODE } from '../../agent/api/exec-sync.ts';
import { BUSYBOX_IMAGE_REF } from '../lab/busybox-image.ts';
import { kubeletCgroupParent } from '../lab/containerd.ts';
import type { CriCaller } from './grpc-go-cri.ts';
import type { CriAnswer } from './kubelet-cri.ts';
import { makePod } from './pod-factory.ts';

const PORT = 8080;
/** busybox httpd serves the container's /etc: /passwd is a file (200), /no-such-file is not (404). */
const GOOD_PATH = '/passwd';
const MISSING_PATH = '/no-such-file';
/** A probe's timeoutSeconds: kubelet's 1 s raised, so a starved shared machine does not decide a verdict. */
const PROBE_TIMEOUT_S = 3;
/** kubelet's --runtime-request-timeout, and its sandbox calls' doubled one. */
const RUNTIME_TIMEOUT_MS = 120_000;
/** grpc status codes used here (numbers, so this module needs no runtime grpc-js import). */
const UNAVAILABLE = 14 as grpc.status;

/** What to run. */
export interface ChurnOptions {
  client: CriCaller;
  /** Who runs the probes: the agent, asked through the shim by marker ExecSyncs, or kubelet itself (no shim). */
  probes: 'shim' | 'kubelet';
  /** Distinct per run (pod names, labels), so runs on one runtime do not see each other's pods. */
  namespace: string;
  /** The lab's cgroup prefix (ContainerdLab.cgroupPrefix), for kubelet-shaped cgroup parents. */
  cgroupPrefix: string;
  pods: number;
  seconds: number;
  replacePods: number;
  replaceEverySeconds: number;
  /** Called whenever the set of running pods changes: the pod specs kubelet serves (with their rewritten probes). */
  onPods?: (specs: Record<string, unknown>[]) => void;
  log?: (line: string) => void;
}

/** Per method: how many calls, and their gRPC codes when they failed. */
export interface MethodCount { calls: number; ok: number; byCode: Record<string, number> }

/** What a run found. */
export interface ChurnResult {
  /** The whole run: the first pods' start, the churn, the final deletions. */
  seconds: number;
  /** How long the first pods took to come up (the churn's `seconds` start then). */
  firstPodsUpSeconds: number;
  podsStarted: number;
  replaced: number;
  calls: number;
  /** Calls that ended UNAVAILABLE (a lost or refused connection), whatever the call. */
  unavailable: number;
  byMethod: Record<string, MethodCount>;
  /** Readiness and liveness probes after the startup gate: answered as expected / not. */
  probes: { right: number; wrong: number; expectedFailures: number };
  plainExecs: { right: number; wrong: number };
  /** Every wrong answer (the first 30 in full). */
  wrongCount: number;
  wrong: string[];
  /** The slowest answer of each kind (ms). */
  maxLatencyMs: Record<string, number>;
}

interface Pod {
  index: number;
  uid: string;
  name: string;
  sandboxId?: string;
  containerId?: string;
  ips: string[];
  /** Every 4th pod's readiness probe targets a missing path: its right answer is a failure. */
  readinessFails: boolean;
  stopped: boolean;
  workers: Promise<void>[];
}

function readinessCmd(p: Pod): string[] {
  return encodeShimCommand('readiness', { httpGet: { path: p.readinessFails ? MISSING_PATH : GOOD_PATH, port: PORT, scheme: 'HTTP' } });
}
const livenessCmd = encodeShimCommand('liveness', { tcpSocket: { port: PORT } });
const startupCmd = encodeShimCommand('startup', { httpGet: { path: GOOD_PATH, port: PORT, scheme: 'HTTP' } });

/** kubelet's own HTTP probe (no shim): a new connection, success for 200-399. */
function kubeletHttpGet(ip: string, urlPath: string, timeoutMs: number): Promise<{ success: boolean; detail: string }> {
  return new Promise((resolve) => {
    const req = http.get({ host: ip, port: PORT, path: urlPath, agent: false, timeout: timeoutMs }, (res) => {
      res.resume();
      const code = res.statusCode ?? 0;
      resolve({ success: code >= 200 && code < 400, detail: `HTTP ${code}` });
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', (err) => resolve({ success: false, detail: err.message }));
  });
}

/** kubelet's own TCP probe (no shim): success when the connection opens. */
function kubeletTcp(ip: string, timeoutMs: number): Promise<{ success: boolean; detail: string }> {
  return new Promise((resolve) => {
    const s = net.connect({ host: ip, port: PORT, timeout: timeoutMs });
    s.on('connect', () => {
      s.destroy();
      resolve({ success: true, detail: 'connected' });
    });
    s.on('timeout', () => s.destroy(new Error('timeout')));
    s.on('error', (err) => resolve({ success: false, detail: err.message }));
  });
}

/** The pod as kubelet (after the rewrite) serves it to the agent: its probes are marker commands. */
function podSpec(p: Pod, namespace: string): Record<string, unknown> {
  const pod = makePod({ uid: p.uid, name: p.name, namespace, ips: p.ips, probe: 'none', port: PORT, containerID: `containerd://${p.containerId}` });
  const c = (pod.spec as { containers: Record<string, unknown>[] }).containers[0]!;
  const timing = { periodSeconds: 1, timeoutSeconds: PROBE_TIMEOUT_S, successThreshold: 1, failureThreshold: 3 };
  c.startupProbe = { exec: { command: startupCmd }, ...timing, failureThreshold: 30 };
  c.readinessProbe = { exec: { command: readinessCmd(p) }, ...timing };
  c.livenessProbe = { exec: { command: livenessCmd }, ...timing };
  return pod;
}

function describe(a: CriAnswer<Record<string, any>>): string {
  if (!a.ok) return `gRPC ${a.code}: ${a.details.slice(0, 240)}`;
  const m = a.msg as { exitCode?: number; stdout?: Buffer };
  return m.exitCode === undefined ? 'ok' : `exit ${m.exitCode} ${String(m.stdout ?? '').slice(0, 160)}`;
}

/** Runs the churn; returns what it saw. Throws only when the run itself cannot go on (no pod ever started). */
export async function runCriChurn(o: ChurnOptions): Promise<ChurnResult> {
  const log = o.log ?? (() => {});
  const byMethod: Record<string, MethodCount> = {};
  const maxLatencyMs: Record<string, number> = {};
  const wrong: string[] = [];
  let wrongCount = 0;
  let unavailable = 0;
  let calls = 0;
  const probes = { right: 0, wrong: 0, expectedFailures: 0 };
  const plainExecs = { right: 0, wrong: 0 };
  let podsStarted = 0;
  let replaced = 0;
  const pods: Pod[] = [];
  let nextIndex = 0;
  const t0 = Date.now();
  /** The churn's `seconds` count from when the first pods are up; until then, this bounds their start. */
  let endAt = t0 + 120_000;
  const running = (): boolean => Date.now() < endAt;
  const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

  const noteWrong = (what: string): void => {
    wrongCount++;
    if (wrong.length < 30) wrong.push(`t=${((Date.now() - t0) / 1000).toFixed(1)}s ${what}`);
    log(`WRONG ${what}`);
  };

  /** Every call goes through here: counted by method and code; UNAVAILABLE always noted. */
  const call = async <T = Record<string, any>>(kind: string, method: string, req: object, deadlineMs: number): Promise<CriAnswer<T>> => {
    const started = performance.now();
    const a = await o.client.call<T>(method, req, deadlineMs);
    const ms = performance.now() - started;
    maxLatencyMs[kind] = Math.max(maxLatencyMs[kind] ?? 0, Math.round(ms));
    calls++;
    const m = (byMethod[kind] ??= { calls: 0, ok: 0, byCode: {} });
    m.calls++;
    if (a.ok) m.ok++;
    else {
      m.byCode[String(a.code)] = (m.byCode[String(a.code)] ?? 0) + 1;
      if (a.code === UNAVAILABLE) unavailable++;
    }
    return a;
  };
  const execSync = (kind: string, containerId: string, cmd: string[], timeoutS: number): Promise<CriAnswer<{ exitCode: number; stdout: Buffer; stderr: Buffer }>> =>
    call(kind, 'ExecSync', { containerId, cmd, timeout: timeoutS }, RUNTIME_TIMEOUT_MS + timeoutS * 1000);
  /** A call that must succeed; a failure is noted and reported as false. */
  const must = async <T = Record<string, any>>(method: string, req: object, deadlineMs: number, what: string): Promise<CriAnswer<T> & { ok: true } | undefined> => {
    const a = await call<T>(method, method, req, deadlineMs);
    if (a.ok) return a;
    noteWrong(`${method} ${what}: ${describe(a as CriAnswer<Record<string, any>>)}`);
    return undefined;
  };

  const publish = (): void => o.onPods?.(pods.filter((p) => p.containerId && !p.stopped).map((p) => podSpec(p, o.namespace)));

  // kubelet's SyncPod for a new pod: sandbox, its status (for the IPs), container, start.
  const startPod = async (p: Pod): Promise<boolean> => {
    const labels = { 'io.kubernetes.pod.uid': p.uid, 'io.kubernetes.pod.name': p.name, 'io.kubernetes.pod.namespace': o.namespace };
    const sandboxConfig = {
      metadata: { name: p.name, uid: p.uid, namespace: o.namespace, attempt: 0 },
      hostname: p.name,
      labels,
      annotations: { 'kubernetes.io/config.source': 'api' },
      linux: {
        cgroupParent: kubeletCgroupParent(o.cgroupPrefix, p.uid, 'besteffort'),
        securityContext: { namespaceOptions: { network: 'POD', pid: 'CONTAINER', ipc: 'POD' } },
      },
    };
    const sb = await must<{ podSandboxId: string }>('RunPodSandbox', { config: sandboxConfig, runtimeHandler: '' }, 2 * RUNTIME_TIMEOUT_MS, p.name);
    if (!sb) return false;
    p.sandboxId = sb.msg.podSandboxId;
    const st = await must<{ status: { network: { ip: string; additionalIps: { ip: string }[] } | null } | null }>('PodSandboxStatus', { podSandboxId: p.sandboxId }, RUNTIME_TIMEOUT_MS, p.name);
    if (!st) return false;
    const net = st.msg.status?.network;
    p.ips = [net?.ip ?? '', ...(net?.additionalIps ?? []).map((a) => a.ip)].filter(Boolean);
    const created = await must<{ containerId: string }>('CreateContainer', {
      podSandboxId: p.sandboxId,
      config: {
        metadata: { name: 'app', attempt: 0 },
        image: { image: BUSYBOX_IMAGE_REF },
        command: ['/bin/busybox', 'httpd', '-f', '-p', String(PORT), '-h', '/etc'],
        labels: { ...labels, 'io.kubernetes.container.name': 'app' },
      },
      sandboxConfig,
    }, RUNTIME_TIMEOUT_MS, p.name);
    if (!created) return false;
    p.containerId = created.msg.containerId;
    if (!(await must('StartContainer', { containerId: p.containerId }, RUNTIME_TIMEOUT_MS, p.name))) return false;
    publish();
    // The startup gate: kubelet's startup probe until it succeeds (failures meanwhile are right answers).
    const gateEnd = Date.now() + 30_000;
    for (;;) {
      let last: string;
      if (o.probes === 'shim') {
        const a = await execSync('marker startup (gate)', p.containerId, startupCmd, PROBE_TIMEOUT_S);
        if (a.ok && a.msg.exitCode === 0) break;
        if (!a.ok && a.code === UNAVAILABLE) noteWrong(`startup probe of ${p.name}: ${describe(a)}`);
        last = describe(a);
      } else {
        const a = await kubeletHttpGet(p.ips.find((ip) => !ip.includes(':')) ?? '', GOOD_PATH, PROBE_TIMEOUT_S * 1000);
        if (a.success) break;
        last = a.detail;
      }
      if (Date.now() > gateEnd) {
        noteWrong(`startup probe of ${p.name} never succeeded in 30 s: last ${last}`);
        return false;
      }
      await sleep(200);
    }
    podsStarted++;
    return true;
  };

  /** kubelet's probe worker: a tick every period, the next only after the probe returned. */
  const probeWorker = async (p: Pod, kind: 'readiness' | 'liveness'): Promise<void> => {
    await sleep(Math.random() * 1000);
    while (running() && !p.stopped) {
      const started = Date.now();
      const expectFailure = kind === 'readiness' && p.readinessFails;
      let right: boolean;
      let detail: string;
      if (o.probes === 'shim') {
        const a = await execSync(`marker ${kind}`, p.containerId!, kind === 'readiness' ? readinessCmd(p) : livenessCmd, PROBE_TIMEOUT_S);
        right = a.ok && a.msg.exitCode === (expectFailure ? FAILURE_EXIT_CODE : 0);
        detail = describe(a);
      } else {
        const ip = p.ips.find((x) => !x.includes(':')) ?? '';
        const a = kind === 'readiness' ? await kubeletHttpGet(ip, p.readinessFails ? MISSING_PATH : GOOD_PATH, PROBE_TIMEOUT_S * 1000) : await kubeletTcp(ip, PROBE_TIMEOUT_S * 1000);
        right = a.success !== expectFailure;
        detail = a.detail;
      }
      if (right) {
        probes.right++;
        if (expectFailure) probes.expectedFailures++;
      } else {
        probes.wrong++;
        noteWrong(`${kind} probe of ${p.name} (${p.containerId!.slice(0, 12)}, want ${expectFailure ? 'a failure' : 'success'}): ${detail}`);
      }
      await sleep(Math.max(0, 1000 - (Date.now() - started)));
    }
  };

  /** An ordinary exec probe every 8 s, alternating a command with output and one with an exit code. */
  const execWorker = async (p: Pod): Promise<void> => {
    await sleep(Math.random() * 8000);
    for (let i = 0; running() && !p.stopped; i++) {
      const started = Date.now();
      const echo = i % 2 === 0;
      const a = await execSync('plain exec', p.containerId!, echo ? ['/bin/echo', p.name] : ['/bin/sh', '-c', 'exit 3'], 5);
      const right = a.ok && (echo ? a.msg.exitCode === 0 && a.msg.stdout.toString() === `${p.name}\n` : a.msg.exitCode === 3);
      if (right) plainExecs.right++;
      else {
        plainExecs.wrong++;
        noteWrong(`plain exec in ${p.name}: ${describe(a)}`);
      }
      await sleep(Math.max(0, 8000 - (Date.now() - started)));
    }
  };

  /** kubelet's PLEG relist. */
  const relist = async (): Promise<void> => {
    while (running()) {
      const started = Date.now();
      await Promise.all([must('ListPodSandbox', {}, RUNTIME_TIMEOUT_MS, 'relist'), must('ListContainers', {}, RUNTIME_TIMEOUT_MS, 'relist')]);
      await sleep(Math.max(0, 1000 - (Date.now() - started)));
    }
  };

  const newPod = async (): Promise<void> => {
    const index = nextIndex++;
    const p: Pod = { index, uid: randomUUID(), name: `${o.namespace}-${index}`, ips: [], readinessFails: index % 4 === 3, stopped: false, workers: [] };
    pods.push(p);
    if (!(await startPod(p))) {
      p.stopped = true;
      return;
    }
    p.workers.push(probeWorker(p, 'readiness'), probeWorker(p, 'liveness'), execWorker(p));
  };

  // kubelet's pod deletion: probes stop first, then the container and the sandbox are stopped and removed.
  const killPod = async (p: Pod): Promise<void> => {
    p.stopped = true;
    publish();
    await Promise.all(p.workers);
    if (p.containerId) await must('StopContainer', { containerId: p.containerId, timeout: 0 }, RUNTIME_TIMEOUT_MS, p.name);
    if (p.sandboxId) await must('StopPodSandbox', { podSandboxId: p.sandboxId }, RUNTIME_TIMEOUT_MS, p.name);
    if (p.containerId) await must('RemoveContainer', { containerId: p.containerId }, RUNTIME_TIMEOUT_MS, p.name);
    if (p.sandboxId) await must('RemovePodSandbox', { podSandboxId: p.sandboxId }, RUNTIME_TIMEOUT_MS, p.name);
  };

  const churn = async (): Promise<void> => {
    while (running()) {
      await sleep(o.replaceEverySeconds * 1000);
      if (!running()) break;
      const going = pods.filter((p) => !p.stopped).slice(0, o.replacePods);
      await Promise.all(going.map(async (p) => {
        await killPod(p);
        pods.splice(pods.indexOf(p), 1);
        await newPod();
        replaced++;
      }));
    }
  };

  const relisting = relist();
  // The first pods four at a time, as a node taking on pods; probes start as each one is up.
  for (let i = 0; i < o.pods && running(); i += 4) await Promise.all(Array.from({ length: Math.min(4, o.pods - i) }, () => newPod()));
  if (podsStarted === 0) {
    await relisting;
    throw new Error(`no pod started; first wrong answers: ${wrong.join(' | ')}`);
  }
  const upAfter = Date.now() - t0;
  log(`${podsStarted} pods up after ${(upAfter / 1000).toFixed(1)} s`);
  endAt = Date.now() + o.seconds * 1000;
  await Promise.all([churn(), relisting]);
  // The end: every pod deleted as kubelet deletes them (these calls are judged too).
  await Promise.all(pods.map((p) => killPod(p)));
  publish();
  return {
    seconds: Math.round((Date.now() - t0) / 100) / 10,
    firstPodsUpSeconds: Math.round(upAfter / 100) / 10,
    podsStarted, replaced, calls, unavailable, byMethod, probes, plainExecs, wrongCount, wrong, maxLatencyMs,
  };
}

/** The result in a few lines, for assertion messages and the test's log. */
export function formatChurn(label: string, r: ChurnResult): string {
  const methods = Object.entries(r.byMethod)
    .map(([m, c]) => `${m} ${c.ok}/${c.calls}${Object.keys(c.byCode).length ? ` (failed: ${Object.entries(c.byCode).map(([code, n]) => `code ${code} ×${n}`).join(', ')})` : ''}`)
    .join('; ');
  return [
    `${label}: ${r.seconds} s (first pods up after ${r.firstPodsUpSeconds} s), ${r.podsStarted} pods started, ${r.replaced} replaced, ${r.calls} calls, ${r.unavailable} UNAVAILABLE, ${r.wrongCount} wrong`,
    `  probes ${r.probes.right} right (${r.probes.expectedFailures} of them expected failures) / ${r.probes.wrong} wrong; plain execs ${r.plainExecs.right} right / ${r.plainExecs.wrong} wrong`,
    `  per call: ${methods}`,
    `  slowest (ms): ${Object.entries(r.maxLatencyMs).map(([k, v]) => `${k} ${v}`).join(', ')}`,
    ...r.wrong.map((w) => `  wrong: ${w}`),
  ].join('\n');
}
