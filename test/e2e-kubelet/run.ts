/**
 * `make e2e-kubelet KUBELET=/path/to/kubelet`: a real kubelet, which the user provides, runs
 * standalone (static pods, no API server) with `probe-agent shim` as its runtime endpoint in front of
 * the lab's private containerd, the agent reading that kubelet's own /pods (readOnlyPort), and the
 * node->pod path dropped with nftables. The pods (pods.ts) are rewritten by `probe-agent rewrite`.
 * It checks what an operator needs before switching a node pool to this kubelet version: kubelet
 * starts through the shim, readiness on a numeric and a named port comes as fast as kubelet's own
 * exec readiness, a TCP liveness keeps its pod, a 404 liveness restarts its container, postStart and
 * preStop hooks reach the pod, and a kubelet restart mid-run kills no pod. It reads kubelet's
 * /metrics/probes and the containers' restart counts, prints a pass/fail table (exit 0 when all
 * pass, 1 otherwise), puts back the sysctls kubelet changes and removes everything it created.
 * Root only; not part of `make test` (no kubelet is built or fetched here).
 */
import { spawn, spawnSync, execFileSync, type ChildProcess } from 'node:child_process';
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, readdirSync, rmSync, writeFileSync, accessSync, constants } from 'node:fs';
import { createServer } from 'node:net';
import path from 'node:path';
import { importBusyboxImage } from '../lab/busybox-image.ts';
import { createContainerdLab, type ContainerdLab } from '../lab/containerd.ts';
import { slotLayout } from '../lab/containerd-sweep.ts';
import { connectFromNode } from '../lab/net.ts';
import { encodeShimCommand } from '../../agent/rewrite/shim-command.ts';
import { builtCli } from '../support/built-cli.ts';
import { KubeletCri } from '../support/kubelet-cri.ts';
import { e2ePods, HTTP_PORT, PODS } from './pods.ts';

/** bin/probe-agent, set by main() once dist/ is known to be a build of the current sources. */
let CLI = '';
const NODE_NAME = 'probe-agent-e2e';
const NFT_TABLE = 'probe_agent_e2e_kubelet';
/** What kubelet sets at start unless protectKernelDefaults (pkg/kubelet/cm/container_manager_linux.go). */
const KUBELET_SYSCTLS = ['vm.overcommit_memory', 'vm.panic_on_oom', 'kernel.panic', 'kernel.panic_on_oops', 'kernel.keys.root_maxkeys', 'kernel.keys.root_maxbytes'];

interface Check {
  name: string;
  ok: boolean;
  detail: string;
}

const checks: Check[] = [];
const cleanups: (() => void | Promise<void>)[] = [];

function check(name: string, ok: boolean, detail: string): boolean {
  checks.push({ name, ok, detail });
  console.log(`${ok ? 'PASS' : 'FAIL'}  ${name}: ${detail}`);
  return ok;
}

function say(msg: string): void {
  console.log(`[e2e-kubelet ${new Date().toISOString().slice(11, 23)}] ${msg}`);
}

function usage(msg: string): never {
  console.error(`e2e-kubelet: ${msg}\nusage: make e2e-kubelet KUBELET=/path/to/kubelet   (or: node test/e2e-kubelet/run.ts --kubelet PATH)`);
  process.exit(2);
}

