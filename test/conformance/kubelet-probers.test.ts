/**
 * Conformance with kubelet's own prober tests: every case of test/conformance/cases.ts runs end to
 * end, through the built CLI (`bin/probe-agent probe --netns ... --output json`), against the
 * conformance server in a lab pod behind the node->pod drop rule, and is compared with what
 * upstream asserts (or with the documented difference). Needs `make build` (the CLI runs dist/).
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'openssl']);

import { execFile } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLab, type Lab, type LabPod } from '../lab/lab.ts';
import { startConformanceServer, type ConformanceServer } from '../lab/conformance-server.ts';
import { builtCli } from '../support/built-cli.ts';
import { conformanceCases, type ConformanceCase, type Expect } from './cases.ts';

/** PROBE_AGENT_CONFORMANCE_CLI runs the table against another build (e.g. to compare before and after a change). */
const CLI_OVERRIDE = process.env.PROBE_AGENT_CONFORMANCE_CLI;
/** The CLI the table runs: the override, or this checkout's bin/probe-agent once dist/ is a build of the current sources. */
let CLI: string;

let lab: Lab;
let pod: LabPod;
let server: ConformanceServer;
let cases: ConformanceCase[] = [];

interface CliOutcome {
  exitCode: number;
  result: string;
  message: string;
  reason?: string;
  stderr: string;
}

/** One `probe-agent probe` run; resolves with its JSON line and exit status. */
function probeCli(c: ConformanceCase): Promise<CliOutcome> {
  const ips = c.podIPs ?? [pod.ipv4];
  const args = ['probe', '--netns', pod.netns, '--spec', JSON.stringify(c.spec), '--output', 'json', ...ips.flatMap((ip) => ['--pod-ip', ip])];
  return new Promise((resolve, reject) => {
    execFile(CLI, args, { timeout: 30_000, maxBuffer: 1024 * 1024 }, (err, stdout, stderr) => {
      const code = err ? (typeof err.code === 'number' ? err.code : -1) : 0;
      const line = stdout.trim().split('\n').at(-1) ?? '';
      try {
        const j = JSON.parse(line) as { result: string; message: string; reason?: string };
        resolve({ exitCode: code, result: j.result, message: j.message, reason: j.reason, stderr });
      } catch {
        reject(new Error(`probe-agent probe gave no JSON (exit ${code}): ${stdout} ${stderr}`));
      }
    });
  });
}

/** Runs `fn` over `items`, `limit` at a time. */
async function pool<T, R>(items: T[], limit: number, fn: (t: T) => Promise<R>): Promise<R[]> {
  const out: R[] = new Array(items.length);
  let next = 0;
  await Promise.all(Array.from({ length: limit }, async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i] as T);
    }
  }));
  return out;
}

function check(got: CliOutcome, want: Expect): void {
  expect(got.result).toBe(want.result);
  if (typeof want.message === 'string') expect(got.message).toBe(want.message);
  else if (want.message) expect(got.message).toMatch(want.message);
  for (const s of want.contains ?? []) expect(got.message).toContain(s);
  for (const s of want.notContains ?? []) expect(got.message).not.toContain(s);
  // The CLI's documented exit codes: 0 success (warning included), 1 failure, 2 could not run.
  expect(got.exitCode).toBe({ success: 0, warning: 0, failure: 1, error: 2 }[want.result]);
}

const outcomes = new Map<string, CliOutcome>();
const key = (c: ConformanceCase): string => `${c.upstream} :: ${c.name}`;

beforeAll(async () => {
  CLI = CLI_OVERRIDE ?? builtCli();
  lab = await createLab({ pods: 1, policy: 'drop', tag: 'conformance.test' });
  pod = lab.pods[0] as LabPod;
  server = await startConformanceServer(pod.name);
  cases = conformanceCases({ ipv4: pod.ipv4, ipv6: pod.ipv6, ports: server.ports });
  const results = await pool(cases, 4, probeCli);
  cases.forEach((c, i) => outcomes.set(key(c), results[i] as CliOutcome));
  const same = cases.filter((c) => !c.ours).length;
  console.log(`kubelet conformance: ${cases.length} cases, ${same} asserted as kubelet asserts, ${cases.length - same} documented differences`);
}, 240_000);

afterAll(async () => {
  await server?.stop();
  await lab?.destroy();
});

describe('kubelet prober conformance, end to end through `probe-agent probe` in a pod netns', () => {
  it('ran every case from inside the pod: the node->pod drop rule saw nothing', async () => {
    expect(cases.length).toBeGreaterThanOrEqual(60);
    expect(outcomes.size).toBe(cases.length);
    expect(await lab.nodeToPodDrops()).toBe(0);
  });

  it('the same probe from the node is dropped (the hole is closed in this lab)', async () => {
    const got = await new Promise<{ code: number; out: string }>((resolve) => {
      execFile(CLI, ['probe', '--from-node', '--pod-ip', pod.ipv4, '--spec', JSON.stringify({ tcpSocket: { port: server.ports.http }, timeoutSeconds: 1 }), '--output', 'json'], (err, stdout) =>
        resolve({ code: err && typeof err.code === 'number' ? err.code : 0, out: stdout }));
    });
    expect(got.code).toBe(1);
    expect(JSON.parse(got.out)).toMatchObject({ result: 'failure', reason: 'timeout' });
    expect(await lab.nodeToPodDrops()).toBeGreaterThan(0);
  });

  // One test per case, named after the upstream test it comes from.
  for (const c of conformanceCasesForNames()) {
    it(`${c.upstream}: ${c.name}`, () => {
      const real = cases.find((x) => key(x) === key(c));
      expect(real, 'case built').toBeDefined();
      const got = outcomes.get(key(c)) as CliOutcome;
      expect(got, 'case ran').toBeDefined();
      check(got, (real as ConformanceCase).ours ?? (real as ConformanceCase).kubelet);
    });
  }
});

/** The case list with placeholder addresses, only for naming the tests before the lab exists. */
function conformanceCasesForNames(): ConformanceCase[] {
  const ports = { http: 1, newport: 2, https: 3, raw: 4, grpcServing: 5, grpcNotServing: 6, grpcSlow: 7, grpcNoHealth: 8, closed: 9 };
  return conformanceCases({ ipv4: '10.0.0.1', ipv6: 'fd00::1', ports });
}
