/**
 * Gates mode's view of container restarts from the runtime itself. Kubelet restarts a crashed
 * container within about a second and, with the network probes taken out of the spec, shows the new
 * container ready at once: the pod is Ready on the gate the old container earned until the agent
 * writes False. Kubelet's /pods (polled every few seconds, and behind kubelet's own status writes)
 * is too late for that; the runtime is not. It only ever turns the condition False; True still waits
 * for the new container's own probe results.
 *
 * Source: the runtime's container event stream (CRI GetContainerEvents, containerd 1.7+), which says
 * at once that a container started, stopped or went. Events are lossy across reconnects, so every
 * (re)subscription is followed by one ListContainers that the events received meanwhile are replayed
 * on, and a full list runs every `resyncMs` as a safety net (kubelet's Evented PLEG relists too). A
 * runtime without the stream (containerd 1.6: UNIMPLEMENTED; CRI-O with `enable_pod_events = false`,
 * its default: the stream ends at once, empty) is listed every `intervalMs` instead, and asked for
 * the stream again every `retryEventsMs` (an in-place runtime upgrade, a changed config).
 * Either way the consumer gets the same thing: the node's containers as the runtime last said.
 */
import { describeError } from '../errors.ts';
import type { Logger } from '../log.ts';
import type { CriContainer, CriContainerEvent, CriContainerStatus, CriEventStream } from '../netns/cri-client.ts';
import { CONTAINER_LABELS } from '../prober/sandbox-view.ts';

/** One container as the runtime lists it: the pod's UID and the container's name come from kubelet's labels. */
export interface RuntimeContainer {
  id: string;
  podUID: string;
  name: string;
  running: boolean;
  /** Nanoseconds since the epoch (CRI created_at). */
  createdAt: bigint;
  /** Nanoseconds since the epoch (CRI started_at); 0: not known (a list does not carry it). */
  startedAt: bigint;
  /** The sandbox's IPs, primary first, as an event's sandbox status gives them (kubelet's source too); empty from a list. */
  podIPs?: string[];
}

/** Where the watch's view comes from now. */
export type RuntimeWatchSource = 'events' | 'list';

/** gRPC's OK and UNIMPLEMENTED. */
const OK = 0;
const UNIMPLEMENTED = 12;
/**
 * Streams in a row that ended cleanly before any event: the runtime has none to send. CRI-O with
 * pod events off returns from GetContainerEvents at once; a runtime's clean shutdown ends one only.
 */
const EMPTY_ENDS_MEAN_NONE = 3;

function nanos(v: string | undefined): bigint {
  try {
    return BigInt(v || '0');
  } catch {
    return 0n; // a runtime's odd timestamp: sorts first
  }
}

function fromLabels(id: string, labels: Record<string, string> | undefined, metaName: string | undefined, running: boolean, createdAt: string, startedAt: string | undefined): RuntimeContainer | undefined {
  const podUID = labels?.[CONTAINER_LABELS.podUID];
  const name = labels?.[CONTAINER_LABELS.containerName] ?? metaName;
  if (!podUID || !name || !id) return undefined;
  return { id, podUID, name, running, createdAt: nanos(createdAt), startedAt: nanos(startedAt) };
}

/** The runtime's containers that kubelet made, read from a ListContainers answer. Pure. */
export function runtimeContainers(items: readonly CriContainer[]): RuntimeContainer[] {
  const out: RuntimeContainer[] = [];
  for (const c of items) {
    const r = fromLabels(c.id, c.labels, c.metadata?.name, c.state === 'CONTAINER_RUNNING', c.createdAt, undefined);
    if (r) out.push(r);
  }
  return out;
}

/** One container status of an event, as the list would show it; undefined when kubelet did not make it. Pure. */
export function statusContainer(s: CriContainerStatus, sandbox?: CriContainerEvent['podSandboxStatus']): RuntimeContainer | undefined {
  const c = fromLabels(s.id, s.labels, s.metadata?.name, s.state === 'CONTAINER_RUNNING', s.createdAt, s.startedAt);
  const net = sandbox?.network;
  if (c && net?.ip) c.podIPs = [net.ip, ...(net.additionalIps ?? []).map((a) => a.ip).filter((ip) => ip)];
  return c;
}

/**
 * Applies one event to `view` (container ID -> container): the statuses it carries are the
 * sandbox's containers at the event's time; a stopped container is not running whatever they say;
 * a deleted one goes. New IDs beyond `max` are not added (false). Pure but for `view`.
 */
