/**
 * go-url.ts against Go's net/url: each row is what `base.Parse(location)` gives in Go 1.19
 * (Debian's golang-1.19, the Go the grpc-go peer builds with) for the base
 * http://10.0.0.1:8080/a/b?z=1 — scheme, URL.Host, Hostname(), Port() and the request target. The
 * hostname decides whether kubelet follows a redirect at all, and a Location Go rejects fails the
 * probe, so both must match Go exactly.
 */
import { describe, expect, it } from 'vitest';
import { GoUrlError, resolveGoLocation, splitGoHost } from '../../agent/probe/go-url.ts';

const BASE = { scheme: 'http', host: '10.0.0.1:8080', pathAndQuery: '/a/b?z=1' };
const SAME = { scheme: 'http', host: '10.0.0.1:8080', hostname: '10.0.0.1', port: '8080' };

describe('resolveGoLocation, as Go 1.19 net/url resolves a Location', () => {
  it.each([
    ['/x?y', { ...SAME, pathAndQuery: '/x?y' }],
    ['c', { ...SAME, pathAndQuery: '/a/c' }],
    ['../c', { ...SAME, pathAndQuery: '/c' }],
    ['./', { ...SAME, pathAndQuery: '/a/' }],
    ['', { ...SAME, pathAndQuery: '/a/b?z=1' }],
    ['?q=2', { ...SAME, pathAndQuery: '/a/b?q=2' }],
    ['#frag', { ...SAME, pathAndQuery: '/a/b?z=1' }],
    ['/x#f', { ...SAME, pathAndQuery: '/x' }],
    ['a/b:c', { ...SAME, pathAndQuery: '/a/a/b:c' }],
    ['/a/../../b', { ...SAME, pathAndQuery: '/b' }],
    ['/%2F/x', { ...SAME, pathAndQuery: '/%2F/x' }],
    ['/a b', { ...SAME, pathAndQuery: '/a%20b' }],
    ['/é', { ...SAME, pathAndQuery: '/%C3%A9' }],
    // Only a path to Go: WHATWG would read a host out of these.
    ['///x', { ...SAME, pathAndQuery: '///x' }],
    ['/\\evil.com/x', { ...SAME, pathAndQuery: '/%5Cevil.com/x' }],
    ['a\\b', { ...SAME, pathAndQuery: '/a/a%5Cb' }],
    // No host: Go resolves it as a relative reference, so it stays on the same host.
    ['//', { ...SAME, pathAndQuery: '/a/b?z=1' }],
    ['HTTP://Example.COM:81/p', { scheme: 'http', host: 'Example.COM:81', hostname: 'Example.COM', port: '81', pathAndQuery: '/p' }],
    ['http://[FD00::1]:80/', { scheme: 'http', host: '[FD00::1]:80', hostname: 'FD00::1', port: '80', pathAndQuery: '/' }],
    ['http://[fd00::1]', { scheme: 'http', host: '[fd00::1]', hostname: 'fd00::1', port: '', pathAndQuery: '/' }],
    ['//other:9/x', { scheme: 'http', host: 'other:9', hostname: 'other', port: '9', pathAndQuery: '/x' }],
    ['http://user:pw@h/x', { scheme: 'http', host: 'h', hostname: 'h', port: '', pathAndQuery: '/x' }],
    ['http://a@b@c/', { scheme: 'http', host: 'c', hostname: 'c', port: '', pathAndQuery: '/' }],
    ['https://h', { scheme: 'https', host: 'h', hostname: 'h', port: '', pathAndQuery: '/' }],
    ['HTTPS://X/', { scheme: 'https', host: 'X', hostname: 'X', port: '', pathAndQuery: '/' }],
    ['http://h:/x', { scheme: 'http', host: 'h:', hostname: 'h', port: '', pathAndQuery: '/x' }],
    ['http://h:8080:90/', { scheme: 'http', host: 'h:8080:90', hostname: 'h:8080', port: '90', pathAndQuery: '/' }],
    ['http://[::1]:99999/', { scheme: 'http', host: '[::1]:99999', hostname: '::1', port: '99999', pathAndQuery: '/' }],
    ['http://h.example./', { scheme: 'http', host: 'h.example.', hostname: 'h.example.', port: '', pathAndQuery: '/' }],
    ['http://é.example/', { scheme: 'http', host: 'é.example', hostname: 'é.example', port: '', pathAndQuery: '/' }],
    ['http://h%C3%A9/', { scheme: 'http', host: 'hé', hostname: 'hé', port: '', pathAndQuery: '/' }],
    ['ftp://h/x', { scheme: 'ftp', host: 'h', hostname: 'h', port: '', pathAndQuery: '/x' }],
  ])('%j', (location, want) => {
    expect(resolveGoLocation(location, BASE)).toEqual(want);
  });

  it.each([
    ['http://h:80x/', 'invalid port ":80x" after host'],
    [':foo', 'missing protocol scheme'],
    ['1a:b', 'first path segment in URL cannot contain colon'],
    ['http://h/\n', 'net/url: invalid control character in URL'],
    ['http://h ost/', 'invalid character " " in host name'],
    ['http://[fd00::1/', "missing ']' in host"],
    ['http://h%zz/', 'invalid URL escape "%zz"'],
    // In a host an escape may only stand for a non-ASCII byte (or %25 in an IPv6 zone).
    ['http://h%41/', 'invalid URL escape "%41"'],
    ['/a%zzb', 'invalid URL escape "%zz"'],
    ['/a%4', 'invalid URL escape "%4"'],
  ])('rejects %j with Go\'s text', (location, why) => {
    let caught: unknown;
    try {
      resolveGoLocation(location, BASE);
    } catch (err) {
      caught = err;
    }
    expect(caught).toBeInstanceOf(GoUrlError);
    expect((caught as Error).message).toBe(`parse ${JSON.stringify(location)}: ${why}`);
  });

  it('a query is not checked for escapes (Go keeps RawQuery as sent)', () => {
    expect(resolveGoLocation('/p?a=%zz', BASE).pathAndQuery).toBe('/p?a=%zz');
  });

  it('an IPv6 zone may carry %25, kept unescaped', () => {
    expect(resolveGoLocation('http://[fe80::1%25eth0]:8/', BASE)).toMatchObject({ host: '[fe80::1%eth0]:8', hostname: 'fe80::1%eth0', port: '8' });
  });
});

describe('splitGoHost, as URL.Hostname()/Port()', () => {
  it.each([
    ['h:80', 'h', '80'],
    ['h', 'h', ''],
    ['[::1]:9', '::1', '9'],
    ['[::1]', '::1', ''],
    ['::1', ':', '1'],
    ['h:x', 'h:x', ''],
    ['h:', 'h', ''],
  ])('%j', (host, hostname, port) => {
    expect(splitGoHost(host)).toEqual({ hostname, port });
  });
});
