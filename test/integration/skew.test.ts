/**
 * Version skew on real parts: the previous release (test/skew/releases.json, built from this
 * repository's history) and this checkout, paired every way the kubelet shim (host service) and
 * the agent (DaemonSet) can meet during an upgrade, and pods rewritten by either release's
 * rewrite. Each shim runs as its own process through its release's CLI, each agent through its
 * release's CLI, all against one real containerd pod whose netns holds a real HTTP/gRPC server.
 * Only public surfaces: the shim's CRI socket (kubelet-shaped ExecSync), the `rewrite` CLI, the
 * ProbeService's Version.
 *
 * The verdicts are kubelet's: exit 0 (success), a non-zero exit with the message (failure), or a
 * gRPC error other than DEADLINE_EXCEEDED (kubelet discards the result). For every call, every
 * supported pair must give the verdict the current shim and agent give; the key ones are also
 * spelled out. The current shim with the previous agent is not supported (the shim calls
 * ProbeService ExecSync, which the previous agent does not serve: upgrade the agent first): it
 * must answer every call UNAVAILABLE saying so, which kubelet discards for probes.
 */
import { requireRoot } from '../support/root.ts';
requireRoot(['ip', 'nft', 'nsenter', 'containerd', 'ctr', 'dpkg-deb', 'git', 'tar', 'make', 'gcc']);

import { execFileSync, spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ORIGINAL_HANDLERS_ANNOTATION } from '../../agent/rewrite/pod-rewrite.ts';
import { encodeShimCommand, type ShimKind } from '../../agent/contract/shim-command.ts';
import { BUSYBOX_IMAGE_REF, importBusyboxImage } from '../lab/busybox-image.ts';
import { createContainerdLab, type ContainerdLab, type LabContainer, type LabSandbox } from '../lab/containerd.ts';
import { SandboxServer } from '../soak/sandbox-server.ts';
import { startAgent, type AgentHandle } from '../support/agent-harness.ts';
import { builtEntry, REPO } from '../support/built-cli.ts';
import { FakeKubelet } from '../support/fake-kubelet.ts';
import { KubeletCri, type CriAnswer } from '../support/kubelet-cri.ts';
import { makePod } from '../support/pod-factory.ts';
import { buildPreviousRelease, type PreviousRelease } from '../support/previous-release.ts';
import { startShimProcess, type ShimProcess } from '../support/shim-process.ts';
import type { ExpectedLog } from '../support/log-check.ts';
import { AGENT_TOO_OLD } from '../../agent/shim/answer.ts';

const NS = 'skew';
const HTTP = 8080;
const GRPC = 9090;
const SECRET = 'skew-s3cret-value';
/** A second server in the pod's netns that records the X-Hook-Token each request carries (the hook's target). */
const HOOK_PORT = 8081;
const HOOK_SECRET = 'skew-hook-s3cret';
/** This checkout's dist/cli.js (set once dist/ is known to be a build of the current sources). */
let CURRENT_CLI: string;

/** What a user writes: named ports, an inline header value, every kind of handler the rewrite turns into the command. */
const MANIFEST = {
  apiVersion: 'v1',
  kind: 'Pod',
  metadata: { name: 'web', namespace: NS },
  spec: {
    containers: [{
      name: 'app',
      image: 'busybox',
      ports: [{ name: 'http', containerPort: HTTP }, { name: 'grpc', containerPort: GRPC }, { name: 'hook', containerPort: HOOK_PORT }],
      readinessProbe: { httpGet: { path: '/echo', port: 'http', httpHeaders: [{ name: 'X-Token', value: SECRET }] }, periodSeconds: 10, timeoutSeconds: 1 },
      livenessProbe: { tcpSocket: { port: 'http' }, periodSeconds: 10, timeoutSeconds: 1 },
      startupProbe: { grpc: { port: GRPC }, periodSeconds: 10, timeoutSeconds: 1 },
      lifecycle: { postStart: { httpGet: { path: '/started', port: 'hook', httpHeaders: [{ name: 'X-Hook-Token', value: HOOK_SECRET }] } }, preStop: { httpGet: { path: '/healthz', port: 'http' } } },
    }],
  },
};