export function applyEvent(view: Map<string, RuntimeContainer>, e: CriContainerEvent, max: number): boolean {
  let fits = true;
  for (const s of e.containersStatuses ?? []) {
    const c = statusContainer(s, e.podSandboxStatus);
    if (!c) continue;
    if (!view.has(c.id) && view.size >= max) {
      fits = false;
      continue;
    }
    view.set(c.id, c);
  }
  const id = e.containerId;
  if (e.containerEventType === 'CONTAINER_DELETED_EVENT') view.delete(id);
  else if (e.containerEventType === 'CONTAINER_STOPPED_EVENT') {
    const c = view.get(id);
    if (c?.running) view.set(id, { ...c, running: false });
  }
  return fits;
}

export interface RuntimeWatchOptions {
  list: () => Promise<CriContainer[]>;
  /** Subscribes to the runtime's container events (CriClient.containerEvents); absent: list only. */
  events?: (onEvent: (e: CriContainerEvent) => void, onEnd: (err: Error) => void) => CriEventStream;
  /** The list's period without the event stream. */
  intervalMs: number;
  onContainers: (containers: RuntimeContainer[]) => void;
  /** The source in use, on every change (a metric). */
  onSource?: (source: RuntimeWatchSource) => void;
  /** One event received, by type (a metric). */
  onEvent?: (type: string) => void;
  log: Logger;
  /** With the stream: a full list this often. Default 60 s. */
  resyncMs?: number;
  /** Without it: ask for the stream again this often. Default 5 min. */
  retryEventsMs?: number;
  /** Longest wait before resubscribing after the stream ended. Default 5 s. */
  maxBackoffMs?: number;
  /** Containers the event view holds at most; events received during a catch-up list buffered at most. */
  maxContainers?: number;
  maxBuffered?: number;
}

/** A stream that lived this long resubscribes at the shortest back-off. */
const HEALTHY_STREAM_MS = 10_000;
const MIN_BACKOFF_MS = 100;

