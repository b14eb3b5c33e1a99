/** The wake-up floor's Node receiver: one unix-socket connection, a byte back for every chunk (net.Socket, as the agent and the shim read). */
import net from 'node:net';

const path = process.argv[2];
if (!path) process.exit(2);
const server = net.createServer((c) => {
  c.on('data', () => c.write('k'));
  c.on('error', () => process.exit(1));
  c.on('close', () => process.exit(0));
});
server.listen(path, () => process.stdout.write('ready\n'));
