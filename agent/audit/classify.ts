/**
 * The audit's judgement of one probe: given what happened from the node (kubelet's path today) and
 * inside the pod's netns (the agent's path), would switching change anything, and why. Pure
 * functions over ProbeOutcome values, so every rule is unit-testable without a network.
 */
import { canonicalIP, isLoopback } from '../probe/target.ts';
import type { FailureReason, ProbeHandler, ProbeOutcome } from '../probe/types.ts';

/**
 * The verdict on one probe:
 * - same: both paths pass, or both fail (nothing changes on switching);
 * - node-only: passes from the node, fails in the netns (would break when the hole closes);
 * - netns-only: fails from the node, passes in the netns (hole already closed, or a loopback app newly passes);
 * - host-field: the deprecated host field names another host (SSRF), or loopback with an unchanged result;
 * - kubelet: exec, hostNetwork or sandboxed: left to kubelet, not audited;
 * - error: could not be audited (netns unresolvable, helper trouble, spec we cannot parse).
 */
export type Verdict = 'same' | 'node-only' | 'netns-only' | 'host-field' | 'kubelet' | 'error';
export const VERDICTS: readonly Verdict[] = ['same', 'node-only', 'netns-only', 'host-field', 'kubelet', 'error'];

/** What the host field names, seen from the pod: nothing, the pod itself, loopback, or some other host. */
export type HostFieldKind = 'none' | 'pod-ip' | 'loopback' | 'other';

/** A verdict with whether it blocks the switch, and a human explanation. */
export interface Judgement {
  verdict: Verdict;
  /** True when this probe alone makes the audit exit 1 (would break, or unsafe). */
  blocking: boolean;
  note: string;
}

/** Failure reasons that mean "could not try" rather than "the target said no". */
const INFRA_REASONS: ReadonlySet<FailureReason> = new Set(['netns-gone', 'netns-denied', 'helper-error', 'queue-full', 'agent-overloaded']);
/** Reasons that mean the connection never reached the app. */
const UNREACHED: ReadonlySet<FailureReason> = new Set(['refused', 'timeout', 'reset', 'unreachable']);
const NOTE_DETAIL_CHARS = 160;

/** Classifies the host field the way planTargets does inside the netns. */
export function hostFieldKind(handler: ProbeHandler, podIPs: readonly string[]): HostFieldKind {
  if (handler.kind !== 'http' && handler.kind !== 'tcp') return 'none';
  const host = (handler.host ?? '').trim();
  if (host === '') return 'none';
  if (host.toLowerCase() === 'localhost') return 'loopback';
  const literal = canonicalIP(host);
  if (literal === undefined) return 'other';
  if (isLoopback(literal)) return 'loopback';
  const own = podIPs.map(canonicalIP).filter((ip): ip is string => ip !== undefined);
  return own.includes(literal) ? 'pod-ip' : 'other';
}

/** Warning counts as success, as in kubelet's prober. */
export function passes(o: ProbeOutcome): boolean {
  return o.result === 'success' || o.result === 'warning';
}

/** Inputs of judge(): the probe's host field and both outcomes. */
export interface JudgeInput {
  hostKind: HostFieldKind;
  host?: string;
  /** The pod IP kubelet dials (status.podIP). */
  primaryIP?: string;
  fromNode: ProbeOutcome;
  inNetns: ProbeOutcome;
}

/** Compares the two paths of one network probe. */
export function judge(input: JudgeInput): Judgement {
  const { hostKind, fromNode, inNetns } = input;
  const host = JSON.stringify(input.host ?? '');
  if (hostKind === 'other') return otherHost(host, fromNode, inNetns);

  const nodeErr = fromNode.result === 'error';
  const nsErr = inNetns.result === 'error';
  if (nodeErr && nsErr && fromNode.reason === inNetns.reason && !INFRA_REASONS.has(inNetns.reason ?? 'other')) {
    return { verdict: 'same', blocking: false, note: `cannot run either way (${inNetns.reason ?? 'error'}: ${detail(inNetns)}); kubelet has the same problem` };
  }
  if (nsErr) return { verdict: 'error', blocking: false, note: `could not run in the netns: ${detail(inNetns)}` };
  if (nodeErr) return { verdict: 'error', blocking: false, note: `could not run from the node: ${detail(fromNode)}` };

  const nodeOk = passes(fromNode);
  const nsOk = passes(inNetns);
  if (nodeOk === nsOk) {
    if (hostKind === 'loopback') {
      return {
        verdict: 'host-field',
        blocking: false,
        note: `host ${host} is the node's loopback to kubelet but the pod's loopback in the netns: ${nodeOk ? 'passes' : 'fails'} both ways today, yet it will probe something else after the switch`,
      };
    }
    return { verdict: 'same', blocking: false, note: nodeOk ? '' : sameFailureNote(fromNode, inNetns) };
  }
  if (nodeOk) return { verdict: 'node-only', blocking: true, note: nodeOnlyCause(hostKind, host, inNetns) };
  return { verdict: 'netns-only', blocking: false, note: netnsOnlyCause(hostKind, host, input.primaryIP, fromNode, inNetns) };
}

