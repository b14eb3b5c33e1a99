/**
 * `probe-agent webhook`: the mutating admission webhook that applies `probe-agent rewrite` to pods
 * as they are created (docs/rewrite.md, deploy/components/rewrite-webhook). Runs until SIGTERM.
 * Exit status: 0 after a clean stop, 2 it could not start (bad flag, TLS files, address in use).
 */
import { Command, Option } from 'commander';
import { ConfigError, describeError } from '../errors.ts';
import { createLogger, type LogFormat, type LogLevel } from '../log.ts';
import { parseListenAddress } from '../config/listen-address.ts';
import {
  DEFAULT_BODY_TIMEOUT_MS, DEFAULT_HEADERS_TIMEOUT_MS, DEFAULT_MAX_CONCURRENT_REQUESTS, DEFAULT_MAX_INFLIGHT_BYTES, DEFAULT_MAX_REQUEST_BYTES, DEFAULT_TLS_RELOAD_INTERVAL_MS,
} from '../webhook/defaults.ts';
import { parseDuration } from '../config/duration.ts';

/** Where the component mounts the serving certificate (a kubernetes.io/tls Secret). */
export const DEFAULT_TLS_DIR = '/etc/probe-agent/webhook-tls';

interface Raw {
  listen: string;
  tlsCertFile: string;
  tlsKeyFile: string;
  tlsReloadInterval: string;
  maxRequestBytes: string;
  apiServerUrl?: string;
  apiTokenFile?: string;
  apiCaFile?: string;
  loopbackHost: 'rewrite' | 'keep';
  maxConcurrentRequests: string;
  maxInflightBytes: string;
  headerTimeout: string;
  bodyTimeout: string;
  /** A path, or false after --no-client-ca-file. */
  clientCaFile?: string | false;
  metricsListen?: string;
  logLevel: LogLevel;
  logFormat: LogFormat;
}

/** Adds `webhook` to the program. */
export function registerWebhookCommand(program: Command): void {
  program
    .command('webhook')
    .description('serve the rewrite as a mutating admission webhook (AdmissionReview v1, HTTPS)')
    .option('--listen <host:port>', 'HTTPS listen address', ':8443')
    .option('--tls-cert-file <file>', 'serving certificate (PEM, chain allowed); re-read when it changes', `${DEFAULT_TLS_DIR}/tls.crt`)
    .option('--tls-key-file <file>', 'its private key (PEM); re-read when it changes', `${DEFAULT_TLS_DIR}/tls.key`)
    .option('--tls-reload-interval <duration>', 'how often the TLS files are checked for a rotation', `${DEFAULT_TLS_RELOAD_INTERVAL_MS / 1000}s`)
    .option('--max-request-bytes <n>', 'largest AdmissionReview accepted', String(DEFAULT_MAX_REQUEST_BYTES))
    .option('--api-server-url <url>', 'API server to read Nodes (DaemonSet pods) and RuntimeClasses from (default: in-cluster, when run in a pod)')
    .option('--api-token-file <file>', 'bearer token for --api-server-url (default in a pod: the service account token)')
    .option('--api-ca-file <file>', 'CA bundle for --api-server-url (default in a pod: the service account CA)')
    .addOption(new Option('--loopback-host <policy>', 'a probe host of 127.0.0.1/::1/localhost: rewrite (the pod\'s own loopback) or keep (the pod stays with kubelet)').choices(['rewrite', 'keep']).default('rewrite'))
    .option('--max-concurrent-requests <n>', 'AdmissionReviews handled at once; more are answered 429 with Retry-After', String(DEFAULT_MAX_CONCURRENT_REQUESTS))
    .option('--max-inflight-bytes <n>', 'request bytes the reviews in flight may hold together; more are answered 429 (at least --max-request-bytes)', String(DEFAULT_MAX_INFLIGHT_BYTES))
    .option('--header-timeout <duration>', 'time a connection gets for its TLS handshake, and then for its request headers; it is closed beyond', `${DEFAULT_HEADERS_TIMEOUT_MS / 1000}s`)
    .option('--body-timeout <duration>', 'time a request gets for its body once its headers are in; 408 beyond. The API server sends both at once', `${DEFAULT_BODY_TIMEOUT_MS / 1000}s`)
    .option('--client-ca-file <file>', "CA the caller's client certificate must verify against (the API server's admission client certificate); admission paths and /metrics then answer only verified callers")
    .option('--no-client-ca-file', 'answer callers without verifying them (a control plane that cannot present a client certificate); overrides an earlier --client-ca-file')
    .option('--metrics-listen <host:port>', 'plain-HTTP listener for GET /metrics alone (default: none)')
    .addOption(new Option('--log-level <level>', 'log level').choices(['error', 'warn', 'info', 'debug', 'trace']).default('info'))
    .addOption(new Option('--log-format <format>', 'log format on stderr').choices(['json', 'text']).default('json'))
    .action(async (raw: Raw) => {
      process.exitCode = await webhookCommand(raw);
    });
}

