/**
 * Starting and driving test/lab/pod-server.ts inside a lab pod's netns: waits for its ready line,
 * relays control requests over its stdin (the server replays them as real GETs from inside the
 * netns) and stops it. Kept apart from lab.ts so each stays small.
 */
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { LAB_ROOT, LabError } from './slots.ts';

/** Where pod-server.ts lives, resolved next to this module. */
export const POD_SERVER_PATH = fileURLToPath(new URL('./pod-server.ts', import.meta.url));
const COMPILE_CACHE_DIR = join(LAB_ROOT, 'compile-cache');
const READY_TIMEOUT_MS = 10_000;
const CONTROL_TIMEOUT_MS = 10_000;
const STOP_GRACE_MS = 3_000;
const STDERR_KEEP = 8 * 1024;

/** Ports a pod server actually listens on (port 0 in the options picks a free one). */
export interface ServerPorts {
  http?: number; https?: number; tcp?: number; grpc?: number; hang?: number;
  /** Private loopback control port, only when there is neither an HTTP nor an HTTPS port. */
  control?: number;
}

/** A pod server child process; see lab.ts RunningServer for the public shape. */
export class PodServerProcess {
  readonly child: ChildProcessWithoutNullStreams;
  ports: ServerPorts = {};
  #stderr = '';
  #exited = false;
  #nextId = 1;
  readonly #pending = new Map<string, { resolve: () => void; reject: (e: Error) => void; timer: NodeJS.Timeout; path: string }>();
  readonly #exit: Promise<void>;

  /**
   * Spawns the server in `netnsName` (ip netns), or in the netns file at that path (nsenter: a
   * containerd sandbox's netns is not under /run/netns), with `optsJson`; call ready() next.
   */
  constructor(netnsName: string, optsJson: string) {
    // The V8 compile cache roughly halves the start of a gRPC server (grpc-js is a lot of JS).
    const env = { ...process.env, NODE_COMPILE_CACHE: COMPILE_CACHE_DIR };
    const argv = netnsName.startsWith('/')
      ? ['nsenter', [`--net=${netnsName}`, '--', process.execPath, POD_SERVER_PATH, optsJson]] as const
      : ['ip', ['netns', 'exec', netnsName, process.execPath, POD_SERVER_PATH, optsJson]] as const;
    this.child = spawn(argv[0], [...argv[1]], { stdio: ['pipe', 'pipe', 'pipe'], env });
    this.child.stdin.on('error', () => {}); // EPIPE once the server is gone
    this.child.stderr.on('data', (d: Buffer) => { this.#stderr = (this.#stderr + d.toString('utf8')).slice(-STDERR_KEEP); });
    this.#exit = new Promise((resolve) => {
      this.child.on('close', () => {
        this.#exited = true;
        for (const p of this.#pending.values()) {
          clearTimeout(p.timer);
          p.reject(new LabError(`pod server exited before answering control ${p.path}`, { stderr: this.#stderr }));
        }
        this.#pending.clear();
        resolve();
      });
    });
  }

  /** The pid of the node process inside the netns (`ip netns exec` execs it in place). */
  get pid(): number {
    return this.child.pid ?? -1;
  }

  /** Waits for the "ready" line; throws a LabError with the server's stderr if it never comes. */
  async ready(): Promise<void> {
    let timedOut = false;
    const timer = setTimeout(() => { timedOut = true; this.child.kill('SIGKILL'); }, READY_TIMEOUT_MS);
    const lines = createInterface({ input: this.child.stdout });
    let onLine: (line: string) => void = () => {};
    const readyLine = new Promise<string | undefined>((resolve) => {
      onLine = (line) => { if (line.startsWith('ready ')) resolve(line); else this.#onControlLine(line); };
      lines.on('line', (line) => onLine(line));
      void this.#exit.then(() => resolve(undefined));
    });
    const line = await readyLine;
    clearTimeout(timer);
    if (line !== undefined && !this.#exited) {
      this.ports = JSON.parse(line.slice(6)) as ServerPorts;
      onLine = (l) => this.#onControlLine(l);
      return;
    }
    await this.#exit;
    const why = timedOut ? `did not become ready within ${READY_TIMEOUT_MS} ms` : `exited before ready (exit ${this.child.exitCode ?? this.child.signalCode})`;
    throw new LabError(`pod server ${why}: ${this.#stderr.trim() || '(no stderr)'}`,
      { stderr: this.#stderr, exitCode: this.child.exitCode, signal: this.child.signalCode });
  }

  #onControlLine(line: string): void {
    const m = /^ctl (\S+) (\d+) (.*)$/.exec(line);
    const p = m ? this.#pending.get(m[1]!) : undefined;
    if (!m || !p) return;
    this.#pending.delete(m[1]!);
    clearTimeout(p.timer);
    const code = Number(m[2]);
    const body = JSON.parse(m[3]!) as string;
    if (code >= 200 && code < 300) p.resolve();
    else p.reject(new LabError(`control ${p.path} answered ${code}: ${body}`, { code, body }));
  }

  /** Sends a control GET (e.g. `/control/health?ok=0`); resolves on a 2xx answer. */
  control(path: string): Promise<void> {
    if (typeof path !== 'string' || !path.startsWith('/') || /[\s]/.test(path) || path.length > 2048) {
      return Promise.reject(new LabError('control path must start with "/", have no whitespace and be at most 2048 chars', { path }));
    }
    if (this.#exited) return Promise.reject(new LabError('pod server has exited', { path, stderr: this.#stderr }));
    const id = String(this.#nextId++);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#pending.delete(id);
        reject(new LabError(`control ${path} got no answer within ${CONTROL_TIMEOUT_MS} ms`, { path }));
      }, CONTROL_TIMEOUT_MS);
      this.#pending.set(id, { resolve, reject, timer, path });
      this.child.stdin.write(`${id} ${path}\n`);
    });
  }

  /** SIGTERM, then SIGKILL after a grace period; resolves once the process is gone. Idempotent. */
  async stop(): Promise<void> {
    if (this.#exited) return;
    this.child.kill('SIGTERM');
    const timer = setTimeout(() => this.child.kill('SIGKILL'), STOP_GRACE_MS);
    await this.#exit;
    clearTimeout(timer);
  }

  /** True once the process has exited. */
  get exited(): boolean {
    return this.#exited;
  }
}
