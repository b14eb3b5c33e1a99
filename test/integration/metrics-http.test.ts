/**
 * The metrics/health listener end to end over real HTTP on loopback, fed by outcomes of the real
 * prober (agent/probe/run.ts with node-netns sockets) against servers this test runs, and checked
 * with `promtool check metrics`.
 */
import { spawnSync } from 'node:child_process';
import { createServer as createHttpServer, get as httpGet, type Server as HttpServer } from 'node:http';
import { connect, createServer as createTcpServer, type AddressInfo, type Server as TcpServer } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigError } from '../../agent/errors.ts';
import { FeatureGates } from '../../agent/featuregates.ts';
import { freshnessCheck, HealthRegistry } from '../../agent/metrics/health.ts';
import { DEFAULT_METRICS_ADDRESS, parseListenAddress, startMetricsServer, type MetricsServer } from '../../agent/metrics/http-server.ts';
import { createMetrics, type Metrics } from '../../agent/metrics/registry.ts';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { runProbe } from '../../agent/probe/run.ts';
import type { ProbeContext } from '../../agent/probe/types.ts';
import type { ProbeRunMeta } from '../../agent/scheduler/types.ts';

const PROMTOOL = '/usr/bin/promtool';

const sockets = new NodeSocketFactory();
const ctx: ProbeContext = {
  podIPs: ['127.0.0.1'],
  containerPorts: [],
  timeoutSeconds: 1,
  sockets,
  nodeSockets: sockets,
  kubeVersion: '1.34',
  hostFieldPolicy: 'refuse',
  happyEyeballs: false,
};
const tcpProbe = (port: number | string) => runProbe({ kind: 'tcp', port }, ctx);
const httpProbe = (port: number, path: string) => runProbe({ kind: 'http', port, path, scheme: 'HTTP', headers: [] }, ctx);

function meta(pod: string, probeType: ProbeRunMeta['key']['probeType'], protocol: ProbeRunMeta['protocol']): ProbeRunMeta {
  return { key: { podUID: `uid-${pod}`, containerName: 'app', probeType }, namespace: 'shop', podName: pod, protocol };
}

function sample(text: string, name: string, labels: Record<string, string>): number | undefined {
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue;
    if (Object.entries(labels).every(([k, v]) => line.includes(`${k}="${v}"`))) return Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return undefined;
}

/** Sends raw bytes and collects everything until the server closes (or 3 s). */
function raw(port: number, payload: string): Promise<{ text: string; closed: boolean }> {
  return new Promise((resolve) => {
    const sock = connect({ host: '127.0.0.1', port });
    let text = '';
    const timer = setTimeout(() => { sock.destroy(); resolve({ text, closed: false }); }, 3000);
    sock.on('data', (d) => { text += d.toString('latin1'); });
    sock.on('error', () => {});
    sock.once('close', () => { clearTimeout(timer); resolve({ text, closed: true }); });
    sock.write(payload);
  });
}

let tcp: TcpServer;
let http: HttpServer;
let tcpPort: number;
let httpPort: number;
let closedPort: number;
let metrics: Metrics;
let health: HealthRegistry;
let server: MetricsServer;
let helperHangs = false;
const runs = { liveTcp: 0, readyOk: 0, readyBad: 0, refused: 0, unresolved: 0 };
const web0Live = meta('web-0', 'Liveness', 'tcp');
const web0Ready = meta('web-0', 'Readiness', 'http');
const web1Ready = meta('web-1', 'Readiness', 'tcp');
const web2Startup = meta('web-2', 'Startup', 'tcp');

