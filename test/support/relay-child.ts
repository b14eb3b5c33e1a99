/**
 * The frame relay in a process of its own, for tests whose input may make a relay spin or run out
 * of memory (a test process stuck in a loop cannot even time out). Usage:
 *   node relay-child.ts <listen socket> <runtime socket>
 * Each connection on the listen socket gets `new FrameRelay(socket, host)`; the host answers
 * ExecSyncs whose argv[0] is probe-agent's marker at once (exit 0, "ok <x-test-stream>"): the agent
 * is not under test. Prints "ready" once listening.
 */
import * as net from 'node:net';
import { FrameRelay } from '../../agent/shim/relay.ts';
import { TestHost } from './relay-harness.ts';

const [listen, runtime] = process.argv.slice(2);
if (!listen || !runtime) {
  process.stderr.write('usage: relay-child.ts <listen socket> <runtime socket>\n');
  process.exit(2);
}
const host = new TestHost(runtime);
const server = net.createServer((socket) => {
  new FrameRelay(socket, host);
});
server.listen(listen, () => process.stdout.write('ready\n'));
