/**
 * Whether the container runtime says a pod's sandbox has stopped: the earliest sign, before the
 * kubelet's pod list shows a deletion, that the pod is going. A liveness or startup failure seen
 * then is the pod's shutdown, not the app's ill health, and must not restart anything.
 */
import { POD_UID_LABEL } from '../netns/cri-resolver.ts';
import type { CriClient } from '../netns/cri-client.ts';

/** Resolves with why the pod's sandbox is going, or undefined when it runs or the runtime cannot say. */
export type SandboxGoing = (podUID: string, signal?: AbortSignal) => Promise<string | undefined>;

/** A SandboxGoing that asks the CRI for every sandbox of the pod (not only READY ones). */
export function criSandboxGoing(client: Pick<CriClient, 'listPodSandbox'>): SandboxGoing {
  return async (podUID, signal) => {
    let items;
    try {
      items = await client.listPodSandbox({ labelSelector: { [POD_UID_LABEL]: podUID } }, signal);
    } catch {
      return undefined; // The runtime cannot be asked: say nothing, the probe's own result stands.
    }
    const mine = items.filter((s) => s.labels?.[POD_UID_LABEL] === podUID);
    // No sandbox at all: a pod this runtime does not run (found by another resolver). Say nothing.
    if (mine.length === 0 || mine.some((s) => s.state === 'SANDBOX_READY')) return undefined;
    const last = mine.reduce((a, b) => (newer(b.createdAt, a.createdAt) ? b : a));
    return `sandbox ${last.id.slice(0, 12)} is ${last.state}`;
  };
}

/** Whether CRI timestamp `a` (int64 nanoseconds as a string) is later than `b`. */
function newer(a: string, b: string): boolean {
  try {
    return BigInt(a) > BigInt(b);
  } catch {
    return false;
  }
}
