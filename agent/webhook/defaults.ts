/** The webhook's defaults, apart from its server so the CLI can show them without loading it. */

/** Largest AdmissionReview accepted: a pod is at most ~1.5 MiB in etcd, the review wraps it once. */
export const DEFAULT_MAX_REQUEST_BYTES = 3 * 1024 * 1024;
/** How often the TLS files are checked for a rotation. */
export const DEFAULT_TLS_RELOAD_INTERVAL_MS = 10_000;
/** AdmissionReviews read and answered at once; more are answered 429 (see docs/rewrite.md for the measurement). */
export const DEFAULT_MAX_CONCURRENT_REQUESTS = 16;
/**
 * Request bytes the admitted reviews may hold together (declared Content-Length, or the request cap
 * when chunked). Sized so the reviews in flight, parsed, fit the deployment's 64 MB heap.
 */
export const DEFAULT_MAX_INFLIGHT_BYTES = 8 * 1024 * 1024;
/** Seconds a shed request is told to wait (Retry-After); the API server's client honours it. */
export const SHED_RETRY_AFTER_SECONDS = 1;
