/** Base of every error probe-agent raises on purpose: a stable code plus context for logs and metrics. */
export class ProbeAgentError extends Error {
  readonly code: string;
  readonly context: Record<string, unknown>;
  constructor(code: string, message: string, context: Record<string, unknown> = {}, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
    this.context = context;
  }
}

/** A probe spec (or a field of it) that kubelet would reject or that we refuse to run. */
export class InvalidProbeError extends ProbeAgentError {
  constructor(message: string, context: Record<string, unknown> = {}) {
    super('invalid-probe', message, context);
  }
}

/** The network namespace could not be opened, validated or entered. */
export class NetnsError extends ProbeAgentError {
  /** 'gone' (ENOENT), 'denied' (EPERM/EACCES), 'invalid' (path refused), 'enter' (setns failed). */
  readonly kind: 'gone' | 'denied' | 'invalid' | 'enter';
  constructor(kind: NetnsError['kind'], message: string, context: Record<string, unknown> = {}) {
    super(`netns-${kind}`, message, context);
    this.kind = kind;
  }
}

/** The netns helper process failed (crashed, missing binary, protocol error, overloaded). */
export class HelperError extends ProbeAgentError {
  constructor(message: string, context: Record<string, unknown> = {}, options?: { cause?: unknown }) {
    super('helper-error', message, context, options);
  }
}

/** A configuration value (flag, env twin, file) is invalid. */
export class ConfigError extends ProbeAgentError {
  constructor(message: string, context: Record<string, unknown> = {}) {
    super('config', message, context);
  }
}

/** Returns a short, single-line description of any thrown value, for result messages and logs. */
export function describeError(err: unknown): string {
  if (err instanceof Error) {
    const code = (err as NodeJS.ErrnoException).code;
    return code && !err.message.includes(code) ? `${err.message} (${code})` : err.message;
  }
  return String(err);
}

/** The pod is not known on this node (API: NOT_FOUND). */
export class PodNotFoundError extends ProbeAgentError {
  constructor(message: string, context: Record<string, unknown> = {}) {
    super('pod-not-found', message, context);
  }
}

/** The pod cannot be probed by us: hostNetwork, sandboxed runtime (API: FAILED_PRECONDITION). */
export class UnsupportedPodError extends ProbeAgentError {
  constructor(message: string, context: Record<string, unknown> = {}) {
    super('pod-unsupported', message, context);
  }
}

/** The pod's netns cannot be resolved right now (API: UNAVAILABLE). */
export class NetnsUnavailableError extends ProbeAgentError {
  constructor(message: string, context: Record<string, unknown> = {}, options?: { cause?: unknown }) {
    super('netns-unavailable', message, context, options);
  }
}

/** Too many probes in flight or queued (API: RESOURCE_EXHAUSTED). */
export class OverloadedError extends ProbeAgentError {
  constructor(message: string, context: Record<string, unknown> = {}) {
    super('overloaded', message, context);
  }
}
