/**
 * `make e2e-critest CRITEST=/path/to/critest`: cri-tools' CRI conformance suite, which the user
 * provides (built from cri-tools v1.26 or later), run twice on the lab's private runtime (RUNTIME:
 * containerd or CRI-O, test/lab/runtime-lab.ts): once against it directly and once through
 * `probe-agent shim` (runtime and image endpoints both on the shim, no agent behind it: critest
 * sends no rewritten probe). The images critest pulls are
 * busybox-based stand-ins (stand-ins.ts) in Debian's docker-registry on loopback, reached through
 * the runtime's registry mirrors under their original names. The two JUnit reports are compared spec
 * by spec: exit 0 when every spec ended the same way (passed, failed or skipped) and the shim logged
 * no warn or error line, 1 otherwise; a table says the counts and any difference. Each run gets a
 * fresh runtime, so neither sees what the other left. Everything it starts or creates is removed
 * on exit, failure included. Root only; not part of `make test` (no critest is built or fetched here).
 */
import { spawnSync, type ChildProcess } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import path from 'node:path';
import type { RuntimeLab } from '../lab/containerd.ts';
import { createRuntimeLab, describeRuntime, runtimeChoice, type RuntimeChoice } from '../lab/runtime-lab.ts';
import { getUnix } from '../support/http-unix.ts';
import { builtCli } from '../support/built-cli.ts';
import { binaryFromArgs, Cleanups, freePort, readdirSafe, startLogged, stopChild } from '../e2e-kubelet/lib.ts';
import { compareRuns, countOutcomes, outcomeOf, parseJUnit, type SpecResult } from './junit.ts';
import { startRegistry } from './registry.ts';
import { buildStandIns, MIRRORED_REGISTRIES, pushStandIns } from './stand-ins.ts';

/** bin/probe-agent, set by main() once dist/ is known to be a build of the current sources. */
let CLI = '';

/**
 * Specs skipped in both runs (-ginkgo.skip), each for a reason of this lab, not of the shim. Every
 * other spec runs, those that fail on this machine included: they must fail the same way twice.
 */
const SKIPPED_SPECS: { pattern: string; why: string }[] = [
  {
    pattern: 'runtime should support port mapping with host port and container port',
    why: 'a hostPort needs the portmap CNI plugin (host NAT rules); the lab\'s CNI is a bridge that leaves the host\'s nftables alone',
  },
  {
    pattern: 'public image with digest should be pulled and removed',
    why: 'it pulls the real image by its manifest digest, which no stand-in can have',
  },
];

type Mode = 'direct' | 'shim';

interface RunResult {
  mode: Mode;
  specs: SpecResult[];
  exitCode: number | null;
  seconds: number;
  /** ginkgo's "Ran N of M Specs" line. */
  ranLine: string;
  /** The shim's warn/error (and non-JSON) log lines; empty for the direct run. */
  shimProblems: string[];
  /** probe_agent_shim_forwarded_total by method, and runtime errors (shim run only). */
  forwarded?: Map<string, number>;
  runtimeErrors?: number;
}

/** Set by SIGINT/SIGTERM: main stops before its next step while the cleanups run. */
let interrupted = false;
const cleanups = new Cleanups('e2e-critest', () => (interrupted = true));
let keepLogs = process.env['E2E_KEEP_LOGS'] === '1';

function say(msg: string): void {
  console.log(`[e2e-critest ${new Date().toISOString().slice(11, 23)}] ${msg}`);
}

function usage(msg: string): never {
  console.error(`e2e-critest: ${msg}\nusage: make e2e-critest CRITEST=/path/to/critest [RUNTIME=crio CRIO_BIN=/path/to/crio | CONTAINERD_BIN=/path/to/containerd]   (or: node test/e2e-critest/run.ts --critest PATH)`);
  process.exit(2);
}

function safeRead(f: string): string {
  try {
    return readFileSync(f, 'utf8');
  } catch {
    return '';
  }
}

/** The shim's log lines an operator would be alarmed by: warn/error/fatal, and anything not JSON. */
function shimProblems(log: string): string[] {
  return log.split('\n').filter((l) => {
    if (l.trim() === '') return false;
    try {
      const level = (JSON.parse(l) as { level?: unknown }).level;
      return level !== 'info' && level !== 'debug' && level !== 'trace';
    } catch {
      return true;
    }
  });
}

