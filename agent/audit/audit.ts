/**
 * `probe-agent audit`: runs every network probe of every pod on the node twice — from the node, as
 * kubelet does today, and inside the pod's netns, as the agent would — and judges each pair (see
 * classify.ts). Read-only: one GET /pods, netns lookups, and the probes themselves (which kubelet
 * already sends every period); nothing is written anywhere.
 */
import { ProbeAgentError, UnsupportedPodError, describeError } from '../errors.ts';
import { silentLogger, type Logger } from '../log.ts';
import type { NetnsResolution } from '../netns/resolver.ts';
import { classifyPod } from '../pods/pod-model.ts';
import type { PodParseError } from '../pods/pod-model.ts';
import type { ContainerInfo, PodInfo } from '../pods/types.ts';
import { runProbe } from '../probe/run.ts';
import {
  PROBE_TYPES, type HostFieldPolicy, type NetworkHandler, type ProbeContext, type ProbeOutcome, type ProbeSpec, type ProbeType,
  type SocketFactory,
} from '../probe/types.ts';
import { hostFieldKind, judge } from './classify.ts';
import { buildReport, describeHandler, pathResult, type AuditReport, type AuditedProbe } from './report.ts';

/** Default and upper bound of probes audited at once (each one may fork a helper child). */
export const DEFAULT_AUDIT_CONCURRENCY = 8;
export const MAX_AUDIT_CONCURRENCY = 64;

/** Everything the audit needs; the command wires real parts (kubelet, resolver chain, helper). */
export interface AuditInput {
  pods: readonly PodInfo[];
  /** Pods of the list that could not be parsed: each becomes an 'error' row. */
  parseErrors?: readonly PodParseError[];
  /** Finds a pod's netns; rejects with NetnsUnavailableError, or UnsupportedPodError (left to kubelet). */
  resolveNetns(pod: PodInfo, signal?: AbortSignal): Promise<NetnsResolution>;
  /** Makes sockets inside a netns; called once, only when some probe needs it (e.g. starts the helper). */
  netnsSockets(): Promise<SocketFactory>;
  /** Sockets in the node's netns: kubelet's path. */
  nodeSockets: SocketFactory;
  kubeVersion: string;
  /** What the agent would do with a host field naming another host (the LegacyHostFieldProbes gate). */
  hostFieldPolicy: HostFieldPolicy;
  /** The agent's HappyEyeballs gate (kubelet's path never tries the other family). */
  happyEyeballs: boolean;
  /** RuntimeClass names left to kubelet. */
  sandboxedRuntimeClasses?: readonly string[];
  concurrency?: number;
  signal?: AbortSignal;
  log?: Logger;
}

/** One network probe waiting to be run both ways. */
interface Task {
  pod: PodInfo;
  container: ContainerInfo;
  type: ProbeType;
  spec: ProbeSpec & { handler: NetworkHandler };
}

/** Phases a pod has left for good: kubelet stops its probe workers, so there is nothing to compare. */
const FINISHED_PHASES = new Set(['Succeeded', 'Failed']);

/** Audits every probe of `pods`; rejects only when the audit as a whole cannot run (e.g. the helper will not start). */
export async function auditPods(input: AuditInput): Promise<AuditReport> {
  const log = (input.log ?? silentLogger).child({ component: 'audit' });
  const concurrency = input.concurrency ?? DEFAULT_AUDIT_CONCURRENCY;
  if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > MAX_AUDIT_CONCURRENCY) {
    throw new ProbeAgentError('config', `audit concurrency must be an integer 1..${MAX_AUDIT_CONCURRENCY}, got ${concurrency}`);
  }
  const rows: AuditedProbe[] = [];
  const tasks: Task[] = [];
  let withoutProbes = 0;
  let finished = 0;

  for (const err of input.parseErrors ?? []) {
    rows.push({
      ...blankRow(err.namespace ?? '?', err.name ?? '?', err.uid ?? ''),
      verdict: 'error',
      note: `the pod cannot be read, so the agent would not probe it: ${err.error}`,
    });
  }
  for (const pod of input.pods) {
    if (FINISHED_PHASES.has(pod.phase)) {
      finished++;
      continue;
    }
    const probes = pod.containers.flatMap((c) => PROBE_TYPES.flatMap((type) => (c.probes[type] ? [{ c, type, probe: c.probes[type] }] : [])));
    if (probes.length === 0) {
      withoutProbes++;
      continue;
    }
    const notOurs = classifyPod(pod, input.sandboxedRuntimeClasses ? { sandboxedRuntimeClasses: input.sandboxedRuntimeClasses } : {});
    for (const { c, type, probe } of probes) {
      const base = { ...blankRow(pod.namespace, pod.name, pod.uid), container: c.name, probeType: type };
      if (!probe.ok) {
        rows.push({ ...base, verdict: 'error', note: `probe-agent cannot parse this probe, so it would report an error where kubelet probes: ${probe.error}` });
        continue;
      }
      const handler = probe.spec.handler;
      const described = {
        ...base, handlerKind: handler.kind, handler: describeHandler(handler), host: hostOf(handler), hostField: hostFieldKind(handler, pod.podIPs),
      };
      if (notOurs === 'host-network' || notOurs === 'sandboxed-runtime') {
        const why = notOurs === 'host-network' ? 'hostNetwork pod' : `sandboxed runtime class "${pod.runtimeClassName ?? ''}"`;
        rows.push({ ...described, verdict: 'kubelet', note: `${why}: left to kubelet` });
      } else if (handler.kind === 'exec') {
        rows.push({ ...described, verdict: 'kubelet', note: 'exec probe: run by kubelet' });
      } else {
        tasks.push({ pod, container: c, type, spec: probe.spec as Task['spec'] });
      }
    }
  }

  if (tasks.length > 0) {
    const sockets = await input.netnsSockets();
    const netnsOf = memoNetns(input);
    let next = 0;
    const worker = async (): Promise<void> => {
      while (next < tasks.length && !input.signal?.aborted) {
        const task = tasks[next++] as Task;
        rows.push(await auditOne(task, input, sockets, netnsOf, log));
      }
    };
    await Promise.all(Array.from({ length: Math.min(concurrency, tasks.length) }, worker));
    input.signal?.throwIfAborted();
  }
  return buildReport(rows, { total: input.pods.length + (input.parseErrors?.length ?? 0), withoutProbes, finished });
}

