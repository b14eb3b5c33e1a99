/**
 * The part of Go's net/url that decides where an HTTP redirect goes: url.Parse of a Location and
 * its resolution against the request URL (URL.Parse / ResolveReference), and URL.Hostname(). Go keeps
 * the host exactly as written (no lower-casing, no IPv6 canonicalisation), and kubelet's redirect
 * checker compares those raw hostnames; WHATWG URL would normalise them. Pure functions.
 */

/** A resolved http(s) URL, with the host as Go keeps it. */
export interface GoUrl {
  /** Lower-cased scheme ("" when neither the reference nor the base had one). */
  scheme: string;
  /** URL.Host: the authority without userinfo, exactly as written ("[fd00::1]:80", "Example.com"). */
  host: string;
  /** URL.Hostname(): host without port and without IPv6 brackets, case kept. */
  hostname: string;
  /** URL.Port(): "" when absent. */
  port: string;
  /** Escaped path plus "?query" ("/" when empty), as the request target. */
  pathAndQuery: string;
}

/** A Location Go's url.Parse rejects; `message` is Go's text ("parse \"...\": ..."). */
export class GoUrlError extends Error {}

/** Go's validOptionalPort: "" or ":" followed by digits only. */
function validOptionalPort(port: string): boolean {
  return port === '' || /^:[0-9]*$/.test(port);
}

/** Go's splitHostPort as used by URL.Hostname()/Port(). */
export function splitGoHost(host: string): { hostname: string; port: string } {
  let hostname = host;
  let port = '';
  const colon = host.lastIndexOf(':');
  if (colon !== -1 && validOptionalPort(host.slice(colon))) {
    hostname = host.slice(0, colon);
    port = host.slice(colon + 1);
  }
  if (hostname.startsWith('[') && hostname.endsWith(']')) hostname = hostname.slice(1, -1);
  return { hostname, port };
}

