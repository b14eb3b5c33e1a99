/**
 * Summarises a V8 .cpuprofile (node --cpu-prof): self time by function, by area (our agent files,
 * each npm package, Node internals, GC) and inclusive time of the agent's own functions, optionally
 * for a time window only (to leave start-up out).
 *
 *   node test/bench/cpuprofile.ts <file.cpuprofile> [--from-seconds S] [--to-seconds S] [--top N]
 *     [--callers NAME [--depth D]]   (who calls the functions whose name contains NAME: self time by
 *                                     their D nearest non-native callers)
 */
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';

interface CallFrame { functionName: string; url: string; lineNumber: number; columnNumber: number }
interface ProfileNode { id: number; callFrame: CallFrame; children?: number[] }
/** The JSON V8 writes. */
export interface CpuProfile { nodes: ProfileNode[]; startTime: number; endTime: number; samples: number[]; timeDeltas: number[] }

/** One row of a summary table. */
export interface ProfileRow {
  name: string;
  ms: number;
  /** Share of the busy (non-idle) time in the window. */
  percent: number;
}

/** The summary. */
export interface ProfileSummary {
  windowSeconds: number;
  samples: number;
  busyMs: number;
  idleMs: number;
  /** Busy time / window: roughly the main thread's CPU share. */
  busyPercentOfWindow: number;
  topSelf: ProfileRow[];
  byArea: ProfileRow[];
  agentFiles: ProfileRow[];
  agentInclusive: ProfileRow[];
}

const REPO_MARKERS = ['/agent/', '/test/'];

