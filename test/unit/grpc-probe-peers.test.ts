/**
 * The gRPC prober's verdicts and messages for servers that answer with raw HTTP/2 frames (loopback
 * TCP): the cases its HTTP/2 layer decides (GOAWAY before and after the response headers, a reset
 * with and without an error, a connection that ends mid-answer, compressed or over-size messages,
 * non-gRPC answers), each in the words this probe gave when it ran on node:http2; a :status other
 * than 200 (1xx included) in grpc-go's words, as kubelet's prober reports it.
 */
import net from 'node:net';
import { afterAll, describe, expect, it } from 'vitest';
import { encodeLiteralBlock } from '../../agent/http2/hpack.ts';
import { frameBytes, goawayFrame, rstStreamFrame } from '../../agent/http2/wire.ts';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { runProbe } from '../../agent/probe/run.ts';

const sockets = new NodeSocketFactory();
const servers: net.Server[] = [];
afterAll(() => servers.forEach((s) => s.close()));

const SETTINGS = frameBytes(0x4, 0, 0);
const headers = (fields: [string, string][], flags = 0x4): Buffer => frameBytes(0x1, flags, 1, encodeLiteralBlock(fields.map(([name, value]) => ({ name, value }))));
const GRPC_HEADERS = headers([[':status', '200'], ['content-type', 'application/grpc']]);
const message = (flag: number, status: number): Buffer => frameBytes(0x0, 0, 1, Buffer.from([flag, 0, 0, 0, 2, 0x08, status]));
const OK_TRAILERS = headers([['grpc-status', '0']], 0x5);

/** Probes a server that writes `answer` once the request arrives. */
async function probeAgainst(answer: (s: net.Socket) => void) {
  const srv = net.createServer((s) => {
    s.on('error', () => {});
    s.once('data', () => answer(s));
  });
  servers.push(srv);
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const port = (srv.address() as net.AddressInfo).port;
  return runProbe({ kind: 'grpc', port }, {
    netns: undefined, podIPs: ['127.0.0.1'], timeoutSeconds: 2, sockets, nodeSockets: sockets, kubeVersion: '1.34', hostFieldPolicy: 'refuse', happyEyeballs: false,
  });
}

const rpcError = (desc: string): RegExp => new RegExp(`^error: health rpc probe failed: rpc error: code = ${desc}$`);
const connError = (detail: string): RegExp => new RegExp(`^error: failed to connect service at "127\\.0\\.0\\.1:\\d+": connection error: desc = "transport: ${detail}"$`);

