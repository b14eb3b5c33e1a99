/**
 * Where the daemon allocates at a scale point, and what of it stays: V8's sampling heap profiler
 * driven over the inspector protocol (the daemon started with --inspect on loopback), so nothing
 * in the agent changes. Three profiles, one steady window each:
 *   - every allocation, collected or not: what the young generation churns through;
 *   - what the scavenger did not collect (dead or alive in the old generation by the end, plus the
 *     young objects of the last moments): what reaches the old generation, which only a full GC frees;
 *   - what is still live at the end, after a full GC: what is retained.
 * Each is summed by allocating function (self) and by agent function on the stack (inclusive).
 *
 *   BENCH_PROFILE_PODS=250 BENCH_PROFILE_PERIOD=10 BENCH_PROFILE_SECONDS=30 node test/bench/heap-profile.ts
 *   (BENCH_HEAP_CALLERS=delete: also who calls the allocating functions whose name starts with "delete")
 */
import { startAgent } from './agent-process.ts';
import { freePort } from './blackbox.ts';
import { buildForBench } from './build.ts';
import { waitResolved } from './scale.ts';
import { createScaleEnv } from './scale-env.ts';

interface SamplingNode {
  callFrame: { functionName: string; url: string; lineNumber: number };
  selfSize: number;
  children: SamplingNode[];
}

/** One CDP session over the inspector's WebSocket. */
async function inspector(port: number): Promise<{ call(method: string, params?: object): Promise<unknown>; close(): void }> {
  const list = (await (await fetch(`http://127.0.0.1:${port}/json/list`)).json()) as { webSocketDebuggerUrl: string }[];
  const ws = new WebSocket(list[0]!.webSocketDebuggerUrl);
  await new Promise((resolve, reject) => {
    ws.onopen = resolve;
    ws.onerror = reject;
  });
  let id = 0;
  const waiting = new Map<number, (v: unknown) => void>();
  ws.onmessage = (ev) => {
    const m = JSON.parse(String(ev.data)) as { id?: number; result?: unknown; error?: unknown };
    if (m.id !== undefined) waiting.get(m.id)?.(m.error ? Promise.reject(new Error(JSON.stringify(m.error))) : m.result);
  };
  return {
    call: (method, params = {}) => new Promise((resolve) => {
      const n = ++id;
      waiting.set(n, resolve);
      ws.send(JSON.stringify({ id: n, method, params }));
    }),
    close: () => ws.close(),
  };
}

const frameName = (f: SamplingNode['callFrame']): string =>
  `${f.functionName || '(anonymous)'} ${f.url.replace(/^.*?\/(agent|node_modules)\//, '$1/').replace(/^file:\/\//, '')}:${f.lineNumber + 1}`;

/** Self bytes by allocating function and inclusive bytes by agent function. */
function summarise(root: SamplingNode, top: number): string {
  const self = new Map<string, number>();
  const incl = new Map<string, number>();
  let total = 0;
  const walk = (n: SamplingNode, stack: string[]): void => {
    const name = frameName(n.callFrame);
    const here = [...stack, name];
    if (n.selfSize > 0) {
      total += n.selfSize;
      self.set(name, (self.get(name) ?? 0) + n.selfSize);
      for (const s of new Set(here.filter((x) => x.includes('agent/')))) incl.set(s, (incl.get(s) ?? 0) + n.selfSize);
    }
    for (const c of n.children) walk(c, here);
  };
  walk(root, []);
  // BENCH_HEAP_CALLERS=name: the allocations of functions whose name starts with it, by their three callers.
  const want = process.env.BENCH_HEAP_CALLERS;
  const callers = new Map<string, number>();
  const walkCallers = (n: SamplingNode, stack: string[]): void => {
    const name = frameName(n.callFrame);
    if (want && n.selfSize > 0 && name.startsWith(want)) {
      const k = [name, ...stack.slice(-3).reverse()].join(' < ');
      callers.set(k, (callers.get(k) ?? 0) + n.selfSize);
    }
    for (const c of n.children) walkCallers(c, [...stack, name]);
  };
  if (want) walkCallers(root, []);
  const rows = (m: Map<string, number>): string => [...m].sort((a, b) => b[1] - a[1]).slice(0, top)
    .map(([k, v]) => `${(v / 1024).toFixed(0).padStart(8)} KiB ${((100 * v) / total).toFixed(1).padStart(5)} %  ${k}`).join('\n');
  const byCaller = want ? `\n-- ${want} by caller --\n${rows(callers)}` : '';
  return `total ${(total / 2 ** 20).toFixed(1)} MiB\n-- self --\n${rows(self)}\n-- inclusive, agent functions --\n${rows(incl)}${byCaller}`;
}

const pods = Number(process.env.BENCH_PROFILE_PODS ?? 250);
const period = Number(process.env.BENCH_PROFILE_PERIOD ?? 10);
const seconds = Number(process.env.BENCH_PROFILE_SECONDS ?? 30);
const top = Number(process.env.BENCH_PROFILE_TOP ?? 40);
const build = await buildForBench({ fromSource: process.env.BENCH_TS === '1' });
const env = await createScaleEnv(Math.max(1, pods), 'procfs', (l) => process.stderr.write(`${l}\n`));
try {
  env.kubelet.setPods(env.podList(pods, period));
  const port = await freePort();
  const agent = await startAgent({ cli: build.cli, kubeletUrl: env.kubelet.httpUrl, resolver: env.resolver, dir: env.dir, nodeFlags: [`--inspect=127.0.0.1:${port}`] });
  try {
    await waitResolved(agent, pods, 180_000);
    await new Promise((r) => setTimeout(r, period * 1000 + 1000));
    const cdp = await inspector(port);
    const modes = [
      { label: 'allocated (collected or not)', major: true, minor: true },
      { label: 'not collected by the scavenger (promoted)', major: true, minor: false },
      { label: 'live at the end', major: false, minor: false },
    ];
    for (const m of modes) {
      await cdp.call('HeapProfiler.collectGarbage');
      await cdp.call('HeapProfiler.startSampling', { samplingInterval: 1024, includeObjectsCollectedByMajorGC: m.major, includeObjectsCollectedByMinorGC: m.minor });
      await new Promise((r) => setTimeout(r, seconds * 1000));
      if (!m.major) await cdp.call('HeapProfiler.collectGarbage');
      const { profile } = (await cdp.call('HeapProfiler.stopSampling')) as { profile: { head: SamplingNode } };
      process.stdout.write(`== ${pods} pods x 3 @${period}s, ${seconds} s: ${m.label}\n${summarise(profile.head, top)}\n\n`);
    }
    cdp.close();
  } finally {
    await agent.stop();
  }
} finally {
  await env.destroy();
  build.cleanup();
}