type Verdict = { kind: 'exit'; exitCode: number; stdout: string } | { kind: 'grpc'; code: grpc.status; details: string };
type Release = 'previous' | 'current';
interface Pair { shim: Release; agent: Release; cri: KubeletCri; proc: ShimProcess }
/** The handlers and commands one rewrite made of MANIFEST's container. */
interface Rewritten { pod: Record<string, any>; commands: Record<'readiness' | 'liveness' | 'startup' | 'postStart' | 'preStop', string[]> }

let prev: PreviousRelease;
let ctrd: ContainerdLab;
let kubelet: FakeKubelet;
let scratch: string;
let sandbox: LabSandbox;
let app: LabContainer;
let server: SandboxServer | undefined;
let hookServer: ChildProcessWithoutNullStreams;
/** The X-Hook-Token of every request the hook server got, in order (null: no such header). */
const hookTokens: (string | null)[] = [];
const agents = new Map<Release, AgentHandle>();
const pairs: Pair[] = [];
let byPrevious: Rewritten;
let byCurrent: Rewritten;

function rewriteWith(cli: string): Rewritten {
  const file = path.join(scratch, 'pod.json');
  writeFileSync(file, JSON.stringify(MANIFEST));
  const out = execFileSync(process.execPath, [cli, 'rewrite', '-f', file, '--output', 'json'], { encoding: 'utf8' });
  const pod = JSON.parse(out) as Record<string, any>;
  const c = pod.spec.containers[0];
  return {
    pod,
    commands: {
      readiness: c.readinessProbe.exec.command,
      liveness: c.livenessProbe.exec.command,
      startup: c.startupProbe.exec.command,
      postStart: c.lifecycle.postStart.exec.command,
      preStop: c.lifecycle.preStop.exec.command,
    },
  };
}

/** The handler a rewritten command carries (the v1 form: base64url JSON in the third argument). */
function handlerOf(cmd: string[]): Record<string, any> {
  return JSON.parse(Buffer.from(cmd[2]!, 'base64url').toString('utf8')) as Record<string, any>;
}


/** The hook's target: answers 200 to anything and records the request's X-Hook-Token (kubelet ignores a hook's HTTP status). */
async function startHookServer(sb: LabSandbox): Promise<ChildProcessWithoutNullStreams> {
  const code = `require('http').createServer((q, s) => {
    console.log('token=' + JSON.stringify(q.headers['x-hook-token'] ?? null));
    s.end('ok');
  }).listen(${HOOK_PORT}, '::', () => console.log('ready'))`;
  const child = spawn('nsenter', [`--net=${sb.netnsPath}`, '--', process.execPath, '-e', code]);
  child.stdin.on('error', () => {});
  await new Promise<void>((resolve, reject) => {
    const t = setTimeout(() => reject(new Error('hook server did not start')), 15_000);
    createInterface({ input: child.stdout }).on('line', (l) => {
      if (l === 'ready') {
        clearTimeout(t);
        resolve();
      } else if (l.startsWith('token=')) {
        hookTokens.push(JSON.parse(l.slice(6)) as string | null);
      }
    });
  });
  return child;
}

