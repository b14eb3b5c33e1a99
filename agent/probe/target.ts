/**
 * Where a probe goes: kubelet's port resolution (ResolveContainerPort) and the address policy.
 * Kubelet probes status.podIP (or the deprecated host field) from the node; we probe from inside
 * the pod's netns, where only the pod's own addresses and its loopback mean the same thing.
 */
import { lookup } from 'node:dns/promises';
import { isIP, isIPv4 } from 'node:net';
import { InvalidProbeError } from '../errors.ts';
import type { FailureReason, NetworkHandler, PortRef, ProbeContext, SocketFactory } from './types.ts';
import type { Tenant } from '../scheduler/limiter.ts';

/** A container port as the pod spec declares it. */
export interface PortDecl {
  name?: string;
  containerPort: number;
  protocol?: string;
}

/** Where to connect and what to call the target in URLs, Host headers and messages. */
export interface TargetPlan {
  /** Kubelet's host for this probe: the URL host, the default Host header and :authority (an IP literal or a name). */
  host: string;
  port: number;
  /** IP literals to try, in preference order (more than one only with Happy Eyeballs or a resolved name). */
  ips: string[];
  /** Netns to make sockets in; undefined = the node's own. */
  netns: string | undefined;
  sockets: SocketFactory;
  /** Whose probe it is (the socket factory's shares); only for a pod's own netns. */
  tenant?: Tenant;
  /** True when this probe runs from the node because of the legacy host-field policy. */
  legacyNode: boolean;
}

/** A planning problem that makes the probe unrunnable (result 'error'), with its bounded reason. */
export class TargetError extends InvalidProbeError {
  readonly reason: FailureReason;
  constructor(reason: FailureReason, message: string, context: Record<string, unknown> = {}) {
    super(message, { ...context, reason });
    this.reason = reason;
  }
}

/** Kubelet's ResolveContainerPort: a number is used as is, a name is looked up in THIS container's ports only. */
export function resolvePort(port: PortRef, containerPorts: readonly PortDecl[] | undefined): number {
  let resolved: number;
  if (typeof port === 'number') {
    resolved = port;
  } else {
    const found = (containerPorts ?? []).find((p) => p.name === port);
    if (!found) throw new TargetError('port-unresolved', `port ${JSON.stringify(port)} not found`, { port });
    resolved = found.containerPort;
  }
  if (!Number.isInteger(resolved) || resolved < 1 || resolved > 65535) {
    throw new TargetError('port-unresolved', `invalid port number: ${resolved}`, { port });
  }
  return resolved;
}

/** Decides the addresses, netns and socket factory for one probe. Throws TargetError. */
export async function planTargets(handler: NetworkHandler, ctx: ProbeContext, signal?: AbortSignal): Promise<TargetPlan> {
  if (handler.kind === 'http') {
    // A header whose value lives in the pod's annotation is filled in by the shim path
    // (agent/prober/header-values.ts); one that reaches a prober unfilled must not go out empty.
    const i = handler.headers.findIndex((h) => h.valueFrom !== undefined);
    if (i >= 0) throw new InvalidProbeError(`httpGet.httpHeaders[${i}]: its value comes from the pod's annotation, which only a call by container ID reads`, { field: `httpGet.httpHeaders[${i}].valueFrom` });
  }
  const port = handler.kind === 'grpc' ? resolvePort(handler.port, undefined) : resolvePort(handler.port, ctx.containerPorts);
  const host = handler.kind === 'grpc' ? '' : (handler.host ?? '').trim();
  const podIPs = ctx.podIPs.map(canonicalIP).filter((ip): ip is string => ip !== undefined);

  if (host === '') {
    if (podIPs.length === 0) throw new TargetError('other', 'pod has no IP yet');
    const primary = podIPs[0] as string;
    return { host: primary, port, ips: ctx.happyEyeballs ? familyOrdered(podIPs) : [primary], netns: ctx.netns, sockets: ctx.sockets, tenant: ctx.tenant, legacyNode: false };
  }

  // From the node (--from-node / legacy path) the host field means exactly what it means to kubelet.
  if (ctx.netns === undefined) return fromNode(host, port, ctx, false, signal);

  const literal = canonicalIP(host);
  if (/^localhost\.?$/i.test(host)) {
    // Inside the netns "localhost" is the pod's own loopback: the reason in-netns probes exist.
    return { host, port, ips: ctx.happyEyeballs ? ['127.0.0.1', '::1'] : ['127.0.0.1'], netns: ctx.netns, sockets: ctx.sockets, tenant: ctx.tenant, legacyNode: false };
  }
  if (literal !== undefined && isLoopback(literal)) {
    return { host, port, ips: [unmapV4(literal)], netns: ctx.netns, sockets: ctx.sockets, tenant: ctx.tenant, legacyNode: false };
  }
  if (literal !== undefined && podIPs.includes(literal)) {
    return { host, port, ips: [literal], netns: ctx.netns, sockets: ctx.sockets, tenant: ctx.tenant, legacyNode: false };
  }
  if (ctx.hostFieldPolicy === 'legacy-node') return fromNode(host, port, ctx, true, signal);
  throw new TargetError(
    'host-refused',
    `host ${JSON.stringify(host)} is neither the pod's own IP nor loopback: probing other hosts from the node is ` +
      `refused (it lets a pod make the node connect anywhere); enable the feature gate LegacyHostFieldProbes to run it from the node as kubelet does`,
    { host },
  );
}

/**
 * Refuses a handler that a kubelet shim call carries (a `/.probe-agent/v1` exec command, which a pod
 * author can write by hand) when its host field names anything but loopback or one of the pod's own
 * IPs. Such a call never runs from the node, whatever LegacyHostFieldProbes says: the webhook and
 * `probe-agent rewrite` leave foreign-host probes unrewritten, so only a hand-written command gets
 * here, and running it from the node would reopen the SSRF the gate exists to contain.
 */
