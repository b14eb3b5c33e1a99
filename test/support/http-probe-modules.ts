/**
 * Child-process script: loads the daemon's module graph (agent/daemon, not started) from a given
 * agent directory (the TypeScript sources, or a build such as dist/), runs HTTP and HTTPS probes
 * through the agent's probe path against servers on loopback, and prints one JSON line: the results,
 * how many loaded modules come from node_modules/undici (and the first), and the process's RSS after the probes.
 *
 *   node test/support/http-probe-modules.ts <agent dir> <cert.pem> <key.pem> [<probes per kind>]
 *
 * Run in its own process so nothing a test runner loaded is counted.
 */
import { readFileSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import { createRequire } from 'node:module';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const [agentDir, certFile, keyFile, perKindArg] = process.argv.slice(2);
if (!agentDir || !certFile || !keyFile) throw new Error('usage: http-probe-modules.ts <agent dir> <cert.pem> <key.pem> [<probes per kind>]');
const perKind = Number(perKindArg ?? 5);
const ext = agentDir.endsWith('agent') ? '.ts' : '.js';
const load = async (rel: string): Promise<Record<string, unknown>> => import(pathToFileURL(join(agentDir, rel + ext)).href) as Promise<Record<string, unknown>>;

await load('daemon');
const { runProbe } = (await load('probe/run')) as { runProbe: (h: unknown, ctx: unknown) => Promise<{ result: string; message: string }> };
const { NodeSocketFactory } = (await load('netns/node-sockets')) as { NodeSocketFactory: new () => unknown };

const answer = (req: http.IncomingMessage, res: http.ServerResponse): void => {
  if (req.url === '/moved') res.writeHead(302, { location: '/ok' }).end();
  else res.writeHead(200).end('ok');
};
const listen = async (server: http.Server | https.Server): Promise<number> => {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return (server.address() as AddressInfo).port;
};
const plain = http.createServer(answer);
const tls = https.createServer({ cert: readFileSync(certFile), key: readFileSync(keyFile) }, answer);
const [httpPort, httpsPort] = [await listen(plain), await listen(tls)];

const sockets = new NodeSocketFactory();
const ctx = { netns: undefined, podIPs: ['127.0.0.1'], timeoutSeconds: 5, sockets, nodeSockets: sockets, kubeVersion: '1.34', hostFieldPolicy: 'refuse', happyEyeballs: false };
const handler = (port: number, path: string, scheme: 'HTTP' | 'HTTPS') => ({ kind: 'http', port, path, scheme, headers: [] });
const results: string[] = [];
for (let i = 0; i < perKind; i++) {
  for (const h of [handler(httpPort, '/ok', 'HTTP'), handler(httpsPort, '/ok', 'HTTPS'), handler(httpPort, '/moved', 'HTTP')]) {
    const out = await runProbe(h, ctx);
    results.push(`${h.scheme}${h.path}=${out.result}:${out.message}`);
  }
}
plain.close();
tls.close();
globalThis.gc?.();
const require = createRequire(import.meta.url);
const undici = Object.keys(require.cache).filter((p) => /[\\/]node_modules[\\/]undici[\\/]/.test(p));
process.stdout.write(`${JSON.stringify({ results: [...new Set(results)], undiciModules: undici.length, firstUndiciModule: undici[0] ?? null, rssMB: Math.round(process.memoryUsage().rss / 1e5) / 10 })}\n`);