async function webhookCommand(raw: Raw): Promise<number> {
  const log = createLogger({ level: raw.logLevel, format: raw.logFormat });
  let server;
  try {
    const address = parseListenAddress(raw.listen, '--listen');
    const tlsReloadIntervalMs = parseDuration(raw.tlsReloadInterval, '--tls-reload-interval');
    if (tlsReloadIntervalMs < 100) throw new ConfigError('--tls-reload-interval: at least 100ms');
    const maxRequestBytes = Number(raw.maxRequestBytes);
    if (!Number.isInteger(maxRequestBytes) || maxRequestBytes < 1024) throw new ConfigError(`--max-request-bytes: want an integer >= 1024, got "${raw.maxRequestBytes}"`);
    const maxConcurrentRequests = Number(raw.maxConcurrentRequests);
    if (!Number.isInteger(maxConcurrentRequests) || maxConcurrentRequests < 1 || maxConcurrentRequests > 4096) {
      throw new ConfigError(`--max-concurrent-requests: want an integer 1..4096, got "${raw.maxConcurrentRequests}"`);
    }
    const maxInflightBytes = Number(raw.maxInflightBytes);
    if (!Number.isInteger(maxInflightBytes) || maxInflightBytes < maxRequestBytes) {
      throw new ConfigError(`--max-inflight-bytes: want an integer >= --max-request-bytes (${maxRequestBytes}), got "${raw.maxInflightBytes}"`);
    }
    const headersTimeoutMs = parseDuration(raw.headerTimeout, '--header-timeout');
    const bodyTimeoutMs = parseDuration(raw.bodyTimeout, '--body-timeout');
    for (const [flag, ms] of [['--header-timeout', headersTimeoutMs], ['--body-timeout', bodyTimeoutMs]] as const) {
      // The API server waits at most 30 s (timeoutSeconds) for the whole call.
      if (ms < 100 || ms > 30_000) throw new ConfigError(`${flag}: want 100ms..30s, got "${flag === '--header-timeout' ? raw.headerTimeout : raw.bodyTimeout}"`);
    }
    const metricsListen = raw.metricsListen ? parseListenAddress(raw.metricsListen, '--metrics-listen') : undefined;
    // Loaded here: the daemon and the other commands never need the webhook server.
    const { startWebhookServer } = await import('../webhook/server.ts');
    const { ApiServerReader, inClusterOptions } = await import('../webhook/cluster-reader.ts');
    const inCluster = inClusterOptions();
    let cluster;
    if (raw.apiServerUrl) {
      let url: URL;
      try {
        url = new URL(raw.apiServerUrl);
      } catch {
        throw new ConfigError(`--api-server-url: not a URL: ${raw.apiServerUrl.slice(0, 100)}`);
      }
      if (url.protocol !== 'https:' && url.protocol !== 'http:') throw new ConfigError('--api-server-url: want http(s)://');
      cluster = new ApiServerReader({ url: url.href, ...(raw.apiTokenFile ? { tokenFile: raw.apiTokenFile } : {}), ...(raw.apiCaFile ? { caFile: raw.apiCaFile } : {}) });
    } else if (inCluster) {
      cluster = new ApiServerReader({ ...inCluster, ...(raw.apiTokenFile ? { tokenFile: raw.apiTokenFile } : {}), ...(raw.apiCaFile ? { caFile: raw.apiCaFile } : {}) });
    }
    server = await startWebhookServer({ ...address, certFile: raw.tlsCertFile, keyFile: raw.tlsKeyFile, tlsReloadIntervalMs, maxRequestBytes,
      maxConcurrentRequests, maxInflightBytes, headersTimeoutMs, bodyTimeoutMs, log,
      ...(raw.clientCaFile ? { clientCaFile: raw.clientCaFile } : {}),
      ...(metricsListen ? { metricsListen } : {}),
      admission: { ...(cluster ? { cluster } : {}), loopbackHost: raw.loopbackHost },
    });
    if (!cluster) log.warn('no API server (not in a pod, no --api-server-url): DaemonSet pods are left as written, RuntimeClasses are taken by name');
  } catch (err) {
    process.stderr.write(`probe-agent webhook: cannot start: ${describeError(err)}\n`);
    return 2;
  }
  const signal = await new Promise<string>((resolve) => {
    for (const s of ['SIGTERM', 'SIGINT'] as const) process.once(s, () => resolve(s));
  });
  log.info('stopping', { signal });
  await server.close();
  return 0;
}
