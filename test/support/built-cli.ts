/**
 * The built agent (dist/, what bin/probe-agent runs), for tests and drivers that run it as users
 * do. The only way to its paths: each accessor first checks that dist/ is a finished build of the
 * current sources and fails loudly otherwise, so no caller can forget the check or check too little.
 *
 * What dist/ is built from (the Makefile's dist/.built rule): every .ts under agent/, at any depth,
 * and tsconfig.json. proto/ is not among them: the built code loads proto/... from the checkout at
 * run time (agent/api/proto.ts, agent/netns/cri-client.ts), so a changed .proto needs no rebuild.
 */
import { existsSync, readdirSync, statSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const REPO = fileURLToPath(new URL('../..', import.meta.url)).replace(/\/$/, '');

function* tsSources(dir: string): Generator<string> {
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, entry.name);
    if (entry.isDirectory()) yield* tsSources(p);
    else if (entry.isFile() && p.endsWith('.ts') && !p.endsWith('.d.ts')) yield p;
  }
}

/**
 * What makes dist/ stale, one line each (empty when it is a build of the current sources): no
 * finished build, or a source under agent/ (recursively) or tsconfig.json newer than that build,
 * or a source with no .js in dist/.
 */
export function staleBuild(repo = REPO): string[] {
  // The Makefile touches dist/.built once tsc has written all of dist/ (it empties dist/ first).
  const stamp = path.join(repo, 'dist/.built');
  if (!existsSync(stamp)) return [`${path.relative(repo, stamp)} is missing (no finished \`make build\`)`];
  const builtAt = statSync(stamp).mtimeMs;
  const stale: string[] = [];
  const inputs = [...tsSources(path.join(repo, 'agent')), path.join(repo, 'tsconfig.json')];
  for (const src of inputs) {
    const rel = path.relative(repo, src);
    if (statSync(src).mtimeMs > builtAt) stale.push(`${rel} is newer than the build`);
    if (!rel.startsWith('agent/')) continue;
    const built = path.join(repo, 'dist', path.relative(path.join(repo, 'agent'), src)).replace(/\.ts$/, '.js');
    if (!existsSync(built)) stale.push(`${path.relative(repo, built)} (from ${rel}) is missing`);
  }
  return stale;
}

/** Throws unless dist/ is a finished build of every .ts under agent/ (any depth) and tsconfig.json. */
export function requireBuiltCli(): void {
  const stale = staleBuild();
  if (stale.length > 0) {
    const shown = stale.slice(0, 5).join('; ') + (stale.length > 5 ? `; and ${stale.length - 5} more` : '');
    throw new Error(`dist/ is not a build of the current sources (${shown}): run \`make build\` first`);
  }
}

/** bin/probe-agent (runs dist/cli.js), after requireBuiltCli(). */
export function builtCli(): string {
  requireBuiltCli();
  return path.join(REPO, 'bin/probe-agent');
}

/** A built entry point, `node <it> ...`: dist/cli.js or dist/shim/main.js, after requireBuiltCli(). */
export function builtEntry(entry: 'cli.js' | 'shim/main.js'): string {
  requireBuiltCli();
  return path.join(REPO, 'dist', entry);
}

/** The built tree as a whole (dist/, e.g. for the shim installer's SHIM_SRC), after requireBuiltCli(). */
export function builtRepo(): string {
  requireBuiltCli();
  return REPO;
}
