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
/**
 * Time a connection gets for its TLS handshake and its request headers, and then for its body.
 * The API server sends headers and body at once right after the handshake, and gives the whole call
 * the webhook's timeoutSeconds (3 s here, 30 s at most): a request still incomplete after 2 s has
 * left its caller less than a second, so waiting longer only lets a slow sender hold a connection.
 */
export const DEFAULT_HEADERS_TIMEOUT_MS = 2000;
export const DEFAULT_BODY_TIMEOUT_MS = 2000;
/**
 * Requests whose bodies are being read at once (before they may take one of the review slots),
 * at least four per slot; beyond, the one reading the longest is cut (reading-set.ts).
 */
export const DEFAULT_MAX_READING_REQUESTS = 64;
/**
 * How long a request may read its body before it can be cut to make room for a newer one. A body
 * the API server sends arrives at network speed (3 MiB in tens of ms); a request still reading after
 * this is slow, one within it is not cut (a burst of large reviews refuses the newest instead).
 */
export const DEFAULT_READING_GRACE_MS = 500;
/**
 * Connections in their TLS handshake at once. The API server's handshakes take milliseconds and it
 * opens few at a time; a full pool evicts the oldest of the source holding the most
 * (connection-gate.ts), so a flood only churns its own. Each costs OpenSSL state outside the heap.
 */
export const DEFAULT_MAX_HANDSHAKES = 64;
/** Connections past TLS (with a client CA: of verified callers only). */
export const DEFAULT_MAX_CONNECTIONS = 256;
/** With a client CA: connections past TLS of unverified callers (kubelet's /healthz probes), one answer each. */
export const DEFAULT_MAX_UNVERIFIED_CONNECTIONS = 16;
