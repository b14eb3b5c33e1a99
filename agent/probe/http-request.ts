/**
 * The HTTP probe request exactly as kubelet builds it (pkg/probe/http/request.go on top of Go's
 * net/http), and Go's client redirect rules with kubelet's RedirectChecker. Pure functions: no I/O.
 */
import type { HttpHeader } from './types.ts';
import { GoUrlError, resolveGoLocation, splitGoHost, type GoUrl } from './go-url.ts';
import { joinHostPort } from './target.ts';

/** kubelet: ReadAtMost(body, 10 KiB); more is not an error. */
export const MAX_BODY_BYTES = 10 * 1024;
/** Go's default CheckRedirect limit (kubelet's checker keeps it). */
export const MAX_REDIRECTS = 10;

/** One request on the wire: where it goes and the headers after kubelet's and Go's rules. */
export interface ProbeRequest {
  scheme: 'http' | 'https';
  /** URL hostname: IP literal without brackets, or a name. */
  hostname: string;
  port: number;
  /** Request target: path plus query, always starting with "/". */
  pathAndQuery: string;
  /** The Host header value (Go: req.Host, else the URL's host[:port] as written). */
  hostHeader: string;
  /** Headers after Host, in Go's wire order (User-Agent, then keys sorted), values in insertion order. */
  headers: [string, string][];
  /** The URL as Go prints it in errors and the Referer header. */
  url: string;
}

/** Headers Go's Request.Write never copies from the header map (it writes its own or none). */
const GO_EXCLUDED = new Set(['Host', 'User-Agent', 'Content-Length', 'Transfer-Encoding', 'Trailer']);
/**
 * Hop-by-hop headers the HTTP client owns: we always send "Connection: close" (Go's DisableKeepAlives)
 * and never the others (undici, which the probes used before node:http, refused them; they stay
 * out so the request is the same as before). Go would pass them through; a one-shot GET has no use for them.
 */
const CLIENT_OWNED = new Set(['Connection', 'Keep-Alive', 'Upgrade', 'Expect']);

/** Go's textproto.CanonicalMIMEHeaderKey for names that are valid tokens ("x-foo-bar" -> "X-Foo-Bar"). */
export function canonicalHeaderKey(name: string): string {
  if (!/^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/.test(name)) return name;
  let upper = true;
  let out = '';
  for (const ch of name) {
    out += upper ? ch.toUpperCase() : ch.toLowerCase();
    upper = ch === '-';
  }
  return out;
}

/** An ordered multi-map keyed by canonical name, like Go's http.Header. */
export class HeaderMap {
  readonly #map = new Map<string, string[]>();

