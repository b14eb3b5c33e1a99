/** The webhook's own Prometheus metrics, served on its HTTPS port at /metrics. */
import { Counter, Histogram, Registry } from 'prom-client';
import type { AdmissionOutcome } from './admission.ts';

/** What an HTTP request to the webhook ended as: an admission outcome, or the HTTP error it got. */
export type RequestOutcome = AdmissionOutcome | 'bad-request' | 'too-large' | 'internal-error';

export class WebhookMetrics {
  readonly registry = new Registry();
  readonly #requests: Counter<'path' | 'outcome'>;
  readonly #duration: Histogram<'path'>;

  constructor() {
    this.#requests = new Counter({
      name: 'probe_agent_webhook_requests_total',
      help: 'Admission requests by webhook path and outcome (rewritten, unchanged, skipped, refused, bad-request, too-large, internal-error).',
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
  }

  /** Records one admission request. */
  observe(path: string, outcome: RequestOutcome, seconds: number): void {
    this.#requests.inc({ path, outcome });
    this.#duration.observe({ path }, seconds);
  }
}
