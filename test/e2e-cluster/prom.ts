/**
 * Readers of Prometheus text the run's checks use: histograms and their quantiles, the API server's
 * failed webhook calls, and an agent's counters read inside its own pod.
 */
import type { Kubectl } from './kubectl.ts';
/**
 * A counter's total (every series summed) from an agent's /metrics, read inside its own pod (the
 * closed node's pods are not reachable from the host) with bash alone, as its probes do; undefined
 * when unreadable, 0 when the agent has no such series.
 */
export function agentMetric(k: Kubectl, pod: string, name: string, match: (line: string) => boolean = () => true): number | undefined {
  const r = k.run(['-n', 'probe-agent', 'exec', pod, '-c', 'agent', '--', 'bash', '-c',
    'a=$PROBE_AGENT_METRICS_ADDRESS; exec 3<>"/dev/tcp/${a%:*}/${a##*:}" && printf \'GET /metrics HTTP/1.0\\r\\nHost: probe-agent\\r\\n\\r\\n\' >&3 && cat <&3']);
  if (!r.ok || !/^HTTP\/1\.\d 200/.test(r.stdout)) return undefined;
  return r.stdout.split('\n').filter((l) => (l.startsWith(`${name}{`) || l.startsWith(`${name} `)) && match(l)).reduce((n, l) => n + Number(l.slice(l.lastIndexOf(' ') + 1)), 0);
}

/** Quantiles of a Prometheus histogram's buckets (upper bounds, linear within a bucket). */
export function quantile(buckets: [number, number][], q: number): number {
  const total = buckets[buckets.length - 1]?.[1] ?? 0;
  const want = q * total;
  let prevLe = 0;
  let prevN = 0;
  for (const [le, n] of buckets) {
    if (n >= want) return Number.isFinite(le) ? prevLe + ((le - prevLe) * (want - prevN)) / Math.max(1, n - prevN) : prevLe;
    prevLe = le;
    prevN = n;
  }
  return prevLe;
}

/** A histogram's cumulative buckets (upper bound, count) from Prometheus text, summed over the series `match` accepts. */
export function histogram(text: string, name: string, match: (line: string) => boolean): [number, number][] {
  const byLe = new Map<number, number>();
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}_bucket{`) || !match(line)) continue;
    const le = /le="([^"]+)"/.exec(line)?.[1];
    if (le === undefined) continue;
    const bound = le === '+Inf' ? Infinity : Number(le);
    byLe.set(bound, (byLe.get(bound) ?? 0) + Number(line.slice(line.lastIndexOf(' ') + 1)));
  }
  return [...byLe].sort((a, b) => a[0] - b[0]);
}

/** `after` minus `before`, bucket by bucket. */
export const minus = (after: [number, number][], before: [number, number][]): [number, number][] =>
  after.map(([le, n]) => [le, n - (before.find((b) => b[0] === le)?.[1] ?? 0)]);

export const p50p99 = (h: [number, number][]): string => `p50 ${(quantile(h, 0.5) * 1000).toFixed(1)} ms, p99 ${(quantile(h, 0.99) * 1000).toFixed(1)} ms over ${h[h.length - 1]?.[1] ?? 0}`;

/** The API server's calls of `webhook` that did not answer 200, by code and rejection, summed. */
export function failedCalls(text: string, webhook: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (!line.startsWith('apiserver_admission_webhook_request_total{') || !line.includes(`name="${webhook}"`) || line.includes('code="200"')) continue;
    const key = `code ${/code="([^"]*)"/.exec(line)?.[1]}, rejected ${/rejected="([^"]*)"/.exec(line)?.[1]}`;
    out.set(key, (out.get(key) ?? 0) + Number(line.slice(line.lastIndexOf(' ') + 1)));
  }
  return out;
}