beforeAll(async () => {
  tcp = createTcpServer((s) => { s.on('error', () => {}); s.end(); });
  http = createHttpServer((req, res) => {
    res.writeHead(req.url === '/ok' ? 200 : 503, { 'Content-Type': 'text/plain' });
    res.end(req.url === '/ok' ? 'ok' : 'not ready');
  });
  await new Promise<void>((r) => tcp.listen(0, '127.0.0.1', r));
  await new Promise<void>((r) => http.listen(0, '127.0.0.1', r));
  tcpPort = (tcp.address() as AddressInfo).port;
  httpPort = (http.address() as AddressInfo).port;
  const gone = createTcpServer();
  await new Promise<void>((r) => gone.listen(0, '127.0.0.1', r));
  closedPort = (gone.address() as AddressInfo).port;
  await new Promise<void>((r) => gone.close(() => r()));

  metrics = createMetrics({ gates: new FeatureGates(), version: '0.1.0-test', apiVersion: 'v1alpha1' });
  health = new HealthRegistry();
  health.addReadiness('kubelet', freshnessCheck('kubelet poll', () => metrics.agent.kubeletLastSuccess(), 30));
  health.addReadiness('helper', (signal) => (helperHangs ? new Promise<void>((_, rej) => signal.addEventListener('abort', () => rej(signal.reason))) : undefined), { timeoutMs: 200 });
  server = await startMetricsServer({ address: '127.0.0.1:0', registry: metrics.registry, probesRegistry: metrics.probesRegistry, health });

  for (const w of [web0Live, web0Ready, web1Ready, web2Startup]) metrics.probeObserver.workerStarted(w);
  for (let i = 0; i < 3; i++) {
    const o = await tcpProbe(tcpPort);
    if (o.result === 'success') runs.liveTcp++;
    metrics.probeObserver.probeRun(web0Live, o);
  }
  // Two answered GETs and one to a closed port (an HTTP failure with reason 'refused').
  for (const port of [httpPort, httpPort, closedPort]) {
    const o = await httpProbe(port, '/ok');
    if (o.result === 'success') runs.readyOk++;
    else if (o.reason === 'refused') runs.readyBad++;
    metrics.probeObserver.probeRun(web0Ready, o);
  }
  for (let i = 0; i < 2; i++) {
    const o = await tcpProbe(closedPort);
    if (o.reason === 'refused') runs.refused++;
    metrics.probeObserver.probeRun(web1Ready, o);
  }
  // A named port the container does not declare: the prober reports 'error', which kubelet discards.
  const unresolved = await tcpProbe('web');
  if (unresolved.result === 'error' && unresolved.reason === 'port-unresolved') runs.unresolved++;
  metrics.probeObserver.probeRun(web2Startup, unresolved);
});

afterAll(async () => {
  await server?.close();
  health?.close();
  await new Promise<void>((r) => (tcp ? tcp.close(() => r()) : r()));
  await new Promise<void>((r) => (http ? http.close(() => r()) : r()));
});

