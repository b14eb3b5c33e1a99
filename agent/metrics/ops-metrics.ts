/**
 * Gauges an operator alerts on that no other module owns, all read at scrape time:
 * - probe_agent_ready: the verdict of the agent's latest /readyz (what kubelet and the close-hole
 *   sidecar act on), so "up but not ready" is visible without kube-state-metrics;
 * - probe_agent_memory_limit_bytes: the memory limit of the agent's cgroup (cgroup v2
 *   memory.max or v1 memory.limit_in_bytes), to compare with process_resident_memory_bytes before the OOM killer does;
 * (The close-hole sidecar's metrics are in close-hole-state.ts.)
 * Every collect is bounded and never throws: a gauge it cannot read is left out of the scrape.
 */
import { Gauge, type Registry } from 'prom-client';
import type { HealthRegistry } from './health.ts';
import { leaveOut, readSmallFile } from './scrape-file.ts';

/**
 * probe_agent_ready: the verdict of the latest full /readyz run (1 ready, 0 not), absent before
 * the first. Passive on purpose: running the checks at scrape time made every scrape a gRPC self
 * call and a helper request, which slowed the agent's own API under load (api-abuse.test.ts);
 * kubelet's readinessProbe (every 5 s in deploy/base) and the close-hole sidecar keep it fresh.
 */
export function registerReadinessGauge(registry: Registry, health: Pick<HealthRegistry, 'lastReadiness'>): void {
  new Gauge({
    name: 'probe_agent_ready',
    help: 'The verdict of the latest /readyz (kubelet poll fresh, gRPC socket answering, helper self-test, not shutting down): 1 ready, 0 not.',
    registers: [registry],
    collect() {
      const last = health.lastReadiness();
      if (last) this.set(last.ok ? 1 : 0);
      else leaveOut(this);
    },
  });
}

/** Where the cgroup files are; tests point these at files they create. */
export interface CgroupPaths {
  /** /proc/self/cgroup */
  selfCgroup: string;
  /** The cgroup v2 mount, /sys/fs/cgroup. */
  cgroupRoot: string;
}

const DEFAULT_CGROUP_PATHS: CgroupPaths = { selfCgroup: '/proc/self/cgroup', cgroupRoot: '/sys/fs/cgroup' };

/**
 * The memory limit of this process's cgroup in bytes: cgroup v2 memory.max, else (v1 or hybrid
 * hosts) the memory controller's memory.limit_in_bytes; undefined when unlimited ("max", or v1's
 * page-rounded 2^63) or unreadable. Seen through a cgroup namespace (containers) the own path is
 * "/", so the namespace root's file is the container's limit; without one, the container's cgroup
 * is mounted at the root while /proc/self/cgroup shows its full path.
 */
export async function readMemoryLimitBytes(paths: CgroupPaths = DEFAULT_CGROUP_PATHS): Promise<number | undefined> {
  const lines = (await readSmallFile(paths.selfCgroup))?.text.split('\n') ?? [];
  const pathOf = (prefix: RegExp): string | undefined => {
    const line = lines.find((l) => prefix.test(l));
    const rel = line?.slice(line.indexOf(':', line.indexOf(':') + 1) + 1).trim();
    // A "/.." path means our cgroup is outside the namespace's view: nothing trustworthy to read.
    return rel !== undefined && rel.startsWith('/') && !rel.split('/').includes('..') ? rel.replace(/\/$/, '') : undefined;
  };
  const v2 = pathOf(/^0::/);
  const v1 = pathOf(/^\d+:(?:[^:]*,)?memory(?:,[^:]*)?:/);
  // Without a cgroup namespace a container still sees its full cgroup path in /proc/self/cgroup,
  // but its own cgroup mounted at the root of /sys/fs/cgroup: so after the path, the root's file.
  const candidates = [
    v2 !== undefined ? `${paths.cgroupRoot}${v2}/memory.max` : undefined,
    v2 !== undefined && v2 !== '' ? `${paths.cgroupRoot}/memory.max` : undefined,
    v1 !== undefined ? `${paths.cgroupRoot}/memory${v1}/memory.limit_in_bytes` : undefined,
    v1 !== undefined && v1 !== '' ? `${paths.cgroupRoot}/memory/memory.limit_in_bytes` : undefined,
  ];
  for (const file of candidates) {
    if (file === undefined) continue;
    const text = (await readSmallFile(file))?.text.trim();
    if (text === undefined) continue;
    if (!/^\d{1,20}$/.test(text)) return undefined;
    const bytes = Number(text);
    // v1 says "unlimited" with a page-rounded 2^63, far beyond any safe integer.
    return Number.isSafeInteger(bytes) && bytes > 0 ? bytes : undefined;
  }
  return undefined;
}

/** probe_agent_memory_limit_bytes, absent while the cgroup has no memory limit. */
export function registerMemoryLimitGauge(registry: Registry, paths: CgroupPaths = DEFAULT_CGROUP_PATHS): void {
  new Gauge({
    name: 'probe_agent_memory_limit_bytes',
    help: "The memory limit of the agent's cgroup (cgroup v2 memory.max, v1 memory.limit_in_bytes); absent when there is none.",
    registers: [registry],
    async collect() {
      const bytes = await readMemoryLimitBytes(paths);
      if (bytes === undefined) leaveOut(this);
      else this.set(bytes);
    },
  });
}
