/**
 * Pod "sandboxes" for the procfs netns resolver: one tiny long-lived process per lab pod (a `cat`
 * on a pipe from us, standing in for the pause container) inside the pod's netns AND inside a
 * kubelet-shaped pod cgroup (<root>/kubepods/besteffort/pod<uid>), which is what the resolver
 * looks for in /proc/<pid>/cgroup on a real node. Everything lives below one cgroup directory named
 * after this process and is removed by stop(); leftovers of a killed run are swept on the next.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { pidAlive, removeCgroupTree } from '../support/cgroup-tree.ts';

const PREFIX = 'probe-agent-bench-';
/** cgroup v1 pids hierarchy (hybrid hosts), the v2 unified mount of hybrid hosts, or a pure v2 host. */
const CANDIDATE_ROOTS = ['/sys/fs/cgroup/pids', '/sys/fs/cgroup/unified', '/sys/fs/cgroup'];

/** A pod to give a sandbox process. */
export interface SandboxPod {
  /** Netns name under /run/netns. */
  netnsName: string;
  uid: string;
}

/** Running sandbox processes; stop() kills them and removes the cgroups. */
export interface Sandboxes {
  cgroupRoot: string;
  stop(): Promise<void>;
}



/** Deletes bench cgroup trees whose owning bench process is gone. */
function sweep(hierarchy: string): void {
  for (const name of readdirSync(hierarchy)) {
    const pid = Number(name.slice(PREFIX.length));
    if (name.startsWith(PREFIX) && Number.isInteger(pid) && !pidAlive(pid)) removeCgroupTree(join(hierarchy, name));
  }
}

function pickHierarchy(): string {
  for (const root of CANDIDATE_ROOTS) {
    if (!existsSync(join(root, 'cgroup.procs'))) continue;
    const probe = join(root, `${PREFIX}${process.pid}`);
    try {
      mkdirSync(probe, { recursive: true });
      return root;
    } catch {
      // read-only or not ours to use: try the next
    }
  }
  throw new Error(`no writable cgroup hierarchy among ${CANDIDATE_ROOTS.join(', ')}`);
}

async function waitInNetns(child: ChildProcess, netnsName: string): Promise<void> {
  const want = statSync(`/run/netns/${netnsName}`).ino;
  const end = Date.now() + 5000;
  while (Date.now() < end) {
    try {
      if (statSync(`/proc/${child.pid}/ns/net`).ino === want) return;
    } catch {
      // not started yet
    }
    if (child.exitCode !== null) break;
    await new Promise((r) => setTimeout(r, 5));
  }
  throw new Error(`sandbox process for ${netnsName} never entered its netns`);
}

/** Starts one sandbox process per pod in its netns and pod cgroup. */
export async function startSandboxes(pods: SandboxPod[]): Promise<Sandboxes> {
  const hierarchy = pickHierarchy();
  sweep(hierarchy);
  const root = join(hierarchy, `${PREFIX}${process.pid}`);
  const children: ChildProcess[] = [];
  const stop = async (): Promise<void> => {
    await Promise.all(children.map((c) => new Promise<void>((resolve) => {
      if (c.exitCode !== null || c.signalCode !== null) return resolve();
      c.once('exit', () => resolve());
      c.kill('SIGKILL');
    })));
    if (existsSync(root)) removeCgroupTree(root);
  };
  try {
    for (const pod of pods) {
      if (!/^[0-9a-f-]+$/.test(pod.uid)) throw new Error(`pod uid ${JSON.stringify(pod.uid)} is not UID-shaped`);
      const dir = join(root, 'kubepods', 'besteffort', `pod${pod.uid}`);
      mkdirSync(dir, { recursive: true });
      // `cat` on our pipe: exits by itself when this process dies, like a pod whose runtime went away.
      const child = spawn('ip', ['netns', 'exec', pod.netnsName, 'cat'], { stdio: ['pipe', 'ignore', 'ignore'] });
      children.push(child);
      child.stdin?.on('error', () => {});
      writeFileSync(join(dir, 'cgroup.procs'), String(child.pid));
      await waitInNetns(child, pod.netnsName);
    }
  } catch (err) {
    await stop();
    throw err;
  }
  return { cgroupRoot: root, stop };
}
