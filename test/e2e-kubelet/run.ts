/**
 * `make e2e-kubelet KUBELET=/path/to/kubelet`: a real kubelet, which the user provides, runs
 * standalone (static pods, no API server) with `probe-agent shim` as its runtime endpoint in front of
 * the lab's private runtime (RUNTIME=containerd with CONTAINERD_BIN, or RUNTIME=crio with CRIO_BIN:
 * test/lab/runtime-lab.ts), the agent reading that kubelet's own /pods (readOnlyPort), and the
 * node->pod path dropped with nftables. The pods (pods.ts) are rewritten by `probe-agent rewrite`.
 * It checks what an operator needs before switching a node pool to this kubelet version: kubelet
 * starts through the shim, readiness on a numeric and a named port comes as fast as kubelet's own
 * exec readiness, a TCP liveness keeps its pod, a 404 liveness restarts its container, postStart and
 * preStop hooks reach the pod, and a kubelet restart mid-run kills no pod. It reads kubelet's
 * /metrics/probes and the containers' restart counts, prints a pass/fail table (exit 0 when all
 * pass, 1 otherwise), puts back the sysctls kubelet changes and removes everything it created.
 * Then issue 25's cases (cases.ts: a sidecar, a sleep preStop, ExecProbeTimeout off) and the churn
 * phase (churn.ts, issue 24), which replaces pods for E2E_CHURN_SECONDS under a frame tap between the
 * shim and containerd (frame-tap.ts), and the rollout phase (rollout.ts, issue 31), which restarts
 * the agent twice while slow postStart hooks run. E2E_PHASES picks phases; the others print SKIP.
 * Any kubelet from 1.26 on: `kubelet --version` decides whether the runtime endpoints go in flags
 * (< 1.27) or in the config file (1.27 on; some builds have no flags for them), and the version heads
 * the table. Root only; not part of `make test` (no kubelet is built or fetched here).
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import path from 'node:path';
import { importBusyboxImage } from '../lab/busybox-image.ts';
import type { RuntimeLab } from '../lab/containerd.ts';
import { createRuntimeLab, describeRuntime, runtimeChoice } from '../lab/runtime-lab.ts';
import { slotLayout } from '../lab/containerd-sweep.ts';
import { connectFromNode } from '../lab/net.ts';
import { encodeShimCommand } from '../../agent/contract/shim-command.ts';
import { builtCli, builtEntry } from '../support/built-cli.ts';
import { agentDaemonSetEnv, shimUnitEnv, shimUnitNodeFlags } from '../soak/shim-soak.ts';
import { KubeletCri } from '../support/kubelet-cri.ts';
import { runExecTimeoutGate, runSidecar, runSleepHook } from './cases.ts';
import { REPLACE_EVERY_MS, runChurn } from './churn.ts';
import { runRollout } from './rollout.ts';
import { startFrameTap, type FrameTap } from './frame-tap.ts';
import { keepKubeletSysctls, Kubelet, kubeletInfo } from './kubelet.ts';
import {
  binaryFromArgs, check, Cleanups, checks, Daemon, freePort, skip, httpGet, klogTime, NODE_NAME, podLogFiles, podsOf, proberSeries, proberTotals, readdirSafe, safeRead, say, startLogged,
  stopChild, tail, total, unmountUnder, runHarness, waitFor, type PodView,
} from './lib.ts';
import { runBench } from './bench.ts';
import { churnControlPod, churnPod, e2ePods, HTTP_PORT, PODS } from './pods.ts';
import { placePod, removePods, rewritePod, type PhaseContext } from './static-pods.ts';

/** deploy/base's terminationGracePeriodSeconds for the agent: a rollout's SIGKILL comes after it. */
const AGENT_GRACE_MS = 30_000;

/** bin/probe-agent, set by main() once dist/ is known to be a build of the current sources. */
let CLI = '';
/** Named after the containerd lab slot: its subnet is that slot's, and reset-lab-state.sh removes a dead slot's table. */
let NFT_TABLE = '';

const cleanups = new Cleanups('e2e-kubelet');
/** Set once known, for the table's heading. */
let kubeletLine = '';