describe('/metrics', () => {
  it('passes promtool check metrics on a real scrape', async () => {
    const res = await fetch(`${server.url}/metrics`);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('text/plain; version=0.0.4; charset=utf-8');
    const text = await res.text();
    const check = spawnSync(PROMTOOL, ['check', 'metrics'], { input: text, encoding: 'utf8' });
    if (check.error) throw new Error(`promtool is needed (${PROMTOOL}): ${check.error.message}`);
    expect(`${check.stdout}${check.stderr}`).toBe('');
    expect(check.status).toBe(0);
  });

  it('carries the real probe results with kubelet semantics', async () => {
    // The servers are ours, so the outcomes are known; the counts still come from real probes.
    expect(runs).toEqual({ liveTcp: 3, readyOk: 2, readyBad: 1, refused: 2, unresolved: 1 });
    const text = await (await fetch(`${server.url}/metrics`)).text();
    const base = { container: 'app', namespace: 'shop' };
    expect(sample(text, 'prober_probe_total', { ...base, pod: 'web-0', probe_type: 'Liveness', result: 'successful' })).toBe(runs.liveTcp);
    expect(sample(text, 'prober_probe_total', { ...base, pod: 'web-0', probe_type: 'Readiness', result: 'successful' })).toBe(runs.readyOk);
    expect(sample(text, 'prober_probe_total', { ...base, pod: 'web-0', probe_type: 'Readiness', result: 'failed' })).toBe(runs.readyBad);
    expect(sample(text, 'prober_probe_total', { ...base, pod: 'web-1', probe_type: 'Readiness', result: 'failed' })).toBe(runs.refused);
    expect(sample(text, 'prober_probe_duration_seconds_count', { pod: 'web-0', probe_type: 'Readiness' })).toBe(runs.readyOk);
    // web-1 only ever failed: kubelet never times failures, so it has no duration series at all.
    expect(text.includes('prober_probe_duration_seconds_count{probe_type="Readiness",container="app",pod="web-1"')).toBe(false);
    expect(sample(text, 'probe_agent_probe_results_total', { protocol: 'tcp', result: 'failure', reason: 'refused' })).toBe(runs.refused);
    expect(sample(text, 'probe_agent_probe_results_total', { protocol: 'http', result: 'failure', reason: 'refused' })).toBe(runs.readyBad);
    // The errored run left kubelet's series alone and shows up only in ours.
    expect(text.includes('pod="web-2"')).toBe(false);
    expect(sample(text, 'probe_agent_probe_results_total', { probe_type: 'Startup', result: 'error', reason: 'port-unresolved' })).toBe(runs.unresolved);
    // Only answered requests have a first byte; only connected sockets a connect phase.
    expect(sample(text, 'probe_agent_probe_phase_duration_seconds_count', { protocol: 'http', phase: 'first_byte' })).toBe(runs.readyOk);
    expect(sample(text, 'probe_agent_probe_phase_duration_seconds_count', { protocol: 'tcp', phase: 'connect' })).toBe(runs.liveTcp);
    expect(sample(text, 'probe_agent_probe_phase_duration_seconds_count', { protocol: 'tcp', phase: 'helper' })).toBe(runs.liveTcp);
    expect(sample(text, 'probe_agent_probe_phase_duration_seconds_count', { protocol: 'tcp', phase: 'total' })).toBe(runs.liveTcp + runs.refused + runs.unresolved);
    const sum = sample(text, 'probe_agent_probe_phase_duration_seconds_sum', { protocol: 'tcp', phase: 'total' }) ?? -1;
    expect(sum).toBeGreaterThan(0);
    expect(sum).toBeLessThan(5);
    expect(sample(text, 'process_start_time_seconds', {})).toBeGreaterThan(1_600_000_000);
  });

  it('serves only kubelet prober series on /metrics/probes, gzip when asked, and HEAD without a body', async () => {
    const text = await (await fetch(`${server.url}/metrics/probes`)).text();
    const names = new Set(text.split('\n').filter((l) => l && !l.startsWith('#')).map((l) => /^[\w:]+/.exec(l)?.[0]?.replace(/_(bucket|sum|count)$/, '')));
    expect([...names].sort()).toEqual(['prober_probe_duration_seconds', 'prober_probe_total', 'process_start_time_seconds']);

    const gz = await new Promise<{ encoding?: string; length: number }>((resolve, reject) => {
      httpGet({ host: '127.0.0.1', port: server.port, path: '/metrics', headers: { 'Accept-Encoding': 'gzip' } }, (res) => {
        let length = 0;
        res.on('data', (d: Buffer) => { length += d.length; });
        res.on('end', () => resolve({ encoding: res.headers['content-encoding'], length }));
      }).on('error', reject);
    });
    expect(gz.encoding).toBe('gzip');
    const plainLength = Buffer.byteLength(await (await fetch(`${server.url}/metrics`, { headers: { 'Accept-Encoding': 'identity' } })).text());
    expect(gz.length).toBeLessThan(plainLength);

    const head = await fetch(`${server.url}/metrics`, { method: 'HEAD' });
    expect(head.status).toBe(200);
    expect(Number(head.headers.get('content-length'))).toBeGreaterThan(0);
    expect(await head.text()).toBe('');
  });

  it('removes a stopped worker\'s series from the exposition', async () => {
    metrics.probeObserver.workerStopped(web1Ready);
    const text = await (await fetch(`${server.url}/metrics`)).text();
    expect(text.includes('pod="web-1"')).toBe(false);
    expect(sample(text, 'prober_probe_total', { pod: 'web-0', probe_type: 'Liveness', result: 'successful' })).toBe(runs.liveTcp);
  });
});