function otherHost(host: string, fromNode: ProbeOutcome, inNetns: ProbeOutcome): Judgement {
  const today = passes(fromNode) ? 'passes' : fromNode.result === 'error' ? 'cannot run' : 'fails';
  const after = inNetns.reason === 'host-refused'
    ? `refused in the netns by default (LegacyHostFieldProbes off), so it ${passes(fromNode) ? 'would start failing' : 'keeps failing'}`
    : `LegacyHostFieldProbes runs it from the node, so the SSRF stays (${passes(inNetns) ? 'passes' : 'fails'})`;
  return {
    verdict: 'host-field',
    blocking: true,
    note: `host ${host} is another host: kubelet connects there from the node (SSRF risk; ${today} today); ${after}; ` +
      'drop host (set a Host header instead) so the probe targets the pod',
  };
}

function sameFailureNote(fromNode: ProbeOutcome, inNetns: ProbeOutcome): string {
  if (fromNode.reason === inNetns.reason) return `fails both ways (${inNetns.reason ?? 'failure'})`;
  return `fails both ways (from node: ${fromNode.reason ?? 'failure'}, in netns: ${inNetns.reason ?? 'failure'})`;
}

/** Why a probe that works from the node fails inside the pod: the likely cause, from the netns failure reason. */
export function nodeOnlyCause(hostKind: HostFieldKind, host: string, inNetns: ProbeOutcome): string {
  const why = `in netns: ${detail(inNetns)}`;
  if (hostKind === 'loopback') {
    return `host ${host} is the node's loopback to kubelet, where something answers; in the netns it is the pod's own loopback, ` +
      `where nothing does (${why}); drop host to probe the pod IP`;
  }
  switch (inNetns.reason) {
    case 'refused':
    case 'reset':
      return `accepted from the node, refused inside the pod: the app or a firewall in the pod accepts only the node's source address (${why})`;
    case 'timeout':
      return `times out inside the pod: a firewall in the pod drops traffic that does not come from the node, or the app ignores other sources (${why})`;
    case 'status':
    case 'redirects':
    case 'grpc-status':
    case 'grpc-not-serving':
      return `the app answers the node and the pod differently: it decides by source address (an allowlist of the node/kubelet address?) (${why})`;
    case 'tls':
    case 'protocol':
    case 'grpc-unimplemented':
      return `the app speaks differently to connections from inside the pod (a sidecar or proxy intercepting them?) (${why})`;
    case 'unreachable':
      return `the pod IP is not reachable inside the resolved netns: is it the pod's netns? (${why})`;
    default:
      return `passes from the node, fails in the netns (${why})`;
  }
}

function netnsOnlyCause(hostKind: HostFieldKind, host: string, primaryIP: string | undefined, fromNode: ProbeOutcome, inNetns: ProbeOutcome): string {
  const was = `from node: ${detail(fromNode)}`;
  if (hostKind === 'loopback') {
    return `kubelet probes the node's loopback (${was}); in the netns ${host} is the pod's own loopback, where the app answers: a loopback-bound app newly passes`;
  }
  const answered = addressIP(inNetns.address);
  if (primaryIP !== undefined && answered !== undefined && canonicalIP(answered) !== canonicalIP(primaryIP)) {
    return `answers only on ${answered}: kubelet dials the primary pod IP ${primaryIP} only (${was}); the netns path tries every family (HappyEyeballs)`;
  }
  if (UNREACHED.has(fromNode.reason ?? 'other')) {
    return `the node cannot reach the pod (${was}): a NetworkPolicy or firewall already closes the node->pod hole, so kubelet fails this probe today; it passes in the netns`;
  }
  return `the app answers the node's address differently (${was}); it passes in the netns`;
}

/** The outcome's message, on one line and bounded for notes. */
function detail(o: ProbeOutcome): string {
  const text = o.message.replace(/\s+/g, ' ').trim() || o.reason || o.result;
  return text.length > NOTE_DETAIL_CHARS ? `${text.slice(0, NOTE_DETAIL_CHARS - 1)}…` : text;
}

/** "10.0.0.1:80" / "[fd00::1]:80" -> the IP. */
function addressIP(address: string | undefined): string | undefined {
  if (!address) return undefined;
  const m = /^\[([^\]]+)\]:\d+$/.exec(address) ?? /^([^:]+):\d+$/.exec(address);
  return m?.[1];
}