function usage(msg: string): never {
  console.error(`e2e-kubelet: ${msg}\nusage: make e2e-kubelet KUBELET=/path/to/kubelet   (or: node test/e2e-kubelet/run.ts --kubelet PATH)`);
  process.exit(2);
}

async function main(): Promise<number> {
  if (process.getuid?.() !== 0) usage('must run as root (it starts kubelet, containerd and nftables rules)');
  const kubeletBin = binaryFromArgs('--kubelet', 'KUBELET', usage);
  try {
    CLI = builtCli();
  } catch (err) {
    usage((err as Error).message);
  }
  const choice = runtimeChoice();
  if ('error' in choice) usage(choice.error);
  const info = kubeletInfo(kubeletBin);
  kubeletLine = `kubelet ${info.version} (${kubeletBin}); runtime endpoints: ${info.how}`;
  say(kubeletLine);

  const scratch = mkdtempSync('/run/probe-agent-e2e-kubelet-');
  cleanups.push(() => {
    if (process.env['E2E_KEEP_LOGS'] === '1') {
      const keep = `/tmp/e2e-kubelet-logs-${Date.now()}`;
      mkdirSync(keep);
      for (const f of readdirSafe(scratch).filter((x) => x.endsWith('.log') || x.endsWith('.json') || x.endsWith('.yaml'))) execFileSync('cp', [path.join(scratch, f), keep]);
      console.log(`logs kept in ${keep}`);
    }
    rmSync(scratch, { recursive: true, force: true });
  });
  const manifests = path.join(scratch, 'manifests');
  const kubeletRoot = path.join(scratch, 'kubelet');
  mkdirSync(manifests);
  mkdirSync(kubeletRoot);
  cleanups.push(() => unmountUnder(kubeletRoot));

  cleanups.push(keepKubeletSysctls());

  say(`starting the lab ${choice.kind} (CNI bridge, pause and busybox images)`);
  const ctrd: RuntimeLab = await createRuntimeLab(choice);
  cleanups.push(() => ctrd.destroy());
  cleanups.push(() => {
    if (process.env['E2E_KEEP_LOGS'] === '1') execFileSync('cp', [ctrd.logFile, scratch]);
  });
  importBusyboxImage(ctrd);
  kubeletLine += `; runtime ${await describeRuntime(ctrd, choice)}`;
  say(kubeletLine);
  const lay = slotLayout(ctrd.slot);

  // The node->pod path closed: nothing on the node may open a TCP connection to a pod. A table left
  // by a killed run on this slot is replaced, never added to.
  NFT_TABLE = `pa_e2e_kubelet_${ctrd.slot}`;
  const nodePath = (open: boolean): void => {
    spawnSync('nft', ['delete', 'table', 'inet', NFT_TABLE]);
    if (open) return;
    execFileSync('nft', ['-f', '-'], { input: `table inet ${NFT_TABLE} {\n  chain output {\n    type filter hook output priority 0; policy accept;\n    ip daddr ${lay.subnet4} meta l4proto tcp counter drop\n    ip6 daddr ${lay.subnet6} meta l4proto tcp counter drop\n  }\n}\n` });
  };
  nodePath(false);
  cleanups.push(() => nodePath(true));

  const [port, roPort, healthzPort, shimMetricsPort, agentMetricsPort] = [await freePort(), await freePort(), await freePort(), await freePort(), await freePort()];
  const probeSocket = path.join(scratch, 'probe.sock');
  const shimSocket = path.join(scratch, 'cri.sock');

  // The shim reaches containerd through a frame tap (frame-tap.ts) that counts the GOAWAYs
  // containerd sends it, which containerd does not log; E2E_FRAME_TAP=0 connects it directly.
  let tap: FrameTap | undefined;
  let shimRuntime = ctrd.endpoint;
  if (process.env['E2E_FRAME_TAP'] !== '0') {
    tap = await startFrameTap(path.join(scratch, 'tap.sock'), ctrd.socket);
    const t = tap;
    cleanups.push(() => t.close());
    shimRuntime = `unix://${path.join(scratch, 'tap.sock')}`;
  }

  say('starting the agent (reading kubelet\'s /pods on the read-only port) and the shim');
  // A fixed metrics port: the rollout phase restarts the agent on the same flags, and the phases read its /metrics.
  // The heap cap the DaemonSet gives it: without it V8 sizes the heap from the machine's memory, and
  // the churn's RSS would measure that instead of the agent.
  const agent = new Daemon(CLI, ['run', `--kubelet-url=http://127.0.0.1:${roPort}`, '--kubelet-poll-interval=2s', `--cri-endpoint=${ctrd.endpoint}`,
    `--netns-dir=${ctrd.netnsDir}`, '--netns-resolvers=cri', `--socket=${probeSocket}`, `--metrics-address=127.0.0.1:${agentMetricsPort}`, `--node-name=${NODE_NAME}`],
  path.join(scratch, 'agent.log'), { ...agentDaemonSetEnv(), NODE_OPTIONS: [agentDaemonSetEnv()['NODE_OPTIONS'], ...extraFlags('E2E_AGENT_NODE_FLAGS')].join(' ') });
  cleanups.push(async () => {
    await agent.stop();
  });
  // Its counters on a loopback port of this run, not the default socket another shim on this machine may hold.
  // Started as its systemd unit starts it (the unit's node flags and environment, dist/shim/main.js): the churn measures that memory.
  const shim = startLogged(process.execPath, [...shimUnitNodeFlags(), ...extraFlags('E2E_SHIM_NODE_FLAGS'), builtEntry('shim/main.js'), '--listen', `unix://${shimSocket}`, '--runtime-endpoint', shimRuntime, '--probe-socket', probeSocket,
    '--metrics-socket=', `--metrics-listen=127.0.0.1:${shimMetricsPort}`], path.join(scratch, 'shim.log'), shimUnitEnv());
  cleanups.push(() => stopChild(shim));
  if (!(await waitFor('the agent socket and the shim socket', 20_000, () => (existsSync(probeSocket) && existsSync(shimSocket)) || undefined))) {
    check('agent and shim start', false, `see ${scratch}/agent.log, shim.log`);
    return 1;
  }

  // Pod logs in this run's own podLogsDir (1.29+; scratch goes at the end): a kubelet removes the
  // log directories of pods it does not know (its container GC), and a run's cleanup removes what it
  // added, so in a shared /var/log/pods concurrent runs delete each other's. Containerd shrugs that
  // off; CRI-O's conmon exits when kubelet then asks it to reopen the log, and every later status
  // of that container waits 5 s for an exit file nobody writes (docs/development.md).
  const podLogsDir = path.join(scratch, 'pod-logs');
  mkdirSync(podLogsDir);
  const podLogDirs = (): string[] => (existsSync('/var/log/pods') ? readdirSync('/var/log/pods').filter((d) => d.startsWith('default_') && d.includes(`-${NODE_NAME}_`)) : []);
  cleanups.push(() => {
    // Before 1.29 kubelet has no podLogsDir: this run's pods are under /var/log/pods.
    if (info.minor !== undefined && info.minor < 29) for (const d of podLogDirs()) rmSync(path.join('/var/log/pods', d), { recursive: true, force: true });
    if (existsSync('/var/log/containers')) {
      for (const f of readdirSync('/var/log/containers')) if (f.includes(`-${NODE_NAME}_default_`)) rmSync(path.join('/var/log/containers', f), { force: true });
    }
  });

  // As docs/closing-the-hole.md configures a node: the runtime through the shim, images direct.
  const kubelet = new Kubelet(info, {
    scratch, manifests, rootDir: kubeletRoot, port, roPort, healthzPort, runtimeEndpoint: `unix://${shimSocket}`, imageEndpoint: ctrd.endpoint, podLogsDir,
  }, info.minor === 29 ? { PodLifecycleSleepAction: true } : {}); // 1.29: the sleep action is alpha, off by default
  cleanups.push(() => kubelet.stop());
  const up = await kubelet.start('first');
  if (!check('kubelet starts with the shim as its runtime endpoint', up,
    up ? `${info.version} healthy, endpoints by ${info.how}` : `kubelet ${kubelet.exited ? `exited (${kubelet.proc?.exitCode})` : 'not healthy'}: ${tail(kubelet.log, /^(?:\S+ )?[EF]\d{4}|fail|RST_STREAM/i)}`)) {
    return 1;
  }

  const cri = new KubeletCri(ctrd.socket);
  cleanups.push(() => cri.close());
  const ctx: PhaseContext = { kubelet, manifests, scratch, cli: CLI, cri, shimMetricsPort, runtimeLog: ctrd.logFile, runtime: ctrd };
  const phases = selectedPhases();
  const unselected = `not in E2E_PHASES=${process.env['E2E_PHASES']}`;

  if (phases.has('base')) await basePhase(ctx, shimSocket, lay.subnet4, lay.subnet6);
  else skip('base phase (readiness, restart on 404, hooks, kubelet restart)', unselected);

  if (phases.has('cases')) {
    await runSidecar(ctx);
    await runSleepHook(ctx);
  } else skip('issue 25 cases (sidecar, sleep preStop)', unselected);

  if (phases.has('gate')) await runExecTimeoutGate(ctx);
  else skip('ExecProbeTimeout off', unselected);

  if (phases.has('rollout')) await runRollout({ ...ctx, agent, agentMetricsPort, shimLog: path.join(scratch, 'shim.log'), agentGraceMs: AGENT_GRACE_MS });
  else skip('rollout (agent restarted twice while postStart hooks run)', unselected);

  if (phases.has('churn')) {
    const seconds = Number(process.env['E2E_CHURN_SECONDS'] ?? 240);
    if (!(seconds >= REPLACE_EVERY_MS / 1000)) {
      skip('churn', `E2E_CHURN_SECONDS=${process.env['E2E_CHURN_SECONDS']}: less than one replacement round (${REPLACE_EVERY_MS / 1000} s)`);
    } else {
      // The churn starts from an empty node: its numbers are its own.
      const left = readdirSafe(manifests).filter((f) => f.endsWith('.json')).map((f) => f.replace(/\.json$/, ''));
      const gone = await removePods(ctx, left);
      check('churn: earlier pods gone first', gone, `${left.join(', ') || 'none'}: ${gone ? 'not in /pods, no container running' : 'still listed or running after 90 s'}`);
      // One rewrite for all churn pods: the rewrite does not depend on the name, and a node process
      // per pod would take the CPU the churn measures.
      const template = rewritePod(ctx, churnPod('churn-template'));
      const controlTemplate = rewritePod(ctx, churnControlPod('churn-ctl-template'));
      const named = (t: Record<string, unknown>, name: string): string => JSON.stringify({ ...t, metadata: { ...(t['metadata'] as object), name } });
      await runChurn({
        kubelet, manifests, cri, runtimeLog: ctx.runtimeLog, runtimeName: choice.kind === 'crio' ? 'CRI-O' : 'containerd', tap, seconds,
        manifest: (name) => named(template, name),
        controlManifest: (name) => named(controlTemplate, name),
        shimPid: shim.pid!, shimLog: path.join(scratch, 'shim.log'), shimMetricsPort, agentPid: () => agent.pid, agentMetricsPort,
      });
    }
  } else skip('churn', unselected);

  if (phases.has('bench')) {
    await runBench({
      ctx, kubeletPid: () => kubelet.proc?.pid, containerdPid: () => ctrd.pid, containerdSocket: ctrd.socket,
      shimPid: shim.pid!, agentPid: agent.pid!, nodePath,
    });
  }

  console.log('logs: E2E_KEEP_LOGS=1 keeps kubelet\'s, the agent\'s and the shim\'s logs and the manifests in /tmp');
  return checks.every((c) => c.outcome !== 'FAIL') ? 0 : 1;
}

