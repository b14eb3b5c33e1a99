/**
 * ExecSync's parsed-command cache under one tenant's flood, on the real agent process (the
 * DaemonSet's 96 MiB heap cap): 40 pods of one namespace, 10 containers each, every container's
 * hand-written `/.probe-agent/v1` exec commands distinct and padded with JSON whitespace to near the
 * 16 KiB limit (such a probe needs no webhook, and need not succeed). The agent's heap stays
 * bounded (the cache keeps digests and parsed handlers, bounded in bytes, never the commands), the
 * agent lives, and a neighbour's rewritten probe, asked all along, keeps every answer. A quiet
 * neighbour in a third namespace, asked only before and after the flood (its entry the least recently
 * used of all), is still answered from the cache: the flooding namespace, over its share, evicted
 * only its own entries.
 */
import { requireRoot } from '../support/root.ts';
requireRoot();

import { createHash } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { encodeFrame } from '../../agent/grpc/frame.ts';
import { readFields } from '../../agent/grpc/protowire.ts';
import { ShimProbeClient } from '../../agent/shim/agent-client.ts';
import { encodeShimCommand, SHIM_COMMAND_PATH } from '../../agent/contract/shim-command.ts';
import { createLab, type Lab, type LabPod } from '../lab/lab.ts';
import { startAgent, type AgentHandle } from '../support/agent-harness.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { makePod } from '../support/pod-factory.ts';
import { execSyncRequest } from '../support/relay-harness.ts';

const HTTP = 8080;
const PODS = 40;
const CONTAINERS = 10;
const COMMANDS = 8;
const NEIGHBOUR = 'ab'.repeat(32);
const QUIET = 'cd'.repeat(32);

let lab: Lab;
let pod: LabPod;
let kubelet: FakeKubelet;
let agent: AgentHandle;

const cid = (p: number, c: number): string => createHash('sha256').update(`hostile/${p}/${c}`).digest('hex');

/** A hostile pod: CONTAINERS containers, all listed running (so the agent finds each by its ID). */
function hostilePod(p: number): Record<string, unknown> {
  const pod0 = makePod({ name: `flood-${p}`, namespace: 'hostile', ips: pod.ips, port: HTTP, probe: 'none', containerID: `containerd://${cid(p, 0)}` });
  const spec = pod0['spec'] as { containers: Record<string, unknown>[] };
  const status = pod0['status'] as { containerStatuses: Record<string, unknown>[] };
  const [app, appStatus] = [spec.containers[0]!, status.containerStatuses[0]!];
  spec.containers = [];
  status.containerStatuses = [];
  for (let c = 0; c < CONTAINERS; c++) {
    spec.containers.push({ ...app, name: `c${c}` });
    status.containerStatuses.push({ ...appStatus, name: `c${c}`, containerID: `containerd://${cid(p, c)}` });
  }
  return pod0;
}

/**
 * A distinct command near the 16 KiB encoding limit: an HTTP probe of a closed port whose two 4,000-octet
 * header values make its parsed handler large too (about 16 KiB of the cache's estimate, so 3,200 of
 * them are far beyond its 4 MiB), padded with JSON whitespace.
 */
function paddedCommand(n: number): string[] {
  const headers = [{ name: 'x-a', value: 'a'.repeat(4000) }, { name: 'x-b', value: 'b'.repeat(4000) }];
  const handler = JSON.stringify({ httpGet: { port: 1, path: `/${n}`, httpHeaders: headers } });
  const json = `${handler.slice(0, -1)}${' '.repeat(12_000 + 7 * n - handler.length)}}`;
  return [SHIM_COMMAND_PATH, 'readiness', Buffer.from(json).toString('base64url')];
}

async function metric(name: string): Promise<number> {
  const body = (await agent.http('/metrics')).body;
  const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(body);
  if (!m) throw new Error(`${name} not in /metrics`);
  return Number(m[1]);
}

function exitCodeOf(body: Buffer): number {
  let code = 0;
  readFields(body.subarray(5), (f, v) => {
    if (f === 3 && typeof v === 'number') code = v;
  });
  return code;
}

beforeAll(async () => {
  lab = await createLab({ pods: 1, policy: 'drop', tag: 'exec-sync-flood' });
  pod = lab.pods[0]!;
  await lab.startServer(pod, { http: HTTP });
  const neighbour = makePod({ name: 'neighbour', namespace: 'good', ips: pod.ips, port: HTTP, probe: 'none', containerID: `containerd://${NEIGHBOUR}` });
  const quiet = makePod({ name: 'quiet', namespace: 'quiet', ips: pod.ips, port: HTTP, probe: 'none', containerID: `containerd://${QUIET}` });
  kubelet = await FakeKubelet.start({ pods: [neighbour, quiet, ...Array.from({ length: PODS }, (_, p) => hostilePod(p))] });
  agent = await startAgent({ kubeletUrl: kubelet.httpUrl, env: { NODE_OPTIONS: '--max-old-space-size=96' }, startTimeoutMs: 60_000 });
}, 120_000);

afterAll(async () => {
  await agent?.stop('SIGKILL').catch(() => {});
  await kubelet?.stop();
  await lab?.destroy();
});

