/**
 * `probe-agent webhook`: the mutating admission webhook that applies `probe-agent rewrite` to pods
 * as they are created (docs/rewrite.md, deploy/components/rewrite-webhook). Runs until SIGTERM.
 * Exit status: 0 after a clean stop, 2 it could not start (bad flag, TLS files, address in use).
 */
import { hostname } from 'node:os';
import { Command, Option } from 'commander';
import { ConfigError, describeError } from '../errors.ts';
import { createLogger, type LogFormat, type LogLevel } from '../log.ts';
import { parseListenAddress } from '../config/listen-address.ts';
import {
  DEFAULT_BODY_TIMEOUT_MS, DEFAULT_HEADERS_TIMEOUT_MS, DEFAULT_MAX_CONCURRENT_REQUESTS, DEFAULT_MAX_INFLIGHT_BYTES, DEFAULT_MAX_REQUEST_BYTES, DEFAULT_TLS_RELOAD_INTERVAL_MS,
} from '../webhook/defaults.ts';
import { parseDuration } from '../config/duration.ts';
import { SANDBOXED_RUNTIME_CLASSES } from '../rewrite/pod-rewrite.ts';

/** The lease controller's per-request timeout (its ApiWriter's): bounds how long a leader's last write may take. */
const API_TIMEOUT_MS = 5000;

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
  gatesRefusedRuntimeClasses: string;
  gatesLeaseController?: boolean;
  gatesLeaseNamespace: string;
  gatesLeaseInterval: string;
  gatesLeaseMaxWrites: string;
  gatesLeaderLeaseDuration: string;
  gatesLeaderIdentity?: string;
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
    .option('--gates-refused-runtime-classes <list>', 'gates mode: RuntimeClasses (by name or handler, comma-separated) whose pods are left as written; replaces the default list', SANDBOXED_RUNTIME_CLASSES.join(','))
    .option('--gates-lease-controller', "gates mode's fail-closed option: set probe-agent.io/ready False on the gates pods of a node whose agent Lease expired (needs the API server)")
    .option('--gates-lease-namespace <ns>', "namespace of the agents' node Leases", 'probe-agent')
    .option('--gates-lease-interval <duration>', 'how often the node Leases are read', '10s')
    .option('--gates-lease-max-writes <n>', 'most pod condition writes per poll (the rest wait for the next poll)', '50')
    .option('--gates-leader-lease-duration <duration>', `the lease controller's leader election: how long the Lease ${'`gates-lease-controller`'} (in --gates-lease-namespace) holds without renewal; only its holder writes`, '15s')
    .option('--gates-leader-identity <name>', 'this replica in the leader election (default: $POD_NAME, else the host name)')
    .addOption(new Option('--log-level <level>', 'log level').choices(['error', 'warn', 'info', 'debug', 'trace']).default('info'))
    .addOption(new Option('--log-format <format>', 'log format on stderr').choices(['json', 'text']).default('json'))
    .action(async (raw: Raw) => {
      process.exitCode = await webhookCommand(raw);
    });
}