/** Starts the agent-less shim in front of `ctrd`; resolves once it logged "shim listening". */
async function startShim(scratch: string, ctrd: RuntimeLab): Promise<{ child: ChildProcess; socket: string; metrics: string; log: string }> {
  const socket = path.join(scratch, 'shim-cri.sock');
  const metrics = path.join(scratch, 'shim-metrics.sock');
  const log = path.join(scratch, 'shim.log');
  // Nothing listens on the probe socket: critest sends no rewritten probe, so the shim never dials it.
  const child = startLogged(CLI, ['shim', '--listen', `unix://${socket}`, '--runtime-endpoint', ctrd.endpoint,
    '--probe-socket', path.join(scratch, 'no-agent.sock'), '--metrics-socket', metrics], log);
  const end = Date.now() + 20_000;
  while (!safeRead(log).includes('"msg":"shim listening"')) {
    if (child.exitCode !== null) throw new Error(`the shim exited (${child.exitCode}): ${safeRead(log).slice(-1000)}`);
    if (Date.now() > end) throw new Error(`the shim did not start in 20 s: ${safeRead(log).slice(-1000)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  return { child, socket, metrics, log };
}

/**
 * ginkgo's skip and focus: SKIPPED_SPECS unless CRITEST_SKIP gives another regex ('' for none), and
 * CRITEST_FOCUS to run only some specs (both ways), e.g. again the one that ended differently.
 */
function ginkgoFilters(): { skip: string; focus: string } {
  const skip = process.env['CRITEST_SKIP'] ?? SKIPPED_SPECS.map((s) => s.pattern.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')).join('|');
  return { skip, focus: process.env['CRITEST_FOCUS'] ?? '' };
}

/** Runs critest against `endpoint`; resolves with its exit code (null when killed at the time limit). */
async function runCritest(critest: string, endpoint: string, junit: string, logFile: string, seed: number, timeoutMs: number): Promise<number | null> {
  const { skip, focus } = ginkgoFilters();
  const args = [`--runtime-endpoint=${endpoint}`, `--image-endpoint=${endpoint}`, `-ginkgo.junit-report=${junit}`,
    `-ginkgo.seed=${seed}`, '-ginkgo.no-color', ...(skip ? [`-ginkgo.skip=${skip}`] : []), ...(focus ? [`-ginkgo.focus=${focus}`] : [])];
  const child = startLogged(critest, args, logFile);
  cleanups.push(() => stopChild(child, 5000));
  const timer = setTimeout(() => {
    say(`critest ran past ${timeoutMs / 60_000} min: killing it`);
    try {
      process.kill(-child.pid!, 'SIGKILL');
    } catch {
      // gone
    }
  }, timeoutMs);
  const code = await new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
  clearTimeout(timer);
  return code;
}

/** System V shared memory segments: shmid -> size and attach count (/proc/sysvipc/shm). */
function shmSegments(): Map<string, { size: number; nattch: number }> {
  const out = new Map<string, { size: number; nattch: number }>();
  for (const l of safeRead('/proc/sysvipc/shm').split('\n').slice(1)) {
    const f = l.trim().split(/\s+/);
    if (f.length > 6) out.set(f[1]!, { size: Number(f[3]), nattch: Number(f[6]) });
  }
  return out;
}

/**
 * critest's HostIpc specs create a 1 MiB segment on the host (`ipcmk -M 1048576`) and never remove
 * it: remove the ones that appeared during the run and nothing has attached.
 */
function removeCritestSegments(before: Map<string, unknown>): number {
  let removed = 0;
  for (const [id, seg] of shmSegments()) {
    if (before.has(id) || seg.size !== 1048576 || seg.nattch !== 0) continue;
    if (spawnSync('ipcrm', ['-m', id]).status === 0) removed++;
  }
  return removed;
}

/** The runtime's name and version, for the table (set by the first run). */
let runtimeLine = '';

async function runOnce(mode: Mode, choice: RuntimeChoice, critest: string, scratch: string, mirrors: Record<string, string[]>, seed: number, timeoutMs: number): Promise<RunResult> {
  if (interrupted) throw new Error('interrupted');
  say(`${mode}: starting a fresh lab ${choice.kind}`);
  const ctrd = await createRuntimeLab(choice, { registryMirrors: mirrors });
  runtimeLine ||= await describeRuntime(ctrd, choice);
  let shim: Awaited<ReturnType<typeof startShim>> | undefined;
  try {
    if (mode === 'shim') shim = await startShim(scratch, ctrd);
    const endpoint = shim ? `unix://${shim.socket}` : ctrd.endpoint;
    const junit = path.join(scratch, `critest-${mode}.xml`);
    const logFile = path.join(scratch, `critest-${mode}.log`);
    say(`${mode}: critest against ${endpoint} (log ${logFile})`);
    const t0 = Date.now();
    const segments = shmSegments();
    cleanups.push(() => void removeCritestSegments(segments));
    const exitCode = await runCritest(critest, endpoint, junit, logFile, seed, timeoutMs);
    const seconds = (Date.now() - t0) / 1000;
    removeCritestSegments(segments);
    if (interrupted) throw new Error('interrupted');
    const log = safeRead(logFile);
    const ranLine = /^Ran \d+ of \d+ Specs.*$/m.exec(log)?.[0] ?? '(no "Ran N of M Specs" line)';
    say(`${mode}: critest exited ${exitCode ?? 'killed'} after ${seconds.toFixed(0)} s: ${ranLine}`);
    const specs = existsSync(junit) ? parseJUnit(readFileSync(junit, 'utf8')) : [];
    const result: RunResult = { mode, specs, exitCode, seconds, ranLine, shimProblems: [] };
    if (shim) {
      const metrics = await getUnix(shim.metrics, '/metrics').catch(() => ({ status: 0, body: '' }));
      result.forwarded = new Map([...metrics.body.matchAll(/^probe_agent_shim_forwarded_total\{method="(\w+)"\} (\d+)$/gm)].map((m) => [m[1]!, Number(m[2])]));
      result.runtimeErrors = Number(/^probe_agent_shim_runtime_errors_total (\d+)$/m.exec(metrics.body)?.[1] ?? NaN);
      await stopChild(shim.child);
      result.shimProblems = shimProblems(safeRead(shim.log));
    }
    return result;
  } finally {
    await stopChild(shim?.child);
    // The runtime's own log goes with the kept ones: a spec that hangs in the runtime shows there.
    if (existsSync(ctrd.logFile)) copyFileSync(ctrd.logFile, path.join(scratch, `${choice.kind}-${mode}.log`));
    await ctrd.destroy();
  }
}

function minutes(s: number): string {
  return `${Math.floor(s / 60)}m${String(Math.round(s % 60)).padStart(2, '0')}s`;
}

/** ginkgo's specs ([It]); the rest of a report are suite nodes ([BeforeSuite], ...), which can fail too. */
function isSpec(s: SpecResult): boolean {
  return s.name.startsWith('[It]');
}

function printReport(critest: string, seed: number, runs: RunResult[]): boolean {
  const [a, b] = runs as [RunResult, RunResult];
  const ca = countOutcomes(a.specs.filter(isSpec));
  const cb = countOutcomes(b.specs.filter(isSpec));
  const nodes = (r: RunResult): string => {
    const n = r.specs.filter((s) => !isSpec(s));
    return `${n.filter((s) => outcomeOf(s.status) === 'passed').length}/${n.length} passed`;
  };
  // Suite nodes are compared too: a failed BeforeSuite fails every spec after it.
  const diffs = compareRuns(a.specs, b.specs);
  const row = (label: string, x: string | number, y: string | number): void => console.log(`${label.padEnd(34)}${String(x).padStart(12)}${String(y).padStart(18)}`);
  console.log(`\ncritest ${critest}, ginkgo seed ${seed}, runtime ${runtimeLine}`);
  const { skip, focus } = ginkgoFilters();
  if (process.env['CRITEST_SKIP'] === undefined) console.log(`skipped in both runs (-ginkgo.skip):\n${SKIPPED_SPECS.map((s) => `  "${s.pattern}": ${s.why}`).join('\n')}`);
  else console.log(`-ginkgo.skip from CRITEST_SKIP: ${skip ? `"${skip}"` : 'none'}`);
  if (focus) console.log(`-ginkgo.focus from CRITEST_FOCUS: "${focus}"`);
  console.log('');
  row('', 'direct', 'through the shim');
  row('specs', ca.total, cb.total);
  row('  passed', ca.passed, cb.passed);
  row('  failed', ca.failed, cb.failed);
  row('  skipped', ca.skipped, cb.skipped);
  row('suite nodes (BeforeSuite, ...)', nodes(a), nodes(b));
  row('critest exit code', a.exitCode ?? 'killed', b.exitCode ?? 'killed');
  row('duration', minutes(a.seconds), minutes(b.seconds));
  row('shim warn/error log lines', '-', b.shimProblems.length);
  row('shim runtime errors (metric)', '-', b.runtimeErrors ?? '?');
  const fwd = [...(b.forwarded ?? new Map<string, number>())].sort((x, y) => y[1] - x[1]);
  row('CRI calls the shim relayed', '-', fwd.reduce((n, [, v]) => n + v, 0));
  if (fwd.length) console.log(`  by method: ${fwd.map(([m, v]) => `${m} ${v}`).join(', ')}`);

  const both = (o: string): SpecResult[] => a.specs.filter((s) => outcomeOf(s.status) === o && b.specs.some((t) => t.name === s.name && outcomeOf(t.status) === o));
  const ownSkips = both('skipped').filter((s) => !SKIPPED_SPECS.some((k) => s.name.includes(k.pattern)));
  // Listed when few: with CRITEST_FOCUS nearly every spec is skipped.
  if (ownSkips.length > 0 && ownSkips.length <= 10) console.log(`\nskipped by critest itself in both runs (${ownSkips.length}):\n${ownSkips.map((s) => `  ${s.name}${s.message && s.message !== 'skipped' ? ` (${s.message})` : ''}`).join('\n')}`);
  const failedBoth = both('failed');
  if (failedBoth.length) {
    console.log(`\nfailed in both runs (${failedBoth.length}):`);
    for (const s of failedBoth) {
      const t = b.specs.find((x) => x.name === s.name)!;
      console.log(`  ${s.name}\n      direct: ${s.message.slice(0, 200)}\n      shim:   ${t.message.slice(0, 200)}`);
    }
  }
  if (b.shimProblems.length) {
    console.log(`\nshim warn/error log lines (${b.shimProblems.length}, first 10):`);
    for (const l of b.shimProblems.slice(0, 10)) console.log(`  ${l.slice(0, 400)}`);
  }
  console.log(`\ndifferences (${diffs.length}):${diffs.length ? '' : ' none: every spec ended the same way'}`);
  for (const d of diffs) {
    const desc = (s: SpecResult | undefined): string => (s ? `${s.status}${s.message ? `: ${s.message.slice(0, 200)}` : ''}` : 'not in the report');
    console.log(`  ${d.name}\n      direct: ${desc(d.a)}\n      shim:   ${desc(d.b)}`);
  }
  const ok = ca.total > 0 && cb.total > 0 && diffs.length === 0 && b.shimProblems.length === 0 && a.exitCode !== null && b.exitCode !== null;
  console.log(`\ne2e-critest: ${ok ? 'PASS' : 'FAIL'}: ${cb.total} specs, ${diffs.length} ended differently, ${b.shimProblems.length} shim warn/error lines`);
  return ok;
}

async function main(): Promise<number> {
  if (process.getuid?.() !== 0) usage('must run as root (it starts a runtime and a registry)');
  const critest = binaryFromArgs('--critest', 'CRITEST', usage);
  const choice = runtimeChoice();
  if ('error' in choice) usage(choice.error);
  try {
    CLI = builtCli();
  } catch (err) {
    usage((err as Error).message);
  }
  const seed = Number(process.env['CRITEST_SEED'] ?? Math.floor(Math.random() * 100_000));
  const timeoutMs = Number(process.env['CRITEST_TIMEOUT_MIN'] ?? 40) * 60_000;
  const started = Date.now();
  say(`critest ${critest}, seed ${seed}`);

  const scratch = mkdtempSync('/run/probe-agent-e2e-critest-');
  cleanups.push(() => {
    if (keepLogs) {
      const keep = mkdtempSync('/tmp/e2e-critest-logs-');
      for (const f of readdirSafe(scratch).filter((x) => /\.(log|xml)$/.test(x))) copyFileSync(path.join(scratch, f), path.join(keep, f));
      if (existsSync(path.join(scratch, 'registry', 'registry.log'))) copyFileSync(path.join(scratch, 'registry', 'registry.log'), path.join(keep, 'registry.log'));
      console.log(`logs and JUnit reports kept in ${keep}`);
    }
    rmSync(scratch, { recursive: true, force: true });
  });

  say('building the stand-in images');
  const standIns = buildStandIns();
  if (interrupted) throw new Error('interrupted');
  const registryDir = path.join(scratch, 'registry');
  mkdirSync(registryDir);
  const registry = await startRegistry(registryDir, await freePort());
  cleanups.push(() => registry.stop());
  const pushed = pushStandIns(standIns, registry.address);
  say(`docker-registry on ${registry.address}: ${standIns.length} stand-ins pushed under ${pushed} names`);
  const mirrors = Object.fromEntries(MIRRORED_REGISTRIES.map((r) => [r, [`http://${registry.address}`]]));

  const runs: RunResult[] = [];
  for (const mode of ['direct', 'shim'] as const) runs.push(await runOnce(mode, choice, critest, scratch, mirrors, seed, timeoutMs));
  const ok = printReport(critest, seed, runs);
  say(`done in ${minutes((Date.now() - started) / 1000)}`);
  if (!ok) keepLogs = true;
  return ok ? 0 : 1;
}

let code = 1;
try {
  code = await main();
} catch (err) {
  keepLogs = true;
  console.error(`e2e-critest: ${(err as Error).stack ?? err}`);
} finally {
  await cleanups.run();
}
process.exit(code);
