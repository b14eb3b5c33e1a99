/**
 * kubelet's prober test tables (pkg/probe/http/http_test.go, request_test.go, tcp/tcp_test.go,
 * grpc/grpc_test.go) as end-to-end cases, plus the Go client behaviours kubelet's results rest on
 * (issue 13). Each case says what upstream asserts (`kubelet`); where the agent knowingly differs,
 * `ours` says what it does instead and `why` (docs/design/prober.md "Differences from kubelet" lists them).
 * Rewritten from what the upstream tests check, not copied.
 */
import type { ConformancePorts } from '../lab/conformance-server.ts';

/** kubelet's pkg/probe result, plus 'error' (kubelet: a non-nil err, i.e. Unknown, thrown away by the prober). */
export type KubeletResult = 'success' | 'warning' | 'failure' | 'error';

/** What a result must look like: the result, and the message exactly, by pattern, or by (not) containing. */
export interface Expect {
  result: KubeletResult;
  message?: string | RegExp;
  contains?: string[];
  notContains?: string[];
}

/** One conformance case. */
export interface ConformanceCase {
  /** Where it comes from: upstream test and case, or "go-client" for Go net/http behaviour. */
  upstream: string;
  name: string;
  /** The Probe (handler plus timeoutSeconds) given to `probe-agent probe --spec`. */
  spec: Record<string, unknown>;
  /** Pod IPs to pass (--pod-ip); default the pod's IPv4. */
  podIPs?: string[];
  kubelet: Expect;
  /** A known difference: what the agent does instead, and why. */
  ours?: Expect & { why: string };
}

/** The lab pod's addresses, for cases that name them. */
export interface CaseTarget {
  ipv4: string;
  ipv6: string;
  ports: ConformancePorts;
}

/** The message cap of the agent (agent/probe/run.ts MAX_MESSAGE_BYTES) applied to `text`, as the agent prints it. */
export function capped(text: string, max = 1024): string {
  const marker = '… (truncated)';
  return Buffer.byteLength(text) <= max ? text : text.slice(0, max - Buffer.byteLength(marker)) + marker;
}

// 2 s, not kubelet's 1 s default: a two-hop redirect on a loaded 2-core CI machine must not time
// out; /sleep answers after 3 s and the stalls never end, so the timeout cases still time out.
const http = (port: number, path: string, extra: Record<string, unknown> = {}, timeoutSeconds = 2): Record<string, unknown> => ({
  httpGet: { port, path, ...extra },
  timeoutSeconds,
});
const headers = (h: [string, string][]): Record<string, unknown> => ({ httpHeaders: h.map(([name, value]) => ({ name, value })) });