/** The original checks: readiness, the hole closed, valueFrom headers, a 404 restart, hooks, a kubelet restart. */
async function basePhase(ctx: PhaseContext, shimSocket: string, subnet4: string, subnet6: string): Promise<void> {
  const { kubelet, cri } = ctx;
  const roPort = kubelet.setup.roPort;
  for (const p of e2ePods()) placePod(ctx, p);

  // The pods come up; readiness is timed from the container's start (CRI started_at) to kubelet's
  // "SyncLoop (probe)" readiness line.
  const all = [PODS.webNum, PODS.webNamed, PODS.webExec, PODS.hooks] as string[];
  // When kubelet does not log its probe lines, the first /pods answer showing the pod Ready times it (100 ms polls).
  const seenReady = new Map<string, number>();
  const ready = await waitFor('the pods to be Ready', 120_000, async () => {
    const pods = await podsOf(roPort);
    for (const p of pods) if (p.ready && !seenReady.has(p.name)) seenReady.set(p.name, Date.now());
    return all.every((n) => pods.find((p) => p.name === n)?.ready) ? pods : undefined;
  }, 100);
  const pods = ready ?? (await podsOf(roPort).catch(() => []));
  const readyLines = safeRead(kubelet.log).split('\n').filter((l) => l.includes('"SyncLoop (probe)"') && l.includes('probe="readiness"') && l.includes('status="ready"'));
  const readiness: Record<string, string> = {};
  for (const n of [PODS.webNum, PODS.webNamed, PODS.webExec]) {
    const p = pods.find((x) => x.name === n);
    const id = p?.containers[0]?.id.replace(/^[\w-]+:\/\//, '');
    const st = id ? await cri.call<{ status: { startedAt: string } }>('ContainerStatus', { containerId: id }) : undefined;
    const started = st?.ok ? Number(BigInt(st.msg.status.startedAt) / 1000n) / 1000 : undefined;
    const line = readyLines.find((l) => l.includes(`pod="default/${n}-${NODE_NAME}"`));
    const at = line ? klogTime(line) : seenReady.get(n);
    readiness[n] = started !== undefined && at !== undefined ? `${Math.round(at - started)} ms${line ? '' : ' (seen in /pods)'}`
      : `not measured (${!id ? 'no container ID in /pods' : started === undefined ? `ContainerStatus: ${st?.ok ? 'no startedAt' : st?.details}` : `no readiness time: ${line ? `kubelet line ${line.slice(0, 60)}` : 'never seen Ready'}`})`;
    check(`${n}: Ready`, p?.ready === true, `container start -> kubelet's readiness "ready": ${readiness[n]}`);
  }
  check('the node cannot reach the pods (hole closed)', await nodeCannotReach(pods, roPort), `nft table ${NFT_TABLE} drops node -> ${subnet4}, ${subnet6}`);

  // Header values from the pod's annotation as kubelet copied it onto the sandbox: kubelet's own
  // ExecSync for a rewrite that keeps values out of the command (valueFrom), sent through the shim.
  const named = pods.find((p) => p.name === PODS.webNamed)?.containers[0]?.id.replace(/^[\w-]+:\/\//, '');
  if (named) {
    const viaShim = new KubeletCri(shimSocket);
    const exec = (header: string) => viaShim.execSync(named, encodeShimCommand('readiness', { httpGet: { path: '/ready', port: HTTP_PORT, httpHeaders: [{ name: header, valueFrom: 'annotation' }] } }), 1);
    const ok = await exec('X-E2E');
    const miss = await exec('X-Other');
    viaShim.close();
    check('header value from the annotation on a kubelet-made sandbox', ok.ok && ok.msg.exitCode === 0 && !miss.ok && /recorded header at index 0 is "X-E2E"/.test(miss.details),
      `valueFrom X-E2E: ${ok.ok ? `exit ${ok.msg.exitCode}` : ok.details}; a name the record does not have: ${miss.ok ? `exit ${miss.msg.exitCode}` : miss.details.slice(0, 160)}`);
  }

  // 404 liveness: restarted by kubelet, with the HTTP prober's message.
  const restarted = await waitFor('crashy to be restarted', 60_000, async () => {
    const c = (await podsOf(roPort)).find((p) => p.name === PODS.crashy)?.containers[0];
    return c && c.restartCount >= 1 ? c.restartCount : undefined;
  }, 500);
  // At verbosity 1+ kubelet logs the prober's output (a kubelet whose main ignores the logging config does not).
  const failedLine = safeRead(kubelet.log).split('\n').find((l) => l.includes('"Probe failed"') && l.includes(`${PODS.crashy}-${NODE_NAME}`));
  check(`${PODS.crashy}: a 404 liveness restarts the container`, (restarted ?? 0) >= 1,
    `restartCount ${restarted ?? 0}; kubelet: ${(failedLine?.match(/output="[^"]*"/)?.[0] ?? 'no "Probe failed" line')}`);

  // postStart reached the server from inside the pod (busybox httpd logs each URL).
  const hooksPod = (await podsOf(roPort)).find((p) => p.name === PODS.hooks);
  const serverLogText = hooksPod ? podLogFiles(kubelet.podLogsRoot, hooksPod.uid, 'server').map(safeRead).join('') : '';
  const postStartFailed = safeRead(kubelet.log).includes('Failed to execute PostStartHook');
  check(`${PODS.hooks}: postStart httpGet runs in the pod`, /url:\/poststart/.test(serverLogText) && !postStartFailed && hooksPod?.ready === true,
    `${/url:\/poststart/.test(serverLogText) ? 'server logged GET /poststart' : 'no /poststart in the server log'}; ${postStartFailed ? 'kubelet: Failed to execute PostStartHook' : 'no hook failure'}`);

  // A kubelet restart mid-run: no pod is killed, nothing restarts, probes go on through the shim.
  const stable = [PODS.webNum, PODS.webNamed, PODS.webExec, PODS.hooks] as string[];
  const before = await podsOf(roPort);
  const idsBefore = new Map(stable.map((n) => [n, JSON.stringify(before.find((p) => p.name === n)?.containers.map((c) => [c.name, c.id, c.restartCount]).sort())]));
  const sandboxesBefore = await sandboxIDs(cri);
  const totalsBefore = await proberTotals(roPort);
  say('restarting kubelet');
  await kubelet.stop();
  const back = await kubelet.start('restarted');
  // Long enough for kubelet to re-admit the static pods, sync them and probe them many times.
  await new Promise((r) => setTimeout(r, 20_000));
  const after = await podsOf(roPort).catch(() => [] as PodView[]);
  const changed = stable.filter((n) => JSON.stringify(after.find((p) => p.name === n)?.containers.map((c) => [c.name, c.id, c.restartCount]).sort()) !== idsBefore.get(n));
  const sandboxesAfter = await sandboxIDs(cri);
  const goneSandboxes = [...sandboxesBefore].filter((s) => !sandboxesAfter.has(s) && !s.includes(PODS.crashy));
  const restartLog = safeRead(kubelet.log);
  const killed = restartLog.split('\n').filter((l) => /Killing container|Predicate failed|Failed to admit/.test(l) && !l.includes(PODS.crashy));
  check('kubelet restart: no pod killed, no container restarted', back === true && changed.length === 0 && goneSandboxes.length === 0 && killed.length === 0,
    back ? `containers changed: ${changed.join(', ') || 'none'}; sandboxes gone: ${goneSandboxes.length}; kubelet kill/admission lines: ${killed.length}` : 'kubelet did not come back');
  const totalsAfter = await proberTotals(roPort).catch(() => new Map<string, number>());
  const key = `${PODS.webNamed}/app Readiness successful`;
  check('probes go on through the shim after the restart', total(totalsAfter, key) > 0 && after.find((p) => p.name === PODS.webNamed)?.ready === true,
    `${key}: ${total(totalsBefore, key)} before the restart (old kubelet), ${total(totalsAfter, key)} since`);

  // preStop: kubelet ran crashy's preStop httpGet before each liveness kill; its server logged it.
  const crashyPod = (await podsOf(roPort)).find((p) => p.name === PODS.crashy);
  const crashyLogs = crashyPod ? podLogFiles(kubelet.podLogsRoot, crashyPod.uid, 'app').map(safeRead).join('') : '';
  const preStops = (crashyLogs.match(/url:\/prestop/g) ?? []).length;
  const preStopFailed = /PreStop hook failed|FailedPreStopHook/.test(safeRead(kubelet.log) + safeRead(path.join(ctx.scratch, 'kubelet-first.log')));
  check(`${PODS.crashy}: preStop httpGet runs in the pod before each kill`, preStops >= 1 && !preStopFailed,
    `${preStops} GET /prestop in the container's logs${preStopFailed ? '; kubelet: preStop failed' : ''}`);

  // kubelet's own counters, and the restart counts.
  const final = await proberTotals(roPort).catch(() => new Map<string, number>());
  const finalPods = await podsOf(roPort).catch(() => [] as PodView[]);
  const webNum = finalPods.find((p) => p.name === PODS.webNum)?.containers[0];
  check(`${PODS.webNum}: TCP liveness keeps the container`, webNum?.restartCount === 0 && total(final, `${PODS.webNum}/app Liveness successful`) > 0 && total(final, `${PODS.webNum}/app Liveness failed`) === 0,
    `restartCount ${webNum?.restartCount}; liveness successful ${total(final, `${PODS.webNum}/app Liveness successful`)}, failed ${total(final, `${PODS.webNum}/app Liveness failed`)}`);

  console.log('\nkubelet /metrics/probes prober_probe_total (pod/container type result: count):');
  for (const [k, v] of [...final].sort()) console.log(`  ${k}: ${v}`);
  // kubelet's own timing of each successful probe (prober_probe_duration_seconds): the shim's path for
  // the rewritten ones, runc's exec for web-exec.
  const sums = await proberSeries(roPort, 'prober_probe_duration_seconds_sum').catch(() => new Map<string, number>());
  const counts = await proberSeries(roPort, 'prober_probe_duration_seconds_count').catch(() => new Map<string, number>());
  if (sums.size > 0) {
    console.log('\nkubelet prober_probe_duration_seconds, mean of successful probes:');
    for (const [k, v] of [...sums].sort()) {
      const n = counts.get(k) ?? 0;
      if (n > 0) console.log(`  ${k}: ${((v / n) * 1000).toFixed(1)} ms over ${n}`);
    }
  }
  console.log('\nrestart counts:');
  for (const p of finalPods.sort((a, b) => a.name.localeCompare(b.name))) console.log(`  ${p.name}: ${p.containers.map((c) => `${c.name}=${c.restartCount}`).join(' ')}`);
  console.log(`\nreadiness, container start -> ready: ${Object.entries(readiness).map(([n, v]) => `${n} ${v}`).join('; ')}`);
}

/** Extra node flags for the agent or the shim (e.g. --heapsnapshot-signal=SIGUSR2), for finding a leak. */
function extraFlags(name: string): string[] {
  return (process.env[name] ?? '').split(/\s+/).filter(Boolean);
}

/** E2E_PHASES: a comma list of base, cases, gate, rollout, churn (default all); the others print SKIP rows. */
function selectedPhases(): Set<string> {
  // bench (make bench-kubelet) measures rather than checks: only when asked for.
  const all = ['base', 'cases', 'gate', 'rollout', 'churn', 'bench'];
  const v = process.env['E2E_PHASES'];
  if (!v) return new Set(all.filter((x) => x !== 'bench'));
  const want = v.split(',').map((x) => x.trim()).filter(Boolean);
  const bad = want.filter((x) => !all.includes(x));
  if (bad.length) usage(`E2E_PHASES: unknown phase ${bad.join(', ')} (want some of ${all.join(', ')})`);
  return new Set(want);
}

/** Every pod IP on HTTP_PORT, from the node: none may connect (the nftables drop holds). */
async function nodeCannotReach(_pods: PodView[], roPort: number): Promise<boolean> {
  const { body } = await httpGet(`http://127.0.0.1:${roPort}/pods`);
  const ips = ((JSON.parse(body) as { items?: any[] }).items ?? []).flatMap((p) => (p.status?.podIPs ?? []).map((x: any) => String(x.ip)));
  if (ips.length === 0) return false;
  for (const ip of ips) if ((await connectFromNode(ip, HTTP_PORT, 1000)).result === 'connected') return false;
  return true;
}

async function sandboxIDs(cri: KubeletCri): Promise<Set<string>> {
  const r = await cri.call<{ items: { id: string; state: string; metadata: { name: string } }[] }>('ListPodSandbox', {});
  return new Set(r.ok ? r.msg.items.filter((s) => s.state === 'SANDBOX_READY').map((s) => `${s.id} ${s.metadata.name}`) : []);
}


await runHarness('e2e-kubelet', main, cleanups, () => kubeletLine || 'kubelet: not started', 58);
