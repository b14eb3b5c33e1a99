/**
 * Gates mode's view of container restarts from the runtime itself. Kubelet restarts a crashed
 * container within about a second and, with the network probes taken out of the spec, shows the new
 * container ready at once: the pod is Ready on the gate the old container earned until the agent
 * writes False. Kubelet's /pods (polled every few seconds, and behind kubelet's own status writes)
 * is too late for that; the runtime's container list (CRI ListContainers on the node's socket,
 * every second, one local call) is not. It only ever turns the condition False; True still waits
 * for the new container's own probe results.
 */
import { describeError } from '../errors.ts';
import type { Logger } from '../log.ts';
import type { CriContainer } from '../netns/cri-client.ts';
import { CONTAINER_LABELS } from '../prober/sandbox-view.ts';

/** One container as the runtime lists it: the pod's UID and the container's name come from kubelet's labels. */
export interface RuntimeContainer {
  id: string;
  podUID: string;
  name: string;
  running: boolean;
  /** Nanoseconds since the epoch (CRI created_at). */
  createdAt: bigint;
}

/** The runtime's containers that kubelet made, read from a ListContainers answer. Pure. */
export function runtimeContainers(items: readonly CriContainer[]): RuntimeContainer[] {
  const out: RuntimeContainer[] = [];
  for (const c of items) {
    const podUID = c.labels?.[CONTAINER_LABELS.podUID];
    const name = c.labels?.[CONTAINER_LABELS.containerName] ?? c.metadata?.name;
    if (!podUID || !name || !c.id) continue;
    let createdAt = 0n;
    try {
      createdAt = BigInt(c.createdAt || '0');
    } catch { /* a runtime's odd timestamp: sorts first */ }
    out.push({ id: c.id, podUID, name, running: c.state === 'CONTAINER_RUNNING', createdAt });
  }
  return out;
}

/** Lists the runtime's containers every `intervalMs`; the returned function stops it. */
export function startRuntimeWatch(o: {
  list: () => Promise<CriContainer[]>;
  intervalMs: number;
  onContainers: (containers: RuntimeContainer[]) => void;
  log: Logger;
}): () => void {
  let busy = false;
  let failing = false;
  const tick = (): void => {
    if (busy) return;
    busy = true;
    o.list().then(
      (items) => {
        if (failing) o.log.info('runtime container list read again');
        failing = false;
        o.onContainers(runtimeContainers(items));
      },
      (err: unknown) => {
        // Once per streak; kubelet's /pods still tells restarts, later.
        if (!failing) o.log.warn('runtime container list not read; restarts are seen from kubelet\'s pod list only', { err: describeError(err) });
        failing = true;
      },
    ).finally(() => (busy = false));
  };
  const timer = setInterval(tick, o.intervalMs);
  timer.unref();
  tick();
  return () => clearInterval(timer);
}