describe('ExecSync\'s parsed-command cache under a flood of distinct padded commands', () => {
  it('keeps the agent\'s heap bounded, and the neighbour\'s cached probe keeps every answer', async () => {
    const client = new ShimProbeClient(agent.socket);
    const neighbourCall = encodeFrame(execSyncRequest(NEIGHBOUR, encodeShimCommand('readiness', { httpGet: { path: '/healthz', port: HTTP } }), 3));
    const ask = (body: Buffer) => client.execSync(body, { deadlineMs: 30_000 });
    const quietCall = encodeFrame(execSyncRequest(QUIET, encodeShimCommand('liveness', { httpGet: { path: '/healthz', port: HTTP } }), 3));
    for (let i = 0; i < 3; i++) expect(exitCodeOf((await ask(quietCall)).body)).toBe(0);
    for (let i = 0; i < 3; i++) expect(exitCodeOf((await ask(neighbourCall)).body)).toBe(0);
    const heapBefore = await metric('nodejs_heap_size_used_bytes');

    let flooding = true;
    const neighbourAnswers: number[] = [];
    const neighbour = (async () => {
      while (flooding) {
        neighbourAnswers.push(exitCodeOf((await ask(neighbourCall)).body));
        await new Promise((r) => setTimeout(r, 200));
      }
    })();
    const jobs: [number, number, number][] = [];
    for (let p = 0; p < PODS; p++) for (let c = 0; c < CONTAINERS; c++) for (let k = 0; k < COMMANDS; k++) jobs.push([p, c, k]);
    let answered = 0;
    let heapPeak = heapBefore;
    const lanes = Array.from({ length: 16 }, async () => {
      for (let job = jobs.shift(); job; job = jobs.shift()) {
        const [p, c, k] = job;
        // Failure (closed port), or refused by the fair limiter: any answer will do, the command was parsed.
        await ask(encodeFrame(execSyncRequest(cid(p, c), paddedCommand(k), 3))).then(() => {}, () => {});
        if (++answered % 400 === 0) heapPeak = Math.max(heapPeak, await metric('nodejs_heap_size_used_bytes'));
      }
    });
    await Promise.all(lanes);
    flooding = false;
    await neighbour;
    await new Promise((r) => setTimeout(r, 2000));
    const heapAfter = await metric('nodejs_heap_size_used_bytes');
    const [entries, bytes, maxBytes, parsed, hits, namespaces, share, atShare, evictions] = await Promise.all([
      metric('probe_agent_exec_sync_cache_entries'),
      metric('probe_agent_exec_sync_cache_bytes'),
      metric('probe_agent_exec_sync_cache_max_bytes'),
      metric('probe_agent_exec_sync_commands_total{result="parsed"}'),
      metric('probe_agent_exec_sync_commands_total{result="hit"}'),
      metric('probe_agent_exec_sync_cache_namespaces'),
      metric('probe_agent_exec_sync_cache_namespace_share_bytes'),
      metric('probe_agent_exec_sync_cache_namespaces_at_share'),
      metric('probe_agent_exec_sync_cache_evictions_total'),
    ]);
    // Nothing else calls now: the quiet neighbour's call is a hit, not a parse.
    expect(exitCodeOf((await ask(quietCall)).body)).toBe(0);
    const [parsedAfterQuiet, hitsAfterQuiet] = await Promise.all([
      metric('probe_agent_exec_sync_commands_total{result="parsed"}'),
      metric('probe_agent_exec_sync_commands_total{result="hit"}'),
    ]);
    client.close();
    const report = `heap ${(heapBefore / 2 ** 20).toFixed(1)} -> peak ${(heapPeak / 2 ** 20).toFixed(1)} -> ${(heapAfter / 2 ** 20).toFixed(1)} MiB; ` +
      `cache ${entries} entries, ${bytes} of ${maxBytes} bytes, ${evictions} evicted, ${namespaces} namespaces (share ${share} bytes, ${atShare} at it); ${parsed} parsed, ${hits} hits; ` +
      `quiet neighbour's call after the flood: ${parsedAfterQuiet - parsed} parsed, ${hitsAfterQuiet - hits} hit`;
    expect(agent.proc.exitCode, report).toBeNull();
    expect(answered, report).toBe(PODS * CONTAINERS * COMMANDS);
    expect(parsed, report).toBeGreaterThanOrEqual(PODS * CONTAINERS * COMMANDS);
    expect(bytes, report).toBeLessThanOrEqual(maxBytes);
    // The commands alone are 3,200 x 16 KiB = 50 MiB; the cache may hold its 4 MiB bound.
    expect(heapAfter - heapBefore, report).toBeLessThan(16 * 2 ** 20);
    expect(neighbourAnswers.length, report).toBeGreaterThan(0);
    expect(neighbourAnswers.filter((c) => c !== 0), report).toEqual([]);
    // The flood overflowed the cache many times over, yet the quiet neighbour's command stayed.
    expect(evictions, report).toBeGreaterThan(PODS * CONTAINERS * COMMANDS / 2);
    expect({ parsed: parsedAfterQuiet - parsed, hits: hitsAfterQuiet - hits }, report).toEqual({ parsed: 0, hits: 1 });
    expect({ namespaces, share, atShare }, report).toEqual({ namespaces: 3, share: Math.floor(maxBytes / 3), atShare: 1 });
  }, 600_000);
});
