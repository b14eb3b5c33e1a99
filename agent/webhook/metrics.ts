/**
 * The webhook's own Prometheus metrics: /metrics on the HTTPS port for a verified client, or on the
 * --metrics-listen port (metrics-listener.ts).
 */
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { ShedReason } from './load-shedder.ts';
import type { AdmissionOutcome } from './admission.ts';

/** What an HTTP request to the webhook ended as: an admission outcome, or the HTTP error it got. */
export type RequestOutcome = AdmissionOutcome | 'bad-request' | 'too-large' | 'internal-error' | 'overloaded' | 'unauthorized';

export class WebhookMetrics {
  readonly registry = new Registry();
  readonly #requests: Counter<'path' | 'outcome'>;
  readonly #duration: Histogram<'path'>;
  readonly #shed: Counter<'reason'>;
  readonly #inFlight: Gauge;
  readonly #inFlightBytes: Gauge;

  constructor() {
    this.#requests = new Counter({
      name: 'probe_agent_webhook_requests_total',
      help: 'Admission requests by webhook path and outcome (rewritten, unchanged, skipped, refused, bad-request, too-large, internal-error, overloaded, unauthorized).',
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
      help: 'Admission requests answered 429 before their body was read, by the bound they met (concurrency, bytes).',
      labelNames: ['reason'],
      registers: [this.registry],
    });
    this.#inFlight = new Gauge({ name: 'probe_agent_webhook_requests_in_flight', help: 'Admission requests being read, decided or answered.', registers: [this.registry] });
    this.#inFlightBytes = new Gauge({ name: 'probe_agent_webhook_request_bytes_in_flight', help: 'Request bytes reserved by the admission requests in flight.', registers: [this.registry] });
  }

  /** Records one request shed with 429. */
  shed(reason: ShedReason): void {
    this.#shed.inc({ reason });
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
