/**
 * Compiles what the bench runs as "the agent" (agent/cli.ts and the side-by-side driver) with the
 * project's tsconfig into a private temp dir, so the daemon and the drivers run the same JS that
 * bin/probe-agent runs. Node's type stripping would otherwise add its compiler's memory (20-50 MB
 * of RSS) and start-up CPU to every measurement. The dir mirrors the repo layout, with symlinks to
 * node_modules, proto/, netns-helper/ and package.json, so module-relative paths keep working.
 */
import { execFile, execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The repository root. */
export const REPO = fileURLToPath(new URL('../..', import.meta.url)).replace(/\/$/, '');

/** Entry points to run, compiled or (BENCH_TS=1 / compile failure) from source. */
export interface BenchBuild {
  /** `node <cli> run ...` starts the daemon. */
  cli: string;
  /** `node <driver> '<json>'` runs one side-by-side measurement. */
  driver: string;
  /** The checkout it was built from: its launcher's node flags and its DaemonSet's env are the daemon's (agent-process.ts). */
  root: string;
  compiled: boolean;
  /** Why the source is used, when it is. */
  note?: string;
  cleanup(): void;
}

function fromSource(note: string): BenchBuild {
  return { cli: join(REPO, 'agent/cli.ts'), driver: join(REPO, 'test/bench/driver.ts'), root: REPO, compiled: false, note, cleanup: () => {} };
}

/**
 * Compiles into a temp dir; falls back to running the TypeScript sources when that fails. `root`:
 * another checkout to compile (buildRevision), which has no source fallback.
 */
export async function buildForBench(opts: { fromSource?: boolean; root?: string } = {}): Promise<BenchBuild> {
  if (opts.fromSource) return fromSource('BENCH_TS=1: running the TypeScript sources (type stripping adds RSS)');
  const root = opts.root ?? REPO;
  const dir = mkdtempSync(join(tmpdir(), 'probe-agent-bench-build-'));
  const out = join(dir, 'out');
  const cleanup = (): void => rmSync(dir, { recursive: true, force: true });
  writeFileSync(join(dir, 'tsconfig.json'), JSON.stringify({
    extends: join(root, 'tsconfig.json'),
    compilerOptions: { rootDir: root, outDir: out, sourceMap: false, noEmitOnError: false, typeRoots: [join(REPO, 'node_modules/@types')] },
    include: [],
    files: [join(root, 'agent/cli.ts'), join(root, 'test/bench/driver.ts')],
  }));
  const tsc = join(REPO, 'node_modules/typescript/bin/tsc');
  const diagnostics = await new Promise<string>((resolve) => {
    execFile(process.execPath, [tsc, '-p', join(dir, 'tsconfig.json')], { maxBuffer: 16 * 1024 * 1024 }, (_err, stdout, stderr) => resolve(`${stdout}${stderr}`.trim()));
  });
  const cli = join(out, 'agent/cli.js');
  const driver = join(out, 'test/bench/driver.js');
  if (!existsSync(cli) || !existsSync(driver)) {
    cleanup();
    if (opts.root) throw new Error(`tsc produced no output for ${opts.root}: ${diagnostics.split('\n')[0] ?? 'no message'}`);
    return fromSource(`tsc produced no output (${diagnostics.split('\n')[0] ?? 'no message'}): running the TypeScript sources`);
  }
  for (const link of ['proto', 'netns-helper', 'package.json']) symlinkSync(join(root, link), join(out, link));
  symlinkSync(join(REPO, 'node_modules'), join(out, 'node_modules'));
  const build: BenchBuild = { cli, driver, root, compiled: true, cleanup };
  // Type errors still emit JS; other work in progress must not stop the bench, but it is reported.
  if (diagnostics) build.note = `tsc reported: ${diagnostics.split('\n').slice(0, 3).join(' | ')}`;
  return build;
}

/**
 * Another revision's agent and driver, compiled as buildForBench does, with that revision's own
 * helper built from its source (its protocol may differ): `git archive <rev>` into
 * build/bench-revs/<label>, this tree's node_modules. For before/after ratios in one run.
 */
export async function buildRevision(label: string, rev: string): Promise<BenchBuild> {
  if (!/^[A-Za-z0-9_.-]+$/.test(label)) throw new Error(`revision label ${JSON.stringify(label)}: letters, digits, _ . - only`);
  const root = join(REPO, 'build/bench-revs', label);
  const commit = execFileSync('git', ['-C', REPO, 'rev-parse', '--verify', `${rev}^{commit}`], { encoding: 'utf8' }).trim();
  const marker = join(root, '.bench-rev');
  // The same commit extracted and its helper built before: only the compile is redone.
  if (!existsSync(marker) || readFileSync(marker, 'utf8') !== commit || !existsSync(join(root, 'deploy/base'))) {
    rmSync(root, { recursive: true, force: true });
    mkdirSync(root, { recursive: true });
    const paths = ['agent', 'bin', 'deploy/base', 'test', 'proto', 'netns-helper', 'package.json', 'tsconfig.json'];
    const tar = execFileSync('git', ['-C', REPO, 'archive', commit, ...paths], { maxBuffer: 256 * 1024 * 1024 });
    execFileSync('tar', ['-x', '-C', root], { input: tar });
    symlinkSync(join(REPO, 'node_modules'), join(root, 'node_modules'));
    execFileSync('make', ['-s', '-C', join(root, 'netns-helper')], { stdio: ['ignore', 'ignore', 'inherit'] });
    writeFileSync(marker, commit);
  }
  const build = await buildForBench({ root });
  return { ...build, note: `${label} = ${rev} (${commit.slice(0, 7)})${build.note ? `: ${build.note}` : ''}` };
}