describe('gRPC prober against raw HTTP/2 peers', () => {
  const cases: [string, (s: net.Socket) => void, string, string, RegExp][] = [
    ['SERVING', (s) => s.write(Buffer.concat([SETTINGS, GRPC_HEADERS, message(0, 1), OK_TRAILERS])), 'success', '', /^service healthy$/],
    ['NOT_SERVING', (s) => s.write(Buffer.concat([SETTINGS, GRPC_HEADERS, message(0, 2), OK_TRAILERS])), 'failure', 'grpc-not-serving', /^service unhealthy \(responded with "NOT_SERVING"\)$/],
    ['SERVICE_UNKNOWN', (s) => s.write(Buffer.concat([SETTINGS, GRPC_HEADERS, message(0, 3), OK_TRAILERS])), 'failure', 'grpc-not-serving', /^service unhealthy \(responded with "SERVICE_UNKNOWN"\)$/],
    ['a non-OK status with a percent-encoded message', (s) => s.write(Buffer.concat([SETTINGS, GRPC_HEADERS, headers([['grpc-status', '14'], ['grpc-message', 'down%20now']], 0x5)])), 'failure', 'grpc-status', rpcError('Unavailable desc = down now')],
    ['a compressed-flag message', (s) => s.write(Buffer.concat([SETTINGS, GRPC_HEADERS, message(1, 1), OK_TRAILERS])), 'failure', 'grpc-status', rpcError('Internal desc = grpc: compressed message received but no compression was negotiated')],
    ['an over-size answer', (s) => s.write(Buffer.concat([SETTINGS, GRPC_HEADERS, frameBytes(0, 0, 1, Buffer.alloc(16_000)), frameBytes(0, 0, 1, Buffer.alloc(1000))])), 'failure', 'grpc-status', rpcError('ResourceExhausted desc = grpc: received message larger than max \\(17000 vs\\. 16384\\)')],
    // grpc-go (before 1.76, kubelet's through v1.34) fails the call on any :status but 200, in these words.
    ['HTTP 503 without grpc-status', (s) => s.write(Buffer.concat([SETTINGS, headers([[':status', '503']], 0x5)])), 'failure', 'grpc-status', rpcError('Unavailable desc = unexpected HTTP status code received from server: 503 \\(Service Unavailable\\); malformed header: missing HTTP content-type')],
    ['HTTP 503 with grpc-status and a gRPC content-type', (s) => s.write(Buffer.concat([SETTINGS, headers([[':status', '503'], ['content-type', 'application/grpc'], ['grpc-status', '0']], 0x5)])), 'failure', 'grpc-status', rpcError('Unavailable desc = unexpected HTTP status code received from server: 503 \\(Service Unavailable\\)')],
    ['a 100 Continue head, then the answer', (s) => s.write(Buffer.concat([SETTINGS, headers([[':status', '100']]), GRPC_HEADERS, message(0, 1), OK_TRAILERS])), 'failure', 'grpc-status', rpcError('Unknown desc = unexpected HTTP status code received from server: 100 \\(Continue\\); malformed header: missing HTTP content-type')],
    ['a 103 Early Hints head with a gRPC content-type', (s) => s.write(Buffer.concat([SETTINGS, headers([[':status', '103'], ['content-type', 'application/grpc']])])), 'failure', 'grpc-status', rpcError('Unknown desc = unexpected HTTP status code received from server: 103 \\(Early Hints\\)')],
    ['a 199 head with a text content-type', (s) => s.write(Buffer.concat([SETTINGS, headers([[':status', '199'], ['content-type', 'text/plain']])])), 'failure', 'grpc-status', rpcError('Unknown desc = unexpected HTTP status code received from server: 199 \\(\\); transport: received unexpected content-type "text/plain"')],
    ['a malformed :status', (s) => s.write(Buffer.concat([SETTINGS, headers([[':status', 'abc'], ['content-type', 'application/grpc']])])), 'failure', 'grpc-status', rpcError('Internal desc = transport: malformed http-status: strconv.ParseInt: parsing "abc": invalid syntax')],
    ['a text/html answer', (s) => s.write(Buffer.concat([SETTINGS, headers([[':status', '200'], ['content-type', 'text/html']], 0x5)])), 'failure', 'grpc-status', rpcError('Internal desc = transport: received unexpected content-type "text/html"')],
    ['an answer without trailers', (s) => s.write(Buffer.concat([SETTINGS, GRPC_HEADERS, frameBytes(0, 0x1, 1, Buffer.from([0, 0, 0, 0, 2, 8, 1]))])), 'failure', 'grpc-status', rpcError('Internal desc = server closed the stream without sending trailers')],
    ['the connection ends after the response headers', (s) => s.end(Buffer.concat([SETTINGS, GRPC_HEADERS])), 'failure', 'grpc-status', rpcError('Internal desc = server closed the stream without sending trailers')],
    ['RST_STREAM REFUSED_STREAM', (s) => s.write(Buffer.concat([SETTINGS, rstStreamFrame(1, 7)])), 'failure', 'grpc-status', rpcError('Unavailable desc = stream terminated by RST_STREAM with error code: REFUSED_STREAM')],
    ['RST_STREAM NO_ERROR before any header', (s) => s.write(Buffer.concat([SETTINGS, rstStreamFrame(1, 0)])), 'failure', 'protocol', connError('stream closed with code 0')],
    ['RST_STREAM NO_ERROR after the response headers', (s) => s.write(Buffer.concat([SETTINGS, GRPC_HEADERS, rstStreamFrame(1, 0)])), 'failure', 'grpc-status', rpcError('Internal desc = server closed the stream without sending trailers')],
    ['GOAWAY PROTOCOL_ERROR before the response', (s) => s.write(Buffer.concat([SETTINGS, goawayFrame(0, 1, 'bad')])), 'failure', 'protocol', connError('Session closed with error code 1')],
    ['a graceful GOAWAY that leaves stream 1 unprocessed', (s) => s.write(Buffer.concat([SETTINGS, goawayFrame(0, 0)])), 'failure', 'grpc-status', rpcError('Unavailable desc = stream terminated by RST_STREAM with error code: REFUSED_STREAM')],
    ['GOAWAY INTERNAL_ERROR after the response headers', (s) => s.write(Buffer.concat([SETTINGS, GRPC_HEADERS, goawayFrame(1, 2)])), 'failure', 'grpc-status', rpcError('Internal desc = Session closed with error code 2')],
    ['an HTTP/1.1 answer', (s) => s.end('HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n'), 'failure', 'protocol', connError('.+')],
    ['a server that closes at once', (s) => s.end(), 'failure', 'protocol', connError('.+')],
  ];
  it.each(cases)('%s', async (_name, answer, result, reason, msg) => {
    const out = await probeAgainst(answer);
    expect(out.result).toBe(result);
    if (reason) expect(out.reason).toBe(reason);
    expect(out.message).toMatch(msg);
  });
});