describe('/healthz, /livez, /readyz', () => {
  it('reports liveness ok and readiness failing until the kubelet has been polled', async () => {
    for (const path of ['/healthz', '/livez']) {
      const res = await fetch(`${server.url}${path}`);
      expect([res.status, await res.text()]).toEqual([200, 'ok']);
    }
    let res = await fetch(`${server.url}/readyz`);
    expect(res.status).toBe(500);
    expect(await res.text()).toBe('[+]ping ok\n[+]eventloop ok\n[+]shutdown ok\n[-]kubelet failed: reason withheld\n[+]helper ok\nreadyz check failed\n');
    res = await fetch(`${server.url}/readyz?verbose`);
    expect(await res.text()).toContain('[-]kubelet failed: no successful kubelet poll yet\n');
    res = await fetch(`${server.url}/readyz?exclude=kubelet`);
    expect([res.status, await res.text()]).toEqual([200, 'ok']);

    // A real round trip stands in for the kubelet poll (its duration is what gets recorded).
    const t0 = performance.now();
    const poll = await httpProbe(httpPort, '/ok');
    expect(poll.result).toBe('success');
    metrics.agent.kubeletPoll((performance.now() - t0) / 1000);

    res = await fetch(`${server.url}/readyz`);
    expect([res.status, await res.text()]).toEqual([200, 'ok']);
    res = await fetch(`${server.url}/readyz?verbose=1`);
    expect(await res.text()).toBe('[+]ping ok\n[+]eventloop ok\n[+]shutdown ok\n[+]kubelet ok\n[+]helper ok\nreadyz check passed\n');
    res = await fetch(`${server.url}/readyz/kubelet`);
    expect([res.status, await res.text()]).toEqual([200, 'ok']);
    res = await fetch(`${server.url}/livez/kubelet`);
    expect(res.status).toBe(404);
  });

  it('fails a hanging check after its timeout, not after the client gives up', async () => {
    helperHangs = true;
    try {
      const t0 = performance.now();
      const res = await fetch(`${server.url}/readyz/helper`);
      expect(performance.now() - t0).toBeLessThan(10_000);
      expect([res.status, await res.text()]).toEqual([500, 'internal server error: timed out after 0.2s\n']);
      const verbose = await (await fetch(`${server.url}/readyz?verbose`)).text();
      expect(verbose).toContain('[-]helper failed: timed out after 0.2s\n');
    } finally {
      helperHangs = false;
    }
  });

  it('fails readiness once shutdown starts', async () => {
    const h = new HealthRegistry();
    const s = await startMetricsServer({ address: '127.0.0.1:0', registry: metrics.registry, health: h });
    try {
      expect((await fetch(`${s.url}/readyz`)).status).toBe(200);
      h.markShuttingDown();
      const res = await fetch(`${s.url}/readyz?verbose`);
      expect(res.status).toBe(500);
      expect(await res.text()).toContain('[-]shutdown failed: process is shutting down\n');
      expect((await fetch(`${s.url}/livez`)).status).toBe(200);
      expect((await fetch(`${s.url}/metrics/probes`)).status).toBe(404);
    } finally {
      await s.close();
      h.close();
    }
  });
});