function kubeletPathFromArgs(): string {
  const i = process.argv.indexOf('--kubelet');
  const p = i >= 0 ? process.argv[i + 1] : process.env['KUBELET'];
  if (!p) usage('no kubelet binary given');
  const abs = path.resolve(p);
  try {
    accessSync(abs, constants.X_OK);
  } catch {
    usage(`${abs} is not an executable file`);
  }
  return abs;
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

/** Polls `fn` until it gives a value; `false` gives up at once. */
async function waitFor<T>(what: string, timeoutMs: number, fn: () => Promise<T | undefined | false> | T | undefined | false, everyMs = 200): Promise<T | undefined> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    try {
      const v = await fn();
      if (v === false) return undefined;
      if (v !== undefined) return v;
    } catch {
      // not yet
    }
    if (Date.now() > end) {
      say(`gave up waiting for ${what} after ${timeoutMs / 1000} s`);
      return undefined;
    }
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

async function httpGet(url: string, timeoutMs = 3000): Promise<{ status: number; body: string }> {
  const res = await fetch(url, { signal: AbortSignal.timeout(timeoutMs) });
  return { status: res.status, body: await res.text() };
}

function sysctl(name: string): string | undefined {
  const r = spawnSync('sysctl', ['-n', name], { encoding: 'utf8' });
  return r.status === 0 ? r.stdout.trim() : undefined;
}

/** A child whose stdout+stderr go to a file; killed (group) by the cleanups. */
function startLogged(cmd: string, args: string[], logFile: string): ChildProcess {
  const fd = openSync(logFile, 'a');
  try {
    const child = spawn(cmd, args, { stdio: ['ignore', fd, fd], detached: true });
    return child;
  } finally {
    closeSync(fd);
  }
}

async function stopChild(child: ChildProcess | undefined, graceMs = 10_000): Promise<void> {
  if (!child?.pid || child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  try {
    process.kill(child.pid, 'SIGTERM');
  } catch {
    return;
  }
  const timer = setTimeout(() => {
    try {
      process.kill(-child.pid!, 'SIGKILL');
    } catch {
      // gone
    }
  }, graceMs);
  await exited;
  clearTimeout(timer);
}

/** klog's "I1124 20:04:55.831504" -> epoch ms (kubelet logs local time; this run is on one machine). */
function klogTime(line: string): number | undefined {
  const m = /^[IWEF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d{6})/.exec(line);
  if (!m) return undefined;
  const now = new Date();
  const d = new Date(now.getFullYear(), Number(m[1]) - 1, Number(m[2]), Number(m[3]), Number(m[4]), Number(m[5]), Number(m[6]) / 1000);
  return d.getTime() + (Number(m[6]) % 1000) / 1000;
}

interface PodView {
  name: string;
  uid: string;
  ready: boolean;
  containers: { name: string; id: string; ready: boolean; restartCount: number }[];
}

/** kubelet's /pods, reduced to what the checks read. */
async function podsOf(roPort: number): Promise<PodView[]> {
  const { body } = await httpGet(`http://127.0.0.1:${roPort}/pods`);
  const list = JSON.parse(body) as { items?: Record<string, any>[] };
  return (list.items ?? []).map((p) => ({
    name: String(p.metadata?.name ?? '').replace(`-${NODE_NAME}`, ''),
    uid: String(p.metadata?.uid ?? ''),
    ready: (p.status?.conditions ?? []).some((c: any) => c.type === 'Ready' && c.status === 'True'),
    containers: (p.status?.containerStatuses ?? []).map((c: any) => ({
      name: String(c.name), id: String(c.containerID ?? ''), ready: c.ready === true, restartCount: Number(c.restartCount ?? 0),
    })),
  }));
}

/** prober_probe_total from kubelet's /metrics/probes: "pod/container probe_type result" -> count. */
async function proberTotals(roPort: number): Promise<Map<string, number>> {
  return proberSeries(roPort, 'prober_probe_total');
}

/** One series of kubelet's /metrics/probes by "pod/container probe_type result" (result empty when the series has none). */
async function proberSeries(roPort: number, name: string): Promise<Map<string, number>> {
  const { body } = await httpGet(`http://127.0.0.1:${roPort}/metrics/probes`);
  const out = new Map<string, number>();
  for (const line of body.split('\n')) {
    if (!line.startsWith(`${name}{`)) continue;
    const labels = Object.fromEntries([...line.matchAll(/(\w+)="([^"]*)"/g)].map((m) => [m[1], m[2]]));
    const value = Number(line.slice(line.lastIndexOf(' ') + 1));
    const pod = String(labels['pod'] ?? '').replace(`-${NODE_NAME}`, '');
    out.set(`${pod}/${labels['container']} ${labels['probe_type']} ${labels['result'] ?? ''}`.trimEnd(), value);
  }
  return out;
}

function total(m: Map<string, number>, key: string): number {
  return m.get(key) ?? 0;
}

async function main(): Promise<number> {
  if (process.getuid?.() !== 0) usage('must run as root (it starts kubelet, containerd and nftables rules)');
  const kubeletBin = kubeletPathFromArgs();
  try {
    CLI = builtCli();
  } catch (err) {
    usage((err as Error).message);
  }
  say(`kubelet ${kubeletBin}`);

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

  // Sysctls kubelet changes at start: put back whatever they were.
  const saved = new Map(KUBELET_SYSCTLS.map((n) => [n, sysctl(n)] as const));
  cleanups.push(() => {
    for (const [n, v] of saved) if (v !== undefined && sysctl(n) !== v) spawnSync('sysctl', ['-q', '-w', `${n}=${v}`]);
  });

  say('starting the lab containerd (CNI bridge, pause and busybox images)');
  const ctrd: ContainerdLab = await createContainerdLab();
  cleanups.push(() => ctrd.destroy());
  importBusyboxImage(ctrd.socket);
  const lay = slotLayout(ctrd.slot);

  // The node->pod path closed: nothing on the node may open a TCP connection to a pod.
  execFileSync('nft', ['-f', '-'], { input: `table inet ${NFT_TABLE} {\n  chain output {\n    type filter hook output priority 0; policy accept;\n    ip daddr ${lay.subnet4} meta l4proto tcp counter drop\n    ip6 daddr ${lay.subnet6} meta l4proto tcp counter drop\n  }\n}\n` });
  cleanups.push(() => void spawnSync('nft', ['delete', 'table', 'inet', NFT_TABLE]));

  const [port, roPort, healthzPort] = [await freePort(), await freePort(), await freePort()];
  const probeSocket = path.join(scratch, 'probe.sock');
  const shimSocket = path.join(scratch, 'cri.sock');

  say('starting the agent (reading kubelet\'s /pods on the read-only port) and the shim');
  const agent = startLogged(CLI, ['run', `--kubelet-url=http://127.0.0.1:${roPort}`, '--kubelet-poll-interval=2s', `--cri-endpoint=${ctrd.endpoint}`,
    `--netns-dir=${ctrd.netnsDir}`, '--netns-resolvers=cri', `--socket=${probeSocket}`, '--metrics-address=127.0.0.1:0', `--node-name=${NODE_NAME}`], path.join(scratch, 'agent.log'));
  cleanups.push(() => stopChild(agent));
  const shim = startLogged(CLI, ['shim', '--listen', `unix://${shimSocket}`, '--runtime-endpoint', ctrd.endpoint, '--probe-socket', probeSocket], path.join(scratch, 'shim.log'));
  cleanups.push(() => stopChild(shim));
  if (!(await waitFor('the agent socket and the shim socket', 20_000, () => (existsSync(probeSocket) && existsSync(shimSocket)) || undefined))) {
    check('agent and shim start', false, `see ${scratch}/agent.log, shim.log`);
    return 1;
  }

  // The pods, rewritten as a user would: probe-agent rewrite.
  for (const p of e2ePods()) {
    const name = (p.metadata as { name: string }).name;
    const src = path.join(scratch, `${name}.json`);
    writeFileSync(src, JSON.stringify(p));
    const out = execFileSync(CLI, ['rewrite', '-f', src, '--output', 'json'], { encoding: 'utf8' });
    writeFileSync(path.join(manifests, `${name}.json`), out);
  }
  const podLogDirs = (): string[] => (existsSync('/var/log/pods') ? readdirSync('/var/log/pods').filter((d) => d.startsWith('default_') && d.includes(`-${NODE_NAME}_`)) : []);
  cleanups.push(() => {
    for (const d of podLogDirs()) rmSync(path.join('/var/log/pods', d), { recursive: true, force: true });
    if (existsSync('/var/log/containers')) {
      for (const f of readdirSync('/var/log/containers')) if (f.includes(`-${NODE_NAME}_default_`)) rmSync(path.join('/var/log/containers', f), { force: true });
    }
  });

  const config = path.join(scratch, 'kubelet-config.yaml');
  writeFileSync(config, [
    'apiVersion: kubelet.config.k8s.io/v1beta1',
    'kind: KubeletConfiguration',
    `staticPodPath: ${manifests}`,
    'fileCheckFrequency: 1s',
    'syncFrequency: 10s',
    'address: 127.0.0.1',
    `port: ${port}`,
    `readOnlyPort: ${roPort}`,
    'healthzBindAddress: 127.0.0.1',
    `healthzPort: ${healthzPort}`,
    'authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}',
    'authorization: {mode: AlwaysAllow}',
    'cgroupDriver: cgroupfs',
    'cgroupsPerQOS: false',
    'enforceNodeAllocatable: []',
    'failSwapOn: false',
    'evictionHard: {}',
    'makeIPTablesUtilChains: false',
    'localStorageCapacityIsolation: false',
    'serializeImagePulls: false',
    // kubelet's probe and sync lines ("SyncLoop (probe)", "Probe failed") are at verbosity 1-2.
    'logging: {verbosity: 2}',
    '',
  ].join('\n'));
  const kubeletArgs = [
    `--config=${config}`,
    // As docs/closing-the-hole.md configures a node: the runtime through the shim, images direct.
    `--container-runtime-endpoint=unix://${shimSocket}`,
    `--image-service-endpoint=${ctrd.endpoint}`,
    `--root-dir=${kubeletRoot}`,
    `--cert-dir=${path.join(scratch, 'pki')}`,
    `--hostname-override=${NODE_NAME}`,
    '--node-labels=probe-agent.io/shim=ready',
  ];
  let kubeletLog = path.join(scratch, 'kubelet.log');
  let kubelet = startLogged(kubeletBin, kubeletArgs, kubeletLog);
  cleanups.push(() => stopChild(kubelet, 15_000));
  // The read-only port's /healthz: up with the server that serves /pods (the healthz port is not started by every kubelet main).
  const healthy = async (): Promise<boolean | undefined> => (await httpGet(`http://127.0.0.1:${roPort}/healthz`, 1000)).status === 200 || undefined;
  const up = await waitFor('kubelet /healthz', 60_000, async () => (kubelet.exitCode !== null ? false : healthy()), 300);
  // A kubelet built with its own main may not answer --version; every kubelet logs its version at start.
  const kubeletVersion = /"Kubelet version" kubeletVersion="([^"]+)"/.exec(safeRead(kubeletLog))?.[1] ?? 'version not logged';
  if (!check('kubelet starts with the shim as its runtime endpoint', up === true && kubelet.exitCode === null,
    up ? `${kubeletVersion} healthy` : `kubelet ${kubelet.exitCode !== null ? `exited (${kubelet.exitCode})` : 'not healthy'}: ${tail(kubeletLog, /^[EF]\d{4}|fail|RST_STREAM/i)}`)) {
    return 1;
  }

  // The pods come up; readiness is timed from the container's start (CRI started_at) to kubelet's
  // "SyncLoop (probe)" readiness line.
  const cri = new KubeletCri(ctrd.socket);
  cleanups.push(() => cri.close());
  const all = [PODS.webNum, PODS.webNamed, PODS.webExec, PODS.hooks] as string[];
  // When kubelet does not log its probe lines, the first /pods answer showing the pod Ready times it (100 ms polls).
  const seenReady = new Map<string, number>();
  const ready = await waitFor('the pods to be Ready', 120_000, async () => {
    const pods = await podsOf(roPort);
    for (const p of pods) if (p.ready && !seenReady.has(p.name)) seenReady.set(p.name, Date.now());
    return all.every((n) => pods.find((p) => p.name === n)?.ready) ? pods : undefined;
  }, 100);
  const pods = ready ?? (await podsOf(roPort).catch(() => []));
  const readyLines = readFileSync(kubeletLog, 'utf8').split('\n').filter((l) => l.includes('"SyncLoop (probe)"') && l.includes('probe="readiness"') && l.includes('status="ready"'));
  const readiness: Record<string, string> = {};
  for (const n of [PODS.webNum, PODS.webNamed, PODS.webExec]) {
    const p = pods.find((x) => x.name === n);
    const id = p?.containers[0]?.id.replace(/^\w+:\/\//, '');
    const st = id ? await cri.call<{ status: { startedAt: string } }>('ContainerStatus', { containerId: id }) : undefined;
    const started = st?.ok ? Number(BigInt(st.msg.status.startedAt) / 1000n) / 1000 : undefined;
    const line = readyLines.find((l) => l.includes(`pod="default/${n}-${NODE_NAME}"`));
    const at = line ? klogTime(line) : seenReady.get(n);
    readiness[n] = started !== undefined && at !== undefined ? `${Math.round(at - started)} ms${line ? '' : ' (seen in /pods)'}` : 'not measured';
    check(`${n}: Ready`, p?.ready === true, `container start -> kubelet's readiness "ready": ${readiness[n]}`);
  }
  check('the node cannot reach the pods (hole closed)', await nodeCannotReach(pods, roPort), `nft table ${NFT_TABLE} drops node -> ${lay.subnet4}, ${lay.subnet6}`);

  // Header values from the pod's annotation as kubelet copied it onto the sandbox: kubelet's own
  // ExecSync for a rewrite that keeps values out of the command (valueFrom), sent through the shim.
  const named = pods.find((p) => p.name === PODS.webNamed)?.containers[0]?.id.replace(/^\w+:\/\//, '');
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
  const failedLine = readFileSync(kubeletLog, 'utf8').split('\n').find((l) => l.includes('"Probe failed"') && l.includes(`${PODS.crashy}-${NODE_NAME}`));
  check(`${PODS.crashy}: a 404 liveness restarts the container`, (restarted ?? 0) >= 1,
    `restartCount ${restarted ?? 0}; kubelet: ${(failedLine?.match(/output="[^"]*"/)?.[0] ?? 'no "Probe failed" line')}`);

  // postStart reached the server from inside the pod (busybox httpd logs each URL).
  const hooksPod = (await podsOf(roPort)).find((p) => p.name === PODS.hooks);
  const serverLogText = hooksPod ? podLogFiles(hooksPod.uid, 'server').map(safeRead).join('') : '';
  const postStartFailed = readFileSync(kubeletLog, 'utf8').includes('Failed to execute PostStartHook');
  check(`${PODS.hooks}: postStart httpGet runs in the pod`, /url:\/poststart/.test(serverLogText) && !postStartFailed && hooksPod?.ready === true,
    `${/url:\/poststart/.test(serverLogText) ? 'server logged GET /poststart' : 'no /poststart in the server log'}; ${postStartFailed ? 'kubelet: Failed to execute PostStartHook' : 'no hook failure'}`);

  // A kubelet restart mid-run: no pod is killed, nothing restarts, probes go on through the shim.
  const stable = [PODS.webNum, PODS.webNamed, PODS.webExec, PODS.hooks] as string[];
  const before = await podsOf(roPort);
  const idsBefore = new Map(stable.map((n) => [n, JSON.stringify(before.find((p) => p.name === n)?.containers.map((c) => [c.name, c.id, c.restartCount]).sort())]));
  const sandboxesBefore = await sandboxIDs(cri);
  const totalsBefore = await proberTotals(roPort);
  say('restarting kubelet');
  await stopChild(kubelet, 15_000);
  kubeletLog = path.join(scratch, 'kubelet-restarted.log');
  kubelet = startLogged(kubeletBin, kubeletArgs, kubeletLog);
  const back = await waitFor('kubelet /healthz after the restart', 60_000, healthy, 300);
  // Long enough for kubelet to re-admit the static pods, sync them and probe them many times.
  await new Promise((r) => setTimeout(r, 20_000));
  const after = await podsOf(roPort).catch(() => [] as PodView[]);
  const changed = stable.filter((n) => JSON.stringify(after.find((p) => p.name === n)?.containers.map((c) => [c.name, c.id, c.restartCount]).sort()) !== idsBefore.get(n));
  const sandboxesAfter = await sandboxIDs(cri);
  const goneSandboxes = [...sandboxesBefore].filter((s) => !sandboxesAfter.has(s) && !s.includes(PODS.crashy));
  const restartLog = safeRead(kubeletLog);
  const killed = restartLog.split('\n').filter((l) => /Killing container|Predicate failed|Failed to admit/.test(l) && !l.includes(PODS.crashy));
  check('kubelet restart: no pod killed, no container restarted', back === true && changed.length === 0 && goneSandboxes.length === 0 && killed.length === 0,
    back ? `containers changed: ${changed.join(', ') || 'none'}; sandboxes gone: ${goneSandboxes.length}; kubelet kill/admission lines: ${killed.length}` : 'kubelet did not come back');
  const totalsAfter = await proberTotals(roPort).catch(() => new Map<string, number>());
  const key = `${PODS.webNamed}/app Readiness successful`;
  check('probes go on through the shim after the restart', total(totalsAfter, key) > 0 && after.find((p) => p.name === PODS.webNamed)?.ready === true,
    `${key}: ${total(totalsBefore, key)} before the restart (old kubelet), ${total(totalsAfter, key)} since`);

  // preStop: kubelet ran crashy's preStop httpGet before each liveness kill; its server logged it.
  const crashyPod = (await podsOf(roPort)).find((p) => p.name === PODS.crashy);
  const crashyLogs = crashyPod ? podLogFiles(crashyPod.uid, 'app').map(safeRead).join('') : '';
  const preStops = (crashyLogs.match(/url:\/prestop/g) ?? []).length;
  const preStopFailed = /PreStop hook failed|FailedPreStopHook/.test(safeRead(kubeletLog) + safeRead(path.join(scratch, 'kubelet.log')));
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
  console.log('logs: E2E_KEEP_LOGS=1 keeps kubelet\'s, the agent\'s and the shim\'s logs and the manifests in /tmp');
  return checks.every((c) => c.ok) ? 0 : 1;
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

/** A container's log files, one per restart (kubelet's /var/log/pods/<ns>_<name>_<uid>/<container>/<n>.log). */
function podLogFiles(uid: string, container: string): string[] {
  const dir = readdirSafe('/var/log/pods').find((d) => d.endsWith(`_${uid}`));
  if (!dir) return [];
  const cdir = path.join('/var/log/pods', dir, container);
  return readdirSafe(cdir).filter((x) => x.endsWith('.log')).sort().map((f) => path.join(cdir, f));
}

function readdirSafe(d: string): string[] {
  try {
    return readdirSync(d);
  } catch {
    return [];
  }
}

function safeRead(f: string): string {
  try {
    return readFileSync(f, 'utf8');
  } catch {
    return '';
  }
}

/** The last few lines of a log that match `re`, for a failure's detail. */
function tail(file: string, re: RegExp): string {
  return safeRead(file).split('\n').filter((l) => re.test(l)).slice(-3).join(' | ').slice(0, 600) || '(nothing in the log)';
}

/** Kubelet may mount things under its root dir (volumes); unmount before removing it. */
function unmountUnder(dir: string): void {
  // kubelet bind-mounts its root dir onto itself, and volumes below it.
  const mounts = safeRead('/proc/mounts').split('\n').map((l) => l.split(' ')[1] ?? '').filter((m) => m === dir || m.startsWith(dir + '/'));
  for (const m of mounts.sort((a, b) => b.length - a.length)) spawnSync('umount', ['-l', m]);
}

async function runCleanups(): Promise<void> {
  while (cleanups.length) {
    const c = cleanups.pop()!;
    try {
      await c();
    } catch (err) {
      console.error(`e2e-kubelet: cleanup step failed: ${(err as Error).message}`);
    }
  }
}

let exiting = false;
for (const sig of ['SIGINT', 'SIGTERM'] as const) {
  process.on(sig, () => {
    if (exiting) return;
    exiting = true;
    console.error(`e2e-kubelet: ${sig}: cleaning up`);
    void runCleanups().finally(() => process.exit(130));
  });
}

let code = 1;
try {
  code = await main();
} catch (err) {
  console.error(`e2e-kubelet: ${(err as Error).stack ?? err}`);
} finally {
  exiting = true;
  await runCleanups();
}
console.log(`\n${'check'.padEnd(58)} result  detail`);
for (const c of checks) console.log(`${c.name.padEnd(58)} ${c.ok ? 'PASS' : 'FAIL'}    ${c.detail}`);
console.log(`\n${checks.filter((c) => c.ok).length}/${checks.length} passed`);
process.exit(code);