type NetnsLookup = (pod: PodInfo) => Promise<NetnsResolution>;

/** One resolution per pod, shared by all its probes. */
function memoNetns(input: AuditInput): NetnsLookup {
  const cache = new Map<string, Promise<NetnsResolution>>();
  return (pod) => {
    let p = cache.get(pod.uid);
    if (!p) {
      p = input.resolveNetns(pod, input.signal);
      // Each caller handles the rejection; this keeps an unawaited copy from being "unhandled".
      p.catch(() => {});
      cache.set(pod.uid, p);
    }
    return p;
  };
}

async function auditOne(task: Task, input: AuditInput, sockets: SocketFactory, netnsOf: NetnsLookup, log: Logger): Promise<AuditedProbe> {
  const { pod, container, type, spec } = task;
  const handler = spec.handler;
  const hostKind = hostFieldKind(handler, pod.podIPs);
  const row: AuditedProbe = {
    ...blankRow(pod.namespace, pod.name, pod.uid),
    container: container.name,
    probeType: type,
    handlerKind: handler.kind,
    handler: describeHandler(handler),
    host: hostOf(handler),
    hostField: hostKind,
  };
  const base: Omit<ProbeContext, 'netns' | 'sockets' | 'hostFieldPolicy' | 'happyEyeballs'> = {
    podIPs: pod.podIPs,
    containerPorts: container.ports,
    timeoutSeconds: spec.timeoutSeconds,
    nodeSockets: input.nodeSockets,
    kubeVersion: input.kubeVersion,
    ...(input.signal ? { signal: input.signal } : {}),
  };

  let resolution: NetnsResolution | undefined;
  let netnsProblem: unknown;
  try {
    resolution = await netnsOf(pod);
  } catch (err) {
    netnsProblem = err;
  }
  if (netnsProblem instanceof UnsupportedPodError) {
    return { ...row, verdict: 'kubelet', note: messageOf(netnsProblem) };
  }

  // Kubelet's path: the node's netns, primary pod IP only, the host field honoured as written.
  const fromNode = await runProbe(handler, { ...base, netns: undefined, sockets: input.nodeSockets, hostFieldPolicy: 'legacy-node', happyEyeballs: false });
  row.fromNode = pathResult(fromNode);
  if (!resolution) {
    return { ...row, verdict: 'error', note: `netns not resolvable, so the agent could not probe this pod: ${messageOf(netnsProblem)}` };
  }
  row.netns = resolution.path;
  const inNetns: ProbeOutcome = await runProbe(handler, {
    ...base, netns: resolution.path, sockets, hostFieldPolicy: input.hostFieldPolicy, happyEyeballs: input.happyEyeballs,
  });
  row.inNetns = pathResult(inNetns);
  const judged = judge({ hostKind, host: row.host ?? undefined, primaryIP: pod.podIPs[0], fromNode, inNetns });
  if (log.enabled('debug')) {
    log.debug('probe audited', { pod: `${pod.namespace}/${pod.name}`, container: container.name, probeType: type, verdict: judged.verdict, fromNode: fromNode.result, inNetns: inNetns.result });
  }
  return { ...row, ...judged };
}

/** An error's own message: our errors say enough without describeError's "(code)" suffix. */
export function messageOf(err: unknown): string {
  return err instanceof ProbeAgentError ? err.message : describeError(err);
}

function blankRow(namespace: string, pod: string, podUID: string): AuditedProbe {
  return {
    namespace, pod, podUID, container: '', probeType: null, handlerKind: null, handler: '', host: null, hostField: 'none',
    netns: null, fromNode: null, inNetns: null, verdict: 'error', blocking: false, note: '',
  };
}

function hostOf(handler: ProbeSpec['handler']): string | null {
  if (handler.kind !== 'http' && handler.kind !== 'tcp') return null;
  const host = (handler.host ?? '').trim();
  return host === '' ? null : host;
}
