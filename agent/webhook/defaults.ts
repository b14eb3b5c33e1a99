/** The webhook's defaults, apart from its server so the CLI can show them without loading it. */

/** Largest AdmissionReview accepted: a pod is at most ~1.5 MiB in etcd, the review wraps it once. */
export const DEFAULT_MAX_REQUEST_BYTES = 3 * 1024 * 1024;
/** How often the TLS files are checked for a rotation. */
export const DEFAULT_TLS_RELOAD_INTERVAL_MS = 10_000;
