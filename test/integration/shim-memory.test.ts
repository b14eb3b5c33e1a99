/**
 * The shim's resident memory under a burst of rewritten probes, started exactly as its systemd unit starts
 * it (the node flags in deploy/components/kubelet-shim/probe-agent-shim.service's ExecStart). Without a
 * bound on V8's young generation, Node 24 on a machine with a few GB lets it grow to 2 x 64 MB semi-spaces
 * under a stream of ExecSyncs while the live heap stays ~12 MB: 230 MB RSS after these 20000 calls, against
 * 114 MB with the unit's --max-semi-space-size=1 (docs/soak.md, "The kubelet shim under churn"). The calls go
 * to an agent socket nobody listens on, so each is answered UNAVAILABLE at once and only the shim's own work
 * (HTTP/2, the `:authority` rewrite, decoding the command) allocates; no containerd is needed.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { encodeShimCommand } from '../../agent/contract/shim-command.ts';
import { rssOf } from '../bench/procstat.ts';
import { shimUnitEnv, shimUnitNodeFlags } from '../soak/shim-soak.ts';
import { builtEntry } from '../support/built-cli.ts';
import { KubeletCri } from '../support/kubelet-cri.ts';

/** Between what the unit's flags give (114 MB) and what V8's default young generation takes (230 MB). */
const SHIM_RSS_BOUND_MB = 160;
const CALLS = 20_000;
const CONCURRENCY = 16;

let scratch: string;
let sock: string;
let shim: ChildProcess;

beforeAll(async () => {
  scratch = mkdtempSync(path.join(tmpdir(), 'probe-agent-shim-mem-'));
  sock = path.join(scratch, 'cri.sock');
  shim = spawn(process.execPath, [...shimUnitNodeFlags(), builtEntry('shim/main.js'), '--listen', `unix://${sock}`,
    '--runtime-endpoint', `unix://${path.join(scratch, 'no-runtime.sock')}`, '--probe-socket', path.join(scratch, 'no-agent.sock')], { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, ...shimUnitEnv() } });
  let err = '';
  await new Promise<void>((resolve, reject) => {
    shim.stderr!.on('data', (d: Buffer) => {
      err += d.toString();
      if (err.includes('shim listening')) resolve();
    });
    shim.once('exit', (c) => reject(new Error(`shim exited (${c}): ${err}`)));
  });
}, 60_000);

afterAll(() => {
  shim?.kill('SIGKILL');
  rmSync(scratch, { recursive: true, force: true });
});

describe('shim memory as its unit starts it', () => {
  it(`stays under ${SHIM_RSS_BOUND_MB} MB RSS through ${CALLS} rewritten probes on one kubelet connection (socket-path :authority)`, async () => {
    const k = new KubeletCri(sock, { 'grpc.default_authority': sock });
    const cmd = encodeShimCommand('readiness', { httpGet: { path: '/healthz', port: 8080, scheme: 'HTTP' } });
    let sent = 0;
    let peak = 0;
    const codes = new Map<number, number>();
    try {
      await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
        while (sent < CALLS) {
          sent++;
          const a = await k.execSync('c'.repeat(64), cmd, 1);
          const code = a.ok ? -1 : a.code;
          codes.set(code, (codes.get(code) ?? 0) + 1);
          if (sent % 1000 === 0) peak = Math.max(peak, rssOf(shim.pid!).rssMB);
        }
      }));
    } finally {
      k.close();
    }
    peak = Math.max(peak, rssOf(shim.pid!).rssMB);
    // Every call reached the shim's agent path and was answered as kubelet must see an unreachable agent.
    expect(Object.fromEntries(codes)).toEqual({ [grpc.status.UNAVAILABLE]: CALLS });
    expect(peak).toBeGreaterThan(0);
    expect(peak, `shim peak RSS ${peak.toFixed(1)} MB`).toBeLessThan(SHIM_RSS_BOUND_MB);
  }, 600_000);
});