export function refuseForeignHostInShimCall(handler: { kind: string; host?: string }, podIPs: readonly string[], what: 'probe' | 'hook'): void {
  const host = (handler.host ?? '').trim();
  if (host === '' || /^localhost\.?$/i.test(host)) return;
  const literal = canonicalIP(host);
  if (literal !== undefined && (isLoopback(literal) || podIPs.map(canonicalIP).includes(literal))) return;
  throw new TargetError(
    'host-refused',
    `the ${what}'s host ${JSON.stringify(host.slice(0, 253))} is neither the pod's own IP nor loopback: a probe-agent exec command ` +
      `is only run inside the pod's netns (the LegacyHostFieldProbes gate never applies to kubelet shim calls); ` +
      `remove the host field or keep the original probe unrewritten`,
    { host: host.slice(0, 253) },
  );
}

/** Kubelet's own behaviour: dial the host from the node's netns, resolving a name there. */
async function fromNode(host: string, port: number, ctx: ProbeContext, legacyNode: boolean, signal?: AbortSignal): Promise<TargetPlan> {
  const literal = canonicalIP(host);
  if (literal !== undefined) {
    return { host, port, ips: [literal], netns: undefined, sockets: ctx.nodeSockets, legacyNode };
  }
  // Go's dialer resolves a name and races the families (fast fallback) whatever our gate says.
  const ips = familyOrdered(await resolveName(host, signal));
  return { host, port, ips, netns: undefined, sockets: ctx.nodeSockets, legacyNode };
}

async function resolveName(host: string, signal?: AbortSignal): Promise<string[]> {
  if (!/^[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?\.?$/.test(host)) {
    throw new TargetError('invalid-spec', `invalid host ${JSON.stringify(host)}`, { host });
  }
  let onAbort: (() => void) | undefined;
  const aborted = new Promise<never>((_, reject) => {
    onAbort = () => reject(new TargetError('timeout', `lookup ${host}: i/o timeout`, { host }));
    if (signal?.aborted) onAbort();
    else signal?.addEventListener('abort', onAbort, { once: true });
  });
  try {
    // dns.lookup cannot be cancelled: racing it keeps the probe deadline honest; the lookup finishes in the background.
    const found = await Promise.race([lookup(host, { all: true, order: 'verbatim' }), aborted]);
    const ips = found.map((a) => canonicalIP(a.address)).filter((ip): ip is string => ip !== undefined);
    if (ips.length === 0) throw new Error('no such host');
    return ips.slice(0, 16);
  } catch (err) {
    if (err instanceof TargetError) throw err;
    const code = (err as NodeJS.ErrnoException).code;
    const why = code === 'ENOTFOUND' ? 'no such host' : (err as Error).message;
    throw new TargetError('unreachable', `lookup ${host}: ${why}`, { host });
  } finally {
    if (onAbort) signal?.removeEventListener('abort', onAbort);
  }
}

/** Primary family first (the family of the first address), then the other, keeping order within each. */
export function familyOrdered(ips: readonly string[]): string[] {
  if (ips.length === 0) return [];
  const firstIsV4 = isIPv4(ips[0] as string);
  const primary = ips.filter((ip) => isIPv4(ip) === firstIsV4);
  const secondary = ips.filter((ip) => isIPv4(ip) !== firstIsV4);
  // RFC 8305 interleaves families; pod IP lists have one address per family, so this is the same thing.
  const out: string[] = [];
  for (let i = 0; i < Math.max(primary.length, secondary.length); i++) {
    if (i < primary.length) out.push(primary[i] as string);
    if (i < secondary.length) out.push(secondary[i] as string);
  }
  return out;
}

/** canonicalIP's IPv6 answers: every probe of a dual-stack pod asks about the same address. */
const canonicalV6 = new Map<string, string>();
/** Bound of that memo (a node has far fewer pod addresses); past it the memo starts over. */
const CANONICAL_V6_MAX = 4096;

/** The canonical text of an IP literal (compressed lower-case IPv6, no zone), or undefined if not an IP. */
export function canonicalIP(text: string): string | undefined {
  const known = canonicalV6.get(text);
  if (known !== undefined) return known;
  const family = isIP(text);
  if (family === 4) return text;
  if (family !== 6 || text.includes('%')) return undefined;
  // The WHATWG URL parser prints IPv6 in RFC 5952 form, so equal addresses compare equal as strings.
  const canonical = new URL(`http://[${text}]/`).hostname.slice(1, -1);
  if (canonicalV6.size >= CANONICAL_V6_MAX) canonicalV6.clear();
  canonicalV6.set(text, canonical);
  return canonical;
}

/** 127.0.0.0/8, ::1, and IPv4-mapped loopback. */
export function isLoopback(ip: string): boolean {
  if (isIPv4(ip)) return ip.startsWith('127.');
  if (ip === '::1') return true;
  const mapped = unmapV4(ip);
  return mapped !== ip && mapped.startsWith('127.');
}

/** "::ffff:127.0.0.1" -> "127.0.0.1"; anything else unchanged. */
function unmapV4(ip: string): string {
  const m = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/.exec(ip);
  if (m) return m[1] as string;
  const hex = /^::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/.exec(ip);
  if (!hex) return ip;
  const hi = parseInt(hex[1] as string, 16);
  const lo = parseInt(hex[2] as string, 16);
  return `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`;
}

/** host:port with IPv6 bracketed, as Go's net.JoinHostPort. */
export function joinHostPort(host: string, port: number): string {
  return host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
}
