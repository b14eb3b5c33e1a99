/**
 * The lab topology as iproute2 batch scripts and an nftables ruleset, plus the async command runner
 * used to apply them. Batches keep setup to a handful of process spawns (one for the node side, one
 * per pod, one for nft), which is what keeps a 3-pod lab well under half a second.
 */
import { spawn } from 'node:child_process';
import { connect } from 'node:net';
import { LabError, type SlotNames } from './slots.ts';

/** The node->pod rule: drop (time out), reject with TCP reset (fail fast), or no rule at all. */
export type LabPolicy = 'drop' | 'reject' | 'none';

/** Output of a finished command. */
export interface RunResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** Options for run(). */
export interface RunOptions {
  input?: string;
  timeoutMs?: number;
  /** Resolve with the exit code instead of throwing when it is not 0. */
  allowFailure?: boolean;
  /** Cap on collected stdout/stderr each; output beyond it is dropped. */
  maxOutputBytes?: number;
}

const DEFAULT_RUN_TIMEOUT_MS = 30_000;
const DEFAULT_MAX_OUTPUT = 16 * 1024 * 1024;

/** Runs a command (no shell), collecting bounded output; throws LabError on failure or timeout. */
export function run(cmd: string, args: string[], o: RunOptions = {}): Promise<RunResult> {
  const max = o.maxOutputBytes ?? DEFAULT_MAX_OUTPUT;
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ['pipe', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    let outLen = 0;
    let errLen = 0;
    let timedOut = false;
    child.stdout.on('data', (d: Buffer) => { if (outLen < max) { out.push(d); outLen += d.length; } });
    child.stderr.on('data', (d: Buffer) => { if (errLen < max) { err.push(d); errLen += d.length; } });
    const timer = setTimeout(() => { timedOut = true; child.kill('SIGKILL'); }, o.timeoutMs ?? DEFAULT_RUN_TIMEOUT_MS);
    child.stdin.on('error', () => {}); // EPIPE when the command exits without reading its input
    child.stdin.end(o.input ?? '');
    child.on('error', (e) => {
      clearTimeout(timer);
      reject(new LabError(`cannot run ${cmd}: ${e.message}`, { cmd, args }, { cause: e }));
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      const r = {
        code: code ?? 128 + (signal ? 9 : 0),
        stdout: Buffer.concat(out).subarray(0, max).toString('utf8'),
        stderr: Buffer.concat(err).subarray(0, max).toString('utf8'),
      };
      if (timedOut) return reject(new LabError(`${cmd} ${args.join(' ')} timed out after ${o.timeoutMs ?? DEFAULT_RUN_TIMEOUT_MS} ms`, { cmd, args, stderr: r.stderr }));
      if (r.code !== 0 && !o.allowFailure) {
        return reject(new LabError(`${cmd} ${args.join(' ')} failed (exit ${r.code}): ${r.stderr.trim()}`, { cmd, args, code: r.code }));
      }
      resolve(r);
    });
  });
}

/** Node-netns batch: the pods' netns, the bridge with both gateways, one veth pair per pod. */
export function nodeBatch(n: SlotNames, pods: number): string {
  const lines: string[] = [];
  for (let i = 1; i <= pods; i++) lines.push(`netns add ${n.netns(i)}`);
  lines.push(
    // STP off and no forward delay: ports forward the moment they come up.
    `link add ${n.bridge} group ${n.linkGroup} type bridge stp_state 0 forward_delay 0`,
    `addr add ${n.gatewayV4}/24 dev ${n.bridge}`,
    // nodad: usable at once instead of "tentative" for a second or so.
    `addr add ${n.gatewayV6}/64 dev ${n.bridge} nodad`,
    `link set ${n.bridge} up`,
  );
  for (let i = 1; i <= pods; i++) {
    lines.push(
      `link add ${n.hostVeth(i)} group ${n.linkGroup} type veth peer name eth0 netns ${n.netns(i)}`,
      `link set ${n.hostVeth(i)} master ${n.bridge} up`,
    );
  }
  return lines.join('\n') + '\n';
}

/** Pod-netns batch (run with `ip -n <netns>`): lo and eth0 up, both addresses, both default routes. */
export function podBatch(n: SlotNames, i: number): string {
  return [
    'link set lo up',
    `addr add ${n.podV4(i)}/24 dev eth0`,
    `addr add ${n.podV6(i)}/64 dev eth0 nodad`,
    'link set eth0 up',
    `route add default via ${n.gatewayV4}`,
    `route add ::/0 via ${n.gatewayV6}`,
  ].join('\n') + '\n';
}

/**
 * The "NetworkPolicy without the kubelet hole" table: on the node's output hook, NEW connections
 * to the pods' addresses are dropped or reset. The gateways are outside the ranges so the node can
 * still talk to itself; `ct state new` keeps replies to pod->node connections flowing; pod<->pod
 * traffic is bridged and never crosses the node's output hook. The add+delete prefix makes the
 * load replace any older copy of the table atomically.
 */
export function nftScript(n: SlotNames, policy: Exclude<LabPolicy, 'none'>): string {
  const v4 = `${n.podV4(1)}-10.250.${n.slot}.254`;
  const v6 = `${n.podV6(1)}-fd00:10:250:${n.slot}:ffff:ffff:ffff:ffff`;
  const verdicts = policy === 'drop'
    ? ['counter drop']
    : ['meta l4proto tcp counter reject with tcp reset', 'counter reject with icmpx type admin-prohibited'];
  const rules = [`ip daddr ${v4}`, `ip6 daddr ${v6}`].flatMap((match) => verdicts.map((v) => `    ct state new ${match} ${v}`));
  return [
    `add table inet ${n.nftTable}`,
    `delete table inet ${n.nftTable}`,
    `table inet ${n.nftTable} {`,
    '  chain output {',
    '    type filter hook output priority filter; policy accept;',
    ...rules,
    '  }',
    '}',
  ].join('\n') + '\n';
}

/** Sums the packet counters of every rule in `nft -j list table` output. */
export function sumCounters(nftJson: string): number {
  const doc = JSON.parse(nftJson) as { nftables?: Array<{ rule?: { expr?: unknown[] } }> };
  let total = 0;
  for (const item of doc.nftables ?? []) {
    for (const e of item.rule?.expr ?? []) {
      const packets = (e as { counter?: { packets?: number } }).counter?.packets;
      if (typeof packets === 'number') total += packets;
    }
  }
  return total;
}

/**
 * A TCP connect from the test process (the node's netns): 'connected', 'timeout' or the error code,
 * and how long it took. The socket is destroyed at once, so a dropped SYN is not retransmitted into
 * a later measurement (as a fetch left to its pool would).
 */
export function connectFromNode(host: string, port: number, timeoutMs = 2000): Promise<{ result: string; ms: number }> {
  const start = Date.now();
  return new Promise((resolve) => {
    const s = connect({ host, port });
    const done = (result: string): void => {
      s.destroy();
      resolve({ result, ms: Date.now() - start });
    };
    s.setTimeout(timeoutMs, () => done('timeout'));
    s.once('connect', () => done('connected'));
    s.once('error', (e: NodeJS.ErrnoException) => done(e.code ?? e.message));
  });
}
