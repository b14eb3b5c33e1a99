import { describe, expect, it } from 'vitest';
import {
  buildHeaderMap,
  buildProbeRequest,
  canonicalHeaderKey,
  decideRedirect,
  pathAndQueryOf,
  type ProbeRequest,
} from '../../agent/probe/http-request.ts';
import type { HttpHeader } from '../../agent/probe/types.ts';

function request(headers: HttpHeader[] = [], host = '10.0.0.1', port = 8080, path = '/healthz', scheme: 'HTTP' | 'HTTPS' = 'HTTP') {
  const map = buildHeaderMap(headers, '1.34');
  return { map, req: buildProbeRequest(scheme, host, port, path, map) };
}

describe('request headers, as kubelet + Go send them', () => {
  it('defaults: User-Agent kube-probe/<v> and Accept */*, Host with the port', () => {
    const { req } = request();
    expect(req.hostHeader).toBe('10.0.0.1:8080');
    expect(req.headers).toEqual([['User-Agent', 'kube-probe/1.34'], ['Accept', '*/*']]);
    expect(req.url).toBe('http://10.0.0.1:8080/healthz');
  });

  it('keeps the default port in Host like Go (undici would drop :80)', () => {
    expect(request([], '10.0.0.1', 80).req.hostHeader).toBe('10.0.0.1:80');
    expect(request([], '10.0.0.1', 443, '/', 'HTTPS').req.hostHeader).toBe('10.0.0.1:443');
  });

  it('brackets IPv6 in Host and URL', () => {
    const { req } = request([], 'fd00::5', 8080);
    expect(req.hostHeader).toBe('[fd00::5]:8080');
    expect(req.url).toBe('http://[fd00::5]:8080/healthz');
  });

  it('a given User-Agent replaces the default; an empty one sends none (Go skips empty UA)', () => {
    expect(request([{ name: 'user-agent', value: 'me/1' }]).req.headers[0]).toEqual(['User-Agent', 'me/1']);
    expect(request([{ name: 'User-Agent', value: '' }]).req.headers.map((h) => h[0])).not.toContain('User-Agent');
  });

  it('an empty Accept removes Accept entirely; a given one replaces the default', () => {
    expect(request([{ name: 'accept', value: '' }]).req.headers).toEqual([['User-Agent', 'kube-probe/1.34']]);
    expect(request([{ name: 'Accept', value: 'text/plain' }]).req.headers).toContainEqual(['Accept', 'text/plain']);
    expect(request([{ name: 'Accept', value: 'text/plain' }]).req.headers).not.toContainEqual(['Accept', '*/*']);
  });

  it('repeats are kept in order, names canonicalised, keys sorted after User-Agent (Go write order)', () => {
    const { req } = request([
      { name: 'x-zeta', value: '1' },
      { name: 'X-ALPHA', value: 'a' },
      { name: 'x-zeta', value: '2' },
      { name: 'x-alpha', value: 'b' },
    ]);
    expect(req.headers).toEqual([
      ['User-Agent', 'kube-probe/1.34'],
      ['Accept', '*/*'],
      ['X-Alpha', 'a'],
      ['X-Alpha', 'b'],
      ['X-Zeta', '1'],
      ['X-Zeta', '2'],
    ]);
  });

  it('a Host header sets Host (first value) and is not sent twice', () => {
    const { req } = request([{ name: 'host', value: 'svc.example' }, { name: 'Host', value: 'ignored' }]);
    expect(req.hostHeader).toBe('svc.example');
    expect(req.headers.map((h) => h[0])).not.toContain('Host');
  });

  it('drops what Go never copies and what the client owns', () => {
    const { req } = request(['Content-Length', 'Transfer-Encoding', 'Trailer', 'Connection', 'Keep-Alive', 'Upgrade', 'Expect'].map((name) => ({ name, value: 'x' })));
    expect(req.headers).toEqual([['User-Agent', 'kube-probe/1.34'], ['Accept', '*/*']]);
  });

  it('trims value whitespace like Go', () => {
    expect(request([{ name: 'X-A', value: '  v \t' }]).req.headers).toContainEqual(['X-A', 'v']);
  });

  it.each([
    ['x-foo', 'X-Foo'],
    ['X-FOO-BAR', 'X-Foo-Bar'],
    ['content-md5', 'Content-Md5'],
    ['a', 'A'],
    ['-x', '-X'],
  ])('canonicalHeaderKey(%s) = %s', (input, want) => expect(canonicalHeaderKey(input)).toBe(want));
});