/** The X-Token values /echo saw, from a success's message (the agent shows the body). */
function echoedTokens(v: Verdict): string[] {
  if (v.kind !== 'exit') throw new Error(`expected an exit, got gRPC ${grpc.status[v.code]}: ${v.details}`);
  const m = /\{"method".*?"rawHeaders":(\[.*?\])/.exec(v.stdout);
  if (!m) throw new Error(`no /echo body in: ${v.stdout}`);
  const raw = JSON.parse(m[1]!) as string[];
  return raw.flatMap((x, i) => (i % 2 === 0 && x.toLowerCase() === 'x-token' ? [raw[i + 1]!] : []));
}

/** Flags each release's shim takes (the previous one has no --metrics-socket; '' keeps the current one off /run). */
function shimFlags(release: Release, probeSocket: string): string[] {
  const common = [`--runtime-endpoint=${ctrd.endpoint}`, `--probe-socket=${probeSocket}`, '--agent-grace=2s', '--hook-agent-wait=2s'];
  return release === 'current' ? [...common, '--metrics-socket='] : common;
}

function verdictOf(a: CriAnswer<{ stdout: Buffer; exitCode: number }>): Verdict {
  return a.ok ? { kind: 'exit', exitCode: a.msg.exitCode, stdout: a.msg.stdout.toString() } : { kind: 'grpc', code: a.code, details: a.details };
}

/** kubelet's call for `cmd`: a probe with timeout 1 s, a hook with timeout 0. */
async function call(p: Pair, cmd: string[], containerId = app.id): Promise<Verdict> {
  const isHook = cmd[1] === 'postStart' || cmd[1] === 'preStop';
  return verdictOf(await p.cri.execSync(containerId, cmd, isHook ? 0 : 1));
}

function label(p: Pair): string {
  return `${p.shim} shim + ${p.agent} agent`;
}

/** The verdict with what may differ between releases' wording left out: the code or exit, and for failures whether a message came. */
function shape(v: Verdict): string {
  return v.kind === 'exit' ? `exit ${v.exitCode === 0 ? 0 : 'non-zero'}${v.exitCode !== 0 && v.stdout.length > 0 ? ' with a message' : ''}` : `gRPC ${grpc.status[v.code]}`;
}

/**
 * What the error cases below provoke through every pair on purpose ("failures and errors keep their
 * meaning", an unknown container, a header value the annotation contradicts): the agents record the
 * probe of a port name the container lacks as errored, and the shims say they could not answer.
 */
const SKEW_AGENT_LOGS: ExpectedLog[] = [
  { level: 'warn', msg: 'probe errored; result kept', line: /"reason":"port-unresolved","message":"port \\"no-such-port\\" not found"/, why: 'a probe of a port name the container lacks, on purpose' },
];
const SKEW_SHIM_LOGS: ExpectedLog[] = [
  { level: 'warn', msg: 'rewritten handler not run', line: /no-such-port|70000|is not known on this node|X-Token/, why: 'the error cases: a missing port name, a port out of range, an unknown container, a contradicted header value' },
  { level: 'warn', msg: AGENT_TOO_OLD, why: 'the current shim with the previous agent (an unsupported order), on purpose' },
];

/** The pairs an upgrade may hold: every one but the current shim with the previous agent (the agent goes first). */
function supported(): Pair[] {
  return pairs.filter((p) => !(p.shim === 'current' && p.agent === 'previous'));
}

function pair(shim: Release, agent: Release): Pair {
  const p = pairs.find((x) => x.shim === shim && x.agent === agent);
  if (!p) throw new Error(`no ${shim} shim + ${agent} agent pair`);
  return p;
}

beforeAll(async () => {
  CURRENT_CLI = builtEntry('cli.js');
  prev = buildPreviousRelease();
  ctrd = await createContainerdLab();
  importBusyboxImage(ctrd.socket);
  scratch = mkdtempSync(path.join(ctrd.dir, 'skew-'));
  byPrevious = rewriteWith(prev.cli);
  byCurrent = rewriteWith(CURRENT_CLI);
  // kubelet copies the pod's annotations onto the CRI sandbox: here those of the current rewrite,
  // whose original-handlers record holds the header values its commands leave out.
  sandbox = await ctrd.runSandbox({ name: 'web', namespace: NS, annotations: { [ORIGINAL_HANDLERS_ANNOTATION]: byCurrent.pod.metadata.annotations[ORIGINAL_HANDLERS_ANNOTATION] } });
  app = await ctrd.runContainer(sandbox, { name: 'app', image: BUSYBOX_IMAGE_REF, command: ['/bin/sleep', 'infinity'] });
  server = await SandboxServer.start(sandbox, { http: HTTP, grpc: GRPC });
  hookServer = await startHookServer(sandbox);
  // The pod as kubelet lists it: rewritten by the previous release's webhook (what a node holds
  // when its shim and agent are upgraded), its container ID the real one.
  const listed = makePod({ uid: sandbox.uid, name: 'web', namespace: NS, ips: sandbox.ips, probe: 'none', port: HTTP, containerID: `containerd://${app.id}` }) as Record<string, any>;
  Object.assign(listed.spec.containers[0], byPrevious.pod.spec.containers[0], { image: BUSYBOX_IMAGE_REF });
  Object.assign(listed.metadata.annotations, byPrevious.pod.metadata.annotations);
  kubelet = await FakeKubelet.start({ pods: [listed] });

  for (const release of ['current', 'previous'] as const) {
    agents.set(release, await startAgent({
      kubeletUrl: kubelet.httpUrl,
      resolvers: 'cri',
      args: [`--cri-endpoint=${ctrd.endpoint}`, `--netns-dir=${ctrd.netnsDir}`],
      expectedLogs: SKEW_AGENT_LOGS,
      ...(release === 'previous' ? { cli: prev.cli } : {}),
    }));
  }
  for (const shim of ['current', 'previous'] as const) {
    for (const agent of ['current', 'previous'] as const) {
      const listen = path.join(scratch, `${shim}-shim-${agent}-agent.sock`);
      const proc = await startShimProcess(shim === 'current' ? CURRENT_CLI : prev.cli, listen, shimFlags(shim, agents.get(agent)!.socket), undefined, SKEW_SHIM_LOGS);
      pairs.push({ shim, agent, proc, cri: new KubeletCri(listen) });
    }
  }
}, 180_000);

afterAll(async () => {
  for (const p of pairs) {
    p.cri.close();
    await p.proc.stop();
  }
  for (const a of agents.values()) await a.stop('SIGKILL').catch(() => {});
  await kubelet?.stop();
  await server?.stop();
  hookServer?.kill('SIGKILL');
  await ctrd?.destroy();
  prev?.remove();
});

describe('the contracts both releases speak', () => {
  it('the previous build is the recorded release, and it is a different tree from this one', () => {
    expect(prev.commit).toMatch(/^[0-9a-f]{40}$/);
    const head = execFileSync('git', ['-C', REPO, 'rev-parse', 'HEAD'], { encoding: 'utf8' }).trim();
    expect(head).not.toBe(prev.commit);
  });

  it('both agents serve the ProbeService API version the shims check', async () => {
    for (const a of agents.values()) expect((await a.client.version(5000)).apiVersion).toBe('v1alpha1');
  });

  it('both rewrites write the v1 command; a handler with no named port and no header is encoded identically', () => {
    for (const r of [byPrevious, byCurrent]) {
      for (const cmd of Object.values(r.commands)) {
        expect(cmd.slice(0, 2)).toEqual(['/.probe-agent/v1', expect.stringMatching(/^(readiness|liveness|startup|postStart|preStop)$/)]);
        expect(cmd).toHaveLength(3);
      }
    }
    expect(byCurrent.commands.startup).toEqual(byPrevious.commands.startup);
  });

  it('what differs: the previous rewrite keeps named ports and inline header values, the current one resolves ports and moves values out', () => {
    expect(handlerOf(byPrevious.commands.liveness)).toEqual({ tcpSocket: { port: 'http' } });
    expect(handlerOf(byCurrent.commands.liveness)).toEqual({ tcpSocket: { port: HTTP } });
    expect(handlerOf(byPrevious.commands.readiness).httpGet.httpHeaders).toEqual([{ name: 'X-Token', value: SECRET }]);
    expect(handlerOf(byCurrent.commands.readiness).httpGet.httpHeaders).toEqual([{ name: 'X-Token', valueFrom: 'annotation' }]);
    expect(handlerOf(byPrevious.commands.postStart).httpGet.httpHeaders).toEqual([{ name: 'X-Hook-Token', value: HOOK_SECRET }]);
    expect(handlerOf(byCurrent.commands.postStart).httpGet.httpHeaders).toEqual([{ name: 'X-Hook-Token', valueFrom: 'annotation' }]);
    for (const cmd of Object.values(byCurrent.commands)) expect(cmd.join(' ')).not.toMatch(/s3cret/);
  });
});

describe('the current shim with the previous agent (an unsupported upgrade order)', () => {
  it('answers every probe and hook UNAVAILABLE, saying to upgrade the agent first: kubelet discards the probes, nothing reaches the pod', async () => {
    const p = pair('current', 'previous');
    const before = hookTokens.length;
    for (const kind of ['readiness', 'liveness', 'startup', 'postStart'] as const) {
      expect(await call(p, byPrevious.commands[kind]), kind).toEqual({ kind: 'grpc', code: grpc.status.UNAVAILABLE, details: AGENT_TOO_OLD });
    }
    expect(await call(p, byCurrent.commands.postStart)).toEqual({ kind: 'grpc', code: grpc.status.UNAVAILABLE, details: AGENT_TOO_OLD });
    expect(hookTokens.length).toBe(before);
  }, 30_000);
});

describe('pods rewritten by the previous release, through every shim/agent pair', () => {
  it('every pair gives kubelet success for the rewritten readiness (inline header sent), liveness (named port), startup (gRPC) and hooks', async () => {
    for (const p of supported()) {
      const ready = await call(p, byPrevious.commands.readiness);
      expect(ready, label(p)).toMatchObject({ kind: 'exit', exitCode: 0 });
      // /echo answers with the request's headers: the inline value reached the pod.
      expect((ready as { stdout: string }).stdout, label(p)).toContain(SECRET);
      for (const kind of ['liveness', 'startup', 'postStart', 'preStop'] as const) {
        expect(await call(p, byPrevious.commands[kind]), `${label(p)}: ${kind}`).toMatchObject({ kind: 'exit', exitCode: 0 });
      }
    }
  });
});

describe('the ProbeService across releases', () => {
  it('each release\'s `probe-agent status` reads the other release\'s agent, which recorded what kubelet ran through the shims', async () => {
    for (const [cli, release] of [[CURRENT_CLI, 'previous'], [prev.cli, 'current']] as const) {
      const agent = agents.get(release)!;
      // kubelet's readiness call through the previous shim (the one every agent serves), recorded by this agent (on-demand mode).
      expect(await call(pair('previous', release), byPrevious.commands.readiness)).toMatchObject({ kind: 'exit', exitCode: 0 });
      const out = execFileSync(process.execPath, [cli, 'status', `--socket=${agent.socket}`, '--namespace', NS, '--output', 'json'], { encoding: 'utf8' });
      const statuses = (JSON.parse(out) as { statuses: { pod: string; probeType: string; result: string }[] }).statuses;
      expect(statuses.find((x) => x.pod === 'web' && x.probeType === 'Readiness'), cli).toMatchObject({ result: 'success' });
    }
  });
});

describe('failures and errors keep their meaning across the skew', () => {
  const cases: [string, ShimKind, Record<string, unknown>, string][] = [
    ['HTTP 500 (liveness)', 'liveness', { httpGet: { path: '/status/500', port: 'http' } }, 'exit non-zero with a message'],
    ['TCP refused (readiness)', 'readiness', { tcpSocket: { port: 1 } }, 'exit non-zero with a message'],
    ['gRPC on a port nothing serves (liveness)', 'liveness', { grpc: { port: 2 } }, 'exit non-zero with a message'],
    ['gRPC health of a service the server does not know (readiness)', 'readiness', { grpc: { port: GRPC, service: 'no-such-service' } }, 'exit non-zero with a message'],
    ['HTTP hook refused (postStart)', 'postStart', { httpGet: { path: '/', port: 1 } }, 'exit non-zero with a message'],
    ['a tcpSocket hook, which kubelet does not run (preStop)', 'preStop', { tcpSocket: { port: 'http' } }, 'exit non-zero with a message'],
    ['a port name the container lacks (readiness)', 'readiness', { httpGet: { path: '/', port: 'no-such-port' } }, 'gRPC UNAVAILABLE'],
    ['a port out of range (liveness)', 'liveness', { tcpSocket: { port: 70000 } }, 'gRPC INVALID_ARGUMENT'],
  ];

  it.each(cases)('%s: every pair gives the current pair\'s verdict', async (_name, kind, handler, expected) => {
    const cmd = encodeShimCommand(kind, handler);
    const baseline = await call(pair('current', 'current'), cmd);
    expect(shape(baseline)).toBe(expected);
    for (const p of supported()) {
      const v = await call(p, cmd);
      expect(shape(v), label(p)).toBe(shape(baseline));
      // kubelet shows a failure's message in the pod's events: the same words whichever pair ran it.
      if (v.kind === 'exit' && v.exitCode !== 0 && baseline.kind === 'exit') expect(v.stdout, label(p)).toBe(baseline.stdout);
    }
  });

  it('an unknown container: a discarded probe (NOT_FOUND) from every pair, for probes and hooks', async () => {
    for (const p of supported()) {
      for (const cmd of [byPrevious.commands.readiness, byPrevious.commands.preStop]) {
        const v = await call(p, cmd, 'a'.repeat(64));
        expect(v, label(p)).toMatchObject({ kind: 'grpc', code: grpc.status.NOT_FOUND });
      }
    }
  });
});

describe('pods rewritten by the current release (webhook upgraded) through each pair', () => {
  it('resolved ports (liveness tcp, a hook without headers) and an untouched gRPC handler: success from every pair, the previous agent included', async () => {
    for (const p of supported()) {
      for (const kind of ['liveness', 'startup', 'preStop'] as const) {
        expect(await call(p, byCurrent.commands[kind]), `${label(p)}: ${kind}`).toMatchObject({ kind: 'exit', exitCode: 0 });
      }
    }
  });
});

/**
 * The current rewrite leaves header values out of the command (`valueFrom: annotation`, field 100
 * on the wire); the value is in the sandbox's original-handlers annotation, which only the current
 * agent reads, and only when the current shim passes field 100 on. What each pair does with such
 * a readiness probe (target /echo, which answers with the headers it got) and postStart hook
 * (target the hook server, which records X-Hook-Token; kubelet ignores a hook's HTTP status).
 */
describe('header values a current rewrite moved to the annotation (webhook upgraded) through each pair', () => {
  /** The hook server's records made by one call. */
  async function hookTokensOf(p: Pair): Promise<{ verdict: Verdict; tokens: (string | null)[] }> {
    const before = hookTokens.length;
    const verdict = await call(p, byCurrent.commands.postStart);
    // The server's stdout line may trail the answer by a moment.
    for (let i = 0; i < 50 && verdict.kind === 'exit' && hookTokens.length === before; i++) await new Promise((r) => setTimeout(r, 20));
    return { verdict, tokens: hookTokens.slice(before) };
  }

  it('current shim + current agent: the value reaches the pod, for the probe and the hook', async () => {
    const p = pair('current', 'current');
    const ready = await call(p, byCurrent.commands.readiness);
    expect(ready).toMatchObject({ kind: 'exit', exitCode: 0 });
    expect(echoedTokens(ready)).toEqual([SECRET]);
    const hook = await hookTokensOf(p);
    expect(hook.verdict).toMatchObject({ kind: 'exit', exitCode: 0 });
    expect(hook.tokens).toEqual([HOOK_SECRET]);
  });


  it('previous shim + previous agent: the previous shim drops valueFrom; the header goes out EMPTY', async () => {
    const p = pair('previous', 'previous');
    const ready = await call(p, byCurrent.commands.readiness);
    expect(ready).toMatchObject({ kind: 'exit', exitCode: 0 });
    expect(echoedTokens(ready)).toEqual(['']);
    const hook = await hookTokensOf(p);
    expect(hook.verdict).toMatchObject({ kind: 'exit', exitCode: 0 });
    expect(hook.tokens).toEqual(['']);
  });

  it('previous shim + current agent: the previous shim drops valueFrom, the current agent sees an empty value the annotation contradicts and refuses (INVALID_ARGUMENT), sending nothing', async () => {
    const p = pair('previous', 'current');
    const ready = await call(p, byCurrent.commands.readiness);
    expect(ready).toMatchObject({ kind: 'grpc', code: grpc.status.INVALID_ARGUMENT });
    expect((ready as { details: string }).details).toMatch(/X-Token.*empty.*upgrade the shim/);
    const hook = await hookTokensOf(p);
    expect(hook.verdict).toMatchObject({ kind: 'grpc', code: grpc.status.INVALID_ARGUMENT });
    expect(hook.tokens).toEqual([]);
  });

  it('an empty value the annotation also records empty is sent as written by the current agent (an older rewrite\'s inline empty value)', async () => {
    // The record holds X-Token=SECRET for readiness; liveness has no record entry: nothing contradicts the empty value.
    const cmd = encodeShimCommand('liveness', { httpGet: { path: '/echo', port: HTTP, httpHeaders: [{ name: 'X-Token', value: '' }] } });
    for (const shim of ['previous', 'current'] as const) {
      const v = await call(pair(shim, 'current'), cmd);
      expect(v, shim).toMatchObject({ kind: 'exit', exitCode: 0 });
      expect(echoedTokens(v)).toEqual(['']);
    }
  });
});
