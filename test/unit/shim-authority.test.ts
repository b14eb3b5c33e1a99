/**
 * The :authority rule of the shim's relay (agent/http2/authority.ts): which authorities Node's
 * HTTP/2 server (nghttp2) accepts, and the request header list the relay sends in place of one it
 * would refuse (`localhost`, added where a request has none, everything else unchanged).
 */
import { describe, expect, it } from 'vitest';
import { acceptableAuthority, authorityAcceptable, withAcceptableAuthority } from '../../agent/http2/authority.ts';
import type { HeaderField } from '../../agent/http2/hpack.ts';

const REQUEST: HeaderField[] = [
  { name: ':method', value: 'POST' }, { name: ':scheme', value: 'http' }, { name: ':path', value: '/runtime.v1.RuntimeService/Version' },
  { name: ':authority', value: '/run/containerd/containerd.sock' }, { name: 'content-type', value: 'application/grpc' },
  { name: 'user-agent', value: 'grpc-go/1.51.0' }, { name: 'te', value: 'trailers' }, { name: 'grpc-timeout', value: '119999m' },
];

describe('which authorities Node\'s HTTP/2 server accepts', () => {
  it('host names, ports, IP literals and percent-escapes; not paths, spaces, "@", empty or non-ASCII', () => {
    for (const ok of ['localhost', 'localhost:80', '[::1]:10010', '127.0.0.1', 'x%2Fy', "a!$&'()*+,;=_~-.b"]) expect(acceptableAuthority(ok), ok).toBe(true);
    for (const bad of ['/run/containerd/containerd.sock', 'unix:///run/x.sock', '', 'a b', 'a@b', 'tést', 'a?b', 'a#b', 'a{b}', 'a\\b', 'a"b']) expect(acceptableAuthority(bad), bad).toBe(false);
  });

  it('replaces an unacceptable :authority or host by localhost, adds one after the pseudo-headers where there is none', () => {
    expect(withAcceptableAuthority(REQUEST).find((f) => f.name === ':authority')?.value).toBe('localhost');
    const none = REQUEST.filter((f) => f.name !== ':authority');
    expect(withAcceptableAuthority(none).map((f) => f.name)).toEqual([':method', ':scheme', ':path', ':authority', 'content-type', 'user-agent', 'te', 'grpc-timeout']);
    expect(withAcceptableAuthority([...none, { name: 'host', value: '/x.sock' }]).filter((f) => f.name === 'host' || f.name === ':authority').map((f) => f.value)).toEqual(['localhost', 'localhost']);
    const fine = REQUEST.map((f) => (f.name === ':authority' ? { ...f, value: 'localhost:10010' } : f));
    expect(withAcceptableAuthority(fine)).toEqual(fine);
  });

  it('says when a request passes as it is: an acceptable :authority (and host), never none', () => {
    expect(authorityAcceptable(REQUEST)).toBe(false);
    expect(authorityAcceptable(withAcceptableAuthority(REQUEST))).toBe(true);
    expect(authorityAcceptable(REQUEST.filter((f) => f.name !== ':authority'))).toBe(false);
    expect(authorityAcceptable([...withAcceptableAuthority(REQUEST), { name: 'host', value: '/x.sock' }])).toBe(false);
  });
});