describe('URL path, as kubelet formatURL builds it', () => {
  it.each([
    ['/healthz', '/healthz'],
    ['', '/'],
    ['healthz', '/healthz'],
    ['/ready?verbose=1&x=a%20b', '/ready?verbose=1&x=a%20b'],
    ['/a b', '/a%20b'],
    ['/frag#x', '/frag'],
    ['http://evil.example:9/steal?q=1', '/steal?q=1'],
    ['//evil.example/x', '/x'],
    ['/caf\u00e9', '/caf%C3%A9'],
  ])('%j -> %j', (path, want) => expect(pathAndQueryOf(path)).toBe(want));

  it('the query is kept in the request', () => {
    expect(request([], '10.0.0.1', 80, '/h?a=1').req.pathAndQuery).toBe('/h?a=1');
  });
});

describe('redirects (Go client + kubelet RedirectChecker)', () => {
  const { map, req: first } = request([{ name: 'X-Token', value: 't' }]);

  const follow = (current: ProbeRequest, status: number, location: string | undefined, hops = 1): ProbeRequest => {
    const d = decideRedirect(first, current, status, location, hops, map);
    if (d.action !== 'follow') throw new Error(`expected follow, got ${JSON.stringify(d)}`);
    return d.next;
  };

  it('follows a relative redirect on the same host with the same headers plus Referer', () => {
    const next = follow(first, 302, '/other?x=1');
    expect(next.url).toBe('http://10.0.0.1:8080/other?x=1');
    expect(next.hostHeader).toBe('10.0.0.1:8080');
    expect(next.headers).toEqual([
      ['User-Agent', 'kube-probe/1.34'],
      ['Accept', '*/*'],
      ['Referer', 'http://10.0.0.1:8080/healthz'],
      ['X-Token', 't'],
    ]);
  });

  it('follows a port-only change (hostname is what counts)', () => {
    const next = follow(first, 301, 'http://10.0.0.1:9090/x');
    expect([next.port, next.hostHeader, next.pathAndQuery]).toEqual([9090, '10.0.0.1:9090', '/x']);
  });

  it('follows a scheme change on the same host and defaults the port', () => {
    const next = follow(first, 308, 'https://10.0.0.1/secure');
    expect([next.scheme, next.port, next.hostHeader]).toEqual(['https', 443, '10.0.0.1']);
  });

  it('sends no Referer from https to http', () => {
    const https = buildProbeRequest('HTTPS', '10.0.0.1', 443, '/', map);
    const d = decideRedirect(https, https, 302, 'http://10.0.0.1/', 1, map);
    expect(d.action === 'follow' && d.next.headers.some(([k]) => k === 'Referer')).toBe(false);
  });

  it('stops at another hostname and uses the 3xx response (a Warning)', () => {
    expect(decideRedirect(first, first, 302, 'http://10.0.0.2:8080/', 1, map)).toEqual({ action: 'use' });
    expect(decideRedirect(first, first, 302, 'http://example.com/', 1, map)).toEqual({ action: 'use' });
  });

  it('compares with the FIRST request hostname, not the current one', () => {
    const second = follow(first, 302, '/a');
    expect(decideRedirect(first, second, 302, 'http://10.0.0.1:1/b', 2, map).action).toBe('follow');
  });

  it('compares hostnames as Go keeps them: IPv6 without brackets but as written, case-sensitive', () => {
    const { map: m6, req: f6 } = request([], 'fd00::5', 80);
    expect(decideRedirect(f6, f6, 302, 'http://[fd00::5]:81/x', 1, m6).action).toBe('follow');
    // Go's URL.Hostname() is the raw text: another spelling of the same address is another host.
    expect(decideRedirect(f6, f6, 302, 'http://[fd00:0::5]:81/x', 1, m6).action).toBe('use');
    expect(decideRedirect(f6, f6, 302, 'http://[FD00::5]/x', 1, m6).action).toBe('use');
    expect(decideRedirect(f6, f6, 302, 'http://[fd00::6]/x', 1, m6).action).toBe('use');
    const { map: mn, req: fn } = request([], 'app.local', 80);
    expect(decideRedirect(fn, fn, 302, 'http://app.local:81/x', 1, mn).action).toBe('follow');
    expect(decideRedirect(fn, fn, 302, 'http://App.Local/x', 1, mn).action).toBe('use');
  });

  it('keeps the Location host as written in the next URL, and a scheme-relative Location on the same host is followed', () => {
    const next = follow(first, 302, '//10.0.0.1:9000/p?q=1');
    expect(next.url).toBe('http://10.0.0.1:9000/p?q=1');
    expect(follow(first, 302, 'HTTP://10.0.0.1:8080/up').url).toBe('http://10.0.0.1:8080/up');
    expect(follow(first, 302, 'other').url).toBe('http://10.0.0.1:8080/other');
  });

  it.each([
    ['http://10.0.0.1:abc/', 'parse "http://10.0.0.1:abc/": invalid port ":abc" after host'],
    ['http://[fd00::1/', 'parse "http://[fd00::1/": missing \']\' in host'],
    ['http://10.0.0 .1/', 'parse "http://10.0.0 .1/": invalid character " " in host name'],
    [':foo', 'parse ":foo": missing protocol scheme'],
    ['a:b/c'.replace('a:', '1a:'), 'parse "1a:b/c": first path segment in URL cannot contain colon'],
  ])('a Location Go cannot parse fails with Go\'s text: %j', (location, why) => {
    expect(decideRedirect(first, first, 302, location, 1, map)).toEqual({
      action: 'fail',
      reason: 'protocol',
      message: `Get "http://10.0.0.1:8080/healthz": failed to parse Location header ${JSON.stringify(location)}: ${why}`,
    });
  });

  it('uses non-followed 3xx statuses and 3xx without Location as the response', () => {
    for (const status of [300, 304, 305, 306]) expect(decideRedirect(first, first, status, '/x', 1, map)).toEqual({ action: 'use' });
    expect(decideRedirect(first, first, 302, undefined, 1, map)).toEqual({ action: 'use' });
    expect(decideRedirect(first, first, 200, '/x', 1, map)).toEqual({ action: 'use' });
  });

  it('fails after 10 redirects with the Location in Go\'s error', () => {
    expect(decideRedirect(first, first, 302, '/loop', 9, map).action).toBe('follow');
    expect(decideRedirect(first, first, 302, '/loop', 10, map)).toEqual({
      action: 'fail', reason: 'redirects', message: 'Get "/loop": stopped after 10 redirects',
    });
  });

  it('another host wins over the limit (the checker tests the host first)', () => {
    expect(decideRedirect(first, first, 302, 'http://other/', 10, map)).toEqual({ action: 'use' });
  });

  it('keeps a custom Host only across relative redirects (golang/go#22233)', () => {
    const { map: hm, req: hf } = request([{ name: 'Host', value: 'app.local' }]);
    const rel = decideRedirect(hf, hf, 302, '/x', 1, hm);
    const abs = decideRedirect(hf, hf, 302, 'http://10.0.0.1:8080/x', 1, hm);
    expect(rel.action === 'follow' && rel.next.hostHeader).toBe('app.local');
    expect(abs.action === 'follow' && abs.next.hostHeader).toBe('10.0.0.1:8080');
  });

  it('an unsupported scheme on the same host fails', () => {
    expect(decideRedirect(first, first, 302, 'ftp://10.0.0.1/x', 1, map)).toMatchObject({ action: 'fail', reason: 'protocol' });
  });
});
