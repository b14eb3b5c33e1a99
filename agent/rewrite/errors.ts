import { ProbeAgentError } from '../errors.ts';

/** A manifest the rewrite cannot handle: `path` is the field (e.g. `spec.containers[0].livenessProbe`). */
export class RewriteError extends ProbeAgentError {
  readonly path: string;
  constructor(path: string, message: string, context: Record<string, unknown> = {}) {
    super('rewrite-invalid', path ? `${path}: ${message}` : message, { ...context, path });
    this.path = path;
  }
}
