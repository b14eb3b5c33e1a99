/**
 * A real Prometheus (Debian's /usr/bin/prometheus) for tests: private config and data dir, loopback
 * only, a free port, started and stopped by pid. Reusable: point it at any scrape target.
 *
 * Prometheus 2.42 applies target updates on a hard-coded 5 s tick, so the first scrape lands ~5.5 s
 * after start whatever scrape_interval says: always poll with waitFor().
 */
import { spawn } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/** One scrape job. */
export interface ScrapeTarget {
  job: string;
  /** host:port; must be loopback (127.0.0.1 / [::1]). */
  address: string;
  /** Default /metrics. */
  path?: string;
  /** Target labels (static_configs labels), e.g. the `node` label the deploy monitors set. */
  labels?: Record<string, string>;
  /**
   * The scrape config's job_name when two targets share a `job` label (Prometheus wants unique
   * job names; the Prometheus Operator also names its jobs apart and sets `job` by relabeling).
   */
  jobName?: string;
  /** Copy the scrape path into a `metrics_path` label, as the deploy monitors do for /metrics/shim. */
  metricsPathLabel?: boolean;
}

/** Options for startPrometheus. */
export interface PrometheusOptions {
  targets: ScrapeTarget[];
  /** Default '1s'. */
  scrapeInterval?: string;
  /** Default /usr/bin/prometheus (env PROMETHEUS_BIN overrides). */
  binary?: string;
  /** How long to wait for /-/ready (default 20 s). */
  startTimeoutMs?: number;
}

/** One element of an instant-vector result. */
export interface Sample {
  metric: Record<string, string>;
  value: number;
}

/** A running Prometheus. */
export interface RunningPrometheus {
  pid: number;
  /** http://127.0.0.1:<port> */
  url: string;
  dataDir: string;
  /** Instant query; rejects on a PromQL error. */
  query(q: string): Promise<Sample[]>;
  /** Polls `q` until `pred` holds (default: non-empty), or rejects after timeoutMs (default 20 s) with diagnostics. */
  waitFor(q: string, pred?: (samples: Sample[]) => boolean, timeoutMs?: number): Promise<Sample[]>;
  /** Scrape health of each target, for diagnostics. */
  targets(): Promise<{ job: string; health: string; lastError: string }[]>;
  /** SIGTERM, SIGKILL after 5 s, then removes the data dir. Idempotent. */
  stop(): Promise<void>;
}

/** Starts Prometheus scraping `targets`; resolves once it answers /-/ready. */
export async function startPrometheus(opts: PrometheusOptions): Promise<RunningPrometheus> {
  for (const t of opts.targets) {
    if (!/^(127\.0\.0\.1|\[::1\]|localhost):\d{1,5}$/.test(t.address)) {
      throw new Error(`prometheus lab: target ${t.address} is not loopback; tests may only touch loopback`);
    }
  }
  const dir = await mkdtemp(join(tmpdir(), 'probe-agent-prom-'));
  const interval = opts.scrapeInterval ?? '1s';
  // JSON is YAML: no YAML emitter needed.
  const config = {
    global: { scrape_interval: interval, evaluation_interval: interval, scrape_timeout: interval },
    scrape_configs: opts.targets.map((t) => {
      const labels = { ...(t.jobName !== undefined ? { job: t.job } : {}), ...t.labels };
      return {
        job_name: t.jobName ?? t.job,
        metrics_path: t.path ?? '/metrics',
        static_configs: [{ targets: [t.address], ...(Object.keys(labels).length ? { labels } : {}) }],
        ...(t.metricsPathLabel ? { relabel_configs: [{ source_labels: ['__metrics_path__'], target_label: 'metrics_path' }] } : {}),
      };
    }),
  };
  await writeFile(join(dir, 'prometheus.yml'), JSON.stringify(config, null, 2));

  let lastErr: unknown;
  for (let attempt = 0; attempt < 3; attempt++) {
    const port = await freePort();
    try {
      return await launch(opts, dir, port);
    } catch (err) {
      lastErr = err; // most likely the port was taken between freePort() and bind: try another
    }
  }
  await rm(dir, { recursive: true, force: true });
  throw lastErr;
}

