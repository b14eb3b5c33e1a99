/**
 * The wake-up floor's lean Node receivers: one unix-socket connection through agent/io/lean-socket.ts
 * (onread into the reused buffer, as the shim and the agent read now), a byte back for every read.
 * argv[2] says how the byte goes back: `write` (socket.write, what the agent and the shim do),
 * `cork` (the same between cork and uncork), `fd` (fs.writeSync on the socket's descriptor, through
 * Node internals: measured only, to show what the Writable still costs).
 */
import { writeSync } from 'node:fs';
import { leanServer } from '../../../agent/io/lean-socket.ts';

const mode = process.argv[2];
const path = process.argv[3];
if (!path || !['write', 'cork', 'fd'].includes(mode ?? '')) process.exit(2);
const K = Buffer.from('k');
const server = leanServer((c) => {
  if (!c.lean) process.exit(3);
  const fd = (c.socket as unknown as { _handle: { fd: number } })._handle.fd;
  const answer = mode === 'write'
    ? () => c.write(K)
    : mode === 'cork'
      ? () => {
        c.socket.cork();
        c.write(K);
        c.socket.uncork();
      }
      : () => writeSync(fd, K);
  c.start({
    data: answer,
    end: () => process.exit(0),
    close: (err) => process.exit(err ? 1 : 0),
    drain: () => {},
  });
});
server.listen(path, () => process.stdout.write('ready\n'));