/** Builds every case against the running conformance server. */
export function conformanceCases(t: CaseTarget): ConformanceCase[] {
  const p = t.ports;
  const ip = t.ipv4;
  const cases: ConformanceCase[] = [];
  const add = (c: ConformanceCase): void => void cases.push(c);

  // ---- pkg/probe/http/http_test.go TestHTTPProbeChecker ----
  const checker = 'http_test.go TestHTTPProbeChecker';
  add({ upstream: checker, name: '200 with a body', spec: http(p.http, '/ok-body'), kubelet: { result: 'success', message: 'ok body' } });
  add({ upstream: checker, name: 'a custom header is sent', spec: http(p.http, '/echo-headers', headers([['X-Muffins-Or-Cupcakes', 'muffins']])), kubelet: { result: 'success', contains: ['X-Muffins-Or-Cupcakes: muffins\n'] } });
  add({
    upstream: checker, name: 'a repeated header sends every value',
    spec: http(p.http, '/echo-headers', headers([['X-Muffins-Or-Cupcakes', 'muffins'], ['X-Muffins-Or-Cupcakes', 'cupcakes']])),
    kubelet: { result: 'success', contains: ['X-Muffins-Or-Cupcakes: muffins\n', 'X-Muffins-Or-Cupcakes: cupcakes\n'] },
  });
  add({ upstream: checker, name: 'a lower-case header name is canonicalised', spec: http(p.http, '/echo-headers', headers([['x-muffins-or-cupcakes', 'muffins']])), kubelet: { result: 'success', contains: ['X-Muffins-Or-Cupcakes: muffins\n'] } });
  add({ upstream: checker, name: 'a given User-Agent replaces kube-probe', spec: http(p.http, '/echo-headers', headers([['User-Agent', 'foo/1.0']])), kubelet: { result: 'success', contains: ['User-Agent: foo/1.0\n'], notContains: ['kube-probe'] } });
  add({ upstream: checker, name: 'an empty User-Agent sends none', spec: http(p.http, '/echo-headers', headers([['User-Agent', '']])), kubelet: { result: 'success', notContains: ['User-Agent'] } });
  add({ upstream: checker, name: 'the default User-Agent is kube-probe/<major>.<minor>', spec: http(p.http, '/echo-headers'), kubelet: { result: 'success', message: /(^|\n)User-Agent: kube-probe\/\d+\.\d+\n/ } });
  add({ upstream: checker, name: 'an empty Accept sends none', spec: http(p.http, '/echo-headers', headers([['Accept', '']])), kubelet: { result: 'success', notContains: ['Accept'] } });
  add({ upstream: checker, name: 'a given Accept replaces */*', spec: http(p.http, '/echo-headers', headers([['Accept', 'text/html']])), kubelet: { result: 'success', contains: ['Accept: text/html\n'], notContains: ['*/*'] } });
  add({ upstream: checker, name: 'the default Accept is */*', spec: http(p.http, '/echo-headers'), kubelet: { result: 'success', contains: ['Accept: */*\n'] } });
  add({ upstream: checker, name: 'a Host header sets the request host', spec: http(p.http, '/echo-host', headers([['Host', 'muffins.cupcakes.org']])), kubelet: { result: 'success', message: 'muffins.cupcakes.org' } });
  add({ upstream: checker, name: 'a handler that breaks the connection (FailureCode)', spec: http(p.http, '/panic'), kubelet: { result: 'failure', message: `Get "http://${ip}:${p.http}/panic": EOF` } });
  add({ upstream: checker, name: '500 fails without the body', spec: http(p.http, '/status?code=500&body=fail%20body'), kubelet: { result: 'failure', message: 'HTTP probe failed with statuscode: 500' } });
  add({
    upstream: checker, name: 'no answer within the timeout', spec: http(p.http, '/sleep'),
    kubelet: { result: 'failure', message: `Get "http://${ip}:${p.http}/sleep": context deadline exceeded (Client.Timeout exceeded while awaiting headers)` },
  });
  for (const code of [301, 302, 307, 308]) {
    add({ upstream: checker, name: `${code} to a good page`, spec: http(p.http, `/redirect-${code}-ok`), kubelet: { result: 'success', message: '' } });
    add({ upstream: checker, name: `${code} to a failing page`, spec: http(p.http, `/redirect-${code}-bad`), kubelet: { result: 'failure', message: 'HTTP probe failed with statuscode: 500' } });
  }
  add({ upstream: checker, name: '308 without Location, empty body', spec: http(p.http, '/redirect-with-body?code=308&body='), kubelet: { result: 'warning', message: 'Probe terminated redirects, Response body: ' } });
  add({ upstream: checker, name: '308 without Location, with a body', spec: http(p.http, '/redirect-with-body?code=308&body=ok%20body'), kubelet: { result: 'warning', message: 'Probe terminated redirects, Response body: ok body' } });

  // ---- TestHTTPProbeChecker_NonLocalRedirects, with kubelet's own setting (followNonLocalRedirects=false) ----
  const nonLocal = 'http_test.go TestHTTPProbeChecker_NonLocalRedirects (-local)';
  const redirect = (loc: string): string => `/redirect?loc=${encodeURIComponent(loc)}`;
  add({ upstream: nonLocal, name: 'local success', spec: http(p.http, redirect('/success')), kubelet: { result: 'success' } });
  add({ upstream: nonLocal, name: 'local fail', spec: http(p.http, redirect('/fail')), kubelet: { result: 'failure', message: 'HTTP probe failed with statuscode: 500' } });
  add({ upstream: nonLocal, name: 'newport success', spec: http(p.http, redirect(`http://${ip}:${p.newport}/success`)), kubelet: { result: 'success' } });
  add({ upstream: nonLocal, name: 'newport fail', spec: http(p.http, redirect(`http://${ip}:${p.newport}/fail`)), kubelet: { result: 'failure' } });
  add({
    upstream: nonLocal, name: 'bogus nonlocal: not followed, a warning', spec: http(p.http, redirect('http://0.0.0.0/fail')),
    kubelet: { result: 'warning', message: 'Probe terminated redirects, Response body: <a href="http://0.0.0.0/fail">Found</a>.\n\n' },
  });
  add({ upstream: nonLocal, name: 'redirect loop', spec: http(p.http, '/loop'), kubelet: { result: 'failure', message: 'Get "/loop": stopped after 10 redirects' } });

  // ---- TestHTTPProbeChecker_HostHeaderPreservedAfterRedirect ----
  const hostKept = 'http_test.go TestHTTPProbeChecker_HostHeaderPreservedAfterRedirect';
  add({ upstream: hostKept, name: 'success', spec: http(p.http, '/host-redirect', headers([['Host', 'www.success.com']])), kubelet: { result: 'success' } });
  add({ upstream: hostKept, name: 'fail', spec: http(p.http, '/host-redirect', headers([['Host', 'www.fail.com']])), kubelet: { result: 'failure', message: 'HTTP probe failed with statuscode: 400' } });

  // ---- TestHTTPProbeChecker_PayloadTruncated / PayloadNormal ----
  const capWhy = 'the agent caps every message at 1 KiB (status, events, logs); kubelet keeps the 10 KiB it read';
  add({
    upstream: 'http_test.go TestHTTPProbeChecker_PayloadTruncated', name: '10 KiB + 1: truncated, not an error', spec: http(p.http, `/payload?n=${10 * 1024 + 1}`),
    kubelet: { result: 'success', message: 'a'.repeat(10 * 1024) },
    ours: { result: 'success', message: capped('a'.repeat(10 * 1024)), why: capWhy },
  });
  add({
    upstream: 'http_test.go TestHTTPProbeChecker_PayloadNormal', name: '10 KiB - 1', spec: http(p.http, `/payload?n=${10 * 1024 - 1}`),
    kubelet: { result: 'success', message: 'a'.repeat(10 * 1024 - 1) },
    ours: { result: 'success', message: capped('a'.repeat(10 * 1024 - 1)), why: capWhy },
  });

  // ---- pkg/probe/http/request_test.go: the request kubelet builds ----
  const request = 'request_test.go (URL and headers of NewRequestForHTTPGetAction)';
  add({ upstream: request, name: 'path and query kept; Host is ip:port', spec: http(p.http, '/echo-request?x=1&y=two'), kubelet: { result: 'success', message: `GET /echo-request?x=1&y=two\nHost: ${ip}:${p.http}` } });
  add({ upstream: request, name: 'a path without a leading slash gets one', spec: http(p.http, 'echo-request'), kubelet: { result: 'success', message: `GET /echo-request\nHost: ${ip}:${p.http}` } });
  add({ upstream: request, name: 'a fragment is not sent', spec: http(p.http, '/echo-request#frag'), kubelet: { result: 'success', message: `GET /echo-request\nHost: ${ip}:${p.http}` } });
  add({ upstream: request, name: 'IPv6 pod IP: Host in brackets', spec: http(p.http, '/echo-request'), podIPs: [t.ipv6], kubelet: { result: 'success', message: `GET /echo-request\nHost: [${t.ipv6}]:${p.http}` } });
  add({ upstream: request, name: 'scheme HTTPS, no verification', spec: http(p.https, '/echo-request', { scheme: 'HTTPS' }), kubelet: { result: 'success', message: `GET /echo-request\nHost: ${ip}:${p.https}` } });
  add({ upstream: request, name: 'lower-case scheme', spec: http(p.https, '/ok-body', { scheme: 'https' }), kubelet: { result: 'success', message: 'ok body' } });

  // ---- pkg/probe/tcp/tcp_test.go ----
  add({ upstream: 'tcp_test.go TestTcpHealthChecker', name: 'a listening port', spec: { tcpSocket: { port: p.http }, timeoutSeconds: 1 }, kubelet: { result: 'success', message: '' } });
  add({ upstream: 'tcp_test.go TestTcpHealthChecker', name: 'a closed port', spec: { tcpSocket: { port: p.closed }, timeoutSeconds: 1 }, kubelet: { result: 'failure', message: `dial tcp ${ip}:${p.closed}: connect: connection refused` } });

  // ---- pkg/probe/grpc/grpc_test.go TestGrpcProber_Probe ----
  const g = 'grpc_test.go TestGrpcProber_Probe';
  add({
    upstream: g, name: 'nothing listens', spec: { grpc: { port: p.closed }, timeoutSeconds: 1 },
    kubelet: { result: 'failure', message: `timeout: failed to connect service "${ip}:${p.closed}" within 1s: context deadline exceeded` },
    ours: {
      result: 'failure', message: `error: failed to connect service at "${ip}:${p.closed}": dial tcp ${ip}:${p.closed}: connect: connection refused`,
      why: 'grpc-go (WithBlock) redials a refused target until the deadline; the agent reports the refusal at once: same result, sooner, with the real cause',
    },
  });
  add({ upstream: g, name: 'an HTTP/1 server (connection closed)', spec: { grpc: { port: p.http }, timeoutSeconds: 1 }, kubelet: { result: 'failure' } });
  add({ upstream: g, name: 'NOT_SERVING', spec: { grpc: { port: p.grpcNotServing }, timeoutSeconds: 1 }, kubelet: { result: 'failure', message: 'service unhealthy (responded with "NOT_SERVING")' } });
  add({ upstream: g, name: 'no answer in time', spec: { grpc: { port: p.grpcSlow }, timeoutSeconds: 2 }, kubelet: { result: 'failure', message: 'timeout: health rpc did not complete within 2s' } });
  add({ upstream: g, name: 'SERVING', spec: { grpc: { port: p.grpcServing }, timeoutSeconds: 2 }, kubelet: { result: 'success', message: 'service healthy' } });
  add({ upstream: 'grpc.go (Unimplemented)', name: 'no health service', spec: { grpc: { port: p.grpcNoHealth }, timeoutSeconds: 1 }, kubelet: { result: 'failure', message: /^error: this server does not implement the grpc health protocol \(grpc\.health\.v1\.Health\): / } });

  // ---- Go's net/http client, as kubelet's HTTP prober gets it (issue 13 item 3/4) ----
  const go = 'go-client';
  const urlOf = (path: string): string => `http://${ip}:${p.raw}${path}`;
  add({ upstream: go, name: '100 Continue before the final response is skipped', spec: http(p.raw, '/continue'), kubelet: { result: 'success', message: 'ok body' } });
  add({ upstream: go, name: '103 Early Hints is skipped', spec: http(p.raw, '/early-hints'), kubelet: { result: 'success', message: 'ok' } });
  add({ upstream: go, name: 'more than five 1xx', spec: http(p.raw, '/six-1xx'), kubelet: { result: 'failure', message: `Get "${urlOf('/six-1xx')}": net/http: HTTP/1.x transport connection broken: net/http: too many 1xx informational responses` } });
  add({ upstream: go, name: 'the success message is the body as read, untrimmed', spec: http(p.raw, '/untrimmed'), kubelet: { result: 'success', message: '\n  ok  \n\n' } });
  const bodyTimeout = 'context deadline exceeded (Client.Timeout or context cancellation while reading body)';
  add({ upstream: go, name: '200 whose body stalls: a prober error', spec: http(p.raw, '/stall-200'), kubelet: { result: 'error', message: bodyTimeout } });
  add({ upstream: go, name: '503 whose body stalls: a prober error', spec: http(p.raw, '/stall-503'), kubelet: { result: 'error', message: bodyTimeout } });
  add({ upstream: go, name: '200 whose body is cut short: a prober error', spec: http(p.raw, '/short-200'), kubelet: { result: 'error', message: 'unexpected EOF' } });
  add({
    upstream: go, name: 'a followed redirect of unknown length is drained (a stall uses up the deadline)', spec: http(p.raw, '/redirect-stall'),
    kubelet: { result: 'failure', message: `Get "${urlOf('/continue')}": context deadline exceeded (Client.Timeout exceeded while awaiting headers)` },
  });
  add({ upstream: go, name: 'a followed redirect with a big body is not read', spec: http(p.raw, '/redirect-big'), kubelet: { result: 'success', message: 'ok body' } });
  const v6 = t.ipv6;
  add({ upstream: go, name: 'IPv6 Location as written: same address, same spelling, followed', spec: http(p.http, redirect(`http://[${v6}]:${p.newport}/success`)), podIPs: [v6], kubelet: { result: 'success' } });
  add({ upstream: go, name: 'IPv6 Location in capitals is another hostname (Go compares raw text)', spec: http(p.http, redirect(`http://[${v6.toUpperCase()}]:${p.newport}/success`)), podIPs: [v6], kubelet: { result: 'warning' } });
  add({
    upstream: go, name: 'a Location with a bad port fails with Go\'s parse error', spec: http(p.http, redirect(`http://${ip}:abc/`)),
    kubelet: { result: 'failure', message: `Get "http://${ip}:${p.http}${redirect(`http://${ip}:abc/`)}": failed to parse Location header "http://${ip}:abc/": parse "http://${ip}:abc/": invalid port ":abc" after host` },
  });
  return cases;
}