describe('request handling bounds', () => {
  it('answers only GET and HEAD', async () => {
    for (const method of ['POST', 'PUT', 'DELETE', 'OPTIONS']) {
      const res = await fetch(`${server.url}/metrics`, { method });
      expect(res.status).toBe(405);
      expect(res.headers.get('allow')).toBe('GET, HEAD');
      await res.arrayBuffer();
    }
    expect((await fetch(`${server.url}/nope`)).status).toBe(404);
    expect(await (await fetch(`${server.url}/`)).text()).toContain('/metrics/probes');
  });

  it('answers a request with a huge declared body without reading it, then closes', async () => {
    const { text, closed } = await raw(
      server.port,
      `POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 104857600\r\n\r\n${'a'.repeat(1024)}`,
    );
    expect(text.startsWith('HTTP/1.1 405')).toBe(true);
    expect(text.toLowerCase()).toContain('connection: close');
    expect(closed).toBe(true);
  });

  it('rejects oversized headers', async () => {
    const { text } = await raw(server.port, `GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: ${'b'.repeat(20_000)}\r\n\r\n`);
    expect(text.startsWith('HTTP/1.1 431')).toBe(true);
  });

  it('sheds requests beyond its concurrency bound with 503', async () => {
    const h = new HealthRegistry();
    h.addReadiness('slow', () => new Promise<void>((r) => setTimeout(r, 300)));
    const s = await startMetricsServer({ address: '127.0.0.1:0', registry: metrics.registry, health: h, maxConcurrent: 1 });
    try {
      const slow = fetch(`${s.url}/readyz/slow`);
      await new Promise((r) => setTimeout(r, 50));
      const shed = await fetch(`${s.url}/metrics`);
      expect(shed.status).toBe(503);
      expect(shed.headers.get('retry-after')).toBe('1');
      expect((await slow).status).toBe(200);
      expect((await fetch(`${s.url}/metrics`)).status).toBe(200);
    } finally {
      await s.close();
      h.close();
    }
  });

  it('keeps health on its own listener: 64 held connections to the metrics listener leave it answering', async () => {
    const h = new HealthRegistry();
    h.addReadiness('fine', () => {});
    const m = await startMetricsServer({ address: '127.0.0.1:0', registry: metrics.registry, health: h });
    const hs = await startMetricsServer({ address: '127.0.0.1:0', registry: metrics.registry, health: h, healthOnly: true });
    const held: ReturnType<typeof connect>[] = [];
    try {
      for (let i = 0; i < 70; i++) {
        const sock = connect(m.port, '127.0.0.1');
        sock.on('error', () => {});
        held.push(sock);
      }
      await Promise.all(held.map((sock) => new Promise((r) => (sock.readyState === 'open' ? r(null) : sock.once('connect', r).once('close', r)))));
      await new Promise((r) => setTimeout(r, 100));
      // The metrics listener is full: a new connection is dropped unanswered...
      const full = await fetch(`${m.url}/readyz`, { signal: AbortSignal.timeout(1000) }).then((r) => r.status, () => 'dropped');
      expect(full).toBe('dropped');
      // ...while the health listener answers, and serves nothing else.
      expect((await fetch(`${hs.url}/readyz`)).status).toBe(200);
      expect((await fetch(`${hs.url}/healthz`)).status).toBe(200);
      expect((await fetch(`${hs.url}/metrics`)).status).toBe(404);
    } finally {
      for (const sock of held) sock.destroy();
      await Promise.all([m.close(), hs.close()]);
      h.close();
    }
  });
});

describe('listen address', () => {
  it('defaults to loopback and parses the accepted forms', () => {
    expect(parseListenAddress(DEFAULT_METRICS_ADDRESS)).toEqual({ host: '127.0.0.1', port: 9809 });
    expect(parseListenAddress('[::1]:9809')).toEqual({ host: '::1', port: 9809 });
    expect(parseListenAddress(':9809')).toEqual({ host: '', port: 9809 });
    for (const bad of ['9809', '127.0.0.1', '127.0.0.1:99999', '[nope]:1', 'a b:1', '1.2.3.4:80:80']) {
      expect(() => parseListenAddress(bad)).toThrow(ConfigError);
    }
  });

  it('binds IPv6 loopback and reports a taken port as a ConfigError', async () => {
    const h = new HealthRegistry();
    const s = await startMetricsServer({ address: '[::1]:0', registry: metrics.registry, health: h });
    try {
      expect(s.url).toBe(`http://[::1]:${s.port}`);
      expect((await fetch(`${s.url}/healthz`)).status).toBe(200);
      await expect(startMetricsServer({ address: `[::1]:${s.port}`, registry: metrics.registry, health: h })).rejects.toThrow(
        /metrics listener on \[::1\]:\d+: .*EADDRINUSE/,
      );
      await expect(startMetricsServer({ address: { host: '::1', port: s.port }, registry: metrics.registry, health: h })).rejects.toThrow(
        ConfigError,
      );
    } finally {
      await s.close();
      h.close();
    }
  });
});
