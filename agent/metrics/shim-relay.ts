/**
 * Reads the kubelet shim's counters from its root-only metrics socket, so the agent can serve them
 * at /metrics/shim on its own listener: Prometheus scrapes one endpoint per node, and the shim's
 * socket needs no exposure of its own. The read is bounded in size and time; a shim that is away
 * (not installed, restarting, hung) is an error the caller answers clearly, never a hang.
 */
import { request } from 'node:http';

/** Largest shim exposition accepted (its series are bounded: a few KiB in practice). */
export const SHIM_METRICS_MAX_BYTES = 1024 * 1024;
/** Longest the agent waits for the shim's answer. */
export const SHIM_METRICS_TIMEOUT_MS = 2000;

/** Why the shim's counters could not be read. */
export class ShimMetricsUnavailableError extends Error {
  constructor(socketPath: string, reason: string) {
    super(`kubelet shim metrics unavailable on ${socketPath}: ${reason}`);
    this.name = 'ShimMetricsUnavailableError';
  }
}

/** GET /metrics on the shim's socket; resolves the exposition text or rejects with ShimMetricsUnavailableError. */
export function readShimMetrics(socketPath: string, opts: { timeoutMs?: number; maxBytes?: number } = {}): Promise<{ body: string; contentType: string }> {
  const timeoutMs = opts.timeoutMs ?? SHIM_METRICS_TIMEOUT_MS;
  const maxBytes = opts.maxBytes ?? SHIM_METRICS_MAX_BYTES;
  return new Promise((resolve, reject) => {
    let done = false;
    const fail = (reason: string): void => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      req.destroy();
      reject(new ShimMetricsUnavailableError(socketPath, reason));
    };
    const timer = setTimeout(() => fail(`no answer within ${timeoutMs} ms`), timeoutMs);
    const req = request({ socketPath, path: '/metrics', method: 'GET', headers: { Connection: 'close' }, agent: false }, (res) => {
      if (res.statusCode !== 200) {
        res.resume();
        fail(`HTTP ${res.statusCode}`);
        return;
      }
      const chunks: Buffer[] = [];
      let size = 0;
      res.on('data', (c: Buffer) => {
        size += c.length;
        if (size > maxBytes) {
          fail(`answer larger than ${maxBytes} bytes`);
          return;
        }
        chunks.push(c);
      });
      res.on('end', () => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        resolve({ body: Buffer.concat(chunks, size).toString('utf8'), contentType: String(res.headers['content-type'] ?? 'text/plain; version=0.0.4; charset=utf-8') });
      });
      res.on('error', (err) => fail(err.message));
    });
    req.on('error', (err: NodeJS.ErrnoException) => fail(err.code ?? err.message));
    req.end();
  });
}