/** "agent/probe/http.ts" from a file URL of the repo or of the bench's compiled copy. */
function shortUrl(url: string): string {
  if (url === '') return '';
  const path = url.replace(/^file:\/\//, '');
  const nm = path.lastIndexOf('/node_modules/');
  if (nm >= 0) return path.slice(nm + '/node_modules/'.length);
  for (const marker of REPO_MARKERS) {
    const i = path.lastIndexOf(marker);
    if (i >= 0) return path.slice(i + 1).replace(/\.js$/, '.ts');
  }
  return path;
}

/** Where time went, coarsely: "agent/<dir>", an npm package, "node:<module>", or a V8 pseudo-node. */
function areaOf(frame: CallFrame): string {
  const { url, functionName } = frame;
  if (url === '') return functionName.startsWith('(') ? functionName : '(native)';
  if (url.startsWith('node:')) {
    const p = url.slice(5).split('/');
    return p[0] === 'internal' ? `node:internal/${(p[1] ?? '').replace(/\.js$/, '')}` : `node:${p[0] ?? ''}`;
  }
  const s = shortUrl(url);
  if (url.includes('/node_modules/')) {
    const parts = s.split('/');
    return (parts[0]?.startsWith('@') ? `${parts[0]}/${parts[1]}` : parts[0]) ?? s;
  }
  const parts = s.split('/');
  return parts.length > 2 ? `${parts[0]}/${parts[1]}` : (parts[0] ?? s);
}

function fnName(frame: CallFrame): string {
  const name = frame.functionName || '(anonymous)';
  if (frame.url === '') return name;
  return `${name} ${shortUrl(frame.url)}:${frame.lineNumber + 1}`;
}

function rows(map: Map<string, number>, busyMs: number, top: number): ProfileRow[] {
  return [...map.entries()]
    .sort((a, b) => b[1] - a[1])
    .slice(0, top)
    .map(([name, ms]) => ({ name, ms: Math.round(ms * 10) / 10, percent: Math.round((ms / busyMs) * 1000) / 10 }));
}

/** Summarises `profile` between fromSeconds and toSeconds after its start. */
export function summariseProfile(profile: CpuProfile, opts: { fromSeconds?: number; toSeconds?: number; top?: number } = {}): ProfileSummary {
  const top = opts.top ?? 25;
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  // Sample i lasts until sample i+1: timeDeltas[i+1].
  const times: number[] = [];
  let t = profile.startTime;
  for (const d of profile.timeDeltas) times.push((t += d));
  const from = profile.startTime + (opts.fromSeconds ?? 0) * 1e6;
  const to = opts.toSeconds === undefined ? Infinity : profile.startTime + opts.toSeconds * 1e6;
  const self = new Map<string, number>();
  const area = new Map<string, number>();
  const agentFile = new Map<string, number>();
  const inclusive = new Map<string, number>();
  let busy = 0;
  let idle = 0;
  let count = 0;
  let first = Infinity;
  let last = -Infinity;
  for (let i = 0; i < profile.samples.length; i++) {
    const at = times[i] as number;
    if (at < from || at > to) continue;
    const next = times[i + 1];
    const us = next === undefined ? 0 : next - at;
    const node = byId.get(profile.samples[i] as number);
    if (!node) continue;
    count++;
    first = Math.min(first, at);
    last = Math.max(last, at + us);
    const ms = us / 1000;
    if (node.callFrame.functionName === '(idle)') {
      idle += ms;
      continue;
    }
    busy += ms;
    const key = fnName(node.callFrame);
    self.set(key, (self.get(key) ?? 0) + ms);
    const a = areaOf(node.callFrame);
    area.set(a, (area.get(a) ?? 0) + ms);
    const file = shortUrl(node.callFrame.url);
    if (file.startsWith('agent/')) agentFile.set(file, (agentFile.get(file) ?? 0) + ms);
    // Inclusive: every agent function on the stack, once per sample.
    const seen = new Set<string>();
    for (let id: number | undefined = node.id; id !== undefined; id = parent.get(id)) {
      const f = (byId.get(id) as ProfileNode).callFrame;
      if (!shortUrl(f.url).startsWith('agent/')) continue;
      const k = fnName(f);
      if (seen.has(k)) continue;
      seen.add(k);
      inclusive.set(k, (inclusive.get(k) ?? 0) + ms);
    }
  }
  const windowMs = Math.max(1, (last - first) / 1000);
  return {
    windowSeconds: Math.round(windowMs / 100) / 10,
    samples: count,
    busyMs: Math.round(busy),
    idleMs: Math.round(idle),
    busyPercentOfWindow: Math.round((busy / windowMs) * 1000) / 10,
    topSelf: rows(self, busy, top),
    byArea: rows(area, busy, top),
    agentFiles: rows(agentFile, busy, top),
    agentInclusive: rows(inclusive, busy, top),
  };
}

/** Self time of the functions whose name contains `name`, by the chain of their `depth` nearest callers with a script location. */
export function callersOf(profile: CpuProfile, name: string, opts: { fromSeconds?: number; toSeconds?: number; top?: number; depth?: number } = {}): ProfileRow[] {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const from = profile.startTime + (opts.fromSeconds ?? 0) * 1e6;
  const to = opts.toSeconds === undefined ? Infinity : profile.startTime + opts.toSeconds * 1e6;
  const chains = new Map<string, number>();
  let total = 0;
  let at = profile.startTime;
  for (let i = 0; i < profile.samples.length; i++) {
    at += profile.timeDeltas[i] as number;
    const us = (profile.timeDeltas[i + 1] ?? 0);
    if (at < from || at > to) continue;
    const node = byId.get(profile.samples[i] as number);
    if (!node || !fnName(node.callFrame).includes(name)) continue;
    const chain: string[] = [];
    for (let id = parent.get(node.id); id !== undefined && chain.length < (opts.depth ?? 3); id = parent.get(id)) {
      const f = (byId.get(id) as ProfileNode).callFrame;
      if (f.url !== '') chain.push(fnName(f));
    }
    const key = chain.join(' < ') || '(no script caller)';
    chains.set(key, (chains.get(key) ?? 0) + us / 1000);
    total += us / 1000;
  }
  return rows(chains, Math.max(total, 1e-9), opts.top ?? 25);
}

/** Markdown tables of a summary. */
export function profileMarkdown(s: ProfileSummary): string {
  const table = (title: string, list: ProfileRow[]): string =>
    [`| ${title} | ms | % of busy |`, '|---|---:|---:|', ...list.map((r) => `| \`${r.name.replace(/\|/g, '\\|')}\` | ${r.ms} | ${r.percent} |`)].join('\n');
  return [
    `Window ${s.windowSeconds} s, ${s.samples} samples; main thread busy ${s.busyMs} ms (${s.busyPercentOfWindow} % of the window), idle ${s.idleMs} ms.`,
    '',
    table('self time by area', s.byArea.slice(0, 15)),
    '',
    table('self time by function', s.topSelf),
    '',
    table('self time by agent file', s.agentFiles.slice(0, 15)),
    '',
    table('inclusive time of agent functions', s.agentInclusive.slice(0, 20)),
  ].join('\n');
}

if (import.meta.main) {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      'from-seconds': { type: 'string' },
      'to-seconds': { type: 'string' },
      top: { type: 'string', default: '25' },
      callers: { type: 'string' },
      depth: { type: 'string', default: '3' },
    },
  });
  const file = positionals[0];
  if (!file) {
    process.stderr.write('usage: node test/bench/cpuprofile.ts <file.cpuprofile> [--from-seconds S] [--to-seconds S] [--top N]\n');
    process.exit(2);
  }
  const num = (v: string | undefined): number | undefined => (v === undefined ? undefined : Number(v));
  const profile = JSON.parse(readFileSync(file, 'utf8')) as CpuProfile;
  if (values.callers !== undefined) {
    const list = callersOf(profile, values.callers, { fromSeconds: num(values['from-seconds']), toSeconds: num(values['to-seconds']), top: Number(values.top), depth: Number(values.depth) });
    process.stdout.write(`${['| callers | ms | % of the function |', '|---|---:|---:|', ...list.map((r) => `| \`${r.name.replace(/\|/g, '\\|')}\` | ${r.ms} | ${r.percent} |`)].join('\n')}\n`);
    process.exit(0);
  }
  const summary = summariseProfile(profile, {
    fromSeconds: num(values['from-seconds']),
    toSeconds: num(values['to-seconds']),
    top: Number(values.top),
  });
  process.stdout.write(`${profileMarkdown(summary)}\n`);
}
