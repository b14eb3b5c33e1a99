/**
 * The gauges the alerts read and no other module owns (agent/metrics/ops-metrics.ts), scraped
 * through a real prom-client registry: probe_agent_ready follows the /readyz checks,
 * and probe_agent_memory_limit_bytes reads the cgroup v2 memory.max of the process's own cgroup
 * (probe_agent_close_hole_*: close-hole-state.test.ts).
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { Registry } from 'prom-client';
import { afterAll, describe, expect, it } from 'vitest';
import { HealthRegistry } from '../../agent/metrics/health.ts';
import { readMemoryLimitBytes, registerMemoryLimitGauge, registerReadinessGauge } from '../../agent/metrics/ops-metrics.ts';

const scratch = mkdtempSync(path.join(tmpdir(), 'probe-agent-ops-metrics-'));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

/** The value of an unlabelled series in a scrape, or undefined when the scrape lacks it. */
async function sample(registry: Registry, name: string): Promise<number | undefined> {
  const line = (await registry.metrics()).split('\n').find((l) => l.startsWith(`${name} `));
  return line === undefined ? undefined : Number(line.split(' ')[1]);
}

describe('probe_agent_ready', () => {
  it('is the verdict of the latest full /readyz run: absent before one, 1 ready, 0 as soon as a check fails', async () => {
    const health = new HealthRegistry();
    let kubeletFresh = true;
    health.addReadiness('kubelet', () => {
      if (!kubeletFresh) throw new Error('stale');
    });
    const registry = new Registry();
    registerReadinessGauge(registry, health);
    try {
      expect(await sample(registry, 'probe_agent_ready')).toBeUndefined();
      await health.run('readyz');
      expect(await sample(registry, 'probe_agent_ready')).toBe(1);
      kubeletFresh = false;
      // A scrape runs no check: the verdict changes with the next /readyz.
      expect(await sample(registry, 'probe_agent_ready')).toBe(1);
      await health.run('readyz');
      expect(await sample(registry, 'probe_agent_ready')).toBe(0);
      // A run with exclusions (or /livez) is not the agent's readiness.
      await health.run('readyz', ['kubelet']);
      await health.run('livez');
      expect(await sample(registry, 'probe_agent_ready')).toBe(0);
      kubeletFresh = true;
      await health.run('readyz');
      expect(await sample(registry, 'probe_agent_ready')).toBe(1);
      health.markShuttingDown();
      await health.run('readyz');
      expect(await sample(registry, 'probe_agent_ready')).toBe(0);
    } finally {
      health.close();
    }
  });
});

describe('probe_agent_memory_limit_bytes', () => {
  function cgroupFixture(name: string, selfCgroup: string, files: Record<string, string>) {
    const dir = path.join(scratch, name);
    mkdirSync(dir, { recursive: true });
    writeFileSync(path.join(dir, 'self-cgroup'), selfCgroup);
    for (const [rel, text] of Object.entries(files)) {
      mkdirSync(path.dirname(path.join(dir, 'root', rel)), { recursive: true });
      writeFileSync(path.join(dir, 'root', rel), text);
    }
    return { selfCgroup: path.join(dir, 'self-cgroup'), cgroupRoot: path.join(dir, 'root') };
  }

  it("reads memory.max of the process's own cgroup v2, the namespace root in a container", async () => {
    const host = cgroupFixture('host', '0::/kubepods.slice/kubepods-pod1.slice/cri-abc.scope\n', {
      'memory.max': 'max\n',
      'kubepods.slice/kubepods-pod1.slice/cri-abc.scope/memory.max': '234881024\n',
    });
    expect(await readMemoryLimitBytes(host)).toBe(224 * 1024 * 1024);
    const container = cgroupFixture('container', '0::/\n', { 'memory.max': '234881024\n' });
    expect(await readMemoryLimitBytes(container)).toBe(224 * 1024 * 1024);
    const registry = new Registry();
    registerMemoryLimitGauge(registry, container);
    expect(await sample(registry, 'probe_agent_memory_limit_bytes')).toBe(234881024);
  });

  it('reads memory.limit_in_bytes of the memory controller on cgroup v1 and hybrid hosts', async () => {
    const v1 = cgroupFixture('v1', '5:cpu,cpuacct:/x\n4:memory:/kubepods/pod1/abc\n0::/\n', {
      'memory/kubepods/pod1/abc/memory.limit_in_bytes': '234881024\n',
    });
    expect(await readMemoryLimitBytes(v1)).toBe(234881024);
  });

  it('finds the limit of a container without a cgroup namespace: full path in /proc/self/cgroup, own cgroup at the mount root', async () => {
    const v2 = cgroupFixture('no-ns-v2', '0::/kubepods.slice/kubepods-pod1.slice/cri-abc.scope\n', { 'memory.max': '234881024\n' });
    expect(await readMemoryLimitBytes(v2)).toBe(234881024);
    const v1 = cgroupFixture('no-ns-v1', '4:memory:/kubepods/burstable/pod1/abc\n', { 'memory/memory.limit_in_bytes': '234881024\n' });
    expect(await readMemoryLimitBytes(v1)).toBe(234881024);
  });

  it('is absent without a limit, outside the namespace view, or with garbage', async () => {
    const cases = {
      unlimited: cgroupFixture('unlimited', '0::/\n', { 'memory.max': 'max\n' }),
      v1Unlimited: cgroupFixture('v1-unlimited', '4:memory:/\n', { 'memory/memory.limit_in_bytes': '9223372036854771712\n' }),
      v1WithoutMemory: cgroupFixture('v1-no-memory', '4:cpu:/kubepods/pod1/abc\n', { 'memory.max': '234881024\n' }),
      outside: cgroupFixture('outside', '0::/../other\n', { 'memory.max': '234881024\n' }),
      garbage: cgroupFixture('garbage', '0::/\n', { 'memory.max': '-1\n' }),
      missing: cgroupFixture('missing', '0::/gone\n', {}),
    };
    for (const [name, paths] of Object.entries(cases)) {
      expect(await readMemoryLimitBytes(paths), name).toBeUndefined();
      const registry = new Registry();
      registerMemoryLimitGauge(registry, paths);
      expect(await sample(registry, 'probe_agent_memory_limit_bytes'), name).toBeUndefined();
    }
  });
});
