/**
 * Kubelet-shaped pod cgroups for the soak, so that the agent can find a pod's netns with its procfs
 * resolver: one `sleep` per pod (its "pause" process) that joins <pids>/<prefix>/kubepods/
 * besteffort/pod<uid>/pause in the cgroup v1 pids hierarchy and then enters a lab netns. The
 * procfs resolver reads /proc only, so its cost does not depend on the netns other tests keep on
 * a shared machine (the address resolver lists every one of them).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { removeCgroupTree } from '../support/cgroup-tree.ts';

const PIDS = '/sys/fs/cgroup/pids';
const PREFIX = 'probe-agent-soak-';

/** The pause processes of one soak run, under a cgroup prefix named after this process. */
export class PodCgroups {
  readonly root = path.join(PIDS, `${PREFIX}${process.pid}`);
  readonly #pause = new Map<string, ChildProcess>();

  /** Removes the trees of earlier runs whose process is gone; throws when there is no v1 pids hierarchy. */
  static sweep(): void {
    if (!existsSync(PIDS)) throw new Error(`${PIDS} is missing: the procfs soak needs the cgroup v1 pids hierarchy`);
    for (const e of readdirSync(PIDS)) {
      const m = new RegExp(`^${PREFIX}(\\d+)$`).exec(e);
      if (m && !existsSync(`/proc/${m[1]}`)) removeCgroupTree(path.join(PIDS, e));
    }
  }

  /** Starts (or replaces) pod `uid`'s pause process in the netns named `netns`; resolves once it is there. */
  async start(uid: string, netns: string): Promise<void> {
    await this.stop(uid);
    const dir = path.join(this.root, 'kubepods', 'besteffort', `pod${uid}`, 'pause');
    mkdirSync(dir, { recursive: true });
    const child = spawn('sh', ['-c', 'echo $$ > "$1/cgroup.procs" && exec ip netns exec "$2" sleep infinity', 'sh', dir, netns], { stdio: 'ignore' });
    this.#pause.set(uid, child);
    const want = statSync(`/run/netns/${netns}`).ino;
    const deadline = Date.now() + 5000;
    while (Date.now() < deadline) {
      try {
        if (readFileSync(`/proc/${child.pid}/comm`, 'utf8').trim() === 'sleep' && statSync(`/proc/${child.pid}/ns/net`).ino === want) return;
      } catch {
        // not there yet
      }
      await new Promise((r) => setTimeout(r, 10));
    }
    throw new Error(`pause process of pod ${uid} did not reach netns ${netns}`);
  }

  /** Kills pod `uid`'s pause process and removes its cgroup. */
  async stop(uid: string): Promise<void> {
    const child = this.#pause.get(uid);
    this.#pause.delete(uid);
    if (child && child.exitCode === null && child.signalCode === null) {
      const gone = new Promise((r) => child.once('exit', r));
      child.kill('SIGKILL');
      await gone;
    }
    removeCgroupTree(path.join(this.root, 'kubepods', 'besteffort', `pod${uid}`));
  }

  /** Kills every pause process and removes the whole tree. */
  async destroy(): Promise<void> {
    await Promise.all([...this.#pause.keys()].map((uid) => this.stop(uid)));
    removeCgroupTree(this.root);
  }
}