/** Watches the runtime's containers (events, else a list every `intervalMs`); the returned function stops it. */
export function startRuntimeWatch(o: RuntimeWatchOptions): () => void {
  const resyncMs = o.resyncMs ?? 60_000;
  const retryEventsMs = o.retryEventsMs ?? 300_000;
  const maxBackoffMs = o.maxBackoffMs ?? 5000;
  const maxContainers = o.maxContainers ?? 50_000;
  const maxBuffered = o.maxBuffered ?? 10_000;
  let stopped = false;
  let source: RuntimeWatchSource | undefined;
  let listFailing = false;
  let fallbackLogged = false;
  let overflowLogged = false;

  const setSource = (s: RuntimeWatchSource): void => {
    if (s === source) return;
    source = s;
    // The list's reason is said where it is chosen.
    if (s === 'events') o.log.info('container starts and stops come from the runtime\'s event stream (CRI GetContainerEvents)', { source: s });
    o.onSource?.(s);
  };
  const listFailed = (err: unknown): void => {
    // Once per streak; kubelet's /pods still tells restarts, later.
    if (!listFailing) o.log.warn('runtime container list not read; restarts are seen from kubelet\'s pod list only', { err: describeError(err) });
    listFailing = true;
  };
  const listed = (): void => {
    if (listFailing) o.log.info('runtime container list read again');
    listFailing = false;
  };

  // ---- Without the stream: the list every intervalMs. ----
  let pollTimer: NodeJS.Timeout | undefined;
  let polling = false;
  const tick = (): void => {
    if (polling || stopped) return;
    polling = true;
    o.list().then(
      (items) => {
        listed();
        if (!stopped && pollTimer) o.onContainers(runtimeContainers(items));
      },
      listFailed,
    ).finally(() => (polling = false));
  };
  const startPolling = (): void => {
    if (pollTimer || stopped) return;
    pollTimer = setInterval(tick, o.intervalMs);
    pollTimer.unref();
    tick();
  };
  const stopPolling = (): void => {
    if (pollTimer) clearInterval(pollTimer);
    pollTimer = undefined;
  };

  // ---- With the stream. ----
  let stream: CriEventStream | undefined;
  let generation = 0;
  const view = new Map<string, RuntimeContainer>();
  /** Events received while a catch-up list is out, replayed on its answer; undefined: none out. */
  let buffer: CriContainerEvent[] | undefined;
  let bufferOverflowed = false;
  let flushQueued = false;
  let timer: NodeJS.Timeout | undefined;
  let backoffMs = MIN_BACKOFF_MS;
  let subscribedAt = 0;
  /**
   * The stream is the source. A stream asked for again after UNIMPLEMENTED must first deliver an
   * event: until then the list goes on (a runtime answers UNIMPLEMENTED at once, but not always
   * before the catch-up list).
   */
  let trusted = false;
  /** The stream ended and no catch-up list has answered since. */
  let reconnecting = false;
  /** An event came on the current subscription. */
  let delivered = false;
  /** Subscriptions in a row that ended cleanly before any event. */
  let emptyEnds = 0;

  const later = (fn: () => void, ms: number): void => {
    if (timer) clearTimeout(timer);
    timer = setTimeout(() => {
      timer = undefined;
      if (!stopped) fn();
    }, ms);
    timer.unref();
  };
  const flush = (): void => {
    if (flushQueued) return;
    flushQueued = true;
    // Coalesced: a burst of events (a node's pods starting at once) is one evaluation.
    setImmediate(() => {
      flushQueued = false;
      if (!stopped && stream && trusted && buffer === undefined) o.onContainers([...view.values()]);
    });
  };
  const apply = (e: CriContainerEvent): void => {
    if (applyEvent(view, e, maxContainers) || overflowLogged) return;
    overflowLogged = true;
    o.log.warn('runtime container view full; further containers are seen from kubelet\'s pod list only', { maxContainers });
  };
  const onEvent = (gen: number, e: CriContainerEvent): void => {
    if (gen !== generation || stopped) return;
    o.onEvent?.(e.containerEventType);
    delivered = true;
    emptyEnds = 0;
    const first = !trusted;
    trusted = true;
    if (buffer) {
      if (buffer.length < maxBuffered) buffer.push(e);
      else bufferOverflowed = true;
      return;
    }
    apply(e);
    if (first) useEvents();
    flush();
  };
  const useEvents = (): void => {
    setSource('events');
    stopPolling();
  };
  /** One list; events meanwhile are replayed on it. A failed list restarts the stream (with back-off). */
  const catchUp = (gen: number): void => {
    if (buffer) return;
    buffer = [];
    bufferOverflowed = false;
    o.list().then(
      (items) => {
        if (gen !== generation || stopped) return;
        listed();
        reconnecting = false;
        const replay = buffer ?? [];
        const overflowed = bufferOverflowed;
        buffer = undefined;
        view.clear();
        for (const c of runtimeContainers(items)) if (view.size < maxContainers) view.set(c.id, c);
        for (const e of replay) apply(e);
        if (trusted) useEvents();
        flush();
        // More happened meanwhile than was kept: list again.
        later(() => catchUp(gen), overflowed ? 0 : resyncMs);
      },
      (err: unknown) => {
        if (gen !== generation || stopped) return;
        buffer = undefined;
        listFailed(err);
        restart();
      },
    );
  };
  const subscribe = (): void => {
    if (stopped || !o.events) return;
    const gen = ++generation;
    subscribedAt = Date.now();
    delivered = false;
    trusted = source !== 'list';
    stream = o.events((e) => onEvent(gen, e), (err) => onEnd(gen, err));
    catchUp(gen);
  };
  const restart = (): void => {
    stream?.cancel();
    stream = undefined;
    generation++;
    buffer = undefined;
    if (Date.now() - subscribedAt >= HEALTHY_STREAM_MS) backoffMs = MIN_BACKOFF_MS;
    const wait = backoffMs;
    backoffMs = Math.min(backoffMs * 2, maxBackoffMs);
    later(subscribe, wait);
  };
  const onEnd = (gen: number, err: Error): void => {
    if (gen !== generation || stopped) return;
    const code = (err as { context?: { grpcCode?: unknown } }).context?.grpcCode;
    const empty = code === OK && !delivered;
    emptyEnds = empty ? emptyEnds + 1 : 0;
    // Already listing (asked again later): one empty end says it still has none.
    if (code === UNIMPLEMENTED || (empty && (source === 'list' || emptyEnds >= EMPTY_ENDS_MEAN_NONE))) {
      emptyEnds = 0;
      stream = undefined;
      generation++;
      buffer = undefined;
      if (!fallbackLogged || source === 'events') {
        o.log.info('the runtime has no container event stream; its containers are listed every interval instead', {
          source: 'list', reason: code === UNIMPLEMENTED ? describeError(err) : `the stream ended before any event ${EMPTY_ENDS_MEAN_NONE} times in a row (CRI-O: enable_pod_events = false)`,
          intervalMs: o.intervalMs, retryEventsMs,
        });
      }
      fallbackLogged = true;
      setSource('list');
      startPolling();
      later(subscribe, retryEventsMs);
      return;
    }
    // Once per outage: a runtime that is down ends every new subscription too.
    if (!reconnecting) o.log.info('runtime container event stream ended; subscribing again', { reason: describeError(err) });
    else o.log.debug('runtime container event stream ended again', { reason: describeError(err) });
    reconnecting = true;
    restart();
  };

  if (o.events) subscribe();
  else {
    setSource('list');
    startPolling();
  }
  return () => {
    stopped = true;
    stopPolling();
    if (timer) clearTimeout(timer);
    stream?.cancel();
    stream = undefined;
  };
}
