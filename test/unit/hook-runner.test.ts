/**
 * runHookOnce (agent/shim/hook-runner.ts): a hook the agent never saw is sent again until the agent
 * takes it or the wait runs out; the shim's real ShimProbeClient against a socket where the agent's
 * real API server is (or is not yet) listening.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { AgentCallError, ShimProbeClient } from '../../agent/shim/agent-client.ts';
import { encodeFrame } from '../../agent/grpc/frame.ts';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { encodeShimCommand } from '../../agent/contract/shim-command.ts';
import { runHookOnce } from '../../agent/shim/hook-runner.ts';
import { LabProber, startApiFixture, type ApiFixture } from '../support/api-harness.ts';
import { execSyncRequest } from '../support/relay-harness.ts';

const CID = 'c3'.repeat(32);
const body = encodeFrame(execSyncRequest(CID, encodeShimCommand('postStart', { httpGet: { path: '/', port: 8080 } }), 0));
const policy = { agentWaitMs: 60_000, retryMs: 100, lastResortMs: 30_000 };

let dir: string | undefined;
let fx: ApiFixture | undefined;
let client: ShimProbeClient | undefined;
afterEach(async () => {
  client?.close();
  await fx?.close();
  if (dir) rmSync(dir, { recursive: true, force: true });
  client = fx = dir = undefined;
});

function setup(): string {
  dir = mkdtempSync(path.join(tmpdir(), 'hook-runner-'));
  const socket = path.join(dir, 'run', 'probe.sock');
  client = new ShimProbeClient(socket);
  return socket;
}
const startAgent = async (): Promise<ApiFixture> => (fx = await startApiFixture({ prober: new LabProber({ pods: [], sockets: new NodeSocketFactory() }), dir }));

describe('runHookOnce', () => {
  it('no agent for the whole wait: gives up with the not-started error', async () => {
    setup();
    const r = await runHookOnce(client!, body, { ...policy, agentWaitMs: 1000 }, new AbortController().signal);
    expect(r.wait).toBe('gave_up');
    expect(r.error).toBeInstanceOf(AgentCallError);
    expect(r.error?.notStarted).toBe(true);
  }, 60_000);

  it('an agent that comes up during the wait takes the hook: "ran", with its answer', async () => {
    setup();
    const p = runHookOnce(client!, body, policy, new AbortController().signal);
    await new Promise((r) => setTimeout(r, 700));
    await startAgent();
    const r = await p;
    expect(r.wait).toBe('ran');
    // This agent has no hook runner: what matters is that the agent answered, once.
    expect(r.answer !== undefined || r.error?.notStarted === false).toBe(true);
  }, 60_000);

  it('an agent already there: no wait at all', async () => {
    setup();
    await startAgent();
    const r = await runHookOnce(client!, body, policy, new AbortController().signal);
    expect(r.wait).toBeUndefined();
  }, 60_000);

  it("kubelet's cancellation during the wait gives the hook up, never reported as taken", async () => {
    setup();
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 500);
    const r = await runHookOnce(client!, body, policy, ac.signal);
    expect(r.wait).toBe('gave_up');
    expect(r.error?.notStarted).toBe(true);
    expect(r.error?.failure).toBe('unreachable');
  }, 60_000);
});
