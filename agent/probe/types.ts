import type { Socket } from 'node:net';
import type { SharedFrameBudget } from '../http2/frame-budget.ts';
import type { Tenant } from '../scheduler/limiter.ts';

/** The three kubelet probe types, spelled as kubelet's metrics spell them. */
export type ProbeType = 'Liveness' | 'Readiness' | 'Startup';
export const PROBE_TYPES: readonly ProbeType[] = ['Liveness', 'Readiness', 'Startup'];

/** A container port reference: a number, or the name of one of the container's own ports. */
export type PortRef = number | string;

/** One `httpHeaders` entry, kept in order; repeats are kept. */
export interface HttpHeader {
  name: string;
  value: string;
  /**
   * 'annotation': the value is not in the handler; the agent reads it from the pod's
   * original-handlers annotation before the request is made (agent/prober/header-values.ts).
   */
  valueFrom?: 'annotation';
}

/** httpGet, normalised: scheme upper-cased, path defaulted to "/". */
export interface HttpGetHandler {
  kind: 'http';
  port: PortRef;
  path: string;
  scheme: 'HTTP' | 'HTTPS';
  /** The deprecated `host` field, as written (may be empty/undefined). */
  host?: string;
  headers: HttpHeader[];
}

/** tcpSocket. */
export interface TcpSocketHandler {
  kind: 'tcp';
  port: PortRef;
  host?: string;
}

/** grpc: always the pod's own address, numeric port. */
export interface GrpcHandler {
  kind: 'grpc';
  port: number;
  service?: string;
}

/** exec: recognised so that it can be reported as kubelet's, never run by us. */
export interface ExecHandler {
  kind: 'exec';
  command: string[];
}

export type ProbeHandler = HttpGetHandler | TcpSocketHandler | GrpcHandler | ExecHandler;
export type NetworkHandler = HttpGetHandler | TcpSocketHandler | GrpcHandler;

/** A Kubernetes Probe with kubelet's defaults applied. */
export interface ProbeSpec {
  handler: ProbeHandler;
  timeoutSeconds: number;
  periodSeconds: number;
  successThreshold: number;
  failureThreshold: number;
  initialDelaySeconds: number;
  terminationGracePeriodSeconds?: number;
}

/**
 * One probe's outcome, in kubelet's vocabulary plus 'error' (the probe could not run:
 * bad spec, unresolvable named port, netns/helper trouble). Warning counts as success.
 */
export type ProbeResult = 'success' | 'warning' | 'failure' | 'error';

/** Bounded set of failure reasons (a metric label: never add free text here). */
export type FailureReason =
  | 'refused'
  | 'timeout'
  | 'reset'
  | 'unreachable'
  | 'status'
  | 'redirects'
  | 'tls'
  | 'protocol'
  | 'grpc-status'
  | 'grpc-unimplemented'
  | 'grpc-not-serving'
  | 'netns-gone'
  | 'netns-denied'
  /** No resolver could find the pod's netns (runtime down, sandbox not ready). */
  | 'netns-unresolved'
  /** The pod is hostNetwork or runs in a sandboxed runtime: left to kubelet. */
  | 'unsupported-pod'
  | 'helper-error'
  | 'host-refused'
  | 'port-unresolved'
  | 'invalid-spec'
  | 'queue-full'
  /** The agent's event loop was stalled for much of a probe that timed out (loop-lag.ts): an error, not the target's failure. */
  | 'agent-overloaded'
  /** The target's HTTP/2 server sent frames that moved nothing (a flood) past its connection's or its pod's frame budget. */
  | 'frame-budget'
  | 'other';

/** Per-phase timings in seconds; a phase that did not happen is absent. */
export interface ProbePhases {
  /** Waiting for a concurrency slot. */
  queue?: number;
  /** Asking the helper for a socket made inside the netns (fork + setns + socket + fd pass). */
  helper?: number;
  /** TCP handshake (for dual-stack: until the winning attempt connected). */
  connect?: number;
  /** TLS handshake (HTTPS). */
  tls?: number;
  /** Request sent until response headers (HTTP) or response (gRPC) arrived. */
  firstByte?: number;
  /** Whole probe, from dispatch to result. */
  total: number;
}

/** What one probe run produced. `message` never holds a response body of a failure. */
export interface ProbeOutcome {
  result: ProbeResult;
  message: string;
  reason?: FailureReason;
  durationSeconds: number;
  phases: ProbePhases;
  /** The address:port that answered (or was tried last), for humans; never a metric label. */
  address?: string;
}