async function webhookCommand(raw: Raw): Promise<number> {
  const log = createLogger({ level: raw.logLevel, format: raw.logFormat });
  let server;
  let leases: import('../gates/lease-controller.ts').LeaseController | undefined;
  let closeLeases = async (): Promise<void> => {};
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
    const gatesRefusedRuntimeClasses = parseRuntimeClassList(raw.gatesRefusedRuntimeClasses);
    const leaseIntervalMs = parseDuration(raw.gatesLeaseInterval, '--gates-lease-interval');
    if (leaseIntervalMs < 1000 || leaseIntervalMs > 300_000) throw new ConfigError(`--gates-lease-interval: want 1s..5m, got "${raw.gatesLeaseInterval}"`);
    const leaseMaxWrites = Number(raw.gatesLeaseMaxWrites);
    if (!Number.isInteger(leaseMaxWrites) || leaseMaxWrites < 1 || leaseMaxWrites > 10_000) throw new ConfigError(`--gates-lease-max-writes: want an integer 1..10000, got "${raw.gatesLeaseMaxWrites}"`);
    if (!/^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/.test(raw.gatesLeaseNamespace)) throw new ConfigError(`--gates-lease-namespace: not a namespace name: "${raw.gatesLeaseNamespace.slice(0, 80)}"`);
    const leaderDurationMs = parseDuration(raw.gatesLeaderLeaseDuration, '--gates-leader-lease-duration');
    const leaderIdentity = (raw.gatesLeaderIdentity ?? process.env['POD_NAME'] ?? hostname()).slice(0, 253);
    if (leaderIdentity === '') throw new ConfigError('--gates-leader-identity: empty');
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
      admission: { ...(cluster ? { cluster } : {}), loopbackHost: raw.loopbackHost, gatesRefusedRuntimeClasses },
    });
    if (raw.gatesLeaseController) {
      const api = raw.apiServerUrl ? { url: new URL(raw.apiServerUrl).href } : inCluster;
      if (!api) throw new ConfigError('--gates-lease-controller needs the API server: run in a pod, or give --api-server-url');
      const { ApiWriter } = await import('../gates/api-writer.ts');
      const { LeaseController } = await import('../gates/lease-controller.ts');
      const { LeaderElector, LEADER_LEASE_NAME, minLeaderDurationMs } = await import('../gates/leader.ts');
      const minLeaderMs = minLeaderDurationMs(API_TIMEOUT_MS);
      if (leaderDurationMs < minLeaderMs || leaderDurationMs > 300_000) throw new ConfigError(`--gates-leader-lease-duration: want ${minLeaderMs / 1000}s..5m, got "${raw.gatesLeaderLeaseDuration}"`);
      const { GATES_CONDITION } = await import('../rewrite/gates-rewrite.ts');
      const writer = new ApiWriter({ ...api, ...(raw.apiTokenFile ? { tokenFile: raw.apiTokenFile } : {}), ...(raw.apiCaFile ? { caFile: raw.apiCaFile } : {}), nodeName: 'probe-agent-webhook', conditionType: GATES_CONDITION, timeoutMs: API_TIMEOUT_MS });
      const metrics = server.metrics;
      // Every replica runs the controller; only the holder of the leader Lease writes (leader.ts).
      const leader = new LeaderElector({
        api: writer, namespace: raw.gatesLeaseNamespace, identity: leaderIdentity, durationMs: leaderDurationMs, requestTimeoutMs: API_TIMEOUT_MS, log,
        onOp: (ok) => metrics.leaseOp('leader', ok), onLeading: (leading) => metrics.setLeading(leading),
      });
      let electing: Promise<void> | undefined;
      const elect = (): void => {
        electing ??= leader.tryOnce().finally(() => (electing = undefined));
      };
      elect();
      const electTimer = setInterval(elect, leader.retryMs);
      electTimer.unref();
      leases = new LeaseController({
        api: writer, namespace: raw.gatesLeaseNamespace, conditionType: GATES_CONDITION, intervalMs: leaseIntervalMs, maxWritesPerPoll: leaseMaxWrites, log, leader,
        onOp: (op, ok) => metrics.leaseOp(op, ok), onExpired: (n) => metrics.setExpiredLeases(n),
      });
      const controller = leases;
      closeLeases = async () => {
        clearInterval(electTimer);
        await controller.close();
        await electing;
        await leader.release();
        await writer.close();
      };
      leases.start();
      log.info('gates lease controller on', { namespace: raw.gatesLeaseNamespace, interval: raw.gatesLeaseInterval, leaderLease: `${raw.gatesLeaseNamespace}/${LEADER_LEASE_NAME}`, identity: leaderIdentity });
    }
    if (!cluster) log.warn('no API server (not in a pod, no --api-server-url): DaemonSet pods are left as written, RuntimeClasses are taken by name');
  } catch (err) {
    process.stderr.write(`probe-agent webhook: cannot start: ${describeError(err)}\n`);
    await closeLeases();
    await server?.close();
    return 2;
  }
  const signal = await new Promise<string>((resolve) => {
    for (const s of ['SIGTERM', 'SIGINT'] as const) process.once(s, () => resolve(s));
  });
  log.info('stopping', { signal });
  await closeLeases();
  await server.close();
  return 0;
}

/** The --gates-refused-runtime-classes list: names, comma-separated, bounded. */
function parseRuntimeClassList(raw: string): string[] {
  const names = raw.split(',').map((n) => n.trim()).filter((n) => n !== '');
  if (names.length > 64) throw new ConfigError(`--gates-refused-runtime-classes: at most 64 names, got ${names.length}`);
  for (const n of names) {
    if (!/^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/.test(n)) throw new ConfigError(`--gates-refused-runtime-classes: not a RuntimeClass or handler name: "${n.slice(0, 80)}"`);
  }
  return names;
}
