/**
 * Feature gates in the KEP-3920 style: every behaviour that changes probe semantics has a
 * named gate with a stage, a default and, once GA, a lock. Set with --feature-gates A=true,B=false.
 */
import { ConfigError } from './errors.ts';

export type Stage = 'ALPHA' | 'BETA' | 'GA' | 'DEPRECATED';

/** One gate's definition. */
export interface FeatureSpec {
  stage: Stage;
  default: boolean;
  /** A locked gate cannot be set to anything but its default. */
  lockToDefault: boolean;
  description: string;
}

/** Every gate the agent knows. */
export const FEATURES = {
  InNamespaceProbes: {
    stage: 'GA',
    default: true,
    lockToDefault: true,
    description: 'Run TCP/HTTP/gRPC probes inside the pod network namespace (the reason the agent exists).',
  },
  HappyEyeballs: {
    stage: 'BETA',
    default: true,
    lockToDefault: false,
    description: 'Dual-stack pods: try every pod address family, RFC 8305 staggered, first connect wins (kubelet uses the primary IP only).',
  },
  ProbePhaseTimings: {
    stage: 'BETA',
    default: true,
    lockToDefault: false,
    description: 'Measure and export per-phase probe timings (queue, helper, connect, TLS, first byte).',
  },
  LegacyHostFieldProbes: {
    stage: 'ALPHA',
    default: false,
    lockToDefault: false,
    description: 'Probes whose deprecated host field names another host run from the node netns as kubelet does (re-opens the SSRF); off = refused.',
  },
  WarmNetnsHelper: {
    stage: 'ALPHA',
    default: false,
    lockToDefault: false,
    description: 'The resident helper makes sockets itself (setns, socket, setns back) instead of forking a child per probe.',
  },
  NetnsHelperPool: {
    stage: 'BETA',
    default: true,
    lockToDefault: false,
    description: 'Long-lived helper workers (--helper-pool-size) serve netns requests one at a time, killed and replaced past their deadline; off = a child per request. WarmNetnsHelper wins when both are on.',
  },
} as const satisfies Record<string, FeatureSpec>;

export type FeatureName = keyof typeof FEATURES;

/** The effective gate values; immutable after start. */
export class FeatureGates {
  readonly #values: Map<FeatureName, boolean>;

  constructor(overrides: Partial<Record<FeatureName, boolean>> = {}) {
    this.#values = new Map();
    for (const name of Object.keys(FEATURES) as FeatureName[]) {
      const spec: FeatureSpec = FEATURES[name];
      const want = overrides[name];
      if (want !== undefined && spec.lockToDefault && want !== spec.default) {
        throw new ConfigError(`feature gate ${name} is locked to ${spec.default} (stage ${spec.stage})`, { gate: name });
      }
      this.#values.set(name, want ?? spec.default);
    }
  }

  /** Whether `name` is on. */
  enabled(name: FeatureName): boolean {
    return this.#values.get(name) === true;
  }

  /** Every gate with its stage and effective value, sorted by name. */
  list(): { name: FeatureName; stage: Stage; enabled: boolean }[] {
    return [...this.#values.entries()]
      .map(([name, enabled]) => ({ name, stage: (FEATURES[name] as FeatureSpec).stage, enabled }))
      .sort((a, b) => a.name.localeCompare(b.name));
  }
}

/** Parses "A=true,B=false" (whitespace allowed) into gates; unknown names and bad values are errors. */
export function parseFeatureGates(text: string | undefined): FeatureGates {
  const overrides: Partial<Record<FeatureName, boolean>> = {};
  for (const part of (text ?? '').split(',').map((s) => s.trim()).filter(Boolean)) {
    const m = /^([A-Za-z0-9]+)\s*=\s*(true|false)$/i.exec(part);
    if (!m) throw new ConfigError(`invalid feature gate "${part}": want Name=true|false`, { gate: part });
    const name = m[1] as string;
    if (!(name in FEATURES)) {
      throw new ConfigError(`unknown feature gate "${name}" (known: ${Object.keys(FEATURES).join(', ')})`, { gate: name });
    }
    overrides[name as FeatureName] = (m[2] as string).toLowerCase() === 'true';
  }
  return new FeatureGates(overrides);
}