async function launch(opts: PrometheusOptions, dir: string, port: number): Promise<RunningPrometheus> {
  const binary = opts.binary ?? process.env.PROMETHEUS_BIN ?? '/usr/bin/prometheus';
  const url = `http://127.0.0.1:${port}`;
  const child = spawn(
    binary,
    [
      `--config.file=${join(dir, 'prometheus.yml')}`,
      `--storage.tsdb.path=${join(dir, 'data')}`,
      `--web.listen-address=127.0.0.1:${port}`,
      '--storage.tsdb.retention.time=1h',
      '--log.level=warn',
    ],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  );
  let stderr = '';
  child.stderr?.on('data', (chunk: Buffer) => {
    stderr = (stderr + chunk.toString()).slice(-4000);
  });
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  let spawnError: Error | undefined;
  child.once('error', (err) => {
    spawnError = err;
  });
  const killOnExit = () => child.kill('SIGKILL');
  process.once('exit', killOnExit);

  let stopped = false;
  const stop = async () => {
    if (stopped) return;
    stopped = true;
    process.off('exit', killOnExit);
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      const t = setTimeout(() => child.kill('SIGKILL'), 5000);
      await exited;
      clearTimeout(t);
    }
    await rm(dir, { recursive: true, force: true });
  };

  const deadline = Date.now() + (opts.startTimeoutMs ?? 20_000);
  for (;;) {
    if (spawnError || child.exitCode !== null || child.signalCode !== null) {
      stopped = true;
      process.off('exit', killOnExit);
      throw new Error(`prometheus exited before ready (${spawnError?.message ?? `code ${child.exitCode}`}): ${stderr.trim()}`);
    }
    if (await ready(url)) break;
    if (Date.now() > deadline) {
      await stop();
      throw new Error(`prometheus not ready after ${opts.startTimeoutMs ?? 20_000} ms: ${stderr.trim()}`);
    }
    await sleep(100);
  }

  const api = async <T>(path: string): Promise<T> => {
    const res = await fetch(`${url}${path}`, { signal: AbortSignal.timeout(5000) });
    const body = (await res.json()) as { status: string; data: T; error?: string };
    if (body.status !== 'success') throw new Error(`prometheus ${path}: ${body.error ?? res.status}`);
    return body.data;
  };
  const query = async (q: string): Promise<Sample[]> => {
    const data = await api<{ resultType: string; result: { metric: Record<string, string>; value: [number, string] }[] }>(
      `/api/v1/query?query=${encodeURIComponent(q)}`,
    );
    if (data.resultType !== 'vector') throw new Error(`query ${q}: expected a vector, got ${data.resultType}`);
    return data.result.map((r) => ({ metric: r.metric, value: Number(r.value[1]) }));
  };
  const targets = async () => {
    const data = await api<{ activeTargets: { labels: Record<string, string>; health: string; lastError: string }[] }>('/api/v1/targets');
    return data.activeTargets.map((t) => ({ job: t.labels.job ?? '', health: t.health, lastError: t.lastError }));
  };
  const waitFor = async (q: string, pred: (s: Sample[]) => boolean = (s) => s.length > 0, timeoutMs = 20_000) => {
    const until = Date.now() + timeoutMs;
    let last: Sample[] = [];
    for (;;) {
      last = await query(q);
      if (pred(last)) return last;
      if (Date.now() > until) {
        const health = await targets().catch((err: unknown) => String(err));
        throw new Error(`waitFor(${q}) timed out after ${timeoutMs} ms; last result ${JSON.stringify(last)}; targets ${JSON.stringify(health)}`);
      }
      await sleep(250);
    }
  };

  return { pid: child.pid as number, url, dataDir: dir, query, waitFor, targets, stop };
}

async function ready(url: string): Promise<boolean> {
  try {
    const res = await fetch(`${url}/-/ready`, { signal: AbortSignal.timeout(1000) });
    await res.arrayBuffer();
    return res.status === 200;
  } catch {
    return false;
  }
}

/** A port free on 127.0.0.1 right now (the kernel picks it; Prometheus binds it a moment later). */
function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const port = (srv.address() as { port: number }).port;
      srv.close(() => resolve(port));
    });
  });
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
