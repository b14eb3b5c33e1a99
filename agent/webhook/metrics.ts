/**
 * The webhook's own Prometheus metrics: /metrics on the HTTPS port for a verified client, or on the
 * --metrics-listen port (metrics-listener.ts).
 */
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { ShedReason } from './load-shedder.ts';
import type { AdmissionOutcome } from './admission.ts';

/** Why a slow client was cut. */
export type SlowReason = 'handshake-timeout' | 'body-timeout' | 'evicted';

/** What an HTTP request to the webhook ended as: an admission outcome, or the HTTP error it got. */
export type RequestOutcome = AdmissionOutcome | 'bad-request' | 'too-large' | 'internal-error' | 'overloaded' | 'unauthorized' | 'slow';

export class WebhookMetrics {
  readonly registry = new Registry();
  readonly #requests: Counter<'path' | 'outcome'>;
  readonly #duration: Histogram<'path'>;
  readonly #shed: Counter<'reason'>;
  readonly #inFlight: Gauge;
  readonly #inFlightBytes: Gauge;
  readonly #slow: Counter<'reason'>;
  readonly #reading: Gauge;
  readonly #readingBytes: Gauge;
  readonly #evicted: Counter<'pool'>;
  readonly #refused: Counter;

  readonly #leaseOps: Counter<'op' | 'result'>;
  readonly #expiredLeases: Gauge;
  readonly #leading: Gauge;

  constructor() {
    this.#leaseOps = new Counter({
      name: 'probe_agent_webhook_lease_controller_operations_total',
      help: 'Gates lease controller: polls of the node Leases (poll), probe-agent.io/ready writes for nodes whose Lease expired (write), node Leases ignored because their name is not their holder\'s (ignored, once per name), leader Lease tries (leader), by result (ok, error).',
      labelNames: ['op', 'result'],
      registers: [this.registry],
    });
    this.#expiredLeases = new Gauge({ name: 'probe_agent_webhook_expired_node_leases', help: 'Nodes whose probe-agent Lease expired, at the last poll.', registers: [this.registry] });
    this.#leading = new Gauge({ name: 'probe_agent_webhook_lease_controller_leading', help: 'Gates lease controller: 1 while this replica holds the leader Lease gates-lease-controller (only it writes), else 0.', registers: [this.registry] });
    this.#requests = new Counter({
      name: 'probe_agent_webhook_requests_total',
      help: 'Admission requests by webhook path and outcome (rewritten, unchanged, skipped, refused, bad-request, too-large, internal-error, overloaded, unauthorized, slow).',
      labelNames: ['path', 'outcome'],
      registers: [this.registry],
    });
    this.#duration = new Histogram({
      name: 'probe_agent_webhook_request_duration_seconds',
      help: 'Time from the request headers to the answer, by webhook path.',
      labelNames: ['path'],
      buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1],
      registers: [this.registry],
    });
    this.#shed = new Counter({
      name: 'probe_agent_webhook_shed_total',
      help: 'Admission requests answered 429, by the bound they met: concurrency (review slots), bytes (bodies held), arriving (requests reading their bodies, all within their grace).',
      labelNames: ['reason'],
      registers: [this.registry],
    });
    this.#inFlight = new Gauge({ name: 'probe_agent_webhook_requests_in_flight', help: 'Admission requests being decided or answered (their whole body read).', registers: [this.registry] });
    this.#inFlightBytes = new Gauge({ name: 'probe_agent_webhook_request_bytes_in_flight', help: 'Request body bytes of the admission requests in flight.', registers: [this.registry] });
    this.#slow = new Counter({
      name: 'probe_agent_webhook_slow_requests_total',
      help: 'Connections cut for sending too slowly, by reason: handshake-timeout, body-timeout, evicted (the longest-waiting body, cut to make room for newer requests).',
      labelNames: ['reason'],
      registers: [this.registry],
    });
    this.#reading = new Gauge({ name: 'probe_agent_webhook_requests_reading', help: 'Admission requests whose bodies are being read (they hold no review slot yet).', registers: [this.registry] });
    this.#evicted = new Counter({
      name: 'probe_agent_webhook_connections_evicted_total',
      help: 'Connections closed to make room for a newer one in a full pool, by pool: handshake (before TLS), verified (callers with a verified client certificate), other.',
      labelNames: ['pool'],
      registers: [this.registry],
    });
    this.#refused = new Counter({
      name: 'probe_agent_webhook_connections_refused_total',
      help: 'Connections closed before TLS because their source already held its share of the handshakes, or as many as the largest holder of a full pool.',
      registers: [this.registry],
    });
    this.#readingBytes = new Gauge({ name: 'probe_agent_webhook_request_bytes_reading', help: 'Bytes held by the buffers of the bodies being read.', registers: [this.registry] });
  }

  /** Records one request shed with 429. */
  leaseOp(op: 'poll' | 'write' | 'ignored' | 'leader', ok: boolean): void {
    this.#leaseOps.inc({ op, result: ok ? 'ok' : 'error' });
  }

  setLeading(leading: boolean): void {
    this.#leading.set(leading ? 1 : 0);
  }

  setExpiredLeases(nodes: number): void {
    this.#expiredLeases.set(nodes);
  }

  shed(reason: ShedReason | 'arriving'): void {
    this.#shed.inc({ reason });
  }

  /** Records one slow client cut. */
  slow(reason: SlowReason): void {
    this.#slow.inc({ reason });
  }

  /** Records one connection evicted from a full pool. */
  connectionEvicted(pool: 'handshake' | 'verified' | 'other'): void {
    this.#evicted.inc({ pool });
  }

  /** Records one connection refused before TLS. */
  connectionRefused(): void {
    this.#refused.inc();
  }

  /** Sets the gauges of the bodies being read. */
  setReading(requests: number, bytes: number): void {
    this.#reading.set(requests);
    this.#readingBytes.set(bytes);
  }

  /** Sets the in-flight gauges. */
  setInFlight(requests: number, bytes: number): void {
    this.#inFlight.set(requests);
    this.#inFlightBytes.set(bytes);
  }

  /** Records one admission request. */
  observe(path: string, outcome: RequestOutcome, seconds: number): void {
    this.#requests.inc({ path, outcome });
    this.#duration.observe({ path }, seconds);
  }
}