  /** Go's Header.Add. */
  add(name: string, value: string): void {
    const key = canonicalHeaderKey(name);
    const list = this.#map.get(key);
    if (list) list.push(value);
    else this.#map.set(key, [value]);
  }
  /** Go's Header.Set. */
  set(name: string, value: string): void {
    this.#map.set(canonicalHeaderKey(name), [value]);
  }
  /** Go's Header.Get: the first value, or "" when absent. */
  get(name: string): string {
    return this.#map.get(canonicalHeaderKey(name))?.[0] ?? '';
  }
  has(name: string): boolean {
    return this.#map.has(canonicalHeaderKey(name));
  }
  delete(name: string): void {
    this.#map.delete(canonicalHeaderKey(name));
  }
  /** A deep copy (Go's redirect header copier clones the initial request's header). */
  clone(): HeaderMap {
    const copy = new HeaderMap();
    for (const [k, vs] of this.#map) for (const v of vs) copy.add(k, v);
    return copy;
  }
  /** Header lines in Go's Request.Write order: User-Agent (first value only), then the rest by sorted key. */
  wire(): [string, string][] {
    const out: [string, string][] = [];
    const ua = this.get('User-Agent');
    if (ua !== '') out.push(['User-Agent', ua]);
    const keys = [...this.#map.keys()].filter((k) => !GO_EXCLUDED.has(k) && !CLIENT_OWNED.has(k)).sort();
    for (const k of keys) {
      // Go replaces newlines with spaces and trims spaces/tabs when it writes a value.
      for (const v of this.#map.get(k) ?? []) out.push([k, v.replace(/[\r\n]/g, ' ').replace(/^[ \t]+|[ \t]+$/g, '')]);
    }
    return out;
  }
}

/** kubelet's NewRequestForHTTPGetAction: headers from httpGet plus the default User-Agent and Accept rules. */
export function buildHeaderMap(headers: readonly HttpHeader[], kubeVersion: string): HeaderMap {
  const h = new HeaderMap();
  for (const { name, value } of headers) h.add(name, value);
  if (!h.has('User-Agent')) h.set('User-Agent', `kube-probe/${kubeVersion}`);
  if (!h.has('Accept')) h.set('Accept', '*/*');
  else if (h.get('Accept') === '') h.delete('Accept');
  return h;
}

/**
 * kubelet's formatURL: the path is parsed as a URL and then scheme and host:port are forced, so a
 * query survives and anything that looks like an authority in the path is dropped.
 */
export function pathAndQueryOf(path: string): string {
  // A fixed base makes relative paths absolute; for absolute or "//host" paths only path+query are kept, as in Go.
  try {
    const u = new URL(path === '' ? '/' : path, 'http://probe.invalid/');
    return (u.pathname || '/') + u.search;
  } catch {
    // kubelet: "something is busted with the path, but it's too late to reject it" -- send it as a path.
    const raw = path.startsWith('/') ? path : '/' + path;
    return raw.replace(/[^\u0021-\u007e]/gu, (c) => [...Buffer.from(c, 'utf8')].map((b) => '%' + b.toString(16).toUpperCase().padStart(2, '0')).join(''));
  }
}

/** The first request of an HTTP probe. `host` is kubelet's URL host (pod IP or the host field). */
export function buildProbeRequest(
  scheme: 'HTTP' | 'HTTPS',
  host: string,
  port: number,
  path: string,
  headers: HeaderMap,
): ProbeRequest {
  const s = scheme === 'HTTPS' ? 'https' : 'http';
  const authority = joinHostPort(host, port);
  const pathAndQuery = pathAndQueryOf(path);
  return {
    scheme: s,
    hostname: host,
    port,
    pathAndQuery,
    hostHeader: headers.get('Host') || authority,
    headers: headers.wire(),
    url: `${s}://${authority}${pathAndQuery}`,
  };
}

/** Statuses Go's client follows (with a Location); any other 3xx is returned as the response. */
const FOLLOWED = new Set([301, 302, 303, 307, 308]);

/** What to do with a response: use it, follow it, or fail with Go's client error text. */
export type RedirectDecision =
  | { action: 'use' }
  | { action: 'follow'; next: ProbeRequest }
  | { action: 'fail'; message: string; reason: 'redirects' | 'protocol' };

/**
 * Go's Client.Do redirect step with kubelet's RedirectChecker(followNonLocalRedirects=false).
 * `first` is the probe's first request, `current` the one that got `status`, `hops` the number of
 * requests made so far (including `current`), `initial` the header map of the first request.
 */
export function decideRedirect(
  first: ProbeRequest,
  current: ProbeRequest,
  status: number,
  location: string | undefined,
  hops: number,
  initial: HeaderMap,
): RedirectDecision {
  if (!FOLLOWED.has(status) || !location) return { action: 'use' };
  let target: GoUrl;
  try {
    target = resolveGoLocation(location, { scheme: current.scheme, host: authorityOf(current), pathAndQuery: current.pathAndQuery });
  } catch (err) {
    const why = err instanceof GoUrlError ? err.message : String(err);
    return { action: 'fail', reason: 'protocol', message: `Get ${JSON.stringify(current.url)}: failed to parse Location header ${JSON.stringify(location)}: ${why}` };
  }
  // kubelet compares URL.Hostname() of the new request with the FIRST one's (port ignored), as Go
  // keeps them: case-sensitive, IPv6 as written. Another host ends the chain as a Warning.
  if (target.hostname !== splitGoHost(authorityOf(first)).hostname) return { action: 'use' };
  if (hops >= MAX_REDIRECTS) {
    return { action: 'fail', reason: 'redirects', message: `Get ${JSON.stringify(location)}: stopped after ${MAX_REDIRECTS} redirects` };
  }
  const scheme = target.scheme;
  const url = `${scheme}://${target.host}${target.pathAndQuery}`;
  if (scheme !== 'http' && scheme !== 'https') {
    return { action: 'fail', reason: 'protocol', message: `Get ${JSON.stringify(url)}: unsupported protocol scheme ${JSON.stringify(scheme)}` };
  }
  const port = target.port ? Number(target.port) : scheme === 'https' ? 443 : 80;
  if (!Number.isInteger(port) || port < 1 || port > 65535) {
    return { action: 'fail', reason: 'protocol', message: `Get ${JSON.stringify(url)}: dial tcp: address ${target.host}: invalid port` };
  }
  const authority = target.host;
  const pathAndQuery = target.pathAndQuery;
  const hostname = target.hostname;
  const headers = initial.clone();
  // Go keeps a caller-set Host only across relative redirects (golang/go#22233); otherwise the new URL's host.
  const customHost = initial.get('Host');
  const relative = !/^[a-zA-Z][a-zA-Z0-9+.-]*:/.test(location);
  const hostHeader = customHost !== '' && customHost !== authorityOf(first) && relative ? customHost : authority;
  // Go's refererForURL: the previous URL, unless going from https to http; an explicit Referer wins.
  if (!(current.scheme === 'https' && scheme === 'http')) headers.set('Referer', initial.get('Referer') || current.url);
  return {
    action: 'follow',
    next: { scheme, hostname, port, pathAndQuery, hostHeader, headers: headers.wire(), url },
  };
}

function authorityOf(r: ProbeRequest): string {
  return /^[a-z]+:\/\/([^/]*)/.exec(r.url)?.[1] ?? joinHostPort(r.hostname, r.port);
}

/** Request bytes by request: a worker's first request is the same object every period (http.ts). */
const requestBytesOf = new WeakMap<ProbeRequest, Buffer>();

/**
 * The request exactly as Go's client writes it for kubelet (Request.write, keep-alives off): the
 * request line, Host, the headers in Go's wire order (User-Agent, the rest by sorted canonical
 * name; HeaderMap.wire), then "Connection: close" (the transport's extra header, written after
 * the request's own). Values go out as their UTF-8 bytes, as Go writes a string. One buffer, written
 * in one write. Throws for a request target that is not printable ASCII (one more request line
 * or header must never be written).
 */
export function requestBytes(req: ProbeRequest): Buffer {
  const known = requestBytesOf.get(req);
  if (known) return known;
  if (!/^[\u0021-\u007e]+$/.test(req.pathAndQuery)) throw new Error('Request path contains unescaped characters');
  let head = `GET ${req.pathAndQuery} HTTP/1.1\r\nHost: ${fieldValue('Host', req.hostHeader)}\r\n`;
  for (const [name, value] of req.headers) head += `${name}: ${fieldValue(name, value)}\r\n`;
  const bytes = Buffer.from(`${head}Connection: close\r\n\r\n`, 'latin1');
  requestBytesOf.set(req, bytes);
  return bytes;
}

/**
 * A header value's UTF-8 bytes as latin1 characters, so that one latin1 encoding of the whole head
 * writes them. A line break could write a header of its own: Go's transport refuses the request.
 */
function fieldValue(name: string, value: string): string {
  if (/[\r\n]/.test(value)) throw new Error(`net/http: invalid header field value for ${JSON.stringify(name)}`);
  return /[^\u0000-\u007f]/.test(value) ? Buffer.from(value, 'utf8').toString('latin1') : value;
}
