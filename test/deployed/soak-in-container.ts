/**
 * The churn soak (test/soak/soak.ts) against the image as deployed: the agent container from
 * build/probe-agent-image.tar with deploy/base's posture (the memory limit, request and heap cap
 * of the rendered manifest, read-only root, SYS_ADMIN only, RuntimeDefault seccomp), started
 * through the lab's containerd like kubelet starts it (containerized-agent.ts), and the kernel's
 * memory figures of its container.
 *
 *   make soak-deployed                            # 10 minutes, 100 pods x 3 probes at 1 s
 *   SOAK_MINUTES=3 SOAK_PODS=100 SOAK_SEED=42 node test/deployed/soak-in-container.ts
 *
 * test/deployed/soak.test.ts runs it for a minute with 30 pods.
 */
import { execFile } from 'node:child_process';
import { existsSync, rmSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { createContainerdLab, type ContainerdLab } from '../lab/containerd.ts';
import { labScratch } from '../lab/slots.ts';
import { requireRoot } from '../support/root.ts';
import { markdown, runSoak, soakSizeFromEnv, verdicts, type SoakOptions, type SoakReport } from '../soak/soak.ts';
import { CriPodRunner } from './cri-pod.ts';
import { startContainerizedAgent, type ContainerizedAgent, type ContainerMemory } from './containerized-agent.ts';

const run = promisify(execFile);
const IMAGE_TAR = fileURLToPath(new URL('../../build/probe-agent-image.tar', import.meta.url));
const MiB = 2 ** 20;

/** The soak's report and the container's memory. */
export interface ContainerSoakResult {
  report: SoakReport;
  memory: ContainerMemory;
  logTail: string;
}

/** Runs the soak with the agent in its container; the soak's options minus resolver and agent start. */
export async function runSoakInContainer(o: Omit<SoakOptions, 'resolver' | 'startAgent' | 'agentEnv'>): Promise<ContainerSoakResult> {
  if (!existsSync(IMAGE_TAR)) throw new Error(`${IMAGE_TAR} is missing: run \`make image\` first`);
  const scratch = labScratch('deployed-soak-');
  let ctrd: ContainerdLab | undefined;
  let runner: CriPodRunner | undefined;
  let agent: ContainerizedAgent | undefined;
  try {
    ctrd = await createContainerdLab();
    const lab = ctrd;
    const cri = (runner = new CriPodRunner(lab.socket));
    await run('ctr', ['--address', lab.socket, '-n', 'k8s.io', 'images', 'import', '--snapshotter', 'overlayfs', IMAGE_TAR], { timeout: 120_000 });
    const report = await runSoak({
      ...o,
      // The soak's pods live in lab netns under /run/netns, not in CRI sandboxes: the address
      // resolver finds them there through the manifest's HostToContainer mount (procfs would need
      // the procfs-resolver component's hostPID).
      resolver: 'address',
      startAgent: async (kubelet) => {
        agent = await startContainerizedAgent({
          ctrd: lab, runner: cri, scratch, kubelet,
          // host-network: the test kubelet listens on the node's loopback.
          components: ['host-network'],
          env: {
            // https, verified against the CA the manifest names (the service-account ca.crt).
            PROBE_AGENT_KUBELET_URL: kubelet.httpsUrl,
            PROBE_AGENT_NETNS_RESOLVERS: 'address',
            // The judge gives each change 6 s to show (soak.ts SETTLE_MS), as in the host soak.
            PROBE_AGENT_KUBELET_POLL_INTERVAL: '1s',
          },
        });
        return agent;
      },
    });
    if (!agent) throw new Error('the soak did not start the agent');
    return { report, memory: agent.memory(), logTail: agent.logTail(4) };
  } finally {
    await agent?.remove().catch(() => {});
    runner?.close();
    await ctrd?.destroy();
    rmSync(scratch, { recursive: true, force: true });
  }
}

/** One line with the container's memory against its limit. */
export function memoryLine(m: ContainerMemory): string {
  const pct = (b: number): string => `${((100 * b) / m.limitBytes).toFixed(0)} %`;
  return `container memory: limit ${m.limitBytes / MiB} MiB; cgroup peak ${(m.peakUsageBytes / MiB).toFixed(1)} MiB (${pct(m.peakUsageBytes)}); ` +
    `agent peak RSS ${(m.agentPeakRssBytes / MiB).toFixed(1)} MiB (${pct(m.agentPeakRssBytes)}), at the end ${(m.agentRssAnonBytes / MiB).toFixed(1)} MiB anonymous + ` +
    `${(m.agentRssFileBytes / MiB).toFixed(1)} MiB file-backed; OOM kills ${m.oomKills}`;
}

/** The in-container verdicts on top of the soak's: no OOM kill, peak RSS and cgroup peak at most 75 % of the limit. */
export function memoryVerdicts(m: ContainerMemory): string[] {
  const out: string[] = [];
  if (m.oomKills > 0) out.push(`${m.oomKills} OOM kills in the agent's cgroup`);
  if (!(m.agentPeakRssBytes > 0)) out.push('no RSS figure for the agent');
  if (m.agentPeakRssBytes > m.limitBytes * 0.75) out.push(`agent peak RSS ${(m.agentPeakRssBytes / MiB).toFixed(1)} MiB above 75 % of the ${m.limitBytes / MiB} MiB limit`);
  if (m.peakUsageBytes > m.limitBytes * 0.75) out.push(`cgroup peak ${(m.peakUsageBytes / MiB).toFixed(1)} MiB above 75 % of the ${m.limitBytes / MiB} MiB limit`);
  return out;
}

async function main(): Promise<void> {
  requireRoot(['ip', 'nft', 'containerd', 'ctr', 'kubectl']);
  const size = soakSizeFromEnv();
  const started = Date.now();
  const { report, memory, logTail } = await runSoakInContainer({
    ...size,
    log: (l) => process.stderr.write(`${new Date().toISOString()} ${l}\n`),
  });
  process.stdout.write(`${markdown(report)}\n\ntimeline [s, fds, children, zombies, RSS MB, CPU %, queued]: ${JSON.stringify(report.timeline)}\n${memoryLine(memory)}\n`);
  if (report.wrongSamples.length) process.stdout.write(`wrong results kept:\n${report.wrongSamples.map((w) => JSON.stringify(w)).join('\n')}\n`);
  const bad = [...verdicts(report, 150), ...memoryVerdicts(memory)];
  process.stdout.write(bad.length ? `SOAK FAILED:\n- ${bad.join('\n- ')}\nagent log: ${logTail}\n` : `soak passed in ${Math.round((Date.now() - started) / 1000)} s\n`);
  process.exitCode = bad.length ? 1 : 0;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  main().catch((err: unknown) => {
    process.stderr.write(`soak: ${err instanceof Error ? err.stack : String(err)}\n`);
    process.exitCode = 2;
  });
}
