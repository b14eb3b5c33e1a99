/**
 * `probe-agent run` as a child process for the scale curve and the profile: started with real
 * flags against the test kubelet, measured only from the outside (/proc and its /metrics), and
 * stopped with SIGTERM the way the DaemonSet is.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, openSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { freePort } from './blackbox.ts';
import { REPO } from './build.ts';
import { childrenOf, cmdlineOf, cpuOf, findChild, rssOf, treeCpuMs } from './procstat.ts';

/** How to start the agent. */
export interface AgentStartOptions {
  cli: string;
  kubeletUrl: string;
  resolver: 'procfs' | 'address';
  /** Scratch dir for the API socket. */
  dir: string;
  /** Extra node flags (e.g. --cpu-prof). */
  nodeFlags?: string[];
  /** The checkout whose launcher flags and DaemonSet env the agent gets (another revision's); default this tree. */
  root?: string;
}

/**
 * The node flags bin/probe-agent starts the agent with (e.g. a small young generation), read from
 * the script itself so the bench measures the memory the shipped launcher gives; [] if the line
 * cannot be found.
 */
export function launcherNodeFlags(root = REPO): string[] {
  const script = join(root, 'bin/probe-agent');
  try {
    const line = /^exec "\$node" (.*)"\$root\/dist\/cli\.js"/m.exec(readFileSync(script, 'utf8'))?.[1] ?? '';
    return line.split(/\s+/).filter((f) => /^--[a-z0-9-]+(=[^\s"'$]+)?$/.test(f));
  } catch {
    return [];
  }
}

/** The environment the DaemonSet gives the agent that changes its cost: V8's heap cap and glibc's malloc. */
const DEPLOYED_ENV = ['NODE_OPTIONS', 'MALLOC_ARENA_MAX', 'MALLOC_MMAP_THRESHOLD_'] as const;

/**
 * Those of DEPLOYED_ENV the DaemonSet sets (deploy/base/daemonset.yaml of the checkout `root`),
 * read from the manifest so the bench measures the memory a node sees; {} when
 * BENCH_DEPLOYED_ENV=0 or the manifest is missing.
 */
export function deployedEnv(root = REPO): Record<string, string> {
  if (process.env.BENCH_DEPLOYED_ENV === '0') return {};
  let text: string;
  try {
    text = readFileSync(join(root, 'deploy/base/daemonset.yaml'), 'utf8');
  } catch {
    return {};
  }
  const out: Record<string, string> = {};
  for (const m of text.matchAll(/- name: ([A-Z_]+)\s*\n\s*value: "?([^"\n]*)"?/g)) {
    if ((DEPLOYED_ENV as readonly string[]).includes(m[1] as string)) out[m[1] as string] = (m[2] as string).trim();
  }
  return out;
}

/** One sample of the agent's metrics. */
export type MetricSamples = Map<string, { labels: Record<string, string>; value: number }[]>;

/** A running agent. */
export interface AgentProcess {
  pid: number;
  metricsUrl: string;
  /** The resident netns helper (the agent's child), once it runs. */
  helperPid(): number | undefined;
  /** Agent + helper CPU in ms, children of both included (the helper's forks, the resolver's `ip` runs). */
  cpuMs(): { agent: number; helper: number };
  /** Agent + helper resident memory in MB, now and at peak. */
  rss(): { rssMB: number; peakMB: number; anonMB: number; fileMB: number };
  scrape(): Promise<MetricSamples>;
  /** SIGTERM, then SIGKILL after `graceMs`; resolves with the exit code. */
  stop(graceMs?: number): Promise<number | null>;
  readonly stderrTail: () => string;
}

/** Parses the Prometheus text format into samples by metric name (enough for our own output). */
export function parseMetrics(text: string): MetricSamples {
  const out: MetricSamples = new Map();
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels: Record<string, string> = {};
    for (const l of (m[3] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1] as string] = l[2] as string;
    const list = out.get(m[1] as string) ?? [];
    list.push({ labels, value: Number(m[4]) });
    out.set(m[1] as string, list);
  }
  return out;
}

/** Sum of a metric's samples whose labels match `where`. */
export function sumOf(samples: MetricSamples, name: string, where: (labels: Record<string, string>) => boolean = () => true): number {
  return (samples.get(name) ?? []).filter((s) => where(s.labels)).reduce((a, s) => a + s.value, 0);
}

/** An environment assignment among BENCH_NODE_FLAGS' words. */
const ENV_ASSIGNMENT = /^[A-Z_][A-Z0-9_]*=/;

/** Starts `probe-agent run` and waits until its metrics endpoint answers. */
export async function startAgent(opts: AgentStartOptions): Promise<AgentProcess> {
  const port = await freePort();
  // NAME=value words of BENCH_NODE_FLAGS set the agent's environment (e.g. the DaemonSet's MALLOC_ARENA_MAX=1).
  const benchNodeFlags = (process.env.BENCH_NODE_FLAGS ?? '').split(' ').filter(Boolean);
  const benchEnv = Object.fromEntries(benchNodeFlags.filter((f) => ENV_ASSIGNMENT.test(f)).map((f) => [f.slice(0, f.indexOf('=')), f.slice(f.indexOf('=') + 1)]));
  const metricsUrl = `http://127.0.0.1:${port}/metrics`;
  const args = [
    ...launcherNodeFlags(opts.root),
    ...(opts.nodeFlags ?? []),
    // BENCH_NODE_FLAGS: extra flags for trying a launcher change (later flags win in V8).
    ...benchNodeFlags.filter((f) => !ENV_ASSIGNMENT.test(f)),
    opts.cli,
    'run',
    `--kubelet-url=${opts.kubeletUrl}`,
    '--kubelet-token-file=',
    '--kubelet-poll-interval=5s',
    `--netns-resolvers=${opts.resolver}`,
    `--socket=${join(opts.dir, 'probe.sock')}`,
    `--metrics-address=127.0.0.1:${port}`,
    '--node-name=node-a',
    '--log-level=warn',
    // BENCH_AGENT_ARGS: extra daemon flags for a before/after of a flag or gate (e.g. --feature-gates=WarmNetnsHelper=true).
    ...(process.env.BENCH_AGENT_ARGS ?? '').split(' ').filter(Boolean),
  ];
  // BENCH_AGENT_STDOUT: a file for the agent's stdout (what V8's --trace-gc prints there).
  const stdoutFile = process.env.BENCH_AGENT_STDOUT ? openSync(process.env.BENCH_AGENT_STDOUT, 'a') : undefined;
  const child: ChildProcess = spawn(process.execPath, args, {
    stdio: ['ignore', stdoutFile ?? 'ignore', 'pipe'],
    cwd: REPO,
    env: { ...process.env, ...deployedEnv(opts.root), ...benchEnv, PROBE_AGENT_HELPER: join(REPO, 'netns-helper/build/probe-agent-netns-helper') },
  });
  if (stdoutFile !== undefined) closeSync(stdoutFile);
  let stderr = '';
  child.stderr?.on('data', (d: Buffer) => { stderr = (stderr + d.toString()).slice(-16_384); });
  const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
  const pid = child.pid as number;
  let helper: number | undefined;
  const helperPid = (): number | undefined => {
    if (helper !== undefined && cmdlineOf(helper).includes('--resident')) return helper;
    helper = findChild(pid, (argv) => argv.includes('--resident'));
    return helper;
  };
  const agent: AgentProcess = {
    pid,
    metricsUrl,
    helperPid,
    cpuMs() {
      const a = cpuOf(pid);
      const h = helperPid();
      // With its live children (the pool's workers), whose CPU its cutime shows only once they are reaped.
      return { agent: a.selfMs + a.childrenMs, helper: h ? treeCpuMs(h) : 0 };
    },
    rss() {
      const a = rssOf(pid);
      const h = helperPid();
      const hr = { rssMB: 0, peakMB: 0, anonMB: 0, fileMB: 0 };
      // The helper and its workers (each a small static process of its own).
      for (const p of h ? [h, ...childrenOf(h)] : []) {
        const r = rssOf(p);
        hr.rssMB += r.rssMB;
        hr.peakMB += r.peakMB;
        hr.anonMB += r.anonMB;
        hr.fileMB += r.fileMB;
      }
      return { rssMB: a.rssMB + hr.rssMB, peakMB: a.peakMB + hr.peakMB, anonMB: a.anonMB + hr.anonMB, fileMB: a.fileMB + hr.fileMB };
    },
    async scrape() {
      const res = await fetch(metricsUrl, { signal: AbortSignal.timeout(5000) });
      if (!res.ok) throw new Error(`${metricsUrl} answered ${res.status}`);
      return parseMetrics(await res.text());
    },
    async stop(graceMs = 15_000) {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), graceMs);
      const code = await exited;
      clearTimeout(timer);
      return code;
    },
    stderrTail: () => stderr,
  };
  const deadline = Date.now() + 30_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`probe-agent exited at start (${child.exitCode}): ${stderr.trim()}`);
    try {
      await agent.scrape();
      return agent;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) {
      await agent.stop(2000);
      throw new Error(`probe-agent metrics did not answer within 30 s: ${stderr.trim()}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}
