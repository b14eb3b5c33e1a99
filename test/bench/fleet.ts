/**
 * The scale curve's pod servers: ONE process serving HTTP (/healthz), TCP (accept and close) and
 * gRPC health for many lab pods. Its listening sockets are made inside each pod's netns by the
 * agent's own netns helper and listened on here (net.Server.listen(socket), public API), so
 * connections really arrive in the pod netns, on a port chosen by the kernel. 250 pod-server.ts
 * processes would cost about 7 GB and a minute of CPU to start; this costs a few MB and ms per pod.
 *
 *   node test/bench/fleet.ts '{"netns":["/run/netns/pa1p1", ...]}'
 * prints `ready [{"http":P,"tcp":P,"grpc":P}, ...]` (one entry per netns, same order) and exits
 * when its stdin closes (so a crashed bench never leaves it behind).
 */
import http from 'node:http';
import net from 'node:net';
import * as grpc from '@grpc/grpc-js';
import { HealthImplementation } from 'grpc-health-check';
import { ResidentHelper } from '../../agent/netns/helper.ts';

/** Ports one pod serves on. */
export interface FleetPorts {
  http: number;
  tcp: number;
  grpc: number;
}

const MAX_PODS = 256;

async function listenIn(helper: ResidentHelper, netns: string, server: net.Server): Promise<number> {
  // An AF_INET6 socket with V6ONLY off is dual-stack: it takes the pod's IPv4 and IPv6 traffic.
  const socket = await helper.createSocket(netns, 6);
  server.on('error', (err) => {
    process.stderr.write(`fleet: listener in ${netns} failed: ${err.message}\n`);
    process.exit(1);
  });
  await new Promise<void>((resolve) => server.listen(socket, resolve));
  return (server.address() as net.AddressInfo).port;
}

async function main(): Promise<void> {
  const spec = JSON.parse(process.argv[2] ?? '{}') as { netns?: unknown };
  const all = Array.isArray(spec.netns) ? spec.netns : [];
  if (all.length === 0 || all.length > MAX_PODS || !all.every((n) => typeof n === 'string')) {
    throw new Error(`want {"netns": [1..${MAX_PODS} paths]}`);
  }
  const helper = await ResidentHelper.start({});
  const health = new HealthImplementation({ '': 'SERVING' });
  const grpcServer = new grpc.Server();
  health.addToServer(grpcServer);
  const injector = grpcServer.createConnectionInjector(grpc.ServerCredentials.createInsecure());
  const quiet = (s: net.Socket): void => void s.on('error', () => {});
  const ports: FleetPorts[] = [];
  for (const netns of all as string[]) {
    const web = http.createServer((req, res) => {
      const ok = req.url === '/healthz';
      res.writeHead(ok ? 200 : 404, { 'Content-Type': 'text/plain' }).end(ok ? 'ok' : 'not found');
    });
    web.on('connection', quiet);
    web.on('clientError', (_e, s: net.Socket) => s.destroy());
    const tcp = net.createServer((s) => { quiet(s); s.end(); });
    const rpc = net.createServer((s) => { quiet(s); injector.injectConnection(s); });
    ports.push({ http: await listenIn(helper, netns, web), tcp: await listenIn(helper, netns, tcp), grpc: await listenIn(helper, netns, rpc) });
  }
  // The helper is only needed to make the listeners.
  await helper.close();
  process.stdin.on('data', () => {});
  process.stdin.on('end', () => process.exit(0));
  process.on('SIGTERM', () => process.exit(0));
  process.stdout.write(`ready ${JSON.stringify(ports)}\n`);
}

main().catch((err: unknown) => {
  process.stderr.write(`fleet: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(1);
});