/** Makes unconnected TCP sockets that live in some network namespace. */
export interface SocketFactory {
  /** Human/metric name of the path: 'resident', 'warm', 'spawn', 'node'. */
  readonly mode: string;
  /**
   * Returns an unconnected TCP socket of the given family, created in `netns`
   * (a /proc/PID/ns/net or /run/netns path; ignored by the node factory).
   * Rejects with NetnsError or HelperError.
   */
  createSocket(netns: string | undefined, family: 4 | 6, signal?: AbortSignal): Promise<Socket>;
  /**
   * Optional: kubelet's whole TCP probe done where the socket is made (connect within
   * `timeoutMs`, counted from the socket's creation, then close), so no socket travels.
   * Resolves undefined when the factory will not take it now (callers use createSocket);
   * rejects with NetnsError or HelperError as createSocket does. `tenant` (the pod and its
   * namespace) is whose share of the factory's long connects the probe takes.
   */
  connectProbe?(netns: string, target: TcpTarget, signal?: AbortSignal, tenant?: Tenant): Promise<TcpProbeOutcome | undefined>;
  /**
   * Optional: the same connect, but a connection that wins is handed over (TCP_NODELAY set) for the
   * caller to use and destroy; no socket of Node's connects. Resolves undefined when the factory will
   * not take it now (callers then connect a createSocket socket themselves).
   */
  connectSocket?(netns: string, target: TcpTarget, signal?: AbortSignal, tenant?: Tenant): Promise<TcpConnectOutcome | undefined>;
  /**
   * Optional: connectSocket, and on the connection made, `send` written and the answer's first
   * octets read in the same trip (ConnectExchange). Without an exchange in the answer (`send` too
   * long for the factory), nothing was written.
   */
  connectExchange?(netns: string, target: TcpTarget, send: Buffer, signal?: AbortSignal, tenant?: Tenant): Promise<TcpExchangeOutcome | undefined>;
}

/** connectSocket's answer: connectProbe's outcome, with the connection when it connected. */
export type TcpConnectOutcome =
  | (Extract<TcpProbeOutcome, { outcome: 'connected' }> & { socket: Socket })
  | Exclude<TcpProbeOutcome, { outcome: 'connected' }>;

/**
 * connectExchange's answer: connectSocket's, with what the exchange did when it ran; the connection
 * is undefined when the peer ended it during the exchange (`exchange.ended`).
 */
export type TcpExchangeOutcome =
  | (Extract<TcpProbeOutcome, { outcome: 'connected' }> & ({ socket: Socket; exchange?: ConnectExchange } | { socket: undefined; exchange: ConnectExchange }))
  | Exclude<TcpProbeOutcome, { outcome: 'connected' }>;

/**
 * What the factory did with `send` on the connection it made (connectExchange): a byte pipe with no protocol of its
 * own, so every rule about the answer stays with the caller's reader.
 */
export interface ConnectExchange {
  /** Octets of `send` written; the caller writes the rest (and meets whatever stopped them). */
  sent: number;
  /** The answer's first octets, as read. */
  data: Buffer;
  /** How the peer ended the connection during the exchange (then no connection comes). */
  ended?: { eof: true } | { code: string };
  /** Seconds from the connect to the first answer octet; undefined when none came. */
  firstByteSeconds?: number;
  /** Seconds the exchange took in the factory, after the connect: the target's time. */
  seconds: number;
}

/** Where a TCP probe connects, and the target's budget. */
export interface TcpTarget {
  family: 4 | 6;
  ip: string;
  port: number;
  timeoutMs: number;
  /** Happy Eyeballs: a second address, tried after `staggerMs` or as soon as the first fails. */
  second?: { family: 4 | 6; ip: string; staggerMs: number };
}

/** What connecting gave: connected (`won`: 0 the first address, 1 the second), the first address's errno (Node's code spelling), or the timeout passing. */
export type TcpProbeOutcome =
  | { outcome: 'connected'; won: 0 | 1; connectSeconds: number; helperSeconds: number }
  | { outcome: 'error'; code: string; connectSeconds: number; helperSeconds: number }
  | { outcome: 'timeout'; connectSeconds: number; helperSeconds: number };

/** The deprecated host field: what to do with a host that is not the pod's own. */
export type HostFieldPolicy = 'refuse' | 'legacy-node';

/** Everything a prober needs besides the handler. */
export interface ProbeContext {
  /** Netns path to probe inside; undefined means the node's own netns (direct/legacy). */
  netns?: string;
  /** The pod (owner: its UID) and its namespace (group), for the socket factory's per-tenant shares. */
  tenant?: Tenant;
  /** The pod's own IPs (status.podIPs); the only addresses a probe may target. */
  podIPs: string[];
  /** Container ports, for named-port resolution. */
  containerPorts?: { name?: string; containerPort: number; protocol?: string }[];
  timeoutSeconds: number;
  /** Makes sockets in `netns`. */
  sockets: SocketFactory;
  /** Makes sockets in the node's netns (for the legacy host-field path and --from-node). */
  nodeSockets: SocketFactory;
  /** kube-probe/<major>.<minor> version, e.g. "1.34". */
  kubeVersion: string;
  hostFieldPolicy: HostFieldPolicy;
  /** Try every pod address family with RFC 8305 staggering; off = primary IP only (kubelet). */
  happyEyeballs: boolean;
  /** Aborts the probe early (agent shutdown, API deadline). */
  signal?: AbortSignal;
  /** The pod's HTTP/2 frame budget, shared by its probes' connections (pod-frame-budgets.ts); absent = each connection's own only. */
  frameBudget?: SharedFrameBudget;
}