/** Characters Go's unescape(host, encodeHost) accepts unescaped (ASCII). */
const HOST_OK = /^[A-Za-z0-9\-._~!$&'()*+,;=:[\]<>"%]$/;

/** Go's parseHost checks, in its order; returns the host unescaped, or throws the bare reason. */
function checkHost(host: string): string {
  let portPart = '';
  if (host.startsWith('[')) {
    const close = host.lastIndexOf(']');
    if (close < 0) throw new Error("missing ']' in host");
    portPart = host.slice(close + 1);
  } else {
    const colon = host.lastIndexOf(':');
    if (colon !== -1) portPart = host.slice(colon);
  }
  if (!validOptionalPort(portPart)) throw new Error(`invalid port ${JSON.stringify(portPart)} after host`);
  for (let i = 0; i < host.length; i++) {
    const ch = host[i] as string;
    if (ch === '%') {
      const esc = host.slice(i, i + 3);
      // In a host, %-escapes stand only for non-ASCII bytes, or %25 (an IPv6 zone's "%").
      if (!/^%[0-9A-Fa-f]{2}$/.test(esc) || (parseInt(esc[1] as string, 16) < 8 && esc !== '%25')) throw new Error(`invalid URL escape ${JSON.stringify(esc)}`);
      continue;
    }
    if (ch.charCodeAt(0) < 0x80 && !HOST_OK.test(ch)) throw new Error(`invalid character ${JSON.stringify(ch)} in host name`);
  }
  // Go keeps the host unescaped ("h%C3%A9" is "hé", "%25" is "%").
  return host.replace(/(?:%[0-9A-Fa-f]{2})+/g, (run) => Buffer.from(run.replaceAll('%', ''), 'hex').toString('utf8'));
}

/** Go's getScheme: a scheme, the rest, or an error for a leading ':'. */
function splitScheme(raw: string): { scheme: string; rest: string } {
  for (let i = 0; i < raw.length; i++) {
    const c = raw[i] as string;
    if (/[A-Za-z]/.test(c)) continue;
    if (/[0-9+\-.]/.test(c)) {
      if (i === 0) return { scheme: '', rest: raw };
      continue;
    }
    if (c === ':') {
      if (i === 0) throw new Error('missing protocol scheme');
      return { scheme: raw.slice(0, i).toLowerCase(), rest: raw.slice(i + 1) };
    }
    return { scheme: '', rest: raw };
  }
  return { scheme: '', rest: raw };
}

/** Go's unescape(path, encodePath): a "%" must start a two-digit hex escape. */
function checkPathEscapes(path: string): void {
  const bad = /%(?![0-9A-Fa-f]{2})/.exec(path);
  if (bad) throw new Error(`invalid URL escape ${JSON.stringify(path.slice(bad.index, bad.index + 3))}`);
}

/** Path plus query of `ref` (a path-relative or absolute reference) resolved against `basePathAndQuery`. */
function resolvePath(ref: string, basePathAndQuery: string): string {
  const base = new URL(basePathAndQuery.startsWith('/') ? basePathAndQuery : '/' + basePathAndQuery, 'http://go.invalid');
  if (ref === '') return base.pathname + base.search;
  // WHATWG reads "\\" as "/" and a leading "//" as an authority in an http URL; Go keeps both in the
  // path ("\\" escaped), and they are only ever a path here.
  let path = ref.replaceAll('\\', '%5C');
  if (path.startsWith('//')) path = '/.' + path;
  const u = new URL(path, base);
  return (u.pathname || '/') + u.search;
}

/**
 * Go's `base.Parse(location)`: parses a Location the way url.Parse does and resolves it against the
 * request URL. `base` is that URL's scheme, raw host and path+query. Throws GoUrlError with Go's text.
 */
export function resolveGoLocation(location: string, base: { scheme: string; host: string; pathAndQuery: string }): GoUrl {
  const fail = (why: string): never => {
    throw new GoUrlError(`parse ${JSON.stringify(location)}: ${why}`);
  };
  if (/[\u0000-\u001f\u007f]/.test(location)) fail('net/url: invalid control character in URL');
  const withoutFragment = location.split('#', 1)[0] as string;
  const pathEnd = withoutFragment.indexOf('?');
  try {
    checkPathEscapes(pathEnd === -1 ? withoutFragment : withoutFragment.slice(0, pathEnd));
  } catch (err) {
    return fail((err as Error).message);
  }
  let scheme: string;
  let rest: string;
  try {
    ({ scheme, rest } = splitScheme(withoutFragment));
  } catch (err) {
    return fail((err as Error).message);
  }
  let host: string | undefined;
  let pathRef = rest;
  if (rest.startsWith('//') && (scheme !== '' || !rest.startsWith('///'))) {
    const after = rest.slice(2);
    const end = after.search(/[/?]/);
    const authority = end === -1 ? after : after.slice(0, end);
    pathRef = end === -1 ? '' : after.slice(end);
    const rawHost = authority.slice(authority.lastIndexOf('@') + 1);
    try {
      host = checkHost(rawHost);
    } catch (err) {
      return fail((err as Error).message);
    }
    // Go resolves "//" (no host, no userinfo, no scheme) as a relative reference: the base URL.
    if (host === '' && scheme === '' && !authority.includes('@')) host = undefined;
  } else if (scheme === '' && /^[^/?]*:/.test(rest)) {
    // Go: a colon in the first path segment of a relative reference is an error.
    fail('first path segment in URL cannot contain colon');
  }
  const resolvedScheme = scheme || base.scheme;
  const resolvedHost = host ?? (scheme === '' ? base.host : '');
  let pathAndQuery: string;
  if (host !== undefined || scheme !== '') pathAndQuery = resolvePath(pathRef === '' ? '/' : pathRef, '/');
  else pathAndQuery = resolvePath(pathRef, base.pathAndQuery);
  const { hostname, port } = splitGoHost(resolvedHost);
  return { scheme: resolvedScheme, host: resolvedHost, hostname, port, pathAndQuery };
}
